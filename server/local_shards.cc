#include "server/local_shards.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"

namespace pstrain {

LocalShards::LocalShards(int num_shards, ShardOptions options,
                         const TlsOptions& tls, const ServerLimits& limits) {
  for (int s = 0; s < num_shards; ++s) {
    options.shard_index = s;
    options.num_shards = num_shards;
    shards_.push_back(std::make_unique<ParameterShard>(options));
    services_.push_back(std::make_unique<PsService>(
        shards_.back().get(), absl::Seconds(60), !tls.insecure));
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentials(tls, TlsIdentity{TlsRole::kPs, s, options.job_id});
    if (!credentials.ok()) std::abort();  // test-only: the caller's files
    absl::StatusOr<ListeningServer> listening = StartGrpcServer(
        "127.0.0.1:0", services_.back().get(), "", *credentials, limits);
    // Test-only: failing to bind a loopback port 0 is a broken machine.
    if (!listening.ok()) std::abort();
    servers_.push_back(std::move(listening->server));
    addresses_.push_back(absl::StrCat("127.0.0.1:", listening->port));
  }
}

LocalShards::~LocalShards() {
  // As pstrain_ps: the checkpoint waits end before Shutdown waits for them.
  for (auto& service : services_) service->Close();
  for (auto& server : servers_) server->Shutdown();
}

}  // namespace pstrain
