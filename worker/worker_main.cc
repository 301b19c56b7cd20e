// pstrain_worker: one data-parallel worker process (CPU or CUDA backend).
//
// Loads the dataset, builds the model, connects to every PS shard in
// --ps_addresses and trains its shard of the data (see worker/trainer.h).
// Worker 0 writes the job's results to --results_json when given.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags_util.h"
#include "google/protobuf/util/json_util.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, job_id, "local", "Job id sent with every request.");
ABSL_FLAG(int, worker_id, 0, "This worker's index in [0, num_workers).");
ABSL_FLAG(int, num_workers, 1, "Number of workers in the job.");
ABSL_FLAG(std::string, ps_addresses, "",
          "Comma-separated host:port of every PS shard, by shard index.");
ABSL_FLAG(std::string, model, "lenet5",
          "Model: alexnet, lenet5, mlp, resnet18/34/50/101 or vgg16.");
ABSL_FLAG(std::string, mode, "sync", "sync or async; must match the shards.");
ABSL_FLAG(int, batch_size, 64, "Samples per step on this worker.");
ABSL_FLAG(int, epochs, 2, "Epochs over the training set.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and the shuffles.");
ABSL_FLAG(int, log_every_steps, 200, "Steps between throughput lines.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20,
          "Largest chunk of a tensor on the wire, bytes.");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0,
          "If > 0, at most this many steps per epoch (short runs).");
ABSL_FLAG(std::string, results_json, "",
          "Worker 0: write the job's results here as JSON.");
ABSL_FLAG(int, init_timeout_s, 120,
          "Seconds to wait for the shards to be initialised.");
ABSL_FLAG(int, rpc_timeout_s, 60, "Deadline of each unary RPC, seconds.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("One pstrain data-parallel worker.");
  absl::ParseCommandLine(argc, argv);
  const std::string program = "pstrain_worker";

  pstrain::TrainerOptions options;
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_ps_addresses),
                                            ',', absl::SkipEmpty())) {
    options.ps_addresses.emplace_back(a);
  }
  if (options.ps_addresses.empty()) {
    pstrain::PrintError(program,
                        "--ps_addresses is empty; expected host:port[,...]");
    return 2;
  }
  if (options.num_workers <= 0 || options.worker_id < 0 ||
      options.worker_id >= options.num_workers) {
    pstrain::PrintError(
        program, absl::StrCat("--worker_id=", options.worker_id,
                              ": expected 0 <= worker_id < --num_workers=",
                              options.num_workers));
    return 2;
  }
  options.model = absl::GetFlag(FLAGS_model);
  options.mode = absl::GetFlag(FLAGS_mode);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  options.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  options.max_steps_per_epoch = absl::GetFlag(FLAGS_max_steps_per_epoch);
  options.init_timeout = absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s));
  options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));

  options.backend = absl::GetFlag(FLAGS_backend);
  options.gpu = absl::GetFlag(FLAGS_gpu);
  if (absl::Status s = pstrain::CheckBackendFlags(); !s.ok()) {
    pstrain::PrintError(program, s.message());
    return 2;
  }
  absl::StatusOr<pstrain::Dataset> dataset = pstrain::LoadDatasetFromFlags();
  if (!dataset.ok()) {
    pstrain::PrintError(program, dataset.status().message());
    return 2;
  }
  absl::StatusOr<pstrain::TrainerOutput> output =
      pstrain::RunWorker(options, *dataset);
  if (!output.ok()) {
    pstrain::PrintError(program,
                        absl::StrCat("worker ", options.worker_id, ": ",
                                     output.status().ToString()));
    return 1;
  }
  const std::string results_json = absl::GetFlag(FLAGS_results_json);
  if (options.worker_id == 0 && !results_json.empty()) {
    std::string json;
    google::protobuf::util::JsonPrintOptions print_options;
    print_options.add_whitespace = true;
    print_options.always_print_primitive_fields = true;
    print_options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(output->result, &json,
                                                      print_options);
    absl::Status status = pstrain::WriteFileAtomically(results_json, json);
    if (!status.ok()) {
      pstrain::PrintError(program, status.ToString());
      return 1;
    }
  }
  return 0;
}
