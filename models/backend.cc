#include "models/backend.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pstrain {

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

class PassedFence : public CopyFence {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<int64_t> Backend::DeviceMemoryInUseBytes() {
  return absl::UnimplementedError(
      absl::StrCat(name(), " keeps its tensors in host memory"));
}

absl::StatusOr<std::shared_ptr<CopyFence>> Backend::RecordCopies() {
  static const std::shared_ptr<CopyFence>* const passed =
      new std::shared_ptr<CopyFence>(std::make_shared<PassedFence>());
  return *passed;
}

absl::StatusOr<float> Backend::SoftmaxCrossEntropyIgnoring(
    const DeviceTensor& logits, absl::Span<const int32_t> labels,
    int32_t ignore_index, DeviceTensor* dlogits) {
  if (!host_memory()) {
    return absl::UnimplementedError(absl::StrCat(
        name(), ": cross-entropy with an ignore index not implemented yet"));
  }
  if (logits.shape().empty() || logits.layout() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "softmax cross-entropy: logits ", ShapeToString(logits.shape()),
        " in layout ", logits.layout(), "; expected dense [..., K]"));
  }
  const int64_t k = logits.shape().back();
  return HostSoftmaxCrossEntropyIgnoring(
      logits.data(), k > 0 ? logits.size() / k : 0, k, labels, ignore_index,
      dlogits != nullptr ? dlogits->data() : nullptr);
}

DeviceTensor::DeviceTensor(DeviceTensor&& other) noexcept
    : backend_(other.backend_),
      shape_(std::move(other.shape_)),
      data_(other.data_),
      capacity_(other.capacity_),
      layout_(other.layout_),
      owned_(other.owned_) {
  other.data_ = nullptr;
  other.owned_ = true;
  other.capacity_ = 0;
  other.shape_.clear();
}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr && owned_) backend_->Free(data_);
    backend_ = other.backend_;
    shape_ = std::move(other.shape_);
    data_ = other.data_;
    capacity_ = other.capacity_;
    layout_ = other.layout_;
    owned_ = other.owned_;
    other.data_ = nullptr;
    other.owned_ = true;
    other.capacity_ = 0;
    other.shape_.clear();
  }
  return *this;
}

DeviceTensor::~DeviceTensor() {
  if (data_ != nullptr && owned_) backend_->Free(data_);
}

void DeviceTensor::SetView(float* data, int64_t capacity) {
  if (data_ != nullptr && owned_) backend_->Free(data_);
  data_ = data;
  capacity_ = capacity;
  owned_ = false;
  if (NumElements(shape_) > capacity) shape_.clear();
}

absl::Status DeviceTensor::Resize(const Shape& shape) {
  if (backend_ == nullptr) {
    return absl::FailedPreconditionError("tensor has no backend");
  }
  const int64_t n = NumElements(shape);
  if (n > capacity_ && !owned_) {
    return absl::InternalError(absl::StrCat("tensor view of ", capacity_,
                                            " elements cannot hold ",
                                            ShapeToString(shape)));
  }
  if (n > capacity_) {
    if (data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
    capacity_ = 0;
    absl::StatusOr<float*> data = backend_->Allocate(n);
    if (!data.ok()) return data.status();
    data_ = *data;
    capacity_ = n;
  }
  shape_ = shape;
  return absl::OkStatus();
}

absl::StatusOr<float> HostSoftmaxCrossEntropy(const float* logits, int64_t n,
                                              int64_t k,
                                              absl::Span<const int32_t> labels,
                                              float* dlogits) {
  if (static_cast<int64_t>(labels.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax cross-entropy: ", labels.size(), " labels for ",
                     n, " rows of logits"));
  }
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    if (label < 0 || label >= k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", label, " of sample ", i, " is outside [0, ", k, ")"));
    }
    const float* row = logits + i * k;
    const float max = *std::max_element(row, row + k);
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(row[j] - max);
    const double log_sum = std::log(sum);
    loss += log_sum - (row[label] - max);
    if (dlogits != nullptr) {
      float* d = dlogits + i * k;
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(row[j] - max - log_sum);
        d[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / n);
      }
    }
  }
  return static_cast<float>(loss / std::max<int64_t>(n, 1));
}

absl::StatusOr<int64_t> CountPredictedRows(absl::Span<const int32_t> labels,
                                           int64_t n, int64_t k,
                                           int32_t ignore_index) {
  if (static_cast<int64_t>(labels.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax cross-entropy: ", labels.size(), " labels for ",
                     n, " rows of logits"));
  }
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    if (label == ignore_index) continue;
    if (label < 0 || label >= k) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", label, " of row ", i, " is outside [0, ", k,
                       ") and not the ignore index ", ignore_index));
    }
    ++count;
  }
  return count;
}

absl::StatusOr<float> HostSoftmaxCrossEntropyIgnoring(
    const float* logits, int64_t n, int64_t k, absl::Span<const int32_t> labels,
    int32_t ignore_index, float* dlogits) {
  ASSIGN_OR_RETURN(const int64_t count,
                   CountPredictedRows(labels, n, k, ignore_index));
  const double scale = 1.0 / std::max<int64_t>(count, 1);
  // Rows on every OpenMP thread (a vocabulary's logits are large), each
  // row's exponentials computed once (kept in its gradient row); the loss
  // summed in row order, so the same on any thread count.
  std::vector<double> row_loss(n, 0.0);
#pragma omp parallel for schedule(static) if (n * k >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    const float* row = logits + i * k;
    float* d = dlogits != nullptr ? dlogits + i * k : nullptr;
    if (label == ignore_index) {
      if (d != nullptr) std::fill(d, d + k, 0.0f);
      continue;
    }
    const float max = *std::max_element(row, row + k);
    double sum = 0.0;
    if (d == nullptr) {
      for (int64_t j = 0; j < k; ++j) sum += std::exp(row[j] - max);
    } else {
      for (int64_t j = 0; j < k; ++j) {
        d[j] = std::exp(row[j] - max);
        sum += d[j];
      }
    }
    row_loss[i] = std::log(sum) - (row[label] - max);
    if (d == nullptr) continue;
    const double inv_sum = 1.0 / sum;
    for (int64_t j = 0; j < k; ++j) {
      d[j] = static_cast<float>((d[j] * inv_sum - (j == label ? 1.0 : 0.0)) *
                                scale);
    }
  }
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) loss += row_loss[i];
  return static_cast<float>(loss * scale);
}

}  // namespace pstrain
