// ParameterShard's step decisions: step ends (EndStep, and
// EndStepWithBackups with shard 0's admissions), the clipping round's
// partial norm and decision (ApplyStepNorm), and the checkpoint cut shard 0
// picks (HoldCheckpointStep); see parameter_shard.h.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/parameter_shard.h"
#include "server/parameter_shard_state.h"

namespace pstrain {

void ParameterShard::ResetStepsLocked(int64_t version) {
  ending_step_ = version;
  ends_.clear();
  ends_.resize(policy_.open_steps());
  for (StepEnds& e : ends_) {
    e.ended.assign(options_.num_workers, false);
    e.said_finite.assign(options_.num_workers, false);
  }
  decided_step_ = version - 1;
  decided_through_.store(decided_step_);
  recent_skips_.clear();
  norm_step_ = -1;
  norm_partial_ = 0;
  recent_norms_.clear();
  hold_step_ = -1;
  hold_closes_ = false;
}

double ParameterShard::PartialNormLocked(int64_t step, bool skip,
                                         const std::vector<bool>* members) {
  if (skip) return 0;
  double sum_sq = 0;
  const std::vector<int> workers = AveragedWorkers(members);
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    // A chunk already past `step` (restored at a later version) has no
    // pushes of it: its slot holds nothing of this step.
    if (c->version != step) continue;
    StepSlot& slot = c->slots[SlotIndex(step)];
    if (slot.skipped) continue;  // not applied (CompleteBarrierLocked())
    if (c->spec.row_elements > 0) {
      // The untouched rows' zeros add nothing: the dense sum's value.
      for (float g :
           AverageRowsLocked(slot, workers, c->spec.row_elements).values) {
        sum_sq += static_cast<double>(g) * g;
      }
      continue;
    }
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
  if (ends.num_ended < EndsToDecide()) return false;
  // Nothing is applied yet: the step waits for its norm, whose partial the
  // pulls send (ApplyStepNorm()).
  norm_step_ = deciding;
  norm_partial_ = PartialNormLocked(deciding, ends.skip != nullptr,
                                    MaskOf(policy_.norm_members(), ends));
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
  if (loss_scaler_.has_value()) {
    // As every worker's scaler takes the step (StepLoop).
    loss_scaler_before_ = loss_scaler_;
    LossScaler scaler;
    scaler.Restore(*loss_scaler_);
    scaler.Update(ends.skip != nullptr);
    loss_scaler_ = scaler.state();
  }
  ends.skip.reset();
  ends.ended.assign(options_.num_workers, false);
  ends.num_ended = 0;
  ends.said_finite.assign(options_.num_workers, false);
  decided_step_ = deciding;
  decided_through_.store(deciding);
  ending_step_ = deciding + 1;
  if (planned_.has_value() && planned_->version == deciding + 1) {
    // A membership change planned for this decision (PlanReopen()): no
    // push of the next step can be in yet (each needs this decision), so
    // the new members start from here with every chunk's state as it is.
    {
      absl::MutexLock switch_lock(&switch_mu_);
      last_switch_ = {generation_.load(), planned_->generation,
                      planned_->version};
    }
    members_before_switch_ = membership();
    SetMembership(planned_->membership);
    generation_.store(planned_->generation);
    planned_.reset();
    wake_ready_.store(true);
  }
}

absl::Status ParameterShard::AddEndLocked(
    StepEnds& ends, int worker_id, int64_t step,
    const NonFiniteValue* nonfinite,
    absl::FunctionRef<bool(const ChunkState&)> pushed) {
  if (ends.ended[worker_id]) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, " ended step ", step,
                     " twice on shard ", options_.shard_index));
  }
  if (nonfinite != nullptr && ends.said_finite[worker_id]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " ended step ", step, " on shard ",
        options_.shard_index,
        " with a non-finite value after its verdict that every value of "
        "the step was finite"));
  }
  for (const std::unique_ptr<ChunkState>& c : chunks_) {
    absl::MutexLock chunk_lock(&c->mu);
    if (!pushed(*c)) {
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
  return absl::OkStatus();
}

absl::Status ParameterShard::EndStep(int worker_id, int64_t step,
                                     const NonFiniteValue* nonfinite,
                                     int64_t generation) {
  // After step_mu_'s release (declared before its lock).
  absl::Cleanup wake = [this] { WakeReadyAfterSwitch(); };
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("end of step ", step, " on shard ", options_.shard_index,
                     " before it was initialised"));
  }
  if (!policy_.has_steps()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " sent to shard ", options_.shard_index,
        ", which runs in async mode (step ends are for sync)"));
  }
  if (absl::Status s = CheckMember(worker_id); !s.ok()) return s;
  if (policy_.admits()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " on shard ", options_.shard_index,
        ", which aggregates ", EndsToDecide(), " of ", NumMembers(),
        " workers per step: a step end must say the worker's admission"));
  }
  absl::MutexLock lock(&step_mu_);
  if (absl::Status current = CheckGeneration(generation); !current.ok()) {
    return current;
  }
  if (chunks_.empty()) return absl::OkStatus();  // nothing to decide
  const int s = policy_.staleness();
  if (step < ending_step_ || step > ending_step_ + s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker_id, " ended step ", step, " but shard ",
        options_.shard_index, " is collecting the ends of step ", ending_step_,
        s == 0 ? "" : absl::StrCat(" to ", ending_step_ + s)));
  }
  auto pushed = [&](const ChunkState& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c.version > step ||
           (step <= c.version + s &&
            c.slots[SlotIndex(step)].has_pending[worker_id]);
  };
  if (absl::Status added = AddEndLocked(ends_[SlotIndex(step)], worker_id, step,
                                        nonfinite, pushed);
      !added.ok()) {
    return added;
  }
  // Decide every step whose ends are all in, oldest first.
  bool decided_any = false;
  while (true) {
    const int64_t deciding = ending_step_;
    StepEnds& e = ends_[SlotIndex(deciding)];
    if (e.num_ended < EndsToDecide()) break;
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
        UndoLocked(*c);
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

bool ParameterShard::FiniteByVerdictsLocked(int64_t step) const {
  if (step != ending_step_ || !policy_.takes_verdicts()) return false;
  // A change planned for this decision names the generation the pull's
  // word carries: it waits for the decision itself.
  if (planned_.has_value() && planned_->version == step + 1) return false;
  const StepEnds& ends = ends_[SlotIndex(step)];
  if (ends.skip != nullptr) return false;
  // A member that ended the step without a non-finite value counts as one
  // that said so ahead.
  int finite = 0;
  for (size_t w = 0; w < ends.ended.size(); ++w) {
    if (ends.ended[w] || ends.said_finite[w]) ++finite;
  }
  return finite >= EndsToDecide();
}

absl::Status ParameterShard::NoteFiniteVerdict(int worker_id, int64_t step,
                                               int64_t generation) {
  const std::string what = absl::StrCat("verdict of step ", step, " on shard ",
                                        options_.shard_index);
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " before it was initialised"));
  }
  if (!policy_.takes_verdicts()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": verdicts are for sync mode without staleness, backup workers or "
        "clipping"));
  }
  if (absl::Status s = CheckMember(worker_id); !s.ok()) return s;
  absl::MutexLock lock(&step_mu_);
  if (absl::Status current = CheckGeneration(generation); !current.ok()) {
    return current;
  }
  if (chunks_.empty() || step < ending_step_) {
    return absl::OkStatus();  // nothing to decide, or decided already
  }
  if (step > ending_step_) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id,
                                                      " sent the ", what,
                                                      ", which is collecting "
                                                      "the ends of step ",
                                                      ending_step_));
  }
  StepEnds& ends = ends_[SlotIndex(step)];
  if (ends.ended[worker_id] || ends.said_finite[worker_id]) {
    return absl::OkStatus();  // its end, or this word, is in already
  }
  ends.said_finite[worker_id] = true;
  if (FiniteByVerdictsLocked(step)) NoteUpdate();  // the pulls' word
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
  if (!policy_.admits()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end of step ", step, " with an admission sent to shard ",
        options_.shard_index, ", which runs without backup workers"));
  }
  if (absl::Status s = CheckMember(worker_id); !s.ok()) return s;
  const bool arbiter = policy_.admission_arbiter();
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
  if (arbiter && hold_closes_ && step >= hold_step_) {
    if (absl::Now() < hold_until_) {
      // A change's cut (HoldFirstUndecidedStep()): the reopen drops the
      // step and every later one, which the new generation redoes.
      late_steps_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    hold_step_ = -1;  // worker 0 never reopened: the job goes on
    hold_closes_ = false;
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
  const int s = policy_.staleness();
  if (step > ending_step_ + s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker_id, " ended step ", step, " but shard ",
        options_.shard_index, " is collecting the ends of step ", ending_step_,
        s == 0 ? "" : absl::StrCat(" to ", ending_step_ + s)));
  }
  // The step's R admitted ends may be in already (staleness: it waits for
  // the step before it; clipping: for its norm).
  const bool admissions_full =
      step >= ending_step_ &&
      ends_[SlotIndex(step)].num_ended >= EndsToDecide();
  if (step < ending_step_ || admissions_full ||
      claim == AdmissionClaim::kLate) {
    if (claim == AdmissionClaim::kAdmitted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, " claims an admission to step ", step,
          ", which shard ", options_.shard_index, " decided already with ",
          EndsToDecide(), " other workers"));
    }
    // Late: its pushes of the step (if any are still waiting) go when the
    // step is decided.
    late_steps_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  StepEnds& ends = ends_[SlotIndex(step)];
  // No admitted step is decided before its end, so the chunk is at most
  // at `step` and holds its push there.
  auto pushed = [this, worker_id,
                 step](const ChunkState& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c.version <= step && c.slots[SlotIndex(step)].has_pending[worker_id];
  };
  if (absl::Status added =
          AddEndLocked(ends, worker_id, step, nonfinite, pushed);
      !added.ok()) {
    return added;
  }
  samples_.fetch_add(samples, std::memory_order_relaxed);
  // Decide every step whose admissions are complete, oldest first
  // (staleness: later steps' may be complete before the oldest's).
  while (ends_[SlotIndex(ending_step_)].num_ended >= EndsToDecide()) {
    if (clipping()) {
      if (MaybeAwaitNormLocked()) NoteUpdate();  // wakes the pulls
      break;  // ApplyStepNorm() decides, then looks at the next step
    }
    DecideWithBackupsLocked(ending_step_, ends_[SlotIndex(ending_step_)]);
  }
  return true;
}

absl::StatusOr<int64_t> ParameterShard::HoldCheckpointStep(
    int64_t min_step, int64_t end_step, absl::Duration hold) {
  if (!initialized_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint of step ", min_step, " on shard ",
                     options_.shard_index, " before it was initialised"));
  }
  if (!policy_.picks_checkpoint_step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of step ", min_step, " picked by shard ",
        options_.shard_index,
        ": only shard 0 of a job with backup workers picks a checkpoint's "
        "step"));
  }
  absl::MutexLock lock(&step_mu_);
  // The first step at or after worker 0's with no admitted end (staleness:
  // the ends of s + 1 steps are admitted at once).
  int64_t cut = std::max(min_step, ending_step_);
  while (cut <= ending_step_ + policy_.staleness() &&
         ends_[SlotIndex(cut)].num_ended > 0) {
    ++cut;
  }
  if (end_step > 0 && cut >= end_step) {
    return absl::OutOfRangeError(absl::StrCat(
        "checkpoint asked at step ", min_step, " on shard ",
        options_.shard_index, ": every step of the job (", end_step,
        ") was admitted without worker 0; no cut is left before its end"));
  }
  hold_step_ = cut;
  hold_until_ = absl::Now() + hold;
  hold_closes_ = false;
  return hold_step_;
}

absl::StatusOr<int64_t> ParameterShard::HoldFirstUndecidedStep(
    int64_t min_step, absl::Duration hold) {
  if (!initialized_.load() || !policy_.picks_checkpoint_step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a hold of shard ", options_.shard_index, "'s admissions at step ",
        min_step,
        ": only shard 0 of an initialised job with backup workers holds "
        "them"));
  }
  absl::MutexLock lock(&step_mu_);
  // A step whose admissions are complete is decided whatever the hold (with
  // clipping, once its norm is in), on every shard: the cut is past it.
  int64_t cut = std::max(min_step, ending_step_);
  while (cut <= ending_step_ + policy_.staleness() &&
         ends_[SlotIndex(cut)].num_ended >= EndsToDecide()) {
    ++cut;
  }
  hold_step_ = cut;
  hold_until_ = absl::Now() + hold;
  hold_closes_ = true;
  return hold_step_;
}

void ParameterShard::ReleaseCheckpointHold() {
  absl::MutexLock lock(&step_mu_);
  hold_step_ = -1;
  hold_closes_ = false;
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
  if (absl::Status s = CheckMember(worker_id); !s.ok()) return s;
  if (!std::isfinite(sum_sq) || sum_sq < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " sent ", sum_sq, " as the squared global norm ",
        "of step ", step, "; expected a finite sum >= 0"));
  }
  // After step_mu_'s release (declared before its lock).
  absl::Cleanup wake = [this] { WakeReadyAfterSwitch(); };
  absl::MutexLock lock(&step_mu_);
  // A late sum of the step a planned change was taken at comes from its
  // old generation.
  if (absl::Status current = CheckGenerationAt(generation, step + 1);
      !current.ok()) {
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
      static_cast<float>(policy_.clip_grad_norm()) / (norm + 1e-6f), 1.0f);
  // Backup workers: the admitted workers' pushes only.
  const std::vector<bool>* members = MaskOf(policy_.averages(), ends);
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

}  // namespace pstrain
