// An input pipeline that keeps the training step fed from image files:
// reading, decoding (libjpeg-turbo, libpng: worker/image_folder.h) and
// augmentation run on a pool of threads that prepare the next
// `prefetch_batches` batches while the caller trains on the current one.
//
// Augmentation, as the seeds' training recipes (torchvision's transforms):
//  - kPadCrop: RandomCrop(out_size, padding=pad): the image resized to
//    out_size (if it is not already), zero-padded by `pad` pixels on each
//    side, and an out_size window at a uniform offset in [0, 2 pad];
//  - kRandomResizedCrop: RandomResizedCrop(out_size, scale=(min_area,
//    max_area), ratio=(min_ratio, max_ratio)): up to 10 tries of an area
//    fraction ~ U(scale) and a log-uniform aspect ratio, the first window
//    that fits the image, else the central crop of the ratio clamped to the
//    range; the window resized to out_size;
//  - kResize: the whole image resized to out_size (evaluation);
// then a horizontal flip with probability 1/2 (hflip), scaling to [0, 1]
// (value / 255, ToTensor) and Normalize(mean, stddev) per channel. Resizes
// are bilinear with half-pixel centres and no antialiasing, as ImageToChw:
// output pixel x of a window [x0, x0 + w) samples the image at
// x0 + (x + 0.5) * w / out_size - 0.5, clamped to the image. Crop, resize,
// flip, scaling and normalisation are one separable pass from the decoded
// bytes, and the pipeline decodes only the window of each JPEG that the
// crop reads (DecodeImageFileWindow, as TensorFlow's decode_and_crop_jpeg):
// the same values as decoding the whole image, for less work the smaller
// the crop.
//
// Determinism: sample k of the epoch's order draws its crop and flip from a
// generator seeded with a hash of (seed, k) alone, and batch b holds
// samples [b * batch_size, (b + 1) * batch_size) of the order, so the
// batches are the same bytes whatever the number of threads.
//
// Threads: `threads` are the pipeline's own, on top of the step's compute
// threads; a worker given N cores runs its step on N - threads of them
// (InputThreadsForCores).
//
// Memory: Next() takes the storage of the batch it overwrites for a later
// batch, so a caller that passes the same Batch each time makes the
// pipeline allocate nothing after its first batches.
//
// Thread-safety: Next() from one thread at a time; the pool is internal and
// is joined by the destructor (which does not wait for unneeded batches).
#ifndef PSTRAIN_WORKER_INPUT_PIPELINE_H_
#define PSTRAIN_WORKER_INPUT_PIPELINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "models/tensor.h"
#include "worker/dataset.h"
#include "worker/image_folder.h"

namespace pstrain {

struct AugmentOptions {
  enum class Crop { kResize, kPadCrop, kRandomResizedCrop };
  Crop crop = Crop::kRandomResizedCrop;
  int out_size = 224;  // pixels, square output
  int pad = 4;         // kPadCrop: pixels of zero padding per side
  // kRandomResizedCrop: area fraction and aspect ratio (w / h) ranges.
  double min_area = 0.08, max_area = 1.0;
  double min_ratio = 3.0 / 4.0, max_ratio = 4.0 / 3.0;
  bool hflip = true;
  // Output channels: 1 or 3 (images converted as ImageToChw does).
  int channels = 3;
  // Per channel, of values in [0, 1]; empty: no normalisation. ImageNet's:
  // {0.485, 0.456, 0.406} and {0.229, 0.224, 0.225}.
  std::vector<float> mean, stddev;
};

// Writes `image` augmented with `rng_seed` as channels x out_size x out_size
// floats at `out` (see the file comment).
void AugmentImage(const DecodedImage& image, const AugmentOptions& options,
                  uint64_t rng_seed, float* out);

struct InputPipelineOptions {
  int64_t batch_size = 64;
  int threads = 2;           // decoding and augmentation threads, >= 1
  int prefetch_batches = 4;  // batches prepared ahead of Next(), >= 1
  uint64_t seed = 1;
  AugmentOptions augment;
  // The decoding threads run under SCHED_IDLE (Linux), so they take only
  // the cycles the training step leaves idle (its waits for the network,
  // for the pipeline itself, between steps) and never preempt its compute
  // threads: a CPU worker can give its step every core instead of one core
  // per input thread.
  bool idle_priority = false;
};

class InputPipeline {
 public:
  struct Batch {
    Tensor images;                // [batch_size, C, S, S]
    std::vector<int32_t> labels;  // batch_size
  };
  // Batches 0 .. num_batches - 1 of files.paths[order[k]]; `files` must
  // outlive the pipeline. INVALID_ARGUMENT (from Create) for bad options,
  // an order entry outside the files, or fewer than num_batches * batch_size
  // entries.
  static absl::StatusOr<std::unique_ptr<InputPipeline>> Create(
      const ImageFiles& files, SampleOrder order, int64_t num_batches,
      const InputPipelineOptions& options);
  ~InputPipeline();

  // The next batch, in order: true with it, false after the last; the
  // decode error of the batch's first unreadable file ("PATH: corrupt JPEG
  // (...)"), after which the pipeline is finished.
  absl::StatusOr<bool> Next(Batch* batch);

 private:
  InputPipeline(const ImageFiles& files, SampleOrder order, int64_t num_batches,
                const InputPipelineOptions& options);
  void Work();
  absl::Status Build(int64_t b, Batch* batch) const;

  const ImageFiles& files_;
  const SampleOrder order_;
  const int64_t num_batches_;
  const InputPipelineOptions options_;
  // Waits are absl::Mutex::Await conditions (re-checked on each unlock).
  absl::Mutex mu_;
  int64_t next_to_build_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, absl::StatusOr<Batch>> ready_ ABSL_GUARDED_BY(mu_);
  // Batches handed back through Next(), whose storage Work() reuses.
  std::vector<Batch> spare_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Pipeline threads for a task given `cores` cores: a quarter of them, at
// least 1 and at most cores - 1 (the step keeps the rest); 1 for one core.
int InputThreadsForCores(int cores);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_INPUT_PIPELINE_H_
