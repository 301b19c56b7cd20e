// An elastic allreduce job's choice of world, told through the job's
// rendezvous store (issue 40).
//
// Worker 0 chooses the membership whose world (collective) every member
// connects: at a step boundary the coordinator's newest ready one
// (ElasticMembership::MaybeApply), after a member's death the next one,
// at a restart of every worker the newest. A joining worker (one a Scale
// added, a standby, every worker but 0 after a restart) cannot learn that
// choice from the coordinator's memberships: with two Scale requests in
// quick succession it may know the first while worker 0, at its next
// boundary, applies the second (both have the joiner), and the two sides
// would wait in different worlds until the collective's timeout. So
// worker 0 announces each world before it connects it, a joining worker
// connects the first world announced that has it, and after a member's
// death every other survivor the first world announced after its own
// (ElasticOptions::announced_world).
//
// Keys (worker 0's: coordinator/job_table.h KvKeyOwner): an announcement
// of epoch E from epoch F sets `<prefix(e)>/world` for every e in
// [max(F + 1, E - kMaxPendingMemberships - 1, 0), E]: at E "E:w0,w1,..." (the
// members, ascending ids, worker 0 first), at each e < E "E" (worker 0
// went past e to E). The coordinator drops them with their world's other
// rendezvous keys once worker 0 applied a later epoch (DropEndedWorldKeys),
// so a joiner reads from the applied epoch on.
#ifndef PSTRAIN_WORKER_WORLD_ANNOUNCEMENT_H_
#define PSTRAIN_WORKER_WORLD_ANNOUNCEMENT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/membership.h"
#include "worker/collective.h"

namespace pstrain {

// The rendezvous prefix of the world of membership `epoch` ("gloo-2-m3").
using WorldPrefixFn = std::function<std::string(int64_t epoch)>;

// The value at the key of world `next.epoch` ("3:0,1,2"), and its reading:
// INVALID_ARGUMENT naming what is wrong unless `value` is an epoch >=
// `key_epoch` with, at `key_epoch` itself, at most kMaxMembershipWorkers
// ascending ids from 0 (a pointer "E": workers empty, epoch E).
std::string EncodeWorld(const WorkerMembership& next);
absl::StatusOr<WorkerMembership> DecodeWorld(const std::string& value,
                                             int64_t key_epoch);

// Worker 0, before it connects the world of `next` (its current world's
// epoch `from_epoch`; -1 at its start). One store Set per key, at most
// kMaxPendingMemberships + 2. Thread-compatible. Errors: the store's.
absl::Status AnnounceWorld(RendezvousStore& store, const WorldPrefixFn& prefix,
                           int64_t from_epoch, const WorkerMembership& next);

// What AwaitAnnouncedWorld waits for.
struct AwaitWorldOptions {
  // -1: the first world announced at or after the start epoch, whoever is
  // in it (a survivor of a member's death: a world without it removed it).
  // Else the first that has this worker (a joiner: worlds without it are
  // passed over).
  int worker_id = -1;
  // Each wait on the store, after which the start epoch is read again.
  absl::Duration poll = absl::Milliseconds(500);
  // DEADLINE_EXCEEDED after this; the infinite future: the wait is bounded
  // by the job, whose heartbeats end the process when it ends or removes
  // this worker.
  absl::Time deadline = absl::InfiniteFuture();
};

// The first world worker 0 announces from epoch `start_epoch()` on (the
// applied epoch: the keys of ended worlds are dropped; it is read again
// after each poll) that `options` asks for: its workers and epoch.
// Errors: INTERNAL naming the key for a value that does not decode;
// DEADLINE_EXCEEDED past the deadline; the store's other errors.
absl::StatusOr<WorkerMembership> AwaitAnnouncedWorld(
    RendezvousStore& store, const WorldPrefixFn& prefix,
    const std::function<int64_t()>& start_epoch,
    const AwaitWorldOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_WORLD_ANNOUNCEMENT_H_
