// How a worker turns its gradients into the next weights, one per training
// mode (the rest of the training loop, worker/trainer.h, is shared):
//
//   PS (sync, async): push every gradient chunk to the shard that owns it,
//     as soon as backward has produced it (GradientsReady), and pull the new
//     weights (sync: each chunk once every worker's push of it is in;
//     async: the newest, after this worker's pushes); Adam runs on the
//     shards.
//   allreduce: average the gradients over the workers with ring allreduce
//     (worker/collective.h) in buckets of at most `bucket_bytes` (tensors in
//     reverse order, as PyTorch DDP fills its buckets). A communication
//     thread allreduces each bucket, in bucket order on every worker, as
//     soon as backward has produced all of its gradients (GradientsReady),
//     so communication overlaps the rest of backward (Li et al., "PyTorch
//     Distributed", VLDB 2020). The same thread then applies Adam to the
//     bucket's weights on every worker, while the next bucket is on the
//     wire (the optimizer overlapped with communication, as PyTorch's
//     DDP optimizer-in-backward), with the same arithmetic as a sync shard
//     (optim/optimizer.h: sum, times 1/W, one update per step at the
//     scheduled lr, Adam or SGD with the momentum buffer in the tensor's
//     m), so that in
//     exact arithmetic the two modes train the same model. BatchNorm
//     buffers are averaged and assigned, as on the shards.
//
// Tensors are the model's PS tensors (parameters, then `num_buffers`
// BatchNorm buffers): fp32, host memory, lengths in elements.
// Thread-compatible: one worker thread drives an exchange (the allreduce
// exchange's own communication thread is internal).
#ifndef PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_
#define PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/nonfinite.h"
#include "common/partition.h"
#include "models/backend.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "worker/collective.h"
#include "worker/ps_client.h"
#include "worker/topk_compression.h"

namespace pstrain {

// One step's exchange, measured where it happens (worker/metrics.h): PS
// modes: PsStepTimes (worker/ps_client.h); allreduce: the time the
// communication thread spent in the step's bucket allreduces (summed; it
// overlaps backward), and as bytes pushed and pulled what this rank sent
// and received by its algorithms (a ring allreduce of B bytes: 2 (W - 1) /
// W x B each way; top-k's allgather: (W - 1) x its message). Absent: not
// this mode's.
struct ExchangeStepTimes {
  std::optional<absl::Duration> push, barrier_wait, pull;
  std::optional<int64_t> bytes_pushed, bytes_pulled;
  std::optional<absl::Duration> allreduce;
};

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;

  // Gives every worker the same starting weights: worker 0's `weights`
  // (its initialised model) on entry; everyone's on return. The exchange
  // keeps the spans: every Step() writes the next weights into them, so
  // they must stay valid (and not move) for the exchange's lifetime.
  // With `resume` (worker 0 of a PS job, or every worker of an allreduce
  // job, resumed from a checkpoint; the weights already hold the
  // checkpoint's), the shards (allreduce: the exchange) also get its
  // optimizer state and versions (allreduce: the smallest version is the
  // update count; a sync or allreduce checkpoint has one).
  virtual absl::Status Start(const std::vector<absl::Span<float>>& weights,
                             const ModelState* resume = nullptr) = 0;

  // PS jobs that recover from failures (--max_restarts), after a step
  // failed because a task died: gives up the step in flight and every
  // stream, points the client at `addresses` (a restarted shard listens
  // elsewhere; empty: unchanged), and continues on the shards' next
  // generation (proto/ps.proto, RequestHeader): worker 0 (`restore`
  // non-null: the newest checkpoint's state, or the job's initial weights)
  // restores every shard to it first, or in sync mode (without top-k
  // residuals to restore) reopens every shard at its own last decided step when
  // all of them still hold their state at one version (see RecoveredInPlace());
  // the others wait for that. Then pulls the restored weights into the Start()
  // spans and returns the smallest version pulled. Each wait lasts at most
  // `timeout`: a shard that is not back yet, or an address that is stale (the
  // coordinator did not know of the death yet), gives UNAVAILABLE or
  // DEADLINE_EXCEEDED, and the caller tries again with fresh addresses. Top-k
  // residuals (sync): this worker's own at the shards' version, a step of it
  // that the shards decided without it seeing the end committed (a restarted or
  // joining worker's Rejoin(): the checkpoint's file of that version, or
  // zeros). UNIMPLEMENTED for allreduce.
  virtual absl::StatusOr<int64_t> Recover(
      const std::vector<std::string>& addresses, const ModelState* restore,
      absl::Duration timeout) {
    return absl::UnimplementedError(
        "allreduce jobs do not recover from failures; only parameter-server "
        "jobs do");
  }

  // In place of Start(), for a task restarted into a running PS job: the
  // shards are initialised already. Worker 0 (`restore` non-null) restores
  // them as Recover() does; the others join the shards' current
  // generation. Pulls the weights into `weights` (kept as in Start()) and
  // returns the smallest version pulled. Waits as Recover().
  virtual absl::StatusOr<int64_t> Rejoin(
      const std::vector<absl::Span<float>>& weights,
      const std::vector<std::string>& addresses, const ModelState* restore,
      absl::Duration timeout) {
    return Recover(addresses, restore, timeout);
  }

  // After worker 0's Recover() or Rejoin(): whether the shards were
  // reopened at their own state (sync mode, every shard alive and at one
  // version: no rollback, PsClient::Reopen) rather than
  // restored to `restore`; and if not, why (empty if not tried).
  virtual bool RecoveredInPlace() const { return false; }
  virtual std::string ReopenRefusal() const { return ""; }

  // Elastic jobs (issue 40; worker/elastic.h), PS sync mode:
  // Worker 0, between its pull of version `step` and its push of it: the
  // shards settle at a version v (`step`, or later where backup workers
  // went on without worker 0: shard 0 holds the admissions of a cut and
  // every shard decides the steps before it, PsClient::HoldAndSettle),
  // then every shard reopens at v with `membership_at(v)` as the next
  // generation's workers and data position (PsClient::Reopen); the other
  // workers' pushes of the step in flight and later are dropped, and they
  // recover into the new generation. Pulls and returns v. INTERNAL where
  // the shards reopen at another version than the one settled (the
  // membership's data position would be that of the wrong step).
  // With staleness (and no backup workers) worker 0
  // first pulls version `step` from every shard, so that all of them have
  // decided its last step and none can decide its next without it: they
  // reopen at `step`, dropping the later steps the others ran ahead.
  // Top-k residuals stay with their workers (a leaving worker's are
  // dropped, a joining one starts from zeros), see Recover().
  // Async: the step in flight is dropped, every shard keeps its state as
  // it is and takes `membership_at(step)` from its from_step (worker 0's
  // step: the caller anchors it), which is returned (async has no shared
  // step; the others go on from it, ElasticMembership::Follow).
  // UNIMPLEMENTED where the exchange has no shards.
  using MembershipAt = std::function<WorkerMembership(int64_t version)>;
  virtual absl::StatusOr<int64_t> ChangeMembership(
      const MembershipAt& membership_at, absl::Duration timeout) {
    return absl::UnimplementedError(
        "only parameter-server jobs change their workers while they run");
  }
  // Worker 0, sync PS without staleness or backup workers, at the boundary
  // before step `step` (before its first push of it): plans the change to
  // `next` (anchored at step + 1) for the shards' decision of `step`
  // (PsClient::PlanReopen). The step is trained by the old members, none
  // dropped; every member's Step() that ends it takes the new generation,
  // whose membership membership() then returns (each member re-splits the
  // epoch there, ElasticMembership::TakeSwitch). FAILED_PRECONDITION where
  // this exchange or its shards cannot plan one (another mode or policy;
  // a shard without chunks): the caller changes the membership at once
  // (ChangeMembership()). Other errors are the step's.
  virtual absl::Status PlanMembership(const WorkerMembership& next,
                                      int64_t step, absl::Duration timeout) {
    return absl::FailedPreconditionError(
        "this exchange changes its membership at a step boundary only");
  }
  // The membership of the shards' generation this exchange works on
  // (found by Start(), Recover() and Rejoin(), or taken at a planned
  // change's step, PlanMembership()); none without shards.
  virtual std::optional<WorkerMembership> membership() const {
    return std::nullopt;
  }
  // Worker 0: the membership a Recover() or Rejoin() that restores the
  // shards to version v sends with the restore (the data position at v);
  // null: none (the shards keep their own).
  virtual void set_restore_membership(MembershipAt membership_at) {}
  // Elastic shards (issue 40; docs/ARCHITECTURE.md "Elastic shards"), PS
  // sync mode (with staleness, settled at worker 0's step first, as
  // ChangeMembership() does; not with staleness and backup workers):
  // worker 0, where ChangeMembership() is called, moves the shards' state in
  // memory onto the shards at `addresses` (the new layout, shard by shard; old
  // shards among them keep their index): every old shard closes at a new
  // generation and sends its state (PsClient::ExportState), worker 0 restores
  // it onto the new layout at the generation after with
  // `membership_at(version)` as its workers, and works on it from then on. The
  // other workers' step in flight fails (ABORTED) and they recover onto the new
  // shards (their addresses from the coordinator). Pulls and returns the
  // version (the shards' last decided step + 1). A failure half way leaves the
  // old shards closed: the caller recovers as from any failure (a reopen or the
  // last checkpoint opens them). Top-k residuals are the workers' and do not
  // move. Async: the step in flight is dropped and every chunk moves as it
  // is, at its own version; `membership_at` is given the smallest version,
  // which means no step (the caller anchors worker 0's step), and the
  // membership's from_step is returned, as ChangeMembership() does.
  // UNIMPLEMENTED without shards.
  virtual absl::StatusOr<int64_t> ChangeShards(
      const std::vector<std::string>& addresses,
      const MembershipAt& membership_at, absl::Duration timeout) {
    return absl::UnimplementedError(
        "only parameter-server jobs change their shards while they run");
  }
  // A worker joining an elastic job waits until a generation has it.
  virtual void set_joining(bool joining) {}
  // fp16 precision: the worker's loss scaler (not owned; null: none),
  // before Start(). Elastic allreduce: where rank 0 sends its state to a
  // new world (a joiner's, or the survivors' after a member's death), the
  // scaler's state goes with it, so that every member scales, skips and
  // grows alike. Sync PS: the shards keep the members' state and a worker
  // takes it at each WaitReady (PsClient::set_loss_scaler), so a joining
  // or restarted worker scales as the others. Async PS: unused (each
  // worker's scaler follows its own skips).
  virtual void set_loss_scaler(LossScaler* scaler) {}

  // Elastic allreduce jobs (issue 40; docs/ARCHITECTURE.md "Elastic
  // allreduce"): the collective's world changes in place.
  // At each step boundary every member calls AgreeMembership() with worker
  // 0's proposal (the others pass none; worker 0 is rank 0): each returns
  // worker 0's (its workers, epoch, from_step and data position) or none.
  // A broadcast of 16 bytes per step, and one of the proposal's size when
  // there is one. Errors: the collective's (a member died).
  virtual absl::StatusOr<std::optional<WorkerMembership>> AgreeMembership(
      const std::optional<WorkerMembership>& proposal) {
    return absl::UnimplementedError(
        "only an elastic allreduce job agrees on memberships in its "
        "collective");
  }
  // Leaves the current world and joins that of `next` (its epoch's
  // collective, ElasticWorld::connect) at this worker's rank in it; a
  // worker `next` leaves out only leaves. `after_failure`: a step failed
  // part way because a member died; this worker's updates of it are undone
  // first (as a skipped step's) and rank 0's whole state (its step,
  // weights and optimizer state) goes to every rank, so that the survivors
  // agree whether the step happened. Otherwise that state goes out only
  // when `next` adds workers (they receive it in Start()). membership()
  // then holds `next` with rank 0's step as from_step and the data
  // position there (set_restore_membership's, on rank 0). Returns the step
  // to go on from. Errors: the collective's, DEADLINE_EXCEEDED when the
  // members do not all meet within `timeout`.
  virtual absl::StatusOr<int64_t> ChangeWorld(const WorkerMembership& next,
                                              bool after_failure,
                                              absl::Duration timeout) {
    return absl::UnimplementedError(
        "only an elastic allreduce job changes its collective's world");
  }
  // An elastic allreduce job whose step failed because a member died:
  // closes this worker's connections of the current world now, so that a
  // member still blocked in a collective with it fails at once instead of
  // at the collective's timeout (and does not miss the next world). The
  // next ChangeWorld joins a new world. Nothing elsewhere.
  virtual void LeaveWorld() {}

  // Worker 0: the exchange's part of checkpoint `step`, whose folder on
  // this worker's host is `step_dir` (worker/checkpoint.h): PS, every
  // shard's file, which each shard writes into ITS checkpoint folder's
  // step-<step> (the same folder where the job's checkpoint_dir is shared
  // storage; PsClient::Checkpoint); allreduce, the weights and optimizer
  // state every worker holds, as step_dir/shard-0.safetensors.
  // Called with `wait` false right after Step() (the state is copied then),
  // and again with `wait` true, which returns each file's size and crc32
  // once it is durable. Thread-safe against Step(): a background thread
  // may wait (`wait` true) while training goes on. `end_step` (not wait):
  // the job's number of steps; a PS job with backup workers whose cut
  // would be at or past it (worker 0 fell behind the workers that ended)
  // takes no checkpoint: OUT_OF_RANGE, nothing begun. `latest_step` (not
  // wait): the newest checkpoint completed before this one (-1: none), for
  // the shards' retention (CheckpointRequest.latest_step).
  virtual absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t end_step, int64_t latest_step,
      const std::string& step_dir, bool wait) {
    return absl::UnimplementedError("this exchange writes no checkpoints");
  }
  // A recovery begins on this worker (Recovery::Recover, before worker 0
  // waits for its checkpoint in flight): a checkpoint whose cut lies ahead
  // of this worker's step waits for a residual file of this worker's that
  // this timeline will not write, so that wait gives up (CANCELLED) at
  // once instead of at its deadline. Thread-safe against Checkpoint().
  virtual void BeforeRecovery() {}

  // During a step's compute: gradients `tensors` of `gradients` (the spans
  // the next Step() gets, of a batch of `samples`) are final once `fence`
  // (null: now) is passed (see GradientsReadyFn in models/model.h). The
  // allreduce exchange starts their bucket's communication here; the PS
  // exchange begins the step (sync: sends the pull) and pushes their
  // chunks, as BytePS does during backward.
  virtual void GradientsReady(
      const std::vector<absl::Span<const float>>& gradients, int64_t samples,
      absl::Span<const int> tensors, std::shared_ptr<CopyFence> fence) {}

  // One step: this worker's gradients (and buffer values) of a batch of
  // `samples`; on return the spans given to Start() hold the next step's
  // weights. Tensors not named by GradientsReady() are taken as ready now.
  // Either exchange may write a tensor's weights before Step(), while
  // backward still runs (allreduce: once its bucket is averaged; sync PS:
  // once every worker has pushed its chunk and the shard sent it back): a
  // tensor announced by GradientsReady() must no longer be read by this
  // step's compute (true of a layer's weights once its backward has
  // finished).
  virtual absl::Status Step(
      const std::vector<absl::Span<const float>>& gradients,
      int64_t samples) = 0;

  // Row-sparse tables (issue 41; PsClient::SetStepRows): from the next
  // step on, each table's push is the rows of `touched` (the step's batch;
  // every other row's gradient is zero) and its pull the rows of `next`
  // (the next step's batch), or the whole table where `pull_rows` is
  // false. Call between steps, before the step's compute. Allreduce: the
  // rows `touched` travel (AllreduceRows); nothing is pulled.
  virtual void SetStepRows(std::vector<std::vector<uint32_t>> touched,
                           std::vector<std::vector<uint32_t>> next,
                           bool pull_rows) {}

  // Non-finite values (PS modes; server/parameter_shard.h): the PS
  // exchange checks every gradient chunk as it pushes it. This reports one
  // found elsewhere (the loss): the step is skipped as if a gradient held
  // it. Call before Step(). Allreduce: ignored (the averaged gradients
  // decide, the same on every worker; a loss is one worker's alone).
  virtual void MarkStepNonFinite(const NonFiniteValue& value) {}

  // After Step(): the step was skipped, and who found what, or nullopt.
  // Sync PS: on every shard, reported by the lowest worker id that found a
  // value. Async PS: this worker's pushes from the value on were dropped.
  // Allreduce: a bucket's sum held a NaN or an infinity (every worker sees
  // the same sums, so every worker skips alike) and the tensors updated
  // before it in the step were put back; worker_id is this worker's rank
  // if its own gradients held the value, else -1.
  virtual std::optional<SkippedStepInfo> SkippedStep() const {
    return std::nullopt;
  }

  // Top-k compression with error feedback: after Start() of a resumed
  // job, this worker's residuals at the start of `step` from the
  // checkpoint folder `step_dir` (worker/residual_files.h). False where the
  // folder holds none (a checkpoint of a job without compression): the
  // residuals start at zero. An exchange without compression: false.
  virtual absl::StatusOr<bool> RestoreResiduals(const std::string& step_dir,
                                                int64_t step) {
    return false;
  }

  // Forward before the pull ends (priority pulls; PS sync without
  // staleness or backup workers): from now on Step() returns once a shard
  // has announced the step decided and not skipped, or (early verdicts,
  // without clipping or top-k; worker/ps_client.h AwaitDecision) unable
  // to be skipped once every worker said its step is finite, while this
  // worker's pushes may still be going and the pull goes on; without a
  // verdict, once this worker's pushes and step end are out too. Its
  // Step() does not wait for the decision's chunks: the next step's
  // compute must then ask the returned gate
  // (models/backend.h WeightsGate) before it reads a tensor's weights, and
  // before backward writes the gradients. An error of the pull comes back
  // from the gate, or from the next Step(). Null (and nothing changes)
  // where the exchange or its mode keeps the whole wait in Step(): backup
  // workers decide a step's weights only at the pull's end (a late worker
  // pulls again), and staleness pulls weights whose step may still be
  // undone. With clipping no shard announces the decision (the norm
  // round decides the step, and every chunk comes after it), and a
  // skipped step is known only at the pull's end: Step() waits for the
  // whole pull whenever no shard announced the decision. Top-k's residual of a
  // checkpoint the pull announces (on its last message) is saved when the pull
  // completes, before the next step's pushes compress again (the compressor
  // keeps the last few steps' residuals). Call before the first Step().
  virtual WeightsGate* StartEarlyForward() { return nullptr; }
  // Returns once the last Step()'s weights are all in: before anything
  // but the gated compute reads them (a checkpoint, an evaluation, the
  // final weights). The pull's error, if it failed. At once without a
  // pull in flight.
  virtual absl::Status AwaitWeights() { return absl::OkStatus(); }
  // After the job's last Step() (before its last evaluation): the weights
  // of every step, decided. AwaitWeights(), except in sync PS with
  // staleness s, whose last pull (of version T - s, T the job's steps) may
  // lag the shards by up to s steps, and with clipping leaves the norm
  // rounds of the last s steps unanswered, so that the shards would never
  // apply them: then it answers those rounds and pulls version T
  // (PsClient::PullDecided()), waiting, up to the pull timeout, until every
  // worker ended step T - 1. Async PS: tells the shards this worker's
  // steps ended, waits until every member's have (PsClient
  // ::AwaitStepsEnded(); its streams closed meanwhile), then pulls the
  // weights as they are: every worker's every push is in them, where the
  // newest pull lacked the pushes of the workers still training. When no
  // push reaches the shards for the init timeout meanwhile (a member
  // evaluating, checkpointing or dead), it pulls at once and
  // FinalWeightsShortfall() says which members' pushes may be missing. On a
  // 16-bit wire (bf16, fp16) the weights are pulled once more in fp32 (sync:
  // version T; async: that pull), so that they are the shards' fp32 weights,
  // not their rounding. The pull's error, as Step()'s.
  virtual absl::Status AwaitFinalWeights() { return AwaitWeights(); }
  // After AwaitFinalWeights(): a line on what the final weights lack, for
  // the job's log; empty when they hold every step.
  virtual std::string FinalWeightsShortfall() const { return ""; }

  // After Step(): how its exchange went. With forward before the pull
  // ends, the pull's figures (barrier_wait, pull, bytes_pulled) are those
  // of the last pull that ended, the step before's.
  virtual ExchangeStepTimes LastStepTimes() const { return {}; }

  // After Step() of step `step`: the step to train next, step + 1 but
  // with backup workers (sync PS), where a worker the shards left behind
  // goes on from their version (the batches between are skipped).
  virtual int64_t NextStep(int64_t step) const { return step + 1; }
  // After Step(): with backup workers, the shards dropped this worker's
  // gradients of the step (it ended it late).
  virtual bool LastStepLate() const { return false; }

  // Training samples of all workers so far (for data/sec).
  virtual absl::StatusOr<int64_t> SamplesSoFar() = 0;

  // Before a long pause (worker 0's evaluation): let idle connections go.
  virtual absl::Status BeforePause() = 0;

  // This worker is done.
  virtual absl::Status Finish() = 0;
};

// Top-k compression of a job's gradients (worker/topk_compression.h: a PS
// job's pushes, an allreduce job's sparse allgather, worker/topk_allgather.h)
// and where its residuals go.
struct ExchangeCompression {
  // Null: dense gradients. A PS client's options point at it
  // (PsClientOptions::compressor); the exchange begins and commits its
  // steps (a skipped step, or one the shards dropped as late, is not
  // committed).
  std::unique_ptr<TopKCompressor> compressor;
  // The checkpoint folder of a step (worker/checkpoint.h
  // CheckpointStepDir over the job's checkpoint_dir); null: the job has no
  // checkpoints, and no residual is saved.
  std::function<std::string(int64_t)> step_dir;
  int worker_id = 0;
  int num_workers = 1;
  // The compressor's state tensors' names in residual files
  // (TopKCompressor::num_state_tensors(): the parameters' state_dict
  // names, then, with momentum correction, "velocity." and each).
  std::vector<std::string> names;
  // Allreduce: each selection's chunk bound, the job's partition_bytes (a
  // PS job of the same partition_bytes selects from the same chunks), and
  // how long worker 0's checkpoint waits for the others' residual files.
  int64_t partition_bytes = PartitionPlan::kDefaultPartitionBytes;
  absl::Duration residual_wait = absl::Seconds(120);
};

// `client` is connected to the job's shards; `sync` selects the barrier.
// `staleness` (sync; server/parameter_shard.h): step t pushes as step t
// and pulls weights of version >= max(1, t + 1 - staleness); 0: plain sync
// (version t + 1). `backup_workers` (sync; the client's option of the
// same name): a step may be dropped by the shards (late) or overtaken; the
// worker then pulls the newest version whole and NextStep() jumps to it.
// `compression`: with error feedback and checkpoints, each worker saves
// its residual of every checkpoint shard 0 announces, worker 0's
// Checkpoint(wait) waits for every worker's, and a worker's death restores
// the checkpoint (never a reopen in place: the dead worker's residual is
// only there).
// `ready_generation`: the shards hold the job's initial state at that
// generation already (--partition_bytes=auto's last restore,
// worker/partition_tuner.h), so Start() initialises nothing and every
// worker waits for it; nullopt: worker 0's Start() initialises them.
std::unique_ptr<GradientExchange> CreatePsExchange(
    std::unique_ptr<PsClient> client, bool sync, bool chief,
    absl::Duration init_timeout, int staleness = 0, bool backup_workers = false,
    ExchangeCompression compression = {},
    std::optional<int64_t> ready_generation = std::nullopt);

// An elastic allreduce job's worlds (CreateAllreduceExchange).
struct ElasticWorld {
  CollectiveFactory connect;
  int worker_id = 0;
  // The world the worker starts in (the coordinator's membership then:
  // its workers and epoch).
  WorkerMembership start;
  // A standby worker (TrainerOptions::await_membership): Start() waits for
  // the membership that adds it and starts in its world instead of
  // `start`. Null: `start`.
  std::function<absl::StatusOr<WorkerMembership>()> await_start;
  // Rank 0 (worker 0), before it connects each world: tells the joiners
  // which (worker/world_announcement.h AnnounceWorld; `from_epoch` its
  // world's epoch before, -1 at the start). Its error fails the change.
  // Null: nothing announced.
  std::function<absl::Status(int64_t from_epoch, const WorkerMembership&)>
      announce;
  // The linear scaling rule (JobSpec.linear_lr_scaling): each world's lr
  // is adam.lr x its members / initial_workers (the job's num_workers).
  bool linear_lr_scaling = false;
  int initial_workers = 1;
  // Each connection's and every later call's limit.
  absl::Duration timeout = absl::Seconds(120);
};

// Row-sparse tables in an allreduce job (`sparse_embeddings`; issue 41,
// docs/ARCHITECTURE.md "Row-sparse embeddings"): each table is a bucket of
// its own whose step's rows (SetStepRows' `touched`) every rank sends in
// an allgather (row ids and rows, padded to the most rows of any rank);
// every rank sums them in rank order into the union of the ranks' rows,
// averages them and updates them as a sync shard does (server/row_sparse.h:
// lazy Adam, torch.optim.SparseAdam's, those rows alone; SGD on the rows,
// every row with momentum or weight decay). Where the rows would cost more than
// the ring (W x their bytes >= 2 x 4n), the ids go alone and the rows as a
// dense fp32 ring allreduce of each rank's wire-rounded rows in zeros (the same
// sums, up to the order of additions with three or more ranks).
struct AllreduceRows {
  // Per PS tensor, the elements per row of a row-sparse table, 0 for a
  // dense tensor; empty: none.
  std::vector<int64_t> row_elements;
  // The partition's chunk bound in bytes: a 16-bit wire encodes a table's
  // rows chunk by chunk of it (fp16: one scale exponent a chunk), as a PS
  // push of them is encoded, so the values every rank sums are the ones a
  // shard would.
  int64_t partition_bytes = PartitionPlan::kDefaultPartitionBytes;
};

// `collective` (not owned) connects the job's workers. `bucket_bytes` > 0.
// Communication errors (Gloo's, after the collective's timeout) come back
// from Step(); the buckets averaged before the error are already applied,
// so the weights are a mix of two steps and the run must stop (every
// worker's collective fails with it), unless an elastic job's
// ChangeWorld(after_failure) undoes them. Destroying the exchange mid-step
// stops its thread once the collective call in flight returns.
// `clip_grad_norm` > 0: gradient clipping by global norm, as
// torch.nn.utils.clip_grad_norm_(parameters, clip_grad_norm) before the
// optimizer step: the average gradients of all parameters (not buffers)
// are scaled by min(1, clip_grad_norm / (norm + 1e-6)), norm their L2 norm
// over every bucket; so every bucket is allreduced before any is applied
// (no overlap of the optimizer with communication). 0: none.
// `wire_dtype`: DTYPE_FLOAT32, or DTYPE_BFLOAT16/DTYPE_FLOAT16 to average
// the parameters' gradients over a 16-bit allreduce as PyTorch DDP's
// bf16_compress_hook/fp16_compress_hook (each rank's gradient divided by
// the world size, rounded, summed in the type; float16 scaled by a power
// of two every rank agrees on); buffers stay fp32.
// `compression` (its compressor null: none): top-k with error feedback,
// each bucket's parameter gradients summed over a sparse allgather of every
// rank's selection (worker/topk_allgather.h) and averaged as a dense
// bucket's sums are; buffers stay dense fp32. With checkpoints, every
// worker writes its residual file (worker/residual_files.h) of each
// checkpoint, which rank 0 announces to the others at the start of the
// checkpoint's step (a broadcast of 8 bytes a step), and worker 0's
// Checkpoint(wait) waits for all of them; a resumed worker reads its own
// (RestoreResiduals). An elastic job's residuals stay with their workers: a
// joining worker starts from zeros, a leaving one's go with it.
// `elastic` (an elastic job's; `collective` null then): the exchange
// connects its own collective through ElasticWorld::connect, at Start()
// in the world of `start` and at each ChangeWorld() in the next one; the
// state every rank starts from is rank 0's (the job's initial weights, or
// its resumed checkpoint), sent at Start() with the optimizer state and
// the step, which is how a worker joining a running job gets it.
std::unique_ptr<GradientExchange> CreateAllreduceExchange(
    Collective* collective, const OptimizerOptions& adam, int64_t bucket_bytes,
    int num_buffers, double clip_grad_norm = 0,
    DType wire_dtype = DTYPE_FLOAT32,
    std::optional<ElasticWorld> elastic = std::nullopt,
    ExchangeCompression compression = {}, AllreduceRows rows = {});

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_
