// An elastic job's membership on a worker (issue 40; docs/ARCHITECTURE.md,
// "Elastic membership"): which workers train each step, and this worker's
// share of the epoch (worker/data_position.h).
//
// The coordinator holds the job's intent (its newest Membership:
// `pstrain scale`, or a worker removed when its restart budget is spent,
// coordinator/job_table.h); worker 0 learns it from its heartbeat answers
// (coordinator/task_agent.h) and applies it at a step boundary: every
// shard reopens at its last decided step with the new members
// (GradientExchange::ChangeMembership), the data position of that step
// becoming the new segment's start, so that the epoch is re-split from
// where it is. The other workers' step in flight fails (ABORTED) and they
// recover into the new generation, whose membership the shards return
// (WaitReady): each re-splits the epoch at the same place, a removed
// worker leaves the run, and a joining one starts at that step.
//
// Mode allreduce has no shards: every worker takes part in each step
// boundary's agreement on worker 0's proposal, in the collective, and all
// move to the new world there (GradientExchange::ChangeWorld); after a
// member's death each survivor waits for the coordinator's next
// membership and joins its world with rank 0's state (RecoverWorld).
//
// Thread-compatible: the training thread's.
#ifndef PSTRAIN_WORKER_ELASTIC_H_
#define PSTRAIN_WORKER_ELASTIC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/membership.h"
#include "proto/coordinator.pb.h"
#include "worker/data_position.h"

namespace pstrain {

class GradientExchange;

struct ElasticOptions {
  int worker_id = 0;
  // Mode async: no step is shared, so a membership change reopens the
  // shards at worker 0's step, from which every member goes on (as every
  // worker goes on from one step after an async restore).
  bool async = false;
  // Mode allreduce (an elastic collective, GradientExchange::ChangeWorld):
  // every worker takes part in each boundary's agreement on worker 0's
  // proposal, and after a member's death waits for the coordinator's next
  // membership (`newest`, which every worker has then) and joins its world.
  bool allreduce = false;
  // Worker 0 (allreduce: every worker): the coordinator's newest
  // membership (TaskAgent), or none known yet.
  std::function<std::optional<Membership>()> newest;
  // Allreduce, every worker but 0: the first world worker 0 announces
  // from epoch `from_epoch` on, whoever is in it, or DEADLINE_EXCEEDED
  // (worker/world_announcement.h). After a death a survivor joins that
  // world rather than the newest membership it knows, which may differ
  // from worker 0's choice (a Scale made while the dead worker was
  // removed). Null: the newest.
  std::function<absl::StatusOr<WorkerMembership>(int64_t from_epoch,
                                                 absl::Time deadline)>
      announced_world;
  // Worker 0: reports a membership applied (sent with the next heartbeat).
  std::function<void(const MembershipApplied&)> applied;
  // Worker 0: waits for its checkpoint in flight (null: none).
  std::function<absl::Status()> wait_checkpoint;
  // Worker 0 of a job whose checkpoints hold the workers' top-k residuals
  // (null otherwise): whether a checkpoint is in flight. Such a
  // checkpoint is durable only once every member wrote its residual file,
  // which the others do when they learn of the cut, on the pull of the
  // step after it: worker 0 holding that step back to wait for the
  // checkpoint would wait for ever. So a due membership is applied at the
  // first step boundary with no checkpoint in flight.
  std::function<bool()> checkpoint_in_flight;
  std::function<void(const std::string&)> say;
  absl::Duration timeout = absl::Seconds(60);
  // Worker 0 of a job that removes dead workers (min_workers > 0): after
  // a failure's recovery, how long to wait for the coordinator's verdict
  // (a membership without the dead worker) before going on; 0: none.
  absl::Duration verdict_wait = absl::ZeroDuration();
  // The job's shards at the start; a membership whose num_ps differs
  // (elastic shards) moves the state onto its shards
  // (GradientExchange::ChangeShards).
  int num_ps = 0;
};

class ElasticMembership {
 public:
  // `positions` and `exchange` (not owned) outlive this.
  ElasticMembership(ElasticOptions options, DataPositions* positions,
                    GradientExchange* exchange);

  // Worker 0, at the boundary before step `step`: applies the
  // coordinator's newest membership if it is ready, newer than the one
  // applied, and due (its at_step reached); the step to go on from then
  // (the shards' version), else none. An exchange error is the step's
  // (recovered from as a failure). A membership with another num_ps
  // moves the shards' state onto its ps_addresses in the same change
  // (GradientExchange::ChangeShards); INTERNAL if it lists another number
  // of addresses than num_ps.
  // Sync PS without staleness or backup workers, the same shards: the
  // change is planned instead (GradientExchange::PlanMembership): step
  // `step` is trained by the old members, the shards take the new ones
  // at its decision, and TakeSwitch() follows them after its exchange;
  // none is returned (nobody's step in flight is dropped). No other
  // membership is applied until the planned one is taken or dropped.
  // Allreduce: every worker calls it; they agree on worker 0's proposal
  // (GradientExchange::AgreeMembership) and each joins the new world at
  // `step` (ChangeWorld); a worker left out is removed() then.
  absl::StatusOr<std::optional<int64_t>> MaybeApply(int64_t step);

  // Allreduce, after `cause` broke a step (a member's death breaks every
  // rank's collective): waits up to `timeout` for a ready coordinator
  // membership newer than the current one (min_workers: the dead worker
  // removed) and joins its world with rank 0's state
  // (ChangeWorld(after_failure)), trying each newer one in turn; the step
  // to go on from (rank 0's). A cause no death explains (not UNAVAILABLE,
  // ABORTED, CANCELLED or DEADLINE_EXCEEDED) is returned as it is, and so
  // is the last error when no membership could be joined in time. A
  // restart of every worker (a budget left) ends the process meanwhile
  // (the heartbeats' kRestartExitCode).
  absl::StatusOr<int64_t> RecoverWorld(absl::Status cause);

  // Worker 0, whenever some of step `step`'s gradients are ready, before
  // they are pushed (StepLoop::GradientsReady; the step's ends go to the
  // shards only after every gradient is pushed, so no shard can have
  // decided it): plans the coordinator's newest membership for this
  // step's decision where MaybeApply() would (sync PS without staleness
  // or backup workers, a step exchanged since the last recovery, the same
  // shards) and it became due since the boundary, so that a scale request
  // that came during the step is taken at its end rather than the next
  // one's. Returns at once without a due membership or with one planned.
  // Never applies one at once; an error is said and left to the step.
  void PlanBeforePush(int64_t step);

  // Sync PS, after step `step` - 1's exchange: where the shards took a
  // planned membership change at its decision (worker 0 planned it in
  // MaybeApply(), GradientExchange::PlanMembership), follows it from
  // `step` as after a recovery (Follow(): the epoch re-split there) and
  // returns whether this worker is a member; worker 0 reports the change
  // applied. None where no change was taken.
  absl::StatusOr<std::optional<bool>> TakeSwitch(int64_t step);

  // Allreduce: the last membership applied left this worker out.
  bool removed() const { return removed_; }

  // After the start (or a joining worker's rejoin) at `*step`: Follow(),
  // and from then on a recovery takes whatever membership the shards have
  // (one without this worker: it leaves).
  absl::StatusOr<bool> Started(int64_t* step);

  // Worker 0, after a failure's recovery: waits up to verdict_wait for a
  // membership newer than the one applied (a dead worker removed), which
  // the next MaybeApply() applies; returns at once if one is known.
  void AwaitVerdict();

  // After a recovery at `*step` of a step this worker was training at
  // `own_step`: takes the shards' membership
  // (GradientExchange::membership()) and re-splits the epoch where it
  // says; false if this worker is not a member (it leaves the run).
  // Async: a membership this worker has not followed yet moves `*step` to
  // min(own_step, its from_step): a worker behind worker 0 at the change
  // trains its own blocks of the old split up to worker 0's step, then
  // the new split (DataPositions::SplitAt), one ahead goes back to worker
  // 0's step; at a start (Started), to at least from_step (a restarted
  // worker keeps its estimate from the shards' pushes,
  // Recovery::StepOfVersion, when that is later).
  absl::StatusOr<bool> Follow(int64_t* step, int64_t own_step);

  // Worker 0: the membership to restore the shards with at `version`
  // (the current workers, and the data position at `version`). Async: a
  // restore's version counts pushes; the caller passes the step the
  // workers go on from instead (Recovery::StepOfVersion).
  WorkerMembership AtVersion(int64_t version) const;

  // The shards this worker trains on: the job's first, then worker 0's
  // each applied membership's (the other workers' stay the first: the
  // run's table is worker 0's).
  int num_ps() const { return num_ps_; }

  // Worker 0: the last membership MaybeApply() applied (none before).
  const std::optional<MembershipApplied>& last_applied() const {
    return last_applied_;
  }

  // The epoch of the membership this worker trains with.
  int64_t epoch() const { return current_.epoch; }
  const WorkerMembership& current() const { return current_; }
  // Worker 0's checkpoint writer's wait, once it exists.
  void set_wait_checkpoint(std::function<absl::Status()> wait) {
    options_.wait_checkpoint = std::move(wait);
  }
  void set_checkpoint_in_flight(std::function<bool()> in_flight) {
    options_.checkpoint_in_flight = std::move(in_flight);
  }

 private:
  WorkerMembership Anchored(std::vector<int> workers, int64_t epoch,
                            int64_t step) const;
  // Worker 0: the coordinator's newest membership if it is ready, newer
  // than the one applied and due at `step`; none otherwise (and on the
  // other workers).
  std::optional<Membership> Due(int64_t step) const;
  absl::StatusOr<bool> FollowAt(int64_t* step, int64_t own_step, bool at_start);
  // Worker 0: plans `newest` for the shards' decision of `step`
  // (GradientExchange::PlanMembership) where that can be done: true if
  // planned, false where it is applied at once instead (a change of
  // shards, async, allreduce, no step exchanged since a recovery, another
  // policy); the exchange's other errors.
  absl::StatusOr<bool> TryPlan(const Membership& newest, int64_t step,
                               absl::Time began);
  // Worker 0: `newest` applied from `version` (current_ is its): the
  // line, last_applied_ and the applied() report, timed from `began`.
  void ReportApplied(const Membership& newest, int64_t version, int old_workers,
                     int old_ps, absl::Time began);
  // Allreduce: joins `next`'s world (ChangeWorld) and re-splits the epoch
  // at the step it returns; worker 0 says so and reports it applied.
  absl::StatusOr<int64_t> SwitchWorld(const WorkerMembership& next,
                                      bool after_failure, absl::Time began,
                                      const std::string& reason);

  ElasticOptions options_;
  // The shards worker 0 trains on (options_.num_ps, then each applied
  // membership's).
  int num_ps_ = 0;
  std::optional<MembershipApplied> last_applied_;
  DataPositions* const positions_;
  GradientExchange* const exchange_;
  WorkerMembership current_;
  bool removed_ = false;
  // Worker 0: a change planned for the shards' decision of a step
  // (MaybeApply(), GradientExchange::PlanMembership), until the shards'
  // membership shows it taken (TakeSwitch(), or a recovery's Follow()) or
  // a recovery dropped it.
  struct Planned {
    Membership membership;  // the coordinator's
    WorkerMembership next;
    absl::Time began;
    int old_workers = 0;
  };
  std::optional<Planned> planned_;
  // A step's exchange succeeded since the start or the last recovery
  // (TakeSwitch() is called after each): only then does worker 0 plan a
  // change rather than apply it at once.
  bool exchanged_since_recovery_ = false;
  // Allreduce: the newest epoch whose world this worker began to join.
  int64_t attempted_epoch_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_ELASTIC_H_
