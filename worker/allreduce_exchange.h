// The allreduce exchange (worker/gradient_exchange.h, CreateAllreduceExchange):
// gradients averaged over the workers' collective in buckets, the optimizer
// applied on every worker. Internal to the gradient_exchange library: its
// steps are in allreduce_exchange.cc, its state (checkpoints, residual
// files, elastic worlds) in allreduce_state.cc.
//
// Thread-safety: as GradientExchange's (one worker thread), with the
// communication thread's members and the checkpoint writer's marked below.
#ifndef PSTRAIN_WORKER_ALLREDUCE_EXCHANGE_H_
#define PSTRAIN_WORKER_ALLREDUCE_EXCHANGE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/nonfinite.h"
#include "common/safetensors.h"
#include "server/row_sparse.h"
#include "server/shard_checkpoint.h"
#include "worker/gradient_exchange.h"
#include "worker/topk_allgather.h"

namespace pstrain {

// CreateAllreduceExchange's exchange (worker/gradient_exchange.h says what
// it does; its arguments are CreateAllreduceExchange's).
class AllreduceExchange : public GradientExchange {
 public:
  AllreduceExchange(Collective* collective, const OptimizerOptions& adam,
                    int64_t bucket_bytes, int num_buffers,
                    double clip_grad_norm, DType wire_dtype,
                    std::optional<ElasticWorld> elastic,
                    ExchangeCompression compression, AllreduceRows rows)
      : collective_(collective),
        adam_(adam),
        base_lr_(adam.lr),
        elastic_(std::move(elastic)),
        clip_grad_norm_(clip_grad_norm),
        wire_dtype_(wire_dtype),
        bucket_elements_(std::max<int64_t>(1, bucket_bytes / 4)),
        num_buffers_(num_buffers),
        compression_(std::move(compression)),
        rows_(std::move(rows)) {
    if (compression_.compressor != nullptr) {
      topk_.emplace(compression_.compressor.get(),
                    compression_.partition_bytes / 4, wire_dtype_);
    }
  }

  // Stops the communication thread once its collective call in flight
  // returns, and waits for the checkpoint writer.
  ~AllreduceExchange() override;

  absl::Status Start(const std::vector<absl::Span<float>>& weights,
                     const ModelState* resume) override;

  absl::StatusOr<std::optional<WorkerMembership>> AgreeMembership(
      const std::optional<WorkerMembership>& proposal) override;

  absl::StatusOr<int64_t> ChangeWorld(const WorkerMembership& next,
                                      bool after_failure,
                                      absl::Duration timeout) override;

  void LeaveWorld() override {
    if (!elastic_.has_value()) return;
    collective_ = nullptr;
    owned_.reset();
  }

  std::optional<WorkerMembership> membership() const override {
    if (!elastic_.has_value()) return std::nullopt;
    return membership_;
  }

  void set_restore_membership(MembershipAt membership_at) override {
    anchor_ = std::move(membership_at);
  }
  void set_loss_scaler(LossScaler* scaler) override { loss_scaler_ = scaler; }

  void SetStepRows(std::vector<std::vector<uint32_t>> touched,
                   std::vector<std::vector<uint32_t>> /*next*/,
                   bool /*pull_rows*/) override {
    step_rows_ = std::move(touched);  // read by the next step's thread
  }

  void GradientsReady(const std::vector<absl::Span<const float>>& gradients,
                      int64_t samples, absl::Span<const int> tensors,
                      std::shared_ptr<CopyFence> fence) override;

  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples) override;

  std::optional<SkippedStepInfo> SkippedStep() const override {
    return last_skip_;
  }

  ExchangeStepTimes LastStepTimes() const override {
    ExchangeStepTimes times;
    times.allreduce = last_allreduce_;
    times.bytes_pushed = last_traffic_.sent;
    times.bytes_pulled = last_traffic_.received;
    return times;
  }

  // Worker 0: the whole state (every worker holds the same) as one shard
  // file, step_dir/shard-0.safetensors (server/shard_checkpoint.h: one
  // chunk per tensor at the step's version). Not wait: copies it (between
  // steps, on the training thread) into buffers kept between checkpoints and
  // writes them on a thread of its own; wait: joins that thread and returns the
  // file's size and crc32.
  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t /*end_step*/, int64_t /*latest_step*/,
      const std::string& step_dir, bool wait) override;

  absl::StatusOr<bool> RestoreResiduals(const std::string& step_dir,
                                        int64_t step) override;

  // Every worker steps in lockstep with the same batch size.
  absl::StatusOr<int64_t> SamplesSoFar() override { return samples_; }
  absl::Status BeforePause() override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  // Starts this step's communication thread unless it runs.
  void StartCommunicator(const std::vector<absl::Span<const float>>* gradients)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Bucket `b`'s next weights from its summed gradients in flat_[b], as a
  // sync shard computes them: the sum times 1/W (not for one worker), then
  // the optimizer's update number step_ + 1 for parameters, the average
  // assigned for BatchNorm buffers. Runs on the communication thread; Step()
  // increments step_ only after joining it.
  //
  // Non-finite values (issue 22): every worker sees the same sums, so all
  // decide alike without a message. A bucket whose sum holds a NaN or an
  // infinity is not applied, nor is any later bucket of the step, and
  // Step() puts the tensors updated before it back (their previous weights
  // copied, the optimizer state written beside the old one and swapped).
  //
  // `clip` (ClipCoefficient(); 1: none) multiplies the parameters' average
  // gradients, as torch.nn.utils.clip_grad_norm_ does before step().
  void Update(size_t b, float clip = 1.0f);
  // Update()'s part for row-sparse table `t`: update number `step` of the
  // union's rows (union_rows_[t]; every row where SgdMovesEveryRow) of the
  // average at `average` (the table's elements), as a shard does
  // (server/row_sparse.h LazyUpdateRows), its undo in row_undo_[t]. An update
  // that overflows is put back and reported, the rest of the step applied, as a
  // shard does with a chunk's.
  void UpdateRows(int t, int64_t step, const float* average);
  // Puts tensor `t`'s state before this step's update back (a skipped
  // step, a failed one).
  void UndoUpdate(int t);
  // Row-sparse table bucket `b` (one table): every rank's step rows summed
  // in rank order into flat_[b] (zeros elsewhere), their union's ids into
  // union_rows_ (AllreduceRows in worker/gradient_exchange.h).
  absl::Status AllgatherRows(size_t b);
  // Elements per row of tensor `t` if it is a row-sparse table, else 0.
  int64_t RowElements(int t) const {
    return t < static_cast<int>(rows_.row_elements.size())
               ? rows_.row_elements[t]
               : 0;
  }

  bool AllReady(const std::vector<int>& tensors) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The communication thread: every bucket in order (the same on every
  // worker, as collectives require), each as soon as it is ready.
  void Communicate();

  // Gradient clipping by global norm (clip_grad_norm_ > 0), as
  // torch.nn.utils.clip_grad_norm_ (PyTorch 1.13): averages every bucket
  // (flat_[b] times 1/W, as Update() would) and returns
  // min(1, max_norm / (norm + 1e-6)), norm the L2 norm of all parameters'
  // average gradients (buffers left out), summed in double, the quotient in
  // fp32 as PyTorch's. 1 if the norm is not finite: Update() then skips the
  // step for the value it finds.
  float ClipCoefficient();

  // A 16-bit wire (wire_dtype_ bf16 or fp16): bucket `b`'s parameter
  // gradients are averaged over the ranks as PyTorch DDP's
  // bf16_compress_hook/fp16_compress_hook do: each rank divides its own
  // by the world size in fp32, rounds to the 16-bit type and the ranks sum
  // those (Collective::AllreduceSum16); the average comes back widened to
  // fp32. float16 first scales the bucket by 2^e, and by 2^-e after: e
  // from M, the largest divided magnitude over every rank (an
  // AllreduceMax of one value), such that W x M lands in [16384, 32768)
  // (common/wire_dtype.h's ScaleExponent of W x M): a partial sum of the
  // ring is at most W x M, so none leaves fp16's range (65504). Buffers
  // (BatchNorm's running statistics) travel in fp32 and are averaged here too:
  // flat_[b] holds averages on return.
  absl::Status Allreduce16(size_t b);
  bool wire16() const { return wire_dtype_ != DTYPE_FLOAT32; }
  // Whether bucket `b` comes back averaged (a 16-bit allreduce divides
  // before it rounds) rather than summed (fp32, top-k pairs, a table's
  // rows).
  bool ReturnsAverages(size_t b) const {
    return wire16() && !topk_.has_value() && RowElements(buckets_[b][0]) == 0;
  }

  // Top-k (compression_): bucket `b`'s buffers (its first elements: the
  // buffers are the model's last tensors, in flat_[b]) summed densely in
  // fp32, its parameters' `gradients` (by tensor id, read where they are)
  // as every rank's top-k selection (TopKAllgather). flat_[b] holds sums
  // on return.
  absl::Status AllgatherTopK(
      size_t b, const std::vector<absl::Span<const float>>& gradients);

  // The model's parameters: weights_' first tensors (the buffers follow).
  int num_params() const {
    return static_cast<int>(weights_.size()) - num_buffers_;
  }

  // What a ring allreduce of `bytes` sends (and receives) on each rank:
  // 2 (W - 1) / W of them (Patarasuk & Yuan 2009).
  int64_t RingBytes(int64_t bytes) const {
    const int64_t size = collective_->size();
    return size > 1 ? 2 * (size - 1) * bytes / size : 0;
  }

  // The start of a step's communication with top-k: the compressor's step
  // begins, and (with residual files) rank 0 tells every rank whether a
  // checkpoint of this step was begun (announced_), so that each writes its
  // residual file of it in Step().
  absl::Status BeginTopKStep();

  bool saves_residuals() const {
    return compression_.compressor != nullptr &&
           compression_.compressor->options().error_feedback &&
           compression_.step_dir != nullptr;
  }
  int worker_id() const {
    return elastic_.has_value() ? elastic_->worker_id : compression_.worker_id;
  }

  // This worker's residual file of checkpoint `step` (the residual at its
  // start: the newest commit at or before it). A failure is reported and
  // training goes on: worker 0's wait for the file fails and that
  // checkpoint is not taken (as a PS worker's, gradient_exchange.cc).
  void SaveResiduals(int64_t step);

  // Elastic jobs: leaves the world this worker is in and joins `next`'s as
  // its rank there (none: it only leaves); rank 0 announces it first
  // (ElasticWorld::announce, from world `from_epoch`, -1 at the start);
  // with `sync_state`, rank 0's state goes to every rank (SyncState).
  // membership_ becomes `next`.
  absl::Status JoinWorld(const WorkerMembership& next, bool sync_state,
                         int64_t from_epoch);

  // Rank 0's state to every rank: its step (update count), samples so far,
  // the data position of its step (anchor_) and its loss scaler's state
  // (fp16), then every tensor's weights and every parameter's optimizer
  // state. membership_ takes the step and the position.
  absl::Status SyncState();

  // Top-k after a member's death, once rank 0's state is this worker's
  // (SyncState): its residual goes to the step rank 0's is at the start
  // of (rank0_newest_), so that the residual matches the weights. A step at
  // the failure's edge may have ended on some ranks and not on others:
  // where rank 0 committed this worker's step in flight `in_flight` (which
  // it could only finish with every rank's pairs, so this worker's
  // compression of it is complete in the compressor's step buffer), it is
  // committed here too; where this worker committed a step rank 0 did not
  // finish, it is rewound.
  void AlignResiduals(int64_t in_flight);

  // A step that failed part way (a member died): the tensors it updated go
  // back to their state before it, as a skipped step's do (Step()).
  void UndoStepInFlight();

  // The collective: the caller's, or (elastic) owned_, that of the world
  // of membership_ (null once this worker left it).
  Collective* collective_;
  std::unique_ptr<Collective> owned_;
  // The optimizer; its lr follows the members with the linear scaling
  // rule (from base_lr_).
  OptimizerOptions adam_;
  const float base_lr_;
  const std::optional<ElasticWorld> elastic_;
  WorkerMembership membership_;
  // The data position of a step (ElasticMembership's), for SyncState.
  MembershipAt anchor_;
  // fp16 precision: the worker's loss scaler (set_loss_scaler); null: none.
  LossScaler* loss_scaler_ = nullptr;
  // Gradient clipping by global norm; 0: none.
  const double clip_grad_norm_;
  // DTYPE_FLOAT32, or a 16-bit wire (Allreduce16).
  const DType wire_dtype_;
  // Allreduce16's 16-bit copy of the bucket in hand, reused bucket after
  // bucket (the communication thread's).
  std::vector<uint16_t> halves_;
  // The communication thread's: flat_ already holds averages (clipping).
  bool averaged_ = false;
  const int64_t bucket_elements_;
  const int num_buffers_;
  // Set by Start(); read by both threads.
  std::vector<absl::Span<float>> weights_;
  std::vector<std::vector<int>> buckets_;
  // Each bucket's gradients (a top-k bucket's buffers only, its
  // parameters' read where they are), then their sum, then their average;
  // the communication thread's alone.
  std::vector<std::vector<float>> flat_;
  // Adam state, and the number of updates so far: written by the
  // communication thread, step_ by Step() after joining it.
  std::vector<std::vector<float>> m_;
  std::vector<std::vector<float>> v_;
  // This step's state before each tensor's update (kept for a skip), the
  // tensors updated, this worker's own first non-finite value, and the
  // step's skip: the communication thread's during a step, Step()'s after
  // joining it.
  std::vector<std::vector<float>> prev_w_, prev_m_, prev_v_;
  std::vector<int> updated_;
  std::optional<NonFiniteValue> own_nonfinite_;
  std::optional<SkippedStepInfo> skip_;
  std::optional<SkippedStepInfo> last_skip_;
  int64_t step_ = 0;
  int64_t samples_ = 0;
  // Time in AllreduceSum this step (the communication thread's), and the
  // last step's (Step()'s, after joining it).
  absl::Duration allreduce_;
  absl::Duration last_allreduce_;

  absl::Mutex mu_;
  std::thread communicator_;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<CopyFence>> fences_ ABSL_GUARDED_BY(mu_);
  const std::vector<absl::Span<const float>>* gradients_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  absl::Status communicator_status_ ABSL_GUARDED_BY(mu_);
  bool abort_ ABSL_GUARDED_BY(mu_) = false;

  // The checkpoint in flight (Checkpoint(), under checkpoint_mu_): the
  // state's copy (kept between checkpoints: no fresh memory to touch), its
  // step, its writer thread and what that wrote. The writer reads snapshot_
  // and sets checkpoint_written_ while it runs; both are touched otherwise
  // only after it is joined.
  absl::Mutex checkpoint_mu_;
  std::vector<ChunkSnapshot> snapshot_;
  int64_t checkpoint_step_ ABSL_GUARDED_BY(checkpoint_mu_) = -1;
  std::thread checkpoint_writer_ ABSL_GUARDED_BY(checkpoint_mu_);
  absl::StatusOr<safetensors::WriteResult> checkpoint_written_;

  // Top-k with error feedback (compression_.compressor non-null): the
  // sparse allgather of each bucket (the communication thread's), the
  // checkpoint step rank 0 announces (worker 0's Checkpoint() sets it
  // between steps; the communication thread reads it), the one this
  // worker heard at the start of the step (the communication thread's,
  // then Step()'s), and rank 0's newest commit from the last SyncState.
  ExchangeCompression compression_;
  std::optional<TopKAllgather> topk_;
  std::atomic<int64_t> announced_{-1};
  int64_t checkpoint_heard_ = -1;
  int64_t rank0_newest_ = -1;
  // The bytes this rank sent and received this step (the ring's or the
  // allgather's by their algorithms; the communication thread's, then
  // Step()'s) and in the last step.
  TopKAllgather::Traffic traffic_;
  TopKAllgather::Traffic last_traffic_;

  // Row-sparse tables: which tensors (AllreduceRows), the rows of the next
  // step (SetStepRows, between steps; the communication thread reads them
  // during the step), each table's union of the step's rows and its undo
  // (the communication thread's during a step, Step()'s after).
  const AllreduceRows rows_;
  std::vector<std::vector<uint32_t>> step_rows_;
  std::vector<std::vector<uint32_t>> union_rows_;
  std::vector<RowUndo> row_undo_;
  // AllgatherRows()'s scratch, kept between steps (the communication
  // thread's): this rank's message, every rank's, and a 16-bit wire's
  // rows before and after encoding.
  std::vector<uint8_t> row_message_;
  std::vector<uint8_t> row_gathered_;
  std::vector<float> row_values_;
  std::vector<uint16_t> row_halves_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_ALLREDUCE_EXCHANGE_H_
