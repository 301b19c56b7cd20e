// Top-k gradient compression with error feedback, on the worker side of
// the parameter-server modes (the job's `compression: "topk:R"`,
// proto/job.proto).
//
// Each step, for each chunk of a parameter's gradient (the partition plan's
// chunks; BatchNorm buffers are values, not gradients, and go dense), the
// worker adds its residual to the gradient, pushes the k = ceil(R * n)
// entries of the largest magnitude as index/value pairs
// (TensorChunk.sparse, proto/ps.proto) and keeps the others as the next
// residual: error feedback, so that what is not sent now is sent later
// (Lin et al., "Deep Gradient Compression", ICLR 2018; Stich et al.,
// "Sparsified SGD with Memory", NeurIPS 2018; BytePS's topk compressor with
// its error-feedback wrapper). Without error feedback the unsent entries
// are dropped (for contrast: it trains worse). The shards densify a sparse
// push and average it as any other, so the step's update is the average of
// the workers' sparse gradients, exactly.
//
// Selection order: larger |value| first; among equal magnitudes the lower
// index first (a total order, so the selection is unique and the same on
// every run). The selected entries are sent in ascending index order.
//
// Residuals and checkpoints. The residual is part of the training state:
// a checkpoint of step S holds each worker's residual at the start of step
// S (`DIR/step-<S>/residual-<w>.safetensors`, worker/checkpoint.h), so that
// a resumed job goes on exactly. A worker may learn of checkpoint S only
// after it began later steps (staleness lets it run ahead), so the
// compressor keeps a ring of the last `history` residuals, each tagged
// with the step it is the residual at the start of; a step's compression
// reads the newest and writes into the oldest, and CommitStep() makes that
// the newest (a skipped or failed step is never committed). The ring costs
// no copy per step.
//
// Momentum correction and momentum factor masking (Lin et al., DGC,
// section 3.2; the job's `momentum_correction`, for SGD with momentum):
// the worker keeps a velocity u beside the residual v of each tensor and,
// per step and entry, u = m * u + (1 - dampening) * g, v = v + u
// (Nesterov, as DGC's code: u = m * (u + g), v = (v + u) + g); it pushes
// the top k of v and zeroes both u and v at the pushed entries (masking:
// a pushed entry's stale momentum does not push it again). The shards
// then apply plain SGD (momentum 0) to the average of the pushed v's:
// the momentum lives on the workers, before the selection. Float
// arithmetic, in that order, with m and 1 - dampening as floats. At a
// ratio of 1 every entry is pushed and masked each step, so u never
// carries over: plain SGD without momentum (DGC's masking, exactly; the
// warm-up's first steps are nearly so). The velocities are worker state
// as the residuals are: in the same ring and the same files.
//
// With Adam the same flag keeps Adam's moments on the workers: per step
// and entry (t = step + 1, the shards' update number in sync; Kingma & Ba's
// formula as optim/adam.h computes it)
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g * g,
//   d = (1 / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),
//   r = r + d,
// the worker pushes the top k of r, and the shards apply plain SGD at the
// job's lr (its schedule; AdamW's decay as SGD's coupled term, which is
// the same w = w (1 - lr wd) - lr d) to the average of what is pushed.
// What error feedback accumulates is then the update itself, already
// divided by each entry's RMS, so an entry pushed once in a hundred steps
// moves its weight by the sum of those steps' updates (as dense Adam
// would), not by one normalised burst (the shards' Adam on a sparse
// gradient: docs/ARCHITECTURE.md, "Sparse pushes"). The moments are not
// masked (they are the optimizer's, not a stale push). What differs from
// dense Adam with several workers: each worker's v is of its own
// gradient (higher variance than the average's), and t counts steps, not
// a shard's applied updates (equal in sync unless a step is skipped). As
// Lin et al.'s correction for momentum, and 1-bit Adam's momentum on the
// workers (Tang et al., ICML 2021), without its frozen variance.
//
// Whole tensors (as DGC's reference code, which compresses only the
// parameters of more than one dimension): a model's one-dimensional
// parameters (biases, BatchNorm's and LayerNorm's gains and shifts) are
// pushed whole every step (WholeTensors). They are a small part of the
// bytes (ResNet-18: 9,610 of 11.2 M entries) but each entry carries a
// whole channel's scale or shift, and at 1% a 64-entry gain would push one
// entry a step. Their sum (residual, velocity or Adam's update as above)
// is pushed entirely, so their residual stays zero (but for a 16-bit
// wire's rounding, below), and with momentum
// correction their velocity is not masked: the shards' plain SGD on the
// workers' average velocity is then SGD with momentum on the average
// gradient (velocities are linear in the gradients), exactly; with Adam
// each worker's update of its own moments, as for the others.
//
// Tensors: fp32, host memory, element counts as the model's PS tensors.
// Thread-safety: Compress() may run concurrently for disjoint chunks of one
// step (the client's pusher threads); every other call is the worker
// thread's, between steps.
#ifndef PSTRAIN_WORKER_TOPK_COMPRESSION_H_
#define PSTRAIN_WORKER_TOPK_COMPRESSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/wire_dtype.h"
#include "optim/adam.h"

namespace pstrain {

struct CompressionOptions {
  // The fraction of each chunk's entries pushed, in (0, 1]; 0: no
  // compression.
  double topk_ratio = 0;
  // Keep the unsent entries as residuals (true), or drop them.
  bool error_feedback = true;
  // Sparsity warm-up (Lin et al., "Deep Gradient Compression", ICLR 2018,
  // section 3.3): step t < warmup_steps pushes the fraction
  // s * (topk_ratio / s)^(t / warmup_steps), s = warmup_start (s at step
  // 0, falling exponentially to topk_ratio). 0: topk_ratio from the first
  // step.
  int64_t warmup_steps = 0;
  // The warm-up's first fraction s, in [topk_ratio, 1]; 1 (the default)
  // starts dense. DGC's schedule starts at sparsity 75% (s = 0.25) and
  // divides the fraction by 4 each epoch: fewer bytes in the warm-up
  // (BENCHMARKS.md), but on ResNet-18's one epoch it ended further from
  // fp32 by the median of 3 seeds (docs/ARCHITECTURE.md, "Sparse pushes").
  double warmup_start = 1;
  // Steps 0 to dense_steps - 1 push every entry (ratio 1); the warm-up,
  // if any, starts after them (step t >= dense_steps pushes RatioAt of
  // t - dense_steps as above). 0: none.
  int64_t dense_steps = 0;
  // Momentum correction (above): the SGD momentum the worker applies
  // before the selection, in (0, 1); 0: none (the residual accumulates
  // the gradient itself). Needs error_feedback.
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  // Adam's moments on the workers (the job's `momentum_correction` with
  // Adam; above): 0 < beta1, beta2 < 1, epsilon > 0 as the job's Adam.
  bool adam = false;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;

  // The fraction pushed at step `step` (sync: the step; async: the
  // worker's pushes so far).
  double RatioAt(int64_t step) const;

  bool enabled() const { return topk_ratio > 0; }
  bool momentum_correction() const {
    return enabled() && (momentum > 0 || adam);
  }
  // Moment tensors the worker keeps per parameter: 0, 1 (SGD's velocity)
  // or 2 (Adam's m and v).
  int moments() const { return !momentum_correction() ? 0 : adam ? 2 : 1; }
};

// Parses a job's `compression`: "" or "none" (no compression), or
// "topk:R" with 0 < R <= 1. INVALID_ARGUMENT naming the text and what was
// expected otherwise.
absl::StatusOr<CompressionOptions> ParseCompression(absl::string_view text);
// "none" or "topk:R" (R as given).
std::string CompressionSpelling(const CompressionOptions& options);

// k of a chunk of `n` elements: ceil(ratio * n), at least 1 (n > 0).
int64_t TopKCount(double ratio, int64_t n);

// Which of a model's parameters (their shapes, in the PS tensors' order)
// a top-k job pushes whole: those of one dimension (above).
std::vector<bool> WholeTensors(const std::vector<std::vector<int64_t>>& shapes);

// Writes into `indices` (ascending) the positions of the `k` entries of
// `values` of the largest magnitude, ties to the lower index (the order
// above; a NaN counts as larger than infinity). k <= values.size().
// For k <= n / 8 of n >= 65,536 entries (a push's chunk), a sampled
// threshold: every 64th entry's magnitude gives one that about 1.25 k
// entries reach (the sample's quantile plus four standard deviations of
// its count), one pass collects those, and std::nth_element among them
// picks the k; exact, since the k largest all reach a threshold that at
// least k reach (else, or where more than n / 8 reach it, the radix select
// runs instead). Otherwise a radix select on the magnitudes' bit patterns:
// one pass counts them in 2,048 bins (an eighth of an octave each), a
// second collects the bins above the k-th entry's and the entries of its
// bin, among which the rest are chosen. Both O(n): the radix select ~3 ns
// an element on one core, the sampled one about a third of that, against
// ~17 ns for std::nth_element over all of them (bench/topk_bench.cc).
// Thread-safe for distinct outputs (thread-local scratch).
void SelectTopK(absl::Span<const float> values, int64_t k,
                std::vector<uint32_t>* indices);

class TopKCompressor {
 public:
  // `sizes`: element counts of the tensors that are compressed (the
  // model's parameters, not its buffers). `history` >= 2: residuals kept
  // (the worker's staleness bound + 3 covers every checkpoint it can hear
  // of late). `whole` (empty: none; else one flag per tensor): tensors
  // pushed whole every step (see WholeTensors).
  TopKCompressor(const CompressionOptions& options, std::vector<int64_t> sizes,
                 int history, std::vector<bool> whole = {});

  const CompressionOptions& options() const { return options_; }
  int num_tensors() const { return static_cast<int>(sizes_.size()); }
  int64_t size(int tensor) const { return sizes_[tensor]; }
  bool whole(int tensor) const {
    return !whole_.empty() && whole_[static_cast<size_t>(tensor)];
  }
  // The worker state a checkpoint holds: the residuals of the
  // num_tensors() tensors, then (momentum correction) their velocities, or
  // Adam's m, then v.
  int num_state_tensors() const {
    return num_tensors() * (1 + options_.moments());
  }
  int64_t state_size(int i) const { return sizes_[i % num_tensors()]; }

  // Starts step `step`: picks the residual it writes (the oldest), and the
  // fraction pushed (options().RatioAt(step)). The step reads the newest
  // residual, whatever its tag (a backup worker that jumped over steps had
  // no pushes between them).
  void BeginStep(int64_t step);

  // One chunk of step `step` (BeginStep() first): elements [offset, offset
  // + gradient.size()) of tensor `tensor`. Adds the residual to
  // `gradient` (momentum correction: the updated velocity, above),
  // selects the top k of the sum, writes their offsets within the chunk
  // into `indices` and their values into `values`, and (with error
  // feedback) the rest into the step's residual. A whole tensor's chunk
  // selects every entry and keeps its velocity unmasked.
  //
  // `wire`: the dtype the values go in (common/wire_dtype.h). With a
  // 16-bit one and error feedback, what its rounding drops (each value
  // minus RoundThroughWire's of the chunk's values, the bits the shard
  // receives) stays in the residual at the pushed entries instead of 0,
  // so the rounding is fed back as the unsent entries are (Seide et al.,
  // "1-bit SGD", Interspeech 2014; Karimireddy et al., "Error Feedback
  // Fixes SignSGD", ICML 2019). `values` stay unrounded: the encoder
  // rounds them once, to the same bits.
  void Compress(int tensor, int64_t offset, absl::Span<const float> gradient,
                std::vector<uint32_t>* indices, std::vector<float>* values,
                DType wire = DTYPE_FLOAT32);

  // Step `step` was pushed and taken (not skipped, not failed): its
  // residual becomes the newest, the residual at the start of step + 1.
  void CommitStep(int64_t step);

  // The step the newest residual is the start of (0 before any commit).
  int64_t newest_step() const;

  // The state (num_state_tensors() spans: residuals, then velocities) at
  // the start of step `step`: that of the newest commit at
  // or before it (the caller knows no later step before `step` will still
  // commit: its next step is at or past `step`). FAILED_PRECONDITION when
  // the ring no longer holds it.
  absl::StatusOr<std::vector<absl::Span<const float>>> ResidualAt(
      int64_t step) const;

  // Sets the state (num_state_tensors() tensors, as ResidualAt) at the
  // start of `step` (a resumed or restored job), dropping the rest of the
  // ring. `residuals` empty: zeros.
  // INVALID_ARGUMENT for a wrong tensor count or size.
  absl::Status Reset(int64_t step,
                     const std::vector<std::vector<float>>& residuals);
  // Goes back to the state at the start of `step` held in the ring (the
  // one ResidualAt(step) gives), in place: the commits after `step` are
  // dropped. False, and the ring unchanged, where it holds none at or
  // before `step` (or keeps no residuals).
  bool RewindTo(int64_t step);

 private:
  int Newest() const;

  CompressionOptions options_;
  std::vector<int64_t> sizes_;
  std::vector<bool> whole_;
  // ring_[b][t]: buffer b's residual of tensor t (t < num_tensors()) or
  // velocity of tensor t - num_tensors(); tags_[b]: the step it is the
  // start of (-1: unused).
  std::vector<std::vector<std::vector<float>>> ring_;
  std::vector<int64_t> tags_;
  // The buffers the step in flight reads and writes.
  int read_ = 0;
  int write_ = 1;
  double ratio_ = 0;
  // Adam (momentum correction): optim/adam.h's scalars of the step in
  // flight at lr 1 (step_size = 1 / (1 - beta1^t)).
  AdamStepConstants adam_step_{};
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TOPK_COMPRESSION_H_
