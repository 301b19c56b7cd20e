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

// Where each output pixel of one augmented image samples the image: the
// row and column taps over the full image (columns already mirrored when
// the image is flipped).
struct SamplePlan {
  std::vector<Tap> xs, ys;
};

// Draws the crop and flip of AugmentImage for an H x W image from the
// generator seeded with `rng_seed` (see the header's file comment).
SamplePlan PlanAugment(int H, int W, const AugmentOptions& o,
                       uint64_t rng_seed) {
  SplitMix64 rng{rng_seed};
  const int S = o.out_size;
  SamplePlan plan;
  switch (o.crop) {
    case AugmentOptions::Crop::kResize:
      plan.xs = Taps(S, 0, W, W);
      plan.ys = Taps(S, 0, H, H);
      break;
    case AugmentOptions::Crop::kPadCrop: {
      const int dy = static_cast<int>(rng.Int(0, 2 * o.pad)) - o.pad;
      const int dx = static_cast<int>(rng.Int(0, 2 * o.pad)) - o.pad;
      plan.ys = PadTaps(S, dy, H);
      plan.xs = PadTaps(S, dx, W);
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
      plan.ys = Taps(S, top, h, H);
      plan.xs = Taps(S, left, w, W);
      break;
    }
  }
  // Output x of the flipped image is output S - 1 - x of the unflipped one.
  if (o.hflip && (rng.Next() & 1) != 0) {
    std::reverse(plan.xs.begin(), plan.xs.end());
  }
  return plan;
}

// The smallest window holding every pixel a valid tap reads (1 x 1 at the
// origin when none is valid, as a pad wider than the image can make).
PixelWindow NeededWindow(const SamplePlan& plan) {
  auto span = [](const std::vector<Tap>& taps, int* lo, int* count) {
    int first = -1, last = -1;
    for (const Tap& t : taps) {
      if (!t.valid) continue;
      first = first < 0 ? t.i0 : std::min(first, t.i0);
      last = std::max(last, t.i1);
    }
    *lo = std::max(first, 0);
    *count = first < 0 ? 1 : last - first + 1;
  };
  PixelWindow w;
  span(plan.ys, &w.top, &w.height);
  span(plan.xs, &w.left, &w.width);
  return w;
}

// Writes the augmented image: `image` holds the pixels of window `at` of the
// full image the plan was drawn for. Separable: each source row a row tap
// reads is interpolated along x once (two rows cached, as consecutive
// output rows share their source rows), then pairs of those rows along y.
// The arithmetic is the direct formula's, term by term: value / 255 per
// pixel, top = r0[i0] + (r0[i1] - r0[i0]) wx and bottom likewise,
// v = top + (bottom - top) wy, zero outside a padded crop, then
// (v - mean) / stddev.
void SampleImage(const DecodedImage& image, const PixelWindow& at,
                 const SamplePlan& plan, const AugmentOptions& o, float* out) {
  const int S = o.out_size;
  const int c = image.channels;
  const size_t row_bytes = static_cast<size_t>(image.width) * c;
  // Column taps as byte offsets of channel 0 in a decoded row.
  std::vector<size_t> x0(S), x1(S);
  std::vector<float> wx(S);
  std::vector<int> invalid_x;
  for (int x = 0; x < S; ++x) {
    const Tap& t = plan.xs[x];
    if (!t.valid) {
      invalid_x.push_back(x);
      continue;
    }
    x0[x] = static_cast<size_t>(t.i0 - at.left) * c;
    x1[x] = static_cast<size_t>(t.i1 - at.left) * c;
    wx[x] = t.w1;
  }
  std::vector<float> rows(2 * static_cast<size_t>(S));
  for (int ch = 0; ch < o.channels; ++ch) {
    const int from = c == 1 ? 0 : ch;
    const bool luma = c == 3 && o.channels == 1;
    // Source row r (full-image coordinates) interpolated along x.
    auto interpolate = [&](int r, float* h) {
      const uint8_t* p =
          image.pixels.data() + static_cast<size_t>(r - at.top) * row_bytes;
      if (luma) {
        auto value = [p](size_t i) {
          const uint32_t y = (p[i] * 19595u + p[i + 1] * 38470u +
                              p[i + 2] * 7471u + 0x8000u) >>
                             16;
          return y * (1.0f / 255.0f);
        };
        for (int x = 0; x < S; ++x) {
          const float a = value(x0[x]), b = value(x1[x]);
          h[x] = a + (b - a) * wx[x];
        }
      } else {
        p += from;
        for (int x = 0; x < S; ++x) {
          const float a = p[x0[x]] * (1.0f / 255.0f);
          const float b = p[x1[x]] * (1.0f / 255.0f);
          h[x] = a + (b - a) * wx[x];
        }
      }
      for (int x : invalid_x) h[x] = 0.0f;
    };
    int cached[2] = {-1, -1};  // source row held by rows[0..S), rows[S..2S)
    auto row_of = [&](int r, int keep) -> const float* {
      for (int k = 0; k < 2; ++k) {
        if (cached[k] == r) return &rows[static_cast<size_t>(k) * S];
      }
      const int k = cached[0] == keep ? 1 : 0;  // never evict `keep`
      cached[k] = r;
      interpolate(r, &rows[static_cast<size_t>(k) * S]);
      return &rows[static_cast<size_t>(k) * S];
    };
    const float mean = o.mean.empty() ? 0.0f : o.mean[ch];
    const float inv = o.stddev.empty() ? 1.0f : 1.0f / o.stddev[ch];
    float* dst = out + static_cast<size_t>(ch) * S * S;
    for (int y = 0; y < S; ++y) {
      const Tap& ty = plan.ys[y];
      float* row = dst + static_cast<size_t>(y) * S;
      if (!ty.valid) {
        std::fill(row, row + S, (0.0f - mean) * inv);
        continue;
      }
      const float* top = row_of(ty.i0, -1);
      const float* bottom = row_of(ty.i1, ty.i0);
      const float wy = ty.w1;
      for (int x = 0; x < S; ++x) {
        const float v = top[x] + (bottom[x] - top[x]) * wy;
        row[x] = (v - mean) * inv;
      }
    }
  }
}

}  // namespace

void AugmentImage(const DecodedImage& image, const AugmentOptions& o,
                  uint64_t rng_seed, float* out) {
  SampleImage(image, PixelWindow{0, 0, image.height, image.width},
              PlanAugment(image.height, image.width, o, rng_seed), o, out);
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
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
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
    SplitMix64 hash{options_.seed ^
                    (0x5851f42d4c957f2dull * static_cast<uint64_t>(k + 1))};
    const uint64_t seed = hash.Next();
    // Only the window the crop reads is decoded (JPEG).
    SamplePlan plan;
    PixelWindow window;
    absl::StatusOr<DecodedImage> image = DecodeImageFileWindow(
        files_.paths[sample],
        [&](int height, int width) {
          plan = PlanAugment(height, width, a, seed);
          return NeededWindow(plan);
        },
        &window);
    if (!image.ok()) return image.status();
    SampleImage(*image, window, plan, a, &batch->images.data[i * per]);
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
      absl::MutexLock lock(&mu_);
      auto buildable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || next_to_build_ >= num_batches_ ||
               next_to_build_ < consumed_ + options_.prefetch_batches;
      };
      mu_.Await(absl::Condition(&buildable));
      if (stop_ || next_to_build_ >= num_batches_) return;
      b = next_to_build_++;
    }
    Batch batch;
    {
      absl::MutexLock lock(&mu_);
      if (!spare_.empty()) {
        batch = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    absl::Status status = Build(b, &batch);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      ready_.emplace(b, std::move(batch));
    } else {
      ready_.emplace(b, std::move(status));
    }
  }
}

absl::StatusOr<bool> InputPipeline::Next(Batch* batch) {
  absl::MutexLock lock(&mu_);
  if (consumed_ >= num_batches_) return false;
  const int64_t b = consumed_;
  auto built = [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ready_.count(b) > 0;
  };
  mu_.Await(absl::Condition(&built));
  auto it = ready_.find(b);
  absl::StatusOr<Batch> result = std::move(it->second);
  ready_.erase(it);
  if (!result.ok()) {
    consumed_ = num_batches_;  // Finished: no batch after an error.
    stop_ = true;
    return result.status();
  }
  // The caller's previous batch is done with: its storage is reused for a
  // later batch (a batch of 224 x 224 images is 38 MB; allocating it anew
  // costs page faults and zeroing on every batch).
  if (batch->images.size() > 0 &&
      spare_.size() < static_cast<size_t>(options_.prefetch_batches)) {
    spare_.push_back(std::move(*batch));
  }
  *batch = *std::move(result);
  ++consumed_;
  return true;
}

int InputThreadsForCores(int cores) {
  if (cores <= 1) return 1;
  return std::clamp(cores / 4, 1, cores - 1);
}

}  // namespace pstrain
