#include "server/parameter_shard.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/trace.h"

namespace pstrain {

ParameterShard::ParameterShard(const ShardOptions& options)
    : options_(options) {}

absl::Status ParameterShard::CheckWorkerId(int worker_id) const {
  if (worker_id < 0 || worker_id >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker_id,
                                                   " is outside the job's [0, ",
                                                   options_.num_workers, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckWorker(const std::string& job_id,
                                         int worker_id) const {
  if (job_id != options_.job_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id \"", job_id, "\" does not match this shard's job \"",
        options_.job_id, "\""));
  }
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<InitChunk*>> ParameterShard::MatchInitChunks(
    const PartitionPlan& plan, const std::vector<int>& local_index,
    const std::vector<int64_t>& local_sizes,
    std::vector<InitChunk>& chunks) const {
  if (chunks.size() != local_sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("init sent ", chunks.size(), " chunks; shard ",
                     options_.shard_index, " owns ", local_sizes.size()));
  }
  std::vector<InitChunk*> by_local(local_sizes.size(), nullptr);
  for (InitChunk& c : chunks) {
    const int global = plan.FindChunk(c.param_id, c.chunk_index);
    if (global < 0 || local_index[global] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("init chunk (", c.param_id, ", ", c.chunk_index,
                       ") is not owned by shard ", options_.shard_index));
    }
    const int local = local_index[global];
    if (by_local[local] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init chunk (", c.param_id, ", ", c.chunk_index, ") sent twice"));
    }
    const size_t n = c.values.size();
    if (static_cast<int64_t>(n) != local_sizes[local]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init chunk (", c.param_id, ", ", c.chunk_index, ") has ", n,
          " elements; expected ", local_sizes[local]));
    }
    for (const std::vector<float>* moment : {&c.m, &c.v}) {
      if (!moment->empty() && moment->size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "init chunk (", c.param_id, ", ", c.chunk_index, ") has ",
            moment->size(), " Adam state elements; expected ", n));
      }
    }
    if (c.version < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("init chunk (", c.param_id, ", ", c.chunk_index,
                       ") has version ", c.version, "; expected >= 0"));
    }
    by_local[local] = &c;
  }
  return by_local;
}

absl::Status ParameterShard::Initialize(
    const std::vector<int64_t>& param_num_elements, int64_t partition_bytes,
    std::vector<InitChunk> chunks, int num_buffers, int64_t generation) {
  absl::MutexLock lock(&init_mu_);
  // Installs chunk `c` into `state` (whose lock is held).
  auto install = [this](InitChunk& c,
                        ChunkState& state) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const size_t n = c.values.size();
    state.weights = std::move(c.values);
    state.m = c.m.empty() ? std::vector<float>(n, 0.0f) : std::move(c.m);
    state.v = c.v.empty() ? std::vector<float>(n, 0.0f) : std::move(c.v);
    state.version = c.version;
    StepSlot empty;
    empty.pending.assign(options_.num_workers, {});
    empty.has_pending.assign(options_.num_workers, false);
    state.slots.assign(
        options_.mode == SyncMode::kSync ? options_.staleness + 1 : 1, empty);
    state.num_latest = 0;
    state.undo_step = -1;
    state.snap_into = nullptr;  // a restore ends the checkpoint's cut
  };
  // Sync steps restart at the chunks' version (equal in sync mode).
  auto reset_steps = [this](const std::vector<InitChunk*>& by_local) {
    int64_t version = 0;
    for (size_t i = 0; i < by_local.size(); ++i) {
      version = i == 0 ? by_local[i]->version
                       : std::min(version, by_local[i]->version);
    }
    absl::MutexLock step_lock(&step_mu_);
    ResetStepsLocked(version);
  };
  if (initialized_.load()) {
    if (generation <= generation_.load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard_index,
          " is already initialised (generation ", generation_.load(),
          "); a restore must name a higher generation, not ", generation));
    }
    // A restore: the same layout, every chunk replaced.
    if (param_num_elements != plan_->param_num_elements() ||
        partition_bytes != plan_->partition_bytes() ||
        num_buffers != plan_->num_buffers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore of shard ", options_.shard_index,
                       " sent another model layout than the job's (",
                       param_num_elements.size(), " tensors, ", partition_bytes,
                       " bytes per chunk)"));
    }
    std::vector<int64_t> sizes;
    for (const std::unique_ptr<ChunkState>& c : chunks_) {
      sizes.push_back(c->spec.num_elements);
    }
    absl::StatusOr<std::vector<InitChunk*>> by_local =
        MatchInitChunks(*plan_, local_index_, sizes, chunks);
    if (!by_local.ok()) return by_local.status();
    // From here on the older generation's pushes (checked under each
    // chunk's lock) and pulls are refused; the new generation's wait in
    // WaitReady() until init_mu_ is released.
    generation_.store(generation);
    reset_steps(*by_local);
    for (size_t i = 0; i < chunks_.size(); ++i) {
      absl::MutexLock chunk_lock(&chunks_[i]->mu);
      install(*(*by_local)[i], *chunks_[i]);
    }
    broken_.store(false);
    NoteUpdate();
    return absl::OkStatus();
  }
  absl::StatusOr<PartitionPlan> plan = PartitionPlan::Create(
      param_num_elements, partition_bytes, options_.num_shards, num_buffers);
  if (!plan.ok()) return plan.status();

  std::vector<int> local_index(plan->chunks().size(), -1);
  std::vector<std::unique_ptr<ChunkState>> states;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < plan->chunks().size(); ++i) {
    const ChunkSpec& spec = plan->chunks()[i];
    if (spec.shard != options_.shard_index) continue;
    local_index[i] = static_cast<int>(states.size());
    auto state = std::make_unique<ChunkState>();
    state->spec = spec;
    sizes.push_back(spec.num_elements);
    states.push_back(std::move(state));
  }
  absl::StatusOr<std::vector<InitChunk*>> by_local =
      MatchInitChunks(*plan, local_index, sizes, chunks);
  if (!by_local.ok()) return by_local.status();
  reset_steps(*by_local);
  for (size_t i = 0; i < states.size(); ++i) {
    absl::MutexLock chunk_lock(&states[i]->mu);
    install(*(*by_local)[i], *states[i]);
  }
  plan_ = std::make_unique<PartitionPlan>(*std::move(plan));
  chunks_ = std::move(states);
  local_index_ = std::move(local_index);
  generation_.store(generation);
  initialized_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterShard::Reopen(int64_t generation,
                                               int64_t expected_version) {
  absl::MutexLock lock(&init_mu_);
  const std::string shard = absl::StrCat("shard ", options_.shard_index);
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(shard,
                     " holds no state to reopen (not initialised: a restarted "
                     "shard takes a checkpoint)"));
  }
  if (options_.mode != SyncMode::kSync || options_.staleness != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard, " runs ",
        options_.mode == SyncMode::kSync ? "with bounded staleness" : "async",
        ": only a sync shard without staleness reopens at its own state"));
  }
  if (generation <= generation_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(shard, " is at generation ", generation_.load(),
                     "; a reopen must name a higher one, not ", generation));
  }
  // Freeze the current generation: from here its pushes (checked under
  // each chunk's lock) and step ends (under step_mu_) are refused.
  if (!broken_.load()) {
    absl::MutexLock abort_lock(&abort_mu_);
    broken_reason_ = "worker 0 is reopening the shards after a failure";
    broken_.store(true);
  }
  absl::MutexLock step_lock(&step_mu_);
  const int64_t version = decided_step_ + 1;
  if (expected_version >= 0 && version != expected_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard, " has decided step ", decided_step_, " and reopens at version ",
        version, ", not ", expected_version));
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (c->version != version && c->version != version + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          shard, ": chunk (", c->spec.param_id, ", ", c->spec.chunk_index,
          ") is at version ", c->version, ", not ", version, " or ",
          version + 1, " (step ", decided_step_, " decided)"));
    }
  }
  generation_.store(generation);
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (c->version == version + 1 && c->undo_step == version) {
      // The undecided update of step `version`: put back.
      c->weights.swap(c->prev_weights);
      if (!plan_->is_buffer(c->spec.param_id)) {
        c->m.swap(c->prev_m);
        c->v.swap(c->prev_v);
      }
    }
    c->version = version;
    c->undo_step = -1;
    for (StepSlot& slot : c->slots) {
      std::fill(slot.has_pending.begin(), slot.has_pending.end(), false);
      slot.num_pending = 0;
      slot.skipped = false;
      slot.averaged = false;
    }
  }
  ResetStepsLocked(version);
  broken_.store(false);
  NoteUpdate();
  return version;
}

absl::Status ParameterShard::WaitReady(absl::Time deadline,
                                       int64_t min_generation) const {
  absl::MutexLock lock(&init_mu_);
  auto ready = [this, min_generation]() {
    return (initialized_.load() && generation_.load() >= min_generation) ||
           aborted_.load();
  };
  // initialized_ only changes under init_mu_, so the condition is re-checked
  // whenever the mutex is released.
  if (!init_mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    if (initialized_.load()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", options_.shard_index, " was not restored to generation ",
          min_generation, " by worker 0 before the deadline (it is at ",
          generation_.load(), ")"));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", options_.shard_index,
                     " was not initialised by worker 0 before the deadline"));
  }
  if (aborted_.load()) return AbortedStatus();
  return absl::OkStatus();
}

absl::Status ParameterShard::AbortedStatus() const {
  absl::MutexLock lock(&abort_mu_);
  return absl::AbortedError(absl::StrCat("shard ", options_.shard_index,
                                         " aborted: ", abort_reason_));
}

absl::Status ParameterShard::CheckFinite(int32_t param_id, int32_t chunk_index,
                                         int64_t step,
                                         absl::Span<const float> values) const {
  const int64_t i = FindNonFinite(values);
  if (i < 0) return absl::OkStatus();
  const ChunkSpec& spec =
      plan_->chunks()[plan_->FindChunk(param_id, chunk_index)];
  return absl::InvalidArgumentError(absl::StrCat(
      "push of parameter ", param_id, ", chunk ", chunk_index, " (elements ",
      spec.offset, " to ", spec.offset + spec.num_elements - 1, ") of step ",
      step, " holds a non-finite value (", NonFiniteText(values[i]),
      " at element ", spec.offset + i,
      " of the parameter) not marked as a skipped push; not applied, the "
      "weights are unchanged"));
}

absl::Status ParameterShard::CheckGeneration(int64_t generation) const {
  const int64_t current = generation_.load();
  if (generation != current) {
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard_index, " is at generation ", current,
        " (restored by worker 0 after a failure); the request is of "
        "generation ",
        generation));
  }
  if (broken_.load()) {
    absl::MutexLock lock(&abort_mu_);
    return absl::AbortedError(
        absl::StrCat("shard ", options_.shard_index,
                     ": no step can complete: ", broken_reason_));
  }
  return absl::OkStatus();
}

void ParameterShard::BreakBarrier(int64_t generation,
                                  const std::string& reason) {
  if (options_.mode != SyncMode::kSync) return;
  {
    absl::MutexLock init_lock(&init_mu_);
    if (!initialized_.load() || generation != generation_.load() ||
        broken_.load()) {
      return;
    }
    absl::MutexLock lock(&abort_mu_);
    broken_reason_ = reason;
    broken_.store(true);
  }
  NoteUpdate();  // wakes the pulls, which see broken_
}

void ParameterShard::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
  }
  // Waiters re-check their conditions when the mutex they wait on is
  // released.
  { absl::MutexLock lock(&init_mu_); }
  if (!initialized_.load()) return;
  for (const std::unique_ptr<ChunkState>& chunk : chunks_) {
    absl::MutexLock lock(&chunk->mu);
  }
  NoteUpdate();  // wakes pulls waiting for any chunk
}

absl::Status ParameterShard::Push(int worker_id, int32_t param_id,
                                  int32_t chunk_index, int64_t step,
                                  absl::Span<const float> gradient,
                                  int64_t generation) {
  return Push(
      worker_id, param_id, chunk_index, step,
      static_cast<int64_t>(gradient.size()),
      [gradient](absl::Span<float> out) {
        std::copy(gradient.begin(), gradient.end(), out.begin());
        return absl::OkStatus();
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
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
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
  absl::MutexLock lock(&chunk.mu);
  // Under the chunk's lock: a restore bumps the generation before it
  // replaces any chunk, so no push of the older one lands in restored state.
  absl::Status current = CheckGeneration(generation);
  if (!current.ok()) return current;
  if (options_.mode == SyncMode::kAsync) {
    chunk.incoming.resize(n);
    absl::Status status = fill(absl::MakeSpan(chunk.incoming));
    if (status.ok()) {
      status = CheckFinite(param_id, chunk_index, step, chunk.incoming);
    }
    if (!status.ok()) return status;
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
      out.w.assign(n, 0.0f);
      for (int w = 0; w < options_.num_workers; ++w) {
        if (!latest.has_pending[w]) continue;
        const float* v = latest.pending[w].data();
        for (int64_t i = 0; i < n; ++i) out.w[i] += v[i];
      }
      const float scale = 1.0f / static_cast<float>(chunk.num_latest);
      for (int64_t i = 0; i < n; ++i) out.w[i] *= scale;
      if (NoteOverflow(chunk, chunk.version, out.w)) return absl::OkStatus();
      chunk.weights.swap(out.w);
      ++chunk.version;
      NoteUpdate();
      return absl::OkStatus();
    }
    ApplyLocked(chunk, chunk.incoming.data());
    return absl::OkStatus();
  }
  if (backup_workers() && step < chunk.version) {
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
  absl::Status status = fill(absl::MakeSpan(slot.pending[worker_id]));
  if (status.ok()) {
    status = CheckFinite(param_id, chunk_index, step, slot.pending[worker_id]);
  }
  if (!status.ok()) return status;
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
  if (backup_workers() || clipping()) return;
  // Step version - 1 decided: its update can no longer be put back, so the
  // undo buffers are free for this one. Read under the chunk's lock and
  // stored by EndStep() before it takes the lock, so a step completed here
  // and one decided there are never both missed.
  if (chunk.slots[SlotIndex(chunk.version)].num_pending ==
          options_.num_workers &&
      decided_through_.load() >= chunk.version - 1) {
    CompleteBarrierLocked(chunk);
  }
}

absl::Status ParameterShard::CheckSyncPushLocked(const ChunkState& chunk,
                                                 int worker_id, int64_t step,
                                                 absl::string_view what) const {
  const int32_t param_id = chunk.spec.param_id;
  const int32_t chunk_index = chunk.spec.chunk_index;
  const int s = options_.staleness;
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
  absl::MutexLock lock(&chunk.mu);
  absl::Status current = CheckGeneration(generation);
  if (!current.ok()) return current;
  if (options_.mode == SyncMode::kAsync) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (backup_workers() && step < chunk.version) {
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

int64_t ParameterShard::overflowed(std::string* last) const {
  absl::MutexLock lock(&overflow_mu_);
  if (last != nullptr) *last = last_overflow_;
  return overflowed_;
}

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
  std::vector<int> workers;
  for (int w = 0; w < options_.num_workers; ++w) {
    if (members == nullptr || (*members)[w]) workers.push_back(w);
  }
  if (members == nullptr ? slot.skipped || skip : skip) {
    // A worker skips this step: nothing to apply, nothing to undo.
    chunk.undo_step = -1;
  } else {
    // Average in worker-id order (into the first worker's slot, which the
    // next step refills), then one update, written beside the current
    // state.
    float* sum = AverageInto(slot, workers, n);
    if (clip != 1.0f && !plan_->is_buffer(chunk.spec.param_id)) {
      for (int64_t i = 0; i < n; ++i) sum[i] *= clip;
    }
    chunk.prev_weights.resize(n);
    const bool buffer = plan_->is_buffer(chunk.spec.param_id);
    bool finite = false;  // false: NoteOverflow() looks
    if (buffer) {
      std::copy(sum, sum + n, chunk.prev_weights.begin());
    } else {
      chunk.prev_m.resize(n);
      chunk.prev_v.resize(n);
      const auto start = std::chrono::steady_clock::now();
      finite = OptimizerUpdateInto(options_.adam, step + 1,
                                   chunk.weights.data(), sum, chunk.m.data(),
                                   chunk.v.data(), chunk.prev_weights.data(),
                                   chunk.prev_m.data(), chunk.prev_v.data(), n);
      optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
    }
    if (!finite && NoteOverflow(chunk, step, chunk.prev_weights)) {
      // Not applied: the chunk keeps its state, nothing to undo.
      chunk.undo_step = -1;
    } else {
      if (!buffer) {
        chunk.m.swap(chunk.prev_m);
        chunk.v.swap(chunk.prev_v);
      }
      chunk.weights.swap(chunk.prev_weights);
      // Backup workers and clipping: decided already, nothing to undo.
      chunk.undo_step = members == nullptr && !clipping() ? step : -1;
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

void ParameterShard::ResetStepsLocked(int64_t version) {
  ending_step_ = version;
  ends_.clear();
  ends_.resize(options_.staleness + 1);
  for (StepEnds& e : ends_) e.ended.assign(options_.num_workers, false);
  decided_step_ = version - 1;
  decided_through_.store(decided_step_);
  recent_skips_.clear();
  norm_step_ = -1;
  norm_partial_ = 0;
  recent_norms_.clear();
  hold_step_ = -1;
}

double ParameterShard::PartialNormLocked(int64_t step, bool skip,
                                         const std::vector<bool>* members) {
  if (skip) return 0;
  double sum_sq = 0;
  std::vector<int> workers;
  for (int w = 0; w < options_.num_workers; ++w) {
    if (members == nullptr || (*members)[w]) workers.push_back(w);
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    // A chunk already past `step` (restored at a later version) has no
    // pushes of it: its slot holds nothing of this step.
    if (c->version != step) continue;
    StepSlot& slot = c->slots[SlotIndex(step)];
    if (slot.skipped) continue;  // not applied (CompleteBarrierLocked())
    const int64_t n = c->spec.num_elements;
    const float* sum = AverageInto(slot, workers, n);
    if (plan_->is_buffer(c->spec.param_id)) continue;
    for (int64_t i = 0; i < n; ++i) {
      sum_sq += static_cast<double>(sum[i]) * sum[i];
    }
  }
  return sum_sq;
}

bool ParameterShard::MaybeAwaitNormLocked() {
  if (!clipping() || norm_step_ >= 0) return false;
  const int64_t deciding = ending_step_;
  StepEnds& ends = ends_[SlotIndex(deciding)];
  const int needed =
      backup_workers() ? options_.replicas_to_aggregate : options_.num_workers;
  if (ends.num_ended < needed) return false;
  // Nothing is applied yet: the step waits for its norm, whose partial the
  // pulls send (ApplyStepNorm()).
  norm_step_ = deciding;
  norm_partial_ = PartialNormLocked(deciding, ends.skip != nullptr,
                                    backup_workers() ? &ends.ended : nullptr);
  return true;
}

const ParameterShard::NormDecision* ParameterShard::RecentNormLocked(
    int64_t step) const {
  for (const NormDecision& d : recent_norms_) {
    if (d.step == step) return &d;
  }
  return nullptr;
}

void ParameterShard::DecidedLocked(int64_t deciding, StepEnds& ends) {
  if (ends.skip != nullptr) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    recent_skips_.push_back(*ends.skip);
    if (recent_skips_.size() > 8) recent_skips_.erase(recent_skips_.begin());
  }
  ends.skip.reset();
  ends.ended.assign(options_.num_workers, false);
  ends.num_ended = 0;
  decided_step_ = deciding;
  decided_through_.store(deciding);
  ending_step_ = deciding + 1;
}

absl::Status ParameterShard::EndStep(int worker_id, int64_t step,
                                     const NonFiniteValue* nonfinite,
                                     int64_t generation) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("end of step ", step, " on shard ", options_.shard_index,
                     " before it was initialised"));
  }
  if (options_.mode != SyncMode::kSync) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " sent to shard ", options_.shard_index,
        ", which runs in async mode (step ends are for sync)"));
  }
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  if (backup_workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " on shard ", options_.shard_index,
        ", which aggregates ", options_.replicas_to_aggregate, " of ",
        options_.num_workers,
        " workers per step: a step end must say the worker's admission"));
  }
  absl::MutexLock lock(&step_mu_);
  if (absl::Status current = CheckGeneration(generation); !current.ok()) {
    return current;
  }
  if (chunks_.empty()) return absl::OkStatus();  // nothing to decide
  const int s = options_.staleness;
  if (step < ending_step_ || step > ending_step_ + s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker_id, " ended step ", step, " but shard ",
        options_.shard_index, " is collecting the ends of step ", ending_step_,
        s == 0 ? "" : absl::StrCat(" to ", ending_step_ + s)));
  }
  StepEnds& ends = ends_[SlotIndex(step)];
  if (ends.ended[worker_id]) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, " ended step ", step,
                     " twice on shard ", options_.shard_index));
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    const bool pushed =
        c->version > step || (step <= c->version + s &&
                              c->slots[SlotIndex(step)].has_pending[worker_id]);
    if (!pushed) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker_id, " ended step ", step, " on shard ",
                       options_.shard_index, " before pushing chunk (",
                       c->spec.param_id, ", ", c->spec.chunk_index, ")"));
    }
  }
  ends.ended[worker_id] = true;
  ++ends.num_ended;
  if (nonfinite != nullptr &&
      (ends.skip == nullptr || worker_id < ends.skip->worker_id)) {
    ends.skip = std::make_unique<SkippedStepInfo>();
    ends.skip->step = step;
    ends.skip->worker_id = worker_id;
    ends.skip->nonfinite = *nonfinite;
  }
  // Decide every step whose ends are all in, oldest first.
  bool decided_any = false;
  while (true) {
    const int64_t deciding = ending_step_;
    StepEnds& e = ends_[SlotIndex(deciding)];
    if (e.num_ended < options_.num_workers) break;
    if (clipping()) {
      // The step waits for its norm; true wakes the pulls.
      if (MaybeAwaitNormLocked()) decided_any = true;
      break;
    }
    // Every worker pushed every chunk of the step, and the step before is
    // decided, so every chunk is at deciding + 1.
    if (e.skip != nullptr) {
      for (const std::unique_ptr<ChunkState>& c : chunks_) {
        absl::MutexLock chunk_lock(&c->mu);
        if (c->undo_step != deciding) continue;
        c->weights.swap(c->prev_weights);
        if (!plan_->is_buffer(c->spec.param_id)) {
          c->m.swap(c->prev_m);
          c->v.swap(c->prev_v);
        }
        c->undo_step = -1;
      }
    }
    DecidedLocked(deciding, e);
    decided_any = true;
    if (s == 0) break;  // no pushes of later steps can be waiting
    // Staleness: the next step's pushes may all be in already; its update
    // waited for this decision.
    for (const std::unique_ptr<ChunkState>& c : chunks_) {
      absl::MutexLock chunk_lock(&c->mu);
      MaybeCompleteLocked(*c);
    }
  }
  if (decided_any) NoteUpdate();
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterShard::EndStepWithBackups(
    int worker_id, int64_t step, const NonFiniteValue* nonfinite,
    int64_t generation, AdmissionClaim claim, int64_t samples) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("end of step ", step, " on shard ", options_.shard_index,
                     " before it was initialised"));
  }
  if (!backup_workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " with an admission sent to shard ",
        options_.shard_index, ", which runs without backup workers"));
  }
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  const bool arbiter = options_.shard_index == 0;
  if (arbiter != (claim == AdmissionClaim::kDecide)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " ended step ", step, " on shard ",
        options_.shard_index,
        arbiter ? " with an admission: shard 0 gives the admissions"
                : " without shard 0's admission"));
  }
  absl::MutexLock lock(&step_mu_);
  if (absl::Status current = CheckGeneration(generation); !current.ok()) {
    return current;
  }
  if (arbiter && step == hold_step_) {
    // A checkpoint's cut: the other shards register it before any of
    // them can decide the step (HoldCheckpointStep()).
    auto released = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
      return hold_step_ != step || aborted_.load();
    };
    if (!step_mu_.AwaitWithDeadline(absl::Condition(&released), hold_until_) &&
        hold_step_ == step) {
      hold_step_ = -1;  // worker 0 never released it: its checkpoint fails
    }
    if (aborted_.load()) return AbortedStatus();
    if (absl::Status current = CheckGeneration(generation); !current.ok()) {
      return current;
    }
  }
  if (step > ending_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " ended step ", step, " but shard ",
                     options_.shard_index, " is collecting the ends of step ",
                     ending_step_));
  }
  // Clipping: the step's R admitted ends may be in already, its norm
  // awaited.
  const bool admissions_full =
      step == ending_step_ &&
      ends_[0].num_ended >= options_.replicas_to_aggregate;
  if (step < ending_step_ || admissions_full ||
      claim == AdmissionClaim::kLate) {
    if (claim == AdmissionClaim::kAdmitted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, " claims an admission to step ", step,
          ", which shard ", options_.shard_index, " decided already with ",
          options_.replicas_to_aggregate, " other workers"));
    }
    // Late: its pushes of the step (if any are still waiting) go when the
    // step is decided.
    late_steps_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  StepEnds& ends = ends_[0];
  if (ends.ended[worker_id]) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, " ended step ", step,
                     " twice on shard ", options_.shard_index));
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (!c->slots[0].has_pending[worker_id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker_id, " ended step ", step, " on shard ",
                       options_.shard_index, " before pushing chunk (",
                       c->spec.param_id, ", ", c->spec.chunk_index, ")"));
    }
  }
  ends.ended[worker_id] = true;
  ++ends.num_ended;
  samples_.fetch_add(samples, std::memory_order_relaxed);
  if (nonfinite != nullptr &&
      (ends.skip == nullptr || worker_id < ends.skip->worker_id)) {
    ends.skip = std::make_unique<SkippedStepInfo>();
    ends.skip->step = step;
    ends.skip->worker_id = worker_id;
    ends.skip->nonfinite = *nonfinite;
  }
  if (ends.num_ended == options_.replicas_to_aggregate) {
    if (clipping()) {
      if (MaybeAwaitNormLocked()) NoteUpdate();  // wakes the pulls
    } else {
      DecideWithBackupsLocked(step, ends);
    }
  }
  return true;
}

absl::StatusOr<int64_t> ParameterShard::HoldCheckpointStep(
    int64_t min_step, absl::Duration hold) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint of step ", min_step, " on shard ",
                     options_.shard_index, " before it was initialised"));
  }
  if (!backup_workers() || options_.shard_index != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of step ", min_step, " picked by shard ",
        options_.shard_index,
        ": only shard 0 of a job with backup workers picks a checkpoint's "
        "step"));
  }
  absl::MutexLock lock(&step_mu_);
  const int64_t first_open =
      ends_[0].num_ended > 0 ? ending_step_ + 1 : ending_step_;
  hold_step_ = std::max(min_step, first_open);
  hold_until_ = absl::Now() + hold;
  return hold_step_;
}

void ParameterShard::ReleaseCheckpointHold() {
  absl::MutexLock lock(&step_mu_);
  hold_step_ = -1;
}

void ParameterShard::DecideWithBackupsLocked(int64_t step, StepEnds& ends) {
  const bool skip = ends.skip != nullptr;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    // A checkpoint's cut comes before the update that takes the chunk
    // past it.
    if (c->snap_into != nullptr) MaybeSnapLocked(*c);
    // Every admitted worker pushed the chunk (checked at its end), so the
    // chunk is at `step`; the late workers' pushes go with the slot.
    CompleteBarrierLocked(*c, &ends.ended, skip);
  }
  DecidedLocked(step, ends);
  NoteUpdate();
}

absl::Status ParameterShard::ApplyStepNorm(int worker_id, int64_t step,
                                           double sum_sq, int64_t generation) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("global norm of step ", step, " sent to shard ",
                     options_.shard_index, " before it was initialised"));
  }
  if (!clipping()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "global norm of step ", step, " sent to shard ", options_.shard_index,
        ", which does not clip gradients (clip_grad_norm 0 or async mode)"));
  }
  if (absl::Status s = CheckWorkerId(worker_id); !s.ok()) return s;
  if (!std::isfinite(sum_sq) || sum_sq < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " sent ", sum_sq, " as the squared global norm ",
        "of step ", step, "; expected a finite sum >= 0"));
  }
  absl::MutexLock lock(&step_mu_);
  if (absl::Status current = CheckGeneration(generation); !current.ok()) {
    return current;
  }
  if (chunks_.empty()) return absl::OkStatus();  // nothing to decide
  if (const NormDecision* decided = RecentNormLocked(step)) {
    if (sum_sq != decided->sum_sq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, " sent ", sum_sq,
          " as the squared global norm of step ", step, " but shard ",
          options_.shard_index, " clipped it with ", decided->sum_sq));
    }
    return absl::OkStatus();
  }
  // Staleness: a sum of a step decided before the ones kept; nothing left
  // to check it against.
  if (step <= decided_step_ && step != norm_step_) return absl::OkStatus();
  if (step != norm_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker_id, " sent the global norm of step ", step,
        " but shard ", options_.shard_index,
        norm_step_ < 0 ? absl::StrCat(" awaits none (collecting the ends of "
                                      "step ",
                                      ending_step_, ")")
                       : absl::StrCat(" awaits that of step ", norm_step_)));
  }
  StepEnds& ends = ends_[SlotIndex(step)];
  const bool skip = ends.skip != nullptr;
  // As torch.nn.utils.clip_grad_norm_ (PyTorch 1.13): the norm and the
  // coefficient in fp32, clamped to 1 (worker/gradient_exchange.cc's
  // allreduce clipping is the same).
  const float norm = static_cast<float>(std::sqrt(sum_sq));
  const float clip = std::min(
      static_cast<float>(options_.clip_grad_norm) / (norm + 1e-6f), 1.0f);
  // Backup workers: the admitted workers' pushes only.
  const std::vector<bool>* members = backup_workers() ? &ends.ended : nullptr;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    // As in PartialNormLocked(): a chunk past `step` has nothing of it.
    if (c->version != step) continue;
    // A checkpoint's cut comes before the update that takes the chunk
    // past it.
    if (c->snap_into != nullptr) MaybeSnapLocked(*c);
    CompleteBarrierLocked(*c, members, skip, clip);
  }
  recent_norms_.push_back({step, norm_partial_, sum_sq});
  if (recent_norms_.size() > 8) recent_norms_.erase(recent_norms_.begin());
  norm_step_ = -1;
  DecidedLocked(step, ends);
  // Staleness: the next step's ends may all be in already.
  MaybeAwaitNormLocked();
  NoteUpdate();
  return absl::OkStatus();
}

void ParameterShard::NoteUpdate() {
  absl::MutexLock lock(&updates_mu_);
  ++updates_;
}

void ParameterShard::ApplyLocked(ChunkState& chunk, const float* gradient) {
  trace::Scope traced("update", "shard",
                      {{"param", chunk.spec.param_id},
                       {"chunk", chunk.spec.chunk_index},
                       {"step", chunk.version}});
  const int64_t n = chunk.spec.num_elements;
  // Written beside the current state, and swapped in only if finite.
  UpdateScratch& out = ThreadUpdateScratch();
  out.w.resize(n);
  out.m.resize(n);
  out.v.resize(n);
  const auto start = std::chrono::steady_clock::now();
  const bool finite = OptimizerUpdateInto(
      options_.adam, chunk.version + 1, chunk.weights.data(), gradient,
      chunk.m.data(), chunk.v.data(), out.w.data(), out.m.data(), out.v.data(),
      n);
  optimizer_ns_.fetch_add(ElapsedNs(start), std::memory_order_relaxed);
  if (!finite && NoteOverflow(chunk, chunk.version, out.w)) return;
  chunk.weights.swap(out.w);
  chunk.m.swap(out.m);
  chunk.v.swap(out.v);
  ++chunk.version;
  applied_.fetch_add(1, std::memory_order_relaxed);
  NoteUpdate();
}

absl::Status ParameterShard::Pull(int64_t min_version, int64_t samples,
                                  absl::Time deadline, const PullVisitor& visit,
                                  const std::function<bool()>& after_chunk,
                                  const std::atomic<bool>* cancelled,
                                  int64_t generation, SkippedStepInfo* skipped,
                                  const NormVisitor& norm_partial) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pull from shard ", options_.shard_index,
                     " before it was initialised"));
  }
  // Backup workers: counted from the admitted ends instead.
  if (!backup_workers()) samples_.fetch_add(samples, std::memory_order_relaxed);
  pulls_.fetch_add(1, std::memory_order_relaxed);
  auto stream_ended = [this] {
    return absl::CancelledError(
        absl::StrCat("pull from shard ", options_.shard_index,
                     " cancelled: the worker's stream ended"));
  };
  std::vector<bool> sent(chunks_.size(), false);
  size_t remaining = chunks_.size();
  // Sync: the step whose decision the pull waits for (see EndStep()).
  const int64_t deciding = options_.mode == SyncMode::kSync && min_version >= 1
                               ? min_version - 1
                               : -1;
  bool resent = false;
  // Clipping: this shard's partial of step `deciding`, sent once, before
  // the pull's last message.
  bool norm_sent = !clipping() || deciding < 0;
  if (!norm_sent && !norm_partial) {
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
    if (!norm_sent) {
      bool ready = chunks_.empty();  // a partial of 0
      double partial = 0;
      if (!ready) {
        absl::MutexLock lock(&step_mu_);
        if (norm_step_ == deciding) {
          ready = true;
          partial = norm_partial_;
        } else if (const NormDecision* d = RecentNormLocked(deciding)) {
          // Decided already by another worker's sum: this worker still
          // needs the partial (its own sum is checked against it).
          ready = true;
          partial = d->partial;
        }
      }
      if (ready) {
        norm_sent = true;
        if (!norm_partial(deciding, partial)) return stream_ended();
      }
    }
    if (remaining == 0) {
      if (deciding < 0 || chunks_.empty() || resent) return absl::OkStatus();
      bool decided = false;
      {
        absl::MutexLock lock(&step_mu_);
        if (decided_step_ >= deciding) {
          decided = true;
          for (const SkippedStepInfo& skip : recent_skips_) {
            if (skip.step != deciding) continue;
            // Skipped: every chunk again, with its restored weights.
            if (skipped != nullptr) *skipped = skip;
            std::fill(sent.begin(), sent.end(), false);
            remaining = chunks_.size();
            resent = true;
          }
        }
      }
      if (decided && !resent) return absl::OkStatus();
    }
    // Every chunk ready now, in plan order.
    bool progressed = false;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      if (sent[i]) continue;
      ChunkState& chunk = *chunks_[i];
      chunk.mu.Lock();
      if (aborted_.load()) {
        chunk.mu.Unlock();
        return AbortedStatus();
      }
      if (absl::Status current = CheckGeneration(generation); !current.ok()) {
        chunk.mu.Unlock();
        return current;
      }
      if (chunk.version < min_version) {
        chunk.mu.Unlock();
        continue;
      }
      visit(chunk.spec, chunk.version,
            absl::MakeConstSpan(chunk.weights.data(), chunk.weights.size()));
      chunk.mu.Unlock();
      sent[i] = true;
      --remaining;
      progressed = true;
      if (after_chunk && !after_chunk()) {
        return stream_ended();
      }
    }
    if (progressed) continue;
    // None ready: wait for the next update, in slices, so that a broken
    // caller is noticed.
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
    if (absl::Status current = CheckGeneration(generation); !current.ok()) {
      return current;
    }
    if (cancelled != nullptr && cancelled->load()) {
      return stream_ended();
    }
    if (absl::Now() < deadline) continue;
    if (remaining == 0 || clipping()) {
      absl::MutexLock lock(&step_mu_);
      if (decided_step_ >= deciding) continue;  // decided just now
      if (norm_step_ == deciding) {
        return absl::DeadlineExceededError(
            absl::StrCat("pull of version ", min_version, " from shard ",
                         options_.shard_index,
                         " timed out waiting for the global norm of "
                         "step ",
                         deciding,
                         ": every worker ended the step, none sent "
                         "the sum of the shards' partials"));
      }
      // The oldest undecided step (staleness: the slowest worker's).
      std::vector<int> missing;
      const StepEnds& ends = ends_[SlotIndex(ending_step_)];
      for (int w = 0; w < options_.num_workers; ++w) {
        if (!ends.ended[w]) missing.push_back(w);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of version ", min_version, " from shard ", options_.shard_index,
          " timed out waiting for the end of step ", ending_step_,
          " from worker(s) ", absl::StrJoin(missing, ",")));
    }
    // Name the first chunk still waiting and whose push it lacks.
    size_t first = 0;
    while (sent[first]) ++first;
    ChunkState& chunk = *chunks_[first];
    absl::MutexLock lock(&chunk.mu);
    if (chunk.version >= min_version) continue;  // arrived just now
    std::vector<int> missing;
    const StepSlot& slot = chunk.slots[SlotIndex(chunk.version)];
    for (int w = 0; w < options_.num_workers; ++w) {
      if (!slot.has_pending[w]) missing.push_back(w);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "pull of version ", min_version, " from shard ", options_.shard_index,
        " timed out at chunk (", chunk.spec.param_id, ", ",
        chunk.spec.chunk_index, "), still at version ", chunk.version,
        "; no push yet from worker(s) ", absl::StrJoin(missing, ",")));
  }
  return absl::OkStatus();
}

ShardStats ParameterShard::Stats() const {
  ShardStats stats;
  stats.initialized = initialized_.load();
  stats.generation = generation_.load();
  stats.samples = samples_.load();
  stats.pushes = pushes_.load();
  stats.pulls = pulls_.load();
  stats.skipped = skipped_.load();
  stats.optimizer_ns = optimizer_ns_.load();
  stats.updates = applied_.load();
  stats.late_pushes = late_pushes_.load();
  stats.late_steps = late_steps_.load();
  stats.overflowed = overflowed(&stats.last_overflow);
  if (initialized_.load()) {
    int64_t min_version = -1;
    for (const std::unique_ptr<ChunkState>& chunk : chunks_) {
      absl::MutexLock lock(&chunk->mu);
      if (min_version < 0 || chunk->version < min_version) {
        min_version = chunk->version;
      }
    }
    stats.min_version = std::max<int64_t>(min_version, 0);
  }
  return stats;
}

}  // namespace pstrain
