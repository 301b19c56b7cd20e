#include "server/local_shards.h"

#include "absl/strings/str_cat.h"
#include "common/rpc_options.h"

namespace pstrain {

LocalShards::LocalShards(int num_shards, ShardOptions options) {
  for (int s = 0; s < num_shards; ++s) {
    options.shard_index = s;
    options.num_shards = num_shards;
    shards_.push_back(std::make_unique<ParameterShard>(options));
    services_.push_back(
        std::make_unique<PsService>(shards_.back().get(), absl::Seconds(60)));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(services_.back().get());
    servers_.push_back(builder.BuildAndStart());
    addresses_.push_back(absl::StrCat("127.0.0.1:", port));
  }
}

LocalShards::~LocalShards() {
  for (auto& server : servers_) server->Shutdown();
}

}  // namespace pstrain
