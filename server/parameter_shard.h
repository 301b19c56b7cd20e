// ParameterShard: one shard of the parameter server, without any networking.
//
// It holds, for every chunk the partition plan gives this shard, the fp32
// master weights, the optimizer state (m, v, step count: Adam's moments, or
// SGD's momentum buffer in m; optim/optimizer.h) and the chunk's version
// (the number of updates applied). It aggregates pushed gradients and applies
// the optimizer (called Adam below) at the scheduled lr of the step:
//  - sync mode: a chunk's gradients of step v from all `num_workers` workers
//    are kept apart, then summed in worker-id order (so the result does not
//    depend on arrival order), divided by num_workers, and Adam is applied
//    once; the chunk becomes version v+1 and pulls waiting for it wake up.
//  - async mode: every push is applied at once and bumps the version.
//  - non-finite values (issue 22): a worker never pushes a chunk holding a
//    NaN or an infinity; it sends PushSkipped() for it (and for every chunk
//    after it in that step) and says so in its EndStep(). Sync mode: each
//    chunk's update is applied as soon as every worker pushed it (into a
//    second buffer: the state before it is kept) and released to pulls;
//    once every worker's EndStep() of the step is in, the step is decided:
//    if any worker found a non-finite value, every chunk is put back to its
//    state before the step (buffers swapped; the version still advances,
//    so Adam's step count t counts skipped steps too, unlike PyTorch's
//    GradScaler, which does not call step()), and a pull of the step's
//    version ends by sending every chunk again. Every worker sends the same
//    EndStep to every shard, so every shard decides alike: no shard
//    applies a partial step. A pull of version v + 1 returns once step v is
//    decided. Async mode: a skipped push is dropped and counted; chunks the
//    worker pushed before it found the value are applied (async updates are
//    per chunk anyway).
//  - buffers (BatchNorm running statistics, the plan's last tensors): a push
//    carries the worker's current values, not a gradient. Sync mode: the
//    average of the step's pushes (in worker-id order) replaces the value,
//    without Adam. Async mode: each worker's latest push is kept and the
//    value is their average. Averaging running statistics over workers, as
//    Horovod's and DDP's users do by syncing BatchNorm buffers, makes the
//    evaluated model use statistics of all the data, not of worker 0's
//    shard alone.
//
//  - bounded staleness (sync mode, options.staleness = s > 0; Ho et al.,
//    "More Effective Distributed ML via a Stale Synchronous Parallel
//    Parameter Server", NIPS 2013): a worker may push step t while the
//    chunk is at any version from t - s to t, so pushes of up to s + 1
//    steps are collected at once, each step in its own slot. Step t's
//    update is still the sync one (the average of all num_workers pushes
//    of step t, in worker-id order), applied in step order, once all of
//    them are in and step t - 1 is decided (so that at most one update is
//    undoable at a time, as above). A worker's pull for its step t asks
//    for version >= t + 1 - s (its PsExchange), so it returns at once if
//    the slowest worker is at most s steps behind, else it waits (with the
//    pull deadline naming the workers that have not ended the oldest
//    undecided step). Step ends may come for steps decided + 1 to
//    decided + 1 + s; steps are decided in order. s = 0 is plain sync bit
//    for bit: one slot, the same checks, the same arithmetic. A pulled
//    chunk may carry an update whose step is not decided yet (a later skip
//    puts it back); its version says which. A checkpoint is a deferred
//    snapshot (BeginDeferredSnapshot(); docs/ARCHITECTURE.md, Checkpoints).
//
//  - backup workers (sync mode, options.replicas_to_aggregate = R with
//    0 < R < num_workers; Chen et al., "Revisiting Distributed Synchronous
//    SGD", 2016; TensorFlow's SyncReplicasOptimizer): a step's update is
//    the average of the gradients of the first R workers to end the step,
//    the others' pushes of it are dropped and counted, and the late
//    workers pull the new version and go on. Every shard must average
//    every chunk over the same R workers, so shard 0 admits them: a
//    worker ends its step on shard 0 first (EndStepWithBackups(), claim
//    kDecide), which admits the first R ends of a step and refuses later
//    ones (the step is decided at the R-th), and the worker then ends the
//    step on every other shard with shard 0's answer (claim kAdmitted or
//    kLate). A shard other than 0 decides the step once R admitted ends
//    are in: the same R workers as shard 0's, since only shard 0 admits.
//    A chunk's update is applied at the decision (not before, as without
//    backups: the set is not known before), from the admitted workers'
//    pushes in worker-id order, divided by R; a non-finite value reported
//    by an admitted worker skips the step; a late worker's report does
//    not. A push of a step already decided is dropped and counted
//    (ShardStats::late_pushes), OK. Samples are counted from the admitted
//    ends (the late workers' batches are not trained on). With staleness
//    s too, the ends of steps decided + 1 to decided + 1 + s are admitted
//    at once (each step's first R), and steps are decided in order, each
//    once its R admitted ends are in and the step before it is decided; a
//    late worker goes on from the oldest version its pull returned.
//    Checkpoints: worker 0 may be late, so shard 0 picks the cut where the
//    admissions are (HoldCheckpointStep(), then BeginDeferredSnapshot() on
//    every shard).
//
//  - gradient clipping by global norm (sync mode, options.clip_grad_norm
//    c > 0, with or without staleness or backup workers): one more round
//    per step agrees the global norm through the workers; see "Gradient
//    clipping" in server/step_policy.h.
//
// Which of the above a shard runs, and each one's answers (who decides a
// step, whose pushes it averages, whether its update is applied before the
// decision, the checkpoint's cut, where a job rejoins, the norm's
// members), is its StepPolicy (server/step_policy.h, policy()), computed
// once from ShardOptions. The code (docs/ARCHITECTURE.md names each
// file's part): parameter_shard*.cc, sharing parameter_shard_state.h.
//
// The gRPC service (ps_service.h) only converts messages and statuses.
//
// Errors, and what they leave behind (nothing, in every case):
//  - INVALID_ARGUMENT: wrong job id, worker id outside [0, num_workers),
//    unknown chunk key, wrong element count or dtype, a second push of the
//    same chunk and step by the same worker, a layout that does not match,
//    a push holding a NaN or an infinity (never applied: one worker's
//    non-finite gradient would poison the weights of every worker for good).
//  - FAILED_PRECONDITION: push or pull before Initialize(); a sync push for a
//    step other than the chunk's current version (staleness s: outside
//    version to version + s, or more than s steps past the last decided
//    step); a second Initialize() of a generation not above the shard's.
//  - DEADLINE_EXCEEDED: Pull() or WaitReady() past their deadline.
//  - ABORTED: a push or pull of another generation than the shard's, or
//    (sync mode) of a generation whose barrier is broken (see below).
//
// Recovery (--max_restarts): the shard's state has a generation, 0 from
// the first Initialize(). When a task dies, worker 0 reopens every shard
// at its own last decided step (Reopen(), sync mode, when every shard
// still holds its state at one version), or else restores every shard to
// a checkpoint with Initialize() of a higher generation; pushes and
// pulls carry the generation their worker works on, and the shard refuses
// other generations' with ABORTED, so that no update of the abandoned
// timeline reaches the restored state. In sync mode a worker's stream that
// breaks mid-step (its process died, or it gave the step up) breaks the
// generation's barrier: no step can complete without that worker, so every
// waiting pull ends at once with ABORTED naming it, instead of at the pull
// timeout.
//
//  - row-sparse tensors (embedding tables, issue 41; SetRowSparseLayout()):
//    chunks of whole rows, pushed by the rows a batch touched (PushRows();
//    a dense Push() touches every row) under every policy above, averaged
//    over the union of the workers' rows and updated lazily on those rows
//    (server/row_sparse.h: torch.optim.SparseAdam); untouched rows keep w,
//    m and v, the version advances. Pulls, snapshots and checkpoints see
//    dense chunks.
//
// Thread-safety: all methods may be called concurrently. Each chunk has its
// own mutex, so chunks aggregate and update in parallel.
#ifndef PSTRAIN_SERVER_PARAMETER_SHARD_H_
#define PSTRAIN_SERVER_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/membership.h"
#include "common/nonfinite.h"
#include "common/partition.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "server/row_sparse.h"
#include "server/shard_chunk_state.h"
#include "server/shard_options.h"
#include "server/shard_types.h"
#include "server/shared_floats.h"
#include "server/step_policy.h"

namespace pstrain {

class ParameterShard {
 public:
  explicit ParameterShard(const ShardOptions& options);
  ~ParameterShard();
  ParameterShard(const ParameterShard&) = delete;
  ParameterShard& operator=(const ParameterShard&) = delete;

  const ShardOptions& options() const { return options_; }
  // What the options' mode says about steps: when one is decided, whose
  // pushes it averages, when its update is applied, a checkpoint's cut,
  // where a job rejoins (server/step_policy.h). Fixed at construction.
  const StepPolicy& policy() const { return policy_; }
  // ShardStats::overflowed and last_overflow, without the rest of Stats().
  int64_t overflowed(std::string* last = nullptr) const;

  // INVALID_ARGUMENT unless `job_id` is this job's and 0 <= worker_id <
  // num_workers.
  absl::Status CheckWorker(const std::string& job_id, int worker_id) const;

  // Derives the partition plan from the model layout and installs the
  // initial weights of every chunk this shard owns (all of them, each once).
  // All or nothing: on error the shard keeps the state it had.
  // The last `num_buffers` tensors are buffers (see PartitionPlan).
  // `generation` 0: a job's first Initialize (once). Above the shard's
  // generation: a restore, allowed on an initialised shard with the same
  // tensors; it replaces every chunk's weights, Adam state and version,
  // drops pending pushes, and ends the older generation's pulls (ABORTED).
  // A restore with another `partition_bytes` is a re-layout
  // (--partition_bytes=auto, worker/partition_tuner.h): the shard derives
  // the new plan and makes every chunk's state anew, so the caller must
  // first end every push, pull, step end and snapshot of the shard
  // (PsService waits for every stream and checkpoint call to end); Stats()
  // and Abort() may run meanwhile.
  // `num_shards` (0: the options') the layout's shard count: a restore with
  // another count than plan()'s is a re-layout too (an elastic job moving
  // its state onto another number of shards, issue 40); INVALID_ARGUMENT
  // unless shard_index < num_shards <= PartitionPlan::kMaxShards.
  // A restore opens a shard Reopen(close = true) closed.
  // `loss_scaler` (sync mode; null: none, an async shard ignores it): fp16
  // precision's loss scaler at the chunks' version, which the shard then
  // updates at each step it decides (LossScaler::Update with the step's
  // skip, as every worker does) and takes back with an undone decision
  // (Reopen); loss_scaler_state() reads it. INVALID_ARGUMENT unless its
  // scale is finite and > 0 and its growth_tracker >= 0.
  absl::Status Initialize(const std::vector<int64_t>& param_num_elements,
                          int64_t partition_bytes,
                          std::vector<InitChunk> chunks, int num_buffers = 0,
                          int64_t generation = 0,
                          const WorkerMembership* membership = nullptr,
                          int num_shards = 0,
                          const LossScaler::State* loss_scaler = nullptr);
  // A sync fp16 job's loss scaler after the last decided step: the state
  // every member holds for the next step (Initialize). None without.
  // Any thread.
  std::optional<LossScaler::State> loss_scaler_state() const;

  // Sync mode, after a worker died (its stream broke the barrier;
  // StepPolicy::rejoin()), or for an elastic job's planned membership
  // change: the shard takes `generation`
  // (above its own) keeping its own state as of its last decided step d, so
  // that the job goes on from where it was instead of from a checkpoint: an
  // update of step d + 1 applied but not decided is undone (its second buffers
  // swapped back), pending pushes and step ends are dropped (with staleness s,
  // those of steps d + 1 to d + 1 + s, and a deferred checkpoint cut: its
  // waiter ends ABORTED), and every chunk is at version d + 1, which it
  // returns. Every worker then redoes step d + 1, whose batch is a function of
  // the step: the same model, bit for bit, as the run nobody killed. The older
  // generation's pushes and pulls end with ABORTED; its barrier is broken
  // first, so nothing changes while the shard checks. Shards decide a step on
  // their own (a worker may die between its step ends to two shards), so the
  // caller asks every shard for the smallest version any of them stands at
  // (`expected_version`). A shard one decided step past it (d + 1 ==
  // expected_version + 1) steps back when every chunk still holds its
  // state before step d's update (plain sync: the update was applied at
  // the barrier, and no update of d + 1 has come since): the update is
  // undone bit for bit and the shard reopens at version d, as if the step
  // had not been decided. FAILED_PRECONDITION, the shard's state unchanged
  // (its barrier broken): not initialised (a restarted shard), async mode
  // with neither a membership nor `close`, `generation` not above the
  // shard's, `expected_version` >= 0 and neither d + 1 nor, undoable, d, or
  // a chunk not at version d + 1 or d + 2; the caller then restores a
  // checkpoint.
  //
  // `membership` (if not null): an elastic job's membership change (issue
  // 40): the workers of the new generation, from the version returned on
  // (its from_step is set to it). INVALID_ARGUMENT, nothing changed, if
  // it is empty, not ascending, holds an id outside [0, num_workers) or
  // lacks worker 0. Async mode (no decided step; workers come and go):
  // the generation and membership change and nothing else (every push
  // applied is final, each chunk keeps its version; `expected_version` is
  // not checked; the membership keeps the from_step sent, worker 0's
  // step; with `close`, its state as it is for the move); the buffers'
  // average forgets the workers that left; returns the smallest chunk
  // version.
  //
  // `close` (an elastic job moving its state onto another number of
  // shards, issue 40; PsService Export): the shard also stays closed to
  // every worker at `generation`: WaitReady() waits, whatever its
  // arguments, until a restore (Initialize() at a higher generation)
  // opens it, so that no worker trains on the old layout while worker 0
  // copies its state (Snapshot() of the version returned) to the new one.
  absl::StatusOr<int64_t> Reopen(int64_t generation,
                                 int64_t expected_version = -1,
                                 const WorkerMembership* membership = nullptr,
                                 bool close = false);
  // Sync mode without staleness or backup workers: an elastic job's
  // membership change planned ahead (issue 40; worker 0 at a step
  // boundary, before its first push of that step, PsClient::PlanReopen).
  // When this shard decides step `version` - 1 it takes `generation` and
  // `membership` (its from_step set to `version`) in the same decision,
  // keeping every chunk's state: no step is undone or dropped. The
  // members' requests of the generation left that belong to the decided
  // step (a pull of `version`, a late global-norm sum) are still
  // answered, a pull's end naming the generation taken
  // (last_switch()); any other request of it is ABORTED, as after a
  // Reopen(). WaitReady() wakes then. A later plan replaces this one;
  // Reopen() and a restore drop it. The decision is taken by pushes of
  // the old members, so the plan changes nothing a step already holds.
  // FAILED_PRECONDITION, nothing changed: not initialised, another
  // policy (async, staleness, backup workers: the caller reopens at once,
  // Reopen()), `generation` not the shard's + 1, or `version` - 1 not the
  // step whose ends are being collected (decided already, or ahead).
  // INVALID_ARGUMENT: a membership Reopen() refuses.
  absl::Status PlanReopen(int64_t generation, int64_t version,
                          const WorkerMembership& membership);
  // The last planned change a decision took (PlanReopen()): the
  // generation it left, the one it took, and the version it took effect
  // at; from == -1: none since the last Reopen() or restore. Any thread.
  struct GenerationSwitch {
    int64_t from = -1;
    int64_t to = -1;
    int64_t version = -1;
  };
  GenerationSwitch last_switch() const;

  // Closed by Reopen(close = true) and not restored since. Any thread.
  bool closed() const { return closed_.load(); }

  // The current generation's members (see WorkerMembership). Any thread.
  WorkerMembership membership() const;
  // The same with the generation it belongs to, read together (a planned
  // change takes both at a decision, PlanReopen()). Any thread.
  WorkerMembership membership(int64_t* generation) const;
  // How many ends decide a step of the current members: all of them, or
  // with backup workers the first members - b (at least 1), b being the
  // job's initial_workers - replicas_to_aggregate. Any thread.
  int EndsToDecide() const { return ends_to_decide_.load(); }
  int NumMembers() const { return num_members_.load(); }
  bool IsMember(int worker_id) const { return CheckMember(worker_id).ok(); }

  bool initialized() const { return initialized_.load(); }
  int64_t generation() const { return generation_.load(); }

  // Blocks until Initialize() succeeded with a generation of at least
  // `min_generation`, or `deadline` passes.
  // With `until_member` >= 0 (a worker joining an elastic job), also until
  // that worker is a member of the generation.
  absl::Status WaitReady(absl::Time deadline, int64_t min_generation = 0,
                         int until_member = -1) const;

  // The layout given to Initialize(); only valid once initialized(), and
  // replaced by a re-layout (see Initialize()).
  const PartitionPlan& plan() const { return *plan_; }

  // Pushes worker `worker_id`'s gradient of chunk (param_id, chunk_index)
  // for step `step` (the weights version the gradient was computed on).
  // `gradient` must have the chunk's element count.
  // `generation`: the pusher's (ABORTED unless it is the shard's).
  absl::Status Push(int worker_id, int32_t param_id, int32_t chunk_index,
                    int64_t step, absl::Span<const float> gradient,
                    int64_t generation = 0);

  // Writes a gradient of exactly out.size() elements into `out` (a server
  // copies a received payload straight into the shard's pending slot) and
  // returns the index of its first NaN or infinity, or -1 if none
  // (FindNonFinite()'s answer: a source that copies finds it on the way,
  // ReceivedChunkMessage::CopyFloatPayloadFindNonFinite). Called with the
  // chunk's lock held; an error aborts the push.
  using GradientSource =
      absl::FunctionRef<absl::StatusOr<int64_t>(absl::Span<float>)>;
  // As above, the gradient of `num_elements` elements coming from `fill`.
  // Checks worker, chunk, element count and step before `fill` runs, so a
  // rejected push neither calls it nor changes any state. If `fill` fails
  // (it should have checked its payload before), the push is dropped: the
  // chunk keeps its weights and its other workers' pending gradients.
  absl::Status Push(int worker_id, int32_t param_id, int32_t chunk_index,
                    int64_t step, int64_t num_elements, GradientSource fill,
                    int64_t generation = 0);

  // Row-sparse chunks: the rows of a gradient. `fill(num_elements,
  // row_elements, out)` writes the rows (offsets in the chunk) and their
  // values into `out`, under the chunk's lock, after the checks Push()
  // makes. INVALID_ARGUMENT, nothing changed, for a dense chunk, or rows
  // not strictly ascending (a duplicate), past the chunk's rows, or
  // values not row_elements per row; otherwise as Push().
  using RowSource = absl::FunctionRef<absl::Status(
      int64_t num_elements, int64_t row_elements, RowValues* out)>;
  absl::Status PushRows(int worker_id, int32_t param_id, int32_t chunk_index,
                        int64_t step, RowSource fill, int64_t generation = 0);
  // The layout's row-sparse tensors (ModelLayout.param_row_elements; see
  // PartitionPlan::Create), used by every later Initialize(): a service
  // sets them from the layout it is sent, before Initialize(). A restore
  // with other row widths than the shard's layout is refused as another
  // layout is.
  void SetRowSparseLayout(std::vector<int64_t> param_row_elements);
  // The job's total steps as worker 0 counts them (InitRequest
  // .lr_total_steps): the horizon of a cosine schedule whose own
  // total_steps is 0 (JobSpec optimizer.lr_total_steps unset); ignored by
  // any other schedule. A service sets it before Initialize(). Errors:
  // INVALID_ARGUMENT outside 0 to 1e9, or, where the schedule needs it, not
  // above its warmup steps (0 included: a worker that did not count).
  // Any thread.
  absl::Status SetLrHorizon(int64_t total_steps);
  // SetLrHorizon()'s checks alone: a service refuses a bad horizon before
  // it reads the rest of an Init.
  absl::Status CheckLrHorizon(int64_t total_steps) const;
  // The horizon set (0: none), and putting one back, 0 included, where the
  // shard refused an Init after its horizon was set (set just before the
  // new state opens to pushes: PsService::OpenWithLrHorizon).
  int64_t lr_horizon() const;
  void RestoreLrHorizon(int64_t total_steps);

  // In place of Push(): worker `worker_id` skips its chunk of `step` (a
  // non-finite value in it or in a chunk before it). The same checks as
  // Push() (worker, chunk, step, generation, once per worker and step).
  // Sync mode: counts toward the chunk's barrier; the chunk's update of
  // that step is not applied. Async mode: dropped and counted.
  absl::Status PushSkipped(int worker_id, int32_t param_id, int32_t chunk_index,
                           int64_t step, int64_t generation = 0);

  // Sync mode: worker `worker_id` has pushed (or skipped) every chunk of
  // `step` on this shard; `nonfinite` (null: none) is where it found a
  // non-finite value in that step. Once every worker's end of the step is
  // in, the step is decided (see the top of this file).
  // Errors: FAILED_PRECONDITION in async mode, before Initialize(), or for
  // a step other than the one being collected (staleness s: outside the
  // s + 1 steps after the last decided one); INVALID_ARGUMENT for a
  // second end of the step by the same worker, or an end before the
  // worker's push of every chunk (naming the chunk); ABORTED as Push().
  absl::Status EndStep(int worker_id, int64_t step,
                       const NonFiniteValue* nonfinite, int64_t generation = 0);

  // Sync mode without staleness, backup workers or clipping: worker
  // `worker_id` says, ahead of its pushes, that every value of its `step`
  // is finite (proto/ps.proto StepVerdict). With every member's verdict or
  // finite EndStep() of the step being collected in, and no change planned
  // at its decision, the step cannot be skipped: pulls announce it decided
  // (PullOrder::decided) and PlanReopen() is refused. A later PushSkipped()
  // or non-finite EndStep() of the step by that worker is INVALID_ARGUMENT.
  // A verdict of a decided step, or a repeated one, changes nothing.
  // Errors: FAILED_PRECONDITION before Initialize(), in another mode, or
  // for a later step than the one collected; ABORTED as Push().
  absl::Status NoteFiniteVerdict(int worker_id, int64_t step,
                                 int64_t generation = 0);

  // Backup workers (see the top of this file), in place of EndStep():
  // worker `worker_id` has pushed every chunk of `step` on this shard (a
  // late worker: maybe not) and trained on `samples` samples in it.
  // Returns whether the worker is in the step: on shard 0 (`claim`
  // kDecide) its decision, the first R ends of a step in, every later one
  // (of a decided step) out; on the others `claim`'s. The R-th admitted
  // end decides the step (its updates applied, its pulls answered).
  // Errors: FAILED_PRECONDITION without backup workers, in async mode,
  // before Initialize(), or for a step after the one being collected;
  // INVALID_ARGUMENT for a claim that does not fit the shard (kDecide on
  // another shard than 0, or kAdmitted/kLate on shard 0), a second end of
  // the step, an admitted end before the worker's push of every chunk
  // (naming the chunk), or an admitted end of a step decided already (a
  // worker that claims an admission shard 0 did not give); ABORTED as
  // Push().
  absl::StatusOr<bool> EndStepWithBackups(int worker_id, int64_t step,
                                          const NonFiniteValue* nonfinite,
                                          int64_t generation,
                                          AdmissionClaim claim,
                                          int64_t samples);
  // Backup workers are on: 0 < replicas_to_aggregate < num_workers.
  bool backup_workers() const { return policy_.admits(); }

  // Called once per chunk of this shard with the chunk's weights at a
  // version >= min_version. The span is valid only during the call (the
  // chunk's lock is held).
  using PullVisitor =
      std::function<void(const ChunkSpec& chunk, int64_t version,
                         absl::Span<const float> weights)>;
  // Hands each chunk to `visit` as soon as it reaches version >= min_version
  // (min_version 0: the newest), in the order chunks get there (plan order
  // among those ready together): the first aggregated chunks can be sent
  // while later ones are still aggregating, whatever order the workers push
  // in (a worker pushing during backward sends the last layers first).
  // `samples` (training samples of the worker's last step) is added to the
  // shard's throughput counter.
  //
  // `after_chunk` (optional) runs after each visit, outside the chunk's
  // lock: where a server writes the chunk it encoded in `visit`; false stops
  // the pull with CANCELLED. `cancelled` (optional) is polled every 100 ms
  // while waiting; once true the pull ends with CANCELLED (the caller's
  // stream broke). `generation`: the puller's; the pull ends with ABORTED
  // once the shard is at another one, or its barrier broke.
  //
  // Sync mode, min_version >= 1: returns only once step min_version - 1 is
  // decided (every worker's EndStep() in); if it was skipped, every chunk
  // is visited again with its restored weights and `skipped` (optional)
  // receives the decision.
  //
  // Clipping (clipping()), sync pull of min_version >= 1: `norm_partial`
  // (needed then) receives this shard's partial sum of squares of step
  // min_version - 1 once every worker has ended that step, before any
  // chunk of the step's version; false stops the pull with CANCELLED.
  //
  // `subset` (PullRequest.channel and channels: a worker with several
  // streams to the shard): only the chunks whose index i among the shard's
  // chunks (plan order) has i % subset.count == subset.index are visited;
  // the partial norm goes to index 0's pull only (`norm_partial` unused by
  // the others). Default: every chunk.
  //
  // `order` (PullOrder): which ready chunk goes first, and the early word
  // of the step's decision. Default: plan order, no word.
  using NormVisitor = std::function<bool(int64_t step, double sum_sq)>;
  absl::Status Pull(int64_t min_version, int64_t samples, absl::Time deadline,
                    const PullVisitor& visit,
                    const std::function<bool()>& after_chunk = nullptr,
                    const std::atomic<bool>* cancelled = nullptr,
                    int64_t generation = 0, SkippedStepInfo* skipped = nullptr,
                    const NormVisitor& norm_partial = nullptr,
                    PullSubset subset = {}, const PullOrder& order = {});

  // Clipping (see "Gradient clipping" in server/step_policy.h): worker
  // `worker_id` sends the squared global norm of `step`, the sum over every
  // shard of the partials its pulls received. The first sum decides the step on
  // this shard (the clipped updates applied, the version advanced, the pulls
  // answered); a later one must equal it.
  // Errors: FAILED_PRECONDITION without clipping, before Initialize(), or
  // for a step that is neither awaiting its norm (every worker's end in)
  // nor the last one decided; INVALID_ARGUMENT for a worker id out of
  // range, a sum that is negative or not finite, or one that differs from
  // the sum that decided the step; ABORTED as Push().
  absl::Status ApplyStepNorm(int worker_id, int64_t step, double sum_sq,
                             int64_t generation = 0);
  // Gradient clipping by global norm is on: sync mode, clip_grad_norm > 0.
  bool clipping() const { return policy_.clipping(); }

  // Sync mode, while the shard is at `generation`: no step of it can
  // complete any more (`reason`: which worker's stream broke). Every
  // waiting and later push and pull of that generation ends with ABORTED
  // and `reason`, until a restore (Initialize() of a higher generation).
  // A no-op in async mode and for another generation, except the one a
  // planned change just left (PlanReopen(): its members' streams carry it
  // until their next request). Thread-safe.
  void BreakBarrier(int64_t generation, const std::string& reason);
  // Sync mode without backup workers: some step of the current generation
  // has another worker's push in and not `worker_id`'s (so no pull of it
  // completes without that worker). False in async mode, with backup
  // workers (a step needs only some workers) and before Initialize().
  // Thread-safe.
  bool StepWaitsFor(int worker_id) const;

  ShardStats Stats() const;

  // Copies every chunk of this shard (weights, Adam state, version), each
  // under its own lock, in plan order: the in-memory half of a checkpoint
  // (the file is written from the copy while training goes on). Sync mode:
  // every chunk must be at `expected_version` (FAILED_PRECONDITION naming
  // the first that is not), which holds when worker 0 asks after its pull
  // of that version and before its next push, since no chunk can pass the
  // barrier without that push: a consistent cut. Async mode: each chunk as
  // it is (`expected_version` unchecked; the snapshot records each chunk's
  // version). FAILED_PRECONDITION before Initialize().
  absl::StatusOr<std::vector<ChunkSnapshot>> Snapshot(
      int64_t expected_version) const;
  // As Snapshot(), into `out`, reusing its memory (a server that
  // checkpoints every N steps keeps one snapshot: fresh memory's first
  // touch costs more than the copy). On error `out` holds a partial copy.
  absl::Status SnapshotInto(int64_t expected_version,
                            std::vector<ChunkSnapshot>* out) const;
  // One chunk's state, seen in place under its lock (VisitChunks()).
  struct ChunkView {
    const ChunkSpec& spec;
    bool is_buffer;
    int64_t version;
    absl::Span<const float> weights, m, v;  // m and v empty for buffers
  };
  // Calls `visit` with every chunk of this shard under the chunk's lock,
  // in plan order, without a copy (an elastic job's export of a closed
  // shard, which no push changes: PsService::Export); checks
  // `expected_version` as Snapshot(). CANCELLED where `visit` returns
  // false; FAILED_PRECONDITION before Initialize().
  absl::Status VisitChunks(
      int64_t expected_version,
      const std::function<bool(const ChunkView&)>& visit) const;

  // The deferred half of a checkpoint of step `version` (sync mode; what a
  // shard with bounded staleness or backup workers takes, where chunks
  // reach `version` at different times). Registers the cut:
  // each chunk copies itself into (*out)[i] (plan order, as Snapshot())
  // once it is at `version` with step version - 1 decided (its state at
  // `version` final: no skip can put it back any more): at once if it
  // already is, else just before the update of step `version` (in the
  // apply path, under the chunk's lock) or at the decision of step
  // version - 1, whichever comes first. Staleness: worker 0 registers
  // before it pushes step `version`, and no chunk applies that step
  // without its push, so every chunk is copied at `version`: one
  // consistent cut. Backup workers: shard 0 holds the step's admissions
  // until every shard registered (HoldCheckpointStep()).
  // `out` (resized here) must stay alive until AwaitDeferredSnapshot()
  // returns OK, the next registration, CancelDeferredSnapshot() or the
  // shard's end. Replaces an earlier registration.
  // FAILED_PRECONDITION (nothing registered): before Initialize(), another
  // mode, a chunk already past `version`, or one more than s + 2 steps
  // behind it (naming it): a worker 0 at step v has pulled version v - s of
  // every chunk, and shard 0's cut is at most one step past the ends it
  // admitted, whose workers pulled version cut - 1 - s; the other step
  // allows for an update a skip takes back.
  absl::Status BeginDeferredSnapshot(int64_t version,
                                     std::vector<ChunkSnapshot>* out);
  // Blocks until every chunk of the registration of `version` has copied
  // itself (OK). ABORTED once the shard leaves the generation it had at the
  // registration, its barrier breaks or Abort() (the cut will not come),
  // or the registration was cancelled or replaced; CANCELLED once
  // `*cancelled` (polled every 100 ms); DEADLINE_EXCEEDED past `deadline`,
  // naming how many chunks are still short of `version`.
  absl::Status AwaitDeferredSnapshot(
      int64_t version, absl::Time deadline,
      const std::atomic<bool>* cancelled = nullptr) const;
  // Drops the registration: no chunk writes into its `out` any more; a
  // waiter ends with ABORTED.
  void CancelDeferredSnapshot();

  // Backup workers, shard 0: the step of a checkpoint worker 0 asks for at
  // its step `min_step` (see "Backup workers" above). Returns the cut: the
  // larger of `min_step` and the first step this shard has admitted no end
  // of; until ReleaseCheckpointHold() (or `hold` passes, or the shard
  // changes generation) an end of that step waits before its admission,
  // so that the other shards can register the cut before any of them can
  // decide the step. The caller then registers this shard's deferred
  // snapshot of the cut. FAILED_PRECONDITION without backup workers, on
  // another shard than 0, or before Initialize(); OUT_OF_RANGE (nothing
  // held) where the cut would be at or past `end_step` (> 0: the job's
  // number of steps, CheckpointRequest.end_step).
  absl::StatusOr<int64_t> HoldCheckpointStep(int64_t min_step, int64_t end_step,
                                             absl::Duration hold);
  // Ends the hold (a no-op without one).
  void ReleaseCheckpointHold();
  // Backup workers, shard 0: holds, unlike HoldCheckpointStep() without
  // making the ends wait (each end of the held step or a later one is
  // answered late at once: a waiting end would stall its stream, and with
  // it the global norm of an earlier step that the settle waits for), the
  // first step this shard has not decided (at least `min_step`) and whose
  // admissions are not complete, though some workers' ends may have been
  // admitted (a step with all its admissions is decided on every shard
  // whatever the hold; with clipping it may still await its norm): no
  // step is decided past the one before it on any shard (the others
  // decide what shard 0 admits, in order) until the hold ends
  // (ReleaseCheckpointHold(), `hold` passes, or a reopen). Returns the held
  // step. For worker 0's settle before an elastic change
  // (PsClient::HoldAndSettle), which then reopens every shard at it, dropping
  // its admitted ends. FAILED_PRECONDITION as HoldCheckpointStep().
  absl::StatusOr<int64_t> HoldFirstUndecidedStep(int64_t min_step,
                                                 absl::Duration hold);

  // Ends every wait (WaitReady, Pull) now and later with ABORTED and
  // `reason`: the job has ended elsewhere (a lost worker, a cancel), so no
  // barrier will complete. Thread-safe; the first reason is kept.
  void Abort(const std::string& reason);

 private:
  // A chunk's state and one step's pushes of it (shard_chunk_state.h);
  // one step's ends (parameter_shard_state.h, as UpdateScratch).
  using StepSlot = ShardStepSlot;
  using ChunkState = ShardChunkState;
  struct StepEnds;

  // The chunk's state into `out` (its memory reused).
  void CopyChunkLocked(const ChunkState& chunk, ChunkSnapshot& out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The chunk owes a deferred snapshot and its state at snap_version is
  // final (see BeginDeferredSnapshot()): copies it and counts it.
  void MaybeSnapLocked(ChunkState& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Clears every chunk's deferred snapshot (each under its lock).
  void ClearChunkSnapshots();

  // Row-sparse chunks (parameter_shard_rows.cc): the slot's average of
  // `workers`' row pushes (once per slot, slot.averaged); the barrier's
  // lazy update of the average's rows (scaled by `clip`), undoable as a
  // dense one; and the undo of `chunk`'s last update, dense or by rows.
  RowValues& AverageRowsLocked(StepSlot& slot, const std::vector<int>& workers,
                               int64_t row_elements);
  void ApplyRowBarrierLocked(ChunkState& chunk, StepSlot& slot,
                             const std::vector<int>& workers, float clip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  void UndoLocked(ChunkState& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Delta pulls: the entries of `chunk` that changed from version
  // `have_version` to its version, if it is one update past it, that
  // update's previous weights are kept and the changed entries' indices
  // and values (`wire_bytes` each) are fewer bytes than the whole chunk;
  // else null (the whole chunk goes).
  const ChunkDelta* DeltaLocked(ChunkState& chunk, int64_t have_version,
                                int wire_bytes, ChunkDelta* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Async: ApplyLocked for `grad`'s rows (lazy); false if it overflowed.
  bool ApplyRowsLocked(ChunkState& chunk, const RowValues& grad,
                       int64_t worker_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  // Sync mode: the barrier of `chunk`'s step is complete (every worker
  // pushed or skipped it): the update, kept undoable, and the version.
  // Backup workers: `members` (per worker) are the step's admitted
  // workers, whose pushes are averaged, and `skip` says whether one of
  // them found a non-finite value; the update is final (not undoable).
  // Clipping: the update is final too, `skip` decides whether it is
  // applied, and `clip` multiplies the parameters' average gradient.
  void CompleteBarrierLocked(ChunkState& chunk,
                             const std::vector<bool>* members = nullptr,
                             bool skip = false, float clip = 1.0f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The average of `workers`' pushes in `slot` (n elements each), summed in
  // worker-id order then scaled by 1/|workers|, into the first one's
  // buffer, which it returns; once per slot (slot.averaged).
  static float* AverageInto(StepSlot& slot, const std::vector<int>& workers,
                            int64_t n);
  // Clipping: every worker's end of step `step` is in (backup workers:
  // the admitted ones, `members`): averages each chunk's pushes of
  // `members` (null: every worker; slot.averaged) and returns the sum of
  // the squares of the parameters' averages, in double, chunk by chunk in
  // plan order; 0 if the step is skipped.
  double PartialNormLocked(int64_t step, bool skip,
                           const std::vector<bool>* members)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // `members` as CompleteBarrierLocked() and PartialNormLocked() take
  // them: step `ends`' admitted workers (kAdmitted), or null: every worker.
  static const std::vector<bool>* MaskOf(StepPolicy::Members members,
                                         const StepEnds& ends);
  // Step `step`'s end by `worker_id` into `ends`, once `pushed` (called
  // under each chunk's lock) says it pushed every chunk of the step:
  // INVALID_ARGUMENT for a second end or a chunk not pushed (naming it),
  // nothing recorded; else the end, and the first non-finite report
  // (lowest worker id) as the step's skip.
  absl::Status AddEndLocked(StepEnds& ends, int worker_id, int64_t step,
                            const NonFiniteValue* nonfinite,
                            absl::FunctionRef<bool(const ChunkState&)> pushed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Step `step` is the one collected and cannot be skipped any more
  // (NoteFiniteVerdict()).
  bool FiniteByVerdictsLocked(int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Sync mode: step `deciding`'s ends are all in, and (clipping) its norm:
  // the step counters, the skip record, and the pulls woken; a change
  // planned for version `deciding` + 1 (PlanReopen()) is taken.
  void DecidedLocked(int64_t deciding, StepEnds& ends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // WaitReady() waits on init_mu_, and a planned change is taken under
  // step_mu_ only: once step_mu_ is released, a change taken wakes it.
  void WakeReadyAfterSwitch() ABSL_LOCKS_EXCLUDED(step_mu_, init_mu_);
  // Initialize()'s state installed or about to be: the shard takes
  // `generation` (a planned change dropped first, ForgetSwitchLocked()),
  // opens, and takes `membership` if not null.
  void OpenRestoredLocked(int64_t generation,
                          const WorkerMembership* membership)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(init_mu_);
  // Drops a planned change and the record of the last one taken (a
  // Reopen() or restore, before it takes its generation).
  void ForgetSwitchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Backup workers: step `step` is decided (its R admitted ends are in):
  // every chunk's update, then the step counters.
  void DecideWithBackupsLocked(int64_t step, StepEnds& ends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Sync mode: CompleteBarrierLocked() if every worker pushed the chunk's
  // step (chunk.version) and the step before it is decided.
  void MaybeCompleteLocked(ChunkState& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The slot of `step` (sync) in chunk.slots / ends_.
  size_t SlotIndex(int64_t step) const {
    return static_cast<size_t>(step % policy_.open_steps());
  }
  // Sync mode, the checks of a push (or skipped push: `what`) of `step`
  // against the chunk: its version, the previous step decided, not twice.
  absl::Status CheckSyncPushLocked(const ChunkState& chunk, int worker_id,
                                   int64_t step, absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The checks Push() and PushSkipped() share; the chunk on success.
  absl::StatusOr<ChunkState*> FindPushChunk(int worker_id, int32_t param_id,
                                            int32_t chunk_index,
                                            int64_t num_elements);

  // Pull()'s parts (server/parameter_shard_pull.cc), over the state of one
  // call (PullCursor: the chunks sent, the step it waits for, a re-send
  // after a skip, the partial norm sent). In the order a round runs them:
  // clipping: sends this shard's partial of the step once it is known
  // (CANCELLED if `norm_partial` says the stream ended);
  struct PullCursor;
  absl::Status SendNormPartialIfReady(PullCursor& cursor,
                                      const NormVisitor& norm_partial);
  // every chunk sent: true if the pull is done; false while the step is
  // undecided, or when it was skipped (every chunk goes again, `skipped`
  // receives the decision);
  bool PullFinished(PullCursor& cursor, SkippedStepInfo* skipped);
  // with PullOrder::decided: says once that the step is decided and not
  // skipped (CANCELLED if `decided` says the stream ended);
  absl::Status AnnounceDecisionIfReady(PullCursor& cursor,
                                       const PullOrder& order);
  // visits every chunk at the version asked for (order.front_first: only
  // the first ready one; order.visit_delta: a chunk one update past
  // order.have_version with few entries changed), each under its lock;
  // whether any was (ABORTED, or CANCELLED if `after_chunk` says so);
  absl::StatusOr<bool> VisitReadyChunks(
      PullCursor& cursor, int64_t generation, const PullVisitor& visit,
      const std::function<bool()>& after_chunk, const PullOrder& order);
  // none was: waits for an update after `seen` (updates_), in 100 ms
  // slices when `cancelled` can end it; ABORTED or CANCELLED as Pull();
  absl::Status AwaitPullUpdate(int64_t seen, absl::Time deadline,
                               const std::atomic<bool>* cancelled,
                               int64_t generation, int64_t min_version) const;
  // past the deadline: DEADLINE_EXCEEDED naming what the pull waits for
  // (the workers whose ends, norm or push it lacks), or nullopt if that
  // arrived just now.
  std::optional<absl::Status> PullTimeout(const PullCursor& cursor) const;
  // CANCELLED: the worker's stream ended.
  absl::Status PullCancelled() const;

  // Wakes pulls waiting for a chunk: after a version change.
  void NoteUpdate();
  // Async: one push's update (buffers are averaged in Push()) at the lr of
  // the pusher's `worker_step`, written beside the chunk's state and
  // swapped in unless NoteOverflow().
  void ApplyLocked(ChunkState& chunk, const float* gradient,
                   int64_t worker_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Where an async update is written first: one per thread.
  struct UpdateScratch;
  static UpdateScratch& ThreadUpdateScratch();
  // True if `updated` (a chunk's new weights for `step`) holds a NaN or an
  // infinity, which finite gradients can still give (a sum of workers'
  // gradients or Adam's moments past float's range): the caller then
  // leaves the chunk's state as it was. Counted and recorded for Stats().
  // Called for buffers, and for parameters only when the optimizer's own
  // check (OptimizerUpdateInto) found a non-finite weight: no extra pass.
  bool NoteOverflow(const ChunkState& chunk, int64_t step,
                    absl::Span<const float> updated);

  const ShardOptions options_;
  const StepPolicy policy_;

  absl::Status AbortedStatus() const;
  // INVALID_ARGUMENT unless 0 <= worker_id < num_workers.
  absl::Status CheckWorkerId(int worker_id) const;
  // As CheckWorkerId, and ABORTED unless the worker is a member of the
  // current generation (a push, step end or norm; a pull or WaitReady
  // needs no membership): as for another generation's request, a worker
  // left out recovers, finds it is not a member and leaves.
  absl::Status CheckMember(int worker_id) const;
  // The workers a step averages, ascending: `admitted` (backup workers'
  // admitted set) or, when null, every member.
  std::vector<int> AveragedWorkers(const std::vector<bool>* admitted) const;
  // Installs `membership` (checked) with its optimizer, under
  // membership_mu_: called with the older generation frozen (under
  // init_mu_, or under step_mu_ when a planned change is taken at a
  // decision, DecidedLocked()).
  void SetMembership(const WorkerMembership& membership)
      ABSL_LOCKS_EXCLUDED(membership_mu_);
  void SetMembershipLocked(const WorkerMembership& membership)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(membership_mu_);
  // CheckLrHorizon() under membership_mu_.
  absl::Status CheckLrHorizonLocked(int64_t total_steps) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(membership_mu_);
  // Sync: every chunk is at version decided_step_ + 1 holding its state
  // from before decided_step_'s update (undo_step), so the decision can be
  // taken back (Reopen() at version decided_step_).
  bool LastDecisionUndoableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Reopen() of an async shard for `membership` (checked; null: kept) or
  // `close`, the older generation frozen: see Reopen(). Returns the
  // smallest chunk version.
  int64_t ReopenAsyncLocked(int64_t generation,
                            const WorkerMembership* membership, bool close)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(init_mu_, step_mu_);
  // INVALID_ARGUMENT naming the chunk, step and element if `values` (a
  // pushed gradient, or buffer values) holds a NaN or an infinity;
  // `first_nonfinite` is its first one's index (-1: none), as
  // FindNonFinite(values) answers.
  absl::Status CheckFinite(int32_t param_id, int32_t chunk_index, int64_t step,
                           absl::Span<const float> values,
                           int64_t first_nonfinite) const;
  // OK if `generation` is the shard's and its barrier holds; else ABORTED.
  absl::Status CheckGeneration(int64_t generation) const;
  // As CheckGeneration(), for a request about the weights of `version` (a
  // pull's min_version; a global-norm sum: its step + 1): the generation
  // a planned change left passes for versions up to the one it took
  // effect at (PlanReopen()).
  absl::Status CheckGenerationAt(int64_t generation, int64_t version) const;
  // Checks `chunks` against the plan (each owned chunk once, sizes, versions)
  // and returns them by local chunk index; changes nothing.
  absl::StatusOr<std::vector<InitChunk*>> MatchInitChunks(
      const PartitionPlan& plan, const std::vector<int>& local_index,
      const std::vector<int64_t>& local_sizes,
      std::vector<InitChunk>& chunks) const;

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(abort_mu_);
  // Changed under init_mu_ (and read anywhere): the state's generation and
  // whether its barrier broke (with the reason, under abort_mu_).
  std::atomic<int64_t> generation_{0};
  std::atomic<bool> broken_{false};
  std::string broken_reason_ ABSL_GUARDED_BY(abort_mu_);
  mutable absl::Mutex init_mu_;
  std::atomic<bool> initialized_{false};
  // Reopen(close = true) and no restore since; written under init_mu_.
  std::atomic<bool> closed_{false};
  // The members (WorkerMembership); replaced under init_mu_ only while the
  // older generation is frozen, read anywhere through the atomic pointer.
  std::shared_ptr<const WorkerMembership> membership_;
  std::shared_ptr<const std::vector<bool>> is_member_;
  // The optimizer of the current members' steps: options_.adam, with
  // ShardOptions::linear_lr_scaling its lr scaled to the members. Set
  // with the membership; read through optimizer().
  std::shared_ptr<const OptimizerOptions> optimizer_;
  std::shared_ptr<const OptimizerOptions> optimizer() const {
    return std::atomic_load(&optimizer_);
  }
  std::atomic<int> num_members_{1};
  std::atomic<int> ends_to_decide_{1};
  int backups_ = 0;  // b: the job's num_workers - replicas_to_aggregate
  // Set by Initialize() before initialized_ becomes true; immutable
  // afterwards but for a re-layout (under init_mu_, with no push, pull or
  // snapshot running; Stats() and Abort() read chunks_ under init_mu_).
  std::unique_ptr<PartitionPlan> plan_;
  std::vector<std::unique_ptr<ChunkState>> chunks_;
  // Index into chunks_ by the plan's global chunk index; -1: not ours.
  std::vector<int> local_index_;
  // Bumped after every version change (and by Abort()), so that a pull can
  // wait for "some chunk changed". Taken after a chunk's lock, never
  // before one.
  mutable absl::Mutex updates_mu_;
  int64_t updates_ ABSL_GUARDED_BY(updates_mu_) = 0;

  // Sync mode: the oldest step whose ends (EndStep) are being collected
  // (decided_step_ + 1), and the ends of it and of the `staleness` steps
  // after it, each in ends_[SlotIndex(step)]; every step up to
  // decided_step_ is decided; the last few skipped steps. Taken before a
  // chunk's lock, never after one.
  mutable absl::Mutex step_mu_;
  int64_t ending_step_ ABSL_GUARDED_BY(step_mu_) = 0;
  std::vector<StepEnds> ends_ ABSL_GUARDED_BY(step_mu_);
  int64_t decided_step_ ABSL_GUARDED_BY(step_mu_) = -1;
  std::vector<SkippedStepInfo> recent_skips_ ABSL_GUARDED_BY(step_mu_);
  // fp16's loss scaler after decided_step_, and before its update (for a
  // Reopen that undoes that decision); none without (Initialize).
  std::optional<LossScaler::State> loss_scaler_ ABSL_GUARDED_BY(step_mu_);
  std::optional<LossScaler::State> loss_scaler_before_
      ABSL_GUARDED_BY(step_mu_);
  // Clipping: the step whose ends are all in and whose norm is awaited
  // (-1: none) and this shard's partial of it; the last step decided by
  // a norm, its partial and the sum that decided it.
  int64_t norm_step_ ABSL_GUARDED_BY(step_mu_) = -1;
  double norm_partial_ ABSL_GUARDED_BY(step_mu_) = 0;
  // The last few steps decided by a norm (oldest first): a pull of one of
  // them still gets its partial, a late sum is checked against it.
  struct NormDecision;
  std::vector<NormDecision> recent_norms_ ABSL_GUARDED_BY(step_mu_);
  // The decision of `step` among recent_norms_, or null.
  const NormDecision* RecentNormLocked(int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Clipping: if the oldest undecided step has all its ends in (backup
  // workers: its R admitted ones) and awaits no norm yet, takes its
  // partial (PartialNormLocked()) and awaits the norm; true if so.
  bool MaybeAwaitNormLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Backup workers, shard 0: a checkpoint's cut (HoldCheckpointStep()),
  // whose admissions wait until hold_until_ (-1: none); or, with
  // hold_closes_ (HoldFirstUndecidedStep()), the cut of a change, from
  // which on every end is answered late until hold_until_.
  int64_t hold_step_ ABSL_GUARDED_BY(step_mu_) = -1;
  absl::Time hold_until_ ABSL_GUARDED_BY(step_mu_);
  bool hold_closes_ ABSL_GUARDED_BY(step_mu_) = false;
  // A planned membership change (PlanReopen()), taken when step
  // version - 1 is decided.
  struct PlannedReopen {
    int64_t generation = 0;
    int64_t version = 0;
    WorkerMembership membership;
  };
  std::optional<PlannedReopen> planned_ ABSL_GUARDED_BY(step_mu_);
  // The members before the last planned change taken, for a Reopen()
  // that takes back the decision it was taken at.
  std::optional<WorkerMembership> members_before_switch_
      ABSL_GUARDED_BY(step_mu_);
  // The last planned change taken; a leaf lock (taken under a chunk's or
  // step_mu_, never before them).
  mutable absl::Mutex switch_mu_;
  GenerationSwitch last_switch_ ABSL_GUARDED_BY(switch_mu_);
  // Set when a decision took a planned change (WakeReadyAfterSwitch()).
  std::atomic<bool> wake_ready_{false};
  // decided_step_, readable under a chunk's lock: a sync push of step s
  // needs step s - 1 decided.
  std::atomic<int64_t> decided_through_{-1};
  // Resets the above for chunks at `version` (Initialize()).
  void ResetStepsLocked(int64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);

  // The deferred snapshot registered (BeginDeferredSnapshot()): its
  // version (-1: none), the generation it was registered in, and how many
  // chunks have not copied themselves yet. Taken after a chunk's lock,
  // never before one.
  mutable absl::Mutex snap_mu_;
  mutable absl::CondVar snap_cv_;  // signalled when snap_remaining_ hits 0
  int64_t snap_version_ ABSL_GUARDED_BY(snap_mu_) = -1;
  int64_t snap_generation_ ABSL_GUARDED_BY(snap_mu_) = 0;
  int64_t snap_remaining_ ABSL_GUARDED_BY(snap_mu_) = 0;
  // The registration's chunk count, for AwaitDeferredSnapshot()'s message
  // (chunks_ itself may be replaced by a re-layout meanwhile).
  int64_t snap_chunks_ ABSL_GUARDED_BY(snap_mu_) = 0;

  std::atomic<int64_t> samples_{0};
  std::atomic<int64_t> skipped_{0};
  std::atomic<int64_t> pushes_{0};
  std::atomic<int64_t> pulls_{0};
  std::atomic<int64_t> optimizer_ns_{0};
  std::atomic<int64_t> applied_{0};
  std::atomic<int64_t> late_pushes_{0};
  std::atomic<int64_t> late_steps_{0};
  std::vector<int64_t> row_elements_ ABSL_GUARDED_BY(init_mu_);
  // A leaf lock (nothing is taken under it) over SetMembership()'s
  // install, so SetLrHorizon() and a change taken at a decision do not
  // undo each other. lr_horizon_: a cosine schedule's total steps where
  // options_.adam's is 0; 0 until set.
  mutable absl::Mutex membership_mu_;
  int64_t lr_horizon_ ABSL_GUARDED_BY(membership_mu_) = 0;
  mutable absl::Mutex overflow_mu_;
  int64_t overflowed_ ABSL_GUARDED_BY(overflow_mu_) = 0;
  std::string last_overflow_ ABSL_GUARDED_BY(overflow_mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PARAMETER_SHARD_H_
