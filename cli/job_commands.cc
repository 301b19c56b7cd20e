#include "cli/job_commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "catalog/job_config.h"
#include "cli/trace_merge.h"
#include "common/flags_util.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "coordinator/task_agent.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "host:port of pstrain_coordinator (submit, status, cancel, wait).");
ABSL_FLAG(int, rpc_timeout_s, 30, "Deadline of each coordinator call, s.");
ABSL_FLAG(int, wait_poll_ms, 1000, "wait: milliseconds between polls.");
ABSL_FLAG(int64_t, at_step, 0,
          "scale: apply the new membership at the first step boundary at or "
          "after this step (0: the next).");
ABSL_FLAG(int, coordinator_timeout_s, 120,
          "How long status, logs and wait keep retrying, as the tasks do, "
          "while the coordinator cannot be reached (a restart), s; 0: no "
          "retries.");
// Defined here, not in cli/certs_command.cc, so that a binary with the job
// commands but not pstrain's own flags (compare_test) links.
ABSL_FLAG(std::string, out, "",
          "Where certs and trace write; see pstrain help certs and pstrain "
          "help trace.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

// A stub as the administrator (the admin certificate of --tls_dir,
// PSTRAIN_ADMIN_TLS_DIR or PSTRAIN_TLS_DIR), or
// plaintext with --insecure; exits 2 naming the problem otherwise.
std::unique_ptr<Coordinator::Stub> NewStub() {
  if (absl::Status s =
          CheckFlagRange("rpc_timeout_s", absl::GetFlag(FLAGS_rpc_timeout_s), 1,
                         86400, "seconds");
      !s.ok()) {
    std::exit(Fail(2, std::string(s.message())));
  }
  if (absl::Status s = CheckFlagRange(
          "coordinator_timeout_s", absl::GetFlag(FLAGS_coordinator_timeout_s),
          0, 86400, "seconds");
      !s.ok()) {
    std::exit(Fail(2, std::string(s.message())));
  }
  if (absl::Status s =
          CheckGrpcTarget("coordinator", absl::GetFlag(FLAGS_coordinator));
      !s.ok()) {
    std::exit(Fail(2, std::string(s.message())));
  }
  absl::StatusOr<TlsOptions> tls = AdminTlsOptionsFromFlags(kProgram);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      tls.ok() ? ChannelCredentials(*tls, TlsIdentity{TlsRole::kAdmin})
               : tls.status();
  if (!credentials.ok()) std::exit(Fail(2, credentials.status().ToString()));
  // Any answer the coordinator sends, a whole log or every job's store
  // (kMaxCoordinatorAnswerBytes), is received.
  return Coordinator::NewStub(
      grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator), *credentials,
                                CoordinatorChannelArguments()));
}

// The process's one stub, made on the first call and never destroyed: its
// channel may still be reconnecting on gRPC's threads when the command
// ends (a coordinator that went away), and the command ends with
// ExitAfterCommand rather than a teardown that races them.
Coordinator::Stub* Stub() {
  static Coordinator::Stub* const stub = NewStub().release();
  return stub;
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

// "[worker0] Step200: ..." as `pstrain run` prefixes its tasks' lines, in
// the order the tasks printed them (LogLine.time_ms, then arrival).
void PrintLogLines(const JobInfo& job) {
  std::vector<LogLine> lines(job.log().begin(), job.log().end());
  std::stable_sort(lines.begin(), lines.end(),
                   [](const LogLine& a, const LogLine& b) {
                     return a.time_ms() < b.time_ms();
                   });
  for (const LogLine& line : lines) {
    std::printf("[%s%d] %s\n", line.role() == ROLE_PS ? "ps" : "worker",
                line.index(), line.text().c_str());
  }
  std::fflush(stdout);
}

// `call`, retried as the tasks retry their calls (coordinator/task_agent.h
// CallCoordinatorWithRetry) for up to --coordinator_timeout_s while the
// coordinator cannot be reached, as while it restarts. Says on stderr,
// once, that it is retrying and for how long, and when the coordinator
// answers again. A call that still fails after the deadline: the status
// with the deadline in its message.
grpc::Status CallRidingOutRestarts(
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const int timeout_s = absl::GetFlag(FLAGS_coordinator_timeout_s);
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  bool retried = false;
  const grpc::Status status = CallCoordinatorWithRetry(
      absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s)),
      absl::Seconds(timeout_s), call, [&](const grpc::Status& failure) {
        if (retried) return;
        retried = true;
        std::fprintf(stderr,
                     "%s: coordinator %s unreachable (%s); retrying for up "
                     "to %d s (--coordinator_timeout_s)\n",
                     kProgram, coordinator.c_str(),
                     failure.error_message().c_str(), timeout_s);
      });
  if (!retried) return status;
  if (!RetryableCoordinatorStatus(status)) {
    std::fprintf(stderr, "%s: coordinator %s answers again\n", kProgram,
                 coordinator.c_str());
    return status;
  }
  return grpc::Status(
      status.error_code(),
      absl::StrCat("unreachable for longer than --coordinator_timeout_s=",
                   timeout_s, " s (", status.error_message(), ")"));
}

// Job `id` with its log lines from seq `log_since` on, riding out a
// coordinator restart.
grpc::Status GetJob(Coordinator::Stub* stub, const std::string& id,
                    int64_t log_since, JobInfo* job) {
  JobRequest request;
  request.set_job_id(id);
  request.set_log_since(log_since);
  return CallRidingOutRestarts([&](grpc::ClientContext* context) {
    return stub->GetJob(context, request, job);
  });
}

void PrintJobLine(const JobInfo& job) {
  int registered = 0;
  int tasks = 0;  // an elastic job's idle and removed workers left out
  int standbys = 0;
  int prepared = 0;
  for (const TaskInfo& t : job.tasks()) {
    if (t.state() == TASK_STANDBY) {
      ++standbys;
      prepared += t.prepared();
      continue;
    }
    if (t.state() == TASK_IDLE || t.state() == TASK_REMOVED) continue;
    registered += !t.address().empty();
    ++tasks;
  }
  // An elastic job: its newest membership's workers, and its bound.
  const bool elastic = !job.memberships().empty();
  const std::string elastic_text =
      elastic
          ? absl::StrCat(
                " (membership ", job.membership().epoch(), ", at most ",
                std::max(job.spec().max_workers(), job.spec().num_workers()),
                standbys > 0 ? absl::StrCat(", ", standbys, " standby, ",
                                            prepared, " prepared")
                             : "",
                ")")
          : "";
  std::printf(
      "%s %s %s %d ps %d workers%s (%d/%d registered)%s%s\n", job.id().c_str(),
      JobStateName(job.state()).c_str(), job.spec().model().c_str(),
      // An elastic-shard job: its newest membership's shards.
      job.membership().num_ps() > 0 ? job.membership().num_ps()
                                    : job.spec().num_ps(),
      elastic ? job.membership().workers_size() : job.spec().num_workers(),
      elastic_text.c_str(), registered, tasks,
      job.message().empty() ? "" : ": ", job.message().c_str());
  std::fflush(stdout);
}

// The names of `type`'s 64-bit integer fields and its messages' (proto3
// JSON writes those as strings).
void Int64FieldNames(const google::protobuf::Descriptor* type,
                     std::set<std::string>* names) {
  using google::protobuf::FieldDescriptor;
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        names->insert(field->name());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (field->message_type() != type) {
          Int64FieldNames(field->message_type(), names);
        }
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::string Int64sAsNumbers(const google::protobuf::Descriptor* type,
                            const std::string& json) {
  std::set<std::string> names;
  Int64FieldNames(type, &names);
  std::string out = json;
  for (const std::string& name : names) {
    const std::string key = absl::StrCat("\"", name, "\": \"");
    size_t at = 0;
    while ((at = out.find(key, at)) != std::string::npos) {
      const size_t value = at + key.size();
      size_t end = value;
      if (end < out.size() && out[end] == '-') ++end;
      while (end < out.size() && out[end] >= '0' && out[end] <= '9') ++end;
      // A key of this message (not text inside a string value, whose
      // quotes are escaped) with a whole integer value.
      if ((at == 0 || out[at - 1] != '\\') && end > value && end < out.size() &&
          out[end] == '"') {
        out.erase(end, 1);
        out.erase(value - 1, 1);
      }
      at = value;
    }
  }
  return out;
}

std::string FormatResultTable(const RunResult& r) {
  std::string out =
      "| #PS | #Workers | Mode | Model | Batchsize | Epochs | Steps | Runtime "
      "| Throughput (data/sec) | Test accuracy |\n"
      "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n";
  absl::StrAppend(&out, "| ", r.num_ps(), " | ", r.num_workers(), " | ",
                  r.mode(), " | ", r.model(), " | ", r.batch_size(), " | ",
                  r.epochs(), " | ", r.steps(), " | ",
                  absl::StrFormat("%.2f s", r.runtime_seconds()), " | ",
                  absl::StrFormat("%.2f", r.throughput_samples_per_sec()),
                  " | ", FormatTestAccuracy(r), " |\n");
  return out;
}

std::string FormatTestAccuracy(const RunResult& r) {
  // Synthetic compute and a dataset without a test split evaluate nothing.
  return r.has_test_accuracy() ? absl::StrFormat("%.4f", r.test_accuracy())
                               : std::string("-");
}

std::string ResultJson(const RunResult& result) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(result, &json, options);
  return Int64sAsNumbers(RunResult::descriptor(), json);
}

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
  Coordinator::Stub* const stub = Stub();
  if (args.empty()) {
    ListJobsResponse response;
    const grpc::Status status =
        CallRidingOutRestarts([&](grpc::ClientContext* context) {
          return stub->ListJobs(context, ListJobsRequest(), &response);
        });
    if (!status.ok()) return RpcFailure(status);
    for (const JobInfo& job : response.jobs()) PrintJobLine(job);
    return 0;
  }
  JobInfo job;
  const grpc::Status status = GetJob(stub, args[0], JobTable::kNoLog, &job);
  if (!status.ok()) return RpcFailure(status);
  PrintJobLine(job);
  for (const EpochResult& e : job.result().epoch_results()) {
    std::printf("  epoch %d: %.2f s, test accuracy %.4f\n", e.epoch(),
                e.train_seconds(), e.test_accuracy());
  }
  for (const TaskInfo& t : job.tasks()) {
    std::string state = TaskState_Name(t.state());
    if (state.rfind("TASK_", 0) == 0) state = state.substr(5);
    const std::string progress =
        t.steps() > 0 ? absl::StrFormat(" %d steps, %.1f samples/sec",
                                        t.steps(), t.samples_per_sec())
                      : "";
    std::printf(
        "  %-10s %-10s %s%s%s%s\n", TaskName(t.role(), t.index()).c_str(),
        state.c_str(), t.address().empty() ? "-" : t.address().c_str(),
        progress.c_str(), t.message().empty() ? "" : " ", t.message().c_str());
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

int ScaleCommand(const std::vector<std::string>& args,
                 const ScaleFlags& flags) {
  constexpr char kUsage[] =
      "usage: pstrain scale JOB_ID [--num_workers=N] [--num_ps=M] "
      "[--at_step=S] [--coordinator=HOST:PORT]";
  if (args.size() != 1) return Fail(2, kUsage);
  if (!flags.num_workers_given && !flags.num_ps_given) {
    return Fail(2, absl::StrCat("scale: --num_workers, --num_ps or both are "
                                "required; ",
                                kUsage));
  }
  if (flags.num_workers_given) {
    if (absl::Status s = CheckFlagRange("num_workers", flags.num_workers, 1,
                                        kMaxNumWorkers, "workers");
        !s.ok()) {
      return Fail(2, std::string(s.message()));
    }
  }
  int num_ps = 0;
  if (flags.num_ps_given) {
    if (!absl::SimpleAtoi(flags.num_ps, &num_ps)) {
      return Fail(2, absl::StrCat("--num_ps=", flags.num_ps,
                                  ": expected a number of shards, 1 to ",
                                  kMaxElasticPs));
    }
    if (absl::Status s =
            CheckFlagRange("num_ps", num_ps, 1, kMaxElasticPs, "shards");
        !s.ok()) {
      return Fail(2, std::string(s.message()));
    }
  }
  const int64_t at_step = absl::GetFlag(FLAGS_at_step);
  if (absl::Status s = CheckFlagRange("at_step", at_step, 0, kMaxSteps,
                                      "(0: the next step)");
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  grpc::ClientContext context;
  SetDeadline(&context);
  ScaleRequest request;
  request.set_job_id(args[0]);
  request.set_num_workers(flags.num_workers_given ? flags.num_workers : 0);
  request.set_num_ps(num_ps);
  request.set_at_step(at_step);
  ScaleResponse response;
  const grpc::Status status = Stub()->Scale(&context, request, &response);
  if (!status.ok()) return RpcFailure(status);
  const Membership& m = response.membership();
  const std::string shards =
      m.num_ps() > 0 ? absl::StrCat(", ", m.num_ps(), " shards") : "";
  std::printf(
      "%s membership %lld: %d workers (%s)%s%s%s\n", args[0].c_str(),
      static_cast<long long>(m.epoch()), m.workers_size(),
      absl::StrJoin(m.workers(), ", ").c_str(), shards.c_str(),
      m.at_step() > 0
          ? absl::StrCat(" from step ", m.at_step(), " or the next").c_str()
          : " from the next step",
      m.ready() ? "" : ", once the new tasks registered");
  return 0;
}

int TraceCommand(const std::vector<std::string>& args) {
  constexpr char kUsage[] =
      "usage: pstrain trace JOB_ID_OR_METRICS_DIR [--out=FILE] "
      "[--coordinator=HOST:PORT]";
  if (args.size() != 1) return Fail(2, kUsage);
  namespace fs = std::filesystem;
  std::string dir = args[0];
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    // A job id: its metrics_dir, from the coordinator (not its log).
    JobInfo job;
    const grpc::Status status = GetJob(Stub(), args[0], JobTable::kNoLog, &job);
    if (!status.ok()) return RpcFailure(status);
    if (job.spec().metrics_dir().empty() || !job.spec().trace()) {
      return Fail(2, absl::StrCat(args[0],
                                  " was not run with a trace (expected a job "
                                  "with trace: true and a metrics_dir)"));
    }
    dir = job.spec().metrics_dir();
  }
  const bool has_subdir = fs::is_directory(fs::path(dir) / "trace", error);
  const std::string trace_dir =
      has_subdir ? (fs::path(dir) / "trace").string() : dir;
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    out = (fs::path(has_subdir ? dir : trace_dir) /
           (has_subdir ? "trace.json" : "merged_trace.json"))
              .string();
  }
  absl::StatusOr<TraceMergeSummary> merged = MergeTraces(trace_dir, out);
  if (!merged.ok()) {
    return Fail(absl::IsNotFound(merged.status()) ||
                        absl::IsInvalidArgument(merged.status())
                    ? 2
                    : 1,
                std::string(merged.status().message()));
  }
  std::printf(
      "Merged %zu task traces (%lld events) into %s, on the coordinator's "
      "clock (offsets measured within +-%lld us); open it in "
      "https://ui.perfetto.dev or chrome://tracing\n",
      merged->files.size(), static_cast<long long>(merged->events), out.c_str(),
      static_cast<long long>(merged->max_rtt_us / 2));
  return 0;
}

int LogsCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail(2, "usage: pstrain logs JOB_ID [--coordinator=HOST:PORT]");
  }
  JobInfo job;
  const grpc::Status status = GetJob(Stub(), args[0], 0, &job);
  if (!status.ok()) return RpcFailure(status);
  PrintLogLines(job);
  return 0;
}

int WaitCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail(2, "usage: pstrain wait JOB_ID [--coordinator=HOST:PORT]");
  }
  if (absl::Status s = CheckFlagRange(
          "wait_poll_ms", absl::GetFlag(FLAGS_wait_poll_ms), 1, 60000, "ms");
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  Coordinator::Stub* const stub = Stub();
  JobState last = JOB_STATE_UNSPECIFIED;
  int64_t log_since = 0;
  // While tasks are missing (a queued launch), which ones, once a minute.
  absl::Time next_report = absl::Now() + absl::Seconds(60);
  while (true) {
    JobInfo job;
    const grpc::Status status = GetJob(stub, args[0], log_since, &job);
    if (!status.ok()) return RpcFailure(status);
    PrintLogLines(job);
    if (job.state() != last) {
      PrintJobLine(job);
      last = job.state();
    }
    // The coordinator's numbering, which a restarted one resumes from its
    // job file.
    log_since = job.next_log_seq();
    if (absl::Now() >= next_report) {
      next_report = absl::Now() + absl::Seconds(60);
      const std::string report = WaitingReport(job, absl::Now());
      if (!report.empty()) {
        std::printf("%s\n", report.c_str());
        std::fflush(stdout);
      }
    }
    if (JobEnded(job.state())) {
      if (job.state() != JOB_SUCCEEDED) return 1;
      std::printf("\n%s", FormatResultTable(job.result()).c_str());
      std::fflush(stdout);
      return 0;
    }
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_wait_poll_ms)));
  }
}

void ExitAfterCommand(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace pstrain
