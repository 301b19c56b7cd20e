// Collective::CreateNccl in builds without CUDA (worker/collective.h): the
// NCCL collective is in worker/nccl_collective.cc, built with --config=cuda.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/collective.h"

namespace pstrain {

bool Collective::HasNccl() { return false; }

absl::StatusOr<std::unique_ptr<Collective>> Collective::CreateNccl(
    int rank, int size, int gpu, RendezvousStore* store,
    const std::string& prefix, absl::Duration timeout) {
  return absl::UnimplementedError(
      absl::StrCat("NCCL rank ", rank,
                   ": this build has no NCCL collective "
                   "(build with bazel build --config=cuda on a machine with "
                   "the CUDA toolkit)"));
}

}  // namespace pstrain
