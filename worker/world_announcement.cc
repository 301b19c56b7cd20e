#include "worker/world_announcement.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "coordinator/job_membership.h"

namespace pstrain {
namespace {

std::string KeyOf(const WorldPrefixFn& prefix, int64_t epoch) {
  return absl::StrCat(prefix(epoch), "/world");
}

}  // namespace

std::string EncodeWorld(const WorkerMembership& next) {
  return absl::StrCat(next.epoch, ":", absl::StrJoin(next.workers, ","));
}

absl::StatusOr<WorkerMembership> DecodeWorld(const std::string& value,
                                             int64_t key_epoch) {
  WorkerMembership world;
  const size_t colon = value.find(':');
  const std::string epoch = value.substr(0, colon);
  if (!absl::SimpleAtoi(epoch, &world.epoch) || world.epoch < key_epoch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", value.substr(0, 64), "\" is not an epoch >= ", key_epoch,
        " (\"E\" or \"E:w0,w1,...\")"));
  }
  if (colon == std::string::npos) return world;  // a pointer to a later one
  if (world.epoch != key_epoch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the members of epoch ", world.epoch, " under epoch ", key_epoch));
  }
  const absl::string_view ids = absl::string_view(value).substr(colon + 1);
  if (ids.size() > 8 * static_cast<size_t>(kMaxMembershipWorkers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a member list of ", ids.size(), " bytes (at most ",
                     kMaxMembershipWorkers, " ids)"));
  }
  for (absl::string_view id : absl::StrSplit(ids, ',')) {
    int w = -1;
    if (!absl::SimpleAtoi(id, &w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("member \"", id.substr(0, 16), "\" is not a number"));
    }
    world.workers.push_back(w);
  }
  RETURN_IF_ERROR(CheckMembership(world, kMaxMembershipWorkers));
  return world;
}

absl::Status AnnounceWorld(RendezvousStore& store, const WorldPrefixFn& prefix,
                           int64_t from_epoch, const WorkerMembership& next) {
  const int64_t first = std::max<int64_t>(
      {from_epoch + 1, next.epoch - kMaxPendingMemberships - 1, 0});
  const std::string pointer = absl::StrCat(next.epoch);
  for (int64_t e = first; e < next.epoch; ++e) {
    RETURN_IF_ERROR(store.Set(KeyOf(prefix, e), pointer));
  }
  return store.Set(KeyOf(prefix, next.epoch), EncodeWorld(next));
}

absl::StatusOr<WorkerMembership> AwaitAnnouncedWorld(
    RendezvousStore& store, const WorldPrefixFn& prefix,
    const std::function<int64_t()>& start_epoch,
    const AwaitWorldOptions& options) {
  int64_t epoch = 0;
  while (true) {
    // Keys of epochs before the applied one may be dropped already.
    epoch = std::max(epoch, start_epoch());
    const std::string key = KeyOf(prefix, epoch);
    const absl::Duration left = options.deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no world of membership ", epoch,
                       " or later was announced (", key, ") in time"));
    }
    absl::StatusOr<std::string> value =
        store.Wait(key, std::min(options.poll, left));
    if (absl::IsDeadlineExceeded(value.status())) continue;
    if (!value.ok()) return value.status();
    absl::StatusOr<WorkerMembership> world = DecodeWorld(*value, epoch);
    if (!world.ok()) {
      return absl::InternalError(absl::StrCat(
          "world announcement \"", key, "\": ", world.status().message()));
    }
    if (world->workers.empty()) {
      epoch = world->epoch;  // worker 0 went past `epoch`
    } else if (options.worker_id < 0 || world->RankOf(options.worker_id) >= 0) {
      return world;
    } else {
      epoch = world->epoch + 1;  // a world without this worker
    }
  }
}

}  // namespace pstrain
