#include "worker/gradient_exchange.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/nonfinite.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "server/shard_checkpoint.h"
#include "worker/residual_files.h"

namespace pstrain {
namespace {

// The smallest version of any range of `state` (0 if it has none): sync
// state has one version throughout; async's chunks each have their own,
// and the workers' pulls go on from the smallest.
int64_t SmallestVersion(const ModelState& state) {
  int64_t version = -1;
  for (const std::vector<ModelState::Range>& ranges : state.versions) {
    for (const ModelState::Range& r : ranges) {
      if (version < 0 || r.version < version) version = r.version;
    }
  }
  return std::max<int64_t>(version, 0);
}

class PsExchange : public GradientExchange, public WeightsGate {
 public:
  PsExchange(std::unique_ptr<PsClient> client, bool sync, bool chief,
             absl::Duration init_timeout, int staleness, bool backup_workers,
             ExchangeCompression compression,
             std::optional<int64_t> ready_generation)
      : client_(std::move(client)),
        sync_(sync),
        chief_(chief),
        init_timeout_(init_timeout),
        staleness_(staleness),
        backup_workers_(sync && backup_workers),
        compression_(std::move(compression)),
        ready_generation_(ready_generation) {}

  absl::Status Start(const std::vector<absl::Span<float>>& weights,
                     const ModelState* resume) override {
    if (chief_ && !ready_generation_.has_value()) {
      std::vector<absl::Span<const float>> initial(weights.begin(),
                                                   weights.end());
      RETURN_IF_ERROR(client_->Initialize(initial, resume));
    }
    RETURN_IF_ERROR(
        client_->WaitReady(init_timeout_, ready_generation_.value_or(0)));
    weights_ = weights;
    ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, 0, 0, weights_));
    step_ = version_;
    return absl::OkStatus();
  }

  void GradientsReady(const std::vector<absl::Span<const float>>& gradients,
                      int64_t samples, absl::Span<const int> tensors,
                      std::shared_ptr<CopyFence> fence) override {
    // After an error no tensor begins the step: Step() reports the error.
    if (!pull_error_.ok()) return;
    if (pull_in_flight_) {
      // (The gated compute completed it before backward already.)
      pull_error_ = CompletePull();
      if (!pull_error_.ok()) return;
    }
    if (!client_->step_begun()) {
      // An error here (a stream re-opened for its age that did not close
      // cleanly: its shard died between steps; PsClient::BeginStep()) is
      // the step's.
      pull_error_ = BeginStep(gradients, samples);
      if (!pull_error_.ok()) return;
    }
    client_->PushReady(tensors, std::move(fence));
  }

  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples) override {
    if (!pull_error_.ok()) return std::exchange(pull_error_, absl::OkStatus());
    RETURN_IF_ERROR(CompletePull());
    if (!client_->step_begun()) {
      RETURN_IF_ERROR(BeginStep(gradients, samples));
    }
    if (pending_mark_.has_value()) {
      client_->MarkStepNonFinite(*pending_mark_);
      pending_mark_.reset();
    }
    if (early_forward_ && client_->AwaitDecision()) {
      // Decided and not skipped: the weights of version step_ + 1 are
      // final and still arriving; the next forward asks for each tensor
      // (AwaitTensor) and CompletePull() ends the pull.
      pull_in_flight_ = true;
      version_ = step_ + 1;
      ++step_;
      if (TopKCompressor* topk = compression_.compressor.get()) {
        topk->CommitStep(pushed_tag_);
        ++pushes_;
      }
      return absl::OkStatus();
    }
    absl::StatusOr<int64_t> finished = client_->FinishStep();
    if (!finished.ok()) {
      // A worker that died writes no residual file: worker 0's checkpoint
      // in flight stops waiting for one.
      residual_wait_abandoned_.store(true);
      return finished.status();
    }
    version_ = *finished;
    ++step_;
    if (TopKCompressor* topk = compression_.compressor.get()) {
      // A skipped step, or one the shards dropped (late), changed nothing:
      // its residual is not kept.
      if (!client_->skipped_step().has_value() && !client_->last_step_late()) {
        topk->CommitStep(pushed_tag_);
        ++pushes_;
      }
    }
    if (backup_workers_) {
      // Late (the shards decided the step without this worker), or a pull
      // that straddled a later step decided without it: the weights are
      // pulled again, whole, at the newest version, and the worker goes
      // on from there (its gradients are computed on one version). With
      // staleness a pull's chunks may be at several versions anyway: the
      // worker goes on from the oldest, if it is past the worker's step.
      // A pull by rows brought the rows of batch step_ only: a worker that
      // jumps past it trains another batch, so it pulls again, whole.
      while ((staleness_ == 0 && client_->last_max_version() > version_) ||
             (client_->last_pull_by_rows() && version_ > step_)) {
        ASSIGN_OR_RETURN(
            version_,
            client_->PushPull(0, {}, client_->last_max_version(), 0, weights_));
      }
      step_ = std::max(step_, version_);
    }
    return SaveAnnouncedResiduals();
  }

  absl::StatusOr<bool> RestoreResiduals(const std::string& step_dir,
                                        int64_t step) override {
    return LoadResiduals(step_dir, step);
  }

  int64_t NextStep(int64_t step) const override {
    return backup_workers_ ? step_ : step + 1;
  }

  bool LastStepLate() const override { return client_->last_step_late(); }

  void MarkStepNonFinite(const NonFiniteValue& value) override {
    pending_mark_ = value;  // given to the step in Step()
  }

  void SetStepRows(std::vector<std::vector<uint32_t>> touched,
                   std::vector<std::vector<uint32_t>> next,
                   bool pull_rows) override {
    // A pull still in flight (forward before the pull ends) has sent its
    // request, and its pushes (still going after a verdict) keep the rows
    // their step began with: these are the next step's.
    client_->SetStepRows(std::move(touched), std::move(next), pull_rows);
  }

  std::optional<SkippedStepInfo> SkippedStep() const override {
    return client_->skipped_step();
  }

  ExchangeStepTimes LastStepTimes() const override {
    const PsStepTimes& t = client_->last_step_times();
    ExchangeStepTimes times;
    times.push = t.push;
    times.barrier_wait = t.barrier_wait;
    times.pull = t.pull;
    times.bytes_pushed = t.bytes_pushed;
    times.bytes_pulled = t.bytes_pulled;
    return times;
  }

  absl::StatusOr<int64_t> SamplesSoFar() override {
    // Samples of every worker, counted by shard 0.
    ASSIGN_OR_RETURN(StatsResponse stats, client_->Stats(0));
    return stats.samples();
  }

  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t end_step, int64_t latest_step,
      const std::string& step_dir, bool wait) override {
    if (!wait) {
      residual_wait_abandoned_.store(false);
      if (checkpoint_generation_.exchange(client_->generation()) !=
          client_->generation()) {
        own_checkpoint_step_ = -1;  // an older generation's pick
      }
    }
    ASSIGN_OR_RETURN(std::vector<CheckpointResponse> replies,
                     client_->Checkpoint(step, end_step, latest_step, wait));
    if (!wait && saves_residuals()) {
      // Worker 0 knows its cut now (backup workers: shard 0's pick), and
      // saves its own residual as soon as it holds it: at once unless the
      // cut lies ahead (an evaluation may come before its next step).
      own_checkpoint_step_ = std::max(
          own_checkpoint_step_, replies.empty() ? step : replies[0].step());
      RETURN_IF_ERROR(SaveAnnouncedResiduals());
    }
    if (wait && saves_residuals()) {
      // Every worker's residual file of the cut (worker/residual_files.h)
      // before the manifest can name the checkpoint.
      // An elastic job's members (worker 0 applies no membership while a
      // checkpoint is in flight: those of the cut).
      std::vector<int> workers;
      if (const std::optional<WorkerMembership> m = client_->membership()) {
        workers = m->workers;
      } else {
        for (int w = 0; w < compression_.num_workers; ++w) workers.push_back(w);
      }
      RETURN_IF_ERROR(WaitForResidualFiles(
          step_dir, workers, step, checkpoint_generation_.load(),
          absl::Now() + init_timeout_, &residual_wait_abandoned_));
    }
    return replies;
  }

  void BeforeRecovery() override {
    if (saves_residuals() && AnnouncedCut() > residual_saved_) {
      residual_wait_abandoned_.store(true);
    }
  }

  absl::Status BeforePause() override {
    RETURN_IF_ERROR(CompletePull());
    return client_->CloseStreams();
  }
  absl::Status Finish() override {
    RETURN_IF_ERROR(CompletePull());
    return client_->Done();
  }

  WeightsGate* StartEarlyForward() override {
    const PsClientOptions& options = client_->options();
    if (!options.priority_pulls || !sync_ || staleness_ > 0 ||
        backup_workers_) {
      return nullptr;
    }
    early_forward_ = true;
    client_->set_announce_decisions(true);
    return this;
  }
  absl::Status AwaitWeights() override { return CompletePull(); }
  absl::Status AwaitFinalWeights() override {
    RETURN_IF_ERROR(CompletePull());
    const bool stale = sync_ && staleness_ > 0;
    if (sync_ && !stale && !client_->sixteen_bit_wire()) {
      return absl::OkStatus();
    }
    // Async: once every member's last push is in (or no push came for
    // init_timeout: the streams idle meanwhile are closed), the shards'
    // weights as they are; sync: version step_ (the last pull answered the
    // norm of step step_ - 1 - s). In fp32.
    final_shortfall_.clear();
    if (!sync_) {
      RETURN_IF_ERROR(client_->CloseStreams());
      ASSIGN_OR_RETURN(const std::vector<int> training,
                       client_->AwaitStepsEnded(init_timeout_));
      if (!training.empty()) {
        final_shortfall_ = absl::StrCat(
            "the final weights: worker(s) ", absl::StrJoin(training, ","),
            " had not ended their last step and no push reached the shards "
            "for ",
            absl::FormatDuration(init_timeout_),
            "; they hold the pushes in so far");
      }
    }
    ASSIGN_OR_RETURN(version_, sync_ ? client_->PullDecided(step_ - staleness_,
                                                            step_, weights_)
                                     : client_->PullDecided(0, 0, weights_));
    // A checkpoint those pulls announced takes this worker's residual.
    return SaveAnnouncedResiduals();
  }

  std::string FinalWeightsShortfall() const override {
    return final_shortfall_;
  }

  // WeightsGate: the compute's forward asks per tensor, then for all.
  absl::Status AwaitTensor(int t) override {
    if (!pull_in_flight_ || client_->AwaitTensor(t)) return absl::OkStatus();
    return CompletePull();  // the step failed: its error
  }
  absl::Status AwaitAll() override { return CompletePull(); }

  absl::StatusOr<int64_t> Recover(const std::vector<std::string>& addresses,
                                  const ModelState* restore,
                                  absl::Duration timeout) override {
    return Continue(addresses, restore, client_->generation() + 1, timeout,
                    /*live=*/true);
  }

  absl::StatusOr<int64_t> Rejoin(const std::vector<absl::Span<float>>& weights,
                                 const std::vector<std::string>& addresses,
                                 const ModelState* restore,
                                 absl::Duration timeout) override {
    weights_ = weights;
    return Continue(addresses, restore, 0, timeout, /*live=*/false);
  }

  bool RecoveredInPlace() const override { return reopened_; }
  std::string ReopenRefusal() const override { return reopen_refusal_; }

  absl::StatusOr<int64_t> ChangeMembership(const MembershipAt& membership_at,
                                           absl::Duration timeout) override {
    ASSIGN_OR_RETURN(const int64_t settled,
                     SettleAtOwnStep("a membership change", timeout));
    // Anchored at the version every shard stands at now, so that one
    // reopen gives the followers the data position of the steps they run
    // in the new generation.
    const WorkerMembership membership = membership_at(settled);
    ASSIGN_OR_RETURN(const int64_t reopened,
                     client_->Reopen(timeout, &membership));
    if (sync_ && reopened != settled) {
      return absl::InternalError(absl::StrCat(
          "a membership change: the shards were settled at version ", settled,
          " but reopened at ", reopened,
          "; the membership's data position is that of ", settled));
    }
    RETURN_IF_ERROR(client_->WaitReady(timeout, client_->generation(),
                                       /*wait_for_connection=*/false));
    ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, 0, 0, weights_));
    step_ = version_;
    RETURN_IF_ERROR(KeepResiduals(/*live=*/true));
    return sync_ ? version_ : membership.from_step;
  }
  absl::Status PlanMembership(const WorkerMembership& next, int64_t step,
                              absl::Duration timeout) override {
    if (!sync_ || staleness_ > 0 || backup_workers_) {
      return GradientExchange::PlanMembership(next, step, timeout);
    }
    // The plan names the decision of step `step`: every shard must have
    // decided the one before (a pull Step() left running, whose pushes
    // may still be going after a verdict).
    RETURN_IF_ERROR(CompletePull());
    if (step != step_) {
      return absl::InternalError(
          absl::StrCat("a membership change planned at step ", step,
                       " while this worker pulled version ", step_));
    }
    trace::Scope traced("plan membership", "elastic", {{"step", step}});
    return client_->PlanReopen(step + 1, next, timeout);
  }
  absl::StatusOr<int64_t> ChangeShards(
      const std::vector<std::string>& addresses,
      const MembershipAt& membership_at, absl::Duration timeout) override {
    trace::Scope traced(
        "change shards", "elastic",
        {{"step", step_},
         {"old_shards", client_->num_shards()},
         {"new_shards", static_cast<int64_t>(addresses.size())}});
    ASSIGN_OR_RETURN(const int64_t settled,
                     SettleAtOwnStep("a change of shards", timeout));
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> next,
                     client_->WithShards(addresses));
    // Sync: every chunk at the settled version (MoveStateTo checks it),
    // the new membership's data position that of its step; async: every
    // chunk moves as it is, at its own version, and the caller's
    // membership_at anchors worker 0's step instead.
    const WorkerMembership membership = membership_at(settled);
    trace::Scope moved("move", "elastic");
    ASSIGN_OR_RETURN(const int64_t generation,
                     client_->MoveStateTo(*next, sync_ ? settled : -1,
                                          &membership, timeout));
    moved.End();
    client_ = std::move(next);
    trace::Scope ready("wait ready and pull", "elastic");
    RETURN_IF_ERROR(client_->WaitReady(timeout, generation,
                                       /*wait_for_connection=*/false));
    ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, 0, 0, weights_));
    ready.End();
    step_ = version_;
    RETURN_IF_ERROR(KeepResiduals(/*live=*/true));
    return sync_ ? version_ : membership.from_step;
  }
  std::optional<WorkerMembership> membership() const override {
    return client_->membership();
  }
  void set_restore_membership(MembershipAt membership_at) override {
    restore_membership_ = std::move(membership_at);
  }
  void set_joining(bool joining) override { client_->set_joining(joining); }
  // Sync: the shards keep the members' loss scale (PsClient::set_loss_scaler).
  void set_loss_scaler(LossScaler* scaler) override {
    if (sync_) client_->set_loss_scaler(scaler);
  }

 private:
  // Recover() and Rejoin(): the shards' generation of at least
  // `min_generation` (worker 0: a new one it restores). `live`: this
  // process trained before (a recovery, not a restarted or joining
  // worker's rejoin), so it holds its own residuals (KeepResiduals()).
  absl::StatusOr<int64_t> Continue(const std::vector<std::string>& addresses,
                                   const ModelState* restore,
                                   int64_t min_generation,
                                   absl::Duration timeout, bool live) {
    DropStepInFlight();
    if (!addresses.empty() &&
        static_cast<int>(addresses.size()) != client_->num_shards()) {
      // An elastic job's worker 0 moved the state onto another number of
      // shards (ChangeShards()).
      ASSIGN_OR_RETURN(client_, client_->WithShards(addresses));
    } else if (!addresses.empty()) {
      RETURN_IF_ERROR(client_->SetAddresses(addresses));
    }
    reopened_ = false;
    if (restore != nullptr && saves_residuals()) {
      reopen_refusal_ =
          "top-k compression with error feedback: a dead worker's residuals "
          "live only in checkpoints, so the shards restore one";
    }
    if (restore != nullptr) {
      // Sync: every shard goes on from its own state at its last decided
      // step when it still holds it (no rollback; with staleness the
      // steps the workers ran ahead of it are dropped and redone); a
      // restarted shard, or shards that decided different steps (a worker
      // that died between its step ends to two shards), take the
      // checkpoint instead.
      absl::StatusOr<int64_t> reopened =
          sync_ && !saves_residuals()
              ? client_->Reopen(timeout)
              : absl::FailedPreconditionError(
                    "async: the shards always restore the checkpoint");
      if (reopened.ok()) {
        reopened_ = true;
        min_generation = client_->generation();
      } else if (!absl::IsFailedPrecondition(reopened.status())) {
        return reopened.status();
      } else {
        if (!saves_residuals()) {
          reopen_refusal_ = std::string(reopened.status().message());
        }
        std::vector<absl::Span<const float>> weights;
        for (const std::vector<float>& w : restore->weights) {
          weights.push_back(absl::MakeConstSpan(w));
        }
        std::optional<WorkerMembership> membership;
        if (restore_membership_) {
          membership = restore_membership_(SmallestVersion(*restore));
        }
        ASSIGN_OR_RETURN(
            min_generation,
            client_->Restore(weights, *restore, timeout,
                             membership.has_value() ? &*membership : nullptr));
      }
    }
    RETURN_IF_ERROR(client_->WaitReady(timeout, min_generation,
                                       /*wait_for_connection=*/false));
    ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, 0, 0, weights_));
    step_ = version_;
    RETURN_IF_ERROR(KeepResiduals(live));
    return version_;
  }

  // The top-k residuals this worker goes on with from the shards' version_
  // after a recovery, a rejoin, or a membership or shard change, whether
  // the shards reopened in place or went back to a checkpoint. Sync, a
  // live worker: its own. A step of it that did not finish but whose
  // pushes all went out was applied if the shards decided it (version_ is
  // past it) and shard 0 did not answer it late, so its residual is
  // committed (had shard 0 admitted it unheard, committing costs the
  // pushed entries, as a late step costs its gradient; not committing
  // would push them twice). Then the residual at the start of version_ is
  // the newest commit at or before it (TopKCompressor::ResidualAt), which
  // is also what a checkpoint of version_ holds of this worker. Otherwise
  // (a restarted or joining worker, a ring no longer reaching back to
  // version_): the residual file of the checkpoint of version_, or zeros
  // where there is none (a worker that joined after it). Async: zeros
  // (async restores are not exact anyway).
  absl::Status KeepResiduals(bool live) {
    TopKCompressor* topk = compression_.compressor.get();
    if (topk == nullptr) return absl::OkStatus();
    const std::optional<PsClient::UnfinishedStep> unfinished =
        std::exchange(unfinished_, std::nullopt);
    if (sync_ && live && topk->options().error_feedback) {
      if (unfinished.has_value() && unfinished->all_pushed &&
          unfinished->admission != 0 && unfinished->step < version_ &&
          unfinished->step >= topk->newest_step()) {
        topk->CommitStep(unfinished->step);
      }
      if (topk->RewindTo(version_)) {
        residual_saved_ = std::min(residual_saved_, version_ - 1);
        return absl::OkStatus();
      }
    }
    const bool from_file = sync_ && version_ > 0 && compression_.step_dir;
    return LoadResiduals(from_file ? compression_.step_dir(version_) : "",
                         version_)
        .status();
  }

  // Ends the pull Step() left running (forward before the pull ends):
  // every chunk in, gRPC done with the pushed gradients.
  absl::Status CompletePull() {
    if (!pull_in_flight_) return absl::OkStatus();
    pull_in_flight_ = false;
    absl::StatusOr<int64_t> finished = client_->FinishStep();
    if (!finished.ok()) {
      residual_wait_abandoned_.store(true);
      return finished.status();
    }
    if (*finished != version_) {
      return absl::DataLossError(
          absl::StrCat("the shards announced step ", version_ - 1,
                       " decided, but the pull brought version ", *finished));
    }
    return SaveAnnouncedResiduals();
  }

  // Before worker 0 reopens the shards at a step boundary (`what`: a
  // membership change, a change of shards), between its pull of version
  // step_ and its push of it: with staleness, waits until every shard has
  // decided step_ - 1 (a pull of version step_), then drops the step in
  // flight (nothing pushed yet) and the streams. The others may be up to
  // `staleness` steps behind this worker and each shard decides steps on
  // its own, but none can decide step_ without this worker's push, so then
  // every shard stands at version step_ and reopens there; the others'
  // pushes of later steps are dropped, and they redo those steps in the
  // new generation. Backup workers (with or without staleness): the
  // others decide steps without this worker, so shard 0 holds the
  // admissions of a cut at or past step_ and every shard decides the steps
  // before it (PsClient::HoldAndSettle): every shard then stands at the
  // cut's version; the others' pushes of later steps are dropped and
  // redone. Async: nothing to settle (every push applied is final, the
  // shards keep their state as it is): the step in flight is dropped.
  // Returns the version every shard stands at (sync: step_, or the cut;
  // async: step_, which means no shared step).
  absl::StatusOr<int64_t> SettleAtOwnStep(absl::string_view what,
                                          absl::Duration timeout) {
    // A pull Step() left running (its pushes may still be going after a
    // verdict): the shards decide that step before anything is dropped.
    RETURN_IF_ERROR(CompletePull());
    int64_t settled = step_;
    if (sync_ && backup_workers_) {
      // On the open streams, as below.
      absl::StatusOr<int64_t> cut = client_->HoldAndSettle(step_, timeout);
      if (!cut.ok()) {
        return absl::Status(cut.status().code(),
                            absl::StrCat(what, ": ", cut.status().message()));
      }
      settled = *cut;
    } else if (sync_ && staleness_ > 0) {
      // On the open streams, before they are dropped: a member's stream
      // that ends breaks the shard's barrier (PushPullSession::Finish).
      ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, step_, 0, weights_));
    }
    DropStepInFlight();
    return settled;
  }

  // Gives up the step in flight and every stream (a recovery, or a
  // membership change).
  void DropStepInFlight() {
    client_->Reset();
    // A step whose FinishStep() failed, or the one Reset() gave up (kept
    // across the retries of a recovery, whose pulls begin no step with
    // pushes).
    if (client_->unfinished_step().has_value()) {
      unfinished_ = client_->unfinished_step();
    }
    pending_mark_.reset();
    pull_in_flight_ = false;
    pull_error_ = absl::OkStatus();
  }

  bool saves_residuals() const {
    return compression_.compressor != nullptr &&
           compression_.compressor->options().error_feedback &&
           compression_.step_dir != nullptr;
  }

  // The residuals at the start of `step` from `step_dir`'s file (empty:
  // zeros). False (zeros) where the folder holds none (a checkpoint of a
  // job without compression).
  absl::StatusOr<bool> LoadResiduals(const std::string& step_dir,
                                     int64_t step) {
    TopKCompressor* topk = compression_.compressor.get();
    if (topk == nullptr) return false;
    const int64_t tag = sync_ ? step : pushes_;
    // Zeros (no file): this worker holds no residual of any step before
    // this one either (a worker restarted into a backup job after a cut it
    // missed), so they are its residual at every earlier cut too: a
    // checkpoint in flight still gets this worker's file, of zeros.
    residual_saved_ = -1;
    ASSIGN_OR_RETURN(const bool restored,
                     RestoreResidualFile(step_dir, compression_.worker_id, step,
                                         tag, compression_.names, topk));
    if (restored) residual_saved_ = step;
    return restored;
  }

  // After a step: the residual of the newest checkpoint shard 0 announced
  // into its folder, once this worker holds it (sync: it has finished the
  // step before the cut; async: the residual now).
  // The newest checkpoint cut this worker must save its residual of: shard
  // 0's announcement, or worker 0's own pick, of the current generation
  // (a recovery or a reopen abandons the checkpoint in flight: its cut is
  // not the next checkpoint's, whose folder worker 0 clears first).
  int64_t AnnouncedCut() const {
    const int64_t own = checkpoint_generation_.load() == client_->generation()
                            ? own_checkpoint_step_
                            : -1;
    return std::max(client_->announced_checkpoint_step(), own);
  }

  absl::Status SaveAnnouncedResiduals() {
    const int64_t announced = AnnouncedCut();
    if (!saves_residuals() || announced <= residual_saved_) {
      return absl::OkStatus();
    }
    TopKCompressor* topk = compression_.compressor.get();
    // Sync: held once this worker's next step is at or past the cut (a
    // late or skipped step committed nothing, so the newest commit at or
    // before the cut is its residual).
    if (sync_ && step_ < announced) return absl::OkStatus();
    // An elastic job's cut before the membership this worker trains in
    // was complete before worker 0 applied it (ElasticMembership waits for
    // its checkpoint, or applies the change after it): not this worker's
    // to write (a joining worker was no member there).
    residual_saved_ = announced;
    if (const std::optional<WorkerMembership> m = client_->membership();
        sync_ && m.has_value() && announced < m->from_step) {
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<absl::Span<const float>>> residuals =
        topk->ResidualAt(sync_ ? announced : topk->newest_step());
    if (!residuals.ok()) {
      // Worker 0's wait for this file gives up; the checkpoint is not
      // taken.
      std::fprintf(stderr,
                   "worker %d: no residual file for checkpoint %lld: %s\n",
                   compression_.worker_id, static_cast<long long>(announced),
                   std::string(residuals.status().message()).c_str());
      return absl::OkStatus();
    }
    if (absl::Status written = WriteResidualFile(
            compression_.step_dir(announced), compression_.worker_id, announced,
            client_->generation(), compression_.names, *residuals);
        !written.ok()) {
      // Worker 0 gave the checkpoint up and removed its folder while this
      // file was written (a shard died: RemoveOldCheckpoints takes the
      // folders after `latest`), or the write itself failed: either way
      // worker 0's wait for the file fails and that checkpoint is not
      // taken. Training goes on, as it does when a shard's write fails.
      std::fprintf(stderr,
                   "worker %d: residual file of checkpoint %lld not written "
                   "(that checkpoint is not taken): %s\n",
                   compression_.worker_id, static_cast<long long>(announced),
                   written.ToString().c_str());
    }
    return absl::OkStatus();
  }

  absl::Status BeginStep(const std::vector<absl::Span<const float>>& gradients,
                         int64_t samples) {
    // Sync: the weights after this step's update (staleness s: after step
    // step_ - s's; at least version 1, which keeps the pull a sync one:
    // PsClient sends it first and ends the step on every shard).
    const int64_t min_version =
        sync_ ? std::max<int64_t>(1, step_ + 1 - staleness_) : 0;
    if (TopKCompressor* topk = compression_.compressor.get()) {
      pushed_tag_ = sync_ ? step_ : pushes_;
      unfinished_.reset();
      topk->BeginStep(pushed_tag_);
    }
    return client_->BeginStep(sync_ ? step_ : version_, gradients, min_version,
                              samples, weights_);
  }

  std::unique_ptr<PsClient> client_;
  const bool sync_;
  const bool chief_;
  const absl::Duration init_timeout_;
  // AwaitFinalWeights(): what the final weights lack ("" nothing).
  std::string final_shortfall_;
  const int staleness_;
  const bool backup_workers_;
  std::vector<absl::Span<float>> weights_;
  // The smallest version pulled last, and (sync) this worker's step: equal
  // without staleness. Async pushes carry the version.
  int64_t version_ = 0;
  int64_t step_ = 0;
  std::optional<NonFiniteValue> pending_mark_;
  // Forward before the pull ends (StartEarlyForward()): on; the last
  // Step() returned with its pull still running; the error of a pull
  // completed in GradientsReady(), which the next Step() returns.
  bool early_forward_ = false;
  bool pull_in_flight_ = false;
  absl::Status pull_error_;
  // The last Recover()/Rejoin() of worker 0 reopened the shards in place;
  // else why they could not be (empty: not tried).
  bool reopened_ = false;
  std::string reopen_refusal_;
  MembershipAt restore_membership_;
  // Top-k compression: its compressor and residual files; the tag of the
  // step in flight (sync: the step; async: this worker's pushes so far,
  // `pushes_`); the newest checkpoint whose residual was saved (or
  // restored).
  ExchangeCompression compression_;
  // The shards' generation holding the initial state already (a partition
  // tuning's), or nullopt.
  const std::optional<int64_t> ready_generation_;
  int64_t pushed_tag_ = 0;
  // The step DropStepInFlight() found unfinished (KeepResiduals()).
  std::optional<PsClient::UnfinishedStep> unfinished_;
  int64_t pushes_ = 0;
  int64_t residual_saved_ = -1;
  // Worker 0: the cut of the newest checkpoint it began.
  int64_t own_checkpoint_step_ = -1;
  // Worker 0's checkpoint in flight: the generation it was begun in, and
  // whether its wait for residual files gives up (a step failed).
  std::atomic<int64_t> checkpoint_generation_{0};
  std::atomic<bool> residual_wait_abandoned_{false};
};

}  // namespace

std::unique_ptr<GradientExchange> CreatePsExchange(
    std::unique_ptr<PsClient> client, bool sync, bool chief,
    absl::Duration init_timeout, int staleness, bool backup_workers,
    ExchangeCompression compression, std::optional<int64_t> ready_generation) {
  return std::make_unique<PsExchange>(std::move(client), sync, chief,
                                      init_timeout, staleness, backup_workers,
                                      std::move(compression), ready_generation);
}

}  // namespace pstrain
