// input_bench: images/sec of worker/input_pipeline (read + decode + augment
// + batch) over a folder of JPEG files, for bench/input_bench.py, which
// times PyTorch's DataLoader on the same files and prints the table.
//
//   input_bench --dir=D --size=64 --threads=2 --batch_size=64 --epochs=3
//       [--reference_out=F [--reference_size=R]]
//
// Reads D/*.jpg in name order (label 0), runs --epochs epochs of
// RandomResizedCrop(size) + horizontal flip + ImageNet Normalize batches in
// a seeded shuffled order, and prints one line:
//   images_per_sec=<float> images=<int> seconds=<float> checksum=<float>
// timed from the first batch of the first epoch to the last batch (the
// pool's start is left out, as the Python side leaves out its workers').
// --reference_out writes the first 8 images decoded and resized to
// R x R (--reference_size, default --size: the files' own size when they
// are square and R is it, so no resize) (no crop, no flip, no normalisation) as
// float32 CHW values, for the correctness check against PIL's decoder.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "worker/input_pipeline.h"

ABSL_FLAG(std::string, dir, "", "Folder of *.jpg files.");
ABSL_FLAG(int, size, 64, "Output images are size x size pixels.");
ABSL_FLAG(int, threads, 2, "Pipeline threads.");
ABSL_FLAG(int, batch_size, 64, "Images per batch.");
ABSL_FLAG(int, epochs, 3, "Passes over the folder.");
ABSL_FLAG(int, reference_size, 0,
          "Size of the --reference_out images; 0: --size.");
ABSL_FLAG(std::string, reference_out, "",
          "Write the first 8 images, resized only, as float32 CHW here.");

namespace {

constexpr char kProgram[] = "input_bench";

int Main() {
  namespace fs = std::filesystem;
  pstrain::ImageFiles files;
  std::error_code error;
  for (const auto& entry :
       fs::directory_iterator(absl::GetFlag(FLAGS_dir), error)) {
    if (absl::EndsWith(entry.path().string(), ".jpg")) {
      files.paths.push_back(entry.path().string());
    }
  }
  if (error || files.paths.empty()) {
    pstrain::PrintError(kProgram, "--dir: expected a folder of *.jpg files");
    return 2;
  }
  std::sort(files.paths.begin(), files.paths.end());
  files.labels.assign(files.paths.size(), 0);
  const int size = absl::GetFlag(FLAGS_size);
  pstrain::InputPipelineOptions o;
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.prefetch_batches = 2 * o.threads;
  o.augment.out_size = size;
  o.augment.mean = {0.485f, 0.456f, 0.406f};
  o.augment.stddev = {0.229f, 0.224f, 0.225f};
  const int64_t n = static_cast<int64_t>(files.paths.size());
  const int64_t batches = n / o.batch_size;
  std::mt19937_64 rng(1);
  double checksum = 0;
  int64_t images = 0;
  absl::Time start;
  bool started = false;
  // One batch object for the whole run, as the trainer keeps one: the
  // pipeline reuses the storage of the batch it overwrites.
  pstrain::InputPipeline::Batch batch;
  for (int epoch = 0; epoch < absl::GetFlag(FLAGS_epochs); ++epoch) {
    std::vector<pstrain::SampleIndex> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    o.seed = 1000 + epoch;
    absl::StatusOr<std::unique_ptr<pstrain::InputPipeline>> p =
        pstrain::InputPipeline::Create(files, order, batches, o);
    if (!p.ok()) {
      pstrain::PrintError(kProgram, p.status().message());
      return 2;
    }
    while (true) {
      absl::StatusOr<bool> more = (*p)->Next(&batch);
      if (!more.ok()) {
        pstrain::PrintError(kProgram, more.status().message());
        return 1;
      }
      if (!*more) break;
      if (!started) {
        start = absl::Now();  // After the first batch.
        started = true;
      } else {
        images += o.batch_size;
      }
      checksum += batch.images.data[0];
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("images_per_sec=%.1f images=%lld seconds=%.3f checksum=%.6f\n",
              images / seconds, static_cast<long long>(images), seconds,
              checksum);
  const std::string reference = absl::GetFlag(FLAGS_reference_out);
  if (!reference.empty()) {
    FILE* f = std::fopen(reference.c_str(), "wb");
    if (f == nullptr) {
      pstrain::PrintError(kProgram, "--reference_out: cannot write");
      return 1;
    }
    const int reference_size = absl::GetFlag(FLAGS_reference_size) > 0
                                   ? absl::GetFlag(FLAGS_reference_size)
                                   : size;
    pstrain::AugmentOptions plain;
    plain.crop = pstrain::AugmentOptions::Crop::kResize;
    plain.hflip = false;
    plain.out_size = reference_size;
    std::vector<float> out(3 * reference_size * reference_size);
    for (int64_t i = 0; i < std::min<int64_t>(8, n); ++i) {
      absl::StatusOr<pstrain::DecodedImage> image =
          pstrain::DecodeImageFile(files.paths[i]);
      if (!image.ok()) {
        pstrain::PrintError(kProgram, image.status().message());
        return 1;
      }
      pstrain::AugmentImage(*image, plain, 0, out.data());
      std::fwrite(out.data(), sizeof(float), out.size(), f);
    }
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "input_bench --help");
  return Main();
}
