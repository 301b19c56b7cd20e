// The flags of the pstrain binary (run, compare, eval, ...), defined in
// pstrain_flags.cc and read by pstrain.cc's commands. Both files are the
// binary's own sources (cli/BUILD's pstrain), not a library: no other
// binary links these flags. Each flag's help, with its unit and default,
// is at its definition.
#ifndef PSTRAIN_CLI_PSTRAIN_FLAGS_H_
#define PSTRAIN_CLI_PSTRAIN_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/strings/string_view.h"
#include "catalog/job_config.h"

namespace pstrain {

// --partition_bytes: bytes, or "auto" (JobSpec.partition_bytes_auto).
struct PartitionBytesFlag {
  bool automatic = false;
  int64_t bytes = 4 << 20;
};

bool AbslParseFlag(absl::string_view text, PartitionBytesFlag* value,
                   std::string* error);
std::string AbslUnparseFlag(const PartitionBytesFlag& value);

}  // namespace pstrain

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, num_ps);
ABSL_DECLARE_FLAG(int, num_workers);
ABSL_DECLARE_FLAG(int, batch_size);
ABSL_DECLARE_FLAG(int, epochs);
ABSL_DECLARE_FLAG(pstrain::Mode, mode);
ABSL_DECLARE_FLAG(int64_t, bucket_bytes);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(double, beta1);
ABSL_DECLARE_FLAG(double, beta2);
ABSL_DECLARE_FLAG(double, epsilon);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(pstrain::OptimizerAlgorithm, optimizer);
ABSL_DECLARE_FLAG(double, momentum);
ABSL_DECLARE_FLAG(double, dampening);
ABSL_DECLARE_FLAG(bool, nesterov);
ABSL_DECLARE_FLAG(pstrain::LrScheduleKind, lr_schedule);
ABSL_DECLARE_FLAG(int64_t, warmup_steps);
ABSL_DECLARE_FLAG(int64_t, lr_step_size);
ABSL_DECLARE_FLAG(double, lr_gamma);
ABSL_DECLARE_FLAG(double, lr_min);
ABSL_DECLARE_FLAG(int64_t, lr_total_steps);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(double, dropout);
ABSL_DECLARE_FLAG(std::string, results_json);
ABSL_DECLARE_FLAG(int, log_every_steps);
ABSL_DECLARE_FLAG(std::string, metrics_dir);
ABSL_DECLARE_FLAG(bool, trace);
ABSL_DECLARE_FLAG(pstrain::PartitionBytesFlag, partition_bytes);
ABSL_DECLARE_FLAG(std::string, wire_dtype);
ABSL_DECLARE_FLAG(std::string, compression);
ABSL_DECLARE_FLAG(bool, error_feedback);
ABSL_DECLARE_FLAG(int64_t, compression_warmup_steps);
ABSL_DECLARE_FLAG(double, compression_warmup_start);
ABSL_DECLARE_FLAG(bool, momentum_correction);
ABSL_DECLARE_FLAG(int64_t, compression_dense_steps);
ABSL_DECLARE_FLAG(bool, compression_freeze_adam_variance);
ABSL_DECLARE_FLAG(bool, delta_pulls);
ABSL_DECLARE_FLAG(int, channels_per_shard);
ABSL_DECLARE_FLAG(bool, priority_pulls);
ABSL_DECLARE_FLAG(bool, sparse_embeddings);
ABSL_DECLARE_FLAG(int64_t, max_steps_per_epoch);
ABSL_DECLARE_FLAG(std::string, ps_binary);
ABSL_DECLARE_FLAG(std::string, worker_binary);
ABSL_DECLARE_FLAG(pstrain::ComputeKind, compute);
ABSL_DECLARE_FLAG(double, compute_ms);
ABSL_DECLARE_FLAG(double, backward_fraction);
ABSL_DECLARE_FLAG(int64_t, model_bytes);
ABSL_DECLARE_FLAG(std::string, ps_netns);
ABSL_DECLARE_FLAG(std::string, worker_netns);
ABSL_DECLARE_FLAG(std::string, coordinator_host);
ABSL_DECLARE_FLAG(std::string, workers);
ABSL_DECLARE_FLAG(std::string, batch_sizes);
ABSL_DECLARE_FLAG(std::string, modes);
ABSL_DECLARE_FLAG(int, steps);
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(std::string, scaling);
ABSL_DECLARE_FLAG(int, repeats);
ABSL_DECLARE_FLAG(std::string, out_dir);
ABSL_DECLARE_FLAG(double, link_mbit);
ABSL_DECLARE_FLAG(bool, plot);
ABSL_DECLARE_FLAG(int, heartbeat_timeout_s);
ABSL_DECLARE_FLAG(int, registration_timeout_s);
ABSL_DECLARE_FLAG(std::string, init_from);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(int64_t, checkpoint_every_steps);
ABSL_DECLARE_FLAG(double, checkpoint_every_secs);
ABSL_DECLARE_FLAG(int, max_nonfinite_steps);
ABSL_DECLARE_FLAG(std::string, straggler);
ABSL_DECLARE_FLAG(int, staleness);
ABSL_DECLARE_FLAG(int, backup_workers);
ABSL_DECLARE_FLAG(int, max_workers);
ABSL_DECLARE_FLAG(int, min_workers);
ABSL_DECLARE_FLAG(bool, linear_lr_scaling);
ABSL_DECLARE_FLAG(bool, standby_workers);
ABSL_DECLARE_FLAG(int, max_ps);
ABSL_DECLARE_FLAG(std::string, control_file);
ABSL_DECLARE_FLAG(double, clip_grad_norm);
ABSL_DECLARE_FLAG(int, keep_checkpoints);
ABSL_DECLARE_FLAG(int, max_restarts);
ABSL_DECLARE_FLAG(bool, resume);
ABSL_DECLARE_FLAG(std::string, checkpoint);

#endif  // PSTRAIN_CLI_PSTRAIN_FLAGS_H_
