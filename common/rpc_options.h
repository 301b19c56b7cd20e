// gRPC settings pstrain sets on purpose rather than leaving gRPC's defaults,
// shared by servers and clients.
#ifndef PSTRAIN_COMMON_RPC_OPTIONS_H_
#define PSTRAIN_COMMON_RPC_OPTIONS_H_

namespace pstrain {

// Largest gRPC message either side accepts, bytes. A message carries one
// chunk (at most --partition_bytes, 4 MiB by default); the bound leaves room
// for raising --partition_bytes without hitting gRPC's 4 MB default.
constexpr int kMaxMessageBytes = 256 << 20;
// Keepalive pings on idle connections, so that a dead peer breaks a
// long-lived stream within ~20 s instead of never.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 10000;

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_OPTIONS_H_
