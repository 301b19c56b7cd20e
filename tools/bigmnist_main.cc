// bigmnist: writes an N-times larger MNIST or Fashion-MNIST as plain IDX
// files by deterministic deformations (tools/bigmnist.h).
//
//   bigmnist --input_dir=/usr/share/datasets/fashion-mnist
//       --output_dir=/data/bigfmnist --copies=67 --seed=1 --threads=2
//
// writes 67 x 60,000 = 4,020,000 training images (3.15 GB) and copies the
// 10,000 test images; train with --dataset=fashion_mnist
// --data_dir=/data/bigfmnist (the files are memory-mapped, not loaded).
// Exit 0 when written, 2 with one line on a bad flag (--output_dir naming
// --input_dir's folder or files included) or an unreadable input, 1 when a
// write fails.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "tools/bigmnist.h"

ABSL_FLAG(std::string, input_dir, "/usr/share/datasets/fashion-mnist",
          "Folder of the source IDX files (train-* and t10k-*, gzipped or "
          "plain).");
ABSL_FLAG(std::string, output_dir, "", "Folder for the output IDX files.");
ABSL_FLAG(int64_t, copies, 10,
          "Output training images per source image (output size = copies x "
          "source size).");
ABSL_FLAG(bool, include_originals, false,
          "Copy 0 of each image is the source image, not a deformation.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the deformations.");
ABSL_FLAG(int, threads, 0, "Threads deforming images (0: all cores).");
ABSL_FLAG(double, max_rotation_deg, 10.0, "Rotation bound, degrees.");
ABSL_FLAG(double, max_scale, 0.1, "Scale in [1 - max_scale, 1 + max_scale].");
ABSL_FLAG(double, max_shear, 0.15, "Horizontal shear factor bound.");
ABSL_FLAG(double, max_translation_px, 2.0, "Translation bound, pixels.");
ABSL_FLAG(double, elastic_alpha, 34.0,
          "Elastic distortion scale, pixels (Simard et al. 2003: 34).");
ABSL_FLAG(double, elastic_sigma, 4.0,
          "Elastic distortion smoothing, pixels (Simard et al. 2003: 4; 0 "
          "turns it off).");

int main(int argc, char** argv) {
  constexpr char kProgram[] = "bigmnist";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "bigmnist --help");
  pstrain::BigMnistOptions o;
  o.input_dir = absl::GetFlag(FLAGS_input_dir);
  o.output_dir = absl::GetFlag(FLAGS_output_dir);
  if (o.output_dir.empty()) {
    pstrain::PrintError(kProgram, "--output_dir is required");
    return 2;
  }
  o.copies = absl::GetFlag(FLAGS_copies);
  o.include_originals = absl::GetFlag(FLAGS_include_originals);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads == 0) {
    o.threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  o.deform.max_rotation_deg = absl::GetFlag(FLAGS_max_rotation_deg);
  o.deform.max_scale = absl::GetFlag(FLAGS_max_scale);
  o.deform.max_shear = absl::GetFlag(FLAGS_max_shear);
  o.deform.max_translation_px = absl::GetFlag(FLAGS_max_translation_px);
  o.deform.elastic_alpha = absl::GetFlag(FLAGS_elastic_alpha);
  o.deform.elastic_sigma = absl::GetFlag(FLAGS_elastic_sigma);
  const absl::Time start = absl::Now();
  const absl::Status status = pstrain::WriteBigMnist(o);
  if (!status.ok()) {
    pstrain::PrintError(kProgram, status.message());
    return status.code() == absl::StatusCode::kInvalidArgument ||
                   status.code() == absl::StatusCode::kNotFound ||
                   status.code() == absl::StatusCode::kDataLoss
               ? 2
               : 1;
  }
  std::printf("bigmnist: wrote %s (%lld copies) in %.1f s\n",
              o.output_dir.c_str(), static_cast<long long>(o.copies),
              absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}
