// The CPU backend: oneDNN 2.6 primitives on host memory. Its CNN layers
// are cpu_layers.cc's, its transformer layers cpu_transformer.cc's.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "catalog/job_config.h"
#include "common/nonfinite.h"
#include "common/status_macros.h"
#include "models/backend.h"
#include "models/cpu_dnnl.h"
#include "models/cpu_layers.h"
#include "models/cpu_transformer.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

using cpu_dnnl::CpuEngine;
using cpu_dnnl::CpuStream;
using cpu_dnnl::CreationMutex;
using cpu_dnnl::Run;
using cpu_dnnl::Wrap;

// Why the CPU backend has no fp16 precision.
constexpr char kCpuFp16Refusal[] =
    "precision fp16 on the cpu backend; expected fp32 or bf16 (oneDNN 2.6 "
    "has no fp16 convolution or inner product on CPUs; bf16 has fp32's "
    "range and needs no loss scaling)";

absl::Status ProbeCpuBf16() {
  try {
    absl::MutexLock lock(&CreationMutex());
    const memory::desc src({1, 16, 8, 8}, dt::bf16, tag::any);
    const memory::desc wei({16, 16, 3, 3}, dt::bf16, tag::any);
    const memory::desc dst({1, 16, 8, 8}, dt::f32, tag::any);
    dnnl::convolution_forward::primitive_desc conv(
        dnnl::convolution_forward::desc(prop_kind::forward_training,
                                        algorithm::convolution_direct, src, wei,
                                        dst, {1, 1}, {1, 1}, {1, 1}),
        CpuEngine());
    dnnl::inner_product_forward::primitive_desc ip(
        dnnl::inner_product_forward::desc(
            prop_kind::forward_training,
            memory::desc({4, 16}, dt::bf16, tag::any),
            memory::desc({8, 16}, dt::bf16, tag::any),
            memory::desc({4, 8}, dt::f32, tag::any)),
        CpuEngine());
  } catch (const dnnl::error& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "precision bf16 on this CPU: oneDNN creates no bf16 convolution here "
        "(",
        e.what(),
        "; it needs AVX-512: avx512_core, avx512_core_bf16 or AMX); "
        "expected precision fp32"));
  }
  return absl::OkStatus();
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override {
    return precision_ == PRECISION_FP32
               ? "cpu"
               : absl::StrCat("cpu (", Spelling(precision_), ")");
  }
  bool host_memory() const override { return true; }

  absl::Status SetPrecision(PrecisionKind precision) override {
    switch (precision) {
      case PRECISION_FP32:
        break;
      case PRECISION_BF16:
        RETURN_IF_ERROR(CpuBf16Available());
        break;
      case PRECISION_TF32:
        return absl::InvalidArgumentError(
            "precision tf32 on the cpu backend; expected fp32 or bf16 (TF32 "
            "is a format of NVIDIA tensor cores; CPUs have no TF32 "
            "arithmetic)");
      case PRECISION_FP16:
        return absl::InvalidArgumentError(kCpuFp16Refusal);
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "precision ", static_cast<int>(precision), " on the cpu backend"));
    }
    precision_ = precision;
    return absl::OkStatus();
  }
  PrecisionKind precision() const override { return precision_; }

  absl::StatusOr<float*> Allocate(int64_t elements) override {
    const size_t bytes =
        (sizeof(float) * std::max<int64_t>(elements, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
    return static_cast<float*>(p);
  }
  void Free(float* data) override { std::free(data); }
  absl::StatusOr<float*> AllocateHost(int64_t elements) override {
    return Allocate(elements);
  }
  void FreeHost(float* data) override { Free(data); }

  absl::Status CopyToDevice(const float* host, int64_t elements,
                            float* device) override {
    if (host != device) std::memcpy(device, host, sizeof(float) * elements);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const float* device, int64_t elements,
                          float* host) override {
    return CopyToDevice(device, elements, host);
  }
  absl::Status CopyOnDevice(const float* src, int64_t elements,
                            float* dst) override {
    return CopyToDevice(src, elements, dst);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<Layer>> CreateLayer(
      const LayerSpec& spec, std::vector<Param*> params,
      std::vector<Buffer*> buffers, uint64_t seed) override {
    switch (spec.type) {
      case LayerType::kConv2d:
      case LayerType::kLinear:
      case LayerType::kBatchNorm2d:
      case LayerType::kRelu:
      case LayerType::kMaxPool2d:
      case LayerType::kAvgPool2d:
      case LayerType::kGlobalAvgPool:
      case LayerType::kAdd:
      case LayerType::kFlatten:
      case LayerType::kDropout:
        return NewCpuCnnLayer(spec, std::move(params), std::move(buffers), seed,
                              precision_ == PRECISION_BF16);
      case LayerType::kEmbedding:
      case LayerType::kLayerNorm:
      case LayerType::kGelu:
      case LayerType::kMultiheadAttention:
      case LayerType::kTransformerEncoderLayer:
      case LayerType::kGatherRows:
        return NewCpuTransformerLayer(spec, std::move(params), seed,
                                      precision_ == PRECISION_BF16);
    }
    return absl::InvalidArgumentError("unknown layer type");
  }

  absl::Status AdamUpdate(const AdamOptions& options, int64_t step, float* w,
                          const float* g, float* m, float* v,
                          int64_t n) override {
    pstrain::AdamUpdate(options, step, w, g, m, v, n);
    return absl::OkStatus();
  }

  absl::Status Accumulate(const float* x, int64_t elements, float* y) override {
    for (int64_t i = 0; i < elements; ++i) y[i] += x[i];
    return absl::OkStatus();
  }

  absl::Status Scale(float a, float* x, int64_t elements) override {
    for (int64_t i = 0; i < elements; ++i) x[i] *= a;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> AllFinite(
      absl::Span<const DeviceTensor* const> tensors) override {
    for (const DeviceTensor* t : tensors) {
      if (FindNonFinite({t->data(), static_cast<size_t>(t->size())}) >= 0) {
        return false;
      }
    }
    return true;
  }

  absl::StatusOr<float> SoftmaxCrossEntropy(const DeviceTensor& logits,
                                            absl::Span<const int32_t> labels,
                                            DeviceTensor* dlogits) override {
    if (logits.shape().size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("softmax cross-entropy: logits ",
                       ShapeToString(logits.shape()), "; expected [N, K]"));
    }
    return HostSoftmaxCrossEntropy(
        logits.data(), logits.shape()[0], logits.shape()[1], labels,
        dlogits != nullptr ? dlogits->data() : nullptr);
  }

  // The MLM loss on oneDNN's JIT kernels: log-softmax of every row into
  // dlogits (oneDNN logsoftmax_forward, axis 1), the loss from the labels'
  // log-probabilities (summed in row order), then dlogits = (exp(that) -
  // onehot) / count (eltwise_exp, then a scaling pass over the rows on
  // every OpenMP thread; ignored rows zeroed). The host loop
  // (HostSoftmaxCrossEntropyIgnoring) without dlogits.
  absl::StatusOr<float> SoftmaxCrossEntropyIgnoring(
      const DeviceTensor& logits, absl::Span<const int32_t> labels,
      int32_t ignore_index, DeviceTensor* dlogits) override {
    if (dlogits == nullptr || logits.shape().empty() || logits.layout() != 0) {
      return Backend::SoftmaxCrossEntropyIgnoring(logits, labels, ignore_index,
                                                  dlogits);
    }
    const int64_t k = logits.shape().back();
    const int64_t n = k > 0 ? logits.size() / k : 0;
    ASSIGN_OR_RETURN(const int64_t count,
                     CountPredictedRows(labels, n, k, ignore_index));
    if (n == 0) return 0.0f;
    float* d = dlogits->data();
    const memory::desc md({n, k}, dt::f32, tag::ab);
    RETURN_IF_ERROR(Run("softmax cross-entropy", [&] {
      if (!(loss_md_ == md)) {
        absl::MutexLock lock(&CreationMutex());
        log_softmax_ =
            dnnl::logsoftmax_forward(dnnl::logsoftmax_forward::primitive_desc(
                dnnl::logsoftmax_forward::desc(prop_kind::forward_inference, md,
                                               1),
                CpuEngine()));
        exp_ = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(
            dnnl::eltwise_forward::desc(prop_kind::forward_inference,
                                        algorithm::eltwise_exp, md),
            CpuEngine()));
        loss_md_ = md;
      }
      log_softmax_.execute(CpuStream(),
                           {{DNNL_ARG_SRC, Wrap(md, logits.data())},
                            {DNNL_ARG_DST, Wrap(md, d)}});
    }));
    const double scale = 1.0 / std::max<int64_t>(count, 1);
    double loss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (labels[i] != ignore_index) loss -= d[i * k + labels[i]];
    }
    RETURN_IF_ERROR(Run("softmax cross-entropy", [&] {
      exp_.execute(CpuStream(),
                   {{DNNL_ARG_SRC, Wrap(md, d)}, {DNNL_ARG_DST, Wrap(md, d)}});
    }));
    const float s = static_cast<float>(scale);
#pragma omp parallel for schedule(static) if (n * k >= 65536)
    for (int64_t i = 0; i < n; ++i) {
      float* row = d + i * k;
      if (labels[i] == ignore_index) {
        std::fill(row, row + k, 0.0f);
        continue;
      }
      for (int64_t j = 0; j < k; ++j) row[j] *= s;
      row[labels[i]] -= s;
    }
    return static_cast<float>(loss * scale);
  }

 private:
  PrecisionKind precision_ = PRECISION_FP32;
  // SoftmaxCrossEntropyIgnoring's primitives, for logits of shape loss_md_.
  memory::desc loss_md_;
  dnnl::logsoftmax_forward log_softmax_;
  dnnl::eltwise_forward exp_;
};

}  // namespace

absl::Status CpuBf16Available() {
  static const absl::Status* const available = new absl::Status(ProbeCpuBf16());
  return *available;
}

std::unique_ptr<Backend> NewCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace pstrain
