// export_image_folder: an IDX dataset (MNIST, Fashion-MNIST, a bigMNIST set)
// written out as an image-folder tree that `--dataset=image_folder` reads
// (worker/image_folder.h, the split class-folder layout):
//
//   OUT/train/<label>/<index>.<jpg|png>   from train-images/train-labels
//   OUT/test/<label>/<index>.<jpg|png>    from t10k-images/t10k-labels
//
// <label> is the label's number, zero-padded to the width of the largest
// (so that the byte order of the names, which image_folder uses, is the
// numeric order and label i stays label i; a folder only for the labels
// that occur); <index> is the image's index in its IDX file, zero-padded.
// Images are written gray (1 channel) as JPEG at `quality`
// (worker/image_write.h: 4:4:4, libjpeg-turbo) or as PNG (lossless), so a model
// trained on the tree sees the IDX pixels up to the JPEG's loss. What it is
// for: checking that the image-folder path trains to the IDX path's accuracy
// (BENCHMARKS.md), and making JPEG datasets of any size for the input pipeline.
//
// Thread-safety: ExportIdxAsImageFolder writes on `threads` threads of its
// own and returns when all have finished; calls on different output
// folders may run concurrently.
#ifndef PSTRAIN_TOOLS_IMAGE_FOLDER_EXPORT_H_
#define PSTRAIN_TOOLS_IMAGE_FOLDER_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pstrain {

struct ImageFolderExportOptions {
  // Folder with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]
  // and the t10k-* pair.
  std::string input_dir;
  std::string output_dir;
  // "jpeg" or "png".
  std::string format = "jpeg";
  // JPEG quality, 1 to 100.
  int quality = 90;
  // Writing threads, 1 to 64.
  int threads = 1;
};

struct ImageFolderExportResult {
  int64_t train_images = 0;
  int64_t test_images = 0;
  int64_t bytes = 0;  // of all image files written
};

// Errors: INVALID_ARGUMENT for bad options (naming the option and its
// range) or an output folder that already holds train/ or test/ (nothing
// is overwritten); ReadIdx's NOT_FOUND / DATA_LOSS naming the input file;
// DATA_LOSS when images and labels disagree in count or the images are not
// [N, H, W]; the first write error (INTERNAL, naming the file). A failed
// export leaves a partial tree behind.
absl::StatusOr<ImageFolderExportResult> ExportIdxAsImageFolder(
    const ImageFolderExportOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_IMAGE_FOLDER_EXPORT_H_
