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
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/backend.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/cuda_transformer.h"
#include "models/cuda/kernels.h"
#include "models/dropout_mask.h"

namespace pstrain {
namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

class CudaBackend;

// RAII cuDNN descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { cudnnCreateTensorDescriptor(&d); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  absl::Status Set(const Shape& s, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    int n = 1, c = 1, h = 1, w = 1;
    if (s.size() == 4) {
      n = s[0], c = s[1], h = s[2], w = s[3];
    } else if (s.size() == 2) {
      n = s[0], c = s[1];
    } else {
      c = static_cast<int>(NumElements(s));
    }
    CUDA_RETURN_IF_ERROR(
        cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, n, c, h, w));
    return absl::OkStatus();
  }
};

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

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override {
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

  absl::Status Init(int gpu) {
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

  absl::Status SetPrecision(PrecisionKind precision) override {
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
  PrecisionKind precision() const override { return precision_; }
  // The 16-bit type of a bf16 or fp16 precision; false for fp32 and tf32.
  bool sixteen_bit() const {
    return precision_ == PRECISION_BF16 || precision_ == PRECISION_FP16;
  }

  std::string name() const override { return name_; }
  bool host_memory() const override { return false; }

  absl::StatusOr<float*> Allocate(int64_t elements) override {
    return AllocateWith(cudaMalloc, "device", elements);
  }
  void Free(float* data) override { cudaFree(data); }
  absl::StatusOr<float*> AllocateHost(int64_t elements) override {
    return AllocateWith(cudaMallocHost, "pinned host", elements);
  }
  void FreeHost(float* data) override { cudaFreeHost(data); }

  // The copy stream first waits for all compute issued so far.
  absl::Status CopyToDevice(const float* host, int64_t elements,
                            float* device) override {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_, compute_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, compute_done_, 0));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, host, sizeof(float) * elements,
                                         cudaMemcpyHostToDevice, copy_));
    // Later compute reads what was copied.
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_done_, copy_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, copy_done_, 0));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const float* device, int64_t elements,
                          float* host) override {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_, compute_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, compute_done_, 0));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, device, sizeof(float) * elements,
                                         cudaMemcpyDeviceToHost, copy_));
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(const float* src, int64_t elements,
                            float* dst) override {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, sizeof(float) * elements,
                                         cudaMemcpyDeviceToDevice, compute_));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> DeviceMemoryInUseBytes() override {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu_));
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes - free_bytes);
  }
  absl::StatusOr<std::shared_ptr<CopyFence>> RecordCopies() override {
    cudaEvent_t event = nullptr;
    CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    auto fence = std::make_shared<CudaCopyFence>(gpu_, event);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(event, copy_));
    return fence;
  }

  absl::StatusOr<std::unique_ptr<Layer>> CreateLayer(
      const LayerSpec& spec, std::vector<Param*> params,
      std::vector<Buffer*> buffers, uint64_t seed) override;

  absl::Status AdamUpdate(const AdamOptions& options, int64_t step, float* w,
                          const float* g, float* m, float* v,
                          int64_t n) override {
    CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchAdam(
        AdamConstantsFor(options, step), w, g, m, v, n, compute_));
    return absl::OkStatus();
  }

  absl::Status Accumulate(const float* x, int64_t elements, float* y) override {
    CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchAdd(x, y, elements, y, compute_));
    return absl::OkStatus();
  }

  absl::Status Scale(float a, float* x, int64_t elements) override {
    CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchScale(a, x, elements, compute_));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> AllFinite(
      absl::Span<const DeviceTensor* const> tensors) override {
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

  // The 16-bit copies a convolution or linear layer makes within one
  // Forward or Backward call (To16, Buffer16), shared by every layer: the
  // layers run one after another on the compute stream and none keeps a
  // copy past its call. One set per backend instead of one per layer (the
  // H200 run of 2026-11-27 measured ResNet-50 at batch 128 in 20604 MiB
  // under bf16 against 12590 MiB under tf32 with a set per layer).
  enum class Slot16 { kInput, kWeight, kOutput, kWeightGrad };
  DeviceTensor* Scratch16(Slot16 slot) {
    return &scratch16_[static_cast<int>(slot)];
  }

  // Converts `n` fp32 values at `x` to the precision's 16-bit type into
  // `*buffer` (grown as needed) and returns its data.
  absl::StatusOr<uint16_t*> To16(const float* x, int64_t n,
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
  // A buffer of at least `n` 16-bit values.
  absl::StatusOr<uint16_t*> Buffer16(int64_t n, DeviceTensor* buffer) {
    if (buffer->backend() == nullptr) *buffer = DeviceTensor(this);
    if (buffer->size() * 2 < n) {
      absl::Status s = buffer->Resize({(n + 1) / 2});
      if (!s.ok()) return s;
    }
    return reinterpret_cast<uint16_t*>(buffer->data());
  }
  absl::Status From16(const uint16_t* x, int64_t n, float* y) {
    CUDA_RETURN_IF_LAUNCH_ERROR(
        cuda::LaunchFrom16(x, n, precision_ == PRECISION_BF16, y, compute_));
    return absl::OkStatus();
  }

  absl::StatusOr<float> SoftmaxCrossEntropy(const DeviceTensor& logits,
                                            absl::Span<const int32_t> labels,
                                            DeviceTensor* dlogits) override {
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

  // On the device, the labels checked on the host (CountPredictedRows).
  absl::StatusOr<float> SoftmaxCrossEntropyIgnoring(
      const DeviceTensor& logits, absl::Span<const int32_t> labels,
      int32_t ignore_index, DeviceTensor* dlogits) override {
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

  // Both cross-entropies: uploads the `n` labels (checked by the caller) into
  // labels_, runs kernels.h's LaunchSoftmaxCrossEntropy over logits [n, k]
  // (dlogits divided by `divisor`) and returns the sum of the per-row
  // losses, ignored rows adding 0.
  absl::StatusOr<double> CrossEntropySum(const DeviceTensor& logits,
                                         absl::Span<const int32_t> labels,
                                         int64_t n, int64_t k,
                                         int32_t ignore_index, int64_t divisor,
                                         DeviceTensor* dlogits) {
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
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), losses_,
                                         sizeof(float) * n,
                                         cudaMemcpyDeviceToHost, compute_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    double sum = 0;
    for (float l : host) sum += l;
    return sum;
  }

  // Shared by the layers.
  CudaLayerContext LayerContext() {
    CudaLayerContext context;
    context.backend = this;
    context.cublas = cublas_;
    context.stream = compute_;
    context.pool = &transformer_scratch_;
    return context;
  }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudaStream_t compute() const { return compute_; }

  // A device workspace of at least `bytes` (cuDNN convolutions).
  absl::StatusOr<void*> Workspace(size_t bytes) {
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

  // A device vector of at least `n` ones (bias gradients by GEMV).
  absl::StatusOr<const float*> Ones(int64_t n) {
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

  // Scratch device memory for outputs nobody needs (BatchNorm's dx of the
  // first layer).
  absl::StatusOr<float*> Scratch(int64_t n) {
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

 private:
  // RESOURCE_EXHAUSTED naming the bytes and `kind` of memory on failure.
  absl::StatusOr<float*> AllocateWith(cudaError_t (*allocate)(void**, size_t),
                                      const char* kind, int64_t elements) {
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

  int gpu_ = 0;
  std::string name_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  cudaEvent_t copy_done_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  PrecisionKind precision_ = PRECISION_TF32;
  int compute_capability_ = 0;
  int* flag_ = nullptr;  // AllFinite's
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  DeviceTensor scratch16_[4];
  // The transformer layers' shared scratch (cuda_transformer.h).
  CudaScratchPool transformer_scratch_{this};
  float* ones_ = nullptr;
  int64_t ones_size_ = 0;
  float* scratch_ = nullptr;
  int64_t scratch_size_ = 0;
  int32_t* labels_ = nullptr;
  float* losses_ = nullptr;
  int64_t label_capacity_ = 0;
};

// Convolution with the fastest algorithms cuDNN finds for each shape (as
// PyTorch's cudnn.benchmark = True). Math by the backend's precision when
// the layer is created: fp32 on FMA units, tf32 on TF32 tensor cores, bf16
// and fp16 with the input, weights and output gradient converted to the
// 16-bit type (our kernels) and cuDNN's pseudo-16-bit configuration
// (16-bit tensors, CUDNN_DATA_FLOAT compute: fp32 accumulation) on tensor
// cores; its 16-bit output, input gradient and weight gradient converted
// back to fp32. The bias and its gradient stay fp32.
class Conv2d final : public Layer {
 public:
  Conv2d(CudaBackend* b, const LayerSpec& spec, std::vector<Param*> params)
      : b_(b),
        spec_(spec),
        weight_(params[0]),
        bias_(spec.bias ? params[1] : nullptr),
        precision_(b->precision()),
        half_(b->sixteen_bit()),
        type_(precision_ == PRECISION_BF16   ? CUDNN_DATA_BFLOAT16
              : precision_ == PRECISION_FP16 ? CUDNN_DATA_HALF
                                             : CUDNN_DATA_FLOAT) {
    cudnnCreateFilterDescriptor(&filter_);
    cudnnCreateConvolutionDescriptor(&conv_);
  }
  ~Conv2d() override {
    cudnnDestroyFilterDescriptor(filter_);
    cudnnDestroyConvolutionDescriptor(conv_);
  }

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status s = Prepare(in[0]->shape(), out->shape());
    if (!s.ok()) return s;
    absl::StatusOr<void*> ws = b_->Workspace(workspace_bytes_);
    if (!ws.ok()) return ws.status();
    const void* x = in[0]->data();
    const void* w = weight_->value.data();
    void* y = out->data();
    if (half_) {
      absl::StatusOr<uint16_t*> x16 =
          b_->To16(in[0]->data(), in[0]->size(),
                   b_->Scratch16(CudaBackend::Slot16::kInput));
      if (!x16.ok()) return x16.status();
      absl::StatusOr<uint16_t*> w16 =
          b_->To16(weight_->value.data(), weight_->value.size(),
                   b_->Scratch16(CudaBackend::Slot16::kWeight));
      if (!w16.ok()) return w16.status();
      absl::StatusOr<uint16_t*> y16 = b_->Buffer16(
          out->size(), b_->Scratch16(CudaBackend::Slot16::kOutput));
      if (!y16.ok()) return y16.status();
      x = *x16;
      w = *w16;
      y = *y16;
    }
    CUDA_RETURN_IF_ERROR(cudnnConvolutionForward(
        b_->cudnn(), &kOne, x_.d, x, filter_, w, conv_, fwd_algo_, *ws,
        workspace_bytes_, &kZero, y_.d, y));
    if (half_) {
      s = b_->From16(static_cast<const uint16_t*>(y), out->size(), out->data());
      if (!s.ok()) return s;
    }
    if (bias_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudnnAddTensor(b_->cudnn(), &kOne, bias_desc_.d,
                                          bias_->value.data(), &kOne, y32_.d,
                                          out->data()));
    }
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    absl::Status s = Prepare(in[0]->shape(), out.shape());
    if (!s.ok()) return s;
    absl::StatusOr<void*> ws = b_->Workspace(workspace_bytes_);
    if (!ws.ok()) return ws.status();
    const void* x = in[0]->data();
    const void* w = weight_->value.data();
    const void* dy = dout.data();
    void* dw = weight_->grad.data();
    void* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    if (half_) {
      absl::StatusOr<uint16_t*> x16 =
          b_->To16(in[0]->data(), in[0]->size(),
                   b_->Scratch16(CudaBackend::Slot16::kInput));
      if (!x16.ok()) return x16.status();
      absl::StatusOr<uint16_t*> dy16 =
          b_->To16(dout.data(), dout.size(),
                   b_->Scratch16(CudaBackend::Slot16::kOutput));
      if (!dy16.ok()) return dy16.status();
      absl::StatusOr<uint16_t*> dw16 =
          b_->Buffer16(weight_->grad.size(),
                       b_->Scratch16(CudaBackend::Slot16::kWeightGrad));
      if (!dw16.ok()) return dw16.status();
      x = *x16;
      dy = *dy16;
      dw = *dw16;
    }
    CUDA_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
        b_->cudnn(), &kOne, x_.d, x, y_.d, dy, conv_, bwd_filter_algo_, *ws,
        workspace_bytes_, &kZero, filter_, dw));
    if (half_) {
      s = b_->From16(static_cast<const uint16_t*>(dw), weight_->grad.size(),
                     weight_->grad.data());
      if (!s.ok()) return s;
    }
    if (bias_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudnnConvolutionBackwardBias(
          b_->cudnn(), &kOne, y32_.d, dout.data(), &kZero, bias_desc_.d,
          bias_->grad.data()));
    }
    if (dx != nullptr) {
      if (half_) {
        absl::StatusOr<uint16_t*> w16 =
            b_->To16(weight_->value.data(), weight_->value.size(),
                     b_->Scratch16(CudaBackend::Slot16::kWeight));
        if (!w16.ok()) return w16.status();
        absl::StatusOr<uint16_t*> dx16 = b_->Buffer16(
            in[0]->size(), b_->Scratch16(CudaBackend::Slot16::kInput));
        if (!dx16.ok()) return dx16.status();
        w = *w16;
        dx = *dx16;  // the input's copy is free again: dW is done
      }
      CUDA_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
          b_->cudnn(), &kOne, filter_, w, y_.d, dy, conv_, bwd_data_algo_, *ws,
          workspace_bytes_, &kZero, x_.d, dx));
      if (half_) {
        s = b_->From16(static_cast<const uint16_t*>(dx), in[0]->size(),
                       din[0]->data());
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Prepare(const Shape& in, const Shape& out) {
    if (in == in_shape_) return absl::OkStatus();
    in_shape_ = in;
    absl::Status s = x_.Set(in, type_);
    if (s.ok()) s = y_.Set(out, type_);
    if (s.ok()) s = y32_.Set(out);
    if (s.ok()) s = bias_desc_.Set({1, spec_.out_channels, 1, 1});
    if (!s.ok()) return s;
    const int k = static_cast<int>(spec_.kernel);
    CUDA_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(
        filter_, type_, CUDNN_TENSOR_NCHW, static_cast<int>(spec_.out_channels),
        static_cast<int>(spec_.in_channels), k, k));
    const int p = static_cast<int>(spec_.padding);
    const int st = static_cast<int>(spec_.stride);
    // CUDNN_DATA_FLOAT compute: fp32 accumulation in every precision (for
    // 16-bit tensors cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configuration).
    CUDA_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        conv_, p, p, st, st, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // CUDNN_FMA_MATH keeps fp32 convolutions off the tensor cores.
    CUDA_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        conv_,
        precision_ == PRECISION_FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    // cudnnFind* times every algorithm on scratch tensors it allocates.
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDA_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithm(
        b_->cudnn(), x_.d, filter_, conv_, y_.d,
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, fwd));
    if (count < 1 || fwd[0].status != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat(LayerName(spec_), ": no cuDNN forward algorithm"));
    }
    fwd_algo_ = fwd[0].algo;
    size_t bytes = fwd[0].memory;
    cudnnConvolutionBwdDataAlgoPerf_t
        data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDA_RETURN_IF_ERROR(cudnnFindConvolutionBackwardDataAlgorithm(
        b_->cudnn(), filter_, y_.d, conv_, x_.d,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, data));
    if (count < 1 || data[0].status != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat(LayerName(spec_), ": no cuDNN backward-data algorithm"));
    }
    bwd_data_algo_ = data[0].algo;
    bytes = std::max(bytes, data[0].memory);
    cudnnConvolutionBwdFilterAlgoPerf_t
        filt[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDA_RETURN_IF_ERROR(cudnnFindConvolutionBackwardFilterAlgorithm(
        b_->cudnn(), x_.d, y_.d, conv_, filter_,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, filt));
    if (count < 1 || filt[0].status != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(absl::StrCat(
          LayerName(spec_), ": no cuDNN backward-filter algorithm"));
    }
    bwd_filter_algo_ = filt[0].algo;
    workspace_bytes_ = std::max(bytes, filt[0].memory);
    return absl::OkStatus();
  }

  CudaBackend* b_;
  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  const PrecisionKind precision_;
  const bool half_;
  const cudnnDataType_t type_;
  Shape in_shape_;
  // x_, y_ in the precision's type; y32_ the fp32 output (bias).
  TensorDesc x_, y_, y32_, bias_desc_;
  // bf16/fp16: the 16-bit copies (input, then input gradient; weights;
  // output; output gradient; weight gradient).
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
  size_t workspace_bytes_ = 0;
};

// BatchNorm2d, spatial mode. cuDNN updates the running mean and the running
// (unbiased) variance with factor `momentum`, as PyTorch does.
class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(CudaBackend* b, const LayerSpec& spec, std::vector<Param*> params,
              std::vector<Buffer*> buffers)
      : b_(b),
        spec_(spec),
        weight_(params[0]),
        bias_(params[1]),
        running_mean_(buffers[0]),
        running_var_(buffers[1]),
        save_mean_(b),
        save_inv_var_(b) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status s = Prepare(in[0]->shape());
    if (!s.ok()) return s;
    if (!training) {
      CUDA_RETURN_IF_ERROR(cudnnBatchNormalizationForwardInference(
          b_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.d,
          in[0]->data(), x_.d, out->data(), c_.d, weight_->value.data(),
          bias_->value.data(), running_mean_->value.data(),
          running_var_->value.data(), spec_.epsilon));
      return absl::OkStatus();
    }
    CUDA_RETURN_IF_ERROR(cudnnBatchNormalizationForwardTraining(
        b_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.d,
        in[0]->data(), x_.d, out->data(), c_.d, weight_->value.data(),
        bias_->value.data(), spec_.momentum, running_mean_->value.data(),
        running_var_->value.data(), spec_.epsilon, save_mean_.data(),
        save_inv_var_.data()));
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    absl::Status s = Prepare(in[0]->shape());
    if (!s.ok()) return s;
    float* dx = nullptr;
    if (din[0] != nullptr) {
      dx = din[0]->data();
    } else {
      absl::StatusOr<float*> scratch = b_->Scratch(in[0]->size());
      if (!scratch.ok()) return scratch.status();
      dx = *scratch;
    }
    CUDA_RETURN_IF_ERROR(cudnnBatchNormalizationBackward(
        b_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero,
        x_.d, in[0]->data(), x_.d, dout.data(), x_.d, dx, c_.d,
        weight_->value.data(), weight_->grad.data(), bias_->grad.data(),
        spec_.epsilon, save_mean_.data(), save_inv_var_.data()));
    return absl::OkStatus();
  }

 private:
  absl::Status Prepare(const Shape& in) {
    if (in == shape_) return absl::OkStatus();
    shape_ = in;
    absl::Status s = x_.Set(in);
    if (s.ok()) s = c_.Set({1, spec_.in_channels, 1, 1});
    if (s.ok()) s = save_mean_.Resize({spec_.in_channels});
    if (s.ok()) s = save_inv_var_.Resize({spec_.in_channels});
    return s;
  }

  CudaBackend* b_;
  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  Buffer* running_mean_;
  Buffer* running_var_;
  DeviceTensor save_mean_, save_inv_var_;
  Shape shape_;
  TensorDesc x_, c_;
};

// ReLU. The backward reads the output alone (layer_spec.h's contract;
// cuDNN's ReLU gradient is dy where y > 0, and y stands in for x, which may
// be gone), so the forward may run in place and the backward with dx over dy
// (cuDNN's activations allow both with identical descriptors).
class Relu final : public Layer {
 public:
  explicit Relu(CudaBackend* b) : b_(b) {
    cudnnCreateActivationDescriptor(&act_);
    cudnnSetActivationDescriptor(act_, CUDNN_ACTIVATION_RELU,
                                 CUDNN_NOT_PROPAGATE_NAN, 0.0);
  }
  ~Relu() override { cudnnDestroyActivationDescriptor(act_); }
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status s = x_.Set({in[0]->size()});
    if (!s.ok()) return s;
    CUDA_RETURN_IF_ERROR(cudnnActivationForward(b_->cudnn(), act_, &kOne, x_.d,
                                                in[0]->data(), &kZero, x_.d,
                                                out->data()));
    return absl::OkStatus();
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    absl::Status s = x_.Set({in[0]->size()});
    if (!s.ok()) return s;
    CUDA_RETURN_IF_ERROR(cudnnActivationBackward(
        b_->cudnn(), act_, &kOne, x_.d, out.data(), x_.d, dout.data(), x_.d,
        out.data(), &kZero, x_.d, din[0]->data()));
    return absl::OkStatus();
  }

 private:
  CudaBackend* b_;
  cudnnActivationDescriptor_t act_ = nullptr;
  TensorDesc x_;
};

class Pool2d final : public Layer {
 public:
  Pool2d(CudaBackend* b, const LayerSpec& spec) : b_(b), spec_(spec) {
    cudnnCreatePoolingDescriptor(&pool_);
  }
  ~Pool2d() override { cudnnDestroyPoolingDescriptor(pool_); }
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status s = Prepare(in[0]->shape(), out->shape());
    if (!s.ok()) return s;
    CUDA_RETURN_IF_ERROR(cudnnPoolingForward(b_->cudnn(), pool_, &kOne, x_.d,
                                             in[0]->data(), &kZero, y_.d,
                                             out->data()));
    return absl::OkStatus();
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    absl::Status s = Prepare(in[0]->shape(), out.shape());
    if (!s.ok()) return s;
    CUDA_RETURN_IF_ERROR(cudnnPoolingBackward(
        b_->cudnn(), pool_, &kOne, y_.d, out.data(), y_.d, dout.data(), x_.d,
        in[0]->data(), &kZero, x_.d, din[0]->data()));
    return absl::OkStatus();
  }

 private:
  absl::Status Prepare(const Shape& in, const Shape& out) {
    if (in == in_shape_) return absl::OkStatus();
    in_shape_ = in;
    absl::Status s = x_.Set(in);
    if (s.ok()) s = y_.Set(out);
    if (!s.ok()) return s;
    int kh = static_cast<int>(spec_.kernel), kw = kh;
    int stride = static_cast<int>(spec_.stride);
    int pad = static_cast<int>(spec_.padding);
    if (spec_.type == LayerType::kGlobalAvgPool) {
      kh = static_cast<int>(in[2]);
      kw = static_cast<int>(in[3]);
      stride = 1;
      pad = 0;
    }
    const cudnnPoolingMode_t mode =
        spec_.type == LayerType::kMaxPool2d
            ? CUDNN_POOLING_MAX
            : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    CUDA_RETURN_IF_ERROR(
        cudnnSetPooling2dDescriptor(pool_, mode, CUDNN_NOT_PROPAGATE_NAN, kh,
                                    kw, pad, pad, stride, stride));
    return absl::OkStatus();
  }

  CudaBackend* b_;
  const LayerSpec spec_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
  Shape in_shape_;
  TensorDesc x_, y_;
};

// y[N, O] = x[N, I] W^T + b (per token for [N, S, I]) on cuBLAS (column-major:
// Y = W^T X with W^T read from the row-major [O, I] weight). bf16 and fp16
// precision: the input, weights and output gradient converted to the
// 16-bit type and multiplied by cublasGemmEx with fp32 output and
// CUBLAS_COMPUTE_32F (fp32 accumulation, tensor cores); the bias and its
// gradient stay fp32.
class Linear final : public Layer {
 public:
  Linear(CudaBackend* b, const LayerSpec& spec, std::vector<Param*> params)
      : b_(b),
        spec_(spec),
        weight_(params[0]),
        bias_(params[1]),
        half_(b->sixteen_bit()),
        type_(b->precision() == PRECISION_BF16 ? CUDA_R_16BF : CUDA_R_16F) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    // Rows: samples, or tokens for a per-token [N, S, I] input.
    const int n = static_cast<int>(in[0]->size() / spec_.in_channels);
    const int i = static_cast<int>(spec_.in_channels);
    const int o = static_cast<int>(spec_.out_channels);
    absl::StatusOr<const float*> ones = b_->Ones(n);
    if (!ones.ok()) return ones.status();
    // Y = b 1^T, then Y += W^T X.
    CUDA_RETURN_IF_ERROR(cublasSgemm(b_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, o,
                                     n, 1, &kOne, bias_->value.data(), o, *ones,
                                     1, &kZero, out->data(), o));
    if (half_) {
      absl::StatusOr<uint16_t*> w16 =
          b_->To16(weight_->value.data(), weight_->value.size(),
                   b_->Scratch16(CudaBackend::Slot16::kWeight));
      if (!w16.ok()) return w16.status();
      absl::StatusOr<uint16_t*> x16 =
          b_->To16(in[0]->data(), in[0]->size(),
                   b_->Scratch16(CudaBackend::Slot16::kInput));
      if (!x16.ok()) return x16.status();
      return Gemm(CUBLAS_OP_T, CUBLAS_OP_N, o, n, i, *w16, i, *x16, i, &kOne,
                  out->data(), o);
    }
    CUDA_RETURN_IF_ERROR(cublasSgemm(b_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, o,
                                     n, i, &kOne, weight_->value.data(), i,
                                     in[0]->data(), i, &kOne, out->data(), o));
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    // Rows: samples, or tokens for a per-token [N, S, I] input.
    const int n = static_cast<int>(in[0]->size() / spec_.in_channels);
    const int i = static_cast<int>(spec_.in_channels);
    const int o = static_cast<int>(spec_.out_channels);
    absl::StatusOr<const float*> ones = b_->Ones(n);
    if (!ones.ok()) return ones.status();
    // db = dY 1.
    CUDA_RETURN_IF_ERROR(cublasSgemv(b_->cublas(), CUBLAS_OP_N, o, n, &kOne,
                                     dout.data(), o, *ones, 1, &kZero,
                                     bias_->grad.data(), 1));
    if (half_) {
      absl::StatusOr<uint16_t*> x16 =
          b_->To16(in[0]->data(), in[0]->size(),
                   b_->Scratch16(CudaBackend::Slot16::kInput));
      if (!x16.ok()) return x16.status();
      absl::StatusOr<uint16_t*> dy16 =
          b_->To16(dout.data(), dout.size(),
                   b_->Scratch16(CudaBackend::Slot16::kOutput));
      if (!dy16.ok()) return dy16.status();
      // dW (col-major I x O) = X dY^T.
      absl::Status s = Gemm(CUBLAS_OP_N, CUBLAS_OP_T, i, o, n, *x16, i, *dy16,
                            o, &kZero, weight_->grad.data(), i);
      if (!s.ok() || din[0] == nullptr) return s;
      absl::StatusOr<uint16_t*> w16 =
          b_->To16(weight_->value.data(), weight_->value.size(),
                   b_->Scratch16(CudaBackend::Slot16::kWeight));
      if (!w16.ok()) return w16.status();
      // dX (col-major I x N) = W dY.
      return Gemm(CUBLAS_OP_N, CUBLAS_OP_N, i, n, o, *w16, i, *dy16, o, &kZero,
                  din[0]->data(), i);
    }
    // dW (col-major I x O) = X dY^T.
    CUDA_RETURN_IF_ERROR(cublasSgemm(b_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, i,
                                     o, n, &kOne, in[0]->data(), i, dout.data(),
                                     o, &kZero, weight_->grad.data(), i));
    if (din[0] != nullptr) {
      // dX (col-major I x N) = W dY.
      CUDA_RETURN_IF_ERROR(cublasSgemm(
          b_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, i, n, o, &kOne,
          weight_->value.data(), i, dout.data(), o, &kZero, din[0]->data(), i));
    }
    return absl::OkStatus();
  }

 private:
  // C (fp32) = A B + beta C with 16-bit A and B, fp32 accumulation.
  absl::Status Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, const uint16_t* a, int lda, const uint16_t* b,
                    int ldb, const float* beta, float* c, int ldc) {
    CUDA_RETURN_IF_ERROR(cublasGemmEx(
        b_->cublas(), ta, tb, m, n, k, &kOne, a, type_, lda, b, type_, ldb,
        beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }

  CudaBackend* b_;
  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  const bool half_;
  const cudaDataType_t type_;
  // bf16/fp16: the 16-bit copies of the input, weights, output gradient.
};

// The residual add; with spec.relu, the add and its ReLU as one kernel each
// way (kernels.h: no cuDNN call fuses them for fp32 NCHW).
class Add final : public Layer {
 public:
  Add(CudaBackend* b, const LayerSpec& spec) : b_(b), relu_(spec.relu) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    CUDA_RETURN_IF_LAUNCH_ERROR((relu_ ? cuda::LaunchAddRelu : cuda::LaunchAdd)(
        in[0]->data(), in[1]->data(), out->size(), out->data(), b_->compute()));
    return absl::OkStatus();
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (relu_) {
      float* da = din[0] != nullptr ? din[0]->data() : nullptr;
      float* db = din[1] != nullptr ? din[1]->data() : nullptr;
      if (da == nullptr) std::swap(da, db);
      if (da == nullptr) return absl::OkStatus();
      CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchAddReluBackward(
          dout.data(), out.data(), dout.size(), da, db, b_->compute()));
      return absl::OkStatus();
    }
    for (DeviceTensor* d : din) {
      if (d == nullptr) continue;
      absl::Status s = b_->CopyOnDevice(dout.data(), dout.size(), d->data());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  CudaBackend* b_;
  const bool relu_;
};

class Flatten final : public Layer {
 public:
  explicit Flatten(CudaBackend* b) : b_(b) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    return b_->CopyOnDevice(in[0]->data(), in[0]->size(), out->data());
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    return b_->CopyOnDevice(dout.data(), dout.size(), din[0]->data());
  }

 private:
  CudaBackend* b_;
};

class Dropout final : public Layer {
 public:
  Dropout(CudaBackend* b, const LayerSpec& spec, uint64_t seed)
      : b_(b), spec_(spec), seed_(seed), mask_(b) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    if (!training) {
      return b_->CopyOnDevice(in[0]->data(), in[0]->size(), out->data());
    }
    absl::Status s = mask_.Resize(in[0]->shape());
    if (!s.ok()) return s;
    CUDA_RETURN_IF_LAUNCH_ERROR(
        cuda::LaunchDropout(in[0]->data(), in[0]->size(), 1.0f - spec_.dropout,
                            DropoutCallSeed(seed_, ++calls_), mask_.data(),
                            out->data(), b_->compute()));
    return absl::OkStatus();
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    if (mask_.size() != dout.size()) {
      return absl::FailedPreconditionError(
          "dropout: backward without a training forward of this shape");
    }
    CUDA_RETURN_IF_LAUNCH_ERROR(cuda::LaunchMultiply(
        dout.data(), mask_.data(), dout.size(), din[0]->data(), b_->compute()));
    return absl::OkStatus();
  }

 private:
  CudaBackend* b_;
  const LayerSpec spec_;
  const uint64_t seed_;
  uint64_t calls_ = 0;
  DeviceTensor mask_;
};

absl::StatusOr<std::unique_ptr<Layer>> CudaBackend::CreateLayer(
    const LayerSpec& spec, std::vector<Param*> params,
    std::vector<Buffer*> buffers, uint64_t seed) {
  switch (spec.type) {
    case LayerType::kConv2d:
      return std::unique_ptr<Layer>(new Conv2d(this, spec, std::move(params)));
    case LayerType::kLinear:
      return std::unique_ptr<Layer>(new Linear(this, spec, std::move(params)));
    case LayerType::kBatchNorm2d:
      return std::unique_ptr<Layer>(
          new BatchNorm2d(this, spec, std::move(params), std::move(buffers)));
    case LayerType::kRelu:
      return std::unique_ptr<Layer>(new Relu(this));
    case LayerType::kMaxPool2d:
    case LayerType::kAvgPool2d:
    case LayerType::kGlobalAvgPool:
      return std::unique_ptr<Layer>(new Pool2d(this, spec));
    case LayerType::kAdd:
      return std::unique_ptr<Layer>(new Add(this, spec));
    case LayerType::kFlatten:
      return std::unique_ptr<Layer>(new Flatten(this));
    case LayerType::kDropout:
      return std::unique_ptr<Layer>(new Dropout(this, spec, seed));
    case LayerType::kEmbedding:
    case LayerType::kLayerNorm:
    case LayerType::kGelu:
    case LayerType::kMultiheadAttention:
    case LayerType::kTransformerEncoderLayer:
    case LayerType::kGatherRows:
      return NewCudaTransformerLayer(LayerContext(), spec, std::move(params),
                                     seed);
  }
  return absl::InvalidArgumentError("unknown layer type");
}

}  // namespace

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
