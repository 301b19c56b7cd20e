#include "worker/topk_compression.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pstrain {

absl::StatusOr<CompressionOptions> ParseCompression(absl::string_view text) {
  CompressionOptions options;
  if (text.empty() || text == "none") return options;
  absl::string_view ratio = text;
  double r = 0;
  if (!absl::ConsumePrefix(&ratio, "topk:") || !absl::SimpleAtod(ratio, &r) ||
      !(r > 0 && r <= 1)) {
    return absl::InvalidArgumentError(
        // C-escaped: the text is a caller's (no newline or terminal
        // escape reaches a log raw).
        absl::StrCat("compression: \"", absl::CHexEscape(text.substr(0, 40)),
                     text.size() > 40 ? "...(cut)" : "",
                     "\"; expected none or topk:R with 0 < R <= 1 (the "
                     "fraction of each chunk pushed, e.g. topk:0.01)"));
  }
  options.topk_ratio = r;
  return options;
}

double CompressionOptions::RatioAt(int64_t step) const {
  if (step < dense_steps) return 1.0;
  step -= dense_steps;
  if (warmup_steps <= 0 || step >= warmup_steps) return topk_ratio;
  const double start = std::max(warmup_start, topk_ratio);
  return start * std::pow(topk_ratio / start,
                          static_cast<double>(std::max<int64_t>(step, 0)) /
                              static_cast<double>(warmup_steps));
}

std::string CompressionSpelling(const CompressionOptions& options) {
  if (!options.enabled()) return "none";
  return absl::StrCat("topk:", options.topk_ratio);
}

int64_t TopKCount(double ratio, int64_t n) {
  if (n <= 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, n);
}

namespace {

// |x| as an unsigned key of the same order: IEEE 754 magnitudes order as
// their bit patterns with the sign cleared (+0 and -0 are equal, as in
// std::fabs; a NaN's key is above infinity's).
inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffffu;
}

// The first pass's bins: a key's top 11 bits (the exponent and 3 mantissa
// bits), an eighth of an octave each.
constexpr int kBinShift = 20;
constexpr int kBins = 1 << (31 - kBinShift);

// An entry's place in the order as one number: a larger number comes first
// (the key, then the lower index).
inline uint64_t Ranked(uint32_t key, int64_t i) {
  return (static_cast<uint64_t>(key) << 32) |
         (0xffffffffu - static_cast<uint32_t>(i));
}

// The radix select over every entry (0 < k < n).
void RadixSelect(absl::Span<const float> values, int64_t k,
                 std::vector<uint32_t>* indices) {
  const int64_t n = static_cast<int64_t>(values.size());
  // A radix select. Pass 1: how many keys fall in each bin; the bin where
  // the count from the top reaches k holds the k-th key, every entry of a
  // higher bin is selected.
  std::array<int64_t, kBins> counts{};
  for (int64_t i = 0; i < n; ++i)
    ++counts[MagnitudeKey(values[i]) >> kBinShift];
  int threshold_bin = kBins - 1;
  int64_t above = 0;
  while (above + counts[threshold_bin] < k) above += counts[threshold_bin--];
  // Pass 2: the higher bins' indices (ascending), and the threshold bin's
  // entries as candidates, each packed so that a larger number comes first
  // in the order (the key, then the lower index).
  thread_local std::vector<uint32_t> selected;
  thread_local std::vector<uint64_t> candidates;
  selected.clear();
  selected.reserve(above);
  candidates.clear();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = MagnitudeKey(values[i]);
    const int bin = static_cast<int>(key >> kBinShift);
    if (bin > threshold_bin) {
      selected.push_back(static_cast<uint32_t>(i));
    } else if (bin == threshold_bin) {
      candidates.push_back(Ranked(key, i));
    }
  }
  // The first k - above candidates in the order (usually a few percent of
  // n), merged with the higher bins' into ascending order.
  const int64_t wanted = k - above;
  if (wanted < static_cast<int64_t>(candidates.size())) {
    std::nth_element(candidates.begin(), candidates.begin() + wanted,
                     candidates.end(), std::greater<uint64_t>());
    candidates.resize(wanted);
  }
  thread_local std::vector<uint32_t> chosen;
  chosen.clear();
  for (uint64_t c : candidates) {
    chosen.push_back(0xffffffffu - static_cast<uint32_t>(c));
  }
  std::sort(chosen.begin(), chosen.end());
  indices->resize(k);
  std::merge(selected.begin(), selected.end(), chosen.begin(), chosen.end(),
             indices->begin());
}

// Sampled selection, for a small k of a large chunk: the keys of every
// kSampleStride-th entry give a threshold that about 1.25 k entries reach
// (the sample's quantile with a margin of four standard deviations of its
// count); one pass collects the entries at or above it, in index order, and
// the k-th of them in the order picks the chosen. Exact whenever at least k
// entries reach the threshold (the k largest then all do); returns false,
// having written nothing, where fewer do or more than an eighth of the
// chunk does (a sample that missed the chunk's shape; the caller falls
// back to RadixSelect).
constexpr int64_t kSampleStride = 64;
constexpr int64_t kSampledFrom = 1 << 16;  // elements

bool SampledSelect(absl::Span<const float> values, int64_t k,
                   std::vector<uint32_t>* indices) {
  const int64_t n = static_cast<int64_t>(values.size());
  thread_local std::vector<uint32_t> sample;
  sample.clear();
  for (int64_t i = 0; i < n; i += kSampleStride) {
    sample.push_back(MagnitudeKey(values[i]));
  }
  const double expected = static_cast<double>(k) *
                          static_cast<double>(sample.size()) /
                          static_cast<double>(n);
  const int64_t m = static_cast<int64_t>(
      std::ceil(1.25 * expected + 4.0 * std::sqrt(expected) + 8.0));
  if (m >= static_cast<int64_t>(sample.size())) return false;
  std::nth_element(sample.begin(), sample.begin() + (m - 1), sample.end(),
                   std::greater<uint32_t>());
  const uint32_t threshold = sample[m - 1];
  const int64_t limit = n / 8;
  thread_local std::vector<uint64_t> candidates;
  candidates.clear();
  // Blocks of 16 entries, most of which no entry reaches: a branch-free
  // test of the whole block (which the compiler vectorises) first.
  constexpr int64_t kBlock = 16;
  const float* v = values.data();
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    if (end - start == kBlock) {
      uint32_t any = 0;
      for (int64_t j = 0; j < kBlock; ++j) {
        any |= MagnitudeKey(v[start + j]) >= threshold ? 1u : 0u;
      }
      if (any == 0) continue;
    }
    for (int64_t i = start; i < end; ++i) {
      const uint32_t key = MagnitudeKey(v[i]);
      if (key >= threshold) candidates.push_back(Ranked(key, i));
    }
    if (static_cast<int64_t>(candidates.size()) > limit) return false;
  }
  if (static_cast<int64_t>(candidates.size()) < k) return false;
  thread_local std::vector<uint64_t> order;
  order.assign(candidates.begin(), candidates.end());
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                   std::greater<uint64_t>());
  const uint64_t kth = order[k - 1];  // every Ranked() differs
  indices->clear();
  indices->reserve(k);
  for (uint64_t c : candidates) {
    if (c >= kth) indices->push_back(0xffffffffu - static_cast<uint32_t>(c));
  }
  return true;
}

}  // namespace

void SelectTopK(absl::Span<const float> values, int64_t k,
                std::vector<uint32_t>* indices) {
  const int64_t n = static_cast<int64_t>(values.size());
  indices->clear();
  if (k >= n) {
    indices->resize(n);
    std::iota(indices->begin(), indices->end(), 0u);
    return;
  }
  if (k <= 0) return;
  if (n >= kSampledFrom && 8 * k <= n && SampledSelect(values, k, indices)) {
    return;
  }
  RadixSelect(values, k, indices);
}

std::vector<bool> WholeTensors(
    const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<bool> whole;
  whole.reserve(shapes.size());
  for (const std::vector<int64_t>& shape : shapes) {
    whole.push_back(shape.size() <= 1);
  }
  return whole;
}

TopKCompressor::TopKCompressor(const CompressionOptions& options,
                               std::vector<int64_t> sizes, int history,
                               std::vector<bool> whole)
    : options_(options),
      sizes_(std::move(sizes)),
      whole_(std::move(whole)),
      ratio_(options.RatioAt(0)) {
  if (!whole_.empty()) whole_.resize(sizes_.size(), false);
  const int buffers = options_.error_feedback ? std::max(2, history) : 0;
  ring_.resize(buffers);
  tags_.assign(buffers, -1);
  for (auto& buffer : ring_) {
    buffer.reserve(num_state_tensors());
    for (int i = 0; i < num_state_tensors(); ++i) {
      buffer.emplace_back(state_size(i), 0.0f);
    }
  }
  if (buffers > 0) tags_[0] = 0;
}

int TopKCompressor::Newest() const {
  int newest = 0;
  for (int b = 1; b < static_cast<int>(tags_.size()); ++b) {
    if (tags_[b] > tags_[newest]) newest = b;
  }
  return newest;
}

int64_t TopKCompressor::newest_step() const {
  return tags_.empty() ? 0 : tags_[Newest()];
}

void TopKCompressor::BeginStep(int64_t step) {
  ratio_ = options_.RatioAt(step);
  if (options_.adam) {
    // Adam's own per-step scalars (rounded as the shards' Adam rounds
    // them), at lr 1: the shards apply the lr.
    AdamOptions adam;
    adam.lr = 1.0f;
    adam.beta1 = static_cast<float>(options_.beta1);
    adam.beta2 = static_cast<float>(options_.beta2);
    adam.epsilon = static_cast<float>(options_.epsilon);
    adam_step_ = AdamConstantsFor(adam, std::max<int64_t>(step, 0) + 1);
  }
  if (ring_.empty()) return;
  read_ = Newest();
  // The oldest other buffer (an unused one first: tag -1).
  write_ = read_ == 0 ? 1 : 0;
  for (int b = 0; b < static_cast<int>(tags_.size()); ++b) {
    if (b != read_ && tags_[b] < tags_[write_]) write_ = b;
  }
  // It is being overwritten: no longer the residual of its step.
  tags_[write_] = -1;
}

void TopKCompressor::Compress(int tensor, int64_t offset,
                              absl::Span<const float> gradient,
                              std::vector<uint32_t>* indices,
                              std::vector<float>* values, DType wire) {
  const int64_t n = static_cast<int64_t>(gradient.size());
  // Indexed as a raw pointer: Span's operator[] asserts its bound without
  // NDEBUG, and that branch keeps GCC from vectorising the loops below.
  const float* const grad = gradient.data();
  const bool whole_tensor = whole(tensor);
  absl::Span<const float> sum = gradient;
  float* next = nullptr;
  float* velocity = nullptr;
  if (!ring_.empty()) {
    // The sum goes straight into the step's residual, whose selected
    // entries are then cleared.
    const float* residual = ring_[read_][tensor].data() + offset;
    next = ring_[write_][tensor].data() + offset;
    if (options_.adam) {
      const int mt = num_tensors() + tensor;
      const int vt = 2 * num_tensors() + tensor;
      const float* m_in = ring_[read_][mt].data() + offset;
      const float* v_in = ring_[read_][vt].data() + offset;
      float* m_out = ring_[write_][mt].data() + offset;
      float* v_out = ring_[write_][vt].data() + offset;
      const AdamStepConstants c = adam_step_;
      for (int64_t i = 0; i < n; ++i) {
        const float g = grad[i];
        const float m = c.beta1 * m_in[i] + c.one_minus_beta1 * g;
        const float v = c.beta2 * v_in[i] + c.one_minus_beta2 * g * g;
        m_out[i] = m;
        v_out[i] = v;
        next[i] = residual[i] +
                  c.step_size * m /
                      (std::sqrt(v) * c.inv_bias_correction2_sqrt + c.epsilon);
      }
    } else if (options_.momentum_correction()) {
      const int u = num_tensors() + tensor;
      const float* previous = ring_[read_][u].data() + offset;
      velocity = ring_[write_][u].data() + offset;
      const float m = static_cast<float>(options_.momentum);
      if (options_.nesterov) {
        for (int64_t i = 0; i < n; ++i) {
          velocity[i] = (previous[i] + grad[i]) * m;
          next[i] = (residual[i] + velocity[i]) + grad[i];
        }
      } else {
        const float c = static_cast<float>(1.0 - options_.dampening);
        for (int64_t i = 0; i < n; ++i) {
          velocity[i] = m * previous[i] + c * grad[i];
          next[i] = residual[i] + velocity[i];
        }
      }
    } else {
      for (int64_t i = 0; i < n; ++i) next[i] = grad[i] + residual[i];
    }
    sum = absl::MakeConstSpan(next, n);
  }
  if (whole_tensor) {
    indices->resize(n);
    std::iota(indices->begin(), indices->end(), 0u);
  } else {
    SelectTopK(sum, TopKCount(ratio_, n), indices);
  }
  values->resize(indices->size());
  for (size_t i = 0; i < indices->size(); ++i) {
    (*values)[i] = sum[(*indices)[i]];
  }
  if (next != nullptr && wire != DTYPE_FLOAT32) {
    // What the wire's rounding drops stays behind.
    thread_local std::vector<float> rounded;
    rounded.assign(values->begin(), values->end());
    RoundThroughWire(wire, absl::MakeSpan(rounded));
    for (size_t j = 0; j < indices->size(); ++j) {
      next[(*indices)[j]] = (*values)[j] - rounded[j];
    }
  } else if (next != nullptr) {
    for (uint32_t i : *indices) next[i] = 0.0f;
  }
  if (velocity != nullptr && !whole_tensor) {
    // Momentum factor masking.
    for (uint32_t i : *indices) velocity[i] = 0.0f;
  }
}

void TopKCompressor::CommitStep(int64_t step) {
  if (ring_.empty()) return;
  tags_[write_] = step + 1;
}

absl::StatusOr<std::vector<absl::Span<const float>>> TopKCompressor::ResidualAt(
    int64_t step) const {
  std::vector<absl::Span<const float>> spans;
  if (ring_.empty()) return spans;
  int best = -1;
  for (int b = 0; b < static_cast<int>(tags_.size()); ++b) {
    if (tags_[b] >= 0 && tags_[b] <= step &&
        (best < 0 || tags_[b] > tags_[best])) {
      best = b;
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the residual at the start of step ", step,
                     " is not held (the newest is of step ", newest_step(),
                     "; ", ring_.size(), " kept)"));
  }
  // The ring holds the newest commits (a step evicts the oldest), so the
  // newest commit at or before `step`, when the ring holds one, is the
  // last one before `step`: steps between it and `step` pushed nothing (a
  // backup worker's jump).
  for (const std::vector<float>& t : ring_[best]) spans.emplace_back(t);
  return spans;
}

bool TopKCompressor::RewindTo(int64_t step) {
  const bool held = std::any_of(tags_.begin(), tags_.end(), [step](int64_t t) {
    return t >= 0 && t <= step;
  });
  if (!held) return false;
  for (int64_t& t : tags_) {
    if (t > step) t = -1;  // unused, as BeginStep marks a buffer it writes
  }
  return true;
}

absl::Status TopKCompressor::Reset(
    int64_t step, const std::vector<std::vector<float>>& residuals) {
  const int count = num_state_tensors();
  if (!residuals.empty()) {
    if (static_cast<int>(residuals.size()) != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "residuals of ", residuals.size(), " tensors; expected ", count));
    }
    for (int t = 0; t < count; ++t) {
      if (static_cast<int64_t>(residuals[t].size()) != state_size(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("residual of tensor ", t, " has ", residuals[t].size(),
                         " elements; expected ", state_size(t)));
      }
    }
  }
  if (ring_.empty()) return absl::OkStatus();
  std::fill(tags_.begin(), tags_.end(), -1);
  tags_[0] = step;
  for (int t = 0; t < count; ++t) {
    if (residuals.empty()) {
      std::fill(ring_[0][t].begin(), ring_[0][t].end(), 0.0f);
    } else {
      ring_[0][t] = residuals[t];
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
