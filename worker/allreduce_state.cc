// The allreduce exchange's state (worker/allreduce_exchange.h): its
// checkpoints and top-k residual files, and an elastic job's worlds.
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/allreduce_exchange.h"
#include "worker/residual_files.h"

namespace pstrain {

absl::StatusOr<std::optional<WorkerMembership>>
AllreduceExchange::AgreeMembership(
    const std::optional<WorkerMembership>& proposal) {
  if (!elastic_.has_value()) {
    return GradientExchange::AgreeMembership(proposal);
  }
  // [epoch, members] of rank 0's proposal; epoch -1: none.
  int64_t head[2] = {-1, 0};
  if (proposal.has_value() && collective_->rank() == 0) {
    head[0] = proposal->epoch;
    head[1] = proposal->size();
  }
  RETURN_IF_ERROR(BroadcastInt64(*collective_, head, 2, 0));
  if (head[0] < 0) return std::nullopt;
  if (head[1] < 1 || head[1] > kMaxMembershipWorkers) {
    return absl::InternalError(
        absl::StrCat("rank 0 proposed a membership of ", head[1], " workers"));
  }
  // [from_step, data_epoch, data_offset, data_steps, workers...].
  std::vector<int64_t> body(4 + head[1]);
  if (collective_->rank() == 0) {
    body[0] = proposal->from_step;
    body[1] = proposal->data_epoch;
    body[2] = proposal->data_offset;
    body[3] = proposal->data_steps;
    for (int i = 0; i < proposal->size(); ++i) {
      body[4 + i] = proposal->workers[i];
    }
  }
  RETURN_IF_ERROR(BroadcastInt64(*collective_, body.data(), body.size(), 0));
  WorkerMembership agreed;
  agreed.epoch = head[0];
  agreed.from_step = body[0];
  agreed.data_epoch = static_cast<int>(body[1]);
  agreed.data_offset = body[2];
  agreed.data_steps = body[3];
  for (size_t i = 4; i < body.size(); ++i) {
    agreed.workers.push_back(static_cast<int>(body[i]));
  }
  return agreed;
}

absl::StatusOr<int64_t> AllreduceExchange::ChangeWorld(
    const WorkerMembership& next, bool after_failure, absl::Duration timeout) {
  if (!elastic_.has_value()) {
    return GradientExchange::ChangeWorld(next, after_failure, timeout);
  }
  if (after_failure) UndoStepInFlight();
  const int64_t in_flight = step_;
  bool joiners = false;
  for (int w : next.workers) {
    if (membership_.RankOf(w) < 0) joiners = true;
  }
  RETURN_IF_ERROR(JoinWorld(next, after_failure || joiners, membership_.epoch));
  if (after_failure && topk_.has_value() &&
      membership_.RankOf(worker_id()) >= 0) {
    AlignResiduals(in_flight);
  }
  return step_;
}

absl::StatusOr<std::vector<CheckpointResponse>> AllreduceExchange::Checkpoint(
    int64_t step, int64_t /*end_step*/, int64_t /*latest_step*/,
    const std::string& step_dir, bool wait) {
  absl::MutexLock lock(&checkpoint_mu_);
  if (wait) {
    if (!checkpoint_writer_.joinable() || checkpoint_step_ != step) {
      return absl::FailedPreconditionError(
          absl::StrCat("no checkpoint of step ", step, " was begun"));
    }
    checkpoint_writer_.join();
    RETURN_IF_ERROR(checkpoint_written_.status());
    if (saves_residuals()) {
      // Every worker's residual file of the step before the manifest
      // can name the checkpoint (an elastic job's members: worker 0
      // applies no membership while a checkpoint is in flight).
      std::vector<int> workers;
      if (elastic_.has_value()) {
        workers = membership_.workers;
      } else {
        for (int w = 0; w < collective_->size(); ++w) workers.push_back(w);
      }
      RETURN_IF_ERROR(
          WaitForResidualFiles(step_dir, workers, step, /*generation=*/0,
                               absl::Now() + compression_.residual_wait));
    }
    CheckpointResponse response;
    response.set_size_bytes(
        static_cast<int64_t>(checkpoint_written_->size_bytes));
    response.set_crc32(checkpoint_written_->crc32);
    response.set_num_chunks(static_cast<int64_t>(snapshot_.size()));
    response.set_min_version(step);
    response.set_max_version(step);
    return std::vector<CheckpointResponse>{response};
  }
  if (step != step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of step ", step, ": the weights are at step ", step_));
  }
  if (checkpoint_writer_.joinable()) checkpoint_writer_.join();
  const int num_params = static_cast<int>(m_.size());
  snapshot_.resize(weights_.size());
  for (size_t t = 0; t < weights_.size(); ++t) {
    ChunkSnapshot& c = snapshot_[t];
    c.spec.param_id = static_cast<int>(t);
    c.spec.shard = 0;
    c.spec.offset = 0;
    c.spec.num_elements = static_cast<int64_t>(weights_[t].size());
    c.is_buffer = static_cast<int>(t) >= num_params;
    c.version = step;
    c.weights.assign(weights_[t].begin(), weights_[t].end());
    if (!c.is_buffer) {
      c.m = m_[t];
      c.v = v_[t];
    }
  }
  checkpoint_step_ = step;
  if (saves_residuals()) {
    SaveResiduals(step);
    announced_.store(step);  // to the others in the step's first message
  }
  checkpoint_written_ = absl::UnknownError("not written");
  checkpoint_writer_ =
      std::thread([this, step, path = step_dir + "/shard-0.safetensors"] {
        safetensors::WriteOptions in_folder;
        in_folder.sync_folder = false;  // the CheckpointWriter's
        absl::StatusOr<safetensors::WriteResult> written =
            WriteShardCheckpoint(path, snapshot_, /*shard_index=*/0,
                                 /*num_shards=*/1, step, in_folder);
        checkpoint_written_ = std::move(written);  // read after the join
      });
  return std::vector<CheckpointResponse>{};
}

absl::StatusOr<bool> AllreduceExchange::RestoreResiduals(
    const std::string& step_dir, int64_t step) {
  if (compression_.compressor == nullptr) return false;
  return RestoreResidualFile(step_dir, worker_id(), step, step,
                             compression_.names, compression_.compressor.get());
}

void AllreduceExchange::SaveResiduals(int64_t step) {
  absl::Status written;
  absl::StatusOr<std::vector<absl::Span<const float>>> residuals =
      compression_.compressor->ResidualAt(step);
  if (residuals.ok()) {
    written =
        WriteResidualFile(compression_.step_dir(step), worker_id(), step,
                          /*generation=*/0, compression_.names, *residuals);
  } else {
    written = residuals.status();
  }
  if (!written.ok()) {
    std::fprintf(stderr,
                 "worker %d: residual file of checkpoint %lld not written: "
                 "%s\n",
                 worker_id(), static_cast<long long>(step),
                 std::string(written.message()).c_str());
  }
}

absl::Status AllreduceExchange::JoinWorld(const WorkerMembership& next,
                                          bool sync_state, int64_t from_epoch) {
  collective_ = nullptr;
  owned_.reset();
  membership_ = next;
  const int rank = next.RankOf(elastic_->worker_id);
  if (rank < 0) return absl::OkStatus();
  if (rank == 0 && elastic_->announce) {
    RETURN_IF_ERROR(elastic_->announce(from_epoch, next));
  }
  ASSIGN_OR_RETURN(owned_, elastic_->connect(rank, next.size(), next.epoch,
                                             elastic_->timeout));
  collective_ = owned_.get();
  if (elastic_->linear_lr_scaling) {
    // The linear scaling rule, as the shards apply it (ShardOptions).
    adam_.lr = static_cast<float>(static_cast<double>(base_lr_) * next.size() /
                                  elastic_->initial_workers);
  }
  return sync_state ? SyncState() : absl::OkStatus();
}

absl::Status AllreduceExchange::SyncState() {
  int64_t head[8] = {step_, samples_, 0, 0, 0, 0, 0, -1};
  if (topk_.has_value()) head[7] = compression_.compressor->newest_step();
  if (collective_->rank() == 0 && anchor_) {
    const WorkerMembership at = anchor_(step_);
    head[2] = at.data_epoch;
    head[3] = at.data_offset;
    head[4] = at.data_steps;
  }
  if (loss_scaler_ != nullptr) {
    uint32_t bits;
    std::memcpy(&bits, &loss_scaler_->state().scale, sizeof(bits));
    head[5] = bits;
    head[6] = loss_scaler_->state().growth_tracker;
  }
  RETURN_IF_ERROR(BroadcastInt64(*collective_, head, 8, 0));
  step_ = head[0];
  rank0_newest_ = head[7];
  samples_ = head[1];
  membership_.from_step = head[0];
  membership_.data_epoch = static_cast<int>(head[2]);
  membership_.data_offset = head[3];
  membership_.data_steps = head[4];
  if (loss_scaler_ != nullptr) {
    LossScaler::State scaler;
    const uint32_t bits = static_cast<uint32_t>(head[5]);
    std::memcpy(&scaler.scale, &bits, sizeof(bits));
    scaler.growth_tracker = head[6];
    loss_scaler_->Restore(scaler);
  }
  for (const absl::Span<float>& w : weights_) {
    RETURN_IF_ERROR(collective_->Broadcast(w.data(), w.size(), 0));
  }
  for (size_t t = 0; t < m_.size(); ++t) {
    RETURN_IF_ERROR(collective_->Broadcast(m_[t].data(), m_[t].size(), 0));
    RETURN_IF_ERROR(collective_->Broadcast(v_[t].data(), v_[t].size(), 0));
  }
  return absl::OkStatus();
}

void AllreduceExchange::AlignResiduals(int64_t in_flight) {
  TopKCompressor* topk = compression_.compressor.get();
  if (topk->newest_step() > rank0_newest_) {
    if (!topk->RewindTo(rank0_newest_)) {
      std::fprintf(stderr,
                   "worker %d: no residual at step %lld to go back to; "
                   "error feedback starts from zero\n",
                   worker_id(), static_cast<long long>(rank0_newest_));
      topk->Reset(rank0_newest_, {}).IgnoreError();
    }
  } else if (topk->newest_step() < rank0_newest_ &&
             in_flight + 1 == rank0_newest_) {
    topk->CommitStep(in_flight);
  }
}

void AllreduceExchange::UndoStepInFlight() {
  for (int t : updated_) UndoUpdate(t);
  updated_.clear();
  skip_.reset();
  own_nonfinite_.reset();
  averaged_ = false;
  allreduce_ = absl::ZeroDuration();
}

}  // namespace pstrain
