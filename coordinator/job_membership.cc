#include "coordinator/job_membership.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

// The task of worker `index` (the workers follow the num_ps PS tasks).
TaskInfo* WorkerTask(JobInfo* job, int index) {
  return job->mutable_tasks(job->spec().num_ps() + index);
}
const TaskInfo& WorkerTask(const JobInfo& job, int index) {
  return job.tasks(job.spec().num_ps() + index);
}

// Every member of `m` has registered (a restarted one: again).
bool AllRegistered(const JobInfo& job, const Membership& m) {
  for (int w : m.workers()) {
    if (WorkerTask(job, w).state() != TASK_REGISTERED) return false;
  }
  return true;
}

// Appends `m` as the newest membership.
void AddMembership(JobInfo* job, const Membership& m) {
  *job->add_memberships() = m;
  *job->mutable_membership() = m;
}

}  // namespace

bool IsElastic(const JobSpec& spec) {
  return spec.max_workers() > 0 || spec.min_workers() > 0;
}

int WorkerTaskCount(const JobSpec& spec) {
  return std::max(spec.num_workers(), spec.max_workers());
}

bool IsMember(const Membership& membership, int worker) {
  return std::binary_search(membership.workers().begin(),
                            membership.workers().end(), worker);
}

void InitMembership(JobInfo* job) {
  const JobSpec& spec = job->spec();
  if (!IsElastic(spec)) return;
  Membership first;
  first.set_epoch(0);
  for (int w = 0; w < spec.num_workers(); ++w) first.add_workers(w);
  first.set_ready(true);
  first.set_reason("submitted");
  AddMembership(job, first);
  for (int w = spec.num_workers(); w < WorkerTaskCount(spec); ++w) {
    WorkerTask(job, w)->set_state(TASK_IDLE);
  }
}

const Membership* AppliedMembership(const JobInfo& job) {
  if (!IsElastic(job.spec()) || job.memberships().empty()) return nullptr;
  return &job.memberships(0);
}

bool WorkerRemoved(const JobInfo& job, int index) {
  if (!IsElastic(job.spec()) || job.memberships().empty()) return false;
  for (const Membership& m : job.memberships()) {
    if (IsMember(m, index)) return false;
  }
  return true;
}

bool LeavingJob(const JobInfo& job, int index) {
  return IsElastic(job.spec()) && !job.memberships().empty() &&
         !IsMember(job.membership(), index);
}

void FillHeartbeatMembership(const JobInfo& job, int index,
                             HeartbeatResponse* response) {
  if (!IsElastic(job.spec())) return;
  *response->mutable_membership() = job.membership();
  response->set_removed(WorkerRemoved(job, index));
}

absl::StatusOr<Membership> ScaleMembership(JobInfo* job, int num_workers,
                                           int64_t at_step, int64_t now_ms) {
  const JobSpec& spec = job->spec();
  const std::string& id = job->id();
  if (spec.max_workers() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        id,
        " is not elastic: its spec has no max_workers; a job is scaled "
        "only within max_workers"));
  }
  const int lo = std::max({1, spec.min_workers(), spec.backup_workers() + 1});
  if (num_workers < lo || num_workers > spec.max_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        id, ": scale to ", num_workers, " workers; expected ", lo, " to ",
        spec.max_workers(), " (max(1, min_workers, backup_workers + 1) to ",
        "max_workers)"));
  }
  if (at_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        id, ": at_step ", at_step, "; expected >= 0 (0: the next step)"));
  }
  if (job->state() != JOB_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " is ", JobState_Name(job->state()),
                     "; only a RUNNING job is scaled"));
  }
  const Membership& newest = job->membership();
  const int current = newest.workers_size();
  if (num_workers == current) return newest;
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
    for (int w = 0; w < WorkerTaskCount(spec) &&
                    current + static_cast<int>(joining.size()) < num_workers;
         ++w) {
      const TaskState state = WorkerTask(*job, w).state();
      if (!IsMember(newest, w) &&
          (state == TASK_IDLE || state == TASK_REMOVED)) {
        joining.push_back(w);
      }
    }
    if (current + static_cast<int>(joining.size()) < num_workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          id, ": scale to ", num_workers, " workers: only ", joining.size(),
          " of its ", WorkerTaskCount(spec), " worker tasks are free to join ",
          "(removed workers are still exiting); try again shortly"));
    }
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
  for (int w : joining) {
    TaskInfo* task = WorkerTask(job, w);
    task->set_state(TASK_WAITING);
    task->set_address("");
    task->set_message("");
    task->set_restart_requested(false);
    task->set_waiting_since_ms(now_ms);
  }
  Membership next;
  next.set_epoch(newest.epoch() + 1);
  for (int w : workers) next.add_workers(w);
  next.set_ready(AllRegistered(*job, next));
  next.set_at_step(at_step);
  next.set_reason(absl::StrCat("scale to ", num_workers, " workers"));
  AddMembership(job, next);
  return next;
}

bool UpdateReady(JobInfo* job) {
  if (!IsElastic(job->spec())) return false;
  bool changed = false;
  for (Membership& m : *job->mutable_memberships()) {
    if (m.ready() || !AllRegistered(*job, m)) continue;
    m.set_ready(true);
    if (m.epoch() == job->membership().epoch()) {
      job->mutable_membership()->set_ready(true);
    }
    changed = true;
  }
  return changed;
}

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
  job->mutable_memberships()->DeleteSubrange(0, found);
  auto* history = job->mutable_membership_history();
  *history->Add() = applied;
  if (history->size() > kMaxMembershipHistory) {
    history->DeleteSubrange(0, history->size() - kMaxMembershipHistory);
  }
  return absl::StrCat(
      "membership ", applied.epoch(), ": ", applied.old_workers(),
      " workers -> ", applied.new_workers(), " at step ", applied.step(), " (",
      static_cast<int64_t>(applied.elapsed_ms()), " ms): ", reason);
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
  next.set_ready(AllRegistered(*job, next));
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
  int64_t epoch = -1;
  for (const Membership& m : job.memberships()) {
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
