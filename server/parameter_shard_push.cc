// ParameterShard's chunk store and push path: the checks of a push, the
// pushes' slots, the barrier's average and update (undoable or final, as
// the StepPolicy says), async updates and overflow records; see
// parameter_shard.h.
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/nonfinite.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "server/parameter_shard.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

absl::Status ParameterShard::Push(int worker_id, int32_t param_id,
                                  int32_t chunk_index, int64_t step,
                                  absl::Span<const float> gradient,
                                  int64_t generation) {
  return Push(
      worker_id, param_id, chunk_index, step,
      static_cast<int64_t>(gradient.size()),
      [gradient](absl::Span<float> out) -> absl::StatusOr<int64_t> {
        std::copy(gradient.begin(), gradient.end(), out.begin());
        return FindNonFinite(out);
      },
      generation);
}

absl::StatusOr<ParameterShard::ChunkState*> ParameterShard::FindPushChunk(
    int worker_id, int32_t param_id, int32_t chunk_index,
    int64_t num_elements) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push to shard ", options_.shard_index, " before it was initialised"));
  }
  if (absl::Status s = CheckMember(worker_id); !s.ok()) return s;
  const int global = plan_->FindChunk(param_id, chunk_index);
  if (global < 0 || local_index_[global] < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk (", param_id, ", ", chunk_index,
                     ") is not owned by shard ", options_.shard_index));
  }
  ChunkState& chunk = *chunks_[local_index_[global]];
  const int64_t n = chunk.spec.num_elements;
  if (num_elements >= 0 && num_elements != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk (", param_id, ", ", chunk_index, ") push has ",
                     num_elements, " elements; expected ", n));
  }
  return &chunk;
}

absl::Status ParameterShard::Push(int worker_id, int32_t param_id,
                                  int32_t chunk_index, int64_t step,
                                  int64_t num_elements, GradientSource fill,
                                  int64_t generation) {
  absl::StatusOr<ChunkState*> found =
      FindPushChunk(worker_id, param_id, chunk_index, num_elements);
  if (!found.ok()) return found.status();
  ChunkState& chunk = **found;
  const int64_t n = chunk.spec.num_elements;
  if (chunk.spec.row_elements > 0) {
    // A dense push to a row-sparse chunk: every row touched.
    return PushRows(
        worker_id, param_id, chunk_index, step,
        [&](int64_t, int64_t row_elements, RowValues* out) {
          thread_local std::vector<float> dense;
          dense.resize(n);
          // PushRows scans the rows' values itself.
          absl::StatusOr<int64_t> filled = fill(absl::MakeSpan(dense));
          if (filled.ok()) AllRows(dense, row_elements, out);
          return filled.status();
        },
        generation);
  }
  absl::MutexLock lock(&chunk.mu);
  // Under the chunk's lock: a restore bumps the generation before it
  // replaces any chunk, so no push of the older one lands in restored state.
  absl::Status current = CheckGeneration(generation);
  if (!current.ok()) return current;
  if (policy_.update() == StepPolicy::Update::kEachPush) {
    chunk.incoming.resize(n);
    absl::StatusOr<int64_t> filled = fill(absl::MakeSpan(chunk.incoming));
    if (!filled.ok()) return filled.status();
    RETURN_IF_ERROR(
        CheckFinite(param_id, chunk_index, step, chunk.incoming, *filled));
    pushes_.fetch_add(1, std::memory_order_relaxed);
    if (plan_->is_buffer(param_id)) {
      // The average of every worker's latest values, in worker-id order.
      StepSlot& latest = chunk.slots[0];
      if (!latest.has_pending[worker_id]) {
        latest.has_pending[worker_id] = true;
        ++chunk.num_latest;
      }
      latest.pending[worker_id].swap(chunk.incoming);
      UpdateScratch& out = ThreadUpdateScratch();
      float* const sum = out.w.overwrite_data(n);
      std::fill(sum, sum + n, 0.0f);
      for (int w = 0; w < options_.num_workers; ++w) {
        if (!latest.has_pending[w]) continue;
        const float* v = latest.pending[w].data();
        for (int64_t i = 0; i < n; ++i) sum[i] += v[i];
      }
      const float scale = 1.0f / static_cast<float>(chunk.num_latest);
      for (int64_t i = 0; i < n; ++i) sum[i] *= scale;
      if (NoteOverflow(chunk, chunk.version, out.w.span())) {
        return absl::OkStatus();
      }
      chunk.prev_version = -1;
      chunk.weights.swap(out.w);
      ++chunk.version;
      NoteUpdate();
      return absl::OkStatus();
    }
    ApplyLocked(chunk, chunk.incoming.data(), step);
    return absl::OkStatus();
  }
  if (policy_.drops_late_pushes() && step < chunk.version) {
    // A late worker's push of a step decided without it.
    late_pushes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (absl::Status ok = CheckSyncPushLocked(chunk, worker_id, step, "push");
      !ok.ok()) {
    return ok;
  }
  // The slot is only read once has_pending is set, so a failed fill leaves
  // nothing behind.
  StepSlot& slot = chunk.slots[SlotIndex(step)];
  slot.pending[worker_id].resize(n);
  absl::StatusOr<int64_t> filled =
      fill(absl::MakeSpan(slot.pending[worker_id]));
  if (!filled.ok()) return filled.status();
  RETURN_IF_ERROR(CheckFinite(param_id, chunk_index, step,
                              slot.pending[worker_id], *filled));
  pushes_.fetch_add(1, std::memory_order_relaxed);
  slot.has_pending[worker_id] = true;
  ++slot.num_pending;
  MaybeCompleteLocked(chunk);
  return absl::OkStatus();
}

void ParameterShard::MaybeCompleteLocked(ChunkState& chunk) {
  // A checkpoint's cut comes before the update that takes the chunk past it.
  if (chunk.snap_into != nullptr) MaybeSnapLocked(chunk);
  // Backup workers: the update waits for the step's admitted set;
  // clipping: for the step's norm.
  if (policy_.update() != StepPolicy::Update::kAtBarrier) return;
  // Step version - 1 decided: its update can no longer be put back, so the
  // undo buffers are free for this one. Read under the chunk's lock and
  // stored by EndStep() before it takes the lock, so a step completed here
  // and one decided there are never both missed.
  if (chunk.slots[SlotIndex(chunk.version)].num_pending == NumMembers() &&
      decided_through_.load() >= chunk.version - 1) {
    CompleteBarrierLocked(chunk);
  }
}

absl::Status ParameterShard::CheckSyncPushLocked(const ChunkState& chunk,
                                                 int worker_id, int64_t step,
                                                 absl::string_view what) const {
  const int32_t param_id = chunk.spec.param_id;
  const int32_t chunk_index = chunk.spec.chunk_index;
  const int s = policy_.staleness();
  if (step < chunk.version || step > chunk.version + s) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " of chunk (", param_id, ", ", chunk_index, ") for step ", step,
        " but the chunk is at version ", chunk.version,
        s == 0 ? ""
               : absl::StrCat(" (staleness ", s, ": steps ", chunk.version,
                              " to ", chunk.version + s, ")")));
  }
  if (step > decided_through_.load() + 1 + s) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " of chunk (", param_id, ", ", chunk_index,
                     ") for step ", step, " before step ", step - 1 - s,
                     " was decided (not every worker has ended it)"));
  }
  if (chunk.slots[SlotIndex(step)].has_pending[worker_id]) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, " pushed chunk (", param_id, ", ",
                     chunk_index, ") of step ", step, " twice"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::PushSkipped(int worker_id, int32_t param_id,
                                         int32_t chunk_index, int64_t step,
                                         int64_t generation) {
  absl::StatusOr<ChunkState*> found =
      FindPushChunk(worker_id, param_id, chunk_index, /*num_elements=*/-1);
  if (!found.ok()) return found.status();
  ChunkState& chunk = **found;
  if (policy_.takes_verdicts()) {
    // A worker cannot take back its verdict (NoteFiniteVerdict()).
    absl::MutexLock step_lock(&step_mu_);
    if (step == ending_step_ && !ends_.empty() &&
        ends_[SlotIndex(step)].said_finite[worker_id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, " skipped chunk (", param_id, ", ", chunk_index,
          ") of step ", step, " on shard ", options_.shard_index,
          " after its verdict that every value of the step was finite"));
    }
  }
  absl::MutexLock lock(&chunk.mu);
  absl::Status current = CheckGeneration(generation);
  if (!current.ok()) return current;
  if (policy_.update() == StepPolicy::Update::kEachPush) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (policy_.drops_late_pushes() && step < chunk.version) {
    late_pushes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (absl::Status ok =
          CheckSyncPushLocked(chunk, worker_id, step, "skipped push");
      !ok.ok()) {
    return ok;
  }
  StepSlot& slot = chunk.slots[SlotIndex(step)];
  slot.has_pending[worker_id] = true;
  slot.skipped = true;
  ++slot.num_pending;
  MaybeCompleteLocked(chunk);
  return absl::OkStatus();
}

namespace {

// Nanoseconds on the steady clock since `start`.
int64_t ElapsedNs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

ParameterShard::UpdateScratch& ParameterShard::ThreadUpdateScratch() {
  thread_local UpdateScratch scratch;
  return scratch;
}

bool ParameterShard::NoteOverflow(const ChunkState& chunk, int64_t step,
                                  absl::Span<const float> updated) {
  const int64_t i = FindNonFinite(updated);
  if (i < 0) return false;
  absl::MutexLock lock(&overflow_mu_);
  ++overflowed_;
  last_overflow_ = absl::StrCat("update of chunk (", chunk.spec.param_id, ", ",
                                chunk.spec.chunk_index, ") for step ", step,
                                " overflowed to ", NonFiniteText(updated[i]),
                                " at element ", i, "; not applied");
  return true;
}

float* ParameterShard::AverageInto(StepSlot& slot,
                                   const std::vector<int>& workers, int64_t n) {
  float* sum = slot.pending[workers[0]].data();
  if (slot.averaged) return sum;
  for (size_t k = 1; k < workers.size(); ++k) {
    const float* g = slot.pending[workers[k]].data();
    for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  if (workers.size() > 1) {
    const float scale = 1.0f / static_cast<float>(workers.size());
    for (int64_t i = 0; i < n; ++i) sum[i] *= scale;
  }
  slot.averaged = true;
  return sum;
}

void ParameterShard::CompleteBarrierLocked(ChunkState& chunk,
                                           const std::vector<bool>* members,
                                           bool skip, float clip) {
  // The chunk's update: averaging and optimizer (common/trace.h).
  trace::Scope traced("update", "shard",
                      {{"param", chunk.spec.param_id},
                       {"chunk", chunk.spec.chunk_index},
                       {"step", chunk.version}});
  const int64_t n = chunk.spec.num_elements;
  const int64_t step = chunk.version;
  StepSlot& slot = chunk.slots[SlotIndex(step)];
  // The workers whose pushes go into the update, in worker-id order.
  const std::vector<int> workers = AveragedWorkers(members);
  // Kept (prev_version) only by a dense update's swap below.
  chunk.prev_version = -1;
  if (members == nullptr ? slot.skipped || skip : skip) {
    // A worker skips this step: nothing to apply, nothing to undo.
    chunk.undo_step = -1;
  } else if (chunk.spec.row_elements > 0) {
    ApplyRowBarrierLocked(chunk, slot, workers, clip);
  } else {
    // Average in worker-id order (into the first worker's slot, which the
    // next step refills), then one update, written beside the current
    // state.
    float* sum = AverageInto(slot, workers, n);
    if (clip != 1.0f && !plan_->is_buffer(chunk.spec.param_id)) {
      for (int64_t i = 0; i < n; ++i) sum[i] *= clip;
    }
    // Written whole: a pull reply still holding this storage keeps it.
    float* const updated = chunk.prev_weights.overwrite_data(n);
    const bool buffer = plan_->is_buffer(chunk.spec.param_id);
    const std::shared_ptr<const OptimizerOptions> options = optimizer();
    const bool updates_m = UpdatesFirstMoment(*options);
    const bool updates_v = UpdatesSecondMoment(*options);
    bool finite = false;  // false: NoteOverflow() looks
    if (buffer) {
      std::copy(sum, sum + n, updated);
    } else {
      if (updates_m) chunk.prev_m.resize(n);
      if (updates_v) chunk.prev_v.resize(n);
      const auto start = std::chrono::steady_clock::now();
      finite = OptimizerUpdateInto(*options, step + 1, chunk.weights.data(),
                                   sum, chunk.m.data(), chunk.v.data(), updated,
                                   chunk.prev_m.data(), chunk.prev_v.data(), n);
      optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
    }
    if (!finite && NoteOverflow(chunk, step, chunk.prev_weights.span())) {
      // Not applied: the chunk keeps its state, nothing to undo.
      chunk.undo_step = -1;
    } else {
      if (!buffer) {
        if (updates_m) chunk.m.swap(chunk.prev_m);
        if (updates_v) chunk.v.swap(chunk.prev_v);
      }
      chunk.weights.swap(chunk.prev_weights);
      chunk.prev_version = step;
      // Backup workers and clipping: decided already, nothing to undo.
      chunk.undo_step =
          policy_.update() == StepPolicy::Update::kAtBarrier ? step : -1;
      applied_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  chunk.version = step + 1;
  slot.skipped = false;
  slot.averaged = false;
  std::fill(slot.has_pending.begin(), slot.has_pending.end(), false);
  slot.num_pending = 0;
  NoteUpdate();
}

void ParameterShard::NoteUpdate() {
  absl::MutexLock lock(&updates_mu_);
  ++updates_;
}

void ParameterShard::ApplyLocked(ChunkState& chunk, const float* gradient,
                                 int64_t worker_step) {
  trace::Scope traced("update", "shard",
                      {{"param", chunk.spec.param_id},
                       {"chunk", chunk.spec.chunk_index},
                       {"step", chunk.version}});
  const int64_t n = chunk.spec.num_elements;
  // Written beside the current state, and swapped in only if finite.
  UpdateScratch& out = ThreadUpdateScratch();
  float* const w_out = out.w.overwrite_data(n);
  const std::shared_ptr<const OptimizerOptions> options = optimizer();
  const bool updates_m = UpdatesFirstMoment(*options);
  const bool updates_v = UpdatesSecondMoment(*options);
  if (updates_m) out.m.resize(n);
  if (updates_v) out.v.resize(n);
  const auto start = std::chrono::steady_clock::now();
  // Adam's bias correction counts this chunk's updates; the lr is that of
  // the pushing worker's step, as the horizon and the console count.
  const bool finite = OptimizerUpdateAtInto(
      *options, chunk.version + 1, worker_step, chunk.weights.data(), gradient,
      chunk.m.data(), chunk.v.data(), w_out, out.m.data(), out.v.data(), n);
  optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
  if (!finite && NoteOverflow(chunk, chunk.version, out.w.span())) return;
  chunk.prev_version = -1;
  chunk.weights.swap(out.w);
  if (updates_m) chunk.m.swap(out.m);
  if (updates_v) chunk.v.swap(out.v);
  ++chunk.version;
  applied_.fetch_add(1, std::memory_order_relaxed);
  NoteUpdate();
}

}  // namespace pstrain
