#include "coordinator/task_agent.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "coordinator/job_table.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {
namespace {

// Every request carries the whole queue, so no request has more lines than
// the coordinator accepts in one.
constexpr size_t kMaxPendingLines = JobTable::kMaxLogLinesPerRequest;

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Wait for the channel to connect rather than failing at once: tasks may
  // start before the coordinator.
  context->set_wait_for_ready(true);
}

}  // namespace

bool RetryableCoordinatorStatus(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

grpc::Status CallCoordinatorWithRetry(
    absl::Duration rpc_timeout, absl::Duration budget,
    const std::function<grpc::Status(grpc::ClientContext*)>& call,
    const std::function<void(const grpc::Status&)>& on_retry) {
  const absl::Time give_up = absl::Now() + budget;
  while (true) {
    grpc::ClientContext context;
    // No try outlasts the budget (rpc_timeout 30 s, budget 5 s: 5 s).
    SetDeadline(&context, std::min(rpc_timeout, std::max(give_up - absl::Now(),
                                                         absl::Seconds(1))));
    const grpc::Status status = call(&context);
    if (status.ok() || !RetryableCoordinatorStatus(status)) return status;
    // No try after the budget: one that would start past it is not made.
    if (absl::Now() + kCoordinatorRetryInterval > give_up) return status;
    if (on_retry) on_retry(status);
    absl::SleepFor(kCoordinatorRetryInterval);
  }
}

grpc::ChannelArguments CoordinatorChannelArguments() {
  grpc::ChannelArguments args;
  SetPeerServerName(TlsIdentity{TlsRole::kCoordinator}, &args);
  args.SetMaxReceiveMessageSize(kMaxCoordinatorAnswerBytes);
  return args;
}

TaskAgent::TaskAgent(TaskAgentOptions options)
    : options_(std::move(options)),
      heartbeat_interval_(options_.heartbeat_interval) {
  TlsIdentity self;
  self.role = options_.role == ROLE_PS ? TlsRole::kPs : TlsRole::kWorker;
  self.index = options_.index;
  self.job = options_.job_id;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(options_.tls, self);
  // Checked by the caller (TaskAgentOptionsFromFlags); files that stopped
  // loading since end the task (exit 2 naming the file), never plaintext.
  if (!credentials.ok()) {
    std::fprintf(stderr, "%s: %s\n", name().c_str(),
                 std::string(credentials.status().message()).c_str());
    std::exit(2);
  }
  stub_ = Coordinator::NewStub(grpc::CreateCustomChannel(
      options_.coordinator, *credentials, CoordinatorChannelArguments()));
}

TaskAgent::~TaskAgent() { StopHeartbeats(); }

std::string TaskAgent::name() const {
  return absl::StrCat(TaskName(options_.role, options_.index), " of ",
                      options_.job_id);
}

TaskRef TaskAgent::Ref() const {
  TaskRef ref;
  ref.set_job_id(options_.job_id);
  ref.set_role(options_.role);
  ref.set_index(options_.index);
  return ref;
}

template <typename Request>
void TaskAgent::TakePending(Request* request) {
  absl::MutexLock lock(&mu_);
  for (std::string& line : pending_lines_) {
    request->add_log_lines(std::move(line));
  }
  for (int64_t ms : pending_times_ms_) request->add_log_times_ms(ms);
  pending_lines_.clear();
  pending_times_ms_.clear();
  request->set_steps(steps_);
  request->set_samples_per_sec(samples_per_sec_);
  if (result_ != nullptr) *request->mutable_result() = *std::move(result_);
  result_.reset();
  if constexpr (std::is_same_v<Request, HeartbeatRequest>) {
    if (applied_.has_value())
      *request->mutable_membership_applied() = *applied_;
    request->set_prepared(prepared_);
  }
}

grpc::Status TaskAgent::CallWithRetry(
    absl::Duration budget,
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const grpc::Status status =
      CallCoordinatorWithRetry(options_.rpc_timeout, budget, call);
  return RetryableCoordinatorStatus(status) ? WhyUnreachable(status) : status;
}

grpc::Status TaskAgent::WhyUnreachable(const grpc::Status& status) const {
  TlsIdentity self;
  self.role = options_.role == ROLE_PS ? TlsRole::kPs : TlsRole::kWorker;
  self.index = options_.index;
  self.job = options_.job_id;
  // A TLS handshake that fails looks like an unreachable coordinator to
  // gRPC; one probe says which it is.
  const absl::Status tls =
      CheckTlsPeer(options_.tls, self, options_.coordinator,
                   TlsIdentity{TlsRole::kCoordinator});
  if (tls.ok()) return status;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      std::string(tls.message()));
}

absl::StatusOr<JobSpec> TaskAgent::FetchSpec() {
  JobRequest request;
  request.set_job_id(options_.job_id);
  request.set_log_since(JobTable::kNoLog);
  EscapeNonUtf8Fields(&request);
  JobInfo job;
  const grpc::Status status = CallWithRetry(
      options_.coordinator_timeout, [&](grpc::ClientContext* context) {
        return stub_->GetJob(context, request, &job);
      });
  if (!status.ok()) {
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("coordinator ", options_.coordinator, ": ",
                                     status.error_message()));
  }
  if (JobEnded(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.id(), " has ended (", JobStateName(job.state()), ")",
                     job.message().empty() ? "" : ": ", job.message()));
  }
  return job.spec();
}

absl::Status TaskAgent::ReportOwnRestart() {
  const absl::Time give_up = absl::Now() + options_.coordinator_timeout;
  while (true) {
    JobRequest request;
    request.set_job_id(options_.job_id);
    request.set_log_since(JobTable::kNoLog);
    EscapeNonUtf8Fields(&request);
    JobInfo job;
    const grpc::Status read = CallWithRetry(
        options_.coordinator_timeout, [&](grpc::ClientContext* context) {
          return stub_->GetJob(context, request, &job);
        });
    if (!read.ok()) {
      return absl::Status(FromGrpcStatus(read).code(),
                          absl::StrCat("coordinator ", options_.coordinator,
                                       ": ", read.error_message()));
    }
    // An ended job or an index out of range: Register says so.
    if (JobEnded(job.state())) return absl::OkStatus();
    const TaskInfo* slot = nullptr;
    for (const TaskInfo& t : job.tasks()) {
      if (t.role() == options_.role && t.index() == options_.index) slot = &t;
    }
    if (slot == nullptr) return absl::OkStatus();
    if (slot->state() == TASK_WAITING) {
      // The first process of this task, or one after a restart already
      // reported (by this loop before a lost answer, or the allreduce
      // restart of every worker).
      rejoining_ = slot->restarts() > 0 || slot->restart_requested();
      return absl::OkStatus();
    }
    // A standby not registered yet: this is its first process.
    if (slot->state() == TASK_STANDBY && slot->address().empty()) {
      return absl::OkStatus();
    }
    // Held by a predecessor: report its death. One try per reading of the
    // slot, so that an answer lost in transit is not counted twice.
    RestartTaskRequest restart;
    *restart.mutable_task() = Ref();
    restart.set_why(
        absl::StrCat("died; restarted by its container's restart "
                     "policy (",
                     kSelfRestartVariable, "=1)"));
    EscapeNonUtf8Fields(&restart);
    RestartTaskResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    const grpc::Status status =
        stub_->RestartTask(&context, restart, &response);
    if (status.ok()) {
      rejoining_ = true;
      std::printf(
          "%s: reported its own restart to coordinator %s (restart "
          "%d of %d)\n",
          name().c_str(), options_.coordinator.c_str(), response.restarts(),
          response.max_restarts());
      std::fflush(stdout);
      return absl::OkStatus();
    }
    if (!RetryableCoordinatorStatus(status) || absl::Now() > give_up) {
      const grpc::Status why =
          RetryableCoordinatorStatus(status) ? WhyUnreachable(status) : status;
      return absl::Status(
          FromGrpcStatus(why).code(),
          absl::StrCat("reporting the restart of ", name(), " to coordinator ",
                       options_.coordinator, ": ", why.error_message()));
    }
    absl::SleepFor(kCoordinatorRetryInterval);
  }
}

absl::Status TaskAgent::Register(const std::string& address) {
  if (options_.self_restart && !self_restart_checked_) {
    self_restart_checked_ = true;
    RETURN_IF_ERROR(ReportOwnRestart());
  }
  RegisterRequest request;
  *request.mutable_task() = Ref();
  request.set_address(address);
  EscapeNonUtf8Fields(&request);
  RegisterResponse response;
  // A retried registration from the same address is a no-op, so retrying
  // after a lost answer is safe.
  const grpc::Status status = CallWithRetry(
      options_.coordinator_timeout, [&](grpc::ClientContext* context) {
        return stub_->Register(context, request, &response);
      });
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      FromGrpcStatus(status).code(),
      absl::StrCat("register with coordinator ", options_.coordinator, ": ",
                   status.error_message()));
}

absl::StatusOr<ClusterLayout> TaskAgent::WaitForLayout() {
  absl::Time last_contact = absl::Now();
  while (true) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    JobRequest request;
    request.set_job_id(options_.job_id);
    EscapeNonUtf8Fields(&request);
    ClusterLayout layout;
    const grpc::Status status =
        stub_->WaitForLayout(&context, request, &layout);
    if (status.ok()) return layout;
    // DEADLINE_EXCEEDED from the coordinator means tasks are still missing;
    // the coordinator fails the job if they never come.
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      last_contact = absl::Now();
      continue;
    }
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() - last_contact > options_.coordinator_timeout) {
      return absl::Status(FromGrpcStatus(status).code(),
                          absl::StrCat("waiting for the cluster layout: ",
                                       status.error_message()));
    }
    absl::SleepFor(kCoordinatorRetryInterval);
  }
}

absl::Status TaskAgent::KvSet(const std::string& key,
                              const std::string& value) {
  KvSetRequest request;
  request.set_job_id(options_.job_id);
  request.set_key(key);
  request.set_value(value);
  EscapeNonUtf8Fields(&request);
  KvSetResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, [&](grpc::ClientContext* context) {
        return stub_->KvSet(context, request, &response);
      });
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      FromGrpcStatus(status).code(),
      absl::StrCat("setting key \"", key, "\": ", status.error_message()));
}

absl::StatusOr<std::string> TaskAgent::KvWait(const std::string& key,
                                              absl::Duration timeout) {
  KvWaitRequest request;
  request.set_job_id(options_.job_id);
  request.set_key(key);
  EscapeNonUtf8Fields(&request);
  KvWaitResponse response;
  // A stopping coordinator ends the poll UNAVAILABLE: it is asked again
  // (its successor answers) until `timeout`, as every other call rides
  // out a restart.
  const grpc::Status status = CallCoordinatorWithRetry(
      timeout, timeout, [&](grpc::ClientContext* context) {
        return stub_->KvWait(context, request, &response);
      });
  if (!status.ok()) {
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("waiting for key \"", key,
                                     "\": ", status.error_message()));
  }
  return response.value();
}

void TaskAgent::StartHeartbeats(
    std::function<void(JobState, const std::string&)> on_end,
    std::function<void(const std::string&)> on_restart,
    std::function<void()> on_removed) {
  heartbeats_ = std::thread([this, on_end = std::move(on_end),
                             on_restart = std::move(on_restart),
                             on_removed = std::move(on_removed)] {
    HeartbeatLoop(on_end, on_restart, on_removed);
    absl::MutexLock lock(&mu_);
    heartbeats_over_ = true;
  });
}

bool TaskAgent::NoteMembership(const HeartbeatResponse& response) {
  absl::MutexLock lock(&mu_);
  if (response.has_membership() &&
      (!membership_.has_value() ||
       response.membership().epoch() >= membership_->epoch())) {
    membership_ = response.membership();
    if (response.has_applied_membership()) {
      applied_membership_ = response.applied_membership();
    }
  }
  const bool newly_removed = response.removed() && !removed_;
  removed_ |= response.removed();
  removed_workers_.assign(response.removed_workers().begin(),
                          response.removed_workers().end());
  return newly_removed;
}

std::optional<Membership> TaskAgent::membership() const {
  absl::MutexLock lock(&mu_);
  return membership_;
}

std::optional<Membership> TaskAgent::applied_membership() const {
  absl::MutexLock lock(&mu_);
  return applied_membership_;
}

bool TaskAgent::removed() const {
  absl::MutexLock lock(&mu_);
  return removed_;
}

std::vector<int> TaskAgent::removed_workers() const {
  absl::MutexLock lock(&mu_);
  return removed_workers_;
}

absl::StatusOr<Membership> TaskAgent::WaitForMembership(int64_t min_epoch,
                                                        absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto arrived = [this, min_epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return heartbeats_over_ ||
           (membership_.has_value() && membership_->epoch() >= min_epoch);
  };
  mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline);
  if (membership_.has_value() && membership_->epoch() >= min_epoch) {
    return *membership_;
  }
  if (heartbeats_over_) {
    return absl::CancelledError(
        absl::StrCat(name(), ": the heartbeats stopped before membership ",
                     min_epoch, " arrived"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      name(), ": membership ", min_epoch, " did not arrive in time"));
}

void TaskAgent::SetPrepared() {
  absl::MutexLock lock(&mu_);
  prepared_ = true;
  wake_ = true;  // the others' grow waits for it
}

void TaskAgent::SetMembershipApplied(const MembershipApplied& applied) {
  absl::MutexLock lock(&mu_);
  applied_ = applied;
  // Sent at once: the other workers' recoveries ask the coordinator for
  // the applied membership's shards (WaitForLayout).
  wake_ = true;
}

absl::StatusOr<ClockOffset> TaskAgent::MeasureClockOffset(int samples) {
  std::optional<ClockOffset> best;
  for (int i = 0; i < samples; ++i) {
    HeartbeatRequest request;
    *request.mutable_task() = Ref();
    EscapeNonUtf8Fields(&request);
    HeartbeatResponse response;
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    const int64_t t0 = absl::ToUnixMicros(absl::Now());
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    const int64_t t1 = absl::ToUnixMicros(absl::Now());
    if (!status.ok()) return FromGrpcStatus(status);
    if (response.server_time_us() == 0) {
      return absl::UnimplementedError(absl::StrCat(
          "coordinator ", options_.coordinator,
          " does not send its time (an older version); cannot measure the "
          "clock offset"));
    }
    if (!best.has_value() || t1 - t0 < best->rtt_us) {
      best = ClockOffset{response.server_time_us() - (t0 + t1) / 2, t1 - t0};
    }
  }
  if (!best.has_value()) {
    return absl::InvalidArgumentError("clock offset: samples must be > 0");
  }
  return *best;
}

void TaskAgent::set_heartbeat_interval(absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  heartbeat_interval_ = interval;
}

void TaskAgent::HeartbeatLoop(
    std::function<void(JobState, const std::string&)> on_end,
    std::function<void(const std::string&)> on_restart,
    std::function<void()> on_removed) {
  absl::Time last_contact = absl::Now();
  while (true) {
    {
      // Every interval, or at once on a membership applied or the stop.
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&wake_), heartbeat_interval_);
      wake_ = false;
    }
    if (stop_.HasBeenNotified()) return;
    HeartbeatRequest request;
    *request.mutable_task() = Ref();
    TakePending(&request);
    // A proto3 string that is not UTF-8 fails to parse at the coordinator
    // (INTERNAL, which ends the task); a task's lines quote file names
    // and other bytes as they come.
    EscapeNonUtf8Fields(&request);
    grpc::ClientContext context;
    // No wait_for_ready: a heartbeat that cannot be sent now is retried at
    // the next interval.
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.ok()) {
      last_contact = absl::Now();
      if (request.has_membership_applied()) {
        absl::MutexLock lock(&mu_);
        // Answered: sent no more, unless a newer report replaced it.
        if (applied_.has_value() &&
            applied_->epoch() == request.membership_applied().epoch()) {
          applied_.reset();
        }
      }
      if (NoteMembership(response) && on_removed) on_removed();
      if (JobEnded(response.state())) {
        on_end(response.state(), response.message());
        return;
      }
      if (response.restart() && on_restart) {
        on_restart(response.message());
        return;
      }
      continue;
    }
    {
      // Not delivered: send these lines again next time.
      absl::MutexLock lock(&mu_);
      for (int i = request.log_lines_size() - 1; i >= 0; --i) {
        pending_lines_.push_front(request.log_lines(i));
        pending_times_ms_.push_front(i < request.log_times_ms_size()
                                         ? request.log_times_ms(i)
                                         : absl::ToUnixMillis(absl::Now()));
      }
      while (pending_lines_.size() > kMaxPendingLines) {
        pending_lines_.pop_front();
        pending_times_ms_.pop_front();
      }
    }
    if (!RetryableCoordinatorStatus(status)) {
      on_end(JOB_FAILED,
             absl::StrCat("heartbeat refused by coordinator ",
                          options_.coordinator, ": ", status.error_message()));
      return;
    }
    if (absl::Now() - last_contact > options_.coordinator_timeout) {
      on_end(JOB_FAILED,
             absl::StrCat("coordinator ", options_.coordinator,
                          " unreachable for ",
                          absl::ToInt64Seconds(absl::Now() - last_contact),
                          " s: ", status.error_message()));
      return;
    }
  }
}

void TaskAgent::StopHeartbeats() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    absl::MutexLock lock(&mu_);
    wake_ = true;
  }
  if (heartbeats_.joinable() &&
      heartbeats_.get_id() != std::this_thread::get_id()) {
    heartbeats_.join();
  }
}

void TaskAgent::Log(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  absl::MutexLock lock(&mu_);
  pending_lines_.push_back(line);
  pending_times_ms_.push_back(absl::ToUnixMillis(absl::Now()));
  if (pending_lines_.size() > kMaxPendingLines) {
    pending_lines_.pop_front();
    pending_times_ms_.pop_front();
  }
}

void TaskAgent::SetResult(const RunResult& result) {
  absl::MutexLock lock(&mu_);
  result_ = std::make_unique<RunResult>(result);
}

void TaskAgent::SetProgress(int64_t steps, double samples_per_sec) {
  absl::MutexLock lock(&mu_);
  steps_ = steps;
  samples_per_sec_ = samples_per_sec;
}

absl::Status TaskAgent::Finish(bool ok, const std::string& message,
                               const RunResult* result) {
  StopHeartbeats();
  TaskFinishedRequest request;
  *request.mutable_task() = Ref();
  request.set_ok(ok);
  request.set_message(message);
  TakePending(&request);
  if (result != nullptr) *request.mutable_result() = *result;
  EscapeNonUtf8Fields(&request);
  TaskFinishedResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, [&](grpc::ClientContext* context) {
        return stub_->TaskFinished(context, request, &response);
      });
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      FromGrpcStatus(status).code(),
      absl::StrCat("reporting the end of ", name(), " to coordinator ",
                   options_.coordinator, ": ", status.error_message()));
}

}  // namespace pstrain
