#include "worker/recovery.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pstrain {

Recovery::Recovery(RecoveryOptions options, GradientExchange* exchange,
                   ModelState initial_state, LoadWeightsFn load_weights,
                   LineFn say)
    : options_(std::move(options)),
      exchange_(exchange),
      initial_state_(std::move(initial_state)),
      load_weights_(std::move(load_weights)),
      say_(std::move(say)) {}

absl::StatusOr<ModelState> Recovery::RestoreState() {
  if (!options_.checkpoint_dir.empty()) {
    absl::StatusOr<CheckpointManifest> manifest =
        ReadLatestCheckpoint(options_.checkpoint_dir);
    if (manifest.ok()) {
      restore_source_ = manifest->dir;
      return LoadCheckpointState(*manifest, options_.tensor_names,
                                 options_.tensor_shapes, options_.num_buffers);
    }
    if (!absl::IsNotFound(manifest.status())) return manifest.status();
  }
  restore_source_ = "the initial weights (no checkpoint yet)";
  return initial_state_;
}

void Recovery::SayHowRestored(int64_t version) {
  if (exchange_->RecoveredInPlace()) {
    say_(absl::StrCat("Reopened the shards at their own state, version ",
                      version, " (no rollback)"));
    return;
  }
  const std::string why = exchange_->ReopenRefusal();
  // Async: the checkpoint's step is worker 0's, its version every worker's
  // pushes (the job goes on from version / num_workers).
  const std::string at =
      options_.sync
          ? ""
          : absl::StrCat("; version ", version, ", step ",
                         version / options_.num_workers, " of each worker");
  say_(absl::StrCat("Restored the shards to ", restore_source_,
                    why.empty() ? "" : " (", why, why.empty() ? "" : ")", at));
}

int64_t Recovery::StepOfVersion(int64_t version) const {
  return options_.sync ? version : version / options_.num_workers;
}

absl::StatusOr<int64_t> Recovery::Reconnect(
    const ModelState* restore,
    const std::vector<absl::Span<float>>* rejoin_weights) {
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  absl::Duration pause = absl::Milliseconds(100);
  while (true) {
    std::vector<std::string> addresses;
    if (options_.ps_addresses_fn) {
      ASSIGN_OR_RETURN(addresses, options_.ps_addresses_fn());
    }
    const absl::Duration attempt = std::max(
        absl::Seconds(1), std::min(absl::Seconds(5), deadline - absl::Now()));
    absl::StatusOr<int64_t> version =
        rejoin_weights != nullptr
            ? exchange_->Rejoin(*rejoin_weights, addresses, restore, attempt)
            : exchange_->Recover(addresses, restore, attempt);
    if (version.ok()) return version;
    const absl::Status& s = version.status();
    const bool again = absl::IsUnavailable(s) || absl::IsAborted(s) ||
                       absl::IsCancelled(s) || absl::IsDeadlineExceeded(s);
    if (!again || absl::Now() + pause > deadline) {
      return absl::Status(
          s.code(), absl::StrCat("reconnecting to the shards for ",
                                 absl::FormatDuration(options_.init_timeout),
                                 ": ", s.message()));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(2));
  }
}

absl::StatusOr<int64_t> Recovery::Recover(absl::Status cause, bool counted) {
  while (true) {
    const bool recoverable = absl::IsUnavailable(cause) ||
                             absl::IsAborted(cause) || absl::IsCancelled(cause);
    if (!enabled() || !recoverable) return cause;
    if (counted && recoveries_ >= max_recoveries()) {
      return absl::Status(cause.code(),
                          absl::StrCat("gave up after ", recoveries_,
                                       " recoveries: ", cause.message()));
    }
    const bool incremented = counted;
    if (counted) ++recoveries_;
    const absl::Time began = absl::Now();
    say_(absl::StrCat(
        "worker ", options_.worker_id, ": step failed (", cause.ToString(),
        counted ? absl::StrCat("); recovering (", recoveries_, " of at most ",
                               max_recoveries(), ")")
                : "); recovering (its second exchange: not counted)"));
    // A failed reconnect below is a new cause, counted.
    counted = true;
    if (writer_ != nullptr) {
      // The checkpoint in flight may have lost a shard: it never becomes
      // `latest` then. One that still needs this worker's own residual
      // file (a cut ahead of its step) is given up at once.
      exchange_->BeforeRecovery();
      if (absl::Status s = writer_->Wait(); !s.ok()) {
        say_(absl::StrCat("checkpoint abandoned: ", s.ToString()));
      }
    }
    ModelState state;
    if (chief()) {
      ASSIGN_OR_RETURN(state, RestoreState());
    }
    absl::StatusOr<int64_t> version =
        Reconnect(chief() ? &state : nullptr, /*rejoin_weights=*/nullptr);
    if (!version.ok()) {
      cause = version.status();
      continue;
    }
    if (chief()) SayHowRestored(*version);
    if (options_.elastic) {
      const std::optional<WorkerMembership> m = exchange_->membership();
      if (m.has_value() && m->epoch != membership_epoch_) {
        // The other workers' side of a membership change, not a failure.
        membership_epoch_ = m->epoch;
        if (incremented) --recoveries_;
      }
    }
    RETURN_IF_ERROR(load_weights_());
    const int64_t step = StepOfVersion(*version);
    say_(absl::StrFormat(
        "worker %d: recovered in %.2f s; going on from step %d (version %d)",
        options_.worker_id, absl::ToDoubleSeconds(absl::Now() - began), step,
        *version));
    return step;
  }
}

absl::StatusOr<int64_t> Recovery::Rejoin(
    const std::vector<absl::Span<float>>& weights) {
  ModelState state;
  if (chief()) {
    ASSIGN_OR_RETURN(state, RestoreState());
  }
  ASSIGN_OR_RETURN(const int64_t version,
                   Reconnect(chief() ? &state : nullptr, &weights));
  if (chief()) SayHowRestored(version);
  const int64_t step = StepOfVersion(version);
  say_(absl::StrCat("worker ", options_.worker_id, " rejoined the job at step ",
                    step));
  return step;
}

}  // namespace pstrain
