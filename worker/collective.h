// Collectives among a job's workers for `--mode=allreduce`: in-place sum
// allreduce and broadcast of fp32 arrays in host memory, over
//  - Gloo's TCP transport (Debian's libgloo-dev; CreateGloo), or
//  - NCCL between GPUs (the CUDA toolkit's libnccl; CreateNccl, in builds
//    with --config=cuda): each call stages the array through a buffer on
//    the rank's GPU, so NCCL's transports (NVLink, PCIe, InfiniBand, TCP
//    sockets) carry it.
// Both run a ring allreduce (Patarasuk & Yuan 2009; Gloo's RING algorithm,
// NCCL's ring or tree as NCCL picks): each rank sends and receives
// 2(n-1)/n of the array. Ranks find each other through a RendezvousStore
// (the coordinator's key-value store in a job, an in-process map in tests).
//
// Thread-safety: a Collective is used by one thread at a time, and every
// rank must issue the same calls in the same order (as with any collective
// library). RendezvousStore implementations are thread-safe.
#ifndef PSTRAIN_WORKER_COLLECTIVE_H_
#define PSTRAIN_WORKER_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"

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
  virtual ~Collective() = default;
  // Connects rank `rank` of `size` (all ranks call this with the same
  // `prefix`, a namespace in `store`), listening on `hostname` (an address
  // of this host the other ranks can reach; the port is chosen by the OS).
  // Every later call fails with DEADLINE_EXCEEDED after `timeout`.
  // Errors: INVALID_ARGUMENT for a bad rank or size; UNAVAILABLE with
  // Gloo's message when the ranks cannot connect in time.
  static absl::StatusOr<std::unique_ptr<Collective>> CreateGloo(
      int rank, int size, const std::string& hostname, RendezvousStore* store,
      const std::string& prefix, absl::Duration timeout);

  // Whether this build has the NCCL collective (--config=cuda).
  static bool HasNccl();
  // Connects rank `rank` of `size` through NCCL on CUDA device `gpu` (one
  // rank per GPU: NCCL refuses two ranks of a communicator on one device).
  // Rank 0 creates the communicator's unique id and publishes it in
  // `store` under `prefix`/nccl_id; the others wait for it. Every call
  // (this one included) gives up after `timeout`: the communicator is
  // aborted (ncclCommAbort), so a dead peer is an error, not a hang.
  // Errors: INVALID_ARGUMENT for a bad rank or size; UNIMPLEMENTED in a
  // build without CUDA; FAILED_PRECONDITION when `gpu` is not a visible
  // device; UNAVAILABLE with NCCL's or CUDA's message when the ranks
  // cannot connect; DEADLINE_EXCEEDED after `timeout`.
  static absl::StatusOr<std::unique_ptr<Collective>> CreateNccl(
      int rank, int size, int gpu, RendezvousStore* store,
      const std::string& prefix, absl::Duration timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // data[i] = sum over ranks of data[i], `n` elements, in place.
  virtual absl::Status AllreduceSum(float* data, size_t n) = 0;
  // The same over `n` 16-bit values in `dtype` (DTYPE_BFLOAT16 or
  // DTYPE_FLOAT16 bit patterns, common/wire_dtype.h): every addition widens
  // both operands to fp32, adds, and rounds the sum back to the type
  // (nearest, ties to even; float16 without scaling: the caller keeps the
  // values in range), as NCCL's bf16/half sums and PyTorch's
  // bf16_compress_hook over them. Additions follow the ring, so with three
  // or more ranks the result is one of the roundings of the sum, the same
  // on every rank. INVALID_ARGUMENT for another dtype.
  virtual absl::Status AllreduceSum16(uint16_t* data, size_t n,
                                      DType dtype) = 0;
  // Every rank's `bytes` bytes at `in` in rank order: out[r * bytes, (r +
  // 1) * bytes) become rank r's (this rank's own included), `out` holding
  // size() * bytes. Every rank passes the same `bytes` (a sparse allgather
  // of top-k pairs, worker/topk_allgather.h, pads each rank's message to
  // the longest, whose length an allgather of the lengths gave).
  // A ring allgather (Gloo's; NCCL's AllGather): each rank receives
  // (size() - 1) * bytes.
  virtual absl::Status Allgather(const void* in, size_t bytes, void* out) = 0;
  // data[i] = max over ranks of data[i] (fp32), in place.
  virtual absl::Status AllreduceMax(float* data, size_t n) = 0;
  // Every rank's data becomes rank `root`'s.
  virtual absl::Status Broadcast(float* data, size_t n, int root) = 0;

 protected:
  Collective(int rank, int size) : rank_(rank), size_(size) {}

  // INVALID_ARGUMENT unless 0 <= rank < size.
  static absl::Status CheckRank(int rank, int size);
  // INVALID_ARGUMENT unless `dtype` is a 16-bit one.
  static absl::Status Check16(DType dtype);

 private:
  const int rank_;
  const int size_;
};

// Every rank's `n` values at `data` become rank `root`'s. The bit patterns
// travel in a float broadcast, which copies bytes and adds nothing, so any
// int64 arrives exact. Errors: the collective's.
absl::Status BroadcastInt64(Collective& collective, int64_t* data, size_t n,
                            int root);

// An elastic allreduce job's way to (re)connect its workers (issue 40;
// worker_main.cc): rank `rank` of `size` in the world of coordinator
// membership `epoch` (a namespace of the job's rendezvous store of its
// own, so that each world's ranks meet only each other), failing after
// `timeout` (which every later call of the collective keeps). Errors as
// CreateGloo's and CreateNccl's.
using CollectiveFactory =
    std::function<absl::StatusOr<std::unique_ptr<Collective>>(
        int rank, int size, int64_t epoch, absl::Duration timeout)>;

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_COLLECTIVE_H_
