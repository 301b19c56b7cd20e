// The CUDA backend: cuDNN (convolution, batch normalisation, pooling, ReLU),
// cuBLAS (linear layers, gradient accumulation) and our kernels
// (kernels.h). Two streams: compute, and copy for host transfers, ordered
// with events so that gradient copies to pinned host memory overlap the rest
// of the backward pass.
//
// cuDNN 9 marks its legacy (descriptor) API deprecated in favour of the graph
// API; it is still shipped and supported, and it is what PyTorch 2.x's
// non-graph paths call. This file is compiled with
// -Wno-deprecated-declarations for that reason.
//
// The CNN layers are cuda_layers.cc's, the transformer layers
// cuda_transformer.cc's.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/backend.h"
#include "models/cuda/cuda_backend_internal.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/kernels.h"

namespace pstrain {
namespace {

// A CUDA event recorded on the copy stream.
class CudaCopyFence final : public CopyFence {
 public:
  CudaCopyFence(int gpu, cudaEvent_t event) : gpu_(gpu), event_(event) {}
  ~CudaCopyFence() override { cudaEventDestroy(event_); }

  absl::Status Wait() override {
    // The waiting thread may never have used this GPU.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu_));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }

 private:
  const int gpu_;
  const cudaEvent_t event_;
};

}  // namespace

CudaBackend::~CudaBackend() {
  for (DeviceTensor& t : scratch16_) t = DeviceTensor();
  transformer_scratch_.Clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (ones_ != nullptr) cudaFree(ones_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (labels_ != nullptr) cudaFree(labels_);
  if (flag_ != nullptr) cudaFree(flag_);
  if (losses_ != nullptr) cudaFree(losses_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
  if (copy_done_ != nullptr) cudaEventDestroy(copy_done_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
}

absl::Status CudaBackend::Init(int gpu) {
  gpu_ = gpu;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, gpu));
  name_ = absl::StrCat("cuda:", gpu, " (", prop.name, ")");
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudnnCreate(&cudnn_));
  CUDA_RETURN_IF_ERROR(cudnnSetStream(cudnn_, compute_));
  CUDA_RETURN_IF_ERROR(cublasCreate(&cublas_));
  CUDA_RETURN_IF_ERROR(cublasSetStream(cublas_, compute_));
  compute_capability_ = prop.major * 10 + prop.minor;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&flag_, sizeof(int)));
  // TF32 tensor cores for fp32 GEMMs by default (PyTorch's default for
  // cuDNN convolutions; documented in models/backend.h).
  return SetPrecision(PRECISION_TF32);
}

absl::Status CudaBackend::SetPrecision(PrecisionKind precision) {
  switch (precision) {
    case PRECISION_FP32:
    case PRECISION_TF32:
    case PRECISION_FP16:
      break;
    case PRECISION_BF16:
      if (compute_capability_ < 80) {
        return absl::FailedPreconditionError(absl::StrCat(
            "precision bf16 on ", name_, " (compute capability ",
            compute_capability_ / 10, ".", compute_capability_ % 10,
            "): bf16 tensor cores need 8.0 (Ampere) or newer; expected "
            "fp32, tf32 or fp16"));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "precision ", static_cast<int>(precision), " on ", name_));
  }
  precision_ = precision;
  // fp32 GEMMs (fp32 and the Linear layers' fp32 bias GEMM in every
  // precision) on TF32 tensor cores only under tf32; CUBLAS_DEFAULT_MATH
  // keeps them on FMA units. 16-bit GEMMs (cublasGemmEx) pick tensor
  // cores by their types.
  CUDA_RETURN_IF_ERROR(cublasSetMathMode(
      cublas_, precision == PRECISION_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                           : CUBLAS_DEFAULT_MATH));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToDevice(const float* host, int64_t elements,
                                       float* device) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_, compute_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, compute_done_, 0));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, host, sizeof(float) * elements,
                                       cudaMemcpyHostToDevice, copy_));
  // Later compute reads what was copied.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_done_, copy_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, copy_done_, 0));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(const float* device, int64_t elements,
                                     float* host) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_, compute_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, compute_done_, 0));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, device, sizeof(float) * elements,
                                       cudaMemcpyDeviceToHost, copy_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyOnDevice(const float* src, int64_t elements,
                                       float* dst) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, sizeof(float) * elements,
                                       cudaMemcpyDeviceToDevice, compute_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaBackend::DeviceMemoryInUseBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu_));
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes - free_bytes);
}

absl::StatusOr<std::shared_ptr<CopyFence>> CudaBackend::RecordCopies() {
  cudaEvent_t event = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  auto fence = std::make_shared<CudaCopyFence>(gpu_, event);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event, copy_));
  return fence;
}

absl::Status CudaBackend::AdamUpdate(const AdamOptions& options, int64_t step,
                                     float* w, const float* g, float* m,
                                     float* v, int64_t n) {
  CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchAdam(AdamConstantsFor(options, step),
                                               w, g, m, v, n, compute_));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::AllFinite(
    absl::Span<const DeviceTensor* const> tensors) {
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag_, 0, sizeof(int), compute_));
  for (const DeviceTensor* t : tensors) {
    CUDA_RETURN_IF_LAUNCH_ERROR(
        cuda::LaunchFlagNonFinite(t->data(), t->size(), flag_, compute_));
  }
  int flag = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&flag, flag_, sizeof(int),
                                       cudaMemcpyDeviceToHost, compute_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  return flag == 0;
}

absl::StatusOr<uint16_t*> CudaBackend::To16(const float* x, int64_t n,
                                            DeviceTensor* buffer) {
  if (buffer->backend() == nullptr) *buffer = DeviceTensor(this);
  if (buffer->size() * 2 < n) {
    absl::Status s = buffer->Resize({(n + 1) / 2});
    if (!s.ok()) return s;
  }
  uint16_t* y = reinterpret_cast<uint16_t*>(buffer->data());
  CUDA_RETURN_IF_LAUNCH_ERROR(
      cuda::LaunchTo16(x, n, precision_ == PRECISION_BF16, y, compute_));
  return y;
}

absl::StatusOr<uint16_t*> CudaBackend::Buffer16(int64_t n,
                                                DeviceTensor* buffer) {
  if (buffer->backend() == nullptr) *buffer = DeviceTensor(this);
  if (buffer->size() * 2 < n) {
    absl::Status s = buffer->Resize({(n + 1) / 2});
    if (!s.ok()) return s;
  }
  return reinterpret_cast<uint16_t*>(buffer->data());
}

absl::Status CudaBackend::From16(const uint16_t* x, int64_t n, float* y) {
  CUDA_RETURN_IF_LAUNCH_ERROR(
      cuda::LaunchFrom16(x, n, precision_ == PRECISION_BF16, y, compute_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaBackend::SoftmaxCrossEntropy(
    const DeviceTensor& logits, absl::Span<const int32_t> labels,
    DeviceTensor* dlogits) {
  if (logits.shape().size() != 2 ||
      logits.shape()[0] != static_cast<int64_t>(labels.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "softmax cross-entropy: logits ", ShapeToString(logits.shape()),
        "; expected [", labels.size(), ", K]"));
  }
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", labels[i], " of sample ", i, " is outside [0, ", k, ")"));
    }
  }
  // Every label is in [0, k): none is the ignore index.
  absl::StatusOr<double> sum = CrossEntropySum(
      logits, labels, n, k, std::numeric_limits<int32_t>::min(), n, dlogits);
  if (!sum.ok()) return sum.status();
  return static_cast<float>(*sum / n);
}

absl::StatusOr<float> CudaBackend::SoftmaxCrossEntropyIgnoring(
    const DeviceTensor& logits, absl::Span<const int32_t> labels,
    int32_t ignore_index, DeviceTensor* dlogits) {
  const int64_t k = logits.shape().empty() ? 0 : logits.shape().back();
  const int64_t n = k > 0 ? logits.size() / k : 0;
  absl::StatusOr<int64_t> count =
      CountPredictedRows(labels, n, k, ignore_index);
  if (!count.ok()) return count.status();
  if (n == 0) return 0.0f;
  const int64_t divisor = std::max<int64_t>(*count, 1);
  absl::StatusOr<double> sum =
      CrossEntropySum(logits, labels, n, k, ignore_index, divisor, dlogits);
  if (!sum.ok()) return sum.status();
  return static_cast<float>(*sum / divisor);
}

absl::StatusOr<double> CudaBackend::CrossEntropySum(
    const DeviceTensor& logits, absl::Span<const int32_t> labels, int64_t n,
    int64_t k, int32_t ignore_index, int64_t divisor, DeviceTensor* dlogits) {
  if (n > label_capacity_) {
    if (labels_ != nullptr) cudaFree(labels_);
    if (losses_ != nullptr) cudaFree(losses_);
    labels_ = nullptr;
    losses_ = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&labels_, sizeof(int32_t) * n));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&losses_, sizeof(float) * n));
    label_capacity_ = n;
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels_, labels.data(),
                                       sizeof(int32_t) * n,
                                       cudaMemcpyHostToDevice, compute_));
  CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchSoftmaxCrossEntropy(
      logits.data(), labels_, n, k, ignore_index, static_cast<float>(divisor),
      dlogits != nullptr ? dlogits->data() : nullptr, losses_, compute_));
  std::vector<float> host(n);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), losses_, sizeof(float) * n,
                                       cudaMemcpyDeviceToHost, compute_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  double sum = 0;
  for (float l : host) sum += l;
  return sum;
}

CudaLayerContext CudaBackend::LayerContext() {
  CudaLayerContext context;
  context.backend = this;
  context.cublas = cublas_;
  context.stream = compute_;
  context.pool = &transformer_scratch_;
  context.precision = precision_;
  return context;
}

absl::StatusOr<void*> CudaBackend::Workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    if (workspace_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
      cudaFree(workspace_);
    }
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, bytes));
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

absl::StatusOr<const float*> CudaBackend::Ones(int64_t n) {
  if (n > ones_size_) {
    if (ones_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
      cudaFree(ones_);
    }
    ones_ = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ones_, sizeof(float) * n));
    std::vector<float> host(n, 1.0f);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(ones_, host.data(), sizeof(float) * n,
                                    cudaMemcpyHostToDevice));
    ones_size_ = n;
  }
  return ones_;
}

absl::StatusOr<float*> CudaBackend::Scratch(int64_t n) {
  if (n > scratch_size_) {
    if (scratch_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
      cudaFree(scratch_);
    }
    scratch_ = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(float) * n));
    scratch_size_ = n;
  }
  return scratch_;
}

absl::StatusOr<float*> CudaBackend::AllocateWith(
    cudaError_t (*allocate)(void**, size_t), const char* kind,
    int64_t elements) {
  void* p = nullptr;
  const size_t bytes = sizeof(float) * std::max<int64_t>(elements, 1);
  const cudaError_t e = allocate(&p, bytes);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": cannot allocate ", bytes, " bytes of ", kind,
                     " memory: ", cudaGetErrorString(e)));
  }
  return static_cast<float*>(p);
}

absl::Status CudaDeviceAvailable(int gpu) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device is visible (", cudaGetErrorString(e), ")"));
  }
  if (gpu < 0 || gpu >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", gpu, " is not visible; ", count, " CUDA device(s) found"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int gpu) {
  absl::Status available = CudaDeviceAvailable(gpu);
  if (!available.ok()) return available;
  auto backend = std::make_unique<CudaBackend>();
  absl::Status s = backend->Init(gpu);
  if (!s.ok()) return s;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace pstrain
