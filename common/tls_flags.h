// The TLS flags every pstrain binary shares (common/tls.h):
//   --tls_dir=DIR              the folder of `pstrain certs` (or the
//                              environment's PSTRAIN_TLS_DIR; for the CLI,
//                              PSTRAIN_ADMIN_TLS_DIR first)
//   --insecure                 plaintext: no encryption, no authentication;
//                              prints a warning line at start
//   --insecure_allow_remote    with --insecure, allow a listening address
//                              other than loopback
// Thread-compatible (reads flags).
#ifndef PSTRAIN_COMMON_TLS_FLAGS_H_
#define PSTRAIN_COMMON_TLS_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace pstrain {

// The flags' TlsOptions for a process that listens on `bind` ("" for a
// client only). INVALID_ARGUMENT, naming the flags: neither a TLS folder
// nor --insecure; --insecure with a non-loopback `bind` without
// --insecure_allow_remote. With --insecure and `warn`, `program` prints a
// warning line to stderr.
absl::StatusOr<TlsOptions> TlsOptionsFromFlags(const char* program,
                                               const std::string& bind = "",
                                               bool warn = true);

// The CLI's TlsOptions, as the administrator: --tls_dir, else the
// environment's PSTRAIN_ADMIN_TLS_DIR, else PSTRAIN_TLS_DIR; so that the
// head node keeps admin.key in a folder of its own while the tasks it
// launches inherit PSTRAIN_TLS_DIR, the nodes' folder. Errors as
// TlsOptionsFromFlags().
absl::StatusOr<TlsOptions> AdminTlsOptionsFromFlags(const char* program);

// The TLS flags of a task launched to speak as `tls` says (pstrain run's
// and pstrain node's tasks): --insecure (and --insecure_allow_remote when
// `insecure_allow_remote`), else --tls_dir=DIR (the folder's path, so that
// a folder given to the launcher reaches the task; no key travels in
// argv), or nothing without a folder.
std::vector<std::string> TaskTlsFlags(const TlsOptions& tls,
                                      bool insecure_allow_remote);

// Whether `host` (a name, an address, or [an IPv6 address]) is loopback:
// it resolves, and every address it resolves to is in 127.0.0.0/8 or ::1
// ("localhost" is; "127.evil.example" is whatever its DNS says, and
// nothing when it does not resolve).
bool IsLoopback(const std::string& host);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TLS_FLAGS_H_
