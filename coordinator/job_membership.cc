#include "coordinator/job_membership.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// The task of worker `index` (the workers follow the PS tasks).
TaskInfo* WorkerTask(JobInfo* job, int index) {
  return job->mutable_tasks(PsTaskCount(job->spec()) + index);
}
const TaskInfo& WorkerTask(const JobInfo& job, int index) {
  return job.tasks(PsTaskCount(job.spec()) + index);
}

// Every member of `m` and every shard of its layout has registered (a
// restarted one: again).
bool AllRegistered(const JobInfo& job, const Membership& m) {
  for (int w : m.workers()) {
    const TaskInfo& task = WorkerTask(job, w);
    if (task.state() != TASK_REGISTERED) return false;
    // Worker 0 applies memberships; the others are ready to train once
    // prepared (TaskInfo.prepared).
    if (w != 0 && !task.prepared()) return false;
  }
  for (int s = 0; s < m.num_ps(); ++s) {
    if (job.tasks(s).state() != TASK_REGISTERED) return false;
  }
  return true;
}

// With num_ps, once its shards are registered: their addresses. True if
// they changed.
bool FillShardAddresses(const JobInfo& job, Membership* m) {
  if (m->num_ps() <= 0) return false;
  std::vector<std::string> addresses;
  for (int s = 0; s < m->num_ps(); ++s) {
    if (job.tasks(s).state() != TASK_REGISTERED) return false;
    addresses.push_back(job.tasks(s).address());
  }
  if (std::equal(addresses.begin(), addresses.end(), m->ps_addresses().begin(),
                 m->ps_addresses().end())) {
    return false;
  }
  m->clear_ps_addresses();
  for (std::string& a : addresses) m->add_ps_addresses(std::move(a));
  return true;
}

// Appends `m` as the newest membership.
void AddMembership(JobInfo* job, const Membership& m) {
  *job->add_memberships() = m;
  *job->mutable_membership() = m;
}

// The most shards of the memberships from the applied one on.
int MostShards(const JobInfo& job) {
  int most = 0;
  for (const Membership& m : job.memberships()) {
    most = std::max(most, m.num_ps());
  }
  return most;
}

}  // namespace

bool IsElastic(const JobSpec& spec) {
  return spec.max_workers() > 0 || spec.min_workers() > 0 ||
         IsShardElastic(spec);
}

bool IsShardElastic(const JobSpec& spec) { return spec.max_ps() > 0; }

int WorkerTaskCount(const JobSpec& spec) {
  return std::max(spec.num_workers(), spec.max_workers());
}

int PsTaskCount(const JobSpec& spec) {
  return std::max(spec.num_ps(), spec.max_ps());
}

bool IsMember(const Membership& membership, int worker) {
  return std::binary_search(membership.workers().begin(),
                            membership.workers().end(), worker);
}

bool RegisteredAndBeating(const TaskInfo& t) {
  return t.state() == TASK_REGISTERED ||
         (t.state() == TASK_STANDBY && !t.address().empty());
}

void InitMembership(JobInfo* job) {
  const JobSpec& spec = job->spec();
  if (!IsElastic(spec)) return;
  Membership first;
  first.set_epoch(0);
  for (int w = 0; w < spec.num_workers(); ++w) first.add_workers(w);
  if (IsShardElastic(spec)) first.set_num_ps(spec.num_ps());
  first.set_ready(true);
  first.set_reason("submitted");
  AddMembership(job, first);
  for (int w = spec.num_workers(); w < WorkerTaskCount(spec); ++w) {
    WorkerTask(job, w)->set_state(spec.standby_workers() ? TASK_STANDBY
                                                         : TASK_IDLE);
  }
  for (int s = spec.num_ps(); s < PsTaskCount(spec); ++s) {
    job->mutable_tasks(s)->set_state(TASK_IDLE);
  }
}

const Membership* AppliedMembership(const JobInfo& job) {
  if (!IsElastic(job.spec()) || job.memberships().empty()) return nullptr;
  return &job.memberships(0);
}

bool WorkerRemoved(const JobInfo& job, int index) {
  if (!IsElastic(job.spec()) || job.memberships().empty()) return false;
  // A standby waits to be added.
  if (index >= 0 && index < WorkerTaskCount(job.spec()) &&
      WorkerTask(job, index).state() == TASK_STANDBY) {
    return false;
  }
  for (const Membership& m : job.memberships()) {
    if (IsMember(m, index)) return false;
  }
  return true;
}

bool LeavingJob(const JobInfo& job, int index) {
  return IsElastic(job.spec()) && !job.memberships().empty() &&
         !IsMember(job.membership(), index);
}

bool ShardRemoved(const JobInfo& job, int index) {
  return IsShardElastic(job.spec()) && !job.memberships().empty() &&
         index >= MostShards(job);
}

void FillHeartbeatMembership(const JobInfo& job, TaskRole role, int index,
                             HeartbeatResponse* response) {
  if (!IsElastic(job.spec())) return;
  if (role == ROLE_PS) {
    response->set_removed(ShardRemoved(job, index));
    std::vector<int> gone;
    for (const TaskInfo& t : job.tasks()) {
      if (t.role() == ROLE_WORKER && t.state() == TASK_REMOVED) {
        gone.push_back(t.index());
      }
    }
    std::sort(gone.begin(), gone.end());
    gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
    for (int w : gone) response->add_removed_workers(w);
    return;
  }
  *response->mutable_membership() = job.membership();
  if (const Membership* applied = AppliedMembership(job)) {
    *response->mutable_applied_membership() = *applied;
  }
  response->set_removed(WorkerRemoved(job, index));
}

namespace {

// The checks of a Scale that change nothing (see ScaleMembership).
absl::Status CheckScale(const JobInfo& job, const ScaleTarget& target) {
  const JobSpec& spec = job.spec();
  const std::string& id = job.id();
  if (target.num_workers == 0 && target.num_ps == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        id,
        ": a scale to 0 workers and 0 shards; expected num_workers, "
        "num_ps or both (0: unchanged)"));
  }
  if (target.num_workers != 0 && spec.max_workers() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        id,
        IsShardElastic(spec) ? " has a fixed number of workers"
                             : " is not elastic",
        ": its spec has no max_workers; a job is scaled only within "
        "max_workers"));
  }
  const int lo = std::max({1, spec.min_workers(), spec.backup_workers() + 1});
  if (target.num_workers != 0 &&
      (target.num_workers < lo || target.num_workers > spec.max_workers())) {
    return absl::InvalidArgumentError(absl::StrCat(
        id, ": scale to ", target.num_workers, " workers; expected ", lo,
        " to ", spec.max_workers(),
        " (max(1, min_workers, backup_workers + 1) to max_workers)"));
  }
  if (target.num_ps != 0 && !IsShardElastic(spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        id,
        " has a fixed number of shards: its spec has no max_ps; shards are "
        "scaled only within max_ps"));
  }
  if (target.num_ps != 0 &&
      (target.num_ps < 1 || target.num_ps > spec.max_ps())) {
    return absl::InvalidArgumentError(
        absl::StrCat(id, ": scale to ", target.num_ps,
                     " shards; expected 1 to ", spec.max_ps(), " (max_ps)"));
  }
  if (target.at_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(id, ": at_step ", target.at_step,
                     "; expected >= 0 (0: the next step)"));
  }
  if (job.state() != JOB_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " is ", JobState_Name(job.state()),
                     "; only a RUNNING job is scaled"));
  }
  return absl::OkStatus();
}

// "scale to 3 workers", "scale to 2 shards", "scale to 3 workers and 2
// shards": what changed.
std::string ScaleReason(bool workers_change, int num_workers,
                        bool shards_change, int num_ps) {
  std::string reason = "scale to ";
  if (workers_change) absl::StrAppend(&reason, num_workers, " workers");
  if (workers_change && shards_change) absl::StrAppend(&reason, " and ");
  if (shards_change) absl::StrAppend(&reason, num_ps, " shards");
  return reason;
}

}  // namespace

absl::StatusOr<Membership> ScaleMembership(JobInfo* job,
                                           const ScaleTarget& target,
                                           int64_t now_ms) {
  RETURN_IF_ERROR(CheckScale(*job, target));
  const JobSpec& spec = job->spec();
  const std::string& id = job->id();
  const Membership& newest = job->membership();
  const int current = newest.workers_size();
  const int num_workers =
      target.num_workers != 0 ? target.num_workers : current;
  const int current_ps = newest.num_ps();
  const int num_ps = target.num_ps != 0 ? target.num_ps : current_ps;
  if (num_workers == current && num_ps == current_ps) return newest;
  if (job->memberships_size() > kMaxPendingMemberships) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, ": ", job->memberships_size() - 1,
        " memberships are not applied yet, the limit; scale again once "
        "worker 0 applied membership ",
        newest.epoch()));
  }
  std::vector<int> workers(newest.workers().begin(), newest.workers().end());
  std::vector<int> joining;
  if (num_workers > current) {
    // Prepared standbys first, then registered ones, then those still
    // starting (each runs already), then the idle and removed tasks a
    // supervisor starts; the lowest index within each.
    auto rank = [&](int w) {
      const TaskInfo& task = WorkerTask(*job, w);
      if (IsMember(newest, w)) return -1;
      switch (task.state()) {
        case TASK_STANDBY:
          return task.address().empty() ? 2 : task.prepared() ? 0 : 1;
        case TASK_IDLE:
        case TASK_REMOVED:
          return 3;
        default:
          return -1;
      }
    };
    for (int r = 0; r <= 3; ++r) {
      for (int w = 0; w < WorkerTaskCount(spec) &&
                      current + static_cast<int>(joining.size()) < num_workers;
           ++w) {
        if (rank(w) == r) joining.push_back(w);
      }
    }
    if (current + static_cast<int>(joining.size()) < num_workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          id, ": scale to ", num_workers, " workers: only ", joining.size(),
          " of its ", WorkerTaskCount(spec), " worker tasks are free to join ",
          "(removed workers are still exiting); try again shortly"));
    }
  }
  // Shards current_ps to num_ps - 1 join: each must be free (a shard a
  // shrink not yet applied still holds is not).
  for (int s = current_ps; s < num_ps; ++s) {
    const TaskState state = job->tasks(s).state();
    if (state != TASK_IDLE && state != TASK_REMOVED) {
      return absl::FailedPreconditionError(absl::StrCat(
          id, ": scale to ", num_ps, " shards: ps ", s, " is ",
          TaskState_Name(state),
          " (a shrink not yet applied still holds it, or it is exiting); "
          "try again once worker 0 applied membership ",
          newest.epoch()));
    }
  }
  if (num_workers > current) {
    workers.insert(workers.end(), joining.begin(), joining.end());
    std::sort(workers.begin(), workers.end());
  } else {
    // The highest leave (worker 0 stays); one not registered yet (it was
    // joining, or restarting) is not waited for.
    for (size_t i = num_workers; i < workers.size(); ++i) {
      TaskInfo* task = WorkerTask(job, workers[i]);
      if (task->state() != TASK_WAITING) continue;
      task->set_state(TASK_REMOVED);
      task->set_message(absl::StrCat("left out by a scale to ", num_workers,
                                     " workers before it registered"));
    }
    workers.resize(num_workers);
  }
  // Leaving shards stay until worker 0 applies the membership, but one
  // that joined by a membership not applied and has not registered yet is
  // not waited for.
  const int applied_ps = job->memberships(0).num_ps();
  for (int s = std::max(num_ps, applied_ps); s < current_ps; ++s) {
    TaskInfo* task = job->mutable_tasks(s);
    if (task->state() != TASK_WAITING) continue;
    task->set_state(TASK_REMOVED);
    task->set_message(absl::StrCat("left out by a scale to ", num_ps,
                                   " shards before it registered"));
  }
  std::vector<TaskInfo*> starting;
  for (int w : joining) {
    TaskInfo* task = WorkerTask(job, w);
    // A registered standby is a registered member now, prepared or not.
    if (task->state() == TASK_STANDBY && !task->address().empty()) {
      task->set_state(TASK_REGISTERED);
      continue;
    }
    starting.push_back(task);
  }
  for (int s = current_ps; s < num_ps; ++s) {
    starting.push_back(job->mutable_tasks(s));
  }
  for (TaskInfo* task : starting) {
    task->set_state(TASK_WAITING);
    task->set_address("");
    task->set_message("");
    task->set_restart_requested(false);
    task->set_waiting_since_ms(now_ms);
  }
  Membership next;
  next.set_epoch(newest.epoch() + 1);
  for (int w : workers) next.add_workers(w);
  next.set_num_ps(num_ps);
  next.set_ready(AllRegistered(*job, next));
  if (next.ready()) FillShardAddresses(*job, &next);
  next.set_at_step(target.at_step);
  next.set_reason(ScaleReason(num_workers != current, num_workers,
                              num_ps != current_ps, num_ps));
  AddMembership(job, next);
  return next;
}

bool UpdateReady(JobInfo* job) {
  if (!IsElastic(job->spec())) return false;
  bool changed = false;
  for (Membership& m : *job->mutable_memberships()) {
    if (!m.ready() && AllRegistered(*job, m)) {
      m.set_ready(true);
      changed = true;
    }
    if (m.ready()) changed |= FillShardAddresses(*job, &m);
  }
  if (changed) {
    *job->mutable_membership() = job->memberships(job->memberships_size() - 1);
  }
  return changed;
}

namespace {

// The membership epoch of an allreduce world's rendezvous key (prefix
// "gloo" or "nccl", then "-G" in restart generation G, then "-mE" for
// epoch E > 0: worker_main.cc's CollectiveFactoryOf), or -1 for any other
// key.
int64_t WorldEpochOfKey(absl::string_view key) {
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos) return -1;
  absl::string_view prefix = key.substr(0, slash);
  if (!absl::ConsumePrefix(&prefix, "gloo") &&
      !absl::ConsumePrefix(&prefix, "nccl")) {
    return -1;
  }
  const size_t m = prefix.rfind("-m");
  if (m == absl::string_view::npos) return 0;
  int64_t epoch = -1;
  return absl::SimpleAtoi(prefix.substr(m + 2), &epoch) ? epoch : -1;
}

// An elastic allreduce job's worlds before `epoch` have ended (worker 0
// applied `epoch`, every member connected its world): their rendezvous
// keys go, so that the store's key and byte limits hold however many
// changes a job makes.
void DropEndedWorldKeys(JobInfo* job, int64_t epoch) {
  std::vector<std::string> drop;
  for (const auto& [key, value] : job->kv()) {
    const int64_t world = WorldEpochOfKey(key);
    if (world >= 0 && world < epoch) drop.push_back(key);
  }
  for (const std::string& key : drop) job->mutable_kv()->erase(key);
}

}  // namespace

// The longest time a membership change may be reported to have taken, ms
// (a year).
constexpr double kMaxElapsedMs = 365.0 * 24 * 3600 * 1000;

std::optional<std::string> ApplyMembership(JobInfo* job,
                                           const MembershipApplied& applied) {
  if (!IsElastic(job->spec()) || job->memberships().empty()) {
    return std::nullopt;
  }
  int found = -1;
  for (int i = 1; i < job->memberships_size(); ++i) {
    if (job->memberships(i).epoch() == applied.epoch()) found = i;
  }
  if (found < 0) return std::nullopt;  // applied already, or never made
  const std::string reason = job->memberships(found).reason();
  MembershipApplied kept = applied;
  // A duration, or 0 ms: the report is worker 0's word, and the message
  // below casts it to an integer (NaN or 1e300 would be undefined).
  if (!(kept.elapsed_ms() >= 0 && kept.elapsed_ms() <= kMaxElapsedMs)) {
    kept.set_elapsed_ms(0);
  }
  if (kept.old_ps() == 0) kept.set_old_ps(job->memberships(0).num_ps());
  if (kept.new_ps() == 0) kept.set_new_ps(job->memberships(found).num_ps());
  job->mutable_memberships()->DeleteSubrange(0, found);
  DropEndedWorldKeys(job, applied.epoch());
  auto* history = job->mutable_membership_history();
  *history->Add() = kept;
  if (history->size() > kMaxMembershipHistory) {
    history->DeleteSubrange(0, history->size() - kMaxMembershipHistory);
  }
  // The shards no membership from this one on has: they exit.
  for (int s = 0; s < PsTaskCount(job->spec()); ++s) {
    TaskInfo* task = job->mutable_tasks(s);
    if (!ShardRemoved(*job, s) || task->state() == TASK_IDLE ||
        task->state() == TASK_REMOVED) {
      continue;
    }
    task->set_state(TASK_REMOVED);
    task->set_message(absl::StrCat("left out by membership ", applied.epoch(),
                                   " (", kept.new_ps(), " shards)"));
  }
  const std::string shards =
      IsShardElastic(job->spec())
          ? absl::StrCat(", ", kept.old_ps(), " shards -> ", kept.new_ps())
          : "";
  return absl::StrCat(
      "membership ", applied.epoch(), ": ", applied.old_workers(),
      " workers -> ", applied.new_workers(), shards, " at step ",
      applied.step(), " (", static_cast<int64_t>(kept.elapsed_ms()),
      " ms): ", reason);
}

std::optional<std::string> RemoveFailedWorker(JobInfo* job, int index,
                                              const std::string& why) {
  const JobSpec& spec = job->spec();
  const Membership& newest = job->membership();
  if (!IsElastic(spec) || spec.min_workers() <= 0 || index == 0 || index < 0 ||
      index >= WorkerTaskCount(spec) || !IsMember(newest, index) ||
      newest.workers_size() - 1 < spec.min_workers()) {
    return std::nullopt;
  }
  Membership next;
  next.set_epoch(newest.epoch() + 1);
  for (int w : newest.workers()) {
    if (w != index) next.add_workers(w);
  }
  next.set_num_ps(newest.num_ps());
  next.set_ready(AllRegistered(*job, next));
  if (next.ready()) FillShardAddresses(*job, &next);
  next.set_reason(absl::StrCat("worker ", index, " removed: ", why));
  AddMembership(job, next);
  TaskInfo* task = WorkerTask(job, index);
  task->set_state(TASK_REMOVED);
  task->set_message(why);
  return absl::StrCat(next.reason(), "; membership ", next.epoch(), ": ",
                      next.workers_size(), " workers (min_workers ",
                      spec.min_workers(), "); the job goes on");
}

bool EveryMemberDone(const JobInfo& job) {
  const Membership* applied = AppliedMembership(job);
  for (const TaskInfo& t : job.tasks()) {
    if (t.role() != ROLE_WORKER) continue;
    if (applied != nullptr && !IsMember(*applied, t.index())) continue;
    if (t.state() != TASK_DONE && t.state() != TASK_REMOVED) return false;
  }
  return true;
}

absl::Status ValidateMembership(const JobInfo& job, const std::string& where) {
  if (!IsElastic(job.spec())) return absl::OkStatus();
  if (job.memberships().empty()) {
    return absl::DataLossError(
        absl::StrCat(where, ": an elastic job without a membership"));
  }
  const int tasks = WorkerTaskCount(job.spec());
  const bool shards = IsShardElastic(job.spec());
  const int ps_tasks = PsTaskCount(job.spec());
  int64_t epoch = -1;
  for (const Membership& m : job.memberships()) {
    if (shards ? m.num_ps() < 1 || m.num_ps() > ps_tasks : m.num_ps() != 0) {
      return absl::DataLossError(absl::StrCat(
          where, ": membership ", m.epoch(), " has ", m.num_ps(),
          " shards; expected ",
          shards ? absl::StrCat("1 to ", ps_tasks) : "0 (no max_ps)"));
    }
    if (!m.ps_addresses().empty() && m.ps_addresses_size() != m.num_ps()) {
      return absl::DataLossError(absl::StrCat(
          where, ": membership ", m.epoch(), " lists ", m.ps_addresses_size(),
          " shard addresses for its ", m.num_ps(), " shards"));
    }
    int previous = -1;
    for (int w : m.workers()) {
      if (w <= previous || w >= tasks) {
        return absl::DataLossError(absl::StrCat(
            where, ": membership ", m.epoch(), " lists worker ", w,
            " out of order or outside its ", tasks, " worker tasks"));
      }
      previous = w;
    }
    if (m.workers().empty() || m.workers(0) != 0 || m.epoch() <= epoch) {
      return absl::DataLossError(
          absl::StrCat(where, ": membership ", m.epoch(),
                       " lacks worker 0 or follows epoch ", epoch));
    }
    epoch = m.epoch();
  }
  if (job.membership().epoch() != epoch) {
    return absl::DataLossError(
        absl::StrCat(where, ": membership ", job.membership().epoch(),
                     " is not the newest of its memberships (", epoch, ")"));
  }
  if (job.membership_history_size() > kMaxMembershipHistory) {
    return absl::DataLossError(absl::StrCat(
        where, ": ", job.membership_history_size(),
        " membership reports; at most ", kMaxMembershipHistory, " are kept"));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
