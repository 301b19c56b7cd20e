#include "common/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "common/rpc_options.h"

namespace pstrain {

bool ConnectionCapSupported() {
#ifdef GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS
  return true;
#else
  return false;
#endif
}

absl::StatusOr<ListeningServer> StartGrpcServer(
    const std::string& address, grpc::Service* service,
    const std::string& port_file,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    const ServerLimits& limits) {
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota(absl::StrCat("pstrain server on ", address));
  quota.SetMaxThreads(limits.max_threads);
  quota.Resize(static_cast<size_t>(limits.max_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             limits.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                             limits.max_metadata_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             limits.max_connection_idle_ms);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             limits.handshake_timeout_ms);
#ifdef GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS
  builder.AddChannelArgument(GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS,
                             limits.max_connections);
#endif
  ListeningServer out;
  builder.AddListeningPort(
      address,
      credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
      &out.port);
  builder.SetMaxReceiveMessageSize(limits.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(limits.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA,
                             kMaxPingsWithoutData);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, kMaxPingStrikes);
  // gRPC sets SO_REUSEPORT by default, which would let two tasks listen on
  // one port and split its connections; a port in use must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (in use, or not an address here)"));
  }
  if (!port_file.empty()) {
    absl::Status s =
        WriteFileAtomically(port_file, absl::StrCat(out.port, "\n"));
    if (!s.ok()) return s;
  }
  return out;
}

}  // namespace pstrain
