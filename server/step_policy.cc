#include "server/step_policy.h"

#include "absl/strings/str_cat.h"

namespace pstrain {

StepPolicy::StepPolicy(const ShardOptions& options)
    : num_workers_(options.num_workers) {
  const int r = options.replicas_to_aggregate;
  if (options.mode == SyncMode::kAsync) {
    kind_ = Kind::kAsync;
  } else if (r > 0 && r < options.num_workers) {
    kind_ = Kind::kBackups;
    staleness_ = options.staleness;
    ends_to_decide_ = r;
    admission_arbiter_ = options.shard_index == 0;
  } else {
    kind_ = options.staleness > 0 ? Kind::kStaleness : Kind::kSync;
    staleness_ = options.staleness;
    ends_to_decide_ = options.num_workers;
  }
  if (kind_ != Kind::kAsync && options.clip_grad_norm > 0) {
    clip_grad_norm_ = options.clip_grad_norm;
  }
}

std::string StepPolicy::Describe() const {
  std::string text;
  switch (kind_) {
    case Kind::kSync:
      text = "sync";
      break;
    case Kind::kStaleness:
      text = absl::StrCat("sync with staleness ", staleness_);
      break;
    case Kind::kBackups:
      text = absl::StrCat("sync with backup workers (", ends_to_decide_, " of ",
                          num_workers_, ")");
      if (staleness_ > 0) absl::StrAppend(&text, " and staleness ", staleness_);
      break;
    case Kind::kAsync:
      text = "async";
      break;
  }
  if (clipping()) {
    absl::StrAppend(&text, ", clipping by global norm ", clip_grad_norm_);
  }
  return text;
}

StepPolicy::Members StepPolicy::averages() const {
  switch (kind_) {
    case Kind::kAsync:
      return Members::kOwnPush;
    case Kind::kBackups:
      return Members::kAdmitted;
    default:
      return Members::kEveryWorker;
  }
}

StepPolicy::Update StepPolicy::update() const {
  if (kind_ == Kind::kAsync) return Update::kEachPush;
  // Backups: the averaged set is known at the decision; clipping: the
  // coefficient is.
  if (kind_ == Kind::kBackups || clipping()) return Update::kAtDecision;
  return Update::kAtBarrier;
}

StepPolicy::Members StepPolicy::norm_members() const {
  return clipping() ? averages() : Members::kOwnPush;
}

StepPolicy::Cut StepPolicy::checkpoint_cut() const {
  switch (kind_) {
    case Kind::kSync:
      return Cut::kImmediate;
    case Kind::kStaleness:
      return Cut::kDeferred;
    case Kind::kBackups:
      return Cut::kPickedByShardZero;
    case Kind::kAsync:
      return Cut::kPerChunk;
  }
  return Cut::kImmediate;
}

StepPolicy::Rejoin StepPolicy::rejoin() const {
  // Async has no step to reopen at. With staleness a reopen drops the
  // pushes of every open step (at most one update is undoable); shards
  // that decided different steps (a worker died between its step ends to
  // two of them) restore the checkpoint instead (PsClient::Reopen).
  return kind_ != Kind::kAsync ? Rejoin::kReopenInPlace
                               : Rejoin::kRestoreCheckpoint;
}

}  // namespace pstrain
