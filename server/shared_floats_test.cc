#include "server/shared_floats.h"

#include <memory>
#include <vector>

#include "common/wire_dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;

// A reply holding the storage keeps what it holds, whatever the owner
// writes next; the owner's writes go to storage of its own.
TEST(SharedFloatsTest, AHeldStorageKeepsItsValuesThroughWrites) {
  SharedFloats weights(std::vector<float>{1, 2, 3});
  std::shared_ptr<const std::vector<float>> reply = weights.Share();
  EXPECT_TRUE(weights.shared());
  const float* held = reply->data();

  // A write that keeps the values: copied first.
  float* w = weights.mutable_data();
  EXPECT_NE(w, held);
  w[0] = 10;
  EXPECT_THAT(*reply, ElementsAre(1, 2, 3));
  EXPECT_THAT(weights.ToVector(), ElementsAre(10, 2, 3));
  EXPECT_FALSE(weights.shared());

  // Unshared: written in place.
  EXPECT_EQ(weights.mutable_data(), w);
  EXPECT_EQ(weights.overwrite_data(3), w);
}

TEST(SharedFloatsTest, AnOverwriteOfHeldStorageGoesElsewhereUncopied) {
  SharedFloats weights(std::vector<float>{1, 2, 3});
  SharedFloats spare(std::vector<float>{7, 8, 9});
  // The update's pattern: write beside, swap, and the reply's storage
  // comes back as the buffer the next update writes into.
  std::shared_ptr<const std::vector<float>> reply = weights.Share();
  float* next = spare.overwrite_data(3);
  next[0] = next[1] = next[2] = 5;
  weights.swap(spare);
  EXPECT_THAT(weights.ToVector(), ElementsAre(5, 5, 5));
  float* after = spare.overwrite_data(4);  // the reply still holds it
  EXPECT_NE(after, reply->data());
  after[0] = after[1] = after[2] = after[3] = -1;
  EXPECT_EQ(spare.size(), 4u);
  EXPECT_THAT(*reply, ElementsAre(1, 2, 3));

  // Released: the next overwrite reuses the storage in place.
  reply.reset();
  EXPECT_FALSE(spare.shared());
  EXPECT_EQ(spare.overwrite_data(4), after);
}

TEST(SharedFloatsTest, EmptyAndAssigned) {
  SharedFloats empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.mutable_data(), nullptr);
  EXPECT_EQ(empty.Share(), nullptr);
  float* w = empty.overwrite_data(2);
  w[0] = w[1] = 3;
  EXPECT_THAT(empty.ToVector(), ElementsAre(3, 3));
  empty = std::vector<float>{4};
  EXPECT_THAT(empty.span(), ElementsAre(4));
}

// The 16-bit form is converted once per write and shared by every reply
// until the next write access, which drops it; it moves with its values
// in swap() and holds through the owner's later writes.
TEST(SharedFloatsTest, HalvesAreConvertedOncePerWrite) {
  const std::vector<float> values = {1.0f, -2.5f, 3.0e-3f};
  SharedFloats weights(values);
  EXPECT_EQ(SharedFloats().ShareHalves(DTYPE_BFLOAT16), nullptr);
  std::shared_ptr<const EncodedHalves> first =
      weights.ShareHalves(DTYPE_BFLOAT16);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->bits(), EncodeHalvesOf(values, DTYPE_BFLOAT16).bits());
  EXPECT_EQ(weights.ShareHalves(DTYPE_BFLOAT16), first);  // shared

  // The other 16-bit dtype: converted again, with fp16's exponent.
  std::shared_ptr<const EncodedHalves> half =
      weights.ShareHalves(DTYPE_FLOAT16);
  EXPECT_EQ(half->dtype, DTYPE_FLOAT16);
  EXPECT_EQ(half->scale_exponent, ScaleExponent(values));
  EXPECT_EQ(half->bits(), EncodeHalvesOf(values, DTYPE_FLOAT16).bits());

  // Each write access drops the form; a held one keeps its bits.
  weights.mutable_data()[0] = 4.0f;
  std::shared_ptr<const EncodedHalves> after =
      weights.ShareHalves(DTYPE_FLOAT16);
  EXPECT_NE(after, half);
  EXPECT_EQ(after->bits(),
            EncodeHalvesOf(weights.span(), DTYPE_FLOAT16).bits());
  EXPECT_EQ(half->bits(), EncodeHalvesOf(values, DTYPE_FLOAT16).bits());
  float* w = weights.overwrite_data(3);
  w[0] = w[1] = w[2] = 8.0f;
  EXPECT_NE(weights.ShareHalves(DTYPE_FLOAT16), after);
  EXPECT_EQ(weights.ShareHalves(DTYPE_FLOAT16)->bits(),
            EncodeHalvesOf(weights.span(), DTYPE_FLOAT16).bits());
  weights = std::vector<float>{9.0f};
  EXPECT_EQ(weights.ShareHalves(DTYPE_FLOAT16)->bits().size(), 1u);

  // swap(): each side's form goes with its values.
  SharedFloats a(std::vector<float>{1.0f}), b(std::vector<float>{2.0f});
  std::shared_ptr<const EncodedHalves> of_a = a.ShareHalves(DTYPE_BFLOAT16);
  a.swap(b);
  EXPECT_EQ(b.ShareHalves(DTYPE_BFLOAT16), of_a);
  EXPECT_EQ(a.ShareHalves(DTYPE_BFLOAT16)->bits(),
            EncodeHalvesOf(std::vector<float>{2.0f}, DTYPE_BFLOAT16).bits());
}

}  // namespace
}  // namespace pstrain
