// In-process parameter-server shards, each behind its own gRPC server on
// 127.0.0.1 with an OS-chosen port: for tests and benchmarks that need real
// shards without starting processes.
//
// Thread-safety: construct and destroy from one thread; the servers serve
// from gRPC's threads.
#ifndef PSTRAIN_SERVER_LOCAL_SHARDS_H_
#define PSTRAIN_SERVER_LOCAL_SHARDS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/grpc_server.h"
#include "common/tls.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"

namespace pstrain {

class LocalShards {
 public:
  // Starts `num_shards` shards of `options` (shard_index and num_shards are
  // set here for each). With `tls` not insecure, each serves mutual TLS as
  // ps:<i>@<job_id> from tls.dir (common/tls.h) and authorizes every call.
  // Each gRPC server runs with `limits`.
  LocalShards(int num_shards, ShardOptions options,
              const TlsOptions& tls = InsecureTlsOptions(),
              const ServerLimits& limits = ServerLimits());
  ~LocalShards();

  // host:port of each shard, by shard index.
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<std::unique_ptr<PsService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_LOCAL_SHARDS_H_
