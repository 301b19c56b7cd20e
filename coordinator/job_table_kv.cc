// JobTable's per-job key-value store (job_table.h: Set, WaitForKey and
// KvKeyOwner), where the workers of an allreduce job meet (Gloo's and
// NCCL's rendezvous, the elastic world announcements): its keys and values
// checked against the table's byte limits, each key charged to its owner.
// Also the table's long polls (WaitForLayout, WaitForKey): their waits for
// a cancelled caller and StopWaits().
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_table.h"

namespace pstrain {

namespace {

// `text` is the decimal of a number >= 0 without sign or leading zeros
// that fits an int.
bool ParseIndex(absl::string_view text, int* index) {
  if (text.empty() || text.size() > 9) return false;
  if (text.size() > 1 && text[0] == '0') return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(text, index);
}

}  // namespace

int KvKeyOwner(const std::string& key) {
  int index = -1;
  if (absl::StartsWith(key, "worker-")) {
    const size_t slash = key.find('/');
    if (slash != std::string::npos &&
        ParseIndex(absl::string_view(key).substr(7, slash - 7), &index)) {
      return index;
    }
    return -1;
  }
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos || slash == 0) return -1;
  absl::string_view last = absl::string_view(key).substr(slash + 1);
  if (last == "nccl_id" || last == "world") return 0;
  if (absl::ConsumePrefix(&last, "rank_")) {
    return ParseIndex(last, &index) ? index : -1;
  }
  return ParseIndex(last, &index) ? index : -1;
}

absl::Status JobTable::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("kv: the key is empty");
  if (static_cast<int64_t>(key.size()) > limits_.max_kv_key_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv: a key of ", key.size(), " bytes; the limit is ",
                     limits_.max_kv_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status JobTable::Set(const std::string& id, const std::string& key,
                           const std::string& value) {
  RETURN_IF_ERROR(CheckKey(key));
  if (static_cast<int64_t>(value.size()) > limits_.max_kv_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv: the value of key \"", key, "\" is ", value.size(),
        " bytes; the limit is ", limits_.max_kv_value_bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  // An ended job accepts nothing (job_table.h).
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended (", JobStateName(job->state()),
                     "); refusing to set key \"", key, "\""));
  }
  auto* kv = job->mutable_kv();
  auto it = kv->find(key);
  if (it == kv->end() &&
      static_cast<int64_t>(kv->size()) >= limits_.max_kv_keys_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat(id, ": kv: the job's store holds ", kv->size(),
                     " keys, the limit; refusing new key \"", key, "\""));
  }
  // Byte budgets: the job's store, and the keys of the key's owner.
  const int owner = KvKeyOwner(key);
  int64_t job_bytes = 0;
  int64_t owner_bytes = 0;
  for (const auto& [k, v] : *kv) {
    if (k == key) continue;
    job_bytes += k.size() + v.size();
    if (KvKeyOwner(k) == owner) owner_bytes += k.size() + v.size();
  }
  const int64_t entry = key.size() + value.size();
  if (job_bytes + entry > limits_.max_kv_bytes_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat(id, ": kv: key \"", key, "\" would make the job's store ",
                     job_bytes + entry, " bytes; the limit is ",
                     limits_.max_kv_bytes_per_job, " bytes"));
  }
  if (owner_bytes + entry > limits_.max_kv_bytes_per_task) {
    return absl::ResourceExhaustedError(
        absl::StrCat(id, ": kv: key \"", key, "\" would make the keys of ",
                     owner >= 0 ? TaskName(ROLE_WORKER, owner) : "no worker",
                     " ", owner_bytes + entry, " bytes; the limit is ",
                     limits_.max_kv_bytes_per_task, " bytes"));
  }
  if (it != kv->end()) {
    it->second = value;
  } else {
    (*kv)[key] = value;
  }
  // Written within a second (FlushIfDirty) or with the next state change.
  dirty_ = true;
  return absl::OkStatus();
}

bool JobTable::AwaitUnlessCancelled(const absl::Condition& ready,
                                    absl::Time deadline,
                                    const std::function<bool()>& cancelled) {
  if (!cancelled) {
    mu_.AwaitWithDeadline(ready, deadline);
    return false;
  }
  while (!mu_.AwaitWithDeadline(
      ready, std::min(deadline, absl::Now() + kCancelledCheckInterval))) {
    if (absl::Now() >= deadline) return false;
    // The caller's code (gRPC's) runs without the table locked.
    mu_.Unlock();
    const bool gone = cancelled();
    mu_.Lock();
    if (gone) return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> JobTable::WaitForLayout(
    const std::string& id, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  auto all_registered = [](const JobInfo& job) {
    for (const TaskInfo& t : job.tasks()) {
      if (t.state() == TASK_WAITING) return false;
    }
    return true;
  };
  auto ready = [this, &id,
                &all_registered]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    JobInfo* job = Find(id);
    return waits_stopped_ || job == nullptr || JobEnded(job->state()) ||
           (job->state() != JOB_PENDING && all_registered(*job));
  };
  if (AwaitUnlessCancelled(absl::Condition(&ready), deadline, cancelled)) {
    return absl::CancelledError(
        absl::StrCat(id, ": the wait for the layout was cancelled"));
  }
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if (!all_registered(*job)) {
    std::vector<std::string> missing;
    for (const TaskInfo& t : job->tasks()) {
      if (t.state() == TASK_WAITING) {
        missing.push_back(TaskName(t.role(), t.index()));
      }
    }
    const std::string waiting =
        absl::StrCat("still waiting for ", absl::StrJoin(missing, ", "));
    if (waits_stopped_) {
      return absl::UnavailableError(
          absl::StrCat(id, ": coordinator shutting down; ", waiting));
    }
    return absl::DeadlineExceededError(absl::StrCat(id, ": ", waiting));
  }
  // Elastic shards: the applied membership's layout, shards 0 to its
  // num_ps - 1 (a worker recovering after worker 0 changed it finds the
  // new shards).
  const Membership* applied = AppliedMembership(*job);
  const int shards = IsShardElastic(job->spec()) && applied != nullptr
                         ? applied->num_ps()
                         : job->spec().num_ps();
  std::vector<std::string> addresses;
  for (const TaskInfo& t : job->tasks()) {
    if (t.role() == ROLE_PS && t.index() >= shards) continue;
    const bool member = t.state() != TASK_IDLE && t.state() != TASK_REMOVED;
    addresses.push_back(member ? t.address() : "");
  }
  return addresses;
}

void JobTable::StopWaits() {
  // The waits' conditions are evaluated again when the lock is released.
  absl::MutexLock lock(&mu_);
  waits_stopped_ = true;
}

absl::StatusOr<std::string> JobTable::WaitForKey(
    const std::string& id, const std::string& key, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto ready = [this, &id, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    JobInfo* job = Find(id);
    return waits_stopped_ || job == nullptr || job->kv().contains(key) ||
           JobEnded(job->state());
  };
  if (AwaitUnlessCancelled(absl::Condition(&ready), deadline, cancelled)) {
    return absl::CancelledError(
        absl::StrCat(id, ": the wait for key \"", key, "\" was cancelled"));
  }
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  auto it = job->kv().find(key);
  if (it != job->kv().end()) return it->second;
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if (waits_stopped_) {
    return absl::UnavailableError(absl::StrCat(
        id, ": coordinator shutting down; key \"", key, "\" is not set yet"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(id, ": key \"", key, "\" was not set in time"));
}

}  // namespace pstrain
