#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/tls.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_spec.h"

namespace pstrain {

grpc::Status CoordinatorService::Authorize(const grpc::ServerContext& context,
                                           const char* method,
                                           const std::string& job,
                                           TaskRole role, int index) const {
  RequestClaims claims;
  claims.job = job;
  claims.role = role == ROLE_PS ? TlsRole::kPs : TlsRole::kWorker;
  claims.index = role == ROLE_UNSPECIFIED ? -1 : index;
  return authorizer_.Check(
      context, absl::StrCat("/pstrain.Coordinator/", method), claims);
}

std::string CoordinatorService::CallerName(
    const grpc::ServerContext& context) const {
  if (authorizer_.enabled()) {
    absl::StatusOr<TlsIdentity> identity = PeerIdentity(context);
    if (identity.ok()) return IdentityName(*identity);
  }
  // "ipv4:127.0.0.1:51234" -> "ipv4:127.0.0.1": the port changes per
  // connection.
  std::string peer = context.peer();
  const size_t colon = peer.rfind(':');
  if (colon != std::string::npos && colon > peer.find(':')) {
    peer.resize(colon);
  }
  return peer;
}

CoordinatorService::LongPoll::LongPoll(CoordinatorService* service,
                                       std::string caller)
    : service_(service), caller_(std::move(caller)) {
  absl::MutexLock lock(&service_->polls_mu_);
  int& count = service_->polls_[caller_];
  if (count >= service_->max_long_polls_) {
    status_ = grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(caller_, " has ", count,
                     " long polls (WaitForLayout, KvWait) in flight, the "
                     "limit per caller; try again when one has returned"));
    if (count == 0) service_->polls_.erase(caller_);
    return;
  }
  ++count;
}

CoordinatorService::LongPoll::~LongPoll() {
  if (!status_.ok()) return;
  absl::MutexLock lock(&service_->polls_mu_);
  auto it = service_->polls_.find(caller_);
  if (it != service_->polls_.end() && --it->second <= 0) {
    service_->polls_.erase(it);
  }
}

absl::Time CoordinatorService::Deadline(
    const grpc::ServerContext* context) const {
  absl::Time deadline = absl::Now() + max_wait_;
  const auto client = context->deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(client));
  }
  return deadline;
}

std::function<bool()> CoordinatorService::Cancelled(
    grpc::ServerContext* context) {
  return [context] { return context->IsCancelled(); };
}

grpc::Status CoordinatorService::Submit(grpc::ServerContext* context,
                                        const SubmitRequest* request,
                                        SubmitResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Submit", ""); !denied.ok()) {
    return denied;
  }
  JobSpec spec = request->spec();
  ApplyJobDefaults(&spec);
  absl::Status s = ValidateJobSpec(spec);
  if (!s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::string> id = table_->Submit(spec, absl::Now());
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context,
                                        const JobRequest* request,
                                        JobInfo* response) {
  if (grpc::Status denied = Authorize(*context, "GetJob", request->job_id());
      !denied.ok()) {
    return denied;
  }
  absl::StatusOr<JobInfo> job =
      table_->Get(request->job_id(), request->log_since());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const ListJobsRequest* request,
                                          ListJobsResponse* response) {
  if (grpc::Status denied = Authorize(*context, "ListJobs", ""); !denied.ok()) {
    return denied;
  }
  // A summary of each job (proto/coordinator.proto ListJobsResponse): its
  // store, result and membership history, up to megabytes each, are
  // GetJob's to return.
  for (JobInfo& job : table_->List()) {
    job.clear_kv();
    job.clear_result();
    job.clear_membership_history();
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Cancel(grpc::ServerContext* context,
                                        const JobRequest* request,
                                        CancelResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Cancel", request->job_id());
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(table_->Cancel(request->job_id(), absl::Now()));
}

grpc::Status CoordinatorService::Scale(grpc::ServerContext* context,
                                       const ScaleRequest* request,
                                       ScaleResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Scale", request->job_id());
      !denied.ok()) {
    return denied;
  }
  ScaleTarget target;
  target.num_workers = request->num_workers();
  target.num_ps = request->num_ps();
  target.at_step = request->at_step();
  absl::StatusOr<Membership> membership =
      table_->Scale(request->job_id(), target, absl::Now());
  if (!membership.ok()) return ToGrpcStatus(membership.status());
  *response->mutable_membership() = *std::move(membership);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Register(grpc::ServerContext* context,
                                          const RegisterRequest* request,
                                          RegisterResponse* response) {
  const TaskRef& t = request->task();
  if (grpc::Status denied =
          Authorize(*context, "Register", t.job_id(), t.role(), t.index());
      !denied.ok()) {
    return denied;
  }
  if (request->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "register: the task's address is empty");
  }
  return ToGrpcStatus(table_->Register(t.job_id(), t.role(), t.index(),
                                       request->address(), absl::Now()));
}

grpc::Status CoordinatorService::WaitForLayout(grpc::ServerContext* context,
                                               const JobRequest* request,
                                               ClusterLayout* response) {
  if (grpc::Status denied =
          Authorize(*context, "WaitForLayout", request->job_id());
      !denied.ok()) {
    return denied;
  }
  LongPoll poll(this, CallerName(*context));
  if (!poll.status().ok()) return poll.status();
  absl::StatusOr<std::vector<std::string>> addresses = table_->WaitForLayout(
      request->job_id(), Deadline(context), Cancelled(context));
  if (!addresses.ok()) return ToGrpcStatus(addresses.status());
  absl::StatusOr<JobInfo> job =
      table_->Get(request->job_id(), JobTable::kNoLog);
  if (!job.ok()) return ToGrpcStatus(job.status());
  // The table answers the layout's shards (an elastic-shard job: the
  // applied membership's), then every worker task.
  const int num_ps =
      static_cast<int>(addresses->size()) - WorkerTaskCount(job->spec());
  response->set_generation(JobRestarts(*job));
  for (int i = 0; i < static_cast<int>(addresses->size()); ++i) {
    if (i < num_ps) {
      response->add_ps_addresses((*addresses)[i]);
    } else {
      response->add_worker_addresses((*addresses)[i]);
    }
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const HeartbeatRequest* request,
                                           HeartbeatResponse* response) {
  const TaskRef& t = request->task();
  if (grpc::Status denied =
          Authorize(*context, "Heartbeat", t.job_id(), t.role(), t.index());
      !denied.ok()) {
    return denied;
  }
  bool restart = false;
  absl::StatusOr<JobState> state =
      table_->Heartbeat(*request, absl::Now(), &restart, response);
  if (!state.ok()) return ToGrpcStatus(state.status());
  response->set_state(*state);
  response->set_restart(restart && !JobEnded(*state));
  response->set_server_time_us(absl::ToUnixMicros(absl::Now()));
  if (JobEnded(*state) || response->restart()) {
    absl::StatusOr<JobInfo> job =
        table_->Get(request->task().job_id(), JobTable::kNoLog);
    if (job.ok() && !response->restart()) {
      response->set_message(job->message());
    }
    // A restart says why: the task's message ("restarted with every
    // worker: worker 1 died (signal 9)").
    if (job.ok() && response->restart()) {
      for (const TaskInfo& task : job->tasks()) {
        if (task.role() == t.role() && task.index() == t.index()) {
          response->set_message(task.message());
        }
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::TaskFinished(
    grpc::ServerContext* context, const TaskFinishedRequest* request,
    TaskFinishedResponse* response) {
  const TaskRef& t = request->task();
  if (grpc::Status denied =
          Authorize(*context, "TaskFinished", t.job_id(), t.role(), t.index());
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(table_->TaskFinished(*request, absl::Now()));
}

grpc::Status CoordinatorService::RestartTask(grpc::ServerContext* context,
                                             const RestartTaskRequest* request,
                                             RestartTaskResponse* response) {
  const TaskRef& t = request->task();
  if (grpc::Status denied =
          Authorize(*context, "RestartTask", t.job_id(), t.role(), t.index());
      !denied.ok()) {
    return denied;
  }
  absl::StatusOr<int> restarts = table_->TaskRestarting(
      t.job_id(), t.role(), t.index(),
      request->why().empty() ? "died" : request->why(), absl::Now());
  if (!restarts.ok()) return ToGrpcStatus(restarts.status());
  response->set_restarts(*restarts);
  absl::StatusOr<JobInfo> job = table_->Get(t.job_id(), JobTable::kNoLog);
  if (job.ok()) response->set_max_restarts(job->spec().max_restarts());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::KvSet(grpc::ServerContext* context,
                                       const KvSetRequest* request,
                                       KvSetResponse* response) {
  if (grpc::Status denied = Authorize(*context, "KvSet", request->job_id());
      !denied.ok()) {
    return denied;
  }
  if (request->key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "kv set: the key is empty");
  }
  if (authorizer_.enabled()) {
    // Authorize() passed: the caller is a worker of the job.
    absl::StatusOr<TlsIdentity> caller = PeerIdentity(*context);
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    const int owner = KvKeyOwner(request->key());
    if (owner != caller->index) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat(
              IdentityName(*caller),
              " may not call /pstrain.Coordinator/KvSet for key \"",
              request->key(), "\" of job ", request->job_id(), ": it is ",
              owner >= 0 ? absl::StrCat("worker ", owner, "'s") : "no worker's",
              "; a worker sets only its own keys (worker-<i>/..., "
              "<prefix>/<i>, <prefix>/rank_<i>; <prefix>/nccl_id, "
              "<prefix>/world: worker 0)"));
    }
  }
  return ToGrpcStatus(
      table_->Set(request->job_id(), request->key(), request->value()));
}

grpc::Status CoordinatorService::KvWait(grpc::ServerContext* context,
                                        const KvWaitRequest* request,
                                        KvWaitResponse* response) {
  if (grpc::Status denied = Authorize(*context, "KvWait", request->job_id());
      !denied.ok()) {
    return denied;
  }
  LongPoll poll(this, CallerName(*context));
  if (!poll.status().ok()) return poll.status();
  absl::StatusOr<std::string> value = table_->WaitForKey(
      request->job_id(), request->key(), Deadline(context), Cancelled(context));
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

}  // namespace pstrain
