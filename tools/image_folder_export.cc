#include "tools/image_folder_export.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/dataset.h"
#include "worker/image_write.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

int Digits(int64_t n) {
  int digits = 1;
  while (n >= 10) {
    n /= 10;
    ++digits;
  }
  return digits;
}

// One split: images [N, H, W] and labels [N] into dir/<label>/<index>.ext.
absl::StatusOr<int64_t> ExportSplit(const IdxArray& images,
                                    const IdxArray& labels,
                                    const std::string& what,
                                    const std::string& dir, int label_digits,
                                    const ImageFolderExportOptions& o) {
  if (images.dims.size() != 3 || labels.dims.size() != 1 ||
      images.dims[0] != labels.dims[0]) {
    return absl::DataLossError(absl::StrCat(o.input_dir, ": expected ", what,
                                            " images [N, H, W] and ", what,
                                            " labels [N] of the same N"));
  }
  const int64_t n = images.dims[0];
  const int height = static_cast<int>(images.dims[1]);
  const int width = static_cast<int>(images.dims[2]);
  const size_t pixels = static_cast<size_t>(height) * width;
  const int index_digits = Digits(std::max<int64_t>(n - 1, 0));
  // A folder per label that occurs (an empty class folder is an error to
  // image_folder).
  std::vector<bool> present(256, false);
  for (uint8_t label : labels.data) present[label] = true;
  for (int label = 0; label < 256; ++label) {
    if (!present[label]) continue;
    std::error_code error;
    fs::create_directories(absl::StrFormat("%s/%0*d", dir, label_digits, label),
                           error);
    if (error) {
      return absl::InternalError(
          absl::StrCat(dir, ": cannot create: ", error.message()));
    }
  }
  const bool jpeg = o.format == "jpeg";
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> bytes{0};
  std::mutex mu;
  absl::Status first_error;
  auto work = [&] {
    std::vector<uint8_t> image(pixels);
    for (int64_t i = next++; i < n; i = next++) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.ok()) return;
      }
      std::copy_n(images.data.begin() + i * pixels, pixels, image.begin());
      const std::string path =
          absl::StrFormat("%s/%0*d/%0*d.%s", dir, label_digits, labels.data[i],
                          index_digits, i, jpeg ? "jpg" : "png");
      absl::Status s =
          jpeg ? WriteJpegFile(path, height, width, 1, image, o.quality)
               : WritePngFile(path, height, width, 1, image);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
        return;
      }
      std::error_code error;
      bytes += static_cast<int64_t>(fs::file_size(path, error));
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  RETURN_IF_ERROR(first_error);
  return bytes.load();
}

}  // namespace

absl::StatusOr<ImageFolderExportResult> ExportIdxAsImageFolder(
    const ImageFolderExportOptions& o) {
  if (o.format != "jpeg" && o.format != "png") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format=", o.format, ": expected jpeg or png"));
  }
  if (o.quality < 1 || o.quality > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quality=", o.quality, ": expected 1 to 100"));
  }
  if (o.threads < 1 || o.threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", o.threads, ": expected 1 to 64"));
  }
  if (o.output_dir.empty()) {
    return absl::InvalidArgumentError("--output_dir: expected a folder");
  }
  for (const char* split : {"train", "test"}) {
    std::error_code error;
    if (fs::exists(absl::StrCat(o.output_dir, "/", split), error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--output_dir=", o.output_dir, ": already holds ", split,
                       "/; expected a new or empty folder"));
    }
  }
  ASSIGN_OR_RETURN(
      IdxArray train_images,
      ReadIdx(FindIdxFile(o.input_dir, "train-images-idx3-ubyte")));
  ASSIGN_OR_RETURN(
      IdxArray train_labels,
      ReadIdx(FindIdxFile(o.input_dir, "train-labels-idx1-ubyte")));
  ASSIGN_OR_RETURN(IdxArray test_images,
                   ReadIdx(FindIdxFile(o.input_dir, "t10k-images-idx3-ubyte")));
  ASSIGN_OR_RETURN(IdxArray test_labels,
                   ReadIdx(FindIdxFile(o.input_dir, "t10k-labels-idx1-ubyte")));
  // One width for both splits, so that a label's folder has one name.
  int max_label = 0;
  for (const IdxArray* labels : {&train_labels, &test_labels}) {
    for (uint8_t label : labels->data) {
      max_label = std::max<int>(max_label, label);
    }
  }
  const int label_digits = Digits(max_label);
  ImageFolderExportResult result;
  ASSIGN_OR_RETURN(const int64_t train_bytes,
                   ExportSplit(train_images, train_labels, "train",
                               o.output_dir + "/train", label_digits, o));
  ASSIGN_OR_RETURN(const int64_t test_bytes,
                   ExportSplit(test_images, test_labels, "t10k",
                               o.output_dir + "/test", label_digits, o));
  result.train_images = train_images.dims[0];
  result.test_images = test_images.dims[0];
  result.bytes = train_bytes + test_bytes;
  return result;
}

}  // namespace pstrain
