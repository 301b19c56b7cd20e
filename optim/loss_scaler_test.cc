#include "optim/loss_scaler.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// GradScaler's defaults: 2^16, halved on an overflow, doubled after 2000
// good steps in a row.
TEST(LossScalerTest, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  s.Update(/*skipped=*/true);
  EXPECT_EQ(s.scale(), 32768.0f);
  s.Update(true);
  EXPECT_EQ(s.scale(), 16384.0f);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 16384.0f);
  EXPECT_EQ(s.state().growth_tracker, 1999);
  s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // An overflow restarts the count of good steps.
  for (int i = 0; i < 1500; ++i) s.Update(false);
  s.Update(true);
  EXPECT_EQ(s.scale(), 16384.0f);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 16384.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0f);
}

TEST(LossScalerTest, NeverGrowsToInfinityAndRestoresItsState) {
  LossScaler::Options options;
  options.init_scale = std::numeric_limits<float>::max();
  options.growth_interval = 1;
  LossScaler s(options);
  s.Update(false);
  EXPECT_EQ(s.scale(), std::numeric_limits<float>::max());
  EXPECT_EQ(s.state().growth_tracker, 0);

  LossScaler a;
  for (int i = 0; i < 700; ++i) a.Update(i == 3);
  LossScaler b;
  b.Restore(a.state());
  for (int i = 0; i < 1400; ++i) {
    a.Update(false);
    b.Update(false);
  }
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(a.scale(), 65536.0f);  // halved at step 3, doubled 2000 later
}

}  // namespace
}  // namespace pstrain
