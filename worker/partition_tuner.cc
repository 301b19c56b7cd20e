#include "worker/partition_tuner.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/shard_checkpoint.h"

namespace pstrain {
namespace {

constexpr int64_t kCandidates[] = {256 << 10, 1 << 20, 4 << 20, 16 << 20};

// The job's initial state for a restore: `weights` with zero optimizer
// state at version 0 (empty m, v and version ranges).
ModelState InitialState(size_t num_tensors) {
  ModelState state;
  state.m.resize(num_tensors);
  state.v.resize(num_tensors);
  state.versions.resize(num_tensors);
  return state;
}

// Scratch tensors of the plan's sizes: zero gradients and pulled weights.
std::vector<std::vector<float>> ZerosOf(const PartitionPlan& plan) {
  std::vector<std::vector<float>> zeros;
  for (int64_t n : plan.param_num_elements()) zeros.emplace_back(n, 0.0f);
  return zeros;
}

// One candidate's rounds on `client` (at the trial's generation): the
// median of the timed rounds' wall times, ms. Closes the streams after.
absl::StatusOr<double> RunRounds(const PartitionTunerOptions& options,
                                 PsClient& client, TopKCompressor* compressor) {
  std::vector<std::vector<float>> gradients = ZerosOf(client.plan());
  std::vector<std::vector<float>> pulled = ZerosOf(client.plan());
  std::vector<absl::Span<const float>> push;
  std::vector<absl::Span<float>> weights;
  for (size_t t = 0; t < gradients.size(); ++t) {
    push.push_back(absl::MakeConstSpan(gradients[t]));
    weights.push_back(absl::MakeSpan(pulled[t]));
  }
  std::vector<double> times_ms;
  int64_t version = 0;
  const int total = options.warmup_rounds + options.rounds;
  for (int k = 0; k < total; ++k) {
    // Sync: step k, pulling version k + 1 (staleness s: k + 1 - s, at
    // least 1); async: the pulled version, then the newest.
    const int64_t step = options.sync ? k : version;
    const int64_t min_version =
        options.sync ? std::max<int64_t>(1, k + 1 - options.staleness) : 0;
    if (compressor != nullptr) compressor->BeginStep(step);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(version,
                     client.PushPull(step, push, min_version, 0, weights));
    if (k >= options.warmup_rounds) {
      times_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    if (compressor != nullptr) compressor->CommitStep(step);
  }
  // Every stream ends before the next re-layout (the shards wait for it).
  RETURN_IF_ERROR(client.CloseStreams());
  if (times_ms.empty()) return 0.0;
  std::sort(times_ms.begin(), times_ms.end());
  const size_t n = times_ms.size();
  return n % 2 == 1 ? times_ms[n / 2]
                    : (times_ms[n / 2 - 1] + times_ms[n / 2]) / 2;
}

absl::Status Annotate(const absl::Status& status, int64_t candidate) {
  return absl::Status(
      status.code(),
      absl::StrCat("partition_bytes auto, trying ",
                   FormatPartitionBytes(candidate), ": ", status.message()));
}

absl::StatusOr<PartitionChoice> TuneAsChief(
    const PartitionTunerOptions& options, const PsClient& base,
    const std::vector<absl::Span<const float>>& initial,
    TopKCompressor* trial_compressor) {
  const ModelState state = InitialState(initial.size());
  PartitionChoice choice;
  const int n = static_cast<int>(options.candidates.size());
  for (int i = 0; i < n; ++i) {
    const int64_t candidate = options.candidates[i];
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                       base.WithPartition(candidate, trial_compressor));
      // Candidate i at generation i: Init, then restores (re-layouts).
      if (i == 0) {
        RETURN_IF_ERROR(client->Initialize(initial));
      } else {
        RETURN_IF_ERROR(
            client->Restore(initial, state, options.init_timeout).status());
      }
      RETURN_IF_ERROR(client->WaitReady(options.init_timeout, i));
      ASSIGN_OR_RETURN(const double ms,
                       RunRounds(options, *client, trial_compressor));
      choice.trials.push_back({candidate, ms});
      return absl::OkStatus();
    }();
    if (!status.ok()) return Annotate(status, candidate);
  }
  const PartitionTrial* best = &choice.trials[0];
  for (const PartitionTrial& trial : choice.trials) {
    if (trial.ms_per_step < best->ms_per_step) best = &trial;
  }
  choice.partition_bytes = best->partition_bytes;
  // The job's initial state at the chosen size, generation n.
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   base.WithPartition(choice.partition_bytes));
  absl::StatusOr<int64_t> generation =
      client->Restore(initial, state, options.init_timeout);
  if (!generation.ok()) {
    return Annotate(generation.status(), choice.partition_bytes);
  }
  choice.generation = *generation;
  return choice;
}

absl::StatusOr<PartitionChoice> FollowChief(
    const PartitionTunerOptions& options, const PsClient& base,
    TopKCompressor* trial_compressor) {
  const int64_t n = static_cast<int64_t>(options.candidates.size());
  ASSIGN_OR_RETURN(
      std::unique_ptr<PsClient> client,
      base.WithPartition(base.plan().partition_bytes(), trial_compressor));
  int64_t next = 0;
  while (true) {
    int64_t partition_bytes = 0;
    RETURN_IF_ERROR(client->WaitReady(options.init_timeout, next,
                                      /*wait_for_connection=*/true,
                                      &partition_bytes));
    if (partition_bytes != client->plan().partition_bytes()) {
      ASSIGN_OR_RETURN(
          client, client->WithPartition(partition_bytes, trial_compressor));
    }
    const int64_t generation = client->generation();
    if (generation >= n) {
      PartitionChoice choice;
      choice.partition_bytes = partition_bytes;
      choice.generation = generation;
      return choice;
    }
    absl::StatusOr<double> ms = RunRounds(options, *client, trial_compressor);
    if (!ms.ok()) {
      // Worker 0 re-laid the shards out while this worker's rounds ran
      // (it ran ahead: async, backup workers): on to the next generation.
      if (!absl::IsAborted(ms.status())) {
        return Annotate(ms.status(), partition_bytes);
      }
      client->Reset();
    }
    next = generation + 1;
  }
}

}  // namespace

std::vector<int64_t> PartitionCandidates(
    const std::vector<int64_t>& tensor_num_elements) {
  int64_t largest = 0;
  for (int64_t n : tensor_num_elements) largest = std::max(largest, n * 4);
  std::vector<int64_t> candidates;
  for (int64_t c : kCandidates) {
    candidates.push_back(c);
    if (c >= largest) break;  // cuts nothing, as every larger one
  }
  return candidates;
}

absl::StatusOr<PartitionChoice> TunePartition(
    const PartitionTunerOptions& options, const PsClient& client,
    const std::vector<absl::Span<const float>>& initial, bool chief,
    TopKCompressor* trial_compressor) {
  if (options.candidates.empty() || options.rounds < 1 ||
      options.warmup_rounds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition tuning needs a candidate and a timed round; got ",
        options.candidates.size(), " candidates, ", options.rounds, " rounds, ",
        options.warmup_rounds, " warm-up rounds"));
  }
  return chief ? TuneAsChief(options, client, initial, trial_compressor)
               : FollowChief(options, client, trial_compressor);
}

std::string DescribePartitionChoice(const PartitionChoice& choice) {
  std::vector<std::string> tried;
  for (const PartitionTrial& trial : choice.trials) {
    tried.push_back(absl::StrFormat("%s (%.2f ms/step)",
                                    FormatPartitionBytes(trial.partition_bytes),
                                    trial.ms_per_step));
  }
  return absl::StrCat("partition_bytes auto: tried ",
                      tried.empty() ? "nothing" : absl::StrJoin(tried, ", "),
                      "; chose ", FormatPartitionBytes(choice.partition_bytes));
}

std::string FormatPartitionBytes(int64_t bytes) {
  if (bytes > 0 && bytes % (1 << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes > 0 && bytes % (1 << 10) == 0) {
    return absl::StrCat(bytes >> 10, " KiB");
  }
  return absl::StrCat(bytes, " B");
}

}  // namespace pstrain
