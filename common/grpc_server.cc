#include "common/grpc_server.h"

#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "common/rpc_options.h"

namespace pstrain {
namespace {

// gRPC's health service on every server built from now on, and the
// reflection and channelz plugins on every ServerBuilder made from now on
// (gRPC keeps them in process-wide lists).
void EnableStandardServices() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::channelz::experimental::InitChannelzService();
  });
}

// Drops every plugin (reflection, channelz) from one ServerBuilder: the
// plaintext health server offers health alone.
class NoPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->clear();
  }
};

// The plaintext server of grpc.health.v1.Health alone. gRPC builds no
// server without a polled queue of calls: the generic service (every
// other method UNIMPLEMENTED) gives it one.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(
    const std::string& address, int* port) {
  static grpc::CallbackGenericService* const unimplemented =
      new grpc::CallbackGenericService();
  grpc::ServerBuilder builder;
  // A probe's calls are tiny and few.
  grpc::ResourceQuota quota(absl::StrCat("pstrain health on ", address));
  quota.SetMaxThreads(16);
  quota.Resize(size_t{16} << 20);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(4 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 5 * 1000);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetOption(std::make_unique<NoPlugins>());
  builder.RegisterCallbackGenericService(unimplemented);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0 ||
      server->GetHealthCheckService() == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address,
                     " (health port; in use, or not an address here)"));
  }
  return server;
}

void SetServingOn(grpc::Server* server, const std::string& service_name,
                  bool serving) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  if (!service_name.empty()) health->SetServingStatus(service_name, serving);
}

}  // namespace

void ListeningServer::SetServing(bool serving) const {
  SetServingOn(server.get(), service_name, serving);
  SetServingOn(health_server.get(), service_name, serving);
}

void ListeningServer::Shutdown(
    std::chrono::system_clock::time_point deadline) const {
  SetServing(false);
  if (health_server != nullptr) health_server->Shutdown(deadline);
  if (server != nullptr) server->Shutdown(deadline);
}

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
    const ServerLimits& limits, const HealthOptions& health) {
  EnableStandardServices();
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
  if (limits.sync_server_queues > 0) {
    const int n = std::min(limits.sync_server_queues, 64);
    builder.SetSyncServerOption(grpc::ServerBuilder::NUM_CQS, n);
    builder.SetSyncServerOption(grpc::ServerBuilder::MIN_POLLERS, n);
    builder.SetSyncServerOption(grpc::ServerBuilder::MAX_POLLERS, 2 * n);
  }
  // gRPC sets SO_REUSEPORT by default, which would let two tasks listen on
  // one port and split its connections; a port in use must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (in use, or not an address here)"));
  }
  out.service_name = health.service_name;
  if (!health.plaintext_address.empty()) {
    absl::StatusOr<std::unique_ptr<grpc::Server>> health_server =
        StartHealthServer(health.plaintext_address, &out.health_port);
    if (!health_server.ok()) {
      out.server->Shutdown();
      return health_server.status();
    }
    out.health_server = *std::move(health_server);
  }
  // gRPC's health service knows "" (SERVING) only until told of a name.
  out.SetServing(health.serving_at_start);
  if (!port_file.empty()) {
    absl::Status s =
        WriteFileAtomically(port_file, absl::StrCat(out.port, "\n"));
    if (!s.ok()) return s;
  }
  return out;
}

}  // namespace pstrain
