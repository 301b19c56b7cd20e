#include "cli/node_supervisor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/status.h"
#include "common/utf8.h"
#include "coordinator/job_table.h"
#include "coordinator/task_agent.h"
#include "grpcpp/grpcpp.h"
#include "worker/checkpoint.h"

namespace pstrain {
namespace {

// SIGTERM to SIGKILL when the supervisor stops its tasks.
constexpr absl::Duration kStopGrace = absl::Seconds(3);
// Deadlines of the supervisor's calls to the coordinator.
constexpr std::chrono::seconds kReadDeadline(10);
constexpr std::chrono::seconds kRestartDeadline(30);

TlsRole TlsRoleOf(TaskRole role) {
  return role == ROLE_PS ? TlsRole::kPs : TlsRole::kWorker;
}

// "exit code 3", "signal 9" (ChildExit.code: -signal).
std::string ExitStatus(const ChildExit& exit) {
  return exit.code > 0 ? absl::StrCat("exit code ", exit.code)
                       : absl::StrCat("signal ", -exit.code);
}

void SetDeadline(grpc::ClientContext* context, std::chrono::seconds after) {
  context->set_deadline(std::chrono::system_clock::now() + after);
}

}  // namespace

std::string SupervisedTask::key() const {
  return absl::StrCat(role == ROLE_PS ? "ps" : "worker", index);
}

absl::StatusOr<std::unique_ptr<Coordinator::Stub>> CoordinatorStubAs(
    const std::string& address, const TlsOptions& tls,
    const TlsIdentity& self) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(tls, self);
  if (!credentials.ok()) return credentials.status();
  return Coordinator::NewStub(grpc::CreateCustomChannel(
      address, *credentials, CoordinatorChannelArguments()));
}

NodeSupervisor::NodeSupervisor(SupervisorOptions options)
    : options_(std::move(options)) {}

NodeSupervisor::~NodeSupervisor() { cluster_.StopAll(kStopGrace); }

absl::Status NodeSupervisor::Start(const std::vector<SupervisedTask>& tasks) {
  for (const SupervisedTask& task : tasks) {
    const std::string key = task.key();
    tasks_[key] = task;
    if (absl::Status s = cluster_.Start(key, task.argv, task.env); !s.ok()) {
      cluster_.StopAll(kStopGrace);
      return absl::InternalError(
          absl::StrCat("cannot start ", key, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

SupervisorResult NodeSupervisor::Run() {
  while (cluster_.num_running() > 0) {
    if (options_.stop_signal != nullptr && *options_.stop_signal != 0) {
      const int signal = *options_.stop_signal;
      if (options_.on_signal) options_.on_signal();
      cluster_.StopAll(kStopGrace);
      result_.signal = signal;
      result_.exit_code = 128 + signal;
      return result_;
    }
    const ChildExit exit = cluster_.WaitAny(options_.poll);
    if (!exit.role.empty()) OnExit(exit);
    PollJob();
    StartMore();
    if (absl::Now() >= stop_at_) StopAfterGrace();
  }
  return result_;
}

std::string NodeSupervisor::Name(const SupervisedTask& task) const {
  return options_.names == TaskNames::kJobLog ? TaskName(task.role, task.index)
                                              : task.key();
}

absl::StatusOr<Coordinator::Stub*> NodeSupervisor::Stub(
    const SupervisedTask* task) {
  const std::string key = task == nullptr ? "" : task->key();
  if (auto it = stubs_.find(key); it != stubs_.end()) return it->second.get();
  TlsIdentity as{TlsRole::kWorker, 0, options_.job_id};
  if (task != nullptr) {
    as = TlsIdentity{TlsRoleOf(task->role), task->index, options_.job_id};
    if (!options_.tls.insecure) {
      // The certificate may name any job ("*").
      absl::StatusOr<TlsIdentity> own =
          TaskIdentityInFolder(options_.tls, as.role, as.index);
      if (own.ok()) as = *own;
    }
  } else if (!options_.tls.insecure) {
    absl::StatusOr<TlsIdentity> any =
        AnyTaskIdentityOfJob(options_.tls, options_.job_id);
    if (!any.ok()) return any.status();
    as = *any;
  }
  absl::StatusOr<std::unique_ptr<Coordinator::Stub>> made =
      CoordinatorStubAs(options_.coordinator, options_.tls, as);
  if (!made.ok()) return made.status();
  return (stubs_[key] = *std::move(made)).get();
}

bool NodeSupervisor::ReadJob() {
  absl::StatusOr<Coordinator::Stub*> stub = Stub(nullptr);
  if (!stub.ok()) return false;
  grpc::ClientContext context;
  SetDeadline(&context, kReadDeadline);
  JobRequest request;
  request.set_job_id(options_.job_id);
  request.set_log_since(JobTable::kNoLog);
  JobInfo job;
  if (!(*stub)->GetJob(&context, request, &job).ok()) return false;
  job_ = std::move(job);
  if (JobEnded(job_.state())) {
    stop_at_ = std::min(stop_at_, absl::Now() + options_.end_grace);
  }
  return true;
}

void NodeSupervisor::PollJob() {
  const absl::Time now = absl::Now();
  if (JobEnded(job_.state()) || now - last_read_ < options_.poll) return;
  last_read_ = now;
  ReadJob();
}

bool NodeSupervisor::OnExit(const ChildExit& exit) {
  if (exit.code == 0) return false;
  const SupervisedTask& task = tasks_[exit.role];
  if (!JobEnded(job_.state())) {
    last_read_ = absl::Now();
    ReadJob();
  }
  const bool running =
      !JobEnded(job_.state()) && result_.first_failure.role.empty();
  if (exit.code == kRestartExitCode && running) {
    std::printf("%s: %s stopped for the job's restart; starting it again\n",
                options_.program.c_str(), Name(task).c_str());
    std::fflush(stdout);
    if (StartAgain(task, /*rejoin=*/true)) return true;
  }
  const std::string status = ExitStatus(exit);
  deaths_.push_back(
      absl::StrCat(TaskName(task.role, task.index), " (", status, ")"));
  if (running && RestartOrReport(task, exit, status)) return true;
  if (running && Removed(task)) return false;
  if (!running) {
    ReportDeath(task, absl::StrCat("exited with ", status,
                                   exit.last_error_line.empty() ? "" : ": ",
                                   exit.last_error_line));
  }
  RecordFailure(task, exit);
  return false;
}

absl::StatusOr<RestartTaskResponse> NodeSupervisor::AskRestart(
    const SupervisedTask& task, const std::string& why) {
  ASSIGN_OR_RETURN(Coordinator::Stub * stub, Stub(&task));
  grpc::ClientContext context;
  SetDeadline(&context, kRestartDeadline);
  RestartTaskRequest request;
  request.mutable_task()->set_job_id(options_.job_id);
  request.mutable_task()->set_role(task.role);
  request.mutable_task()->set_index(task.index);
  request.set_why(why);
  RestartTaskResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(stub->RestartTask(&context, request, &response)));
  return response;
}

bool NodeSupervisor::RestartOrReport(const SupervisedTask& task,
                                     const ChildExit& exit,
                                     const std::string& status) {
  const int max_restarts = options_.spec.max_restarts();
  const std::string why = absl::StrCat("died (", status, ")");
  if (max_restarts > 0 && JobRestarts(job_) < max_restarts) {
    absl::StatusOr<RestartTaskResponse> restart = AskRestart(task, why);
    if (!restart.ok()) {
      PrintError(options_.program,
                 absl::StrCat("not restarting ", Name(task), ": ",
                              restart.status().message()));
      return false;
    }
    std::printf("%s: %s %s; %s (restart %d of %d)\n", options_.program.c_str(),
                Name(task).c_str(), why.c_str(),
                ModeOf(options_.spec) == MODE_ALLREDUCE
                    ? "restarting every worker from the newest checkpoint"
                    : "restarting it",
                restart->restarts(), restart->max_restarts());
    std::fflush(stdout);
    // A worker rejoins the job's step (worker/trainer.h); a shard starts
    // empty and the workers restore it.
    if (StartAgain(task, /*rejoin=*/task.role == ROLE_WORKER)) return true;
    ReportDeath(
        task, absl::StrCat("exited with ", status, "; cannot start it again"));
    return false;
  }
  std::string budget;
  if (max_restarts > 0) {
    const std::string& dir = options_.spec.checkpoint_dir();
    absl::StatusOr<CheckpointManifest> latest =
        dir.empty() ? absl::NotFoundError("") : ReadLatestCheckpoint(dir);
    budget = absl::StrCat(
        " (the restart budget, --max_restarts=", max_restarts,
        ", is spent; deaths: ", absl::StrJoin(deaths_, ", "),
        "; last checkpoint: ", latest.ok() ? latest->dir : "none", ")");
  }
  ReportDeath(task, absl::StrCat("exited with ", status, budget,
                                 exit.last_error_line.empty() ? "" : ": ",
                                 exit.last_error_line));
  return false;
}

void NodeSupervisor::ReportDeath(const SupervisedTask& task,
                                 const std::string& message) {
  absl::StatusOr<Coordinator::Stub*> stub = Stub(&task);
  if (!stub.ok()) return;
  grpc::ClientContext context;
  SetDeadline(&context, kReadDeadline);
  TaskFinishedRequest report;
  report.mutable_task()->set_job_id(options_.job_id);
  report.mutable_task()->set_role(task.role);
  report.mutable_task()->set_index(task.index);
  report.set_message(message);
  // The message ends with the task's last line, which may hold any bytes:
  // a string that is not UTF-8 would not parse at the coordinator
  // (INTERNAL), and the death would go unreported.
  EscapeNonUtf8Fields(&report);
  TaskFinishedResponse response;
  // An error changes nothing: the coordinator's heartbeat check finds the
  // task lost.
  (*stub)->TaskFinished(&context, report, &response);
}

bool NodeSupervisor::StartAgain(const SupervisedTask& task, bool rejoin) {
  std::vector<std::string> argv = task.argv;
  if (rejoin) argv.push_back("--rejoin");
  return cluster_.Start(task.key(), argv, task.env).ok();
}

void NodeSupervisor::RecordFailure(const SupervisedTask& task,
                                   const ChildExit& exit) {
  if (!result_.first_failure.role.empty()) return;
  result_.first_failure = exit;
  result_.exit_code = exit.code > 0 ? exit.code : 128 - exit.code;
  if (options_.on_failure) options_.on_failure(task, exit);
  stop_at_ = std::min(stop_at_, absl::Now() + options_.end_grace);
}

bool NodeSupervisor::Removed(const SupervisedTask& task) {
  last_read_ = absl::Now();
  if (!ReadJob() || JobEnded(job_.state())) return false;
  for (const TaskInfo& t : job_.tasks()) {
    if (t.role() != task.role || t.index() != task.index) continue;
    if (t.state() != TASK_REMOVED) return false;
    const bool shard = task.role == ROLE_PS;
    std::printf(
        "%s: %s removed from the job (%s); the job goes on with %d %s\n",
        options_.program.c_str(), Name(task).c_str(), t.message().c_str(),
        shard ? job_.membership().num_ps() : job_.membership().workers_size(),
        shard ? "shards" : "workers");
    std::fflush(stdout);
    return true;
  }
  return false;
}

void NodeSupervisor::StartMore() {
  if (!options_.more_tasks || JobEnded(job_.state()) ||
      !result_.first_failure.role.empty()) {
    return;
  }
  for (const SupervisedTask& task : options_.more_tasks()) {
    const std::string key = task.key();
    if (cluster_.Running(key)) continue;
    tasks_[key] = task;
    if (absl::Status s = cluster_.Start(key, task.argv, task.env); !s.ok()) {
      PrintError(options_.program,
                 absl::StrCat("cannot start ", Name(task), ": ", s.message()));
      ReportDeath(task, absl::StrCat("cannot start it: ", s.message()));
    }
  }
}

void NodeSupervisor::StopAfterGrace() {
  stop_at_ = absl::InfiniteFuture();
  if (options_.on_grace_over) {
    std::vector<SupervisedTask> running;
    for (const auto& [key, task] : tasks_) {
      if (cluster_.Running(key)) running.push_back(task);
    }
    options_.on_grace_over(job_.state(), running);
  }
  cluster_.StopAll(kStopGrace);
}

}  // namespace pstrain
