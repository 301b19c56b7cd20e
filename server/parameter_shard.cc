#include "server/parameter_shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

namespace {

// The shard's options as its step policy reads them: the initial members
// as the job's workers (an elastic job's capacity is larger).
ShardOptions PolicyOptions(ShardOptions options) {
  if (options.initial_workers > 0 &&
      options.initial_workers < options.num_workers) {
    options.num_workers = options.initial_workers;
  }
  return options;
}

}  // namespace

ParameterShard::ParameterShard(const ShardOptions& options)
    : options_(options), policy_(PolicyOptions(options)) {
  const int initial = PolicyOptions(options).num_workers;
  if (policy_.admits()) backups_ = initial - policy_.ends_to_decide();
  WorkerMembership first;
  for (int w = 0; w < initial; ++w) first.workers.push_back(w);
  SetMembership(first);
}

// Here, where ChunkState, StepEnds and NormDecision are complete.
ParameterShard::~ParameterShard() = default;

absl::Status ParameterShard::CheckWorkerId(int worker_id) const {
  if (worker_id < 0 || worker_id >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker_id,
                                                   " is outside the job's [0, ",
                                                   options_.num_workers, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckMember(int worker_id) const {
  RETURN_IF_ERROR(CheckWorkerId(worker_id));
  const std::shared_ptr<const std::vector<bool>> members =
      std::atomic_load(&is_member_);
  if (!(*members)[worker_id]) {
    // ABORTED, as another generation's request: a worker the membership
    // left out recovers, finds it is not a member and leaves.
    const WorkerMembership m = membership();
    return absl::AbortedError(
        absl::StrCat("worker ", worker_id, " is not a member of shard ",
                     options_.shard_index, "'s generation ", generation_.load(),
                     " (workers ", absl::StrJoin(m.workers, ","), " from step ",
                     m.from_step, ")"));
  }
  return absl::OkStatus();
}

void ParameterShard::SetMembership(const WorkerMembership& membership) {
  absl::MutexLock lock(&membership_mu_);
  SetMembershipLocked(membership);
}

void ParameterShard::SetMembershipLocked(const WorkerMembership& membership) {
  auto is_member =
      std::make_shared<std::vector<bool>>(options_.num_workers, false);
  for (int w : membership.workers) (*is_member)[w] = true;
  const int n = static_cast<int>(membership.workers.size());
  std::atomic_store(&membership_,
                    std::shared_ptr<const WorkerMembership>(
                        std::make_shared<WorkerMembership>(membership)));
  std::atomic_store(&is_member_,
                    std::shared_ptr<const std::vector<bool>>(is_member));
  num_members_.store(n);
  ends_to_decide_.store(policy_.admits() ? std::max(1, n - backups_) : n);
  auto optimizer = std::make_shared<OptimizerOptions>(options_.adam);
  if (optimizer->schedule.needs_horizon()) {
    optimizer->schedule.total_steps = std::max<int64_t>(1, lr_horizon_);
  }
  if (options_.linear_lr_scaling) {
    // The linear scaling rule: the lr follows the effective batch.
    const int initial = PolicyOptions(options_).num_workers;
    optimizer->lr =
        static_cast<float>(static_cast<double>(options_.adam.lr) * n / initial);
  }
  std::atomic_store(&optimizer_, std::shared_ptr<const OptimizerOptions>(
                                     std::move(optimizer)));
}

absl::Status ParameterShard::CheckLrHorizonLocked(int64_t total_steps) const {
  const LrSchedule& schedule = options_.adam.schedule;
  if (total_steps < 0 || total_steps > LrSchedule::kMaxHorizon) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_total_steps ", total_steps, "; expected 0 to 1e9"));
  }
  if (!schedule.needs_horizon()) return absl::OkStatus();
  if (total_steps == 0 && lr_horizon_ > 0) return absl::OkStatus();  // kept
  if (total_steps <= schedule.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr_total_steps ", total_steps, " for shard ", options_.shard_index,
        "'s cosine schedule (the job's steps, counted by worker 0); expected "
        "more than warmup_steps (",
        schedule.warmup_steps, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckLrHorizon(int64_t total_steps) const {
  absl::MutexLock lock(&membership_mu_);
  return CheckLrHorizonLocked(total_steps);
}

absl::Status ParameterShard::SetLrHorizon(int64_t total_steps) {
  absl::MutexLock lock(&membership_mu_);
  if (absl::Status s = CheckLrHorizonLocked(total_steps); !s.ok()) return s;
  if (!options_.adam.schedule.needs_horizon() || total_steps == 0 ||
      lr_horizon_ == total_steps) {
    return absl::OkStatus();
  }
  lr_horizon_ = total_steps;
  SetMembershipLocked(*std::atomic_load(&membership_));  // its optimizer
  return absl::OkStatus();
}

int64_t ParameterShard::lr_horizon() const {
  absl::MutexLock lock(&membership_mu_);
  return lr_horizon_;
}

void ParameterShard::RestoreLrHorizon(int64_t total_steps) {
  absl::MutexLock lock(&membership_mu_);
  if (!options_.adam.schedule.needs_horizon() || lr_horizon_ == total_steps) {
    return;
  }
  lr_horizon_ = total_steps;
  SetMembershipLocked(*std::atomic_load(&membership_));  // its optimizer
}

std::vector<int> ParameterShard::AveragedWorkers(
    const std::vector<bool>* admitted) const {
  if (admitted == nullptr) return std::atomic_load(&membership_)->workers;
  std::vector<int> workers;
  for (int w = 0; w < options_.num_workers; ++w) {
    if ((*admitted)[w]) workers.push_back(w);
  }
  return workers;
}

std::optional<LossScaler::State> ParameterShard::loss_scaler_state() const {
  absl::MutexLock lock(&step_mu_);
  return loss_scaler_;
}

WorkerMembership ParameterShard::membership() const {
  return *std::atomic_load(&membership_);
}

WorkerMembership ParameterShard::membership(int64_t* generation) const {
  absl::MutexLock lock(&step_mu_);
  *generation = generation_.load();
  return membership();
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
    std::vector<InitChunk> chunks, int num_buffers, int64_t generation,
    const WorkerMembership* membership, int num_shards,
    const LossScaler::State* loss_scaler) {
  if (membership != nullptr) {
    RETURN_IF_ERROR(CheckMembership(*membership, options_.num_workers));
  }
  if (loss_scaler != nullptr && !loss_scaler->valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler of shard ", options_.shard_index, ": scale ",
        loss_scaler->scale, ", growth tracker ", loss_scaler->growth_tracker,
        "; expected a finite scale > 0 and a tracker >= 0"));
  }
  if (num_shards == 0) num_shards = options_.num_shards;
  if (num_shards <= options_.shard_index ||
      num_shards > PartitionPlan::kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the layout has ", num_shards, " shards; shard ", options_.shard_index,
        " expected ", options_.shard_index + 1, " to ",
        PartitionPlan::kMaxShards));
  }
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
    state.slots.assign(policy_.open_steps(), empty);
    state.num_latest = 0;
    state.undo_step = -1;
    state.prev_version = -1;
    state.delta_version = -1;
    state.snap_into = nullptr;  // a restore ends the checkpoint's cut
  };
  // Sync steps restart at the chunks' version (equal in sync mode), with
  // the loss scaler sent.
  auto reset_steps = [this,
                      loss_scaler](const std::vector<InitChunk*>& by_local) {
    int64_t version = 0;
    for (size_t i = 0; i < by_local.size(); ++i) {
      version = i == 0 ? by_local[i]->version
                       : std::min(version, by_local[i]->version);
    }
    absl::MutexLock step_lock(&step_mu_);
    ResetStepsLocked(version);
    loss_scaler_.reset();
    loss_scaler_before_.reset();
    if (loss_scaler != nullptr && policy_.has_steps()) {
      loss_scaler_ = *loss_scaler;
    }
  };
  if (initialized_.load()) {
    if (generation <= generation_.load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard_index,
          " is already initialised (generation ", generation_.load(),
          "); a restore must name a higher generation, not ", generation));
    }
    // A restore: the same tensors, every chunk replaced.
    if (param_num_elements != plan_->param_num_elements() ||
        num_buffers != plan_->num_buffers() ||
        row_elements_ != plan_->param_row_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore of shard ", options_.shard_index,
                       " sent another model layout than the job's (",
                       param_num_elements.size(), " tensors, ", partition_bytes,
                       " bytes per chunk)"));
    }
  }
  // Another partition of the same tensors (--partition_bytes=auto's
  // trials, worker/partition_tuner.h; an elastic job's other number of
  // shards): a re-layout, every chunk state made anew as at a first
  // Initialize (below). The caller has ended every push, pull and
  // snapshot of the older generation (see the header).
  const bool relayout =
      initialized_.load() && (partition_bytes != plan_->partition_bytes() ||
                              num_shards != plan_->num_shards());
  if (initialized_.load() && !relayout) {
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
    OpenRestoredLocked(generation, membership);
    reset_steps(*by_local);
    for (size_t i = 0; i < chunks_.size(); ++i) {
      absl::MutexLock chunk_lock(&chunks_[i]->mu);
      install(*(*by_local)[i], *chunks_[i]);
    }
    broken_.store(false);
    NoteUpdate();
    return absl::OkStatus();
  }
  absl::StatusOr<PartitionPlan> plan =
      PartitionPlan::Create(param_num_elements, partition_bytes, num_shards,
                            num_buffers, row_elements_);
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
  OpenRestoredLocked(generation, membership);
  initialized_.store(true);
  if (relayout) {
    broken_.store(false);
    NoteUpdate();
  }
  return absl::OkStatus();
}

void ParameterShard::OpenRestoredLocked(int64_t generation,
                                        const WorkerMembership* membership) {
  {
    absl::MutexLock step_lock(&step_mu_);
    ForgetSwitchLocked();
  }
  generation_.store(generation);
  closed_.store(false);
  if (membership != nullptr) SetMembership(*membership);
}

absl::StatusOr<int64_t> ParameterShard::Reopen(
    int64_t generation, int64_t expected_version,
    const WorkerMembership* membership, bool close) {
  if (membership != nullptr) {
    RETURN_IF_ERROR(CheckMembership(*membership, options_.num_workers));
  }
  absl::MutexLock lock(&init_mu_);
  const std::string shard = absl::StrCat("shard ", options_.shard_index);
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(shard,
                     " holds no state to reopen (not initialised: a restarted "
                     "shard takes a checkpoint)"));
  }
  // Async has no decided step: it reopens only for an elastic job's
  // membership change or move of its state, its state kept as it is
  // (every push applied is final); after a death it restores the
  // checkpoint (StepPolicy).
  const bool async = !policy_.has_steps();
  if (async && membership == nullptr && !close) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard,
        " runs async: it reopens at its own state only for a membership "
        "change or a move of its state (after a failure it restores the "
        "checkpoint)"));
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
  const GenerationSwitch switched = last_switch();
  const std::optional<WorkerMembership> members_before =
      std::move(members_before_switch_);
  ForgetSwitchLocked();
  if (async) return ReopenAsyncLocked(generation, membership, close);
  int64_t version = decided_step_ + 1;
  if (expected_version >= 0 && version == expected_version + 1 &&
      LastDecisionUndoableLocked()) {
    // Another shard has not decided step d (a worker died between its step
    // ends to the two): this one goes back to version d, the loop below
    // undoing d's update.
    version = expected_version;
  }
  if (expected_version >= 0 && version != expected_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard, " has decided step ", decided_step_, " and reopens at version ",
        decided_step_ + 1, ", not ", expected_version,
        version == expected_version + 1
            ? absl::StrCat(" (step ", decided_step_,
                           "'s update cannot be undone: its chunks hold no "
                           "state from before it)")
            : ""));
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
  closed_.store(close);
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (c->version == version + 1 && c->undo_step == version) {
      // The undecided update of step `version`: put back.
      UndoLocked(*c);
    }
    c->version = version;
    c->undo_step = -1;
    // A reopened generation's pulls start whole, and the delta cached for
    // an update the reopen undid must not pass for the next update's.
    c->prev_version = -1;
    c->delta_version = -1;
    // A deferred checkpoint cut (staleness) will not come in this
    // generation: its waiter ends ABORTED (AwaitDeferredSnapshot()).
    c->snap_into = nullptr;
    c->snap_version = -1;
    for (StepSlot& slot : c->slots) {
      std::fill(slot.has_pending.begin(), slot.has_pending.end(), false);
      slot.num_pending = 0;
      slot.skipped = false;
      slot.averaged = false;
    }
  }
  if (membership != nullptr) {
    WorkerMembership next = *membership;
    next.from_step = version;
    SetMembership(next);
  } else if (version == decided_step_ && switched.version == version + 1 &&
             members_before.has_value()) {
    // The decision taken back took a planned change (PlanReopen()): the
    // members before it train the step again, as on the shards that had
    // not decided it.
    SetMembership(*members_before);
  }
  if (version == decided_step_) {
    // Step `version`'s decision taken back: its loss scaler update too.
    loss_scaler_ = loss_scaler_before_;
  }
  loss_scaler_before_.reset();
  ResetStepsLocked(version);
  broken_.store(false);
  NoteUpdate();
  return version;
}

absl::Status ParameterShard::PlanReopen(int64_t generation, int64_t version,
                                        const WorkerMembership& membership) {
  RETURN_IF_ERROR(CheckMembership(membership, options_.num_workers));
  absl::MutexLock lock(&init_mu_);
  const std::string shard = absl::StrCat("shard ", options_.shard_index);
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(shard,
                     " plans no membership change before it is "
                     "initialised"));
  }
  if (!policy_.has_steps() || policy_.staleness() > 0 || policy_.admits()) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard,
        " takes a membership change at a decision only in sync mode "
        "without staleness or backup workers (where every step's decision "
        "waits for every member's push); reopen it instead"));
  }
  if (generation != generation_.load() + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        shard, " is at generation ", generation_.load(),
        "; a planned change must name the next one, not ", generation));
  }
  absl::MutexLock step_lock(&step_mu_);
  if (version != ending_step_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(shard, " is collecting the ends of step ", ending_step_,
                     "; a change planned for version ", version,
                     " needs those of step ", version - 1));
  }
  if (FiniteByVerdictsLocked(ending_step_)) {
    // The pulls may have said the step decided without a change: the
    // members may be training the next step already (worker 0 plans
    // before its own verdict, NoteFiniteVerdict()).
    return absl::FailedPreconditionError(absl::StrCat(
        shard, " has every member's verdict of step ", ending_step_,
        ", whose pulls announce it decided without a membership change; "
        "plan the change before worker 0's pushes of the step"));
  }
  PlannedReopen planned;
  planned.generation = generation;
  planned.version = version;
  planned.membership = membership;
  planned.membership.from_step = version;
  planned_ = std::move(planned);
  return absl::OkStatus();
}

ParameterShard::GenerationSwitch ParameterShard::last_switch() const {
  absl::MutexLock lock(&switch_mu_);
  return last_switch_;
}

void ParameterShard::ForgetSwitchLocked() {
  planned_.reset();
  members_before_switch_.reset();
  absl::MutexLock lock(&switch_mu_);
  last_switch_ = GenerationSwitch();
}

void ParameterShard::WakeReadyAfterSwitch() {
  if (!wake_ready_.exchange(false)) return;
  // Releasing init_mu_ re-evaluates WaitReady()'s condition.
  absl::MutexLock lock(&init_mu_);
}

bool ParameterShard::LastDecisionUndoableLocked() {
  if (decided_step_ < 0) return false;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (c->version != decided_step_ + 1 || c->undo_step != decided_step_) {
      return false;
    }
  }
  return true;
}

int64_t ParameterShard::ReopenAsyncLocked(int64_t generation,
                                          const WorkerMembership* membership,
                                          bool close) {
  generation_.store(generation);
  closed_.store(close);
  std::vector<bool> member(options_.num_workers, false);
  for (int w :
       (membership != nullptr ? *membership : this->membership()).workers) {
    member[w] = true;
  }
  int64_t version = -1;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    version = version < 0 ? c->version : std::min(version, c->version);
    // A buffer averages its members' latest values: a worker that left
    // is no longer one of them (its value stays in the buffer until the
    // next member's push).
    StepSlot& latest = c->slots[0];
    for (int w = 0; w < options_.num_workers; ++w) {
      if (!member[w] && latest.has_pending[w]) {
        latest.has_pending[w] = false;
        --c->num_latest;
      }
    }
  }
  // Async has no shared step: the membership starts at worker 0's
  // (from_step as sent), the chunks keep their own versions.
  if (membership != nullptr) SetMembership(*membership);
  broken_.store(false);
  NoteUpdate();
  return std::max<int64_t>(version, 0);
}

absl::Status ParameterShard::WaitReady(absl::Time deadline,
                                       int64_t min_generation,
                                       int until_member) const {
  absl::MutexLock lock(&init_mu_);
  auto ready = [this, min_generation, until_member]() {
    if (aborted_.load()) return true;
    if (!initialized_.load() || closed_.load() ||
        generation_.load() < min_generation) {
      return false;
    }
    return until_member < 0 || until_member >= options_.num_workers ||
           (*std::atomic_load(&is_member_))[until_member];
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
                                         absl::Span<const float> values,
                                         int64_t first_nonfinite) const {
  const int64_t i = first_nonfinite;
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

absl::Status ParameterShard::CheckGenerationAt(int64_t generation,
                                               int64_t version) const {
  if (generation != generation_.load()) {
    const GenerationSwitch last = last_switch();
    if (last.from == generation && version <= last.version) {
      // The members' requests of the step the change was planned at.
      return CheckGeneration(last.to);
    }
  }
  return CheckGeneration(generation);
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
  if (!policy_.has_steps()) return;
  {
    absl::MutexLock init_lock(&init_mu_);
    // A member of a planned change's old generation whose stream breaks
    // before its first request of the new one: no step of the new can
    // complete either.
    const GenerationSwitch last = last_switch();
    const bool just_left =
        last.from == generation && last.to == generation_.load();
    if (!initialized_.load() ||
        (generation != generation_.load() && !just_left) || broken_.load()) {
      return;
    }
    absl::MutexLock lock(&abort_mu_);
    broken_reason_ = reason;
    broken_.store(true);
  }
  NoteUpdate();  // wakes the pulls, which see broken_
}

bool ParameterShard::StepWaitsFor(int worker_id) const {
  if (!policy_.has_steps() || policy_.admits() || worker_id < 0) return false;
  // init_mu_ keeps chunks_ as it is (a re-layout replaces it).
  absl::MutexLock init_lock(&init_mu_);
  if (!initialized_.load()) return false;
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock lock(&c->mu);
    for (const StepSlot& slot : c->slots) {
      if (slot.num_pending > 0 &&
          static_cast<size_t>(worker_id) < slot.has_pending.size() &&
          !slot.has_pending[worker_id]) {
        return true;
      }
    }
  }
  return false;
}

void ParameterShard::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
  }
  {
    // Waiters re-check their conditions when the mutex they wait on is
    // released (init_mu_ also keeps a re-layout out while chunks_ is read).
    absl::MutexLock lock(&init_mu_);
    if (!initialized_.load()) return;
    for (const std::unique_ptr<ChunkState>& chunk : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
    }
  }
  NoteUpdate();  // wakes pulls waiting for any chunk
}

int64_t ParameterShard::overflowed(std::string* last) const {
  absl::MutexLock lock(&overflow_mu_);
  if (last != nullptr) *last = last_overflow_;
  return overflowed_;
}

ShardStats ParameterShard::Stats() const {
  ShardStats stats;
  stats.initialized = initialized_.load();
  stats.generation = generation_.load();
  stats.barrier_broken = broken_.load();
  stats.samples = samples_.load();
  stats.pushes = pushes_.load();
  stats.pulls = pulls_.load();
  stats.skipped = skipped_.load();
  stats.optimizer_ns = optimizer_ns_.load();
  stats.updates = applied_.load();
  stats.late_pushes = late_pushes_.load();
  stats.late_steps = late_steps_.load();
  stats.overflowed = overflowed(&stats.last_overflow);
  stats.decided_step = policy_.has_steps() ? decided_through_.load() : -1;
  // init_mu_: chunks_ as no re-layout changes it meanwhile.
  absl::ReaderMutexLock init_lock(&init_mu_);
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
