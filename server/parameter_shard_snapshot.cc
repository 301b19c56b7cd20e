// ParameterShard's snapshots: the immediate one (Snapshot(), SnapshotInto())
// and the deferred one a checkpoint takes with bounded staleness or backup
// workers (BeginDeferredSnapshot()); see parameter_shard.h.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/parameter_shard.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

absl::StatusOr<std::vector<ChunkSnapshot>> ParameterShard::Snapshot(
    int64_t expected_version) const {
  std::vector<ChunkSnapshot> out;
  absl::Status status = SnapshotInto(expected_version, &out);
  if (!status.ok()) return status;
  return out;
}

void ParameterShard::CopyChunkLocked(const ChunkState& chunk,
                                     ChunkSnapshot& out) const {
  out.spec = chunk.spec;
  out.is_buffer = plan_->is_buffer(chunk.spec.param_id);
  out.version = chunk.version;
  // Copy-assignment keeps the vectors' memory: a reused snapshot touches
  // no fresh pages.
  out.weights.assign(chunk.weights.data(),
                     chunk.weights.data() + chunk.weights.size());
  if (out.is_buffer) {
    out.m.clear();
    out.v.clear();
  } else {
    out.m = chunk.m;
    out.v = chunk.v;
  }
}

absl::Status ParameterShard::SnapshotInto(
    int64_t expected_version, std::vector<ChunkSnapshot>* out) const {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint of shard ", options_.shard_index,
                     " before it was initialised"));
  }
  out->resize(chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const ChunkState& chunk = *chunks_[i];
    absl::MutexLock lock(&chunk.mu);
    if (policy_.has_steps() && chunk.version != expected_version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint of step ", expected_version, ": chunk (",
          chunk.spec.param_id, ", ", chunk.spec.chunk_index, ") of shard ",
          options_.shard_index, " is at version ", chunk.version));
    }
    CopyChunkLocked(chunk, (*out)[i]);
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::VisitChunks(
    int64_t expected_version,
    const std::function<bool(const ChunkView&)>& visit) const {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("export of shard ", options_.shard_index,
                     " before it was initialised"));
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    const ChunkState& chunk = *c;
    absl::MutexLock lock(&chunk.mu);
    if (policy_.has_steps() && chunk.version != expected_version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export of step ", expected_version, ": chunk (", chunk.spec.param_id,
          ", ", chunk.spec.chunk_index, ") of shard ", options_.shard_index,
          " is at version ", chunk.version));
    }
    const bool is_buffer = plan_->is_buffer(chunk.spec.param_id);
    const ChunkView view{chunk.spec,
                         is_buffer,
                         chunk.version,
                         chunk.weights.span(),
                         is_buffer ? absl::Span<const float>() : chunk.m,
                         is_buffer ? absl::Span<const float>() : chunk.v};
    if (!visit(view)) {
      return absl::CancelledError(
          absl::StrCat("export of shard ", options_.shard_index, " given up"));
    }
  }
  return absl::OkStatus();
}

void ParameterShard::MaybeSnapLocked(ChunkState& chunk) {
  // At the cut's version with the step before it decided: no skip can put
  // this state back any more (a skip swaps back before the decision is
  // published in decided_through_).
  if (chunk.version != chunk.snap_version ||
      decided_through_.load() < chunk.version - 1) {
    return;
  }
  CopyChunkLocked(chunk, *chunk.snap_into);
  chunk.snap_into = nullptr;
  absl::MutexLock lock(&snap_mu_);
  if (snap_version_ == chunk.snap_version && --snap_remaining_ == 0) {
    snap_cv_.SignalAll();
  }
}

void ParameterShard::ClearChunkSnapshots() {
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock lock(&c->mu);
    c->snap_into = nullptr;
    c->snap_version = -1;
  }
}

absl::Status ParameterShard::BeginDeferredSnapshot(
    int64_t version, std::vector<ChunkSnapshot>* out) {
  const std::string what = absl::StrCat("checkpoint of step ", version,
                                        " on shard ", options_.shard_index);
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " before it was initialised"));
  }
  if (!policy_.has_steps()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": a deferred snapshot is for sync mode"));
  }
  // A cut no chunk can be near is refused before anything is registered
  // (see the header): it would only keep the writer waiting.
  const int64_t ahead = policy_.open_steps() + 1;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock lock(&c->mu);
    if (c->version + ahead < version) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": chunk (", c->spec.param_id, ", ", c->spec.chunk_index,
          ") is at version ", c->version, ", more than ", ahead,
          " steps behind it (a cut is at most that far ahead of the shard)"));
    }
  }
  // Whatever an earlier registration left goes first, so that no chunk
  // writes into `out` for it.
  ClearChunkSnapshots();
  out->resize(chunks_.size());
  {
    absl::MutexLock lock(&snap_mu_);
    snap_version_ = version;
    snap_generation_ = generation_.load();
    snap_remaining_ = static_cast<int64_t>(chunks_.size());
    snap_chunks_ = snap_remaining_;
  }
  absl::Status status;
  for (size_t i = 0; i < chunks_.size() && status.ok(); ++i) {
    ChunkState& chunk = *chunks_[i];
    absl::MutexLock lock(&chunk.mu);
    if (chunk.version > version) {
      status = absl::FailedPreconditionError(absl::StrCat(
          what, ": chunk (", chunk.spec.param_id, ", ", chunk.spec.chunk_index,
          ") is at version ", chunk.version,
          " already (a checkpoint is asked for before the step's push)"));
      continue;
    }
    chunk.snap_into = &(*out)[i];
    chunk.snap_version = version;
    MaybeSnapLocked(chunk);  // at once if it is at the cut already
  }
  if (!status.ok()) CancelDeferredSnapshot();
  return status;
}

absl::Status ParameterShard::AwaitDeferredSnapshot(
    int64_t version, absl::Time deadline,
    const std::atomic<bool>* cancelled) const {
  absl::MutexLock lock(&snap_mu_);
  while (true) {
    if (snap_version_ != version) {
      return absl::AbortedError(absl::StrCat("checkpoint of step ", version,
                                             " on shard ", options_.shard_index,
                                             ": its snapshot was cancelled"));
    }
    if (snap_remaining_ == 0) return absl::OkStatus();
    if (aborted_.load()) return AbortedStatus();
    if (absl::Status s = CheckGeneration(snap_generation_); !s.ok()) {
      return s;
    }
    if (cancelled != nullptr && cancelled->load()) {
      return absl::CancelledError(
          absl::StrCat("checkpoint of step ", version, " on shard ",
                       options_.shard_index, " cancelled"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("checkpoint of step ", version, " on shard ",
                       options_.shard_index, ": ", snap_remaining_, " of ",
                       snap_chunks_, " chunks have not reached that version"));
    }
    snap_cv_.WaitWithTimeout(&snap_mu_,
                             std::min(deadline - now, absl::Milliseconds(100)));
  }
}

void ParameterShard::CancelDeferredSnapshot() {
  if (!initialized_.load()) return;
  ClearChunkSnapshots();
  absl::MutexLock lock(&snap_mu_);
  snap_version_ = -1;
  snap_cv_.SignalAll();
}

}  // namespace pstrain
