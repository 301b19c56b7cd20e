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
// gRPC by default sends at most 2 pings without data and a server counts
// more as "strikes": a stream idle for a long evaluation (minutes for a
// ResNet on CPU) then dies with "keepalive watchdog timeout". Both sides
// allow unlimited pings on idle streams (GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA
// = 0, GRPC_ARG_HTTP2_MAX_PING_STRIKES = 0).
constexpr int kMaxPingsWithoutData = 0;
constexpr int kMaxPingStrikes = 0;

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_OPTIONS_H_
