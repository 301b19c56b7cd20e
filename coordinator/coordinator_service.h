// The Coordinator gRPC service (proto/coordinator.proto) over a JobTable:
// converts messages and statuses, fills and validates submitted specs, and
// bounds every blocking wait by the caller's deadline and `max_wait`.
//
// Thread-safety: gRPC calls the methods concurrently; the JobTable is
// thread-safe.
#ifndef PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
#define PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_

#include "absl/time/time.h"
#include "common/authz.h"
#include "coordinator/job_table.h"
#include "proto/coordinator.grpc.pb.h"

namespace pstrain {

class CoordinatorService final : public Coordinator::Service {
 public:
  // `table` is not owned and must outlive the service. `authorize`: check
  // every call's certificate against common/authz.h (a TLS server); false:
  // a plaintext server, every call allowed.
  CoordinatorService(JobTable* table, absl::Duration max_wait,
                     bool authorize = false)
      : table_(table), max_wait_(max_wait), authorizer_(authorize) {}

  grpc::Status Submit(grpc::ServerContext* context,
                      const SubmitRequest* request,
                      SubmitResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const JobRequest* request,
                      JobInfo* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const ListJobsRequest* request,
                        ListJobsResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const JobRequest* request,
                      CancelResponse* response) override;
  grpc::Status Register(grpc::ServerContext* context,
                        const RegisterRequest* request,
                        RegisterResponse* response) override;
  grpc::Status WaitForLayout(grpc::ServerContext* context,
                             const JobRequest* request,
                             ClusterLayout* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const HeartbeatRequest* request,
                         HeartbeatResponse* response) override;
  grpc::Status TaskFinished(grpc::ServerContext* context,
                            const TaskFinishedRequest* request,
                            TaskFinishedResponse* response) override;
  grpc::Status RestartTask(grpc::ServerContext* context,
                           const RestartTaskRequest* request,
                           RestartTaskResponse* response) override;
  grpc::Status KvSet(grpc::ServerContext* context, const KvSetRequest* request,
                     KvSetResponse* response) override;
  grpc::Status KvWait(grpc::ServerContext* context,
                      const KvWaitRequest* request,
                      KvWaitResponse* response) override;

 private:
  // The earlier of the caller's deadline and now + max_wait_.
  absl::Time Deadline(const grpc::ServerContext* context) const;

  // The caller may call `method` (common/authz.h) about `job`, as task
  // (`role`, `index`) where the rule names one.
  grpc::Status Authorize(const grpc::ServerContext& context,
                         const char* method, const std::string& job,
                         TaskRole role = ROLE_UNSPECIFIED,
                         int index = -1) const;

  JobTable* const table_;
  const absl::Duration max_wait_;
  const Authorizer authorizer_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
