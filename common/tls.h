// Mutual TLS for every pstrain gRPC service: who is who, the certificates
// that say so, and gRPC credentials made from them.
//
// Identities. Every certificate names one identity in its subject's common
// name, under one job or any ("*"):
//   "coordinator"          the coordinator (server)
//   "admin"                a user's CLI: submits, cancels, reads jobs
//   "ps:<i>@<job>"         PS shard i of a job (server; and a client of the
//                          coordinator, with a second certificate)
//   "worker:<j>@<job>"     worker j of a job (client)
// Servers also carry a DNS name for it, "coordinator.pstrain" or
// "<job>.ps-<i>.pstrain" (a shard of every job: "*.ps-<i>.pstrain", which
// matches any one job), which clients check in place of the host name
// (gRPC's target name override), so that a worker of job-3 talks to shard 1
// only when the peer proves to be shard 1 of job-3, wherever it runs: a
// shard key of another job cannot stand in for it.
//
// Usage by role: a certificate is for a TLS server (extended key usage
// serverAuth: the coordinator, ps-<i>) or for a client (clientAuth: admin,
// worker-<j>, ps-<i>-client, the shard's link to the coordinator), never
// both; OpenSSL refuses one used the other way in the handshake.
//
// Files (MakeCertificates, `pstrain certs`): a folder (mode 0700) holding
// ca.pem (the cluster's CA, P-256 ECDSA, self-signed), ca.key, and per
// identity <stem>.pem (its certificate, signed by the CA) and <stem>.key
// (its private key), stems "coordinator", "admin", "ps-<i>" and
// "ps-<i>-client", "worker-<j>". Keys are created 0600 (O_EXCL|O_NOFOLLOW,
// then renamed into place); no key or secret ever travels in argv.
//
// Credentials read the files through gRPC's file-watching provider, so
// renewed certificates (written atomically, e.g. a new folder renamed into
// place) are picked up within `refresh_s` without a restart.
//
// Errors: INVALID_ARGUMENT naming the flag or file and what was expected;
// INTERNAL with OpenSSL's error for a failure making keys. Thread-safe
// (plain functions).
#ifndef PSTRAIN_COMMON_TLS_H_
#define PSTRAIN_COMMON_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

enum class TlsRole { kCoordinator, kAdmin, kPs, kWorker };

struct TlsIdentity {
  TlsRole role = TlsRole::kAdmin;
  int index = 0;          // ps and worker only
  std::string job = "*";  // ps and worker only; "*": any job

  bool operator==(const TlsIdentity& o) const {
    return role == o.role && index == o.index && job == o.job;
  }
};

// The common name: "coordinator", "admin", "ps:1@job-1", "worker:0@*".
std::string IdentityName(const TlsIdentity& identity);
// The inverse; INVALID_ARGUMENT for anything else.
absl::StatusOr<TlsIdentity> ParseIdentityName(const std::string& name);
// "coordinator", "admin", "ps-1", "worker-0": the stem of the files a
// process uses as this identity's server, or its only one.
std::string IdentityStem(const TlsIdentity& identity);
// The stem of the files this identity uses as a client: "ps-1-client" for a
// shard (its link to the coordinator), IdentityStem() for the others.
std::string ClientStem(const TlsIdentity& identity);
// The DNS name a server's certificate carries and its clients check:
// "coordinator.pstrain", "job-3.ps-1.pstrain" ("*.ps-1.pstrain" for a
// shard of any job); "" for clients only. A client must name the job.
std::string ServerName(const TlsIdentity& identity);

// OK if `job` can name a job in a certificate: "*" or one DNS label
// (letters, digits and '-', 1 to 63 of them, no '-' at either end), as the
// coordinator's ids "job-<n>" are. INVALID_ARGUMENT naming it otherwise.
absl::Status CheckCertificateJob(const std::string& job);

// Makes a CA in `dir` (created 0700; ca.pem and ca.key kept) unless ca.pem
// is there already (then ca.key must be too: FAILED_PRECONDITION
// otherwise), then a key and a CA-signed certificate per identity (two for
// a shard: server and client), valid `validity` from an hour ago; `hosts`
// (names or IP addresses) are added to every certificate's subject
// alternative names, for clients that reach a server by its host name.
// INVALID_ARGUMENT for a job CheckCertificateJob() refuses.
absl::Status MakeCertificates(const std::string& dir,
                              const std::vector<TlsIdentity>& identities,
                              const std::vector<std::string>& hosts = {},
                              absl::Duration validity = absl::Hours(24 * 365));

// Removes `dir`/ca.key and `dir`/admin.key (absent ones are fine): what
// `pstrain run` does once it has minted every certificate of its run, so
// that no key that mints or commands outlives the minting.
// FAILED_PRECONDITION naming the file when one cannot be removed.
absl::Status RemoveMintingKeys(const std::string& dir);

// The names of the files CopyForNodes() writes for `identities`, each once:
// ca.pem, then the .pem and .key of every shard's and worker's server and
// client certificate (a caller checks the nodes' folder holds none of them
// before minting).
std::vector<std::string> NodeFileNames(
    const std::vector<TlsIdentity>& identities);

// Copies what the nodes of a cluster need from `from` (a folder of
// MakeCertificates) into `to` (created 0700): ca.pem and the certificates
// and keys of the shards and workers among `identities`; never ca.key, nor
// the coordinator's or the administrator's (they stay on the head node).
// INVALID_ARGUMENT when `to` is `from`.
absl::Status CopyForNodes(const std::string& from, const std::string& to,
                          const std::vector<TlsIdentity>& identities);

// A folder only this user can enter (mode 0700, under $TMPDIR or /tmp,
// named <prefix>-<pid>-XXXXXX), removed with everything in it on
// destruction: `pstrain run`'s certificates. Its owner holds an flock on
// <folder>/.lock for the object's life (the kernel releases it when the
// process dies), so a process killed before it could remove its folder
// (SIGKILL) leaves it behind only until the next Create() with the same
// prefix: that removes every such folder of this user whose lock is free
// (the pid in the name is for people: pids are not unique across the pid
// namespaces that may share /tmp).
class PrivateFolder {
 public:
  static absl::StatusOr<std::unique_ptr<PrivateFolder>> Create(
      const std::string& prefix);
  ~PrivateFolder();
  PrivateFolder(const PrivateFolder&) = delete;
  PrivateFolder& operator=(const PrivateFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  PrivateFolder(std::string path, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd) {}
  const std::string path_;
  const int lock_fd_;  // holds the flock on path_/.lock
};

// How a process secures its gRPC traffic.
struct TlsOptions {
  // Folder with ca.pem and this identity's <stem>.pem and <stem>.key.
  // Empty: plaintext, allowed only with `insecure`.
  std::string dir;
  bool insecure = false;
  // How often renewed files are looked for, seconds.
  unsigned refresh_s = 60;
};

inline TlsOptions InsecureTlsOptions() {
  TlsOptions options;
  options.insecure = true;
  return options;
}

// Checks that `options.dir` holds readable, matching files for `self`: as
// a server (coordinator, shard) and as a client (admin, worker, shard)
// (FAILED_PRECONDITION / INVALID_ARGUMENT naming the file otherwise).
absl::Status CheckTlsFiles(const TlsOptions& options, const TlsIdentity& self);

// The identity the certificate of task `role` `index` in `options.dir`
// names (its job may be "*"), for a supervisor acting for that task (the
// node agent); NOT_FOUND when the folder has none.
absl::StatusOr<TlsIdentity> TaskIdentityInFolder(const TlsOptions& options,
                                                 TlsRole role, int index);

// The identity of any task certificate in `options.dir` of job `job` (or
// of any job), for a process that reads that job's spec before it knows
// its tasks (the node agent); NOT_FOUND when there is none.
absl::StatusOr<TlsIdentity> AnyTaskIdentityOfJob(const TlsOptions& options,
                                                 const std::string& job);

// A server as `self` (files IdentityStem()) that requires and verifies a
// client certificate from the same CA. Plaintext with `insecure`.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsOptions& options, const TlsIdentity& self);

// A client as `self` (files ClientStem()) that verifies the server's
// certificate against the CA and presents its own. Plaintext with
// `insecure`. Use with SetPeerServerName().
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsOptions& options, const TlsIdentity& self);

// The server name (ServerName()) the channel's peer must prove; a shard's
// `server.job` must be the caller's job (not "*").
void SetPeerServerName(const TlsIdentity& server, grpc::ChannelArguments* args);

// Tries one TLS handshake as `self` with the server at `address`
// ("host:port" or "[v6]:port") that must prove to be `server`, for a task
// whose calls failed to say why in one line: UNAVAILABLE "certificate of
// coordinator.pstrain at ADDR not trusted by DIR/ca.pem (...)", "... is not
// a server's certificate", "ADDR is not job-1.ps-0.pstrain (its certificate
// names ...)", "ADDR refused our certificate DIR/worker-0.pem (...)" or
// "ADDR: cannot connect (...)"; OK when the handshake succeeds, for
// plaintext, or for a target it cannot parse. Waits at most `timeout`.
absl::Status CheckTlsPeer(const TlsOptions& options, const TlsIdentity& self,
                          const std::string& address, const TlsIdentity& server,
                          absl::Duration timeout = absl::Seconds(5));

// The identity of an RPC's caller from its verified certificate;
// UNAUTHENTICATED when there is none (a plaintext call).
absl::StatusOr<TlsIdentity> PeerIdentity(const grpc::ServerContext& context);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TLS_H_
