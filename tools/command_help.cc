#include "tools/command_help.h"

#include "absl/strings/str_cat.h"
#include "common/flags_util.h"

namespace pstrain {
namespace {

const std::vector<std::string>& DataFlags() {
  static const auto* flags = new std::vector<std::string>{
      "dataset",           "data_dir", "image_size",
      "stream_images",     "augment",  "num_classes",
      "synthetic_samples", "backend",  "gpu"};
  return *flags;
}

// The job flags that `run` and `compare` both turn into a job spec.
const std::vector<std::string>& JobFlags() {
  static const auto* flags =
      new std::vector<std::string>{"model",
                                   "num_ps",
                                   "batch_size",
                                   "epochs",
                                   "bucket_bytes",
                                   "lr",
                                   "beta1",
                                   "beta2",
                                   "epsilon",
                                   "weight_decay",
                                   "optimizer",
                                   "momentum",
                                   "dampening",
                                   "nesterov",
                                   "lr_schedule",
                                   "warmup_steps",
                                   "lr_step_size",
                                   "lr_gamma",
                                   "lr_min",
                                   "lr_total_steps",
                                   "seed",
                                   "log_every_steps",
                                   "partition_bytes",
                                   "max_steps_per_epoch",
                                   "ps_binary",
                                   "worker_binary",
                                   "compute",
                                   "compute_ms",
                                   "backward_fraction",
                                   "model_bytes",
                                   "ps_netns",
                                   "worker_netns",
                                   "coordinator_host",
                                   "heartbeat_timeout_s",
                                   "registration_timeout_s",
                                   "max_nonfinite_steps",
                                   "straggler",
                                   "staleness",
                                   "backup_workers",
                                   "clip_grad_norm",
                                   "insecure",
                                   "insecure_allow_remote"};
  return *flags;
}

std::vector<std::string> Join(
    std::initializer_list<std::vector<std::string>> lists) {
  std::vector<std::string> all;
  for (const std::vector<std::string>& list : lists) {
    all.insert(all.end(), list.begin(), list.end());
  }
  return all;
}

const std::vector<std::string> kClientFlags = {"coordinator", "rpc_timeout_s",
                                               "tls_dir", "insecure",
                                               "insecure_allow_remote"};

}  // namespace

const std::vector<CommandInfo>& Commands() {
  static const auto* commands = new std::vector<CommandInfo>{
      {"run", "pstrain run [--flags]",
       "Trains one job on this machine: --num_ps parameter-server shards and "
       "--num_workers workers as local processes (or one network namespace "
       "per task with --ps_netns/--worker_netns) under an in-process "
       "coordinator; streams their lines and prints a table of results. "
       "Mode sync or async: PS flags (--num_ps, --partition_bytes, "
       "checkpoints, --max_restarts); mode "
       "allreduce: --bucket_bytes. --compute=synthetic: --compute_ms, "
       "--model_bytes, --backward_fraction and no dataset flags. A flag "
       "the run would ignore is an error. Exit 0 done, 1 a task failed, 2 "
       "bad flags (nothing started), 128+signal interrupted.",
       Join({JobFlags(),
             DataFlags(),
             {"num_workers", "mode", "results_json", "metrics_dir", "trace",
              "init_from", "checkpoint_dir", "checkpoint_every_steps",
              "checkpoint_every_secs", "keep_checkpoints", "max_restarts",
              "resume"}})},
      {"compare",
       "pstrain compare --out_dir=DIR [--workers=1,2,4 "
       "--modes=ps_sync,ps_async,allreduce --num_ps=2 --batch_sizes=32,64 "
       "--steps=N --repeats=N]",
       "Runs `run` --repeats times per configuration (each of --modes at "
       "each of --workers and --batch_sizes, and each --num_ps for the PS "
       "modes), then prints "
       "and "
       "writes the scaling and communication tables as Markdown, CSV, JSON "
       "and a gnuplot PNG into --out_dir. Every configuration is checked "
       "before the first run starts. --preset=mnist_resnet|dlperf|"
       "tiny_imagenet runs a published report's experiment scaled to this "
       "machine (any of its flags can be overridden) and prints that "
       "report's own table first.",
       Join({JobFlags(),
             DataFlags(),
             {"preset", "workers", "batch_sizes", "modes", "steps", "scaling",
              "repeats", "out_dir", "link_mbit", "plot"}})},
      {"eval",
       "pstrain eval --checkpoint=FILE_OR_DIR [--dataset=... --data_dir=... "
       "--backend=...]",
       "Test loss and accuracy of a saved model (model.safetensors) on the "
       "test set of --dataset. A flag the dataset or backend would ignore "
       "(--num_classes without --dataset=synthetic, --gpu with "
       "--backend=cpu, ...) is an error. It evaluates in batches of "
       "--batch_size when given, else 100 (the activations of a batch are "
       "held at once: 500 images of a ResNet-50 take over 20 GB).",
       Join({DataFlags(), {"checkpoint", "bad_images", "batch_size"}})},
      {"submit", "pstrain submit JOB.pbtxt [--coordinator=HOST:PORT]",
       "Submits a job spec (protobuf text format, proto/job.proto) to a "
       "pstrain_coordinator and prints its id. A spec out of range is a "
       "one-line error naming the field, the value and the range (exit 2).",
       kClientFlags},
      {"status", "pstrain status [JOB_ID] [--coordinator=HOST:PORT]",
       "One line per job (or the named job's tasks).", kClientFlags},
      {"logs", "pstrain logs JOB_ID [--coordinator=HOST:PORT]",
       "The job's lines so far, prefixed by task.", kClientFlags},
      {"trace", "pstrain trace JOB_ID_OR_METRICS_DIR [--out=FILE]",
       "Merges a traced job's per-task timelines (run --trace: "
       "METRICS_DIR/trace/*.json) into one Chrome trace on the "
       "coordinator's clock (default METRICS_DIR/trace.json) for "
       "https://ui.perfetto.dev or chrome://tracing. A job id is looked up "
       "on the coordinator.",
       Join({kClientFlags, {"out"}})},
      {"cancel", "pstrain cancel JOB_ID [--coordinator=HOST:PORT]",
       "Cancels a job; its tasks stop at their next heartbeat.", kClientFlags},
      {"wait", "pstrain wait JOB_ID [--coordinator=HOST:PORT]",
       "Follows a job's lines until it ends; exit 0 if it succeeded, 1 "
       "otherwise.",
       Join({kClientFlags, {"wait_poll_ms"}})},
      {"launch-lines",
       "pstrain launch-lines JOB.pbtxt --launcher=slurm|mpirun|ssh "
       "[--coordinator=HOST:PORT] [--job=ID] [--bin_dir=DIR] [--sbatch]",
       "Prints a script that starts the job's tasks with a cluster launcher "
       "and waits for them. A flag the script would ignore (--nodes or "
       "--gpus_per_node without --agent, --cpus_per_task without slurm, "
       "...) is an error.",
       {"launcher", "coordinator", "job", "bin_dir", "sbatch", "cpus_per_task",
        "agent", "nodes", "gpus_per_node", "ps_binary", "worker_binary"}},
      {"install",
       "pstrain install --prefix=DIR",
       "Copies pstrain, pstrain_ps, pstrain_worker and pstrain_coordinator "
       "to DIR/bin.",
       {"prefix", "ps_binary", "worker_binary"}},
      {"certs",
       "pstrain certs --out=DIR [--nodes_out=NODES --num_ps=N "
       "--num_workers=M --job=ID --hosts=H,...]",
       "Makes a CA and the mutual-TLS certificates of a cluster.",
       {"out", "nodes_out", "hosts", "num_ps", "num_workers", "job"}},
      {"node",
       "pstrain node --coordinator=HOST:PORT --job=ID",
       "Starts this node's tasks of a job, restarts the ones that die "
       "(within the job's max_restarts) and waits for them. A flag the job "
       "would ignore (--node_rank or --num_nodes when its spec lists hosts, "
       "--gpus_per_node with a cpu backend, ...) is an error.",
       {"coordinator", "job", "bin_dir", "gpus_per_node", "node_rank",
        "num_nodes", "node_grace_s", "ps_binary", "worker_binary", "tls_dir",
        "insecure", "insecure_allow_remote"}},
      {"help",
       "pstrain help [COMMAND]",
       "Lists the commands, or one command's synopsis and flags with their "
       "defaults.",
       {}},
  };
  return *commands;
}

const CommandInfo* FindCommand(absl::string_view name) {
  for (const CommandInfo& command : Commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

std::string CommandsOverview() {
  std::string out =
      "pstrain: data-parallel training on a sharded parameter server.\n\n"
      "Commands:\n";
  for (const CommandInfo& command : Commands()) {
    absl::StrAppend(&out, "  ", command.synopsis, "\n");
  }
  absl::StrAppend(&out,
                  "\n`pstrain help COMMAND` (or `pstrain COMMAND --help`) "
                  "lists a command's flags with their defaults; `pstrain "
                  "--help` lists every flag.\n");
  return out;
}

std::string CommandHelp(const CommandInfo& command) {
  std::string out =
      absl::StrCat("usage: ", command.synopsis, "\n\n", command.summary, "\n");
  if (!command.flags.empty()) absl::StrAppend(&out, "\nFlags:\n");
  for (const std::string& flag : command.flags) {
    absl::StrAppend(&out, FlagHelpText(flag), "\n");
  }
  return out;
}

absl::Status CheckFlagsOf(const CommandInfo& command) {
  for (const std::string& flag : SpecifiedFlags()) {
    bool known = false;
    for (const std::string& f : command.flags) known = known || f == flag;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " is not a flag of pstrain ", command.name,
          " (it would be ignored); see pstrain help ", command.name));
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
