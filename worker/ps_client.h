// PsClient: a worker's connection to every parameter-server shard.
//
// Long-lived bidirectional PushPull streams to each shard carry, each step,
// the gradient chunks the partition plan assigns to that shard, then a pull
// of the weights; shards are served in parallel (threads per stream per
// step). With channels_per_shard N > 1 the client opens N channels (each
// its own TCP connection) to each shard, and chunk i of the shard's chunks
// (plan order) travels, both ways, on channel i mod N with its own stream:
// gRPC protects one connection's TLS records on one core at a time, so N
// connections spread encryption over N cores (proto/ps.proto PushesSent,
// PullRequest.channel). Unary calls (Init, WaitReady, Stats, WorkerDone) go
// on each shard's first channel, each with a deadline of `rpc_timeout`.
// Each stream has a deadline of `stream_timeout` from its opening, a bound
// on one stream, not on the job: a step that begins on a stream older than
// half of it first closes that stream cleanly and opens a new one, so the
// streams of a job that runs for days never reach their deadline. Within
// a step they rely on gRPC keepalive and the server's pull timeout, so
// that no call waits forever.
//
// Tensors: `params`, `gradients` and `weights` are spans over each parameter
// tensor in model order, fp32, with the plan's element counts.
//
// Errors: a failed call returns its gRPC status as absl::Status, with the
// shard index and address put in front of the message: the shard's own
// status when it ended the call, UNAVAILABLE when its process or the
// connection died. A step that fails on one shard is given up on every
// shard at once (their streams cancelled), and reports that first error,
// not the CANCELLED of the others.
//
// Recovery (worker/trainer.h, --max_restarts): the client works on one
// generation of the shards' state (see RequestHeader in proto/ps.proto);
// Restore() moves every shard to a new one, WaitReady() follows it, and
// SetAddresses() points the client at a restarted shard's new address.
//
// Thread-compatible: one PsClient per worker thread (a step's own threads
// are internal).
#ifndef PSTRAIN_WORKER_PS_CLIENT_H_
#define PSTRAIN_WORKER_PS_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/chunk_message.h"
#include "common/membership.h"
#include "common/nonfinite.h"
#include "common/partition.h"
#include "common/rpc_options.h"
#include "models/backend.h"
#include "optim/loss_scaler.h"
#include "proto/ps.grpc.pb.h"
#include "server/shard_checkpoint.h"
#include "worker/topk_compression.h"

namespace pstrain {

struct PsClientOptions {
  // host:port of every shard, by shard index.
  std::vector<std::string> addresses;
  std::string job_id = "local";
  int worker_id = 0;
  // Deadline of each unary call.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Deadline of one PushPull stream, from its opening (every call has a
  // deadline); not the job's bound. BeginStep() closes a stream older than
  // half of this, between steps, and opens a new one, so a job may run for
  // many times this; one step must end within the other half (the shards'
  // pull timeout bounds its waits).
  absl::Duration stream_timeout = absl::Hours(24);
  // TLS as this worker (common/tls.h): each shard s must prove to be
  // "<job_id>.ps-<s>.pstrain". Null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sync mode with backup workers (proto/ps.proto StepEnd): each step is
  // ended on shard 0 first, and on the others with shard 0's admission.
  bool backup_workers = false;
  // The job's total steps as this worker counts them, sent with every
  // Init (InitRequest.lr_total_steps): a cosine schedule's horizon where
  // the job leaves it to the data. 0: none.
  int64_t lr_total_steps = 0;
  // Sync mode with gradient clipping by global norm (proto/ps.proto
  // NormSum): after each step's end, the worker waits for every shard's
  // partial sum of squares and sends their sum back to every shard. The
  // shards hold the clipping threshold.
  bool clip_by_global_norm = false;
  // How pushed gradients and pulled weights travel (the job's wire_dtype,
  // common/wire_dtype.h): DTYPE_FLOAT32, or a 16-bit format at half the
  // bytes, converted at the edges (the shards keep fp32).
  DType wire_dtype = DTYPE_FLOAT32;
  // Channels (TCP connections) to each shard, 1 to kMaxChannelsPerShard
  // (fewer where a shard has fewer chunks); 0: automatic, one per
  // kAutoBytesPerChannel (8 MiB) of the shard's chunks, 1 to
  // kAutoMaxChannelsPerShard (4) (common/rpc_options.h).
  int channels_per_shard = 0;
  // Top-k compression of pushed gradients (worker/topk_compression.h; not
  // owned; null: dense pushes). The client compresses each chunk of the
  // compressor's tensors as it pushes it; BeginStep/CommitStep of the
  // compressor are the caller's (the exchange knows whether a step
  // counted).
  TopKCompressor* compressor = nullptr;
  // Priority pulls (P3, Jayarajan et al. MLSys 2019; PullRequest.priority):
  // each shard sends the chunks ready together front layers first (lowest
  // param_id), so that the weights the next forward needs first arrive
  // first; and each stream pushes, among the chunks let go and waiting
  // (backward lets the last layers go first), the front layers' first,
  // so that the front chunks' barriers complete first on every shard.
  bool priority_pulls = false;
  // Delta pulls (sync mode only; PullRequest.have_version): once a pull
  // brought every chunk at one version v into the same weights, the next
  // pull says this worker holds v, and a shard may send a chunk one update
  // past it as the entries that changed (a top-k push under plain SGD).
  // The weights come out the same bit for bit. Dropped after any failure,
  // Reset(), or a change of generation or shard addresses.
  bool delta_pulls = false;
  // A test aid (PSTRAIN_HOLD_STEP_END=STEP, worker 1 only; with
  // PSTRAIN_HOLD_ONCE=FILE only in the process that creates FILE): the
  // end of step `hold_step_end` goes to shard 0 and is held from every
  // other shard (the call never returns), as a worker that dies between
  // its step ends to two shards (the test kills it there); with verdicts
  // the verdict goes first, as a worker that dies between its verdict
  // and its end. -1: none.
  int64_t hold_step_end = -1;
  // A test aid: called by a pusher once it has checked chunk `c`'s values
  // and before it writes the push (a test holds a push on the wire with
  // it); null: none.
  std::function<void(const ChunkSpec& c)> before_push_write;
};

// One step's exchange as this worker saw it (worker/metrics.h), measured
// on the system clock in FinishStep(), over every shard:
//   push: from the start of the step's first chunk write to the end of its
//     last (the pushes overlap backward, so this overlaps the compute);
//   barrier_wait (sync steps): from the end of the last push to the first
//     pulled chunk that arrives after it: the wait for the other workers'
//     pushes of the chunks pushed last (with the shard's averaging and
//     optimizer and one network trip);
//   pull: from there (async: from the end of the last push, when the pull
//     goes out) to the arrival of the last pulled chunk.
// So barrier_wait + pull = last pulled chunk's arrival - last push end.
// Bytes: the serialized PushPull messages of the step's chunks (payload
// and envelope, without gRPC's HTTP/2 framing), pushed and pulled.
struct PsStepTimes {
  absl::Duration push;
  std::optional<absl::Duration> barrier_wait;  // sync steps only
  absl::Duration pull;
  int64_t bytes_pushed = 0;
  int64_t bytes_pulled = 0;
};

class PsClient {
 public:
  // Creates one channel per shard; connects lazily.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      const PsClientOptions& options, const PartitionPlan& plan);
  ~PsClient();

  // Worker 0 only: sends the layout and initial weights to every shard;
  // with `resume` (a checkpoint's state, server/shard_checkpoint.h), also
  // each chunk's Adam state and version, so the shards go on where the
  // checkpoint left off.
  absl::Status Initialize(const std::vector<absl::Span<const float>>& params,
                          const ModelState* resume = nullptr);

  // Worker 0 only, after a task died: every shard takes `state` (a
  // checkpoint's, or the job's initial weights with empty Adam state) as
  // generation G+1, G the highest generation any shard is at (the
  // shards' Init with a generation; see proto/ps.proto): UNAVAILABLE at
  // once for a shard that is not listening; each call lasts at most
  // `timeout`. Returns the new generation, which the client then works on.
  // `membership` (an elastic job's; null: the shards keep theirs): the
  // workers of the new generation and where its data starts.
  absl::StatusOr<int64_t> Restore(
      const std::vector<absl::Span<const float>>& weights,
      const ModelState& state, absl::Duration timeout,
      const WorkerMembership* membership = nullptr);

  // Worker 0 only, after a worker died or for an elastic job's change
  // (sync mode):
  // every shard keeps its own state as of its last decided step and takes
  // generation G+1 (G as in Restore(); InitRequest.reopen), dropping the
  // step in flight. Returns the version every shard is at, which the
  // client then works on: shard 0's own where every shard has decided the
  // same step (StatsResponse.decided_step), else the smallest any stands
  // at (a worker died between its step ends to two shards), a shard one
  // decided step past it undoing that step's update (ParameterShard::
  // Reopen: plain sync, bit for bit).
  // FAILED_PRECONDITION if a shard cannot (a restarted shard holds no
  // state: "shard 1 restarted ...", before any shard is reopened) or a
  // shard cannot reopen at that version (further ahead, or its update of
  // the step applied at the decision: backup workers, clipping; that
  // shard and those after it stay at the old generation, so no worker
  // works on shards at two versions): the caller restores
  // a checkpoint instead (Restore() takes a generation above any reopened
  // one). UNAVAILABLE at once for a shard that is not listening; each call
  // lasts at most `timeout`.
  // `membership` (an elastic job's membership change, issue 40): the
  // workers of the new generation, from its version on; its from_step is
  // set by each shard to the version. Async (a membership change only):
  // every shard keeps its state as it is and the from_step sent (async has
  // no shared step); returns shard 0's smallest chunk version.
  absl::StatusOr<int64_t> Reopen(absl::Duration timeout,
                                 const WorkerMembership* membership = nullptr);

  // Worker 0 only, sync mode without staleness or backup workers, between
  // its pull of version `version` - 1 and its first push of that step: an
  // elastic job's membership change planned ahead (issue 40). Every shard
  // takes generation G+1 (G this client's) and `membership` (from
  // `version` on) when it decides step `version` - 1
  // (InitRequest.reopen_at_decision, ParameterShard::PlanReopen), so that
  // the step in flight is every member's, nothing is dropped, and the
  // members' pulls of `version` end with the new generation, which
  // FinishStep() then takes (WaitReady: its membership; membership()).
  // FAILED_PRECONDITION where a shard cannot plan (another policy; a shard
  // that owns no chunk decides no step; a shard at another generation or
  // step): the caller changes the membership at once instead (Reopen(),
  // which drops the plans other shards took). UNAVAILABLE or
  // DEADLINE_EXCEEDED as Reopen(); each call lasts at most `timeout`.
  absl::Status PlanReopen(int64_t version, const WorkerMembership& membership,
                          absl::Duration timeout);

  // Worker 0 only: asks every shard to save its part of checkpoint `step`
  // into its own checkpoint folder (see CheckpointRequest in
  // proto/ps.proto: !wait copies the state and starts the write; wait waits
  // for it). One reply per shard; the first shard's error otherwise.
  // Backup workers, !wait: `step` is worker 0's step, and the cut is the
  // step shard 0 picks (pick_step; every reply's step() says it): shard 0
  // first, which holds that step's admissions, then every other shard at
  // the cut, then shard 0's hold released (also on error). Call with
  // wait and the cut's step afterwards. `end_step` (> 0, backup workers):
  // the job's number of steps; OUT_OF_RANGE from shard 0, nothing
  // registered anywhere, where the cut would be at or past it
  // (CheckpointRequest.end_step). `latest_step`: CheckpointRequest's.
  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t end_step, int64_t latest_step, bool wait);

  // Worker 0 of a job with backup workers, before it reopens the shards
  // for a membership change or a move of their state (nothing of its step
  // `step` pushed): shard 0 holds the admissions of the first step it has
  // not decided, the cut (at least `step`; CheckpointRequest.hold_only;
  // for 10 s, or until the reopen), and this waits until every shard has
  // decided the step before it (StatsResponse.decided_step,
  // polled every 5 ms), so that every shard stands at version cut when
  // they are reopened. Returns the cut. FAILED_PRECONDITION without backup
  // workers; DEADLINE_EXCEEDED past `timeout`, naming the shard behind;
  // a shard's error otherwise.
  absl::StatusOr<int64_t> HoldAndSettle(int64_t step, absl::Duration timeout);

  // Waits until every shard is initialised (at most `timeout`) at one
  // generation of at least `min_generation`, checks each shard's layout
  // equals this worker's plan (FAILED_PRECONDITION if not: the workers
  // built different models), and works on that generation from then on.
  // `wait_for_connection`: wait (within `timeout`) for a shard that does
  // not accept connections yet, as at a job's start; false: UNAVAILABLE at
  // once (a recovering worker may hold a dead shard's address).
  // `shards_partition_bytes` non-null (--partition_bytes=auto): the shards'
  // layout may cut the same tensors into chunks of another size, which is
  // written there (every shard's must be equal); the caller then works
  // through a client of that partition (WithPartition()).
  absl::Status WaitReady(absl::Duration timeout, int64_t min_generation = 0,
                         bool wait_for_connection = true,
                         int64_t* shards_partition_bytes = nullptr);

  // A client of the same shards (their current addresses), options and
  // generation whose plan cuts the tensors into chunks of at most
  // `partition_bytes` (INVALID_ARGUMENT as PartitionPlan::Create); with
  // `compressor` non-null, that one in place of the options' (a throwaway
  // one for trial rounds). No connection is shared.
  absl::StatusOr<std::unique_ptr<PsClient>> WithPartition(
      int64_t partition_bytes, TopKCompressor* compressor = nullptr) const;

  // An elastic job changing its number of shards (issue 40; docs/
  // ARCHITECTURE.md "Elastic shards"): a client of the same options,
  // partition size and generation over the shards at `addresses` (one per
  // shard of the new layout, by index), whose plan cuts the tensors over
  // that many shards. INVALID_ARGUMENT for no address or more than
  // PartitionPlan::kMaxShards. No connection is shared.
  absl::StatusOr<std::unique_ptr<PsClient>> WithShards(
      const std::vector<std::string>& addresses) const;

  // Worker 0 of an elastic job, at a step boundary (nothing of its next
  // step pushed), moves the model's whole state (weights, Adam state,
  // versions) from these shards onto `next`'s (WithShards(): the same
  // model and partition over another number of shards, some of them these
  // shards): every shard here takes generation G+1 (G the highest any
  // shard of either layout is at) closed, keeping its state as of its last
  // decided step, and streams its chunks (proto/ps.proto ExportRequest);
  // each chunk, checked against the plan, goes on as it arrives, without
  // being decoded, on the Init stream of the shard that owns it in
  // `next`'s layout, whose first message carries generation G+2 and
  // `membership` (if not null). Each Init stream ends once every export
  // has, so that no shard applies its new chunks before its own export is
  // read out. Returns G+2, the generation `next`'s shards then stand at
  // (its WaitReady() follows). Worker 0 holds one chunk per old shard at a
  // time, not the model.
  // `version`: sync, the version every chunk must be at (the step the
  // shards settled at), else FAILED_PRECONDITION; -1 (async): every chunk
  // moves at its own version. FAILED_PRECONDITION also where a shard
  // cannot reopen (as Reopen()); DATA_LOSS for an export that does not fit
  // the plan (a chunk not its own, twice, missing, of the wrong size or
  // dtype); a new shard's error as Restore()'s. Each call lasts at most
  // `timeout`. On an error the old shards stay closed and the new ones
  // apply nothing: the caller recovers (a restore or a reopen at a higher
  // generation opens them).
  absl::StatusOr<int64_t> MoveStateTo(PsClient& next, int64_t version,
                                      const WorkerMembership* membership,
                                      absl::Duration timeout);
  const PartitionPlan& plan() const { return plan_; }

  // The generation this client's requests carry.
  int64_t generation() const { return generation_; }
  // Pulls come in bf16 or fp16 (PsClientOptions.wire_dtype).
  bool sixteen_bit_wire() const { return options_.wire_dtype != DTYPE_FLOAT32; }
  // An elastic job: the membership of the generation the last WaitReady()
  // found (none before, or from shards that send none).
  const std::optional<WorkerMembership>& membership() const {
    return membership_;
  }
  // A worker joining an elastic job: WaitReady() also waits until a
  // generation has it as a member (WaitReadyRequest.until_member).
  void set_joining(bool joining) { joining_ = joining; }
  // fp16 precision (sync): `scaler` (not owned; null: none) is the
  // worker's loss scaler. Initialize() and Restore() send its state with
  // the chunks (InitRequest.loss_scaler), and WaitReady() puts shard 0's
  // (the members' state for the generation's next step) into it, so that
  // a joining or restarted worker scales as the others do. Copied by
  // WithShards() and WithPartition(). Called on the training thread.
  void set_loss_scaler(LossScaler* scaler) { loss_scaler_ = scaler; }

  // Points shard s at addresses[s] (a restarted shard listens elsewhere):
  // the streams are dropped, and channels of changed addresses replaced.
  // Not during a step. INVALID_ARGUMENT for a wrong count.
  absl::Status SetAddresses(const std::vector<std::string>& addresses);

  // Gives up the step in flight (if any) and every stream, without waiting
  // for the shards: after a failure, before recovering.
  void Reset();

  // Pushes `gradients` as step `step` (skipped when `gradients` is empty),
  // then pulls every chunk at version >= `min_version` into `weights`:
  // BeginStep(), then FinishStep().
  absl::StatusOr<int64_t> PushPull(
      int64_t step, const std::vector<absl::Span<const float>>& gradients,
      int64_t min_version, int64_t samples,
      const std::vector<absl::Span<float>>& weights);

  // After a sync job's last step with staleness s: pulls every chunk at
  // version `version` (the job's step count) into `weights` without
  // pushing, once step version - 1 is decided. With clipping the norm
  // round of each step from `first_step` to version - 1 is answered
  // first, in step order (a pull of its next version that sends the sum of
  // the shards' partials, as a step's pusher does after its end): a step's
  // pull answers the norm of the step s before it, so no pull would answer
  // the job's last s steps' norms, and the shards would never decide
  // them. That last pull comes in fp32 and whole whatever the wire
  // (wire_dtype), so that the weights are the shards' own, not their
  // 16-bit rounding. `version` 0 (async): the shards' weights as they are.
  // Returns the smallest version pulled; errors as PushPull().
  absl::StatusOr<int64_t> PullDecided(
      int64_t first_step, int64_t version,
      const std::vector<absl::Span<float>>& weights);

  // One step in three calls, so that pushes can start during backward (as
  // BytePS schedules them) while later gradients are still being computed.
  //
  // BeginStep() opens the streams (first closing, as CloseStreams() does,
  // each one older than half of `stream_timeout`, so that no step meets a
  // stream's deadline) and starts, per shard, a thread that
  // sends the pull (sync, min_version > 0: first, so that updated chunks
  // come back while later gradients still go up; async: after the pushes,
  // so that the pulled weights include this worker's update) and pushes
  // chunks as they are let go, and a thread that reads the pulled chunks
  // into `weights` as the shard sends them. `samples` is the number of
  // training samples of this step (for the shards' throughput counters).
  // FAILED_PRECONDITION if a step is already begun; where a stream closed
  // for its age ends with an error (its shard died between steps), that
  // error as ShardError() and no step begun (the stream is dropped).
  absl::Status BeginStep(int64_t step,
                         const std::vector<absl::Span<const float>>& gradients,
                         int64_t min_version, int64_t samples,
                         const std::vector<absl::Span<float>>& weights);
  // Lets the chunks of `tensors` (indices into `gradients`) go, each once
  // `fence` (null: none) is passed, in the order given; out-of-range and
  // already released tensors are ignored. Thread-safe against the step's
  // own threads; called by the thread that called BeginStep().
  void PushReady(absl::Span<const int> tensors,
                 std::shared_ptr<CopyFence> fence);
  // Lets every other chunk go, waits for the whole pull and returns the
  // smallest version pulled. Every chunk of `weights` is written by then;
  // one whose tensor was let go may be written earlier (sync: once every
  // worker has pushed it). `gradients` go to gRPC without a copy: they must
  // not change until this returns, and it returns only once gRPC has
  // released them (INTERNAL if it still holds them after `rpc_timeout`).
  // FAILED_PRECONDITION without BeginStep().
  absl::StatusOr<int64_t> FinishStep();
  bool step_begun() const { return step_ != nullptr; }

  // Forward before the pull ends (sync steps without staleness, backup
  // workers or clipping; worker/gradient_exchange.h): with this on, each
  // sync pull asks the shards to announce the step's decision
  // (PullRequest.announce_decision). Between steps only.
  void set_announce_decisions(bool on) { announce_decisions_ = on; }
  // Row-sparse tables (the plan's row_elements; issue 41,
  // worker/ps_client_rows.cc): for the steps begun from now on, `touched[p]`
  // are the rows of table p this step's gradient holds (ascending row ids
  // of the whole table; the other rows' gradient must be zero) and
  // `next[p]` the rows the next step reads; each table's chunks are pushed
  // as those rows only and pulled as the `next` rows only (the rest of the
  // table's weights are left as they were). A tensor with no entry (or a
  // dense one) travels whole. `pull_rows` false: the pulls bring every
  // table whole (`next` unused; the next batch is not known). A pull
  // without gradients (PushPull() with none: the start, a recovery, a
  // membership change, a late worker's second pull) always brings every
  // table whole. The training thread's, before BeginStep(); a step in
  // flight (its pushes still going after a verdict, AwaitDecision())
  // keeps the rows it began with. Ids past a table are INVALID_ARGUMENT
  // from the shard.
  void SetStepRows(std::vector<std::vector<uint32_t>> touched,
                   std::vector<std::vector<uint32_t>> next,
                   bool pull_rows = true);
  // Lets every other chunk go, then waits until every stream has written
  // its pushes and its step end, and until the step's decision is known.
  // With verdicts (sends_verdicts()) it first checks every value the step
  // pushes (and the loss, MarkStepNonFinite()); all finite, each shard's
  // first stream says so ahead of its queued pushes (proto/ps.proto
  // StepVerdict) and the wait is for the decision only, which the shards
  // announce once every worker's verdict is in.
  // True: a shard announced the step decided and not skipped, so every
  // chunk the pull still brings is final and the step's outcome is known;
  // the pull goes on (AwaitTensor(), then FinishStep()). False: the pull
  // ended (complete, skipped or failed) or the decision is not announced:
  // call FinishStep(), which then waits for nothing more than it must.
  // FAILED_PRECONDITION is FinishStep()'s to report: false without a step.
  bool AwaitDecision();
  // Early verdicts (issue 39): announce_decisions on, without clipping,
  // backup workers or a compressor (whose pushes' values are only known
  // as they are compressed).
  bool sends_verdicts() const {
    return announce_decisions_ && !options_.clip_by_global_norm &&
           !options_.backup_workers && options_.compressor == nullptr;
  }
  // After AwaitDecision(): waits until every chunk of tensor `t` has been
  // pulled into the weights (at once without a step in flight, or for a
  // tensor out of range). False: the step failed (FinishStep() says why).
  // The training thread's, as every other call.
  bool AwaitTensor(int t);
  const PsClientOptions& options() const { return options_; }
  // The last step FinishStep() completed (zeros before the first).
  const PsStepTimes& last_step_times() const { return last_step_times_; }

  // Non-finite values (common/nonfinite.h, server/parameter_shard.h): each
  // chunk is checked as it is let go; from the first NaN or infinity on,
  // this step's chunks are sent as skipped pushes, and (sync) every
  // shard's step end reports where it was. MarkStepNonFinite() reports one
  // found elsewhere (the loss) the same way; call it before FinishStep().
  // No-op without a step begun.
  void MarkStepNonFinite(const NonFiniteValue& value);
  // After FinishStep() of a sync step: the shards' decision if the step
  // was skipped (by any worker), else nullopt. Async: where this worker
  // found a non-finite value, if it did (its pushes from there on were
  // dropped).
  const std::optional<SkippedStepInfo>& skipped_step() const {
    return skipped_step_;
  }
  // After FinishStep() of a sync step with backup workers: shard 0 did not
  // admit this worker to the step (its gradients were dropped).
  bool last_step_late() const { return last_step_late_; }
  // The last step with pushes that began and did not finish (FinishStep()
  // failed, or Reset() gave it up), as this worker saw it; nullopt once
  // a later step begins or a step finishes. Where `all_pushed`, every
  // chunk of it went out (a top-k compressor's residual of the step is
  // whole); the shards applied it if they decided the step (their version
  // is past it), unless shard 0 answered it late (backup workers).
  struct UnfinishedStep {
    int64_t step = 0;
    bool all_pushed = false;
    // Backup workers: shard 0's answer; -1 none came, 0 late, 1 admitted.
    int admission = -1;
  };
  const std::optional<UnfinishedStep>& unfinished_step() const {
    return unfinished_step_;
  }
  // After FinishStep(): the largest version of any chunk pulled (the
  // smallest is FinishStep()'s result). They differ only where a pull
  // straddled an update this worker did not wait for (backup workers).
  int64_t last_max_version() const { return last_max_version_; }
  // Whether the last step's pull asked for rows of a row-sparse table
  // (SetStepRows()): the worker's copy of a table is then fresh only in the
  // next batch's rows. False after a pull without pushes (every table
  // whole).
  bool last_pull_by_rows() const { return last_pull_by_rows_; }
  // The newest checkpoint step shard 0 announced on a pull
  // (PushPullResponse.checkpoint_step) in this worker's current
  // generation; -1: none (a recovery or a reopen starts a generation with
  // no checkpoint begun: the cut of an abandoned one is not this one's).
  int64_t announced_checkpoint_step() const {
    return announced_generation_ == generation_ ? announced_checkpoint_step_
                                                : -1;
  }

  // Shard `shard`'s Stats, within `timeout` (the unary deadline if not
  // given); the shard's error as ShardError().
  absl::StatusOr<StatsResponse> Stats(int shard);
  absl::StatusOr<StatsResponse> Stats(int shard, absl::Duration timeout);

  // Half-closes and finishes every PushPull stream; the next PushPull opens
  // new ones. Called before work that leaves the streams idle for long (a
  // minutes-long evaluation): gRPC's synchronous client reads keepalive ping
  // acks only while a call polls, so an idle stream can die with "keepalive
  // watchdog timeout". Errors: the first stream's final status.
  absl::Status CloseStreams();

  // Tells every shard this worker has ended its last step (its pushes are
  // in; WorkerDoneRequest.steps_ended) and returns once every member of
  // the job has, or has said Done(), or was removed after its death:
  // asks each shard again, every 5 to 100 ms, while any has a member
  // training. Returns the members still training (ascending) when it
  // stopped waiting because no push reached the shards for
  // `stall_timeout` (a member evaluating, checkpointing or dead); empty
  // when every member ended. Errors: a shard's (ShardError(); ABORTED once
  // the shard is at another generation: a restore, a reopen, a move).
  absl::StatusOr<std::vector<int>> AwaitStepsEnded(
      absl::Duration stall_timeout);

  // Tells every shard this worker has finished and closes the streams.
  absl::Status Done();

  int num_shards() const { return static_cast<int>(stubs_.size()); }
  // Channels (and streams) to shard s.
  int channels_of(int s) const { return lanes_[first_lane_[s]].count; }

 private:
  struct Stream {
    // When the stream was opened: its deadline is this + stream_timeout.
    absl::Time opened;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream;
  };

  struct StepState;

  // How a pull without pushes goes (PullDecided()): it answers its step's
  // norm round (StepState::answer_norm), and comes in fp32 and whole
  // (StepState::full_precision).
  struct PullOnly {
    bool answer_norm = false;
    bool full_precision = false;
  };
  // BeginStep(), with `pull_only` for a pull without gradients.
  absl::Status BeginStep(int64_t step,
                         const std::vector<absl::Span<const float>>& gradients,
                         int64_t min_version, int64_t samples,
                         const std::vector<absl::Span<float>>& weights,
                         PullOnly pull_only);

  // One channel to a shard and its stream: shard `shard`'s chunks i (plan
  // order) with i % count == channel.
  struct Lane {
    int shard = 0;
    int channel = 0;
    int count = 1;
    // Indices into shard_chunks_[shard].
    std::vector<int> chunks;
  };
  int num_lanes() const { return static_cast<int>(lanes_.size()); }

  PsClient(const PsClientOptions& options, const PartitionPlan& plan);
  // The highest generation any shard is at (Stats of each); where
  // `uninitialised` is given, the shards not initialised (restarted ones);
  // where `decided_steps` is, each shard's last decided step (-1: none, or
  // async), by shard index.
  absl::StatusOr<int64_t> HighestGeneration(
      absl::Duration timeout, std::vector<int>* uninitialised = nullptr,
      std::vector<int64_t>* decided_steps = nullptr);
  absl::Status InitializeAs(const std::vector<absl::Span<const float>>& params,
                            const ModelState* resume, int64_t generation,
                            const WorkerMembership* membership = nullptr);
  // An Init stream's first message: this client's layout, `generation`
  // and (if not null) `membership`.
  InitRequest FirstInitRequest(int64_t generation,
                               const WorkerMembership* membership) const;
  // InitializeAs() of shard `s`.
  absl::Status InitializeShard(
      int s, const std::vector<absl::Span<const float>>& params,
      const ModelState* resume, int64_t generation,
      const WorkerMembership* membership);
  // MoveStateTo()'s export of shard `s` at `generation`, each chunk
  // forwarded to `next`'s owner of it through `sink(shard, request)`;
  // (*chunk_versions)[i] set for each chunk i it sent.
  absl::Status ForwardShard(
      int s, int64_t generation, int64_t version, absl::Duration timeout,
      const PsClient& next,
      const std::function<absl::Status(int, InitRequest&)>& sink,
      std::vector<int64_t>* chunk_versions);
  // Runs fn(s) for every shard, each on its own thread (shard 0 on the
  // caller's); the first error by shard index.
  absl::Status ForEachShard(const std::function<absl::Status(int)>& fn);
  absl::Status ShardError(int shard, const grpc::Status& status) const;
  // A lane's part of the step: its pushes and the pull (threads of
  // BeginStep()).
  absl::Status PushPullLane(int lane, StepState* state, int64_t* version);
  absl::Status WritePushes(int lane, StepState* state);
  // The pusher thread's body: WritePushes(), and its own error cancels the
  // call.
  absl::Status RunPusher(int lane, StepState* state);
  // WritePushes' parts: one chunk's push (or its skipped push, when the
  // step holds a non-finite value), and the step's end (with backup
  // workers, shard 0's admission; with clipping, the squared norm).
  absl::Status PushChunk(int lane, StepState* state,
                         const PushPullRequest& envelope, const ChunkSpec& c);
  // (`verdict_sent`: whether this lane said the step's verdict, which it
  // still says while it waits for the other lanes' pushes.)
  absl::Status WriteStepEnd(int lane, StepState* state,
                            const PushPullRequest& envelope, bool verdict_sent);
  // Clipping: the squared global norm of the step the pull decides (the
  // sum of every shard's partial, in shard order), once every partial is
  // in; nothing where one will not come (decided without this worker).
  absl::Status WriteStepNorm(int lane, StepState* state,
                             const PushPullRequest& envelope);
  // The step is finite (StepVerdict), ahead of the lane's queued pushes.
  absl::Status WriteVerdict(int lane, StepState* state,
                            const PushPullRequest& envelope);
  // The hold_step_end test aid: never returns. With verdicts, this lane's
  // verdict goes first (once the step's values are found finite), so the
  // shard holds the verdict without the end.
  [[noreturn]] void HoldStepEnd(int lane, StepState* state,
                                const PushPullRequest& envelope,
                                bool verdict_sent);
  // The lane's pull request (its channel; samples on channel 0 only).
  grpc::ByteBuffer PullOf(int lane, const StepState& state) const;
  // PushPullShard's parts: a shard's partial squared norm (clipping), and
  // one pulled chunk copied into the step's weights (`smallest`: the
  // smallest version pulled from the shard so far, -1 for none).
  absl::Status TakeNormPartial(int shard, StepState* state,
                               const NormSum& partial);
  // A pull's last message: the checkpoint step shard 0 announces; with
  // clipping, whether a partial never came.
  // A pull's message that says its shard took a planned generation
  // (PushPullResponse.generation): recorded for FinishStep(); DATA_LOSS
  // unless it is this client's + 1.
  absl::Status TakeSwitchedGeneration(int lane, StepState* state,
                                      const PushPullResponse& message);
  // FinishStep(), every lane's pull done: where they say the shards took
  // a planned change (PlanReopen()), this client takes its generation and
  // membership (WaitReady); ABORTED where only some did, or the shards
  // went on to another generation since (a recovery follows).
  // `switched_to`: per lane, as StepState's.
  absl::Status TakeGenerationSwitch(int64_t step,
                                    const std::vector<int64_t>& switched_to);
  void TakePullEnd(int lane, StepState* state, const PushPullResponse& last);
  absl::Status TakePulledChunk(int lane, StepState* state,
                               ReceivedChunkMessage& received,
                               int64_t arrived_us, int64_t bytes,
                               int64_t* smallest);
  // Ends the step in flight at once (the destructor's path).
  void AbortStep();
  // Lets every chunk not let go yet go (FinishStep(), AwaitDecision()).
  void ReleaseAll(StepState* state);
  // AwaitDecision() with verdicts: sets state->say_finite if no value of
  // the step is non-finite (the loss marked; each chunk checked by its
  // pusher, or here while it waits, once its copy fence is passed).
  void SayFiniteIfSo(StepState* state);
  // Cancels every stream of the step but lane `except`'s (-1: all) and wakes
  // its pushers: the step failed on one stream.
  void CancelStep(StepState* state, int except);
  // Ends a broken stream and returns its status.
  absl::Status FinishStream(int lane);
  // Half-closes lane `lane`'s open stream, waits for the shard's final
  // status of it (a clean half-close is not the worker leaving: the shard
  // serves what was asked for and ends the call OK) and drops it. Not
  // during a step but from the lane's own thread.
  grpc::Status CloseStream(int lane);
  // Channels, stub and PushPull methods of shard `s` for addresses_[s].
  void Connect(int s);
  void SetHeader(RequestHeader* header) const;
  // One WorkerDone call to `shard` (proto/ps.proto), within rpc_timeout.
  grpc::Status WorkerDone(int shard, bool steps_ended,
                          WorkerDoneResponse* response);
  // The step's PsStepTimes, from its threads' records (after they joined).
  PsStepTimes StepTimesOf(const StepState& state) const;

  const PsClientOptions options_;
  const PartitionPlan plan_;
  std::vector<std::string> addresses_;
  int64_t generation_ = 0;
  // An elastic job: the membership of the generation WaitReady() found,
  // and whether WaitReady() waits until this worker is a member.
  std::optional<WorkerMembership> membership_;
  bool joining_ = false;
  LossScaler* loss_scaler_ = nullptr;  // not owned
  std::vector<std::vector<ChunkSpec>> shard_chunks_;
  // Every shard's lanes, shard by shard; shard s's first one.
  std::vector<Lane> lanes_;
  std::vector<int> first_lane_;
  // For each tensor, the (lane, index into shard_chunks_[shard]) of its
  // chunks.
  std::vector<std::vector<std::pair<int, int>>> tensor_chunks_;
  // For each chunk of the plan, its lane.
  std::vector<int> lane_of_chunk_;
  // Per lane.
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  // Per shard, on its first lane's channel (the unary calls).
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
  // PushPull on each lane's channel, as a method of ByteBuffer messages.
  std::vector<std::unique_ptr<grpc::internal::RpcMethod>> push_pull_methods_;
  // Lends each shard's pushes to gRPC (declared before streams_, so that
  // it outlives the calls holding its slices).
  std::vector<std::unique_ptr<PayloadLease>> leases_;
  // Guards each stream's context against a reset while another step
  // thread cancels it.
  absl::Mutex streams_mu_;
  std::vector<Stream> streams_;  // per lane
  // The step between BeginStep() and FinishStep(); null otherwise.
  std::unique_ptr<StepState> step_;
  // Records `state` as unfinished_step_ (a step with pushes only).
  void NoteUnfinished(StepState* state);
  std::optional<SkippedStepInfo> skipped_step_;
  std::optional<UnfinishedStep> unfinished_step_;
  bool last_step_late_ = false;
  int64_t last_max_version_ = 0;
  bool last_pull_by_rows_ = false;
  int64_t announced_checkpoint_step_ = -1;
  int64_t announced_generation_ = -1;
  PsStepTimes last_step_times_;
  bool announce_decisions_ = false;
  // Delta pulls: the version every chunk of `delta_weights_` (the weights'
  // data, per tensor) holds as the shards of generation `delta_generation_`
  // sent it; -1: none known.
  int64_t delta_base_ = -1;
  int64_t delta_generation_ = -1;
  std::vector<const float*> delta_weights_;
  // Whether `weights` are delta_weights_ at delta_base_, in this generation.
  bool HoldsDeltaBase(const std::vector<absl::Span<float>>& weights) const;
  // SetStepRows(): per tensor, whether it travels by rows, and its rows.
  // Each step keeps those it began with (StepState::rows): its pushers may
  // still read them after Step() returned on a verdict, while the next
  // step's are set (the training thread's).
  struct StepRows {
    std::vector<bool> by_rows;
    std::vector<std::vector<uint32_t>> touched, next;
    bool pull_rows = true;
  };
  std::shared_ptr<const StepRows> rows_ = std::make_shared<const StepRows>();
  // PushChunk's rows of a table's chunk: the step's touched rows in it
  // (offsets in the chunk) and their values, row-major.
  struct ChunkRows {
    std::vector<uint32_t> rows;
    std::vector<float> values;
    absl::Span<const float> Values() const { return values; }
    // The tensor element of values[i].
    int64_t ElementOf(const ChunkSpec& c, int64_t i) const {
      return c.offset + rows[i / c.row_elements] * c.row_elements +
             i % c.row_elements;
    }
  };
  // The rows of chunk `c` (its gradient `values`) the step of `rows`
  // pushes, in a per-thread buffer; null for a chunk that goes whole.
  static const ChunkRows* RowsOfChunk(const StepRows& rows, const ChunkSpec& c,
                                      absl::Span<const float> values);
  grpc::ByteBuffer EncodeRowsPush(const PushPullRequest& envelope,
                                  const ChunkSpec& c, int64_t step,
                                  const ChunkRows& rows) const;
  // The pull's PullRows entries (BeginStep()).
  void AddPullRows(PullRequest* pull) const;
};

// Channel arguments shared by every pstrain client: message size limits
// raised on purpose and keepalive pings.
grpc::ChannelArguments PsChannelArguments();

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PS_CLIENT_H_
