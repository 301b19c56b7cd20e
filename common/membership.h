// An elastic job's membership as the shards hold it (issue 40;
// docs/ARCHITECTURE.md "Elastic membership"): which workers a generation's
// steps wait for and average, from which step, and where the data epoch
// stands there, with its conversions to and from proto/ps.proto's
// ShardMembership.
//
// Thread-safety: plain values and pure functions.
#ifndef PSTRAIN_COMMON_MEMBERSHIP_H_
#define PSTRAIN_COMMON_MEMBERSHIP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ps.pb.h"

namespace pstrain {

// The most workers a job may have (coordinator/job_spec.h, max_workers).
inline constexpr int kMaxMembershipWorkers = 4096;

// Worker ids ascending, each below the job's worker capacity (max_workers),
// worker 0 always. Set at a shard's first Initialize (workers 0 to
// num_workers - 1), then only by a reopen or restore (a generation change),
// so that every step of a generation has one membership. The data fields
// are the workers' (worker/data_position.h: the data epoch at from_step,
// the samples of its permutation trained before from_step, and the
// epoch's steps before it), so that a joining worker re-splits the epoch
// where the others are; the shard keeps them and hands them back.
struct WorkerMembership {
  std::vector<int> workers;
  int64_t epoch = 0;  // the coordinator's membership epoch
  int64_t from_step = 0;
  int data_epoch = 0;
  int64_t data_offset = 0;
  int64_t data_steps = 0;

  int size() const { return static_cast<int>(workers.size()); }
  // The place of `worker` among the members (its rank), or -1.
  int RankOf(int worker) const;
};

// INVALID_ARGUMENT naming the fault unless `membership` has worker 0
// first, ascending ids below `capacity`, and no negative data field.
absl::Status CheckMembership(const WorkerMembership& membership, int capacity);

// The proto's fields, checked as above (more than `capacity` ids is refused
// before they are copied).
absl::StatusOr<WorkerMembership> MembershipFromProto(
    const ShardMembership& proto, int capacity);
void MembershipToProto(const WorkerMembership& membership,
                       ShardMembership* proto);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MEMBERSHIP_H_
