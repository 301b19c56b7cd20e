#include "common/tls_flags.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, tls_dir, "",
          "Folder of this cluster's TLS files (`pstrain certs --out=DIR`): "
          "ca.pem and this process's certificate and key. Default: the "
          "environment's PSTRAIN_TLS_DIR.");
ABSL_FLAG(bool, insecure, false,
          "Plaintext gRPC: no encryption and no authentication (anyone who "
          "reaches the port can call every method). Prints a warning.");
ABSL_FLAG(bool, insecure_allow_remote, false,
          "With --insecure: allow listening on an address other than "
          "loopback.");

namespace pstrain {

bool IsLoopback(const std::string& host) {
  std::string name = host;
  if (absl::StartsWith(name, "[")) {
    if (!absl::EndsWith(name, "]")) return false;
    name = name.substr(1, name.size() - 2);
  }
  if (name.empty()) return false;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return false;
  bool loopback = found != nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      loopback &= (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      const in6_addr& ip = v6->sin6_addr;
      loopback &= IN6_IS_ADDR_LOOPBACK(&ip) ||
                  (IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127);
    } else {
      loopback = false;
    }
  }
  freeaddrinfo(found);
  return loopback;
}

namespace {

// The flags' TlsOptions, the folder from --tls_dir or else the first of
// `variables` set in the environment.
absl::StatusOr<TlsOptions> OptionsFromFlags(
    const char* program, const std::string& bind, bool warn,
    std::initializer_list<const char*> variables) {
  TlsOptions options;
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.dir = absl::GetFlag(FLAGS_tls_dir);
  for (const char* variable : variables) {
    const char* env = std::getenv(variable);
    if (options.dir.empty() && env != nullptr) options.dir = env;
  }
  if (options.insecure) {
    if (!bind.empty() && !IsLoopback(bind) &&
        !absl::GetFlag(FLAGS_insecure_allow_remote)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--insecure with --bind=", bind,
          ": plaintext on a non-loopback address lets anyone on the network "
          "cancel jobs and read or change the model; add "
          "--insecure_allow_remote to do it anyway, or use --tls_dir"));
    }
    if (!warn) return options;
    std::fprintf(stderr,
                 "%s: warning: --insecure: plaintext gRPC, no encryption and "
                 "no authentication%s\n",
                 program,
                 bind.empty() ? "" : absl::StrCat(" on ", bind).c_str());
    return options;
  }
  if (options.dir.empty()) {
    return absl::InvalidArgumentError(
        "--tls_dir is not set (nor PSTRAIN_TLS_DIR): expected the folder "
        "`pstrain certs --out=DIR` made, or --insecure for plaintext");
  }
  return options;
}

}  // namespace

absl::StatusOr<TlsOptions> TlsOptionsFromFlags(const char* program,
                                               const std::string& bind,
                                               bool warn) {
  return OptionsFromFlags(program, bind, warn, {"PSTRAIN_TLS_DIR"});
}

absl::StatusOr<TlsOptions> AdminTlsOptionsFromFlags(const char* program) {
  return OptionsFromFlags(program, "", true,
                          {"PSTRAIN_ADMIN_TLS_DIR", "PSTRAIN_TLS_DIR"});
}

std::vector<std::string> TaskTlsFlags(const TlsOptions& tls,
                                      bool insecure_allow_remote) {
  if (!tls.insecure) {
    if (tls.dir.empty()) return {};
    return {absl::StrCat("--tls_dir=", tls.dir)};
  }
  std::vector<std::string> flags = {"--insecure"};
  if (insecure_allow_remote) flags.push_back("--insecure_allow_remote");
  return flags;
}

}  // namespace pstrain
