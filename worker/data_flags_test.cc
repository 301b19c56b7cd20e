#include "worker/data_flags.h"

#include <string>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

int64_t Parsed(const std::string& text) {
  ByteSize size;
  std::string error;
  EXPECT_TRUE(AbslParseFlag(text, &size, &error)) << text << ": " << error;
  return size.bytes;
}

TEST(DataFlagsTest, ByteSizesTakePowerOf1024Suffixes) {
  EXPECT_EQ(Parsed(""), 0);
  EXPECT_EQ(Parsed("0"), 0);
  EXPECT_EQ(Parsed("4096"), 4096);
  EXPECT_EQ(Parsed("512M"), int64_t{512} << 20);
  EXPECT_EQ(Parsed("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(Parsed("8g"), int64_t{8} << 30);
  EXPECT_EQ(Parsed("8GB"), int64_t{8} << 30);
  EXPECT_EQ(Parsed("1.5K"), 1536);
  EXPECT_EQ(Parsed("2T"), int64_t{2} << 40);
  for (const char* bad : {"lots", "-1G", "8X", "G", "1e30"}) {
    ByteSize size;
    std::string error;
    EXPECT_FALSE(AbslParseFlag(bad, &size, &error)) << bad;
    EXPECT_NE(error.find("expected a size in bytes"), std::string::npos);
  }
  EXPECT_EQ(AbslUnparseFlag(ByteSize{int64_t{8} << 30}), "8589934592");
}

}  // namespace
}  // namespace pstrain
