// UTF-8 checks of protobuf messages whose text fields are `bytes` (a proto3
// `string` holding other bytes fails to parse, so a server could only answer
// gRPC's INTERNAL; as `bytes` the message parses and the check below names
// the field).
//
// Thread-safety: a pure function of its argument.
#ifndef PSTRAIN_COMMON_UTF8_H_
#define PSTRAIN_COMMON_UTF8_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace pstrain {

// OK if every string and bytes field of `message`, nested messages and
// repeated fields included, holds UTF-8 text (RFC 3629, as protobuf's own
// check for `string` fields: no overlong forms, no surrogates, nothing past
// U+10FFFF). Else INVALID_ARGUMENT naming the first such field by path
// ("data_dir", "ps_hosts[1].host", "optimizer.name") with its value
// hex-escaped and cut at 300 bytes, on one line:
//   data_dir: "/data\xff" is not UTF-8; expected UTF-8 text
absl::Status CheckUtf8Fields(const google::protobuf::Message& message);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_UTF8_H_
