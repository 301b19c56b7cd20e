// The CUDA backend's CNN layers: cuDNN convolution, batch normalisation,
// pooling and ReLU, cuBLAS linear layers, and our kernels (kernels.h) for
// add and dropout, on the backend's compute stream. CudaBackend::CreateLayer
// makes them (and the transformer layers, cuda_transformer.h).
//
// cuDNN 9 marks its legacy (descriptor) API deprecated in favour of the graph
// API; this file is compiled with -Wno-deprecated-declarations (see
// cuda_backend.cc).
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
#include "models/cuda/cuda_backend_internal.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/cuda_transformer.h"
#include "models/cuda/kernels.h"
#include "models/dropout_mask.h"

namespace pstrain {
namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

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

}  // namespace

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

}  // namespace pstrain
