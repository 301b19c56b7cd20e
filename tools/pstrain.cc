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
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "google/protobuf/util/json_util.h"
#include "models/model.h"
#include "proto/results.pb.h"
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
ABSL_FLAG(std::string, mode, "sync", "sync (barrier per step) or async.");
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
ABSL_FLAG(int, startup_timeout_s, 30,
          "Seconds to wait for the shards to report their ports.");

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

std::string FormatTable(const RunResult& r) {
  std::string out =
      "| #PS | #Workers | Mode | Model | Batchsize | Epochs | Steps | Runtime "
      "| Throughput (data/sec) | Test accuracy |\n"
      "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n";
  absl::StrAppend(&out, "| ", r.num_ps(), " | ", r.num_workers(), " | ",
                  r.mode(), " | ", r.model(), " | ", r.batch_size(), " | ",
                  r.epochs(), " | ", r.steps(), " | ",
                  absl::StrFormat("%.2f s", r.runtime_seconds()), " | ",
                  absl::StrFormat("%.2f", r.throughput_samples_per_sec()),
                  " | ", absl::StrFormat("%.4f", r.test_accuracy()), " |\n");
  return out;
}

int Run() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int num_ps = absl::GetFlag(FLAGS_num_ps);
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
  if (num_ps <= 0) {
    return Fail(2, absl::StrCat("--num_ps=", num_ps, ": expected >= 1"));
  }
  if (num_workers <= 0) {
    return Fail(2,
                absl::StrCat("--num_workers=", num_workers, ": expected >= 1"));
  }
  if (epochs <= 0) {
    return Fail(2, absl::StrCat("--epochs=", epochs, ": expected >= 1"));
  }
  if (mode != "sync" && mode != "async") {
    return Fail(2, absl::StrCat("--mode=", mode, ": expected sync or async"));
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
  std::string ps_binary = absl::GetFlag(FLAGS_ps_binary);
  if (ps_binary.empty()) ps_binary = SiblingBinary("server", "pstrain_ps");
  std::string worker_binary = absl::GetFlag(FLAGS_worker_binary);
  if (worker_binary.empty()) {
    worker_binary = SiblingBinary("worker", "pstrain_worker");
  }
  for (const std::string& binary : {ps_binary, worker_binary}) {
    if (access(binary.c_str(), X_OK) != 0) {
      return Fail(2, absl::StrCat(binary,
                                  ": not an executable; build it with "
                                  "bazel build //server:pstrain_ps "
                                  "//worker:pstrain_worker"));
    }
  }

  char dir_template[] = "/tmp/pstrain-run-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return Fail(1, "cannot create a temporary folder in /tmp");
  }
  const std::string run_dir = dir_template;
  const std::string job_id = absl::StrCat("run-", getpid());
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  LocalCluster cluster;
  auto fail_job = [&](const std::string& message) {
    cluster.StopAll(absl::Seconds(3));
    std::system(absl::StrCat("rm -rf ", run_dir).c_str());
    return Fail(1, message);
  };
  auto interrupted = [&]() {
    cluster.StopAll(absl::Seconds(3));
    std::system(absl::StrCat("rm -rf ", run_dir).c_str());
    PrintError(kProgram, absl::StrCat("interrupted by signal ",
                                      static_cast<int>(g_signal),
                                      "; stopped every process"));
    return 128 + g_signal;
  };

  for (int s = 0; s < num_ps; ++s) {
    absl::Status status = cluster.Start(
        absl::StrCat("ps", s),
        {ps_binary, "--bind=127.0.0.1", "--port=0",
         absl::StrCat("--port_file=", run_dir, "/ps", s, ".port"),
         absl::StrCat("--job_id=", job_id), absl::StrCat("--shard_index=", s),
         absl::StrCat("--num_shards=", num_ps),
         absl::StrCat("--num_workers=", num_workers),
         absl::StrCat("--mode=", mode),
         absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)),
         absl::StrCat("--beta1=", absl::GetFlag(FLAGS_beta1)),
         absl::StrCat("--beta2=", absl::GetFlag(FLAGS_beta2)),
         absl::StrCat("--epsilon=", absl::GetFlag(FLAGS_epsilon)),
         absl::StrCat("--weight_decay=", absl::GetFlag(FLAGS_weight_decay))});
    if (!status.ok()) return fail_job(status.ToString());
  }
  // Collect the ports the OS gave the shards.
  std::vector<std::string> addresses(num_ps);
  const absl::Time deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
  for (int s = 0; s < num_ps; ++s) {
    std::string port;
    while (!ReadFile(absl::StrCat(run_dir, "/ps", s, ".port"), &port).ok()) {
      if (g_signal != 0) return interrupted();
      ChildExit exit = cluster.WaitAny(absl::Milliseconds(20));
      if (!exit.role.empty()) {
        return fail_job(
            absl::StrCat(exit.role, " exited with code ", exit.code,
                         " before serving: ", exit.last_error_line));
      }
      if (absl::Now() > deadline) {
        return fail_job(
            absl::StrCat("ps", s, " did not report its port within ",
                         absl::GetFlag(FLAGS_startup_timeout_s), " s"));
      }
    }
    while (!port.empty() && port.back() == '\n') port.pop_back();
    addresses[s] = absl::StrCat("127.0.0.1:", port);
  }
  const std::string results_file = absl::StrCat(run_dir, "/results.json");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string omp_threads = absl::StrCat(
      "OMP_NUM_THREADS=", std::max<unsigned>(1, cores / num_workers));
  for (int w = 0; w < num_workers; ++w) {
    std::vector<std::string> argv = {
        worker_binary,
        absl::StrCat("--job_id=", job_id),
        absl::StrCat("--worker_id=", w),
        absl::StrCat("--num_workers=", num_workers),
        absl::StrCat("--ps_addresses=", absl::StrJoin(addresses, ",")),
        absl::StrCat("--model=", model),
        absl::StrCat("--mode=", mode),
        absl::StrCat("--batch_size=", batch_size),
        absl::StrCat("--epochs=", epochs),
        absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
        absl::StrCat("--log_every_steps=",
                     absl::GetFlag(FLAGS_log_every_steps)),
        absl::StrCat("--partition_bytes=", partition_bytes),
        absl::StrCat("--max_steps_per_epoch=",
                     absl::GetFlag(FLAGS_max_steps_per_epoch))};
    for (std::string& arg : DataAndBackendFlagArgs()) {
      argv.push_back(std::move(arg));
    }
    if (w == 0) argv.push_back(absl::StrCat("--results_json=", results_file));
    absl::Status status =
        cluster.Start(absl::StrCat("worker", w), argv, {omp_threads});
    if (!status.ok()) return fail_job(status.ToString());
  }

  // Wait for every worker; any failure stops the job.
  int workers_left = num_workers;
  while (workers_left > 0) {
    if (g_signal != 0) return interrupted();
    ChildExit exit = cluster.WaitAny(absl::Milliseconds(100));
    if (exit.role.empty()) continue;
    if (exit.code != 0) {
      return fail_job(
          absl::StrCat(exit.role, " failed with ",
                       exit.code > 0 ? absl::StrCat("exit code ", exit.code)
                                     : absl::StrCat("signal ", -exit.code),
                       exit.last_error_line.empty()
                           ? ""
                           : absl::StrCat(": ", exit.last_error_line)));
    }
    // A shard exits 0 only once every worker said done, which can happen
    // before the last worker process is reaped here.
    if (exit.role.rfind("worker", 0) == 0) --workers_left;
  }
  // The shards exit by themselves once every worker said done.
  const absl::Time ps_deadline = absl::Now() + absl::Seconds(10);
  while (cluster.num_running() > 0 && absl::Now() < ps_deadline) {
    ChildExit exit = cluster.WaitAny(absl::Milliseconds(100));
    if (!exit.role.empty() && exit.code != 0) {
      return fail_job(absl::StrCat(exit.role, " failed with exit code ",
                                   exit.code, ": ", exit.last_error_line));
    }
  }
  cluster.StopAll(absl::Seconds(2));

  std::string json;
  absl::Status status = ReadFile(results_file, &json);
  std::system(absl::StrCat("rm -rf ", run_dir).c_str());
  if (!status.ok())
    return Fail(1,
                absl::StrCat("worker0 wrote no results: ", status.ToString()));
  RunResult result;
  if (!google::protobuf::util::JsonStringToMessage(json, &result).ok()) {
    return Fail(1, "worker0's results are not valid JSON");
  }
  std::printf("\n%s", FormatTable(result).c_str());
  std::fflush(stdout);
  const std::string results_json = absl::GetFlag(FLAGS_results_json);
  if (!results_json.empty()) {
    status = WriteFileAtomically(results_json, json);
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
      "pstrain submit JOB.pbtxt | status [ID] | cancel ID | wait ID "
      "[--coordinator=HOST:PORT]: jobs on a pstrain_coordinator.");
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
  pstrain::PrintError(
      "pstrain",
      absl::StrCat("expected a command (run, submit, status, cancel, wait); "
                   "got \"",
                   command, "\"", args.empty() ? "" : " and more",
                   " (usage: pstrain run [--flags])"));
  return 2;
}
