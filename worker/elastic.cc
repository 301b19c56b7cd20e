#include "worker/elastic.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<std::optional<int64_t>> ElasticMembership::MaybeApply(
    int64_t step) {
  if (options_.worker_id != 0 || !options_.newest) return std::nullopt;
  const std::optional<Membership> newest = options_.newest();
  if (!newest.has_value() || newest->epoch() <= current_.epoch ||
      !newest->ready() || step < newest->at_step()) {
    return std::nullopt;
  }
  if (options_.checkpoint_in_flight && options_.checkpoint_in_flight()) {
    return std::nullopt;  // the next boundary (ElasticOptions)
  }
  const absl::Time began = absl::Now();
  if (options_.wait_checkpoint) {
    if (absl::Status s = options_.wait_checkpoint(); !s.ok()) {
      options_.say(absl::StrCat("checkpoint abandoned: ", s.ToString()));
    }
  }
  std::vector<int> workers(newest->workers().begin(), newest->workers().end());
  const int old_workers = static_cast<int>(current_.workers.size());
  const int old_ps = num_ps_;
  const bool move_shards = newest->num_ps() > 0 && newest->num_ps() != num_ps_;
  int64_t version = step;
  if (move_shards) {
    if (newest->ps_addresses_size() != newest->num_ps()) {
      return absl::InternalError(absl::StrCat(
          "membership ", newest->epoch(), " has ", newest->num_ps(),
          " shards but ", newest->ps_addresses_size(), " shard addresses"));
    }
    const std::vector<std::string> addresses(newest->ps_addresses().begin(),
                                             newest->ps_addresses().end());
    const int64_t epoch = newest->epoch();
    // The data position of the shards' version (backup workers may have
    // decided steps past worker 0's), under the old membership.
    // Async: no step is shared; the new layout's membership starts at
    // worker 0's.
    ASSIGN_OR_RETURN(version, exchange_->ChangeShards(
                                  addresses,
                                  [this, &workers, epoch, step](int64_t v) {
                                    return Anchored(workers, epoch,
                                                    options_.async ? step : v);
                                  },
                                  options_.timeout));
    num_ps_ = newest->num_ps();
    current_ = Anchored(workers, epoch, version);
  } else {
    const WorkerMembership next = Anchored(workers, newest->epoch(), step);
    ASSIGN_OR_RETURN(version,
                     exchange_->ChangeMembership(next, options_.timeout));
    current_ = Anchored(workers, newest->epoch(), version);
  }
  if (version != step && !move_shards) {
    // Backup workers decided steps past worker 0's: the shards hold the
    // data position of `step`; reopen once more (no step ran since) with
    // that of their version, placed under the old membership.
    ASSIGN_OR_RETURN(version,
                     exchange_->ChangeMembership(current_, options_.timeout));
    current_.from_step = version;
  }
  positions_->Rebase(version, current_.data_epoch, current_.data_offset,
                     current_.data_steps, current_.size(), 0);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - began);
  const std::string shards =
      old_ps == num_ps_ ? ""
                        : absl::StrFormat(", %d -> %d shards", old_ps, num_ps_);
  options_.say(absl::StrFormat(
      "membership %d: %d -> %d workers%s at step %d (%.0f ms): %s",
      newest->epoch(), old_workers, current_.size(), shards, version, ms,
      newest->reason()));
  MembershipApplied applied;
  applied.set_epoch(newest->epoch());
  applied.set_step(version);
  applied.set_elapsed_ms(ms);
  applied.set_old_workers(old_workers);
  applied.set_new_workers(current_.size());
  applied.set_old_ps(old_ps);
  applied.set_new_ps(num_ps_);
  last_applied_ = applied;
  if (options_.applied) options_.applied(applied);
  return version;
}

absl::StatusOr<bool> ElasticMembership::Started(int64_t* step) {
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
  return FollowAt(step, own_step, /*at_start=*/false);
}

absl::StatusOr<bool> ElasticMembership::FollowAt(int64_t* step,
                                                 int64_t own_step,
                                                 bool at_start) {
  const std::optional<WorkerMembership> m = exchange_->membership();
  if (!m.has_value()) return true;
  const int rank = m->RankOf(options_.worker_id);
  if (rank < 0) {
    options_.say(absl::StrCat("worker ", options_.worker_id,
                              " is not a member from step ", m->from_step,
                              " on (membership ", m->epoch, ": workers ",
                              m->size(), "); leaving the job"));
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
  if (old != m->size() || async_change) {
    options_.say(absl::StrCat(
        "worker ", options_.worker_id, ": membership ", m->epoch, ", ",
        m->size(), " workers from step ", m->from_step, " (rank ", rank, ")",
        async_change ? absl::StrCat("; going on from step ", *step) : ""));
  }
  return true;
}

}  // namespace pstrain
