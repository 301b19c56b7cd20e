#include "models/staged_backend.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/backend.h"

namespace pstrain {
namespace {

class Staged final : public StagedCpuBackend {
 public:
  explicit Staged(std::unique_ptr<Backend> cpu) : cpu_(std::move(cpu)) {}

  std::string name() const override { return "staged cpu"; }
  bool host_memory() const override { return false; }

  absl::StatusOr<float*> Allocate(int64_t elements) override {
    return cpu_->Allocate(elements);
  }
  void Free(float* data) override { cpu_->Free(data); }
  absl::StatusOr<float*> AllocateHost(int64_t elements) override {
    return cpu_->Allocate(elements);
  }
  void FreeHost(float* data) override { cpu_->Free(data); }

  absl::Status CopyToDevice(const float* host, int64_t elements,
                            float* device) override {
    ++copies_to_device_;
    elements_to_device_ += elements;
    return Copy(host, elements, device);
  }
  absl::Status CopyToHost(const float* device, int64_t elements,
                          float* host) override {
    return Copy(device, elements, host);
  }
  absl::Status CopyOnDevice(const float* src, int64_t elements,
                            float* dst) override {
    return Copy(src, elements, dst);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<Layer>> CreateLayer(
      const LayerSpec& spec, std::vector<Param*> params,
      std::vector<Buffer*> buffers, uint64_t seed) override {
    return cpu_->CreateLayer(spec, std::move(params), std::move(buffers), seed);
  }
  absl::Status SetPrecision(PrecisionKind precision) override {
    return cpu_->SetPrecision(precision);
  }
  PrecisionKind precision() const override { return cpu_->precision(); }
  absl::Status AdamUpdate(const AdamOptions& options, int64_t step, float* w,
                          const float* g, float* m, float* v,
                          int64_t n) override {
    return cpu_->AdamUpdate(options, step, w, g, m, v, n);
  }
  absl::Status Accumulate(const float* x, int64_t elements, float* y) override {
    return cpu_->Accumulate(x, elements, y);
  }
  absl::Status Scale(float a, float* x, int64_t elements) override {
    return cpu_->Scale(a, x, elements);
  }
  absl::StatusOr<bool> AllFinite(
      absl::Span<const DeviceTensor* const> tensors) override {
    return cpu_->AllFinite(tensors);
  }
  absl::StatusOr<float> SoftmaxCrossEntropy(const DeviceTensor& logits,
                                            absl::Span<const int32_t> labels,
                                            DeviceTensor* dlogits) override {
    return cpu_->SoftmaxCrossEntropy(logits, labels, dlogits);
  }
  absl::StatusOr<float> SoftmaxCrossEntropyIgnoring(
      const DeviceTensor& logits, absl::Span<const int32_t> labels,
      int32_t ignore_index, DeviceTensor* dlogits) override {
    return cpu_->SoftmaxCrossEntropyIgnoring(logits, labels, ignore_index,
                                             dlogits);
  }

  int64_t copies_to_device() const override { return copies_to_device_; }
  int64_t elements_to_device() const override { return elements_to_device_; }

 private:
  static absl::Status Copy(const float* from, int64_t elements, float* to) {
    if (from != to && elements > 0) {
      std::memcpy(to, from, sizeof(float) * elements);
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Backend> cpu_;
  int64_t copies_to_device_ = 0;
  int64_t elements_to_device_ = 0;
};

}  // namespace

std::unique_ptr<StagedCpuBackend> NewStagedCpuBackend() {
  return std::make_unique<Staged>(NewCpuBackend());
}

}  // namespace pstrain
