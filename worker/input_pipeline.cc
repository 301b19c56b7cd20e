#include "worker/input_pipeline.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

// SplitMix64 (Steele, Lea and Flood 2014): a per-sample generator whose
// numbers are the same on every platform and standard library.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() { return Mix64(state += 0x9e3779b97f4a7c15ull); }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi].
  int64_t Int(int64_t lo, int64_t hi) {
    return lo +
           static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
};

// One output coordinate's two source pixels and weight; valid false: zero.
struct Tap {
  int i0 = 0, i1 = 0;
  float w1 = 0;
  bool valid = true;
};

// Output positions 0..out-1 over source window [start, start + extent) of an
// axis of `size` pixels, half-pixel centres, clamped to the axis.
std::vector<Tap> Taps(int out, double start, double extent, int size) {
  std::vector<Tap> taps(out);
  const double scale = extent / out;
  for (int x = 0; x < out; ++x) {
    double s = start + (x + 0.5) * scale - 0.5;
    s = std::clamp(s, 0.0, static_cast<double>(size - 1));
    const int i0 = static_cast<int>(std::floor(s));
    taps[x].i0 = i0;
    taps[x].i1 = std::min(i0 + 1, size - 1);
    taps[x].w1 = static_cast<float>(s - i0);
  }
  return taps;
}

// Padded crop after a resize to `out`: output x is resized pixel x + offset,
// zero outside [0, out).
std::vector<Tap> PadTaps(int out, int offset, int size) {
  std::vector<Tap> resized = Taps(out, 0.0, size, size);
  std::vector<Tap> taps(out);
  for (int x = 0; x < out; ++x) {
    const int u = x + offset;
    if (u < 0 || u >= out) {
      taps[x].valid = false;
    } else {
      taps[x] = resized[u];
    }
  }
  return taps;
}

}  // namespace

void AugmentImage(const DecodedImage& image, const AugmentOptions& o,
                  uint64_t rng_seed, float* out) {
  SplitMix64 rng{rng_seed};
  const int H = image.height, W = image.width, S = o.out_size;
  std::vector<Tap> xs, ys;
  switch (o.crop) {
    case AugmentOptions::Crop::kResize:
      xs = Taps(S, 0, W, W);
      ys = Taps(S, 0, H, H);
      break;
    case AugmentOptions::Crop::kPadCrop: {
      const int dy = static_cast<int>(rng.Int(0, 2 * o.pad)) - o.pad;
      const int dx = static_cast<int>(rng.Int(0, 2 * o.pad)) - o.pad;
      ys = PadTaps(S, dy, H);
      xs = PadTaps(S, dx, W);
      break;
    }
    case AugmentOptions::Crop::kRandomResizedCrop: {
      // torchvision.transforms.RandomResizedCrop.get_params.
      const double area = static_cast<double>(H) * W;
      const double log_lo = std::log(o.min_ratio),
                   log_hi = std::log(o.max_ratio);
      int top = 0, left = 0, h = H, w = W;
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        const double target = area * rng.Uniform(o.min_area, o.max_area);
        const double ratio = std::exp(rng.Uniform(log_lo, log_hi));
        const int cw = static_cast<int>(std::lround(std::sqrt(target * ratio)));
        const int ch = static_cast<int>(std::lround(std::sqrt(target / ratio)));
        if (cw > 0 && cw <= W && ch > 0 && ch <= H) {
          top = static_cast<int>(rng.Int(0, H - ch));
          left = static_cast<int>(rng.Int(0, W - cw));
          h = ch;
          w = cw;
          found = true;
        }
      }
      if (!found) {
        const double in_ratio = static_cast<double>(W) / H;
        if (in_ratio < o.min_ratio) {
          w = W;
          h = static_cast<int>(std::lround(w / o.min_ratio));
        } else if (in_ratio > o.max_ratio) {
          h = H;
          w = static_cast<int>(std::lround(h * o.max_ratio));
        }
        top = (H - h) / 2;
        left = (W - w) / 2;
      }
      ys = Taps(S, top, h, H);
      xs = Taps(S, left, w, W);
      break;
    }
  }
  const bool flip = o.hflip && (rng.Next() & 1) != 0;
  // The source planes as floats in [0, 1], converted to o.channels as
  // ImageToChw does.
  const size_t plane = static_cast<size_t>(H) * W;
  const int c = image.channels;
  const uint8_t* p = image.pixels.data();
  std::vector<float> source(plane * o.channels);
  for (int ch = 0; ch < o.channels; ++ch) {
    float* dst = &source[ch * plane];
    if (c == 1 || o.channels == 3) {
      const int from = c == 1 ? 0 : ch;
      for (size_t j = 0; j < plane; ++j) {
        dst[j] = p[j * c + from] * (1.0f / 255.0f);
      }
    } else {
      for (size_t j = 0; j < plane; ++j) {
        const uint32_t luma = (p[3 * j] * 19595u + p[3 * j + 1] * 38470u +
                               p[3 * j + 2] * 7471u + 0x8000u) >>
                              16;
        dst[j] = luma * (1.0f / 255.0f);
      }
    }
  }
  for (int ch = 0; ch < o.channels; ++ch) {
    const float* src = &source[ch * plane];
    const float mean = o.mean.empty() ? 0.0f : o.mean[ch];
    const float inv = o.stddev.empty() ? 1.0f : 1.0f / o.stddev[ch];
    float* dst = out + static_cast<size_t>(ch) * S * S;
    for (int y = 0; y < S; ++y) {
      const Tap& ty = ys[y];
      float* row = dst + static_cast<size_t>(y) * S;
      const float* r0 = src + static_cast<size_t>(ty.i0) * W;
      const float* r1 = src + static_cast<size_t>(ty.i1) * W;
      for (int x = 0; x < S; ++x) {
        const Tap& tx = xs[x];
        float v = 0.0f;
        if (ty.valid && tx.valid) {
          const float top = r0[tx.i0] + (r0[tx.i1] - r0[tx.i0]) * tx.w1;
          const float bottom = r1[tx.i0] + (r1[tx.i1] - r1[tx.i0]) * tx.w1;
          v = top + (bottom - top) * ty.w1;
        }
        row[flip ? S - 1 - x : x] = (v - mean) * inv;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<InputPipeline>> InputPipeline::Create(
    const ImageFiles& files, SampleOrder order, int64_t num_batches,
    const InputPipelineOptions& o) {
  const AugmentOptions& a = o.augment;
  const bool stats_ok = (a.mean.empty() && a.stddev.empty()) ||
                        (static_cast<int>(a.mean.size()) == a.channels &&
                         static_cast<int>(a.stddev.size()) == a.channels &&
                         std::all_of(a.stddev.begin(), a.stddev.end(),
                                     [](float s) { return s > 0; }));
  if (o.batch_size < 1 || o.threads < 1 || o.prefetch_batches < 1 ||
      a.out_size < 1 || a.out_size > 4096 || a.pad < 0 ||
      (a.channels != 1 && a.channels != 3) || !stats_ok ||
      !(a.min_area > 0 && a.min_area <= a.max_area && a.max_area <= 1) ||
      !(a.min_ratio > 0 && a.min_ratio <= a.max_ratio) ||
      files.paths.size() != files.labels.size() || num_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input pipeline: batch_size ", o.batch_size, ", threads ", o.threads,
        ", prefetch_batches ", o.prefetch_batches, ", out_size ", a.out_size,
        ", pad ", a.pad, ", channels ", a.channels, ", ", a.mean.size(),
        " means and ", a.stddev.size(), " stddevs, area [", a.min_area, ", ",
        a.max_area, "], ratio [", a.min_ratio, ", ", a.max_ratio, "], ",
        files.paths.size(), " paths and ", files.labels.size(),
        " labels; expected sizes >= 1, out_size <= 4096, channels 1 or 3, a "
        "positive stddev per channel, 0 < area <= 1, 0 < ratio, one label "
        "per path"));
  }
  if (static_cast<int64_t>(order.size()) < num_batches * o.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input pipeline: ", num_batches, " batches of ", o.batch_size, " need ",
        num_batches * o.batch_size, " samples; the order has ", order.size()));
  }
  for (int64_t k = 0; k < order.size(); ++k) {
    const SampleIndex i = order[k];
    if (i >= files.paths.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input pipeline: sample ", i, " is outside the ",
                       files.paths.size(), " files"));
    }
  }
  return absl::WrapUnique(
      new InputPipeline(files, std::move(order), num_batches, o));
}

InputPipeline::InputPipeline(const ImageFiles& files, SampleOrder order,
                             int64_t num_batches,
                             const InputPipelineOptions& options)
    : files_(files),
      order_(std::move(order)),
      num_batches_(num_batches),
      options_(options) {
  for (int t = 0; t < options_.threads; ++t) {
    threads_.emplace_back([this] { Work(); });
  }
}

InputPipeline::~InputPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

absl::Status InputPipeline::Build(int64_t b, Batch* batch) const {
  const AugmentOptions& a = options_.augment;
  const int64_t n = options_.batch_size;
  const int64_t per =
      static_cast<int64_t>(a.channels) * a.out_size * a.out_size;
  batch->images.Resize({n, a.channels, a.out_size, a.out_size});
  batch->labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = b * n + i;  // Position in the epoch's order.
    const int64_t sample = order_[k];
    absl::StatusOr<DecodedImage> image = DecodeImageFile(files_.paths[sample]);
    if (!image.ok()) return image.status();
    SplitMix64 hash{options_.seed ^
                    (0x5851f42d4c957f2dull * static_cast<uint64_t>(k + 1))};
    AugmentImage(*image, a, hash.Next(), &batch->images.data[i * per]);
    batch->labels[i] = files_.labels[sample];
  }
  return absl::OkStatus();
}

void InputPipeline::Work() {
  if (options_.idle_priority) {
    // Linux: with pid 0 this sets the calling thread's policy. A failure
    // leaves the thread at the normal priority (slower steps, no error).
    struct sched_param param {};
    sched_setscheduler(0, SCHED_IDLE, &param);
  }
  while (true) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || next_to_build_ >= num_batches_ ||
               next_to_build_ < consumed_ + options_.prefetch_batches;
      });
      if (stop_ || next_to_build_ >= num_batches_) return;
      b = next_to_build_++;
    }
    Batch batch;
    absl::Status status = Build(b, &batch);
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      ready_.emplace(b, std::move(batch));
    } else {
      ready_.emplace(b, std::move(status));
    }
    cv_.notify_all();
  }
}

absl::StatusOr<bool> InputPipeline::Next(Batch* batch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ >= num_batches_) return false;
  const int64_t b = consumed_;
  cv_.wait(lock, [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ready_.count(b) > 0;
  });
  auto it = ready_.find(b);
  absl::StatusOr<Batch> result = std::move(it->second);
  ready_.erase(it);
  if (!result.ok()) {
    consumed_ = num_batches_;  // Finished: no batch after an error.
    stop_ = true;
    cv_.notify_all();
    return result.status();
  }
  *batch = *std::move(result);
  ++consumed_;
  cv_.notify_all();
  return true;
}

int InputThreadsForCores(int cores) {
  if (cores <= 1) return 1;
  return std::clamp(cores / 4, 1, cores - 1);
}

}  // namespace pstrain
