#include "common/nonfinite.h"

#include <cmath>
#include <cstring>
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

// The scan of a sum and its division in one pass: every value multiplied
// (the non-finite ones too, and past the first), the first non-finite
// found as FindNonFinite finds it.
TEST(NonFiniteTest, ScaleFindingNonFiniteIsTheScanAndTheDivision) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (size_t n : {1u, 4096u, 10000u}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.1f * i) * 1e30f;
    v[n - 1] = std::numeric_limits<float>::max();
    for (const float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
      for (size_t at : {n, size_t{0}, n / 2, n - 1}) {
        std::vector<float> w = v;
        if (at < n) w[at] = (at % 2) ? kNaN : -kInf;
        if (at + 1 < n) w[n - 1] = kInf;
        std::vector<float> expected = w;
        for (float& x : expected) x *= scale;
        const int64_t found = ScaleFindingNonFinite(absl::MakeSpan(w), scale);
        EXPECT_EQ(found, FindNonFinite(expected)) << n << " " << at;
        EXPECT_EQ(found, at < n ? static_cast<int64_t>(at) : -1);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(std::memcmp(&w[i], &expected[i], sizeof(float)) == 0)
              << n << " " << at << " " << i;
        }
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
