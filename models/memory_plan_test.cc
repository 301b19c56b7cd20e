#include "models/memory_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

bool Overlap(const Lifetime& a, const Lifetime& b) {
  return a.first <= b.last && b.first <= a.last;
}

TEST(PlanSlots, DisjointLifetimesShareAndOverlappingOnesDoNot) {
  const std::vector<Lifetime> l = {{100, 0, 2}, {50, 3, 5}, {80, 2, 4},
                                   {10, 6, 6},  {0, 0, 9},  {7, 5, 4}};
  const SlotPlan plan = PlanSlots(l);
  ASSERT_EQ(plan.slot_of.size(), l.size());
  EXPECT_EQ(plan.slot_of[4], -1) << "empty tensor";
  EXPECT_EQ(plan.slot_of[5], -1) << "never live";
  EXPECT_EQ(plan.slot_of[0], plan.slot_of[1]);  // 0-2 then 3-5.
  EXPECT_NE(plan.slot_of[0], plan.slot_of[2]);  // Both live at 2.
  // 100 + 80: the 50 goes with the 100, the 10 with the first free.
  EXPECT_EQ(plan.TotalElements(), 180);
}

TEST(PlanSlots, EverySlotHoldsItsTensorsAndNoTwoLiveOnesShare) {
  std::vector<Lifetime> l;
  for (int i = 0; i < 200; ++i) {
    const int first = (i * 37) % 50;
    l.push_back({1 + (i * 7919) % 1000, first, first + (i * 13) % 20});
  }
  const SlotPlan plan = PlanSlots(l);
  int64_t sum = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    sum += l[i].elements;
    ASSERT_GE(plan.slot_of[i], 0);
    EXPECT_GE(plan.slot_elements[plan.slot_of[i]], l[i].elements);
    for (size_t j = 0; j < i; ++j) {
      if (plan.slot_of[i] == plan.slot_of[j]) {
        EXPECT_FALSE(Overlap(l[i], l[j])) << i << " and " << j;
      }
    }
  }
  EXPECT_LT(plan.TotalElements(), sum);
}

}  // namespace
}  // namespace pstrain
