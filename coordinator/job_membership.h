// An elastic job's membership (issue 40; docs/ARCHITECTURE.md "Elastic
// membership"), the part of the JobTable that reads and changes a JobInfo's
// membership fields and its worker tasks' states. No locks and no I/O: the
// JobTable calls these under its mutex and writes its file after a change.
//
// A job is elastic when its spec sets max_workers, min_workers or max_ps.
// It has PsTaskCount() PS tasks, then WorkerTaskCount() worker tasks;
// workers 0 to num_workers - 1 are the members of epoch 0, shards 0 to
// num_ps - 1 its layout (Membership.num_ps, with max_ps), the others start
// TASK_IDLE (workers with standby_workers: TASK_STANDBY, started and
// waiting to be added). The coordinator holds the
// job's intent, JobInfo.membership (the newest); worker 0 applies it at a
// step boundary and reports MembershipApplied. JobInfo.memberships keeps
// the newest applied membership, then every newer one: a worker in none of
// them is removed (it exits 0; its task becomes TASK_REMOVED), and a
// removed task neither fails the job nor is waited for.
//
// Elastic shards (max_ps; docs/ARCHITECTURE.md "Elastic shards"): every
// membership has num_ps, the shards 0 to num_ps - 1 from it on, and, once
// ready, their registered addresses (ps_addresses). A shard at or above
// the num_ps of every membership from the applied one on is removed, as a
// worker in none of them: its heartbeats answer removed, it exits 0, its
// task becomes TASK_REMOVED, and its end is no failure.
//
// Thread-safety: none of its own; pure functions over the JobInfo given.
#ifndef PSTRAIN_COORDINATOR_JOB_MEMBERSHIP_H_
#define PSTRAIN_COORDINATOR_JOB_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace pstrain {

// MembershipApplied reports kept per job (JobInfo.membership_history); the
// oldest are dropped first.
inline constexpr int kMaxMembershipHistory = 1000;
// Memberships made by Scale and not yet applied, per job: past it Scale is
// FAILED_PRECONDITION until worker 0 applies one.
inline constexpr int kMaxPendingMemberships = 64;

// max_workers, min_workers or max_ps set.
bool IsElastic(const JobSpec& spec);
// max_ps set: the number of shards changes while the job runs.
bool IsShardElastic(const JobSpec& spec);
// The job's worker tasks: max(num_workers, max_workers).
int WorkerTaskCount(const JobSpec& spec);
// The job's PS tasks: max(num_ps, max_ps).
int PsTaskCount(const JobSpec& spec);
bool IsMember(const Membership& membership, int worker);
// Whether task `t` has registered and is expected to heartbeat (its
// silence timed, its prepared flag taken): TASK_REGISTERED, or a
// TASK_STANDBY with its address.
bool RegisteredAndBeating(const TaskInfo& t);

// Submit's part: an elastic job's workers from num_workers on (TASK_STANDBY
// with standby_workers) and shards from num_ps on go TASK_IDLE, and its
// membership is epoch 0 (workers 0 to num_workers - 1, num_ps shards with
// max_ps, ready, reason "submitted"; its ps_addresses once the shards
// registered). Nothing for other jobs.
void InitMembership(JobInfo* job);

// The newest membership worker 0 applied (epoch 0 before any); null for a
// job that is not elastic.
const Membership* AppliedMembership(const JobInfo& job);

// Whether worker `index` of an elastic job is in no membership from the
// applied one on (HeartbeatResponse.removed). False in other jobs, and for
// a TASK_STANDBY worker.
bool WorkerRemoved(const JobInfo& job, int index);

// Whether worker `index` of an elastic job is outside the newest
// membership: removed, or about to be once worker 0 applies it. Its end,
// clean or not, is then no failure (it may learn that it left from a shard
// before the coordinator hears that worker 0 applied it), and it is not
// restarted. False in other jobs.
bool LeavingJob(const JobInfo& job, int index);

// Whether shard `index` of a job with max_ps is at or above the num_ps of
// every membership from the applied one on (HeartbeatResponse.removed):
// it is outside the layout and no membership made since brings it back.
// Its end, clean or not, is no failure and it is not restarted. A shard
// only the newest membership leaves out still holds its part of the state
// until worker 0 applies it: its death is handled as before. False in
// other jobs.
bool ShardRemoved(const JobInfo& job, int index);

// The answer's membership fields for task (`role`, `index`) (elastic jobs
// only): a worker's membership and removed; a shard's removed (jobs with
// max_ps).
void FillHeartbeatMembership(const JobInfo& job, TaskRole role, int index,
                             HeartbeatResponse* response);

// What a Scale asks for: 0 keeps a count as the newest membership has it.
struct ScaleTarget {
  int num_workers = 0;
  int num_ps = 0;
  int64_t at_step = 0;
};

// Scale's part: the newest membership with `target.num_workers` members
// and `target.num_ps` shards, as a new epoch (reason "scale to N workers",
// "scale to M shards", "scale to N workers and M shards"), at `at_step`.
// Workers: growing adds non-members: TASK_STANDBY ones first (prepared,
// then registered, then still starting), then TASK_IDLE or TASK_REMOVED
// ones, the lowest index first within each; a registered standby goes
// TASK_REGISTERED (a prepared one makes the membership ready at once), the
// others TASK_WAITING, waiting since `now_ms`; shrinking
// removes the highest members (never worker 0), and the task of one not
// registered (TASK_WAITING) goes TASK_REMOVED at once. The same count as the
// newest returns it unchanged. Shards (max_ps): growing to M brings shards
// from the newest's num_ps to M - 1 in, each TASK_IDLE or TASK_REMOVED
// (it goes TASK_WAITING, and its supervisor starts it); shrinking leaves
// them to be removed once worker 0 applies the membership, but one not
// registered (TASK_WAITING) and outside the applied layout goes
// TASK_REMOVED at once. The new membership is ready when every member and
// every shard 0 to num_ps - 1 is TASK_REGISTERED (UpdateReady marks it
// later), its ps_addresses filled then. INVALID_ARGUMENT for both counts 0,
// num_workers in a job without max_workers, a count outside [max(1,
// min_workers, backup_workers + 1), max_workers], num_ps in a job without
// max_ps or outside [1, max_ps], or at_step < 0; FAILED_PRECONDITION unless
// the job is RUNNING, with kMaxPendingMemberships memberships not yet
// applied, or when too few tasks are free (removed workers or shards still
// leaving). The job is unchanged on an error. Each error is one line naming
// the job.
absl::StatusOr<Membership> ScaleMembership(JobInfo* job,
                                           const ScaleTarget& target,
                                           int64_t now_ms);

// Marks ready every membership not yet applied whose members and shards
// are all TASK_REGISTERED, and sets the ps_addresses of every membership
// with num_ps whose shards are all registered to their addresses now (a
// restarted shard's new one); true if one changed (Register calls it).
bool UpdateReady(JobInfo* job);

// Worker 0's report: appends it to membership_history (at most
// kMaxMembershipHistory), makes its epoch the applied one (dropping the
// older memberships, and an allreduce job's rendezvous keys of the worlds
// before it), marks the shards it removed (ShardRemoved)
// TASK_REMOVED, and returns the job log's line "membership N: W workers ->
// W' at step S (T ms): REASON" ("membership N: W workers -> W', P shards
// -> P' at step S (T ms): REASON" in a job with max_ps; old_ps and new_ps
// the memberships' own where the report leaves them 0). nullopt, changing
// nothing, for an epoch already applied or not made (a repeated or stale
// report).
std::optional<std::string> ApplyMembership(JobInfo* job,
                                           const MembershipApplied& applied);

// Shrink on failure: with min_workers set, worker `index` (not 0, a member
// of the newest membership) leaves it as a new epoch (reason "worker K
// removed: WHY", at the next step; ready when every other member is
// registered, as a Scale's) and its task goes
// TASK_REMOVED, if at least min_workers members remain. Returns the job
// log's line ("worker 3 removed: ...; membership 2: 3 workers"), or
// nullopt (nothing changed: the caller fails the job as before).
std::optional<std::string> RemoveFailedWorker(JobInfo* job, int index,
                                              const std::string& why);

// The job's success rule over its members: every worker of the applied
// membership (every worker of a job that is not elastic) is TASK_DONE, or
// TASK_REMOVED.
bool EveryMemberDone(const JobInfo& job);

// DATA_LOSS naming the first inconsistency of an elastic job's membership
// fields as Load reads them (`where`: the job's id): memberships empty, a
// membership whose workers are not ascending indices below
// WorkerTaskCount with worker 0, a num_ps outside 1 to PsTaskCount (0 in
// a job without max_ps) or ps_addresses neither empty nor num_ps long,
// epochs not increasing, `membership` not the last of them, more than
// kMaxMembershipHistory reports.
absl::Status ValidateMembership(const JobInfo& job, const std::string& where);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_MEMBERSHIP_H_
