#include "common/crc32c.h"

#include <array>

namespace pstrain {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

// table[b]: the CRC register after shifting byte b through it.
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) ? (crc >> 1) ^ kReflectedPolynomial : crc >> 1;
    }
    table[b] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, absl::string_view data) {
  uint32_t reg = ~crc;
  for (unsigned char c : data) {
    reg = kTable[(reg ^ c) & 0xff] ^ (reg >> 8);
  }
  return ~reg;
}

uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data); }

uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

uint32_t UnmaskCrc32c(uint32_t masked_crc) {
  const uint32_t rotated = masked_crc - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

}  // namespace pstrain
