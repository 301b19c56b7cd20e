// UTF-8 checks of protobuf messages whose text fields are `bytes` (a proto3
// `string` holding other bytes fails to parse, so a server could only answer
// gRPC's INTERNAL; as `bytes` the message parses and the check below names
// the field), and the sender's side of `string` fields: text made UTF-8
// before it is sent.
//
// Thread-safety: a pure function of its argument.
#ifndef PSTRAIN_COMMON_UTF8_H_
#define PSTRAIN_COMMON_UTF8_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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

// `text` with each byte that does not begin a UTF-8 character (as above:
// RFC 3629, protobuf's check) replaced by its escape `\xNN` (lowercase
// hex), so the result is always UTF-8; UTF-8 text comes back unchanged.
// A backslash already in `text` is kept as it is, so "\xff" in the result
// may be either; it is meant for people to read (log lines, messages).
//   "photo-\xff.jpg" (6 + 1 + 4 bytes) -> "photo-\\xff.jpg"
std::string EscapeNonUtf8(absl::string_view text);

// Makes every proto `string` field of `message` (TYPE_STRING, nested
// messages and repeated fields included; `bytes` fields are left as they
// are) UTF-8 with EscapeNonUtf8, so that a proto3 message always parses at
// its receiver. Returns how many values it changed (0: it was UTF-8).
int EscapeNonUtf8Fields(google::protobuf::Message* message);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_UTF8_H_
