#include "worker/elastic.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/gradient_exchange.h"

namespace pstrain {

ElasticMembership::ElasticMembership(ElasticOptions options,
                                     DataPositions* positions,
                                     GradientExchange* exchange)
    : options_(std::move(options)),
      num_ps_(options_.num_ps),
      positions_(positions),
      exchange_(exchange) {
  for (int w = 0; w < positions_->members(); ++w) current_.workers.push_back(w);
}

WorkerMembership ElasticMembership::Anchored(std::vector<int> workers,
                                             int64_t epoch,
                                             int64_t step) const {
  const DataPositions::Place place = positions_->Locate(step);
  WorkerMembership m;
  m.workers = std::move(workers);
  m.epoch = epoch;
  m.from_step = step;
  m.data_epoch = place.epoch;
  m.data_offset = place.offset;
  m.data_steps = place.step_in_epoch;
  return m;
}

WorkerMembership ElasticMembership::AtVersion(int64_t version) const {
  return Anchored(current_.workers, current_.epoch, version);
}

std::optional<Membership> ElasticMembership::Due(int64_t step) const {
  if (options_.worker_id != 0 || !options_.newest) return std::nullopt;
  std::optional<Membership> newest = options_.newest();
  if (!newest.has_value() || newest->epoch() <= current_.epoch ||
      !newest->ready() || step < newest->at_step()) {
    return std::nullopt;
  }
  return newest;
}

absl::StatusOr<std::optional<int64_t>> ElasticMembership::MaybeApply(
    int64_t step) {
  const std::optional<Membership> newest = Due(step);
  if (options_.allreduce) {
    // Every member learns worker 0's proposal in the collective.
    const absl::Time began = absl::Now();
    std::optional<WorkerMembership> proposal;
    if (newest.has_value()) {
      proposal = Anchored({newest->workers().begin(), newest->workers().end()},
                          newest->epoch(), step);
    }
    ASSIGN_OR_RETURN(const std::optional<WorkerMembership> agreed,
                     exchange_->AgreeMembership(proposal));
    if (!agreed.has_value()) return std::nullopt;
    ASSIGN_OR_RETURN(const int64_t version,
                     SwitchWorld(*agreed, /*after_failure=*/false, began,
                                 newest.has_value() ? newest->reason() : ""));
    return version;
  }
  if (!newest.has_value()) return std::nullopt;
  // A planned change not taken yet is taken at the end of this step
  // (TakeSwitch()); a newer membership waits for the next boundary.
  if (planned_.has_value()) return std::nullopt;
  if (options_.checkpoint_in_flight && options_.checkpoint_in_flight()) {
    return std::nullopt;  // the next boundary (ElasticOptions)
  }
  const absl::Time began = absl::Now();
  ASSIGN_OR_RETURN(const bool planned, TryPlan(*newest, step, began));
  if (planned) return std::nullopt;
  // A reopen: the checkpoint in flight first (a planned change leaves the
  // shards' state and checkpoints as they are).
  if (options_.wait_checkpoint) {
    if (absl::Status s = options_.wait_checkpoint(); !s.ok()) {
      options_.say(absl::StrCat("checkpoint abandoned: ", s.ToString()));
    }
  }
  std::vector<int> workers(newest->workers().begin(), newest->workers().end());
  const int old_workers = static_cast<int>(current_.workers.size());
  const int old_ps = num_ps_;
  const bool move_shards = newest->num_ps() > 0 && newest->num_ps() != num_ps_;
  const int64_t epoch = newest->epoch();
  // The data position of the version the shards settle at (backup workers
  // may have decided steps past worker 0's), under the old membership.
  // Async: no step is shared; the new membership starts at worker 0's.
  const GradientExchange::MembershipAt anchor = [this, &workers, epoch,
                                                 step](int64_t v) {
    return Anchored(workers, epoch, options_.async ? step : v);
  };
  int64_t version = step;
  if (move_shards) {
    if (newest->ps_addresses_size() != newest->num_ps()) {
      return absl::InternalError(absl::StrCat(
          "membership ", newest->epoch(), " has ", newest->num_ps(),
          " shards but ", newest->ps_addresses_size(), " shard addresses"));
    }
    const std::vector<std::string> addresses(newest->ps_addresses().begin(),
                                             newest->ps_addresses().end());
    ASSIGN_OR_RETURN(
        version, exchange_->ChangeShards(addresses, anchor, options_.timeout));
    num_ps_ = newest->num_ps();
  } else {
    ASSIGN_OR_RETURN(version,
                     exchange_->ChangeMembership(anchor, options_.timeout));
  }
  current_ = anchor(version);
  positions_->Rebase(version, current_.data_epoch, current_.data_offset,
                     current_.data_steps, current_.size(), 0);
  ReportApplied(*newest, version, old_workers, old_ps, began);
  return version;
}

absl::StatusOr<bool> ElasticMembership::TryPlan(const Membership& newest,
                                                int64_t step,
                                                absl::Time began) {
  const bool move_shards = newest.num_ps() > 0 && newest.num_ps() != num_ps_;
  // Sync without staleness or backup workers: the step about to be
  // trained is the old members', and the shards take the new ones when
  // they decide it; nobody's step in flight is dropped. Not after a
  // recovery with no step exchanged since: a member that died (the change
  // may remove it) would never push that step.
  if (move_shards || options_.async || options_.allreduce ||
      !exchanged_since_recovery_ || planned_.has_value()) {
    return false;
  }
  const int old_workers = current_.size();
  WorkerMembership next =
      Anchored({newest.workers().begin(), newest.workers().end()},
               newest.epoch(), step + 1);
  const absl::Status planned =
      exchange_->PlanMembership(next, step, options_.timeout);
  // Another policy: at once, at the boundary (MaybeApply()).
  if (absl::IsFailedPrecondition(planned)) return false;
  RETURN_IF_ERROR(planned);
  options_.say(absl::StrFormat(
      "membership %d: %d -> %d workers planned for step %d (at the shards' "
      "decision of step %d)",
      newest.epoch(), old_workers, next.size(), step + 1, step));
  planned_ = Planned{newest, std::move(next), began, old_workers};
  return true;
}

void ElasticMembership::PlanBeforePush(int64_t step) {
  if (options_.allreduce || options_.async || planned_.has_value()) return;
  const std::optional<Membership> newest = Due(step);
  if (!newest.has_value() ||
      (options_.checkpoint_in_flight && options_.checkpoint_in_flight())) {
    return;
  }
  absl::StatusOr<bool> planned = TryPlan(*newest, step, absl::Now());
  // The shards that took the plan and those that did not cannot both
  // decide the step with it (PsClient::FinishStep: ABORTED, recovered);
  // with none, the boundary tries again.
  if (!planned.ok()) {
    options_.say(absl::StrCat("membership ", newest->epoch(),
                              ": not planned at step ", step, ": ",
                              planned.status().ToString()));
  }
}

void ElasticMembership::ReportApplied(const Membership& newest, int64_t version,
                                      int old_workers, int old_ps,
                                      absl::Time began) {
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - began);
  const std::string shards =
      old_ps == num_ps_ ? ""
                        : absl::StrFormat(", %d -> %d shards", old_ps, num_ps_);
  options_.say(absl::StrFormat(
      "membership %d: %d -> %d workers%s at step %d (%.0f ms): %s",
      newest.epoch(), old_workers, current_.size(), shards, version, ms,
      newest.reason()));
  MembershipApplied applied;
  applied.set_epoch(newest.epoch());
  applied.set_step(version);
  applied.set_elapsed_ms(ms);
  applied.set_old_workers(old_workers);
  applied.set_new_workers(current_.size());
  applied.set_old_ps(old_ps);
  applied.set_new_ps(num_ps_);
  last_applied_ = applied;
  if (options_.applied) options_.applied(applied);
}

absl::StatusOr<std::optional<bool>> ElasticMembership::TakeSwitch(
    int64_t step) {
  exchanged_since_recovery_ = true;
  if (options_.allreduce || options_.async) return std::nullopt;
  const std::optional<WorkerMembership> m = exchange_->membership();
  if (!m.has_value() || m->epoch == current_.epoch || m->from_step != step) {
    return std::nullopt;
  }
  int64_t at = step;
  ASSIGN_OR_RETURN(const bool member, FollowAt(&at, step, /*at_start=*/false));
  return member;
}

absl::StatusOr<int64_t> ElasticMembership::SwitchWorld(
    const WorkerMembership& next, bool after_failure, absl::Time began,
    const std::string& reason) {
  const int old_workers = current_.size();
  attempted_epoch_ = std::max(attempted_epoch_, next.epoch);
  ASSIGN_OR_RETURN(
      const int64_t step,
      exchange_->ChangeWorld(next, after_failure, options_.timeout));
  current_ = exchange_->membership().value_or(next);
  const int rank = current_.RankOf(options_.worker_id);
  if (rank < 0) {
    removed_ = true;
    options_.say(absl::StrCat(
        "worker ", options_.worker_id, " is not a member from step ", step,
        " on (membership ", current_.epoch, ": workers ",
        absl::StrJoin(current_.workers, ","), "); leaving the job"));
    return step;
  }
  positions_->Rebase(current_.from_step, current_.data_epoch,
                     current_.data_offset, current_.data_steps, current_.size(),
                     rank);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - began);
  if (options_.worker_id != 0) {
    options_.say(absl::StrCat(
        "worker ", options_.worker_id, ": membership ", current_.epoch, ", ",
        current_.size(), " workers from step ", step, " (rank ", rank, ")"));
    return step;
  }
  options_.say(absl::StrFormat(
      "membership %d: %d -> %d workers at step %d (%.0f ms%s): %s",
      current_.epoch, old_workers, current_.size(), step, ms,
      after_failure ? ", after a member's death" : "", reason));
  MembershipApplied applied;
  applied.set_epoch(current_.epoch);
  applied.set_step(step);
  applied.set_elapsed_ms(ms);
  applied.set_old_workers(old_workers);
  applied.set_new_workers(current_.size());
  last_applied_ = applied;
  if (options_.applied) options_.applied(applied);
  return step;
}

absl::StatusOr<int64_t> ElasticMembership::RecoverWorld(absl::Status cause) {
  const bool death = absl::IsUnavailable(cause) || absl::IsAborted(cause) ||
                     absl::IsCancelled(cause) ||
                     absl::IsDeadlineExceeded(cause);
  if (!options_.allreduce || !options_.newest || !death) return cause;
  const absl::Time began = absl::Now();
  const absl::Time deadline = began + options_.timeout;
  options_.say(absl::StrCat("worker ", options_.worker_id, ": step failed (",
                            cause.ToString(),
                            "); waiting for the job's next membership"));
  // A member blocked on this one (a ring neighbour) fails now, not at the
  // collective's timeout after this worker's wait for the next world ran
  // out.
  exchange_->LeaveWorld();
  // A world is joined once: a rendezvous of an epoch tried before may hold
  // keys of that try.
  int64_t tried = std::max(current_.epoch, attempted_epoch_);
  absl::Status last = std::move(cause);
  while (absl::Now() < deadline) {
    WorkerMembership next;
    std::string reason;
    if (options_.worker_id != 0 && options_.announced_world) {
      absl::StatusOr<WorkerMembership> world =
          options_.announced_world(tried + 1, deadline);
      if (!world.ok()) {
        last = world.status();
        break;
      }
      next = *std::move(world);
    } else {
      const std::optional<Membership> newest = options_.newest();
      if (!newest.has_value() || newest->epoch() <= tried || !newest->ready()) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      next.workers.assign(newest->workers().begin(), newest->workers().end());
      next.epoch = newest->epoch();
      reason = newest->reason();
    }
    tried = next.epoch;
    absl::StatusOr<int64_t> step =
        SwitchWorld(next, /*after_failure=*/true, began, reason);
    if (step.ok()) return step;
    last = step.status();
    options_.say(absl::StrCat("worker ", options_.worker_id, ": membership ",
                              next.epoch, ": ", last.ToString()));
  }
  return absl::Status(
      last.code(),
      absl::StrCat("no membership of the job's could be joined within ",
                   absl::FormatDuration(options_.timeout), ": ",
                   last.message()));
}

absl::StatusOr<bool> ElasticMembership::Started(int64_t* step) {
  if (options_.allreduce) {
    // Rank 0's step, which the start's state came with.
    if (const std::optional<WorkerMembership> m = exchange_->membership()) {
      *step = m->from_step;
    }
  }
  ASSIGN_OR_RETURN(const bool member,
                   FollowAt(step, /*own_step=*/-1, /*at_start=*/true));
  exchange_->set_joining(false);
  return member;
}

void ElasticMembership::AwaitVerdict() {
  if (options_.worker_id != 0 || !options_.newest ||
      options_.verdict_wait <= absl::ZeroDuration()) {
    return;
  }
  const absl::Time deadline = absl::Now() + options_.verdict_wait;
  while (absl::Now() < deadline) {
    const std::optional<Membership> newest = options_.newest();
    if (newest.has_value() && newest->epoch() > current_.epoch &&
        newest->ready()) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<bool> ElasticMembership::Follow(int64_t* step,
                                               int64_t own_step) {
  exchanged_since_recovery_ = false;
  return FollowAt(step, own_step, /*at_start=*/false);
}

absl::StatusOr<bool> ElasticMembership::FollowAt(int64_t* step,
                                                 int64_t own_step,
                                                 bool at_start) {
  const std::optional<WorkerMembership> m = exchange_->membership();
  if (!m.has_value()) return true;
  const int rank = m->RankOf(options_.worker_id);
  if (rank < 0) {
    options_.say(absl::StrCat(
        "worker ", options_.worker_id, " is not a member from step ",
        m->from_step, " on (membership ", m->epoch, ": workers ",
        absl::StrJoin(m->workers, ","), "); leaving the job"));
    return false;
  }
  const bool async_change = options_.async && m->epoch != current_.epoch;
  if (async_change) {
    // No step is shared: a worker behind worker 0 at the change goes on
    // from its own step (its old split's blocks up to worker 0's step,
    // then the new split), one ahead from worker 0's (the new split's),
    // one that starts from worker 0's or later (a restarted one's
    // estimate from the pushes).
    *step = at_start ? std::max(*step, m->from_step)
                     : std::min(own_step, m->from_step);
  }
  if (m->from_step > *step && !async_change) {
    return absl::InternalError(
        absl::StrCat("the shards' membership starts at step ", m->from_step,
                     " after the step recovered to, ", *step));
  }
  const int old = positions_->members();
  current_ = *m;
  positions_->Rebase(m->from_step, m->data_epoch, m->data_offset, m->data_steps,
                     m->size(), rank);
  if (planned_.has_value()) {
    // Worker 0's planned change: taken where the shards' membership is
    // its (at its step, or by a recovery after it), else dropped (a
    // recovery before the shards decided its step), to be planned again.
    const Planned planned = *std::exchange(planned_, std::nullopt);
    if (m->epoch == planned.next.epoch) {
      ReportApplied(planned.membership, m->from_step, planned.old_workers,
                    num_ps_, planned.began);
      return true;  // its line said it
    }
  }
  if (old != m->size() || async_change) {
    options_.say(absl::StrCat(
        "worker ", options_.worker_id, ": membership ", m->epoch, ", ",
        m->size(), " workers from step ", m->from_step, " (rank ", rank, ")",
        async_change ? absl::StrCat("; going on from step ", *step) : ""));
  }
  return true;
}

}  // namespace pstrain
