// ParameterShard's row-sparse chunks (issue 41): row pushes, their average
// and the lazy update (server/row_sparse.h), undone by rows; see
// parameter_shard.h ("row-sparse tensors").
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "server/parameter_shard.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

namespace {

int64_t ElapsedNs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

void ParameterShard::SetRowSparseLayout(
    std::vector<int64_t> param_row_elements) {
  absl::MutexLock lock(&init_mu_);
  row_elements_ = std::move(param_row_elements);
}

absl::Status ParameterShard::PushRows(int worker_id, int32_t param_id,
                                      int32_t chunk_index, int64_t step,
                                      RowSource fill, int64_t generation) {
  absl::StatusOr<ChunkState*> found =
      FindPushChunk(worker_id, param_id, chunk_index, /*num_elements=*/-1);
  if (!found.ok()) return found.status();
  ChunkState& chunk = **found;
  const int64_t n = chunk.spec.num_elements;
  const int64_t d = chunk.spec.row_elements;
  if (d <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row push to chunk (", param_id, ", ", chunk_index,
                     "), which is dense; expected a row-sparse tensor's"));
  }
  // Fills `out` and checks what came.
  auto take = [&](RowValues* out) {
    RETURN_IF_ERROR(fill(n, d, out));
    RETURN_IF_ERROR(CheckRowValues(param_id, chunk_index, n / d, d, *out));
    return CheckFinite(param_id, chunk_index, step, out->values,
                       FindNonFinite(out->values));
  };
  absl::MutexLock lock(&chunk.mu);
  RETURN_IF_ERROR(CheckGeneration(generation));
  if (policy_.update() == StepPolicy::Update::kEachPush) {
    RETURN_IF_ERROR(take(&chunk.incoming_rows));
    pushes_.fetch_add(1, std::memory_order_relaxed);
    ApplyRowsLocked(chunk, chunk.incoming_rows, step);
    return absl::OkStatus();
  }
  if (policy_.drops_late_pushes() && step < chunk.version) {
    late_pushes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckSyncPushLocked(chunk, worker_id, step, "push"));
  StepSlot& slot = chunk.slots[SlotIndex(step)];
  if (slot.row_pending.size() < slot.has_pending.size()) {
    slot.row_pending.resize(slot.has_pending.size());
  }
  // Read only once has_pending is set: a failed fill leaves nothing.
  RETURN_IF_ERROR(take(&slot.row_pending[worker_id]));
  pushes_.fetch_add(1, std::memory_order_relaxed);
  slot.has_pending[worker_id] = true;
  ++slot.num_pending;
  MaybeCompleteLocked(chunk);
  return absl::OkStatus();
}

RowValues& ParameterShard::AverageRowsLocked(StepSlot& slot,
                                             const std::vector<int>& workers,
                                             int64_t row_elements) {
  if (!slot.averaged) {
    std::vector<const RowValues*> pushes;
    for (int w : workers) pushes.push_back(&slot.row_pending[w]);
    AverageRows(pushes, row_elements, &slot.row_average);
    slot.averaged = true;
  }
  return slot.row_average;
}

void ParameterShard::ApplyRowBarrierLocked(ChunkState& chunk, StepSlot& slot,
                                           const std::vector<int>& workers,
                                           float clip) {
  const int64_t step = chunk.version;
  const int64_t d = chunk.spec.row_elements;
  RowValues& grad = AverageRowsLocked(slot, workers, d);
  if (clip != 1.0f) {
    for (float& g : grad.values) g *= clip;
  }
  const auto start = std::chrono::steady_clock::now();
  const bool finite = LazyUpdateRows(
      *optimizer(), step + 1, step, d, chunk.spec.num_elements / d, grad,
      chunk.weights.mutable_data(), chunk.m.data(), chunk.v.data(),
      &chunk.row_undo);
  optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
  if (!finite) {
    absl::MutexLock lock(&overflow_mu_);
    ++overflowed_;
    last_overflow_ = absl::StrCat("update of chunk (", chunk.spec.param_id,
                                  ", ", chunk.spec.chunk_index, ") for step ",
                                  step, " overflowed in one of its rows (",
                                  grad.rows.size(), " touched); not applied");
    chunk.undo_step = -1;
    return;
  }
  // Backup workers and clipping: decided already, nothing to undo.
  chunk.undo_step =
      policy_.update() == StepPolicy::Update::kAtBarrier ? step : -1;
  applied_.fetch_add(1, std::memory_order_relaxed);
}

bool ParameterShard::ApplyRowsLocked(ChunkState& chunk, const RowValues& grad,
                                     int64_t worker_step) {
  trace::Scope traced("update", "shard",
                      {{"param", chunk.spec.param_id},
                       {"chunk", chunk.spec.chunk_index},
                       {"step", chunk.version}});
  const auto start = std::chrono::steady_clock::now();
  const bool finite = LazyUpdateRows(
      *optimizer(), chunk.version + 1, worker_step, chunk.spec.row_elements,
      chunk.spec.num_elements / chunk.spec.row_elements, grad,
      chunk.weights.mutable_data(), chunk.m.data(), chunk.v.data(),
      &chunk.row_undo);
  optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
  if (!finite) {
    absl::MutexLock lock(&overflow_mu_);
    ++overflowed_;
    last_overflow_ = absl::StrCat(
        "update of chunk (", chunk.spec.param_id, ", ", chunk.spec.chunk_index,
        ") for step ", chunk.version, " overflowed in one of its rows (",
        grad.rows.size(), " touched); not applied");
    return false;
  }
  ++chunk.version;
  applied_.fetch_add(1, std::memory_order_relaxed);
  NoteUpdate();
  return true;
}

void ParameterShard::UndoLocked(ChunkState& chunk) {
  chunk.prev_version = -1;
  if (chunk.spec.row_elements > 0) {
    UndoRows(chunk.spec.row_elements, &chunk.row_undo,
             chunk.weights.mutable_data(), chunk.m.data(), chunk.v.data());
    return;
  }
  chunk.weights.swap(chunk.prev_weights);
  if (!plan_->is_buffer(chunk.spec.param_id)) {
    const std::shared_ptr<const OptimizerOptions> options = optimizer();
    if (UpdatesFirstMoment(*options)) chunk.m.swap(chunk.prev_m);
    if (UpdatesSecondMoment(*options)) chunk.v.swap(chunk.prev_v);
  }
}

}  // namespace pstrain
