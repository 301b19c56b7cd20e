#include "tools/job_commands.h"

#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "host:port of pstrain_coordinator (submit, status, cancel, wait).");
ABSL_FLAG(int, rpc_timeout_s, 30, "Deadline of each coordinator call, s.");
ABSL_FLAG(int, wait_poll_ms, 1000, "wait: milliseconds between polls.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

std::unique_ptr<Coordinator::Stub> Stub() {
  return Coordinator::NewStub(grpc::CreateChannel(
      absl::GetFlag(FLAGS_coordinator), grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::seconds(absl::GetFlag(FLAGS_rpc_timeout_s)));
}

int RpcFailure(const grpc::Status& status) {
  return Fail(
      1, absl::StrCat("coordinator ", absl::GetFlag(FLAGS_coordinator), ": ",
                      status.error_message().empty() ? "unreachable"
                                                     : status.error_message()));
}

std::string StateName(JobState state) {
  std::string name = JobState_Name(state);
  return name.rfind("JOB_", 0) == 0 ? name.substr(4) : name;
}

void PrintJobLine(const JobInfo& job) {
  int registered = 0;
  for (const TaskInfo& t : job.tasks()) registered += t.state() != TASK_WAITING;
  std::printf("%s %s %s %d ps %d workers (%d/%d registered)%s%s\n",
              job.id().c_str(), StateName(job.state()).c_str(),
              job.spec().model().c_str(), job.spec().num_ps(),
              job.spec().num_workers(), registered, job.tasks_size(),
              job.message().empty() ? "" : ": ", job.message().c_str());
}

}  // namespace

int SubmitCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail(2, "usage: pstrain submit JOB.pbtxt [--coordinator=HOST:PORT]");
  }
  std::string text;
  absl::Status s = ReadFile(args[0], &text);
  if (!s.ok()) return Fail(2, std::string(s.message()));
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, args[0]);
  if (!spec.ok()) return Fail(2, std::string(spec.status().message()));
  grpc::ClientContext context;
  SetDeadline(&context);
  SubmitRequest request;
  *request.mutable_spec() = *spec;
  SubmitResponse response;
  const grpc::Status status = Stub()->Submit(&context, request, &response);
  if (!status.ok()) return RpcFailure(status);
  std::printf("%s\n", response.job_id().c_str());
  return 0;
}

int StatusCommand(const std::vector<std::string>& args) {
  if (args.size() > 1) {
    return Fail(2, "usage: pstrain status [JOB_ID] [--coordinator=HOST:PORT]");
  }
  auto stub = Stub();
  grpc::ClientContext context;
  SetDeadline(&context);
  if (args.empty()) {
    ListJobsResponse response;
    const grpc::Status status =
        stub->ListJobs(&context, ListJobsRequest(), &response);
    if (!status.ok()) return RpcFailure(status);
    for (const JobInfo& job : response.jobs()) PrintJobLine(job);
    return 0;
  }
  JobRequest request;
  request.set_job_id(args[0]);
  JobInfo job;
  const grpc::Status status = stub->GetJob(&context, request, &job);
  if (!status.ok()) return RpcFailure(status);
  PrintJobLine(job);
  for (const TaskInfo& t : job.tasks()) {
    std::string state = TaskState_Name(t.state());
    if (state.rfind("TASK_", 0) == 0) state = state.substr(5);
    std::printf("  %-10s %-8s %s%s%s\n", TaskName(t.role(), t.index()).c_str(),
                state.c_str(), t.address().empty() ? "-" : t.address().c_str(),
                t.message().empty() ? "" : " ", t.message().c_str());
  }
  return 0;
}

int CancelCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail(2, "usage: pstrain cancel JOB_ID [--coordinator=HOST:PORT]");
  }
  grpc::ClientContext context;
  SetDeadline(&context);
  JobRequest request;
  request.set_job_id(args[0]);
  CancelResponse response;
  const grpc::Status status = Stub()->Cancel(&context, request, &response);
  if (!status.ok()) return RpcFailure(status);
  std::printf("%s CANCELLED\n", args[0].c_str());
  return 0;
}

int WaitCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail(2, "usage: pstrain wait JOB_ID [--coordinator=HOST:PORT]");
  }
  auto stub = Stub();
  JobState last = JOB_STATE_UNSPECIFIED;
  while (true) {
    grpc::ClientContext context;
    SetDeadline(&context);
    JobRequest request;
    request.set_job_id(args[0]);
    JobInfo job;
    const grpc::Status status = stub->GetJob(&context, request, &job);
    if (!status.ok()) return RpcFailure(status);
    if (job.state() != last) {
      PrintJobLine(job);
      std::fflush(stdout);
      last = job.state();
    }
    if (JobEnded(job.state())) return job.state() == JOB_SUCCEEDED ? 0 : 1;
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_wait_poll_ms)));
  }
}

}  // namespace pstrain
