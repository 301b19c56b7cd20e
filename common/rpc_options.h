// gRPC settings pstrain sets on purpose rather than leaving gRPC's defaults,
// shared by servers and clients.
#ifndef PSTRAIN_COMMON_RPC_OPTIONS_H_
#define PSTRAIN_COMMON_RPC_OPTIONS_H_

#include <cstdint>

namespace pstrain {

// Largest gRPC message either side accepts, bytes. A message carries one
// chunk (at most --partition_bytes, 4 MiB by default); the bound leaves room
// for raising --partition_bytes without hitting gRPC's 4 MB default.
constexpr int kMaxMessageBytes = 256 << 20;
// Keepalive pings on idle connections, so that a peer whose host vanished
// (no FIN, no RST) breaks a long-lived stream within ~70 s instead of never.
// A process that dies closes its sockets and breaks its streams at once; the
// timeout only has to catch hosts and links that go silent. It is the
// coordinator's default --heartbeat_timeout_s (60 s) on purpose: a paused
// process (SIGSTOP, a debugger, a swapped-out host) answers no ping, and a
// shorter timeout turned a worker stopped for 20 s into a broken sync
// barrier and a failed job, where it should only be a straggler until the
// coordinator declares it lost (BENCHMARKS.md, stragglers).
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 60000;
// gRPC by default sends at most 2 pings without data and a server counts
// more as "strikes": a stream idle for a long evaluation (minutes for a
// ResNet on CPU) then dies with "keepalive watchdog timeout". Both sides
// allow unlimited pings on idle streams (GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA
// = 0, GRPC_ARG_HTTP2_MAX_PING_STRIKES = 0).
constexpr int kMaxPingsWithoutData = 0;
constexpr int kMaxPingStrikes = 0;

// gRPC channels (TCP connections) each worker opens to each PS shard
// (JobSpec.channels_per_shard, worker/ps_client.h): gRPC protects one
// connection's TLS records on one core at a time, so that mutual TLS runs
// at one core's speed; chunk i of a shard travels on channel i mod N.
//
// The default (JobSpec 0: automatic) opens one channel per
// kAutoBytesPerChannel of the shard's chunks, at most
// kAutoMaxChannelsPerShard. Measured (issue 39): with a 100 MB model 4
// channels were the fastest (ps_bench, 2 cores: mutual TLS 507-572 ms a
// step against 663-971 ms with 1; H200 host: 1 shard 123.1 against 288.0
// ms; the ResNet-50 PS worker 524.6 against 321.2 samples/s), but a small
// model pays for the extra streams' step-end handshake: the default
// LeNet-5 job (247 KB) ran at 0.63x of its 1-channel speed with 4 on 2
// cores. Each stream holds a shard thread (common/grpc_server.h's
// max_threads): a shard serves up to about max_threads / N workers.
constexpr int kAutoMaxChannelsPerShard = 4;
constexpr int64_t kAutoBytesPerChannel = 8 << 20;
constexpr int kMaxChannelsPerShard = 16;

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_OPTIONS_H_
