// The allreduce exchange (worker/gradient_exchange.h, CreateAllreduceExchange):
// gradients averaged over the workers' collective in buckets, the optimizer
// applied on every worker.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/nonfinite.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "server/shard_checkpoint.h"
#include "worker/gradient_exchange.h"
#include "worker/residual_files.h"
#include "worker/topk_allgather.h"

namespace pstrain {
namespace {

class AllreduceExchange : public GradientExchange {
 public:
  AllreduceExchange(Collective* collective, const OptimizerOptions& adam,
                    int64_t bucket_bytes, int num_buffers,
                    double clip_grad_norm, DType wire_dtype,
                    std::optional<ElasticWorld> elastic,
                    ExchangeCompression compression)
      : collective_(collective),
        adam_(adam),
        base_lr_(adam.lr),
        elastic_(std::move(elastic)),
        clip_grad_norm_(clip_grad_norm),
        wire_dtype_(wire_dtype),
        bucket_elements_(std::max<int64_t>(1, bucket_bytes / 4)),
        num_buffers_(num_buffers),
        compression_(std::move(compression)) {
    if (compression_.compressor != nullptr) {
      topk_.emplace(compression_.compressor.get(),
                    compression_.partition_bytes / 4, wire_dtype_);
    }
  }

  ~AllreduceExchange() override {
    {
      absl::MutexLock lock(&mu_);
      abort_ = true;
    }
    if (communicator_.joinable()) communicator_.join();
    absl::MutexLock lock(&checkpoint_mu_);
    if (checkpoint_writer_.joinable()) checkpoint_writer_.join();
  }

  absl::Status Start(const std::vector<absl::Span<float>>& weights,
                     const ModelState* resume) override {
    if (!elastic_.has_value()) {
      for (const absl::Span<float>& w : weights) {
        RETURN_IF_ERROR(collective_->Broadcast(w.data(), w.size(), 0));
      }
    }
    weights_ = weights;
    const int num_tensors = static_cast<int>(weights.size());
    const int num_params = num_tensors - num_buffers_;
    m_.resize(num_params);
    v_.resize(num_params);
    for (int t = 0; t < num_params; ++t) {
      m_[t].assign(weights[t].size(), 0.0f);
      v_[t].assign(weights[t].size(), 0.0f);
    }
    if (resume != nullptr) {
      // Every worker resumes alike: the optimizer state and its update
      // count (the checkpoint's version: its step in sync and allreduce
      // checkpoints) from the checkpoint; its weights the caller loaded.
      if (resume->m.size() < static_cast<size_t>(num_params) ||
          resume->v.size() < static_cast<size_t>(num_params)) {
        return absl::InvalidArgumentError(
            absl::StrCat("resume: the checkpoint holds optimizer state for ",
                         std::min(resume->m.size(), resume->v.size()),
                         " parameters; the model has ", num_params));
      }
      int64_t version = INT64_MAX;
      for (int t = 0; t < num_params; ++t) {
        if (resume->m[t].size() != weights[t].size() ||
            resume->v[t].size() != weights[t].size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "resume: the checkpoint's optimizer state of parameter ", t,
              " has ", resume->m[t].size(), " elements; the model's has ",
              weights[t].size()));
        }
        m_[t] = resume->m[t];
        v_[t] = resume->v[t];
        version = std::min(
            version,
            resume->VersionOf(t, 0, static_cast<int64_t>(weights[t].size())));
      }
      step_ = num_params > 0 ? version : 0;
    }
    // Buckets of whole tensors, last tensor first (the first gradients
    // backward produces), each at most bucket_elements_ unless one tensor
    // is larger on its own.
    buckets_.clear();
    int64_t filled = 0;
    for (int t = num_tensors - 1; t >= 0; --t) {
      const int64_t n = static_cast<int64_t>(weights[t].size());
      if (buckets_.empty() || filled + n > bucket_elements_) {
        buckets_.emplace_back();
        filled = 0;
      }
      buckets_.back().push_back(t);
      filled += n;
    }
    flat_.assign(buckets_.size(), {});
    prev_w_.assign(num_tensors, {});
    prev_m_.assign(num_params, {});
    prev_v_.assign(num_params, {});
    {
      absl::MutexLock lock(&mu_);
      ready_.assign(num_tensors, false);
      fences_.assign(num_tensors, nullptr);
    }
    if (!elastic_.has_value()) return absl::OkStatus();
    // An elastic job's world: the start's membership (a joining worker's
    // is the one that adds it; a standby's, the one that adds it once a
    // Scale did), whose rank 0 gives every rank its state.
    if (elastic_->await_start) {
      ASSIGN_OR_RETURN(const WorkerMembership start, elastic_->await_start());
      return JoinWorld(start, /*sync_state=*/true, /*from_epoch=*/-1);
    }
    return JoinWorld(elastic_->start, /*sync_state=*/true, /*from_epoch=*/-1);
  }

  absl::StatusOr<std::optional<WorkerMembership>> AgreeMembership(
      const std::optional<WorkerMembership>& proposal) override {
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
      return absl::InternalError(absl::StrCat(
          "rank 0 proposed a membership of ", head[1], " workers"));
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

  absl::StatusOr<int64_t> ChangeWorld(const WorkerMembership& next,
                                      bool after_failure,
                                      absl::Duration timeout) override {
    if (!elastic_.has_value()) {
      return GradientExchange::ChangeWorld(next, after_failure, timeout);
    }
    if (after_failure) UndoStepInFlight();
    const int64_t in_flight = step_;
    bool joiners = false;
    for (int w : next.workers) {
      if (membership_.RankOf(w) < 0) joiners = true;
    }
    RETURN_IF_ERROR(
        JoinWorld(next, after_failure || joiners, membership_.epoch));
    if (after_failure && topk_.has_value() &&
        membership_.RankOf(worker_id()) >= 0) {
      AlignResiduals(in_flight);
    }
    return step_;
  }

  void LeaveWorld() override {
    if (!elastic_.has_value()) return;
    collective_ = nullptr;
    owned_.reset();
  }

  std::optional<WorkerMembership> membership() const override {
    if (!elastic_.has_value()) return std::nullopt;
    return membership_;
  }

  void set_restore_membership(MembershipAt membership_at) override {
    anchor_ = std::move(membership_at);
  }
  void set_loss_scaler(LossScaler* scaler) override { loss_scaler_ = scaler; }

  void GradientsReady(const std::vector<absl::Span<const float>>& gradients,
                      int64_t samples, absl::Span<const int> tensors,
                      std::shared_ptr<CopyFence> fence) override {
    absl::MutexLock lock(&mu_);
    for (int t : tensors) {
      if (t < 0 || t >= static_cast<int>(ready_.size())) continue;
      ready_[t] = true;
      fences_[t] = fence;
    }
    StartCommunicator(&gradients);
  }

  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples) override {
    {
      absl::MutexLock lock(&mu_);
      // Whatever backward did not announce is final now.
      ready_.assign(ready_.size(), true);
      StartCommunicator(&gradients);
    }
    communicator_.join();
    absl::Status communicated;
    {
      absl::MutexLock lock(&mu_);
      communicated = std::move(communicator_status_);
      communicator_status_ = absl::OkStatus();
      ready_.assign(ready_.size(), false);
      fences_.assign(fences_.size(), nullptr);
    }
    RETURN_IF_ERROR(communicated);
    if (topk_.has_value()) {
      // Rank 0 wrote its own in Checkpoint().
      if (checkpoint_heard_ == step_ && collective_->rank() != 0) {
        SaveResiduals(step_);
      }
      // A skipped step's residual is not kept (it pushed nothing).
      if (!skip_.has_value()) compression_.compressor->CommitStep(step_);
    }
    last_traffic_ = std::exchange(traffic_, TopKAllgather::Traffic{});
    // A non-finite average (every worker sees the same sums): the tensors
    // updated before it go back to their state before the step.
    last_skip_.reset();
    if (skip_.has_value()) {
      for (int t : updated_) {
        std::copy(prev_w_[t].begin(), prev_w_[t].end(), weights_[t].data());
        if (t < static_cast<int>(m_.size())) {
          m_[t].swap(prev_m_[t]);
          v_[t].swap(prev_v_[t]);
        }
      }
      skip_->step = step_;
      last_skip_ = std::move(skip_);
      skip_.reset();
    }
    updated_.clear();
    own_nonfinite_.reset();
    last_allreduce_ = allreduce_;
    allreduce_ = absl::ZeroDuration();
    ++step_;
    samples_ += samples * collective_->size();
    return absl::OkStatus();
  }

  std::optional<SkippedStepInfo> SkippedStep() const override {
    return last_skip_;
  }

  ExchangeStepTimes LastStepTimes() const override {
    ExchangeStepTimes times;
    times.allreduce = last_allreduce_;
    times.bytes_pushed = last_traffic_.sent;
    times.bytes_pulled = last_traffic_.received;
    return times;
  }

  // Worker 0: the whole state (every worker holds the same) as one shard
  // file, step_dir/shard-0.safetensors (server/shard_checkpoint.h: one
  // chunk per tensor at the step's version). Not wait: copies it (between
  // steps, on the training thread) into buffers kept between checkpoints and
  // writes them on a thread of its own; wait: joins that thread and returns the
  // file's size and crc32.
  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t /*end_step*/, const std::string& step_dir,
      bool wait) override {
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

  absl::StatusOr<bool> RestoreResiduals(const std::string& step_dir,
                                        int64_t step) override {
    TopKCompressor* topk = compression_.compressor.get();
    if (topk == nullptr) return false;
    std::vector<int64_t> sizes;
    for (int t = 0; t < topk->num_state_tensors(); ++t) {
      sizes.push_back(topk->state_size(t));
    }
    absl::StatusOr<std::vector<std::vector<float>>> residuals =
        topk->options().error_feedback
            ? ReadResidualFile(step_dir, worker_id(), step, compression_.names,
                               sizes)
            : absl::NotFoundError("no error feedback");
    if (absl::IsNotFound(residuals.status())) {
      RETURN_IF_ERROR(topk->Reset(step, {}));
      return false;
    }
    RETURN_IF_ERROR(residuals.status());
    RETURN_IF_ERROR(topk->Reset(step, *residuals));
    return true;
  }

  // Every worker steps in lockstep with the same batch size.
  absl::StatusOr<int64_t> SamplesSoFar() override { return samples_; }
  absl::Status BeforePause() override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  // Starts this step's communication thread unless it runs.
  void StartCommunicator(const std::vector<absl::Span<const float>>* gradients)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    gradients_ = gradients;
    if (!communicator_.joinable()) {
      communicator_ = std::thread([this] { Communicate(); });
    }
  }

  // Bucket `b`'s next weights from its summed gradients in flat_[b], as a
  // sync shard computes them: the sum times 1/W (not for one worker), then
  // the optimizer's update number step_ + 1 for parameters, the average
  // assigned for BatchNorm buffers. Runs on the communication thread; Step()
  // increments step_ only after joining it.
  //
  // Non-finite values (issue 22): every worker sees the same sums, so all
  // decide alike without a message. A bucket whose sum holds a NaN or an
  // infinity is not applied, nor is any later bucket of the step, and
  // Step() puts the tensors updated before it back (their previous weights
  // copied, the optimizer state written beside the old one and swapped).
  //
  // `clip` (ClipCoefficient(); 1: none) multiplies the parameters' average
  // gradients, as torch.nn.utils.clip_grad_norm_ does before step().
  void Update(size_t b, float clip = 1.0f) {
    const int size = collective_->size();
    const int64_t step = step_ + 1;
    const int num_params = static_cast<int>(weights_.size()) - num_buffers_;
    std::vector<float>& flat = flat_[b];
    if (skip_.has_value()) return;  // an earlier bucket decided the step
    if (const int64_t bad = FindNonFinite(flat); bad >= 0) {
      SkippedStepInfo skip;
      int64_t offset = bad;
      for (int t : buckets_[b]) {
        const int64_t n = static_cast<int64_t>(weights_[t].size());
        if (offset < n) {
          skip.nonfinite.param_id = t;
          skip.nonfinite.element = offset;
          break;
        }
        offset -= n;
      }
      skip.nonfinite.value = NonFiniteText(flat[bad]);
      // This worker's own value, if it held one (else another worker's).
      if (own_nonfinite_.has_value()) {
        skip.worker_id = collective_->rank();
        skip.nonfinite = *own_nonfinite_;
      }
      skip_ = std::move(skip);
      return;
    }
    if (size > 1 && !averaged_ && !ReturnsAverages()) {
      const float scale = 1.0f / static_cast<float>(size);
      for (float& x : flat) x *= scale;
    }
    float* average = flat.data();
    for (int t : buckets_[b]) {
      const int64_t n = static_cast<int64_t>(weights_[t].size());
      if (clip != 1.0f && t < num_params) {
        for (int64_t i = 0; i < n; ++i) average[i] *= clip;
      }
      prev_w_[t].assign(weights_[t].begin(), weights_[t].end());
      if (t >= num_params) {
        std::copy(average, average + n, weights_[t].data());
      } else {
        prev_m_[t].resize(n);
        prev_v_[t].resize(n);
        OptimizerUpdateInto(adam_, step, prev_w_[t].data(), average,
                            m_[t].data(), v_[t].data(), weights_[t].data(),
                            prev_m_[t].data(), prev_v_[t].data(), n);
        m_[t].swap(prev_m_[t]);
        v_[t].swap(prev_v_[t]);
      }
      updated_.push_back(t);
      average += n;
    }
  }

  bool AllReady(const std::vector<int>& tensors) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int t : tensors) {
      if (!ready_[t]) return false;
    }
    return true;
  }

  // The communication thread: every bucket in order (the same on every
  // worker, as collectives require), each as soon as it is ready.
  void Communicate() {
    if (trace::Enabled()) trace::SetThreadName("allreduce");
    if (absl::Status s = BeginTopKStep(); !s.ok()) {
      absl::MutexLock lock(&mu_);
      communicator_status_ = std::move(s);
      return;
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const std::vector<int>& bucket = buckets_[b];
      std::vector<std::shared_ptr<CopyFence>> fences;
      const std::vector<absl::Span<const float>>* gradients = nullptr;
      {
        absl::MutexLock lock(&mu_);
        auto bucket_ready = [this, &bucket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                mu_) { return abort_ || AllReady(bucket); };
        mu_.Await(absl::Condition(&bucket_ready));
        if (abort_) return;
        for (int t : bucket) {
          if (fences_[t] != nullptr && std::find(fences.begin(), fences.end(),
                                                 fences_[t]) == fences.end()) {
            fences.push_back(fences_[t]);
          }
        }
        gradients = gradients_;
      }
      absl::Status s;
      for (const std::shared_ptr<CopyFence>& fence : fences) {
        s.Update(fence->Wait());
      }
      std::vector<float>& flat = flat_[b];
      if (s.ok()) {
        flat.clear();
        for (int t : bucket) {
          flat.insert(flat.end(), (*gradients)[t].begin(),
                      (*gradients)[t].end());
        }
        if (!own_nonfinite_.has_value()) {
          // Where this worker's own gradients hold one, to name it.
          int64_t offset = 0;
          for (int t : bucket) {
            const int64_t bad = FindNonFinite((*gradients)[t]);
            if (bad >= 0) {
              NonFiniteValue own;
              own.param_id = t;
              own.element = bad;
              own.value = NonFiniteText(flat[offset + bad]);
              own_nonfinite_ = std::move(own);
              break;
            }
            offset += static_cast<int64_t>((*gradients)[t].size());
          }
        }
        trace::Scope traced(
            "allreduce", "allreduce",
            {{"step", step_},
             {"bucket", static_cast<int64_t>(b)},
             {"bytes", static_cast<int64_t>(flat.size() * (wire16() ? 2 : 4))},
             {"topk", topk_.has_value() ? 1 : 0}});
        const absl::Time start = absl::Now();
        s = topk_.has_value() ? AllgatherTopK(b)
            : wire16()        ? Allreduce16(b)
                       : collective_->AllreduceSum(flat.data(), flat.size());
        allreduce_ += absl::Now() - start;
        if (s.ok() && !topk_.has_value()) {
          const int64_t ring =
              RingBytes(static_cast<int64_t>(flat.size()) * (wire16() ? 2 : 4));
          traffic_.sent += ring;
          traffic_.received += ring;
        }
      }
      if (!s.ok()) {
        absl::MutexLock lock(&mu_);
        communicator_status_ = std::move(s);
        return;
      }
      if (clip_grad_norm_ > 0) continue;  // the norm needs every bucket
      trace::Scope traced(
          "update", "allreduce",
          {{"step", step_}, {"bucket", static_cast<int64_t>(b)}});
      Update(b);
    }
    if (clip_grad_norm_ > 0) {
      const float clip = ClipCoefficient();
      averaged_ = true;
      for (size_t b = 0; b < buckets_.size(); ++b) {
        trace::Scope traced(
            "update", "allreduce",
            {{"step", step_}, {"bucket", static_cast<int64_t>(b)}});
        Update(b, clip);
      }
      averaged_ = false;
    }
  }

  // Gradient clipping by global norm (clip_grad_norm_ > 0), as
  // torch.nn.utils.clip_grad_norm_ (PyTorch 1.13): averages every bucket
  // (flat_[b] times 1/W, as Update() would) and returns
  // min(1, max_norm / (norm + 1e-6)), norm the L2 norm of all parameters'
  // average gradients (buffers left out), summed in double, the quotient in
  // fp32 as PyTorch's. 1 if the norm is not finite: Update() then skips the
  // step for the value it finds.
  float ClipCoefficient() {
    const int size = collective_->size();
    const int num_params = static_cast<int>(weights_.size()) - num_buffers_;
    double sum = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      std::vector<float>& flat = flat_[b];
      if (size > 1 && !ReturnsAverages()) {
        const float scale = 1.0f / static_cast<float>(size);
        for (float& x : flat) x *= scale;
      }
      const float* g = flat.data();
      for (int t : buckets_[b]) {
        const int64_t n = static_cast<int64_t>(weights_[t].size());
        if (t < num_params) {
          for (int64_t i = 0; i < n; ++i) {
            sum += static_cast<double>(g[i]) * g[i];
          }
        }
        g += n;
      }
    }
    const float norm = static_cast<float>(std::sqrt(sum));
    if (!std::isfinite(norm)) return 1.0f;
    const float clip = static_cast<float>(clip_grad_norm_) / (norm + 1e-6f);
    return std::min(clip, 1.0f);
  }

  // A 16-bit wire (wire_dtype_ bf16 or fp16): bucket `b`'s parameter
  // gradients are averaged over the ranks as PyTorch DDP's
  // bf16_compress_hook/fp16_compress_hook do: each rank divides its own
  // by the world size in fp32, rounds to the 16-bit type and the ranks sum
  // those (Collective::AllreduceSum16); the average comes back widened to
  // fp32. float16 first scales the bucket by 2^e, and by 2^-e after: e
  // from M, the largest divided magnitude over every rank (an
  // AllreduceMax of one value), such that W x M lands in [16384, 32768)
  // (common/wire_dtype.h's ScaleExponent of W x M): a partial sum of the
  // ring is at most W x M, so none leaves fp16's range (65504). Buffers
  // (BatchNorm's running statistics) travel in fp32 and are averaged here too:
  // flat_[b] holds averages on return.
  absl::Status Allreduce16(size_t b) {
    const int size = collective_->size();
    const int num_params = static_cast<int>(weights_.size()) - num_buffers_;
    std::vector<float>& flat = flat_[b];
    // A bucket holds consecutive tensors, last first, and the buffers are
    // the model's last tensors: its buffers' elements come first.
    int64_t buffers = 0;
    for (int t : buckets_[b]) {
      if (t >= num_params) buffers += static_cast<int64_t>(weights_[t].size());
    }
    const int64_t params = static_cast<int64_t>(flat.size()) - buffers;
    const float inverse = 1.0f / static_cast<float>(size);
    absl::Span<float> grads(flat.data() + buffers, params);
    for (float& x : grads) x *= inverse;
    int exponent = 0;
    if (wire_dtype_ == DTYPE_FLOAT16 && params > 0) {
      float largest = 0;
      for (float x : grads) largest = std::max(largest, std::fabs(x));
      RETURN_IF_ERROR(collective_->AllreduceMax(&largest, 1));
      // A bound on every partial sum; non-finite: any scale (the step is
      // skipped for the value; a NaN is encoded as one).
      const float bound = largest * static_cast<float>(size);
      exponent = std::isfinite(bound)
                     ? ScaleExponent(absl::MakeConstSpan(&bound, 1))
                     : 0;
    }
    std::vector<uint16_t>& halves = halves_;
    halves.resize(params);
    EncodeHalves(grads, wire_dtype_, exponent, halves.data());
    RETURN_IF_ERROR(
        collective_->AllreduceSum16(halves.data(), halves.size(), wire_dtype_));
    DecodeHalves(halves.data(), wire_dtype_, exponent, grads);
    if (buffers > 0) {
      RETURN_IF_ERROR(collective_->AllreduceSum(flat.data(), buffers));
      for (int64_t i = 0; i < buffers; ++i) flat[i] *= inverse;
    }
    return absl::OkStatus();
  }
  bool wire16() const { return wire_dtype_ != DTYPE_FLOAT32; }
  // Whether a bucket comes back averaged (a 16-bit allreduce divides
  // before it rounds) rather than summed.
  bool ReturnsAverages() const { return wire16() && !topk_.has_value(); }

  // Top-k (compression_): bucket `b`'s buffers (its first elements: the
  // buffers are the model's last tensors) summed densely in fp32, its
  // parameters' gradients as every rank's top-k selection
  // (TopKAllgather). flat_[b] holds sums on return.
  absl::Status AllgatherTopK(size_t b) {
    const int num_params = static_cast<int>(weights_.size()) - num_buffers_;
    std::vector<float>& flat = flat_[b];
    int64_t buffers = 0;
    std::vector<int> params;
    for (int t : buckets_[b]) {
      if (t >= num_params) {
        buffers += static_cast<int64_t>(weights_[t].size());
      } else {
        params.push_back(t);
      }
    }
    if (buffers > 0) {
      RETURN_IF_ERROR(collective_->AllreduceSum(flat.data(), buffers));
      traffic_.sent += RingBytes(4 * buffers);
      traffic_.received += RingBytes(4 * buffers);
    }
    RETURN_IF_ERROR(topk_->SumBucket(
        *collective_, params,
        absl::MakeSpan(flat).subspan(static_cast<size_t>(buffers))));
    const TopKAllgather::Traffic pairs = topk_->TakeTraffic();
    traffic_.sent += pairs.sent;
    traffic_.received += pairs.received;
    return absl::OkStatus();
  }

  // What a ring allreduce of `bytes` sends (and receives) on each rank:
  // 2 (W - 1) / W of them (Patarasuk & Yuan 2009).
  int64_t RingBytes(int64_t bytes) const {
    const int64_t size = collective_->size();
    return size > 1 ? 2 * (size - 1) * bytes / size : 0;
  }

  // The start of a step's communication with top-k: the compressor's step
  // begins, and (with residual files) rank 0 tells every rank whether a
  // checkpoint of this step was begun (announced_), so that each writes its
  // residual file of it in Step().
  absl::Status BeginTopKStep() {
    if (!topk_.has_value()) return absl::OkStatus();
    compression_.compressor->BeginStep(step_);
    checkpoint_heard_ = -1;
    if (!saves_residuals()) return absl::OkStatus();
    int64_t announced = collective_->rank() == 0 ? announced_.load() : -1;
    if (collective_->size() > 1) {
      RETURN_IF_ERROR(BroadcastInt64(*collective_, &announced, 1, 0));
    }
    checkpoint_heard_ = announced;
    return absl::OkStatus();
  }

  bool saves_residuals() const {
    return compression_.compressor != nullptr &&
           compression_.compressor->options().error_feedback &&
           compression_.step_dir != nullptr;
  }
  int worker_id() const {
    return elastic_.has_value() ? elastic_->worker_id : compression_.worker_id;
  }

  // This worker's residual file of checkpoint `step` (the residual at its
  // start: the newest commit at or before it). A failure is reported and
  // training goes on: worker 0's wait for the file fails and that
  // checkpoint is not taken (as a PS worker's, gradient_exchange.cc).
  void SaveResiduals(int64_t step) {
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

  // Elastic jobs: leaves the world this worker is in and joins `next`'s as
  // its rank there (none: it only leaves); rank 0 announces it first
  // (ElasticWorld::announce, from world `from_epoch`, -1 at the start);
  // with `sync_state`, rank 0's state goes to every rank (SyncState).
  // membership_ becomes `next`.
  absl::Status JoinWorld(const WorkerMembership& next, bool sync_state,
                         int64_t from_epoch) {
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
      adam_.lr = static_cast<float>(static_cast<double>(base_lr_) *
                                    next.size() / elastic_->initial_workers);
    }
    return sync_state ? SyncState() : absl::OkStatus();
  }

  // Rank 0's state to every rank: its step (update count), samples so far,
  // the data position of its step (anchor_) and its loss scaler's state
  // (fp16), then every tensor's weights and every parameter's optimizer
  // state. membership_ takes the step and the position.
  absl::Status SyncState() {
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

  // Top-k after a member's death, once rank 0's state is this worker's
  // (SyncState): its residual goes to the step rank 0's is at the start
  // of (rank0_newest_), so that the residual matches the weights. A step at
  // the failure's edge may have ended on some ranks and not on others:
  // where rank 0 committed this worker's step in flight `in_flight` (which
  // it could only finish with every rank's pairs, so this worker's
  // compression of it is complete in the compressor's step buffer), it is
  // committed here too; where this worker committed a step rank 0 did not
  // finish, it is rewound.
  void AlignResiduals(int64_t in_flight) {
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

  // A step that failed part way (a member died): the tensors it updated go
  // back to their state before it, as a skipped step's do (Step()).
  void UndoStepInFlight() {
    for (int t : updated_) {
      std::copy(prev_w_[t].begin(), prev_w_[t].end(), weights_[t].data());
      if (t < static_cast<int>(m_.size())) {
        m_[t].swap(prev_m_[t]);
        v_[t].swap(prev_v_[t]);
      }
    }
    updated_.clear();
    skip_.reset();
    own_nonfinite_.reset();
    averaged_ = false;
    allreduce_ = absl::ZeroDuration();
  }

  // The collective: the caller's, or (elastic) owned_, that of the world
  // of membership_ (null once this worker left it).
  Collective* collective_;
  std::unique_ptr<Collective> owned_;
  // The optimizer; its lr follows the members with the linear scaling
  // rule (from base_lr_).
  OptimizerOptions adam_;
  const float base_lr_;
  const std::optional<ElasticWorld> elastic_;
  WorkerMembership membership_;
  // The data position of a step (ElasticMembership's), for SyncState.
  MembershipAt anchor_;
  // fp16 precision: the worker's loss scaler (set_loss_scaler); null: none.
  LossScaler* loss_scaler_ = nullptr;
  // Gradient clipping by global norm; 0: none.
  const double clip_grad_norm_;
  // DTYPE_FLOAT32, or a 16-bit wire (Allreduce16).
  const DType wire_dtype_;
  // Allreduce16's 16-bit copy of the bucket in hand, reused bucket after
  // bucket (the communication thread's).
  std::vector<uint16_t> halves_;
  // The communication thread's: flat_ already holds averages (clipping).
  bool averaged_ = false;
  const int64_t bucket_elements_;
  const int num_buffers_;
  // Set by Start(); read by both threads.
  std::vector<absl::Span<float>> weights_;
  std::vector<std::vector<int>> buckets_;
  // Each bucket's gradients, then their sum, then their average; the
  // communication thread's alone.
  std::vector<std::vector<float>> flat_;
  // Adam state, and the number of updates so far: written by the
  // communication thread, step_ by Step() after joining it.
  std::vector<std::vector<float>> m_;
  std::vector<std::vector<float>> v_;
  // This step's state before each tensor's update (kept for a skip), the
  // tensors updated, this worker's own first non-finite value, and the
  // step's skip: the communication thread's during a step, Step()'s after
  // joining it.
  std::vector<std::vector<float>> prev_w_, prev_m_, prev_v_;
  std::vector<int> updated_;
  std::optional<NonFiniteValue> own_nonfinite_;
  std::optional<SkippedStepInfo> skip_;
  std::optional<SkippedStepInfo> last_skip_;
  int64_t step_ = 0;
  int64_t samples_ = 0;
  // Time in AllreduceSum this step (the communication thread's), and the
  // last step's (Step()'s, after joining it).
  absl::Duration allreduce_;
  absl::Duration last_allreduce_;

  absl::Mutex mu_;
  std::thread communicator_;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<CopyFence>> fences_ ABSL_GUARDED_BY(mu_);
  const std::vector<absl::Span<const float>>* gradients_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  absl::Status communicator_status_ ABSL_GUARDED_BY(mu_);
  bool abort_ ABSL_GUARDED_BY(mu_) = false;

  // The checkpoint in flight (Checkpoint(), under checkpoint_mu_): the
  // state's copy (kept between checkpoints: no fresh memory to touch), its
  // step, its writer thread and what that wrote. The writer reads snapshot_
  // and sets checkpoint_written_ while it runs; both are touched otherwise
  // only after it is joined.
  absl::Mutex checkpoint_mu_;
  std::vector<ChunkSnapshot> snapshot_;
  int64_t checkpoint_step_ ABSL_GUARDED_BY(checkpoint_mu_) = -1;
  std::thread checkpoint_writer_ ABSL_GUARDED_BY(checkpoint_mu_);
  absl::StatusOr<safetensors::WriteResult> checkpoint_written_;

  // Top-k with error feedback (compression_.compressor non-null): the
  // sparse allgather of each bucket (the communication thread's), the
  // checkpoint step rank 0 announces (worker 0's Checkpoint() sets it
  // between steps; the communication thread reads it), the one this
  // worker heard at the start of the step (the communication thread's,
  // then Step()'s), and rank 0's newest commit from the last SyncState.
  ExchangeCompression compression_;
  std::optional<TopKAllgather> topk_;
  std::atomic<int64_t> announced_{-1};
  int64_t checkpoint_heard_ = -1;
  int64_t rank0_newest_ = -1;
  // The bytes this rank sent and received this step (the ring's or the
  // allgather's by their algorithms; the communication thread's, then
  // Step()'s) and in the last step.
  TopKAllgather::Traffic traffic_;
  TopKAllgather::Traffic last_traffic_;
};

}  // namespace

std::unique_ptr<GradientExchange> CreateAllreduceExchange(
    Collective* collective, const OptimizerOptions& adam, int64_t bucket_bytes,
    int num_buffers, double clip_grad_norm, DType wire_dtype,
    std::optional<ElasticWorld> elastic, ExchangeCompression compression) {
  return std::make_unique<AllreduceExchange>(
      collective, adam, bucket_bytes, num_buffers, clip_grad_norm, wire_dtype,
      std::move(elastic), std::move(compression));
}

}  // namespace pstrain
