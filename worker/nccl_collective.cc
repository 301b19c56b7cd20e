// Collective::CreateNccl for builds with --config=cuda (worker/collective.h).
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0, NCCL 2.14+):
// every NCCL call returns at once, and this file polls
// ncclCommGetAsyncError and the stream until the work is done, the
// communicator reports an error, or the deadline passes. On an error or a
// deadline the communicator is aborted (ncclCommAbort), which is NCCL's way
// to stop kernels that wait for a dead peer; the Collective is unusable
// afterwards and every later call fails at once.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "worker/collective.h"

namespace pstrain {
namespace {

constexpr absl::Duration kPoll = absl::Microseconds(50);

std::string CudaError(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error),
                      ")");
}

class NcclCollective : public Collective {
 public:
  NcclCollective(int rank, int size, int gpu, absl::Duration timeout)
      : Collective(rank, size), gpu_(gpu), timeout_(timeout) {}

  ~NcclCollective() override {
    if (comm_ != nullptr) {
      // Finalize flushes this rank's outstanding work; when it cannot finish
      // in time (a peer is gone) Finish aborts the communicator instead.
      if (Finish(ncclCommFinalize(comm_), "finalize", absl::Now() + timeout_)
              .ok()) {
        ncclCommDestroy(comm_);
      }
    }
    if (buffer_ != nullptr) cudaFree(buffer_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Connect(RendezvousStore* store, const std::string& prefix) {
    const absl::Time deadline = absl::Now() + timeout_;
    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || gpu_ < 0 || gpu_ >= devices) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL rank ", rank(), ": GPU ", gpu_, " is not visible (",
          error == cudaSuccess ? absl::StrCat(devices, " devices")
                               : CudaError(error),
          ")"));
    }
    if ((error = cudaSetDevice(gpu_)) != cudaSuccess ||
        (error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) !=
            cudaSuccess) {
      return absl::UnavailableError(absl::StrCat(
          "NCCL rank ", rank(), " on GPU ", gpu_, ": ", CudaError(error)));
    }
    const std::string key = absl::StrCat(prefix, "/nccl_id");
    ncclUniqueId id;
    if (rank() == 0) {
      ncclResult_t result = ncclGetUniqueId(&id);
      if (result != ncclSuccess) {
        return absl::UnavailableError(absl::StrCat(
            "NCCL rank 0: ncclGetUniqueId: ", ncclGetErrorString(result)));
      }
      absl::Status set =
          store->Set(key, std::string(id.internal, NCCL_UNIQUE_ID_BYTES));
      if (!set.ok()) return set;
    } else {
      absl::StatusOr<std::string> value = store->Wait(key, timeout_);
      if (!value.ok()) return value.status();
      if (value->size() != NCCL_UNIQUE_ID_BYTES) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rendezvous key \"", key, "\" holds ", value->size(),
            " bytes; expected an NCCL unique id of ", NCCL_UNIQUE_ID_BYTES));
      }
      std::memcpy(id.internal, value->data(), NCCL_UNIQUE_ID_BYTES);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return Finish(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config),
                  absl::StrCat("connecting ", size(), " ranks"), deadline);
  }

  absl::Status AllreduceSum(float* data, size_t n) override {
    return Run(data, n * sizeof(float),
               absl::StrCat("allreduce of ", n, " floats"), [&] {
                 return ncclAllReduce(buffer_, buffer_, n, ncclFloat32, ncclSum,
                                      comm_, stream_);
               });
  }

  absl::Status AllreduceSum16(uint16_t* data, size_t n, DType dtype) override {
    RETURN_IF_ERROR(Check16(dtype));
    return Run(data, n * sizeof(uint16_t),
               absl::StrCat("allreduce of ", n, " ", WireDtypeSpelling(dtype),
                            " values"),
               [&] {
                 return ncclAllReduce(
                     buffer_, buffer_, n,
                     dtype == DTYPE_BFLOAT16 ? ncclBfloat16 : ncclFloat16,
                     ncclSum, comm_, stream_);
               });
  }

  absl::Status AllreduceMax(float* data, size_t n) override {
    return Run(data, n * sizeof(float),
               absl::StrCat("max allreduce of ", n, " floats"), [&] {
                 return ncclAllReduce(buffer_, buffer_, n, ncclFloat32, ncclMax,
                                      comm_, stream_);
               });
  }

  absl::Status Allgather(const void* in, size_t bytes, void* out) override {
    if (size() == 1) {
      if (bytes > 0) std::memcpy(out, in, bytes);
      return absl::OkStatus();
    }
    // In place on the GPU: this rank's bytes at its slot of the output.
    const size_t slot = static_cast<size_t>(rank()) * bytes;
    return Run(in, slot, bytes, out, bytes * size(),
               absl::StrCat("allgather of ", bytes, " bytes"), [&] {
                 return ncclAllGather(static_cast<char*>(buffer_) + slot,
                                      buffer_, bytes, ncclUint8, comm_,
                                      stream_);
               });
  }

  absl::Status Broadcast(float* data, size_t n, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " of ", size(), " ranks"));
    }
    return Run(data, n * sizeof(float),
               absl::StrCat("broadcast of ", n, " floats from rank ", root),
               [&] {
                 return ncclBroadcast(buffer_, buffer_, n, ncclFloat32, root,
                                      comm_, stream_);
               });
  }

 private:
  absl::Status CudaFailed(const std::string& what, cudaError_t error) const {
    return absl::InternalError(
        absl::StrCat(what, " on NCCL rank ", rank(), ": ", CudaError(error)));
  }

  // Copies `bytes` at `data` to the GPU, runs `op` on it there, copies it
  // back.
  template <typename Op>
  absl::Status Run(void* data, size_t bytes, const std::string& what, Op op) {
    return Run(data, 0, bytes, data, bytes, what, op);
  }
  // The same with `in_bytes` at `in` copied to offset `in_offset` of the
  // GPU buffer and its first `out_bytes` copied back to `out`.
  template <typename Op>
  absl::Status Run(const void* in, size_t in_offset, size_t in_bytes, void* out,
                   size_t out_bytes, const std::string& what, Op op) {
    const size_t bytes = std::max(in_offset + in_bytes, out_bytes);
    if (comm_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " on NCCL rank ", rank(),
                       ": the communicator was aborted after an earlier "
                       "error"));
    }
    if (size() == 1 || bytes == 0) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + timeout_;
    cudaError_t error = cudaSetDevice(gpu_);
    if (error == cudaSuccess && bytes > capacity_) {
      if (buffer_ != nullptr) cudaFree(buffer_);
      buffer_ = nullptr;
      capacity_ = 0;
      error = cudaMalloc(&buffer_, bytes);
      if (error == cudaSuccess) capacity_ = bytes;
    }
    if (error == cudaSuccess) {
      error = cudaMemcpyAsync(static_cast<char*>(buffer_) + in_offset, in,
                              in_bytes, cudaMemcpyHostToDevice, stream_);
    }
    if (error != cudaSuccess) {
      return CudaFailed(what, error);
    }
    absl::Status status = Finish(op(), what, deadline);
    if (!status.ok()) return status;
    error = cudaMemcpyAsync(out, buffer_, out_bytes, cudaMemcpyDeviceToHost,
                            stream_);
    if (error != cudaSuccess) {
      return CudaFailed(what, error);
    }
    // The stream holds the copy in, the collective and the copy out.
    while (true) {
      error = cudaStreamQuery(stream_);
      if (error == cudaSuccess) return absl::OkStatus();
      if (error != cudaErrorNotReady) {
        return CudaFailed(what, error);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        return Abort(what, absl::StrCat("NCCL: ", ncclGetErrorString(async),
                                        ": ", ncclGetLastError(comm_)));
      }
      if (absl::Now() > deadline) {
        return Abort(what, "not done in time (a rank is gone or stuck)",
                     /*deadline_exceeded=*/true);
      }
      absl::SleepFor(kPoll);
    }
  }

  // Waits until a non-blocking NCCL call that returned `result` has been
  // taken up by the communicator (not until its GPU work is done).
  absl::Status Finish(ncclResult_t result, const std::string& what,
                      absl::Time deadline) {
    while (result == ncclInProgress && comm_ != nullptr) {
      if (absl::Now() > deadline) {
        return Abort(what, "not done in time (a rank is gone or stuck)",
                     /*deadline_exceeded=*/true);
      }
      absl::SleepFor(kPoll);
      ncclCommGetAsyncError(comm_, &result);
    }
    if (result == ncclSuccess) return absl::OkStatus();
    return Abort(what,
                 absl::StrCat("NCCL: ", ncclGetErrorString(result), ": ",
                              comm_ != nullptr ? ncclGetLastError(comm_) : ""));
  }

  // Aborts the communicator (NCCL stops its kernels) and returns the error.
  absl::Status Abort(const std::string& what, const std::string& why,
                     bool deadline_exceeded = false) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    const std::string message =
        absl::StrCat(what, " on NCCL rank ", rank(), " of ", size(), " (GPU ",
                     gpu_, "): ", why);
    return deadline_exceeded ? absl::DeadlineExceededError(message)
                             : absl::UnavailableError(message);
  }

  const int gpu_;
  const absl::Duration timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buffer_ = nullptr;  // on the GPU, capacity_ bytes
  size_t capacity_ = 0;
};

}  // namespace

bool Collective::HasNccl() { return true; }

absl::StatusOr<std::unique_ptr<Collective>> Collective::CreateNccl(
    int rank, int size, int gpu, RendezvousStore* store,
    const std::string& prefix, absl::Duration timeout) {
  absl::Status valid = CheckRank(rank, size);
  if (!valid.ok()) return valid;
  auto collective = std::make_unique<NcclCollective>(rank, size, gpu, timeout);
  absl::Status connected = collective->Connect(store, prefix);
  if (!connected.ok()) return connected;
  return std::unique_ptr<Collective>(std::move(collective));
}

}  // namespace pstrain
