#include "models/memory_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace pstrain {

int64_t SlotPlan::TotalElements() const {
  return std::accumulate(slot_elements.begin(), slot_elements.end(),
                         int64_t{0});
}

SlotPlan PlanSlots(const std::vector<Lifetime>& lifetimes) {
  SlotPlan plan;
  plan.slot_of.assign(lifetimes.size(), -1);
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(lifetimes.size()); ++i) {
    const Lifetime& l = lifetimes[i];
    if (l.last >= l.first && l.elements > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return lifetimes[a].elements > lifetimes[b].elements;
  });
  // The intervals placed in each slot.
  std::vector<std::vector<std::pair<int, int>>> busy;
  for (int i : order) {
    const Lifetime& l = lifetimes[i];
    auto overlaps = [&](const std::pair<int, int>& other) {
      return l.first <= other.second && other.first <= l.last;
    };
    int slot = 0;
    for (; slot < static_cast<int>(busy.size()); ++slot) {
      if (std::none_of(busy[slot].begin(), busy[slot].end(), overlaps)) break;
    }
    if (slot == static_cast<int>(busy.size())) {
      busy.emplace_back();
      plan.slot_elements.push_back(l.elements);
    }
    busy[slot].emplace_back(l.first, l.last);
    plan.slot_of[i] = slot;
  }
  return plan;
}

}  // namespace pstrain
