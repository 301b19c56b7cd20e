#include "worker/gradient_exchange.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace pstrain {
namespace {

class PsExchange : public GradientExchange {
 public:
  PsExchange(std::unique_ptr<PsClient> client, bool sync, bool chief,
             absl::Duration init_timeout)
      : client_(std::move(client)),
        sync_(sync),
        chief_(chief),
        init_timeout_(init_timeout) {}

  absl::Status Start(const std::vector<absl::Span<float>>& weights) override {
    if (chief_) {
      std::vector<absl::Span<const float>> initial(weights.begin(),
                                                   weights.end());
      RETURN_IF_ERROR(client_->Initialize(initial));
    }
    RETURN_IF_ERROR(client_->WaitReady(init_timeout_));
    ASSIGN_OR_RETURN(version_, client_->PushPull(0, {}, 0, 0, weights));
    return absl::OkStatus();
  }

  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples,
                    const std::vector<absl::Span<float>>& weights) override {
    ASSIGN_OR_RETURN(version_, client_->PushPull(version_, gradients,
                                                 sync_ ? version_ + 1 : 0,
                                                 samples, weights));
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> SamplesSoFar() override {
    // Samples of every worker, counted by shard 0.
    ASSIGN_OR_RETURN(StatsResponse stats, client_->Stats(0));
    return stats.samples();
  }

  absl::Status BeforePause() override { return client_->CloseStreams(); }
  absl::Status Finish() override { return client_->Done(); }

 private:
  std::unique_ptr<PsClient> client_;
  const bool sync_;
  const bool chief_;
  const absl::Duration init_timeout_;
  int64_t version_ = 0;
};

class AllreduceExchange : public GradientExchange {
 public:
  AllreduceExchange(Collective* collective, const AdamOptions& adam,
                    int64_t bucket_bytes, int num_buffers)
      : collective_(collective),
        adam_(adam),
        bucket_elements_(std::max<int64_t>(1, bucket_bytes / 4)),
        num_buffers_(num_buffers) {}

  absl::Status Start(const std::vector<absl::Span<float>>& weights) override {
    for (const absl::Span<float>& w : weights) {
      RETURN_IF_ERROR(collective_->Broadcast(w.data(), w.size(), 0));
    }
    const int num_params = static_cast<int>(weights.size()) - num_buffers_;
    m_.resize(num_params);
    v_.resize(num_params);
    for (int t = 0; t < num_params; ++t) {
      m_[t].assign(weights[t].size(), 0.0f);
      v_[t].assign(weights[t].size(), 0.0f);
    }
    // Buckets of whole tensors, last tensor first (the first gradients
    // backward produces), each at most bucket_elements_ unless one tensor
    // is larger on its own.
    buckets_.clear();
    int64_t filled = 0;
    for (int t = static_cast<int>(weights.size()) - 1; t >= 0; --t) {
      const int64_t n = static_cast<int64_t>(weights[t].size());
      if (buckets_.empty() || filled + n > bucket_elements_) {
        buckets_.emplace_back();
        filled = 0;
      }
      buckets_.back().push_back(t);
      filled += n;
    }
    return absl::OkStatus();
  }

  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples,
                    const std::vector<absl::Span<float>>& weights) override {
    ++step_;
    const int size = collective_->size();
    const float scale = 1.0f / static_cast<float>(size);
    const int num_params = static_cast<int>(weights.size()) - num_buffers_;
    for (const std::vector<int>& bucket : buckets_) {
      flat_.clear();
      for (int t : bucket) {
        flat_.insert(flat_.end(), gradients[t].begin(), gradients[t].end());
      }
      RETURN_IF_ERROR(collective_->AllreduceSum(flat_.data(), flat_.size()));
      // As a sync shard: the sum times 1/W (not for one worker).
      if (size > 1) {
        for (float& x : flat_) x *= scale;
      }
      const float* average = flat_.data();
      for (int t : bucket) {
        const int64_t n = static_cast<int64_t>(weights[t].size());
        if (t >= num_params) {
          std::copy(average, average + n, weights[t].data());
        } else {
          AdamUpdate(adam_, step_, weights[t].data(), average, m_[t].data(),
                     v_[t].data(), n);
        }
        average += n;
      }
    }
    samples_ += samples * size;
    return absl::OkStatus();
  }

  // Every worker steps in lockstep with the same batch size.
  absl::StatusOr<int64_t> SamplesSoFar() override { return samples_; }
  absl::Status BeforePause() override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  Collective* const collective_;
  const AdamOptions adam_;
  const int64_t bucket_elements_;
  const int num_buffers_;
  std::vector<std::vector<int>> buckets_;
  std::vector<float> flat_;
  std::vector<std::vector<float>> m_;
  std::vector<std::vector<float>> v_;
  int64_t step_ = 0;
  int64_t samples_ = 0;
};

}  // namespace

std::unique_ptr<GradientExchange> CreatePsExchange(
    std::unique_ptr<PsClient> client, bool sync, bool chief,
    absl::Duration init_timeout) {
  return std::make_unique<PsExchange>(std::move(client), sync, chief,
                                      init_timeout);
}

std::unique_ptr<GradientExchange> CreateAllreduceExchange(
    Collective* collective, const AdamOptions& adam, int64_t bucket_bytes,
    int num_buffers) {
  return std::make_unique<AllreduceExchange>(collective, adam, bucket_bytes,
                                             num_buffers);
}

}  // namespace pstrain
