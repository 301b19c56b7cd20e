// Internal to //worker:image_folder: finding an image-folder dataset's
// layout, classes and files (worker/image_folder.h's file comment says the
// layouts), without reading any image.
#ifndef PSTRAIN_WORKER_IMAGE_FOLDER_SCAN_H_
#define PSTRAIN_WORKER_IMAGE_FOLDER_SCAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/image_folder.h"

namespace pstrain {

// The files of each split, by layout; nothing probed or decoded yet.
struct ImageFolderScan {
  // "tiny_imagenet", "split_class_folders" or "class_folders".
  std::string layout;
  std::vector<std::string> class_names;  // label i is class_names[i]; sorted
  ImageFiles train;  // sorted by path within each class, classes in order
  ImageFiles test;   // tiny-ImageNet: sorted by path; empty without test split
  // The folders the splits were read from, for error messages: root itself
  // for "class_folders"; test_dir "" without a test split.
  std::string train_dir;
  std::string test_dir;
};

// Lists the folders under `root` (and reads tiny-ImageNet's wnids.txt and
// val/val_annotations.txt). Errors, one line naming the path: NOT_FOUND for
// a missing root; INVALID_ARGUMENT for a root that is not a folder, cannot
// be listed or has none of the layouts; DATA_LOSS for a class folder with
// no image files, a test class with no training folder, or a bad wnids.txt
// or val_annotations.txt line. Reentrant.
absl::StatusOr<ImageFolderScan> ScanImageFolder(const std::string& root);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_IMAGE_FOLDER_SCAN_H_
