// Image-folder datasets for the workers: JPEG and PNG files in class folders,
// decoded with libjpeg-turbo and libpng and resized to one square size (or
// kept at the size they all share).
//
// Layouts (ReadImageFolderDataset picks one by what `root` holds):
//  - tiny-ImageNet: root/wnids.txt (one class id a line),
//    root/train/<wnid>/images/*.JPEG for training, and root/val/images/*
//    labelled by root/val/val_annotations.txt ("<file>\t<wnid>\t..." lines)
//    for test; root/test (unlabelled) is not read;
//  - split class folders: root/train/<class>/... for training and
//    root/val/<class>/... (or, without val/, root/test/<class>/...) for
//    test; a test class must also be a training class;
//  - class folders: root/<class>/... for training and no test split.
// Classes are ordered by name (byte order), so label i is the same class in
// every process and every run, whatever order the folders are listed in.
// Inside a class folder, files named *.jpg, *.jpeg or *.png (any case) in it
// and in its subfolders are read, in order of their relative path; other
// files, and names starting with '.', are ignored. The format is taken from
// the file's first bytes, not its name.
//
// Pixels: each image is decoded, converted to the dataset's channel count,
// scaled to [0, 1] and resized to image_size x image_size as
// worker/image_decode.h says (DecodeImageFile, ImageToChw), and stored NCHW
// as floats.
//
// Errors (absl::Status, one line, naming the path): NOT_FOUND for a missing
// root; INVALID_ARGUMENT for bad options or a root whose layout is none of
// the above; DATA_LOSS for a class folder with no image files, a bad
// wnids.txt or val_annotations.txt line, or (BadImages::kFail) the first
// unreadable image in the order above: "PATH: corrupt JPEG (Premature end of
// JPEG file)". With BadImages::kSkip, unreadable images (empty, truncated,
// corrupt, not a JPEG or PNG, too large, missing) are left out and counted;
// a split with no readable image at all is still DATA_LOSS. What counts as
// unreadable, and that decoding never prints or exits: worker/image_decode.h.
//
// Thread-safety: the functions are reentrant and may run concurrently on
// different inputs; ReadImageFolderDataset and ListImageFolder read on
// options.num_threads threads of their own and return when all have
// finished.
#ifndef PSTRAIN_WORKER_IMAGE_FOLDER_H_
#define PSTRAIN_WORKER_IMAGE_FOLDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/image_decode.h"

namespace pstrain {

// What to do with an image that cannot be read.
enum class BadImages {
  kFail,  // the whole read fails, naming the first such file
  kSkip,  // it is left out and counted (ImageFolderSplit::skipped)
};

struct ImageFolderOptions {
  // Images are resized to image_size x image_size pixels (1 to 4096); 0:
  // kept at their own size, which every image of the dataset (both splits)
  // must share (INVALID_ARGUMENT naming two sizes and a file of each
  // otherwise), as torchvision's ImageFolder without a Resize. Decided from
  // the files' headers, before any pixel is decoded.
  int image_size = 64;
  // 1 (grayscale) or 3 (RGB); 0: 1 if every image of the dataset (both
  // splits) is grayscale, else 3. Decided from the files' headers first.
  int channels = 0;
  BadImages bad_images = BadImages::kFail;
  // Decoding threads; 0: the machine's cores, at most 8.
  int num_threads = 0;
  // ReadImageFolderDataset: the most bytes the decoded images (both splits,
  // as floats) may take; 0: no limit. Checked against DecodedImageBytes of
  // the headers' counts and sizes before any pixel is decoded:
  // RESOURCE_EXHAUSTED ("ROOT: decoding 70000 images of 1x224x224 floats
  // needs 14.05 GB, over the limit of 11.20 GB") when over.
  int64_t max_decoded_bytes = 0;
};

// Bytes of `count` decoded images of channels x height x width floats: what
// ReadImageFolderDataset holds for them (its other memory, a decode buffer
// per thread, does not grow with the dataset).
int64_t DecodedImageBytes(int64_t count, int channels, int height, int width);

// RESOURCE_EXHAUSTED as ImageFolderOptions::max_decoded_bytes describes when
// DecodedImageBytes(count, ...) is over `max_bytes` (> 0); OK otherwise.
absl::Status CheckDecodedBytes(const std::string& root, int64_t count,
                               int channels, int height, int width,
                               int64_t max_bytes);

// "14.05 GB" (decimal units: kB, MB, GB, TB; bytes below 1 kB).
std::string FormatBytes(int64_t bytes);

// One split: `count` images [count, C, H, W] (chw = {C, H, W}; H = W =
// image_size, or the images' own height and width with image_size 0) with
// values in [0, 1], and their labels.
struct ImageFolderSplit {
  int64_t chw[3] = {0, 0, 0};
  int64_t count = 0;
  std::vector<float> images;    // count * C * H * W
  std::vector<int32_t> labels;  // count values in [0, number of classes)
  // BadImages::kSkip: images left out, and the first of them as
  // "PATH: reason" (empty when none).
  int64_t skipped = 0;
  std::string first_skipped;
};

struct ImageFolderDataset {
  // "tiny_imagenet", "split_class_folders" or "class_folders".
  std::string layout;
  // Label i is class_names[i]; sorted.
  std::vector<std::string> class_names;
  ImageFolderSplit train;
  ImageFolderSplit test;  // count 0 for the "class_folders" layout
};

// Reads the dataset under `root` in whichever layout it has (see the file
// comment); errors as the file comment says.
absl::StatusOr<ImageFolderDataset> ReadImageFolderDataset(
    const std::string& root, const ImageFolderOptions& options = {});

// Labelled image files, read and decoded on demand (InputPipeline).
struct ImageFiles {
  std::vector<std::string> paths;
  std::vector<int32_t> labels;  // one per path
};

// A dataset's files without their pixels, for streaming them from disk.
struct ImageFolderListing {
  std::string layout;                    // as ImageFolderDataset's
  std::vector<std::string> class_names;  // label i is class_names[i]; sorted
  int channels = 0;  // options.channels, or decided from the headers
  // The size the images are decoded to: options.image_size square, or with
  // image_size 0 the size every image has (from the headers).
  int height = 0;
  int width = 0;
  // In the order ReadImageFolderDataset decodes them; test empty without a
  // test split.
  ImageFiles train;
  ImageFiles test;
  // BadImages::kSkip: files whose header could not be read, left out, and
  // the first of them as "PATH: reason".
  int64_t skipped = 0;
  std::string first_skipped;
};

// Lists the dataset under `root` as ReadImageFolderDataset would read it,
// reading every file's header (format, size, colour) but no pixels: the
// files whose header cannot be read are the error (kFail, the first in
// order) or left out and counted (kSkip). A file whose header reads but
// whose pixels do not is found only when decoded. options.image_size is
// checked, and with 0 the images' one size is found (or the mixed-size
// error returned); options.max_decoded_bytes is not used. Errors: those of
// ReadImageFolderDataset.
absl::StatusOr<ImageFolderListing> ListImageFolder(
    const std::string& root, const ImageFolderOptions& options = {});

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_IMAGE_FOLDER_H_
