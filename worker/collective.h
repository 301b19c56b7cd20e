// Collectives among a job's workers for `--mode=allreduce`: in-place sum
// allreduce and broadcast of fp32 arrays over Gloo's TCP transport
// (Debian's libgloo-dev). Gloo's allreduce here is its ring algorithm
// (Patarasuk & Yuan 2009): each rank sends and receives 2(n-1)/n of the
// array. Ranks find each other through a RendezvousStore (the coordinator's
// key-value store in a job, an in-process map in tests).
//
// Thread-safety: a Collective is used by one thread at a time, and every
// rank must issue the same calls in the same order (as with any collective
// library). RendezvousStore implementations are thread-safe.
#ifndef PSTRAIN_WORKER_COLLECTIVE_H_
#define PSTRAIN_WORKER_COLLECTIVE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace pstrain {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // Blocks until `key` is set; DEADLINE_EXCEEDED naming it after `timeout`.
  virtual absl::StatusOr<std::string> Wait(const std::string& key,
                                           absl::Duration timeout) = 0;
};

// A store in this process's memory, for ranks that are threads.
class InProcessStore : public RendezvousStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Wait(const std::string& key,
                                   absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

class Collective {
 public:
  // Connects rank `rank` of `size` (all ranks call this with the same
  // `prefix`, a namespace in `store`), listening on `hostname` (an address
  // of this host the other ranks can reach; the port is chosen by the OS).
  // Every later call fails with DEADLINE_EXCEEDED after `timeout`.
  // Errors: INVALID_ARGUMENT for a bad rank or size; UNAVAILABLE with
  // Gloo's message when the ranks cannot connect in time.
  static absl::StatusOr<std::unique_ptr<Collective>> CreateGloo(
      int rank, int size, const std::string& hostname, RendezvousStore* store,
      const std::string& prefix, absl::Duration timeout);
  ~Collective();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // data[i] = sum over ranks of data[i], `n` elements, in place.
  absl::Status AllreduceSum(float* data, size_t n);
  // Every rank's data becomes rank `root`'s.
  absl::Status Broadcast(float* data, size_t n, int root);

 private:
  Collective(int rank, int size) : rank_(rank), size_(size) {}

  const int rank_;
  const int size_;
  std::shared_ptr<gloo::Context> context_;
  // Gloo matches the operations of the ranks by tag.
  uint32_t next_tag_ = 1;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_COLLECTIVE_H_
