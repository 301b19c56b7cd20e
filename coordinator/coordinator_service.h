// The Coordinator gRPC service (proto/coordinator.proto) over a JobTable:
// converts messages and statuses, fills and validates submitted specs, and
// bounds every blocking wait by the caller's deadline and `max_wait`.
//
// Thread-safety: gRPC calls the methods concurrently; the JobTable is
// thread-safe.
#ifndef PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
#define PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_

#include "absl/time/time.h"
#include "coordinator/job_table.h"
#include "proto/coordinator.grpc.pb.h"

namespace pstrain {

class CoordinatorService final : public Coordinator::Service {
 public:
  // `table` is not owned and must outlive the service.
  CoordinatorService(JobTable* table, absl::Duration max_wait)
      : table_(table), max_wait_(max_wait) {}

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
  grpc::Status KvSet(grpc::ServerContext* context, const KvSetRequest* request,
                     KvSetResponse* response) override;
  grpc::Status KvWait(grpc::ServerContext* context,
                      const KvWaitRequest* request,
                      KvWaitResponse* response) override;

 private:
  // The earlier of the caller's deadline and now + max_wait_.
  absl::Time Deadline(const grpc::ServerContext* context) const;

  JobTable* const table_;
  const absl::Duration max_wait_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
