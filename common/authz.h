// Who may call which method of every pstrain gRPC service: one table, in
// one place (AuthorizationTable()), checked by each handler before it
// touches any state.
//
// Rules (Caller), by the caller's certificate (common/tls.h):
//   kAdmin             the CLI ("admin"): Submit, ListJobs, Cancel, Scale.
//   kAdminOrTaskOfJob  the CLI, or a PS or worker of the request's job:
//                      GetJob (tasks read their job's spec).
//   kTaskOfJob         a PS or worker of the request's job: WaitForLayout.
//   kTaskAsItself      the very task the request names (role, index, job):
//                      Register, Heartbeat, TaskFinished, RestartTask (the
//                      node agent, with its dead task's key): a task
//                      reports, heartbeats, logs and is restarted only as
//                      itself.
//   kWorkerOfJob       a worker of the request's job: KvSet, KvWait (the
//                      allreduce rendezvous).
//   kWorkerAsItself    a worker of the shard's job whose index is the
//                      request's worker_id: WaitReady, PushPull, Stats,
//                      WorkerDone (only workers push, pull, and say done).
//   kWorker0           worker 0 of the shard's job: Init, Checkpoint.
// A certificate for job "*" counts as one of every job.
//
// Not in the table: gRPC's standard services on every server
// (grpc.health.v1.Health, reflection, channelz; common/grpc_server.h).
// Their handlers are gRPC's and change nothing: any client certificate of
// the cluster's CA may call them (docs/SECURITY.md, "gRPC's standard
// services").
//
// Errors: PERMISSION_DENIED naming the caller, the method and what it may
// not do; UNAUTHENTICATED without a verified certificate; INTERNAL for a
// method without a rule (every RPC must have one: tests/authz_test walks
// every method of every service descriptor). Thread-safe.
#ifndef PSTRAIN_COMMON_AUTHZ_H_
#define PSTRAIN_COMMON_AUTHZ_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tls.h"

namespace pstrain {

enum class Caller {
  kAdmin,
  kAdminOrTaskOfJob,
  kTaskOfJob,
  kTaskAsItself,
  kWorkerOfJob,
  kWorkerAsItself,
  kWorker0,
};

struct MethodRule {
  std::string method;  // "/pstrain.Coordinator/Submit"
  Caller caller;
};

const std::vector<MethodRule>& AuthorizationTable();

// What a request is about: its job, and for task-scoped rules the task it
// names (kTaskAsItself: role and index; worker rules: the worker id).
struct RequestClaims {
  std::string job;
  TlsRole role = TlsRole::kWorker;
  int index = -1;
};

// Whether `caller` may call `method` with a request claiming `claims`.
absl::Status Authorize(const TlsIdentity& caller, const std::string& method,
                       const RequestClaims& claims);

// A server's check of each call: off (every call allowed) for a plaintext
// server (--insecure), else the caller's verified identity must pass
// Authorize().
class Authorizer {
 public:
  explicit Authorizer(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  grpc::Status Check(const grpc::ServerContext& context,
                     const std::string& method,
                     const RequestClaims& claims) const;
  // Before a call's first message is read: whether the caller may call
  // `method` of `job` at all, with its own certificate's role and index as
  // the claims. A server checks it on streams whose messages are large
  // (PushPull, Init), so a caller of another job or role costs it no
  // parsing; each request's claims are then checked with Check().
  grpc::Status CheckCaller(const grpc::ServerContext& context,
                           const std::string& method,
                           const std::string& job) const;

 private:
  const bool enabled_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_AUTHZ_H_
