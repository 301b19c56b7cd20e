// Static memory planning: tensors whose lifetimes do not overlap share one
// block of memory ("slot"), as the planners of TensorFlow and MXNet do for a
// fixed graph. Model (model.h) describes each activation, gradient and
// accumulation scratch of a training step as a Lifetime over step times
// (forward of node n at n, the loss at N, backward of node n at 2N - n) and
// places the tensors in the slots this returns; the slots are allocated once
// per input shape, so a steady-state step allocates nothing.
//
// Thread-safety: plain values and a pure function.
#ifndef PSTRAIN_MODELS_MEMORY_PLAN_H_
#define PSTRAIN_MODELS_MEMORY_PLAN_H_

#include <cstdint>
#include <vector>

namespace pstrain {

// A tensor of `elements` live over step times [first, last], both included:
// a tensor written at time t cannot share with one read at t.
struct Lifetime {
  int64_t elements = 0;
  int first = 0;
  int last = -1;  // last < first: never live (gets no slot).
};

struct SlotPlan {
  std::vector<int> slot_of;            // Per lifetime; -1 for none.
  std::vector<int64_t> slot_elements;  // Size of each slot.
  int64_t TotalElements() const;
};

// Greedy by size, largest first: each lifetime goes to the first slot whose
// lifetimes it does not overlap (every slot is at least as large, since
// larger ones were placed first), else to a new slot of its size.
// Deterministic; O(lifetimes^2) at worst (a ResNet-101 step has ~1,000).
SlotPlan PlanSlots(const std::vector<Lifetime>& lifetimes);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MEMORY_PLAN_H_
