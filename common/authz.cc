#include "common/authz.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {
namespace {

bool JobMatches(const TlsIdentity& caller, const std::string& job) {
  return caller.job == "*" || caller.job == job;
}

bool IsTask(const TlsIdentity& caller) {
  return caller.role == TlsRole::kPs || caller.role == TlsRole::kWorker;
}

const char* RuleText(Caller rule) {
  switch (rule) {
    case Caller::kAdmin:
      return "only the administrator";
    case Caller::kAdminOrTaskOfJob:
      return "only the administrator or a task of the job";
    case Caller::kTaskOfJob:
      return "only a task of the job";
    case Caller::kTaskAsItself:
      return "a task only as itself";
    case Caller::kWorkerOfJob:
      return "only a worker of the job";
    case Caller::kWorkerAsItself:
      return "a worker of the job only as itself";
    case Caller::kWorker0:
      return "only worker 0 of the job";
  }
  return "";
}

}  // namespace

const std::vector<MethodRule>& AuthorizationTable() {
  static const std::vector<MethodRule>* table = new std::vector<MethodRule>{
      {"/pstrain.Coordinator/Submit", Caller::kAdmin},
      {"/pstrain.Coordinator/GetJob", Caller::kAdminOrTaskOfJob},
      {"/pstrain.Coordinator/ListJobs", Caller::kAdmin},
      {"/pstrain.Coordinator/Cancel", Caller::kAdmin},
      {"/pstrain.Coordinator/Scale", Caller::kAdmin},
      {"/pstrain.Coordinator/Register", Caller::kTaskAsItself},
      {"/pstrain.Coordinator/WaitForLayout", Caller::kTaskOfJob},
      {"/pstrain.Coordinator/Heartbeat", Caller::kTaskAsItself},
      {"/pstrain.Coordinator/TaskFinished", Caller::kTaskAsItself},
      // The node agent, with the dead task's own key.
      {"/pstrain.Coordinator/RestartTask", Caller::kTaskAsItself},
      {"/pstrain.Coordinator/KvSet", Caller::kWorkerOfJob},
      {"/pstrain.Coordinator/KvWait", Caller::kWorkerOfJob},
      {"/pstrain.ParameterServer/Init", Caller::kWorker0},
      {"/pstrain.ParameterServer/WaitReady", Caller::kWorkerAsItself},
      {"/pstrain.ParameterServer/PushPull", Caller::kWorkerAsItself},
      {"/pstrain.ParameterServer/Stats", Caller::kWorkerAsItself},
      {"/pstrain.ParameterServer/Checkpoint", Caller::kWorker0},
      {"/pstrain.ParameterServer/WorkerDone", Caller::kWorkerAsItself},
      {"/pstrain.ParameterServer/Export", Caller::kWorker0},
  };
  return *table;
}

absl::Status Authorize(const TlsIdentity& caller, const std::string& method,
                       const RequestClaims& claims) {
  const MethodRule* rule = nullptr;
  for (const MethodRule& r : AuthorizationTable()) {
    if (r.method == method) rule = &r;
  }
  if (rule == nullptr) {
    return absl::InternalError(
        absl::StrCat(method, " has no authorization rule (common/authz.cc)"));
  }
  bool allowed = false;
  switch (rule->caller) {
    case Caller::kAdmin:
      allowed = caller.role == TlsRole::kAdmin;
      break;
    case Caller::kAdminOrTaskOfJob:
      allowed = caller.role == TlsRole::kAdmin ||
                (IsTask(caller) && JobMatches(caller, claims.job));
      break;
    case Caller::kTaskOfJob:
      allowed = IsTask(caller) && JobMatches(caller, claims.job);
      break;
    case Caller::kTaskAsItself:
      allowed = IsTask(caller) && JobMatches(caller, claims.job) &&
                caller.role == claims.role && caller.index == claims.index;
      break;
    case Caller::kWorkerOfJob:
      allowed =
          caller.role == TlsRole::kWorker && JobMatches(caller, claims.job);
      break;
    case Caller::kWorkerAsItself:
      allowed = caller.role == TlsRole::kWorker &&
                JobMatches(caller, claims.job) && caller.index == claims.index;
      break;
    case Caller::kWorker0:
      allowed = caller.role == TlsRole::kWorker &&
                JobMatches(caller, claims.job) && caller.index == 0 &&
                claims.index == 0;
      break;
  }
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      IdentityName(caller), " may not call ", method, " for job \"", claims.job,
      "\"", claims.index >= 0 ? " as task " : "",
      claims.index >= 0 ? std::to_string(claims.index) : "", ": ",
      RuleText(rule->caller), " may"));
}

grpc::Status Authorizer::Check(const grpc::ServerContext& context,
                               const std::string& method,
                               const RequestClaims& claims) const {
  if (!enabled_) return grpc::Status::OK;
  absl::StatusOr<TlsIdentity> caller = PeerIdentity(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(Authorize(*caller, method, claims));
}

grpc::Status Authorizer::CheckCaller(const grpc::ServerContext& context,
                                     const std::string& method,
                                     const std::string& job) const {
  if (!enabled_) return grpc::Status::OK;
  absl::StatusOr<TlsIdentity> caller = PeerIdentity(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  RequestClaims claims;
  claims.job = job;
  claims.role = caller->role;
  claims.index = caller->index;
  return ToGrpcStatus(Authorize(*caller, method, claims));
}

}  // namespace pstrain
