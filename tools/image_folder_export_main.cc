// export_image_folder: writes an IDX dataset (MNIST, Fashion-MNIST, a
// bigMNIST set) as an image-folder tree (tools/image_folder_export.h).
//
//   export_image_folder --input_dir=/usr/share/datasets/fashion-mnist
//       --output_dir=/data/fmnist_jpeg --format=jpeg --quality=90
//
// then train with --dataset=image_folder --data_dir=/data/fmnist_jpeg
// --image_size=28. Exit 0 when written, 2 with one line on a bad flag or an
// unreadable input, 1 when a write fails.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "tools/image_folder_export.h"

ABSL_FLAG(std::string, input_dir, "/usr/share/datasets/fashion-mnist",
          "Folder of the IDX files (train-* and t10k-*, gzipped or plain).");
ABSL_FLAG(std::string, output_dir, "",
          "New folder for the tree (train/<label>/, test/<label>/).");
ABSL_FLAG(std::string, format, "jpeg", "jpeg or png.");
ABSL_FLAG(int, quality, 90, "JPEG quality, 1 to 100.");
ABSL_FLAG(int, threads, 0, "Writing threads (0: all cores).");

int main(int argc, char** argv) {
  constexpr char kProgram[] = "export_image_folder";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "export_image_folder --help");
  pstrain::ImageFolderExportOptions o;
  o.input_dir = absl::GetFlag(FLAGS_input_dir);
  o.output_dir = absl::GetFlag(FLAGS_output_dir);
  o.format = absl::GetFlag(FLAGS_format);
  o.quality = absl::GetFlag(FLAGS_quality);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads == 0) {
    o.threads = static_cast<int>(
        std::min(64u, std::max(1u, std::thread::hardware_concurrency())));
  }
  const absl::Time start = absl::Now();
  const absl::StatusOr<pstrain::ImageFolderExportResult> result =
      pstrain::ExportIdxAsImageFolder(o);
  if (!result.ok()) {
    pstrain::PrintError(kProgram, result.status().message());
    const absl::StatusCode code = result.status().code();
    return code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kNotFound ||
                   code == absl::StatusCode::kDataLoss
               ? 2
               : 1;
  }
  std::printf(
      "export_image_folder: wrote %lld training and %lld test images (%.1f "
      "MB) to %s in %.1f s\n",
      static_cast<long long>(result->train_images),
      static_cast<long long>(result->test_images), result->bytes / 1e6,
      o.output_dir.c_str(), absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}
