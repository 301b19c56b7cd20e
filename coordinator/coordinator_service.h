// The Coordinator gRPC service (proto/coordinator.proto) over a JobTable:
// converts messages and statuses, fills and validates submitted specs, and
// bounds every blocking wait by the caller's deadline and `max_wait`.
//
// Two rules of its own, beside common/authz.h's:
//  - Long polls (WaitForLayout, KvWait) in flight are capped per caller
//    (`max_long_polls_per_caller`): past the cap a call is
//    RESOURCE_EXHAUSTED at once, so that one key cannot take the server's
//    threads from other jobs. The caller is its certificate's identity
//    ("worker:0@job-1") on a TLS server, its IP address on a plaintext one.
//    A long poll whose caller cancels it or goes away ends within about
//    JobTable::kCancelledCheckInterval, freeing its thread and its place
//    under the cap; JobTable::StopWaits() ends them all (UNAVAILABLE).
//  - On a TLS server a worker sets only its own keys (KvKeyOwner in
//    job_table.h): another worker's key is PERMISSION_DENIED.
//
// Thread-safety: gRPC calls the methods concurrently; the JobTable is
// thread-safe; the long-poll counts are guarded by their own mutex.
#ifndef PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
#define PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
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
  // `max_long_polls_per_caller` >= 1.
  CoordinatorService(JobTable* table, absl::Duration max_wait,
                     bool authorize = false,
                     int max_long_polls_per_caller = kMaxLongPollsPerCaller)
      : table_(table),
        max_wait_(max_wait),
        authorizer_(authorize),
        max_long_polls_(max_long_polls_per_caller) {}

  // Default long polls one caller may have in flight: a task waits for one
  // thing at a time (its layout, or one rendezvous key), and a certificate
  // of job "*" is one caller across its jobs.
  static constexpr int kMaxLongPollsPerCaller = 64;

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
  // The admin only (common/authz.h): JobTable::Scale.
  grpc::Status Scale(grpc::ServerContext* context, const ScaleRequest* request,
                     ScaleResponse* response) override;
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
  // Whether the call was cancelled (by its caller, or its connection
  // lost): the long polls' `cancelled` (job_table.h).
  static std::function<bool()> Cancelled(grpc::ServerContext* context);

  // The caller may call `method` (common/authz.h) about `job`, as task
  // (`role`, `index`) where the rule names one.
  grpc::Status Authorize(const grpc::ServerContext& context, const char* method,
                         const std::string& job,
                         TaskRole role = ROLE_UNSPECIFIED,
                         int index = -1) const;

  // "worker:0@job-1" (TLS) or "ipv4:10.0.0.4" (plaintext).
  std::string CallerName(const grpc::ServerContext& context) const;

  // One long poll of a caller, counted while it lives; ok() is false past
  // the caller's cap (and then it counts nothing).
  class LongPoll {
   public:
    LongPoll(CoordinatorService* service, std::string caller);
    ~LongPoll();
    LongPoll(const LongPoll&) = delete;
    LongPoll& operator=(const LongPoll&) = delete;
    // OK, or RESOURCE_EXHAUSTED naming the caller and the cap.
    grpc::Status status() const { return status_; }

   private:
    CoordinatorService* const service_;
    const std::string caller_;
    grpc::Status status_;
  };

  JobTable* const table_;
  const absl::Duration max_wait_;
  const Authorizer authorizer_;
  const int max_long_polls_;
  absl::Mutex polls_mu_;
  absl::flat_hash_map<std::string, int> polls_ ABSL_GUARDED_BY(polls_mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_COORDINATOR_SERVICE_H_
