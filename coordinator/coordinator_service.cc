#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/status.h"
#include "coordinator/job_spec.h"

namespace pstrain {

absl::Time CoordinatorService::Deadline(
    const grpc::ServerContext* context) const {
  absl::Time deadline = absl::Now() + max_wait_;
  const auto client = context->deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(client));
  }
  return deadline;
}

grpc::Status CoordinatorService::Submit(grpc::ServerContext* context,
                                        const SubmitRequest* request,
                                        SubmitResponse* response) {
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
  absl::StatusOr<JobInfo> job =
      table_->Get(request->job_id(), request->log_since());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const ListJobsRequest* request,
                                          ListJobsResponse* response) {
  for (JobInfo& job : table_->List()) *response->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Cancel(grpc::ServerContext* context,
                                        const JobRequest* request,
                                        CancelResponse* response) {
  return ToGrpcStatus(table_->Cancel(request->job_id(), absl::Now()));
}

grpc::Status CoordinatorService::Register(grpc::ServerContext* context,
                                          const RegisterRequest* request,
                                          RegisterResponse* response) {
  const TaskRef& t = request->task();
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
  absl::StatusOr<std::vector<std::string>> addresses =
      table_->WaitForLayout(request->job_id(), Deadline(context));
  if (!addresses.ok()) return ToGrpcStatus(addresses.status());
  absl::StatusOr<JobInfo> job =
      table_->Get(request->job_id(), JobTable::kNoLog);
  if (!job.ok()) return ToGrpcStatus(job.status());
  const int num_ps = job->spec().num_ps();
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
  absl::StatusOr<JobState> state = table_->Heartbeat(*request, absl::Now());
  if (!state.ok()) return ToGrpcStatus(state.status());
  response->set_state(*state);
  if (JobEnded(*state)) {
    absl::StatusOr<JobInfo> job =
        table_->Get(request->task().job_id(), JobTable::kNoLog);
    if (job.ok()) response->set_message(job->message());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::TaskFinished(
    grpc::ServerContext* context, const TaskFinishedRequest* request,
    TaskFinishedResponse* response) {
  return ToGrpcStatus(table_->TaskFinished(*request, absl::Now()));
}

grpc::Status CoordinatorService::KvSet(grpc::ServerContext* context,
                                       const KvSetRequest* request,
                                       KvSetResponse* response) {
  if (request->key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "kv set: the key is empty");
  }
  return ToGrpcStatus(
      table_->Set(request->job_id(), request->key(), request->value()));
}

grpc::Status CoordinatorService::KvWait(grpc::ServerContext* context,
                                        const KvWaitRequest* request,
                                        KvWaitResponse* response) {
  absl::StatusOr<std::string> value =
      table_->WaitForKey(request->job_id(), request->key(), Deadline(context));
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

}  // namespace pstrain
