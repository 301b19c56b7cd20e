// gRPC settings pstrain sets on purpose rather than leaving gRPC's defaults,
// shared by servers and clients.
#ifndef PSTRAIN_COMMON_RPC_OPTIONS_H_
#define PSTRAIN_COMMON_RPC_OPTIONS_H_

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
// at one core's speed; chunk i of a shard travels on channel i mod N. The
// default (JobSpec 0) was chosen with ps_bench (issue 39, 100 MB model, 1
// worker, loopback, 2-core host): 4 was the fastest or tied with mutual
// TLS (1 shard: 507-572 ms a step against 663-971 ms with 1 channel) and
// kept plaintext as fast as 1 channel. Each stream holds a shard thread
// (common/grpc_server.h's max_threads): a shard serves up to about
// max_threads / N workers.
constexpr int kDefaultChannelsPerShard = 4;
constexpr int kMaxChannelsPerShard = 16;

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RPC_OPTIONS_H_
