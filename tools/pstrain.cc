// pstrain: the command-line interface.
//
//   pstrain run [flags]   Runs a whole job on this machine: --num_ps shard
//                         processes and --num_workers worker processes on
//                         127.0.0.1 (ports chosen by the OS), their output
//                         streamed with a role prefix, then a one-row table
//                         of results (and JSON with --results_json).
//
// Exit codes: 0 success; 2 bad flags or input (nothing started); 1 a process
// of the job failed (the others are stopped); 128+signal when interrupted.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "models/model.h"
#include "proto/coordinator.pb.h"
#include "tools/job_commands.h"
#include "tools/local_cluster.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"

ABSL_FLAG(std::string, model, "lenet5",
          "Model: alexnet, lenet5, mlp, resnet18/34/50/101 or vgg16.");
ABSL_FLAG(int, num_ps, 2, "Number of parameter-server shard processes.");
ABSL_FLAG(int, num_workers, 2, "Number of worker processes.");
ABSL_FLAG(int, batch_size, 64, "Samples per step per worker.");
ABSL_FLAG(int, epochs, 2, "Epochs over the training set.");
ABSL_FLAG(std::string, mode, "sync",
          "sync (PS, barrier per step), async (PS) or allreduce (Gloo ring "
          "allreduce among the workers, no PS; --num_ps is ignored).");
ABSL_FLAG(int64_t, bucket_bytes, 25 << 20,
          "allreduce: largest gradient bucket, bytes.");
ABSL_FLAG(double, lr, 1e-3, "Adam learning rate.");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2.");
ABSL_FLAG(double, epsilon, 1e-8, "Adam epsilon.");
ABSL_FLAG(double, weight_decay, 0.0, "Decoupled weight decay (AdamW).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and the shuffles.");
ABSL_FLAG(std::string, results_json, "",
          "If set, write the results here as JSON.");
ABSL_FLAG(int, log_every_steps, 200, "Steps between throughput lines.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20,
          "Largest chunk of a tensor on the wire, bytes.");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0,
          "If > 0, at most this many steps per epoch (short runs).");
ABSL_FLAG(std::string, ps_binary, "",
          "pstrain_ps to run; default: the one built beside this program.");
ABSL_FLAG(std::string, worker_binary, "",
          "pstrain_worker to run; default: the one built beside this program.");
ABSL_FLAG(int, heartbeat_timeout_s, 60,
          "Seconds of silence after which a task is lost and the job fails.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";
volatile sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

// bazel-bin/tools/pstrain -> bazel-bin/<package>/<name>.
std::string SiblingBinary(const std::string& package, const std::string& name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, n);
  dir = dir.substr(0, dir.rfind('/'));  // .../tools
  dir = dir.substr(0, dir.rfind('/'));  // ...
  return absl::StrCat(dir, "/", package, "/", name);
}

}  // namespace

std::string PsBinary() {
  const std::string flag = absl::GetFlag(FLAGS_ps_binary);
  return flag.empty() ? SiblingBinary("server", "pstrain_ps") : flag;
}

std::string WorkerBinary() {
  const std::string flag = absl::GetFlag(FLAGS_worker_binary);
  return flag.empty() ? SiblingBinary("worker", "pstrain_worker") : flag;
}

namespace {

int Run() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const bool allreduce = mode == "allreduce";
  const int num_ps = allreduce ? 0 : absl::GetFlag(FLAGS_num_ps);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  const int epochs = absl::GetFlag(FLAGS_epochs);

  // Every check before any process starts.
  if (!Model::IsKnown(model)) {
    return Fail(2, absl::StrCat("--model=", model,
                                ": unknown model; expected "
                                "one of: ",
                                Model::KnownModels()));
  }
  if (batch_size <= 0) {
    return Fail(2, absl::StrCat("--batch_size=", batch_size,
                                ": expected a positive number of samples per "
                                "worker"));
  }
  if (!allreduce && num_ps <= 0) {
    return Fail(2, absl::StrCat("--num_ps=", num_ps, ": expected >= 1"));
  }
  if (num_workers <= 0) {
    return Fail(2,
                absl::StrCat("--num_workers=", num_workers, ": expected >= 1"));
  }
  if (epochs <= 0) {
    return Fail(2, absl::StrCat("--epochs=", epochs, ": expected >= 1"));
  }
  if (mode != "sync" && mode != "async" && !allreduce) {
    return Fail(2, absl::StrCat("--mode=", mode,
                                ": expected sync, async or allreduce"));
  }
  const int64_t partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  if (partition_bytes < 4 || partition_bytes % 4 != 0) {
    return Fail(2, absl::StrCat("--partition_bytes=", partition_bytes,
                                ": expected a positive multiple of 4"));
  }
  if (absl::Status s = CheckBackendFlags(); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<Dataset> dataset = LoadDatasetFromFlags();
  if (!dataset.ok()) return Fail(2, std::string(dataset.status().message()));
  if (dataset->train.count / num_workers < batch_size) {
    return Fail(2, absl::StrCat("--batch_size=", batch_size,
                                ": larger than "
                                "each worker's ",
                                dataset->train.count / num_workers,
                                " training samples"));
  }
  const std::string ps_binary = PsBinary();
  const std::string worker_binary = WorkerBinary();
  for (const std::string& binary : {ps_binary, worker_binary}) {
    if (access(binary.c_str(), X_OK) != 0) {
      return Fail(2, absl::StrCat(binary,
                                  ": not an executable; build it with "
                                  "bazel build //server:pstrain_ps "
                                  "//worker:pstrain_worker"));
    }
  }

  // The same job spec `pstrain submit` takes, served by an in-process
  // coordinator on 127.0.0.1; the tasks are local processes.
  JobSpec spec;
  spec.set_model(model);
  spec.set_dataset(absl::GetFlag(FLAGS_dataset));
  spec.set_data_dir(absl::GetFlag(FLAGS_data_dir));
  spec.set_image_size(absl::GetFlag(FLAGS_image_size));
  spec.set_num_classes(absl::GetFlag(FLAGS_num_classes));
  spec.set_synthetic_samples(absl::GetFlag(FLAGS_synthetic_samples));
  spec.set_backend(absl::GetFlag(FLAGS_backend));
  spec.set_mode(mode);
  spec.set_num_ps(num_ps);
  spec.set_num_workers(num_workers);
  spec.set_batch_size(batch_size);
  spec.set_epochs(epochs);
  spec.set_seed(absl::GetFlag(FLAGS_seed));
  spec.set_partition_bytes(partition_bytes);
  spec.set_log_every_steps(absl::GetFlag(FLAGS_log_every_steps));
  spec.set_max_steps_per_epoch(absl::GetFlag(FLAGS_max_steps_per_epoch));
  spec.set_bucket_bytes(absl::GetFlag(FLAGS_bucket_bytes));
  OptimizerSpec* optimizer = spec.mutable_optimizer();
  optimizer->set_lr(absl::GetFlag(FLAGS_lr));
  optimizer->set_beta1(absl::GetFlag(FLAGS_beta1));
  optimizer->set_beta2(absl::GetFlag(FLAGS_beta2));
  optimizer->set_epsilon(absl::GetFlag(FLAGS_epsilon));
  optimizer->set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  ApplyJobDefaults(&spec);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) {
    return Fail(2, absl::StrCat("flags: ", s.message()));
  }

  CoordinatorServerOptions coordinator_options;
  coordinator_options.address = "127.0.0.1:0";
  coordinator_options.heartbeat_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> coordinator =
      CoordinatorServer::Start(coordinator_options);
  if (!coordinator.ok()) {
    return Fail(1, absl::StrCat("in-process coordinator: ",
                                coordinator.status().message()));
  }
  JobTable& table = (*coordinator)->table();
  absl::StatusOr<std::string> submitted = table.Submit(spec, absl::Now());
  if (!submitted.ok()) return Fail(1, submitted.status().ToString());
  const std::string job_id = *submitted;
  const std::string coordinator_flag =
      absl::StrCat("--coordinator=127.0.0.1:", (*coordinator)->port());
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  LocalCluster cluster;
  std::map<std::string, std::pair<TaskRole, int>> tasks;
  for (int s = 0; s < num_ps; ++s) {
    const std::string role = absl::StrCat("ps", s);
    tasks[role] = {ROLE_PS, s};
    absl::Status status = cluster.Start(
        role, {ps_binary, coordinator_flag, absl::StrCat("--job=", job_id),
               absl::StrCat("--task_index=", s), "--bind=127.0.0.1", "--port=0",
               "--advertise=127.0.0.1"});
    if (!status.ok()) return Fail(1, status.ToString());
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string omp_threads = absl::StrCat(
      "OMP_NUM_THREADS=", std::max<unsigned>(1, cores / num_workers));
  for (int w = 0; w < num_workers; ++w) {
    const std::string role = absl::StrCat("worker", w);
    tasks[role] = {ROLE_WORKER, w};
    absl::Status status = cluster.Start(
        role,
        {worker_binary, coordinator_flag, absl::StrCat("--job=", job_id),
         absl::StrCat("--task_index=", w), "--advertise=127.0.0.1",
         absl::StrCat("--gpu=", absl::GetFlag(FLAGS_gpu))},
        {omp_threads});
    if (!status.ok()) return Fail(1, status.ToString());
  }

  // Follow the job to its end. A task that dies without reporting (a crash,
  // a kill) fails the job here; the others learn it from their heartbeats.
  JobInfo job;
  while (true) {
    if (g_signal != 0) {
      table.Cancel(job_id, absl::Now()).IgnoreError();
      cluster.StopAll(absl::Seconds(3));
      PrintError(kProgram, absl::StrCat("interrupted by signal ",
                                        static_cast<int>(g_signal),
                                        "; stopped every process"));
      return 128 + g_signal;
    }
    ChildExit exit = cluster.WaitAny(absl::Milliseconds(100));
    if (!exit.role.empty() && exit.code != 0) {
      TaskFinishedRequest report;
      report.mutable_task()->set_job_id(job_id);
      report.mutable_task()->set_role(tasks[exit.role].first);
      report.mutable_task()->set_index(tasks[exit.role].second);
      report.set_message(absl::StrCat(
          "exited with ",
          exit.code > 0 ? absl::StrCat("exit code ", exit.code)
                        : absl::StrCat("signal ", -exit.code),
          exit.last_error_line.empty() ? "" : ": ", exit.last_error_line));
      // A no-op when the task reported its failure itself.
      table.TaskFinished(report, absl::Now()).IgnoreError();
    }
    absl::StatusOr<JobInfo> current = table.Get(job_id, JobTable::kNoLog);
    if (!current.ok()) return Fail(1, current.status().ToString());
    job = *std::move(current);
    if (JobEnded(job.state())) break;
  }
  // Every task exits by itself once the job has ended (the shards after
  // their last worker's WorkerDone, the rest at their next heartbeat).
  const absl::Time exit_deadline = absl::Now() + absl::Seconds(10);
  while (cluster.num_running() > 0 && absl::Now() < exit_deadline) {
    cluster.WaitAny(absl::Milliseconds(100));
  }
  cluster.StopAll(absl::Seconds(2));
  if (job.state() != JOB_SUCCEEDED) {
    return Fail(1, absl::StrCat(job_id, " ", JobStateName(job.state()), ": ",
                                job.message()));
  }
  std::printf("\n%s", FormatResultTable(job.result()).c_str());
  std::fflush(stdout);
  const std::string results_json = absl::GetFlag(FLAGS_results_json);
  if (!results_json.empty()) {
    absl::Status status =
        WriteFileAtomically(results_json, ResultJson(job.result()));
    if (!status.ok()) return Fail(1, status.ToString());
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pstrain run [--flags]: train a data-parallel job on this machine "
      "(parameter-server shards and workers as local processes).\n"
      "pstrain submit JOB.pbtxt | status [ID] | logs ID | cancel ID | wait ID "
      "[--coordinator=HOST:PORT]: jobs on a pstrain_coordinator.\n"
      "pstrain launch-lines JOB.pbtxt --launcher=slurm|mpirun|ssh "
      "[--coordinator=HOST:PORT] [--job=ID]: the lines that start its "
      "tasks.");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::string command = positional.size() > 1 ? positional[1] : "";
  const std::vector<std::string> args(
      positional.size() > 2 ? positional.begin() + 2 : positional.end(),
      positional.end());
  if (command == "run" && args.empty()) return pstrain::Run();
  if (command == "submit") return pstrain::SubmitCommand(args);
  if (command == "status") return pstrain::StatusCommand(args);
  if (command == "cancel") return pstrain::CancelCommand(args);
  if (command == "wait") return pstrain::WaitCommand(args);
  if (command == "logs") return pstrain::LogsCommand(args);
  if (command == "launch-lines") {
    return pstrain::LaunchLinesCommand(args, pstrain::PsBinary(),
                                       pstrain::WorkerBinary());
  }
  pstrain::PrintError(
      "pstrain",
      absl::StrCat("expected a command (run, submit, status, logs, cancel, "
                   "wait, launch-lines); "
                   "got \"",
                   command, "\"", args.empty() ? "" : " and more",
                   " (usage: pstrain run [--flags])"));
  return 2;
}
