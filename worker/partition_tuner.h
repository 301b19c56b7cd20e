// --partition_bytes=auto (issue 39 item 5): the partition size chosen by
// measurement before training's first step, in the style of Horovod's
// autotune.
//
// Worker 0 tries each candidate size in turn: the shards take the job's
// initial weights cut at that size (candidate i at generation i: the first
// an Init, the others restores that re-lay the shards out,
// ParameterShard::Initialize), and every worker runs `warmup_rounds` +
// `rounds` exchange rounds of zero gradients through a client of that
// partition (the job's client options: mode, wire format, channels,
// clipping, backup workers; top-k through a throwaway compressor), then
// closes its streams. Worker 0 times its own rounds after the warm-up and
// keeps the size of the smallest median, ties to the earlier candidate;
// then it restores the job's initial state (the weights, zero optimizer
// state, version 0) cut at that size, at generation n (n candidates). The
// updates of the trial rounds are thrown away with their generations, so
// the job then trains from exactly the state a job with that size fixed
// starts from.
//
// The other workers learn each trial's partition, and the choice, from
// WaitReady's layout: they follow the generations up, run the rounds of
// each trial generation below n they reach (an ABORTED round means worker
// 0 has moved on: they go on to the next one) and stop at generation n.
// A failure during the tuning (a task's death) fails the tuning: the
// worker's error, which a restart (--max_restarts) recovers from as from
// any other; a rejoining task does not tune again.
//
// Thread-compatible: one call per worker thread.
#ifndef PSTRAIN_WORKER_PARTITION_TUNER_H_
#define PSTRAIN_WORKER_PARTITION_TUNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/ps_client.h"

namespace pstrain {

struct PartitionTunerOptions {
  // The sizes to try, in order (PartitionCandidates()); at least one.
  std::vector<int64_t> candidates;
  // Rounds per candidate: untimed ones first (streams opening), then the
  // timed ones whose median counts.
  int warmup_rounds = 1;
  int rounds = 5;
  // The job's step rule: sync (a round's pull waits for version k + 1, or
  // k + 1 - staleness, at least 1) or async (pushes, then the newest).
  bool sync = true;
  int staleness = 0;
  // Each wait for the shards (WaitReady, a restore).
  absl::Duration init_timeout = absl::Seconds(120);
};

struct PartitionTrial {
  int64_t partition_bytes = 0;
  // Worker 0's median exchange round, milliseconds (0 on other workers).
  double ms_per_step = 0;
};

struct PartitionChoice {
  int64_t partition_bytes = 0;
  // The generation at which the shards hold the job's initial state with
  // that partition.
  int64_t generation = 0;
  // Worker 0: every candidate tried, in order; others: empty.
  std::vector<PartitionTrial> trials;
};

// The candidates for a model of tensors `tensor_num_elements` (fp32): 256
// KiB, 1 MiB, 4 MiB and 16 MiB, less those that cut no tensor, but for the
// smallest of these (larger ones give the same plan, each tensor one
// chunk). Never empty.
std::vector<int64_t> PartitionCandidates(
    const std::vector<int64_t>& tensor_num_elements);

// Runs the tuning on this worker. `client`: the job's client of some
// partition (connected to the shards, no step begun; its options are the
// trials'). `initial` (worker 0; others: empty): the job's initial weights,
// per PS tensor. `trial_compressor`: with top-k compression, a compressor
// of the job's options that is not the job's (its residuals are thrown
// away); null otherwise. The shards must be uninitialised (a fresh job).
// Errors: the first failing call's, naming the candidate.
absl::StatusOr<PartitionChoice> TunePartition(
    const PartitionTunerOptions& options, const PsClient& client,
    const std::vector<absl::Span<const float>>& initial, bool chief,
    TopKCompressor* trial_compressor);

// "partition_bytes auto: tried 256 KiB (1.52 ms/step), 1 MiB (1.31
// ms/step); chose 1 MiB".
std::string DescribePartitionChoice(const PartitionChoice& choice);

// 262144 -> "256 KiB", 4194304 -> "4 MiB", 1000 -> "1000 B".
std::string FormatPartitionBytes(int64_t bytes);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PARTITION_TUNER_H_
