#include "worker/step_loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/nonfinite.h"
#include "common/status_macros.h"
#include "common/trace.h"

namespace pstrain {

bool NonFiniteInjection::At(int worker_id, int64_t step) const {
  if (worker != worker_id) return false;
  return every_step ||
         std::find(steps.begin(), steps.end(), step) != steps.end();
}

absl::StatusOr<NonFiniteInjection> ParseNonFiniteInjection(const char* text) {
  NonFiniteInjection injection;
  if (text == nullptr || *text == '\0') return injection;
  const auto bad = [text] {
    return absl::InvalidArgumentError(absl::StrCat(
        "PSTRAIN_INJECT_NONFINITE=\"", text,
        "\"; expected WORKER:all or WORKER:STEP[,STEP...] (a test aid)"));
  };
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &injection.worker) ||
      injection.worker < 0) {
    return bad();
  }
  if (parts[1] == "all") {
    injection.every_step = true;
    return injection;
  }
  for (absl::string_view step : absl::StrSplit(parts[1], ',')) {
    int64_t s;
    if (!absl::SimpleAtoi(step, &s) || s < 0) return bad();
    injection.steps.push_back(s);
  }
  return injection;
}

StepLoop::StepLoop(Options options, const DataPositions& positions, Parts parts)
    : options_(std::move(options)),
      positions_(positions),
      parts_(std::move(parts)),
      on_ready_([this](absl::Span<const int> tensors,
                       std::shared_ptr<CopyFence> fence) {
        GradientsReady(tensors, std::move(fence));
      }) {}

void StepLoop::GradientsReady(absl::Span<const int> tensors,
                              std::shared_ptr<CopyFence> fence) {
  if (options_.worker_id == 0 && parts_.elastic != nullptr) {
    // Before these gradients go out: a membership that became due since
    // the boundary is planned for this step's decision. (The step's ends
    // go to the shards only once every gradient is pushed, so any call
    // is early enough.)
    parts_.elastic->PlanBeforePush(step_);
  }
  const std::vector<absl::Span<const float>>& gradients =
      parts_.compute->gradients();
  if (options_.inject_nonfinite.At(options_.worker_id, step_) &&
      std::find(tensors.begin(), tensors.end(), 0) != tensors.end()) {
    // Parameter 0 (the first layer's, the last gradient backward makes,
    // so later layers' chunks have gone out already) gets a NaN.
    if (fence != nullptr) fence->Wait().IgnoreError();
    const_cast<float*>(gradients[0].data())[0] = std::nanf("");
  }
  parts_.exchange->GradientsReady(gradients, options_.batch_size, tensors,
                                  std::move(fence));
}

absl::Status StepLoop::Run(int64_t start_step) {
  step_ = start_step;
  for (int epoch = positions_.EpochOf(step_); epoch < positions_.epochs();
       ++epoch) {
    if (removed_) return absl::OkStatus();
    ASSIGN_OR_RETURN(bool recovered, TrainEpoch(epoch));
    if (!recovered) {
      ASSIGN_OR_RETURN(recovered, EndEpoch(epoch));
    }
    // Recovered at the job's last step (its end, or its last exchange,
    // failed with every step decided): the job ends again, final weights
    // and evaluation included.
    while (recovered && !removed_ && step_ == positions_.total_steps()) {
      ASSIGN_OR_RETURN(recovered, EndEpoch(positions_.epochs() - 1));
    }
    // Go on at the epoch of the step recovered to (then ++epoch).
    if (recovered) epoch = positions_.EpochOf(step_) - 1;
  }
  return absl::OkStatus();
}

std::string StepLoop::SamplesLine(int epoch) const {
  std::string line = absl::StrCat(epoch, " ", step_);
  for (uint32_t i : parts_.compute->LastBatchSamples()) {
    absl::StrAppend(&line, " ", i);
  }
  return line;
}

void StepLoop::AppendSamplesLine(const std::string& line) const {
  const std::string path = absl::StrCat(
      options_.record_samples_dir, "/samples-", options_.worker_id, ".txt");
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return;
  std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
}

void StepLoop::DropSamplesLinesFrom(int64_t step) const {
  const std::string path = absl::StrCat(
      options_.record_samples_dir, "/samples-", options_.worker_id, ".txt");
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  bool dropped = false;
  for (std::string line; std::getline(in, line);) {
    // "epoch step sample...": the second field.
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(' ', 2));
    int64_t line_step = 0;
    if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &line_step) &&
        line_step >= step) {
      dropped = true;
      continue;
    }
    absl::StrAppend(&kept, line, "\n");
  }
  in.close();
  if (!dropped) return;
  std::ofstream out(path, std::ios::trunc);
  out << kept;
}

void StepLoop::BeginSlice() {
  const DataPositions::Place place = positions_.Locate(step_);
  const int64_t first = step_ - place.step_in_epoch;  // the epoch's
  const DataPositions::Split split = positions_.SplitAt(step_);
  slice_until_rebase_ = split.next_rebase;
  const int64_t end = std::min(place.epoch_end, split.next_rebase);
  EpochSlice slice;
  slice.epoch = place.epoch;
  slice.rank = split.rank;
  slice.members = split.members;
  if (positions_.SegmentStart(step_) <= first) {
    // One membership since the epoch began: its batches from the first,
    // skipping those before (a streamed pipeline's augmentation draws as
    // in the run that never stopped).
    slice.steps = end - first;
    parts_.compute->BeginEpoch(slice);
    parts_.compute->SkipBatches(place.step_in_epoch);
    return;
  }
  slice.offset = place.offset;
  slice.steps = end - step_;
  parts_.compute->BeginEpoch(slice);
}

absl::StatusOr<bool> StepLoop::TrainEpoch(int epoch) {
  parts_.reporter->EpochBegan();
  loss_sum_ = 0;
  BeginSlice();
  while (true) {
    if (parts_.elastic != nullptr) {
      // Worker 0 applies a new membership at this step boundary; the
      // epoch goes on re-split from here.
      absl::StatusOr<std::optional<int64_t>> changed =
          parts_.elastic->MaybeApply(step_);
      if (!changed.ok()) {
        RETURN_IF_ERROR(Recover(changed.status()));
        return true;
      }
      if (changed->has_value()) {
        step_ = **changed;
        if (parts_.elastic->removed()) {
          removed_ = true;
          step_ = positions_.total_steps();
          return true;
        }
        // Allreduce: joining workers got rank 0's state (the others hold
        // the same); PS: the weights pulled at the change.
        if (options_.allreduce) RETURN_IF_ERROR(parts_.compute->LoadWeights());
        RETURN_IF_ERROR(ReportMembershipChanged());
        if (positions_.EpochOf(step_) != epoch) return true;
        BeginSlice();
        // Allreduce: the new world's members (a joining one first of all)
        // agree on this boundary again, in it.
        if (options_.allreduce) continue;
      }
    }
    const DataPositions::Place place = positions_.Locate(step_);
    if (place.epoch != epoch) break;
    if (absl::Status s = TrainStep(epoch, place.step_in_epoch); !s.ok()) {
      RETURN_IF_ERROR(Recover(std::move(s)));
      RETURN_IF_ERROR(RetryKeptStep());
      return true;
    }
    if (parts_.elastic != nullptr) {
      // A membership change the shards took at this step's decision
      // (planned by worker 0): the epoch is re-split from the next step.
      absl::StatusOr<std::optional<bool>> switched =
          parts_.elastic->TakeSwitch(step_);
      if (!switched.ok()) {
        RETURN_IF_ERROR(Recover(switched.status()));
        return true;
      }
      if (switched->has_value()) {
        if (!**switched) {
          removed_ = true;
          step_ = positions_.total_steps();
          return true;
        }
        RETURN_IF_ERROR(ReportMembershipChanged());
        if (positions_.EpochOf(step_) == epoch) BeginSlice();
      }
    }
    if (jumped_ > 0) {
      // The batches of the steps taken without this worker; past the
      // epoch's end the next epoch begins where the step is.
      const int64_t trained = step_ - jumped_ - 1;
      parts_.compute->SkipBatches(positions_.SkipInEpoch(trained, jumped_));
      jumped_ = 0;
    }
    if (step_ >= slice_until_rebase_ && positions_.EpochOf(step_) == epoch) {
      BeginSlice();  // the new membership's split from here
    }
  }
  return false;
}

absl::StatusOr<bool> StepLoop::EndEpoch(int epoch) {
  // The job's last epoch: every step's update in first (with staleness the
  // last pull lags), for the evaluation (in the device's copy too), the
  // results and the model file.
  absl::Status ended;
  if (epoch + 1 == positions_.epochs()) {
    ended = parts_.exchange->AwaitFinalWeights();
    if (ended.ok()) {
      if (const std::string shortfall =
              parts_.exchange->FinalWeightsShortfall();
          !shortfall.empty()) {
        parts_.reporter->Say(
            absl::StrCat("worker ", options_.worker_id, ": ", shortfall));
      }
      ended = parts_.compute->LoadWeights();
    }
  }
  // The training time since the last epoch's end (that final pull, the
  // recoveries and redone steps included), so that the epochs add up to
  // the Runtime.
  const double train_seconds = parts_.reporter->EpochEnded();
  if (ended.ok() && parts_.end_epoch) {
    ended = parts_.end_epoch(epoch, step_, train_seconds,
                             loss_sum_ / positions_.steps_per_epoch());
  }
  if (ended.ok()) return false;
  parts_.reporter->ResumeAfterFailure();  // a recovery is training time
  RETURN_IF_ERROR(Recover(std::move(ended)));
  return true;
}

absl::Status StepLoop::Recover(absl::Status cause, bool counted) {
  if (options_.allreduce && parts_.elastic != nullptr) {
    return RecoverWorld(std::move(cause));
  }
  const int64_t own_step = step_;
  ASSIGN_OR_RETURN(step_, parts_.recovery->Recover(std::move(cause), counted));
  // Steps from the one recovered at were undone (a rollback, or, with
  // staleness, steps this worker ran ahead of the shards' decisions that
  // a reopen dropped): their lines are no longer trained samples. (Async
  // undoes no step but by a restore, and is not counted exactly: its
  // lines stay.)
  if (!options_.record_samples_dir.empty() && !options_.async) {
    DropSamplesLinesFrom(step_);
  }
  const int64_t recovered = step_;
  const std::optional<std::pair<int64_t, std::string>> unrecorded =
      std::exchange(unrecorded_, std::nullopt);
  bool member = true;
  if (parts_.elastic != nullptr) {
    // The generation recovered into may have other members (a membership
    // change is a reopen, or a planned change the shards took before the
    // failure): re-split the epoch, or leave the job. Worker 0 first gives
    // the coordinator a moment to remove a dead worker.
    parts_.elastic->AwaitVerdict();
    const auto& applied = parts_.elastic->last_applied();
    const int64_t applied_before = applied.has_value() ? applied->epoch() : -1;
    ASSIGN_OR_RETURN(member, parts_.elastic->Follow(&step_, own_step));
    if (applied.has_value() && applied->epoch() != applied_before) {
      RETURN_IF_ERROR(ReportMembershipChanged());
    }
  }
  // A step whose exchange failed after the shards applied it (a membership
  // change reopening the shards while this worker pulled): in sync mode
  // without backup workers its push was in; not where this worker left at
  // that step or before (the reopen dropped its push, and the members
  // without it may have decided the step since).
  if (unrecorded.has_value() && recovered > unrecorded->first &&
      !options_.async && !options_.allreduce && !options_.backup_workers &&
      (member ||
       unrecorded->first < parts_.exchange->membership()->from_step)) {
    AppendSamplesLine(unrecorded->second);
  }
  if (!member) {
    removed_ = true;
    step_ = positions_.total_steps();
    return absl::OkStatus();
  }
  return parts_.reporter->Recovered();
}

absl::Status StepLoop::ReportMembershipChanged() {
  const auto& a = parts_.elastic->last_applied();
  if (!a.has_value()) return absl::OkStatus();
  return parts_.reporter->MembershipChanged(
      step_, positions_.EpochOf(step_),
      {a->old_workers(), a->new_workers(), a->old_ps(), a->new_ps(),
       a->elapsed_ms()});
}

absl::Status StepLoop::RecoverWorld(absl::Status cause) {
  const auto& applied = parts_.elastic->last_applied();
  const int64_t applied_before = applied.has_value() ? applied->epoch() : -1;
  ASSIGN_OR_RETURN(step_, parts_.elastic->RecoverWorld(std::move(cause)));
  // Rank 0's step: the steps from it on are undone, and the step in
  // flight was trained if rank 0 had ended it (its push was in every
  // sum).
  const std::optional<std::pair<int64_t, std::string>> unrecorded =
      std::exchange(unrecorded_, std::nullopt);
  if (!options_.record_samples_dir.empty()) {
    DropSamplesLinesFrom(step_);
    if (unrecorded.has_value() && step_ > unrecorded->first) {
      AppendSamplesLine(unrecorded->second);
    }
  }
  if (parts_.elastic->removed()) {
    removed_ = true;
    step_ = positions_.total_steps();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(parts_.compute->LoadWeights());
  if (applied.has_value() && applied->epoch() != applied_before) {
    RETURN_IF_ERROR(ReportMembershipChanged());
  }
  return parts_.reporter->Recovered();
}

absl::Status StepLoop::TrainStep(int epoch, int64_t index) {
  trace::Scope traced_step("step", "step", {{"step", step_}});
  kept_.reset();
  ASSIGN_OR_RETURN(ComputedStep computed, ComputeStep(epoch, index));
  absl::Status exchanged = ExchangeStep(computed);
  if (!exchanged.ok()) kept_ = std::move(computed);
  return exchanged;
}

absl::Status StepLoop::RetryKeptStep() {
  const std::optional<ComputedStep> kept = std::exchange(kept_, std::nullopt);
  if (!kept.has_value() || removed_ || options_.async || options_.allreduce ||
      step_ != kept->step) {
    return absl::OkStatus();
  }
  const DataPositions::Place place = positions_.Locate(step_);
  const DataPositions::Split split = positions_.SplitAt(step_);
  const bool same_batch =
      place.epoch == kept->place.epoch && place.offset == kept->place.offset &&
      place.step_in_epoch == kept->place.step_in_epoch &&
      split.members == kept->split.members && split.rank == kept->split.rank;
  const float scale =
      parts_.loss_scaler != nullptr ? parts_.loss_scaler->scale() : 0;
  // The epoch's last step is left to the epoch loop, whose end (the
  // evaluation, the epoch's checkpoint) follows it.
  if (!same_batch || scale != kept->loss_scale ||
      positions_.EpochOf(step_ + 1) != place.epoch) {
    return absl::OkStatus();
  }
  trace::Scope traced_step("step", "step", {{"step", step_}, {"again", 1}});
  parts_.reporter->Say(absl::StrCat(
      "worker ", options_.worker_id, ": step ", step_,
      " exchanged again with the gradients computed before the recovery "
      "(the same weights and batch)"));
  if (options_.sparse_rows) RETURN_IF_ERROR(SetStepRows());
  absl::Status again = ExchangeStep(*kept);
  // The epoch loop goes on from step_ (BeginSlice()).
  jumped_ = 0;
  if (again.ok()) return absl::OkStatus();
  return Recover(std::move(again), /*counted=*/false);
}

absl::StatusOr<StepLoop::ComputedStep> StepLoop::ComputeStep(int epoch,
                                                             int64_t index) {
  ComputedStep computed;
  computed.epoch = epoch;
  computed.index = index;
  computed.step = step_;
  computed.place = positions_.Locate(step_);
  computed.split = positions_.SplitAt(step_);
  Reporter::StepTimes& times = computed.times;
  times.step = step_;
  times.members = positions_.members();
  times.start = absl::Now();
  if (options_.worker_id == options_.straggler_worker) {
    // The straggler test aid: slower by a known time per step.
    absl::SleepFor(absl::Milliseconds(options_.straggler_delay_ms));
  }
  if (options_.sparse_rows) RETURN_IF_ERROR(SetStepRows());
  if (parts_.loss_scaler != nullptr) {
    computed.loss_scale = parts_.loss_scaler->scale();
    parts_.compute->SetLossScale(computed.loss_scale);
  }
  ASSIGN_OR_RETURN(computed.loss, parts_.compute->Step(on_ready_));
  times.computed = absl::Now();
  if (!options_.record_samples_dir.empty()) {
    computed.samples_line = SamplesLine(epoch);
  }
  return computed;
}

absl::Status StepLoop::ExchangeStep(const ComputedStep& computed) {
  const int epoch = computed.epoch;
  const int64_t index = computed.index;
  const float loss = computed.loss;
  Reporter::StepTimes times = computed.times;
  if (!std::isfinite(loss)) {
    NonFiniteValue value;
    value.value = NonFiniteText(loss);
    parts_.exchange->MarkStepNonFinite(value);
  }
  if (!options_.record_samples_dir.empty()) {
    unrecorded_.emplace(step_, computed.samples_line);
  }
  RETURN_IF_ERROR(
      parts_.exchange->Step(parts_.compute->gradients(), options_.batch_size));
  RETURN_IF_ERROR(parts_.compute->LoadWeights());
  const std::optional<std::pair<int64_t, std::string>> record =
      std::exchange(unrecorded_, std::nullopt);
  times.exchanged = absl::Now();
  parts_.reporter->TraceExchange(step_, times.computed, times.exchanged);
  times.phases = parts_.compute->LastPhases();
  const ExchangeStepTimes exchange_times = parts_.exchange->LastStepTimes();
  times.phases.push = exchange_times.push;
  times.phases.barrier_wait = exchange_times.barrier_wait;
  times.phases.pull = exchange_times.pull;
  times.phases.allreduce = exchange_times.allreduce;
  times.phases.bytes_pushed = exchange_times.bytes_pushed;
  times.phases.bytes_pulled = exchange_times.bytes_pulled;
  std::optional<SkippedStepInfo> skipped = parts_.exchange->SkippedStep();
  if (parts_.loss_scaler != nullptr) {
    parts_.loss_scaler->Update(skipped.has_value());
  }
  RETURN_IF_ERROR(HandleSkip(skipped));
  if (record.has_value() && !skipped.has_value() &&
      !parts_.exchange->LastStepLate()) {
    AppendSamplesLine(record->second);
  }
  if (!skipped.has_value()) loss_sum_ += loss;
  if (options_.report_loss && !skipped.has_value()) times.loss = loss;
  // Backup workers: a worker the shards left behind goes on from their
  // version.
  const int64_t next = parts_.exchange->NextStep(step_);
  times.late = parts_.exchange->LastStepLate();
  parts_.reporter->StepExchanged(times);
  const int64_t trained = step_;
  jumped_ = next - trained - 1;
  step_ = next;
  if (parts_.checkpoints != nullptr) {
    RETURN_IF_ERROR(parts_.checkpoints->AfterStep(trained, step_, absl::Now()));
  }
  return parts_.reporter->StepEnded(trained, step_, epoch, index);
}

absl::Status StepLoop::SetStepRows() {
  std::vector<std::vector<uint32_t>> touched, next;
  if (!parts_.compute->BatchRows(0, &touched)) {
    return absl::InternalError(
        absl::StrCat("step ", step_,
                     ": no batch rows for the row-sparse "
                     "tables"));
  }
  // The next batch is known when the next step is this epoch's (the
  // epoch's batches end with it, or with a membership change, which pulls
  // whole anyway).
  const bool pull_rows =
      step_ + 1 < positions_.total_steps() &&
      positions_.EpochOf(step_ + 1) == positions_.EpochOf(step_) &&
      parts_.compute->BatchRows(1, &next);
  parts_.exchange->SetStepRows(std::move(touched), std::move(next), pull_rows);
  return absl::OkStatus();
}

absl::Status StepLoop::HandleSkip(std::optional<SkippedStepInfo>& skipped) {
  if (!skipped.has_value()) {
    consecutive_skips_ = 0;
    return absl::OkStatus();
  }
  // Async: the shards' version is no step of this worker's; name the
  // worker's own.
  if (options_.async) skipped->step = step_;
  ++consecutive_skips_;
  if (skipped->worker_id == options_.worker_id) {
    parts_.reporter->Say(absl::StrCat(
        "worker ", options_.worker_id, ": ", DescribeSkip(*skipped),
        options_.async       ? "; its pushes from there on are dropped ("
        : options_.allreduce ? "; the step is skipped on every worker ("
                             : "; the step is skipped on every shard (",
        consecutive_skips_, " in a row; at most ", options_.max_nonfinite_steps,
        ")"));
  }
  if (consecutive_skips_ > options_.max_nonfinite_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        consecutive_skips_,
        " consecutive steps skipped for non-finite values "
        "(--max_nonfinite_steps=",
        options_.max_nonfinite_steps, "); the last: ", DescribeSkip(*skipped)));
  }
  return absl::OkStatus();
}

std::string StepLoop::DescribeSkip(const SkippedStepInfo& skip) const {
  const NonFiniteValue& v = skip.nonfinite;
  const std::vector<std::string>& names = options_.tensor_names;
  const std::string where =
      v.param_id < 0 ? "the loss"
      : v.param_id < static_cast<int>(names.size())
          ? absl::StrCat("element ", v.element, " of the gradient of ",
                         names[v.param_id])
          : absl::StrCat("element ", v.element, " of parameter ", v.param_id);
  const std::string who = skip.worker_id < 0
                              ? std::string("a worker's")
                              : absl::StrCat("worker ", skip.worker_id, "'s");
  return absl::StrCat("step ", skip.step, ": ", who, " ", where, " is ",
                      v.value);
}

}  // namespace pstrain
