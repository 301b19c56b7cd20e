#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(Crc32cTest, CheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

// RFC 3720 (iSCSI), appendix B.4: CRC examples.
TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0');
  std::string descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  // An iSCSI SCSI Read (10) command PDU.
  const unsigned char pdu[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(Crc32c(absl::string_view(reinterpret_cast<const char*>(pdu),
                                     sizeof(pdu))),
            0xD9963A56u);
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  const std::string a = "hello, ";
  const std::string b = "parameter server";
  EXPECT_EQ(Crc32cExtend(Crc32c(a), b), Crc32c(a + b));
  EXPECT_EQ(Crc32cExtend(Crc32c(""), a), Crc32c(a));
}

TEST(Crc32cTest, MaskRoundTripsAndDiffers) {
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x80000000u}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc);
  }
  EXPECT_NE(MaskCrc32c(0xE3069283u), 0xE3069283u);
  // The formula: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(1), (1u << 17) + 0xa282ead8u);
}

}  // namespace
}  // namespace pstrain
