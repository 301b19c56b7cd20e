// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), as in
// iSCSI (RFC 3720), leveldb and TFRecord files, and the masked form that
// TFRecord and leveldb store beside their data.
//
// A table-driven software implementation, a byte at a time (Debian has no C++
// CRC-32C library and Abseil 20220623 has no absl/crc). Pure functions: safe
// from any number of threads.
#ifndef PSTRAIN_COMMON_CRC32C_H_
#define PSTRAIN_COMMON_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pstrain {

// The CRC-32C of `data`: Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view data);

// The CRC-32C of A + `data`, where `crc` is the CRC-32C of A (0 for empty
// A): Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, absl::string_view data);

// A CRC stored beside the data it covers is masked, so that the CRC of a
// string holding CRCs does not degenerate:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked_crc);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CRC32C_H_
