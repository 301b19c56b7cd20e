// StepPolicy: what a shard's mode (ShardOptions) says about its steps, in
// one place. A shard runs one of four policies, each with or without
// gradient clipping by global norm (not async):
//  - kSync: step v is decided once every worker has ended it; a chunk's
//    update is applied as soon as every worker pushed it, before the
//    decision, and undone if the step is skipped.
//  - kStaleness (s > 0): as kSync, with the pushes and ends of s + 1 steps
//    collected at once, steps decided in order.
//  - kBackups (R of N): shard 0 admits the first R ends of a step, which
//    decide it; the update averages the admitted workers' pushes and is
//    applied at the decision; later pushes are dropped. With staleness
//    s > 0 too, the ends of s + 1 steps are admitted at once (a fast
//    worker runs up to s steps past the oldest undecided one), steps
//    decided in order.
//  - kAsync: no steps; every push is applied at once.
// Clipping moves a sync or staleness update to the decision too (the
// step's norm decides it). See server/parameter_shard.h for the
// mechanisms (clipping's below); docs/ARCHITECTURE.md, "Step policies",
// for the table.
//
// Gradient clipping by global norm (sync mode, with or without staleness or
// backup workers, options.clip_grad_norm = c > 0; as
// torch.nn.utils.clip_grad_norm_(parameters, c) before the optimizer step,
// which in data-parallel training acts on the workers' average gradient): every
// chunk's average gradient is multiplied by min(1, c / (norm + 1e-6)), norm the
// L2 norm over all parameters of every shard (buffers left out). No shard sees
// the others' chunks, so the norm is agreed through the workers, in one more
// round per step: once every worker's EndStep() is in, a shard averages each
// chunk's pushes (in worker-id order, as the sync update) and sums their
// squares in double (its partial, ParameterShard::PartialNormLocked()), which
// every worker's pull receives before the chunks (Pull()'s `norm_partial`);
// each worker adds the partials of every shard in shard order and sends the sum
// back to every shard (ParameterShard::ApplyStepNorm()); the first sum to
// arrive decides the step: every chunk's update is applied with the
// coefficient, final (not undoable: nothing is applied before the decision),
// and the version advances. Every worker adds the same doubles in the same
// order, so every worker sends the same sum and every shard clips with the same
// coefficient; a later sum that differs is refused. A skipped step (non-finite
// value) goes the same round with partial 0 and applies nothing. With backup
// workers the partial is of the admitted workers' average, taken once the R-th
// admitted end is in (a late worker's pushes are not in the step, so not in its
// norm). With staleness s the norm round of step t is that of the pulls of
// version t + 1 (every worker's pull at its step t + s); steps still decide in
// order, each once its ends are all in, the step before it decided, and its
// norm arrived. A pull of a version whose step was decided long ago carries no
// partial; its worker sends no sum (someone else's decided the step). A sum for
// a step decided earlier is checked against the recent decisions it still
// holds.
//
// A value computed once from ShardOptions (the constructor reads it, no
// later change reaches it); immutable, so any thread may query it.
#ifndef PSTRAIN_SERVER_STEP_POLICY_H_
#define PSTRAIN_SERVER_STEP_POLICY_H_

#include <string>

#include "server/shard_options.h"

namespace pstrain {

class StepPolicy {
 public:
  enum class Kind { kSync, kStaleness, kBackups, kAsync };

  // When a chunk's update of a step is applied.
  enum class Update {
    kEachPush,    // async: every push at once, no step
    kAtBarrier,   // once every worker pushed the chunk, before the step's
                  // decision; undone if the step is skipped
    kAtDecision,  // at the decision (the admitted set, or the norm); final
  };

  // Whose pushes a step's update averages, and (clipping) whose average
  // the norm's partial sums.
  enum class Members {
    kOwnPush,      // async: each push alone
    kEveryWorker,  // all num_workers, in worker-id order
    kAdmitted,     // the R workers shard 0 admitted, in worker-id order
  };

  // A checkpoint's consistent cut, and who names its step.
  enum class Cut {
    kImmediate,  // worker 0's step, between its pull and its push of it:
                 // every chunk is there (ParameterShard::SnapshotInto)
    kDeferred,   // the step worker 0 names before it pushes it; each chunk
                 // copies itself there (BeginDeferredSnapshot)
    kPickedByShardZero,  // the step shard 0 picks from its admissions
                         // (HoldCheckpointStep), then deferred
    kPerChunk,           // async: each chunk as it is, at its own version
  };

  // Where the job goes on after a worker dies.
  enum class Rejoin {
    kReopenInPlace,      // every shard at its last decided step (Reopen)
    kRestoreCheckpoint,  // every shard restored to the newest checkpoint
  };

  // Async ignores staleness, backups and clipping.
  explicit StepPolicy(const ShardOptions& options);

  Kind kind() const { return kind_; }
  // "sync", "sync with staleness 2", "sync with backup workers (3 of 4)",
  // "async"; then ", clipping by global norm 1.5" when clipping.
  std::string Describe() const;

  // Steps exist: pushes carry one, workers end it (EndStep), pulls wait
  // for its decision. False only in async mode.
  bool has_steps() const { return kind_ != Kind::kAsync; }
  // s: how many steps a worker may run ahead of the oldest undecided one;
  // 0 unless kStaleness or kBackups with staleness.
  int staleness() const { return staleness_; }
  // How many steps' pushes and ends are collected at once (s + 1); a
  // step's slot is step % open_steps(). 1 in async mode (its one slot
  // keeps the buffers' latest values).
  int open_steps() const { return staleness_ + 1; }

  // When step v is decided: once this many ends of it are in (every
  // worker's; with backups, R admitted ones) and, when clipping, its
  // norm. 0 in async mode.
  int ends_to_decide() const { return ends_to_decide_; }
  // Step ends carry an admission (EndStepWithBackups, not EndStep).
  bool admits() const { return kind_ == Kind::kBackups; }
  // This shard admits the ends (backups, shard 0); the others take its
  // answer.
  bool admission_arbiter() const { return admission_arbiter_; }
  // Which pushes a step's update averages.
  Members averages() const;
  // A push of a step already decided is dropped and counted, OK (backups:
  // a late worker's); else it is refused.
  bool drops_late_pushes() const { return kind_ == Kind::kBackups; }
  // Samples are counted from the admitted step ends, not from the pulls
  // (a late worker's batch is not trained on).
  bool samples_from_admitted_ends() const { return kind_ == Kind::kBackups; }

  // When an update is applied, and whether it can be undone.
  Update update() const;
  // Gradient clipping by global norm: sync mode, clip_grad_norm > 0.
  bool clipping() const { return clip_grad_norm_ > 0; }
  // Clipping: c (0 without).
  double clip_grad_norm() const { return clip_grad_norm_; }
  // Early verdicts (ParameterShard::NoteFiniteVerdict): kSync without
  // clipping, where a step whose members all said it is finite cannot be
  // skipped and its updates are final as every push of them arrives.
  // Staleness and backups decide a step without every member's pushes of
  // the steps before it; clipping's decision waits for the global norm.
  bool takes_verdicts() const { return kind_ == Kind::kSync && !clipping(); }
  // Clipping: whose average gradient the shard's partial norm sums
  // (kEveryWorker or kAdmitted); kOwnPush without clipping.
  Members norm_members() const;

  Cut checkpoint_cut() const;
  // The checkpoint waits for a deferred cut (kDeferred or
  // kPickedByShardZero): the service begins BeginDeferredSnapshot() and
  // its writer awaits it.
  bool deferred_snapshot() const {
    return checkpoint_cut() == Cut::kDeferred ||
           checkpoint_cut() == Cut::kPickedByShardZero;
  }
  // This shard picks a checkpoint's step (kPickedByShardZero, shard 0).
  bool picks_checkpoint_step() const { return admission_arbiter_; }

  Rejoin rejoin() const;
  // The shard can go on from its own state at its last decided step
  // (ParameterShard::Reopen), after a worker's death (rejoin()) or for an
  // elastic job's membership change (worker/elastic.h): every sync kind,
  // staleness included (at most one update is undoable at a time, and the
  // pushes of later steps are dropped); async has no step to reopen at
  // (Reopen keeps an async shard's state as it is for a membership change
  // or a move of its state only).
  bool reopens() const { return rejoin() == Rejoin::kReopenInPlace; }

 private:
  Kind kind_;
  int staleness_ = 0;
  int num_workers_ = 1;
  int ends_to_decide_ = 0;
  bool admission_arbiter_ = false;
  double clip_grad_norm_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_STEP_POLICY_H_
