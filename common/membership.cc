#include "common/membership.h"

#include "absl/strings/str_cat.h"

namespace pstrain {

int WorkerMembership::RankOf(int worker) const {
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i] == worker) return static_cast<int>(i);
  }
  return -1;
}

absl::Status CheckMembership(const WorkerMembership& membership, int capacity) {
  const std::vector<int>& w = membership.workers;
  if (w.empty() || w.front() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "membership of ", w.size(),
        " workers: expected worker 0 first (it leads the job's restores and "
        "checkpoints)"));
  }
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] >= capacity || (i > 0 && w[i] <= w[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("membership worker ", w[i], " at place ", i,
                       ": expected ascending ids below the job's ", capacity));
    }
  }
  if (membership.data_epoch < 0 || membership.data_offset < 0 ||
      membership.data_steps < 0 || membership.from_step < 0 ||
      membership.epoch < 0) {
    return absl::InvalidArgumentError(
        "membership: a negative epoch, step, data epoch, offset or steps");
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerMembership> MembershipFromProto(
    const ShardMembership& proto, int capacity) {
  if (proto.workers_size() > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership of ", proto.workers_size(),
                     " workers: the job has at most ", capacity));
  }
  WorkerMembership m;
  m.workers.assign(proto.workers().begin(), proto.workers().end());
  m.epoch = proto.epoch();
  m.from_step = proto.from_step();
  m.data_epoch = proto.data_epoch();
  m.data_offset = proto.data_offset();
  m.data_steps = proto.data_steps();
  if (absl::Status s = CheckMembership(m, capacity); !s.ok()) return s;
  return m;
}

void MembershipToProto(const WorkerMembership& membership,
                       ShardMembership* proto) {
  proto->Clear();
  for (int w : membership.workers) proto->add_workers(w);
  proto->set_epoch(membership.epoch);
  proto->set_from_step(membership.from_step);
  proto->set_data_epoch(membership.data_epoch);
  proto->set_data_offset(membership.data_offset);
  proto->set_data_steps(membership.data_steps);
}

}  // namespace pstrain
