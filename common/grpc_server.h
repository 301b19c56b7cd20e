// Starting a gRPC server the way every pstrain server starts: the message
// limits and keepalive/ping settings of rpc_options.h, one listening
// address, and (optionally) the bound port written to a file so that a
// launcher can find a port chosen by the OS.
//
// Thread-safety: a plain function.
#ifndef PSTRAIN_COMMON_GRPC_SERVER_H_
#define PSTRAIN_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

struct ListeningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Serves `service` (not owned; must outlive the server) on `address`
// ("host:port", port 0: any free port) and, when `port_file` is not empty,
// writes the bound port and a newline there atomically. `credentials`:
// the server's TLS (common/tls.h); null: plaintext. UNAVAILABLE "cannot
// listen on <address> (in use, or not an address here)"; the error of the
// port file's write.
absl::StatusOr<ListeningServer> StartGrpcServer(
    const std::string& address, grpc::Service* service,
    const std::string& port_file,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_GRPC_SERVER_H_
