#include "common/nonfinite.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(NonFiniteTest, FindsTheFirstNanOrInfinityAnywhere) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FindNonFinite({}), -1);
  // Every position of blocks' edges and the tail, every kind of value.
  for (size_t n : {1u, 7u, 4095u, 4096u, 4097u, 10000u}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.1f * i) * 1e30f;
    v[n - 1] = std::numeric_limits<float>::max();  // finite, largest
    if (n > 2) v[1] = std::numeric_limits<float>::denorm_min();
    ASSERT_EQ(FindNonFinite(v), -1) << n;
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float bad : {kNaN, kInf, -kInf, -kNaN}) {
        std::vector<float> w = v;
        w[at] = bad;
        if (at + 1 < n) w[n - 1] = kNaN;  // a later one does not matter
        EXPECT_EQ(FindNonFinite(w), static_cast<int64_t>(at))
            << "n " << n << " at " << at << " value " << bad;
      }
    }
  }
}

TEST(NonFiniteTest, NamesTheValue) {
  EXPECT_EQ(NonFiniteText(std::nanf("")), "nan");
  EXPECT_EQ(NonFiniteText(std::numeric_limits<float>::infinity()), "inf");
  EXPECT_EQ(NonFiniteText(-std::numeric_limits<float>::infinity()), "-inf");
  EXPECT_EQ(NonFiniteText(1.5f), "1.5");
}

}  // namespace
}  // namespace pstrain
