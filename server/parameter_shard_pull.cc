// ParameterShard::Pull and its parts: a pull hands each chunk over once it
// reaches the version asked for, sends the shard's partial norm first when
// clipping, waits for the step's decision (sending every chunk again after
// a skip) and names what it still waits for at its deadline; see
// parameter_shard.h.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/parameter_shard.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

// Where one Pull() call stands.
struct ParameterShard::PullCursor {
  int64_t min_version = 0;
  // Sync: the step whose decision the pull waits for (see EndStep()); -1:
  // none.
  int64_t deciding = -1;
  // The chunks asked for (PullSubset).
  PullSubset subset;
  // Per chunk (local index): visited in this round, or not asked for.
  std::vector<bool> sent;
  size_t remaining = 0;
  // Every chunk before it is sent: where a scan starts.
  size_t first_unsent = 0;
  // Marks every chunk asked for unsent (a round's start).
  void Reset(size_t num_chunks) {
    sent.assign(num_chunks, true);
    remaining = 0;
    first_unsent = 0;
    for (size_t i = static_cast<size_t>(subset.index); i < num_chunks;
         i += static_cast<size_t>(subset.count)) {
      sent[i] = false;
      ++remaining;
    }
  }
  // Step `deciding` was skipped: every chunk is being sent again.
  bool resent = false;
  // Clipping: this shard's partial of step `deciding` went out (sent once,
  // before the pull's last message); true when none is due.
  bool norm_sent = true;
  // PullOrder::decided: the decision was announced; true when none is due.
  bool decision_sent = true;
};

absl::Status ParameterShard::Pull(int64_t min_version, int64_t samples,
                                  absl::Time deadline, const PullVisitor& visit,
                                  const std::function<bool()>& after_chunk,
                                  const std::atomic<bool>* cancelled,
                                  int64_t generation, SkippedStepInfo* skipped,
                                  const NormVisitor& norm_partial,
                                  PullSubset subset, const PullOrder& order) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pull from shard ", options_.shard_index,
                     " before it was initialised"));
  }
  // Backup workers: counted from the admitted ends instead.
  if (!policy_.samples_from_admitted_ends()) {
    samples_.fetch_add(samples, std::memory_order_relaxed);
  }
  if (subset.count < 1 || subset.index < 0 || subset.index >= subset.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of chunks i % ", subset.count, " == ", subset.index,
                     " from shard ", options_.shard_index,
                     ": expected 0 <= channel < channels"));
  }
  // A worker's pulls over several streams count once (its first).
  if (subset.index == 0) pulls_.fetch_add(1, std::memory_order_relaxed);
  PullCursor cursor;
  cursor.min_version = min_version;
  cursor.subset = subset;
  cursor.Reset(chunks_.size());
  cursor.deciding =
      policy_.has_steps() && min_version >= 1 ? min_version - 1 : -1;
  cursor.norm_sent = !clipping() || cursor.deciding < 0 || subset.index != 0;
  // With clipping the chunks wait for the norm: no early word.
  cursor.decision_sent = !order.decided || cursor.deciding < 0 || clipping();
  if (!cursor.norm_sent && !norm_partial) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pull of version ", min_version, " from shard ", options_.shard_index,
        ", which clips gradients, without a way to send its partial norm"));
  }
  while (true) {
    int64_t seen;
    {
      absl::MutexLock lock(&updates_mu_);
      seen = updates_;
    }
    if (absl::Status s = SendNormPartialIfReady(cursor, norm_partial);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = AnnounceDecisionIfReady(cursor, order); !s.ok()) {
      return s;
    }
    if (cursor.remaining == 0 && PullFinished(cursor, skipped)) {
      return absl::OkStatus();
    }
    absl::StatusOr<bool> progressed =
        VisitReadyChunks(cursor, generation, visit, after_chunk, order);
    if (!progressed.ok()) return progressed.status();
    if (*progressed) continue;
    // None ready: wait for the next update.
    if (absl::Status s =
            AwaitPullUpdate(seen, deadline, cancelled, generation, min_version);
        !s.ok()) {
      return s;
    }
    if (absl::Now() < deadline) continue;
    if (std::optional<absl::Status> timeout = PullTimeout(cursor)) {
      return *timeout;
    }
  }
}

absl::Status ParameterShard::PullCancelled() const {
  return absl::CancelledError(
      absl::StrCat("pull from shard ", options_.shard_index,
                   " cancelled: the worker's stream ended"));
}

absl::Status ParameterShard::SendNormPartialIfReady(
    PullCursor& cursor, const NormVisitor& norm_partial) {
  if (cursor.norm_sent) return absl::OkStatus();
  bool ready = chunks_.empty();  // a partial of 0
  double partial = 0;
  if (!ready) {
    absl::MutexLock lock(&step_mu_);
    if (norm_step_ == cursor.deciding) {
      ready = true;
      partial = norm_partial_;
    } else if (const NormDecision* d = RecentNormLocked(cursor.deciding)) {
      // Decided already by another worker's sum: this worker still
      // needs the partial (its own sum is checked against it).
      ready = true;
      partial = d->partial;
    }
  }
  if (!ready) return absl::OkStatus();
  cursor.norm_sent = true;
  if (!norm_partial(cursor.deciding, partial)) return PullCancelled();
  return absl::OkStatus();
}

bool ParameterShard::PullFinished(PullCursor& cursor,
                                  SkippedStepInfo* skipped) {
  if (cursor.deciding < 0 || chunks_.empty() || cursor.resent) return true;
  absl::MutexLock lock(&step_mu_);
  if (decided_step_ < cursor.deciding) return false;
  for (const SkippedStepInfo& skip : recent_skips_) {
    if (skip.step != cursor.deciding) continue;
    // Skipped: every chunk again, with its restored weights.
    if (skipped != nullptr) *skipped = skip;
    cursor.Reset(chunks_.size());
    cursor.resent = true;
  }
  return !cursor.resent;
}

absl::Status ParameterShard::AnnounceDecisionIfReady(PullCursor& cursor,
                                                     const PullOrder& order) {
  if (cursor.decision_sent || cursor.resent) return absl::OkStatus();
  {
    absl::MutexLock lock(&step_mu_);
    // Not decided yet, but every member said its step is finite
    // (NoteFiniteVerdict()): it cannot be skipped, so every chunk this pull
    // sends at its version is final: the word goes now.
    if (decided_step_ < cursor.deciding &&
        !FiniteByVerdictsLocked(cursor.deciding)) {
      return absl::OkStatus();
    }
    for (const SkippedStepInfo& skip : recent_skips_) {
      // Skipped: the pull's last message says so, after the chunks again.
      if (skip.step == cursor.deciding) {
        cursor.decision_sent = true;
        return absl::OkStatus();
      }
    }
  }
  cursor.decision_sent = true;
  if (!order.decided(cursor.deciding)) return PullCancelled();
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterShard::VisitReadyChunks(
    PullCursor& cursor, int64_t generation, const PullVisitor& visit,
    const std::function<bool()>& after_chunk, const PullOrder& order) {
  // Every chunk ready now, in plan order (which is (param_id, chunk_index)
  // order); front_first: only the first, so that the next round looks from
  // the front again.
  // The sent front is skipped at once: with front_first, where a pull
  // looks again from the front after every chunk, a pull of N chunks all
  // ready took N^2 / 2 checks of `sent` (22 ms for 4,000 chunks;
  // bench/pull_scan_bench).
  bool progressed = false;
  while (cursor.first_unsent < chunks_.size() &&
         cursor.sent[cursor.first_unsent]) {
    ++cursor.first_unsent;
  }
  for (size_t i = cursor.first_unsent; i < chunks_.size(); ++i) {
    if (cursor.sent[i]) continue;
    ChunkState& chunk = *chunks_[i];
    chunk.mu.Lock();
    if (aborted_.load()) {
      chunk.mu.Unlock();
      return AbortedStatus();
    }
    if (absl::Status current =
            CheckGenerationAt(generation, cursor.min_version);
        !current.ok()) {
      chunk.mu.Unlock();
      return current;
    }
    if (chunk.version < cursor.min_version) {
      chunk.mu.Unlock();
      continue;
    }
    ChunkDelta delta;
    if (order.visit_delta && DeltaLocked(chunk, order.have_version,
                                         order.wire_bytes, &delta) != nullptr) {
      order.visit_delta(chunk.spec, chunk.version, delta);
    } else if (order.visit_shared && chunk.spec.row_elements == 0 &&
               !chunk.weights.empty()) {
      order.visit_shared(chunk.spec, chunk.version, chunk.weights);
    } else {
      visit(chunk.spec, chunk.version, chunk.weights.span());
    }
    chunk.mu.Unlock();
    cursor.sent[i] = true;
    --cursor.remaining;
    progressed = true;
    if (after_chunk && !after_chunk()) return PullCancelled();
    if (order.front_first) break;
  }
  return progressed;
}

const ChunkDelta* ParameterShard::DeltaLocked(ChunkState& chunk,
                                              int64_t have_version,
                                              int wire_bytes,
                                              ChunkDelta* out) const {
  if (have_version < 0 || chunk.version != have_version + 1 ||
      chunk.prev_version != have_version || chunk.spec.row_elements > 0 ||
      plan_->is_buffer(chunk.spec.param_id)) {
    return nullptr;
  }
  if (chunk.delta_version != chunk.version) {
    // Once per chunk and version: the entries whose bits differ (a -0
    // that became +0 counts; the puller's copy must match bit for bit),
    // counted first so that a dense update (Adam's) stops at half the
    // chunk and stores nothing.
    const int64_t n = chunk.spec.num_elements;
    const int64_t most = n / 2;
    const float* now = chunk.weights.data();
    const float* before = chunk.prev_weights.data();
    // Compared as bits (memcpy: no float read as an integer).
    auto differs = [now, before](int64_t i) {
      uint32_t a, b;
      std::memcpy(&a, now + i, sizeof(a));
      std::memcpy(&b, before + i, sizeof(b));
      return a != b;
    };
    int64_t changed = 0;
    for (int64_t i = 0; i < n && changed < most; ++i) {
      changed += differs(i);
    }
    chunk.delta_indices.clear();
    chunk.delta_values.clear();
    chunk.delta_dense = changed >= most;
    if (!chunk.delta_dense) {
      chunk.delta_indices.reserve(changed);
      chunk.delta_values.reserve(changed);
      for (int64_t i = 0; i < n; ++i) {
        if (!differs(i)) continue;
        chunk.delta_indices.push_back(static_cast<uint32_t>(i));
        chunk.delta_values.push_back(now[i]);
      }
    }
    chunk.delta_index_bytes = IndexGapBytes(chunk.delta_indices);
    chunk.delta_version = chunk.version;
  }
  if (chunk.delta_dense ||
      PairsAtLeastDense(chunk.delta_index_bytes,
                        static_cast<int64_t>(chunk.delta_indices.size()),
                        chunk.spec.num_elements, wire_bytes)) {
    return nullptr;
  }
  out->indices = chunk.delta_indices;
  out->values = chunk.delta_values;
  out->index_bytes = chunk.delta_index_bytes;
  return out;
}

absl::Status ParameterShard::AwaitPullUpdate(int64_t seen, absl::Time deadline,
                                             const std::atomic<bool>* cancelled,
                                             int64_t generation,
                                             int64_t min_version) const {
  // In slices, so that a broken caller is noticed.
  auto changed = [this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return updates_ != seen || aborted_.load() || broken_.load();
  };
  const absl::Time slice =
      cancelled == nullptr
          ? deadline
          : std::min(deadline, absl::Now() + absl::Milliseconds(100));
  updates_mu_.LockWhenWithDeadline(absl::Condition(&changed), slice);
  updates_mu_.Unlock();
  if (aborted_.load()) return AbortedStatus();
  if (absl::Status current = CheckGenerationAt(generation, min_version);
      !current.ok()) {
    return current;
  }
  if (cancelled != nullptr && cancelled->load()) return PullCancelled();
  return absl::OkStatus();
}

std::optional<absl::Status> ParameterShard::PullTimeout(
    const PullCursor& cursor) const {
  const int64_t min_version = cursor.min_version;
  if (cursor.remaining == 0 || clipping()) {
    absl::MutexLock lock(&step_mu_);
    if (decided_step_ >= cursor.deciding) return std::nullopt;  // just now
    if (norm_step_ == cursor.deciding) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of version ", min_version, " from shard ", options_.shard_index,
          " timed out waiting for the global norm of "
          "step ",
          cursor.deciding,
          ": every worker ended the step, none sent "
          "the sum of the shards' partials"));
    }
    // The oldest undecided step (staleness: the slowest worker's).
    std::vector<int> missing;
    const StepEnds& ends = ends_[SlotIndex(ending_step_)];
    for (int w : AveragedWorkers(nullptr)) {
      if (!ends.ended[w]) missing.push_back(w);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "pull of version ", min_version, " from shard ", options_.shard_index,
        " timed out waiting for the end of step ", ending_step_,
        " from worker(s) ", absl::StrJoin(missing, ",")));
  }
  // Name the first chunk still waiting and whose push it lacks.
  size_t first = 0;
  while (cursor.sent[first]) ++first;
  const ChunkState& chunk = *chunks_[first];
  absl::MutexLock lock(&chunk.mu);
  if (chunk.version >= min_version) return std::nullopt;  // arrived just now
  std::vector<int> missing;
  const StepSlot& slot = chunk.slots[SlotIndex(chunk.version)];
  for (int w : AveragedWorkers(nullptr)) {
    if (!slot.has_pending[w]) missing.push_back(w);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "pull of version ", min_version, " from shard ", options_.shard_index,
      " timed out at chunk (", chunk.spec.param_id, ", ",
      chunk.spec.chunk_index, "), still at version ", chunk.version,
      "; no push yet from worker(s) ", absl::StrJoin(missing, ",")));
}

}  // namespace pstrain
