// Internal to //server:parameter_shard: the state ParameterShard's own
// files (parameter_shard*.cc) share and its public header only names: the
// ends of one step (StepEnds, under step_mu_), a thread's update scratch
// and a step decided by a norm. A chunk's state is shard_chunk_state.h's
// (the header's lock annotations read its mutex).
#ifndef PSTRAIN_SERVER_PARAMETER_SHARD_STATE_H_
#define PSTRAIN_SERVER_PARAMETER_SHARD_STATE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/nonfinite.h"
#include "common/partition.h"
#include "server/parameter_shard.h"
#include "server/row_sparse.h"
#include "server/shared_floats.h"

namespace pstrain {

// The ends of one step (EndStep): who has ended it, and the first
// non-finite report (lowest worker id); who said ahead of its pushes that
// every value of its step is finite (NoteFiniteVerdict()).
struct ParameterShard::StepEnds {
  std::vector<bool> ended;
  int num_ended = 0;
  std::unique_ptr<SkippedStepInfo> skip;
  std::vector<bool> said_finite;
};

// Where an update is written before it replaces a chunk's state (async
// mode; sync mode uses the chunk's undo buffers): one per thread, since
// chunks are updated concurrently under their own locks. After a swap it
// holds the chunk's old storage, reused for the next update.
struct ParameterShard::UpdateScratch {
  SharedFloats w;  // swapped with a chunk's weights
  std::vector<float> m, v;
};

// The last few steps decided by a norm (oldest first): a pull of one of
// them still gets its partial, a late sum is checked against it.
struct ParameterShard::NormDecision {
  int64_t step = -1;
  double partial = 0;
  double sum_sq = 0;
};

inline const std::vector<bool>* ParameterShard::MaskOf(
    StepPolicy::Members members, const StepEnds& ends) {
  return members == StepPolicy::Members::kAdmitted ? &ends.ended : nullptr;
}

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PARAMETER_SHARD_STATE_H_
