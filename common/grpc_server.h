// Starting a gRPC server the way every pstrain server starts: the message
// limits and keepalive/ping settings of rpc_options.h, the resource bounds
// of ServerLimits, one listening address, gRPC's standard services (health,
// reflection, channelz; HealthOptions), and (optionally) the bound port
// written to a file so that a launcher can find a port chosen by the OS.
//
// Thread-safety: a plain function; ListeningServer's methods are
// thread-safe.
#ifndef PSTRAIN_COMMON_GRPC_SERVER_H_
#define PSTRAIN_COMMON_GRPC_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc_options.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

// What one server may take from its host, each bound enforced by gRPC
// itself (its resource quota and channel arguments), so that a client that
// opens calls or connections and then stalls cannot exhaust the process.
// The number of connections is capped only where gRPC can do it
// (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS, gRPC 1.55 and later; see
// ConnectionCapSupported()). Debian 12's gRPC 1.51 has no such cap: there
// connections are bounded by the memory quota, the handshake timeout and
// the idle timeout below.
struct ServerLimits {
  // Threads gRPC may run to serve calls, count (ResourceQuota::
  // SetMaxThreads). A synchronous handler holds its thread for the whole
  // call (a PS's PushPull stream for the whole training run, a blocking
  // coordinator wait up to --max_wait_s), so this also caps the calls in
  // progress: past it a new call fails at once with RESOURCE_EXHAUSTED and
  // the calls already served carry on. A PS's PushPull stream runs one
  // more thread of its own (server/ps_service.h), so a PS runs at most
  // about twice this many.
  int max_threads = 1024;
  // Memory gRPC may hold for this server's connections and calls, bytes
  // (ResourceQuota::Resize): as use nears it gRPC shrinks flow-control
  // windows and frees idle connections' buffers.
  int64_t max_memory_bytes = int64_t{1} << 30;
  // Streams open at once on one connection, count
  // (GRPC_ARG_MAX_CONCURRENT_STREAMS, sent in HTTP/2 SETTINGS); a client's
  // further streams on that connection wait for a free slot.
  int max_streams_per_connection = 100;
  // Largest message received, bytes. gRPC compares each message's length
  // prefix with it before buffering the message, and fails that call with
  // RESOURCE_EXHAUSTED ("Received message larger than max").
  int max_receive_message_bytes = kMaxMessageBytes;
  // Largest message sent, bytes.
  int max_send_message_bytes = kMaxMessageBytes;
  // Largest header metadata of one call, bytes (GRPC_ARG_MAX_METADATA_SIZE).
  int max_metadata_bytes = 16 << 10;
  // A connection with no call in progress for this long is closed with a
  // GOAWAY, ms (GRPC_ARG_MAX_CONNECTION_IDLE_MS); clients reconnect on
  // their next call. Long-lived streams (PushPull) keep their connection.
  int max_connection_idle_ms = 5 * 60 * 1000;
  // A new connection must finish its TLS and HTTP/2 handshake within this,
  // ms (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS; gRPC's default is 120 s).
  int handshake_timeout_ms = 20 * 1000;
  // TCP connections open at once, count: past it gRPC closes a new
  // connection as soon as it is accepted (the client sees UNAVAILABLE) and
  // the connections already open carry on. Applied only where
  // ConnectionCapSupported(); ignored otherwise.
  int max_connections = 4096;
  // The synchronous server's completion queues and poller threads, count
  // (ServerBuilder::SetSyncServerOption): 0 keeps gRPC's defaults (one
  // queue, one to two pollers); N > 0 runs N queues with N to 2N pollers.
  // Pollers read the connections, and over TLS unprotect their records, so
  // on a many-core host more of them may spread mutual TLS's cost (issue
  // 39; BENCHMARKS.md "Mutual TLS"). At most 64.
  int sync_server_queues = 0;
};

// Whether the gRPC this was built with can cap a server's connections
// (ServerLimits::max_connections). False with gRPC 1.51 (Debian 12).
bool ConnectionCapSupported();

// gRPC's standard services, which every server StartGrpcServer starts
// offers beside its own service:
//   grpc.health.v1.Health           its health (ListeningServer::SetServing),
//                                   what Kubernetes' gRPC probes, load
//                                   balancers and grpc_health_probe ask;
//   grpc.reflection.v1alpha.ServerReflection
//                                   its services and their messages, what
//                                   grpcurl lists and calls through;
//   grpc.channelz.v1.Channelz       its connections, calls and their
//                                   counts, peers' addresses included.
// They are gRPC's own handlers, outside common/authz.h's table: under TLS
// any client certificate of the cluster's CA may call them
// (docs/SECURITY.md, "gRPC's standard services").
struct HealthOptions {
  // The server's own service ("pstrain.ParameterServer"): its status is
  // reported under this name and under "" (the whole server). Empty: ""
  // only.
  std::string service_name;
  // The status from the start. gRPC's health service starts SERVING; with
  // false it is set to NOT_SERVING as soon as the server is built, before
  // the port file is written (a probe that knows the port beforehand may
  // see SERVING in that instant).
  bool serving_at_start = true;
  // "host:port" (port 0: any free port): also serve grpc.health.v1.Health
  // alone, in plaintext, there, for probes that carry no certificate (no
  // reflection, no channelz, no pstrain service: anything else is
  // UNIMPLEMENTED). Empty: no such server.
  std::string plaintext_address;
};

// A started server; thread-safe. Destroying it shuts both servers down
// (gRPC's destructor, no grace); Shutdown() gives calls a grace first.
struct ListeningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // The plaintext health-only server (HealthOptions::plaintext_address),
  // or null.
  std::unique_ptr<grpc::Server> health_server;
  int health_port = 0;
  // HealthOptions::service_name.
  std::string service_name;

  // Sets the health status ("" and service_name) on both servers.
  void SetServing(bool serving) const;
  // Stops both servers: new calls are refused and calls in flight have
  // until `deadline` (then they are cancelled); health reports NOT_SERVING
  // from the start of the grace.
  void Shutdown(std::chrono::system_clock::time_point deadline) const;
};

// Serves `service` (not owned; must outlive the server) on `address`
// ("host:port", port 0: any free port) and, when `port_file` is not empty,
// writes the bound port and a newline there atomically. `credentials`:
// the server's TLS (common/tls.h); null: plaintext. UNAVAILABLE "cannot
// listen on <address> (in use, or not an address here)"; the error of the
// port file's write. `limits`: see ServerLimits. `health`: the standard
// services' health status and the plaintext health port (HealthOptions);
// UNAVAILABLE "cannot listen on <plaintext_address> (health port) ..."
// when that cannot be bound.
absl::StatusOr<ListeningServer> StartGrpcServer(
    const std::string& address, grpc::Service* service,
    const std::string& port_file,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
    const ServerLimits& limits = ServerLimits(),
    const HealthOptions& health = HealthOptions());

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_GRPC_SERVER_H_
