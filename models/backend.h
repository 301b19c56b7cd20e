// Backends: where a model's tensors live and which library computes its
// layers.
//
//  - "cpu": host memory; oneDNN primitives (convolution, batch
//    normalisation, pooling, ReLU, inner product, binary add; for the
//    transformer layers layer normalisation, GELU and matmul) and our own
//    loops for softmax cross-entropy, dropout, the embedding lookup and the
//    attention's masked softmax (models/cpu_transformer.h). Always built.
//  - "cuda": device memory on GPU --gpu; cuDNN (convolution, batch
//    normalisation, pooling, activations), cuBLAS (linear layers) and our own
//    kernels for softmax cross-entropy, elementwise add and dropout, and
//    for the transformer layers cuBLAS products and our kernels
//    (models/cuda/cuda_transformer.h). Built
//    only with `bazel build --config=cuda`; fp32 storage, TF32 tensor-core
//    math for convolutions and GEMMs by default (as PyTorch's default for
//    cuDNN convolutions; Backend::SetPrecision).
//
// All tensors are fp32 (bf16/fp16 precision rounds at a layer's edge:
// SetPrecision), NCHW for images, [N, F] for features, [N, S, E] for
// transformer activations.
//
// Thread-safety: a Backend, its tensors and its layers belong to one
// training thread (the CUDA backend owns one stream for compute and one for
// copies). Create() may be called from any thread.
#ifndef PSTRAIN_MODELS_BACKEND_H_
#define PSTRAIN_MODELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/layer_spec.h"
#include "models/tensor.h"
#include "optim/adam.h"
#include "proto/job.pb.h"

namespace pstrain {

class Backend;

// A tensor in a backend's memory (host memory for cpu, device memory for
// cuda). Move-only; frees its memory on destruction. Resize() keeps the
// allocation when the new shape fits in it.
//
// A view (SetView()) is a tensor over memory someone else owns (the model's
// memory plan places activations and gradients in shared slots): it never
// allocates or frees, and Resize() past the view's capacity is an error.
//
// layout(): how the elements are ordered. 0 is dense row-major (NCHW, NC),
// the only layout parameters, inputs, logits and anything a caller reads
// have. A backend may keep activations in its own layout (the CPU backend:
// 8 or 16, oneDNN's channel-blocked nChw8c / nChw16c, for channel counts
// that are multiples of the block); layers set their output's layout and
// read their inputs' layout. Elementwise operations (ReLU, add, dropout,
// gradient accumulation) work on any layout shared by their operands.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(Backend* backend) : backend_(backend) {}
  DeviceTensor(DeviceTensor&& other) noexcept;
  DeviceTensor& operator=(DeviceTensor&& other) noexcept;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor();

  // RESOURCE_EXHAUSTED (naming the bytes) when the backend cannot allocate;
  // INTERNAL for a view whose capacity the shape exceeds.
  absl::Status Resize(const Shape& shape);
  // Makes this tensor a view of `capacity` elements at `data` (not owned;
  // must outlive the view's use), freeing what it owned. Keeps the shape
  // when it fits, else clears it.
  void SetView(float* data, int64_t capacity);
  bool is_view() const { return !owned_; }

  const Shape& shape() const { return shape_; }
  int layout() const { return layout_; }
  void set_layout(int layout) { layout_ = layout; }
  int64_t size() const { return NumElements(shape_); }
  float* data() { return data_; }
  const float* data() const { return data_; }
  Backend* backend() const { return backend_; }

 private:
  Backend* backend_ = nullptr;
  Shape shape_;
  float* data_ = nullptr;
  int64_t capacity_ = 0;
  int layout_ = 0;
  bool owned_ = true;
};

// A trainable parameter and the gradient of the loss with respect to it
// (same shape), both in the backend's memory.
struct Param {
  std::string name;  // "layer1.0.conv1.weight"
  DeviceTensor value;
  DeviceTensor grad;
};

// A non-trainable tensor the model keeps and the PS averages (BatchNorm's
// running mean and variance).
struct Buffer {
  std::string name;  // "layer1.0.bn1.running_mean"
  DeviceTensor value;
};

// A layer running on a backend. The model sizes every output and input
// gradient before it calls Forward/Backward.
class Layer {
 public:
  virtual ~Layer() = default;
  // out = f(in). `training` selects batch statistics and dropout; false:
  // running statistics and identity. Training forwards of BatchNorm update
  // its running statistics.
  virtual absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                               DeviceTensor* out, bool training) = 0;
  // Given the last training Forward()'s inputs `in` and output `out`, and
  // dLoss/dOut `dout`: writes dLoss/dIn into din[i] (null: not needed) and
  // overwrites the gradients of the layer's parameters.
  virtual absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                                const DeviceTensor& out,
                                const DeviceTensor& dout,
                                absl::Span<DeviceTensor* const> din) = 0;
};

// A point in a backend's copy stream (Backend::RecordCopies()).
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  // Blocks until every copy issued before the fence was recorded is
  // complete; then host memory they wrote may be read. Thread-safe: any
  // thread may wait, any number of times, while the training thread goes on
  // issuing work. A fence must not outlive its backend.
  virtual absl::Status Wait() = 0;
};

// The other direction: the next weights arriving in the host staging
// (Model::HostWeights()) while a training step's forward already runs
// (priority pulls, worker/gradient_exchange.h). Model::ForwardBackward()
// asks before each layer's forward reads (BatchNorm: updates) its PS
// tensors, and once before backward for all of them. Called on the
// training thread only.
class WeightsGate {
 public:
  virtual ~WeightsGate() = default;
  // Returns once PS tensor `t`'s host weights are in and stay as they are
  // until the next step; an error ends the step (the exchange's error).
  virtual absl::Status AwaitTensor(int t) = 0;
  // Returns once every PS tensor is in and the exchange holds none of the
  // host staging any more (backward may write the gradients).
  virtual absl::Status AwaitAll() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", or "cuda" with GPU `gpu`: the spelling parsed
  // (catalog/job_config.h), then CreateBackend (models/backend_factory.h).
  // INVALID_ARGUMENT for another name ("backend: \"tpu\"; expected cpu or
  // cuda"); FAILED_PRECONDITION when this build has no CUDA ("rebuild with
  // --config=cuda") or no GPU `gpu` is visible.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(
      const std::string& name, int gpu = 0);
  // Whether Create("cuda", gpu) would succeed, and why not.
  static absl::Status CudaAvailable(int gpu = 0);

  // "cpu" or "cuda:0 (NVIDIA H100 ...)".
  virtual std::string name() const = 0;
  // True when device memory is host memory (copies are plain memcpy).
  virtual bool host_memory() const = 0;

  virtual absl::StatusOr<float*> Allocate(int64_t elements) = 0;
  virtual void Free(float* data) = 0;
  // Host memory the device copies from and to fast (pinned on CUDA).
  virtual absl::StatusOr<float*> AllocateHost(int64_t elements) = 0;
  virtual void FreeHost(float* data) = 0;

  // Copies on the backend's copy stream, ordered after all compute issued so
  // far; they complete by the next Synchronize().
  virtual absl::Status CopyToDevice(const float* host, int64_t elements,
                                    float* device) = 0;
  virtual absl::Status CopyToHost(const float* device, int64_t elements,
                                  float* host) = 0;
  virtual absl::Status CopyOnDevice(const float* src, int64_t elements,
                                    float* dst) = 0;
  // Waits for all compute and copies issued so far.
  virtual absl::Status Synchronize() = 0;
  // A fence after the copies issued so far, for another thread to wait on
  // (a CUDA event on the copy stream). Host-memory backends copy
  // synchronously: their fence is already passed.
  virtual absl::StatusOr<std::shared_ptr<CopyFence>> RecordCopies();
  // Bytes of the device's memory in use by every process on it (CUDA:
  // total - free from cudaMemGetInfo, so a caller subtracts a baseline taken
  // before its own allocations). UNIMPLEMENTED on host-memory backends.
  virtual absl::StatusOr<int64_t> DeviceMemoryInUseBytes();

  // The layer `spec` with its parameters `params` and buffers `buffers`
  // (sized as ParamSpecs/BufferSpecs say; the layer keeps the pointers).
  // `seed` drives dropout masks.
  virtual absl::StatusOr<std::unique_ptr<Layer>> CreateLayer(
      const LayerSpec& spec, std::vector<Param*> params,
      std::vector<Buffer*> buffers, uint64_t seed) = 0;

  // What convolutions and linear layers compute in (JobSpec.precision,
  // resolved by catalog/job_config.h; README "Mixed precision"), as
  // torch.autocast does; everything else (BatchNorm, pooling, ReLU,
  // softmax and the loss, the optimizer) stays fp32, and so does every
  // DeviceTensor:
  //  - fp32: IEEE single precision (CUDA: FMA units, TF32 off);
  //  - tf32: CUDA only, fp32 convolutions and GEMMs on TF32 tensor cores
  //    (10-bit mantissa; PyTorch's cudnn.allow_tf32 and
  //    cuda.matmul.allow_tf32);
  //  - bf16, fp16: the layer's input, weights and output gradient rounded
  //    to the 16-bit type at its edge (round to nearest even), products
  //    accumulated in fp32, outputs and gradients written in fp32.
  // The default is tf32 on CUDA and fp32 on the CPU. Takes effect for
  // layers created afterwards. INVALID_ARGUMENT for UNSPECIFIED or a
  // precision the backend does not compute (tf32 on the CPU);
  // FAILED_PRECONDITION where this machine cannot (bf16 on a CPU where
  // oneDNN creates no bf16 convolution, a GPU before compute capability
  // 8.0 for bf16), naming the machine.
  virtual absl::Status SetPrecision(PrecisionKind precision) = 0;
  virtual PrecisionKind precision() const = 0;

  // One Adam/AdamW step on the backend's memory: `w`, `m`, `v` updated in
  // place from the gradient `g`, `n` elements each, with optim/adam.h's
  // formula in its order (PyTorch's torch.optim.Adam/AdamW). `step` is
  // 1-based. For a local optimizer (train_bench, as PyTorch's own loop);
  // the PS applies its updates on the host (server/parameter_shard.h).
  virtual absl::Status AdamUpdate(const AdamOptions& options, int64_t step,
                                  float* w, const float* g, float* m, float* v,
                                  int64_t n) = 0;

  // y += x, elementwise over `elements`.
  virtual absl::Status Accumulate(const float* x, int64_t elements,
                                  float* y) = 0;

  // x *= a over `elements` (loss scaling: the loss gradient scaled, each
  // parameter gradient unscaled; Model::set_loss_scale).
  virtual absl::Status Scale(float a, float* x, int64_t elements) = 0;
  // Whether every element of `tensors` is finite (neither NaN nor
  // infinite); waits for the work issued so far.
  virtual absl::StatusOr<bool> AllFinite(
      absl::Span<const DeviceTensor* const> tensors) = 0;

  // Softmax cross-entropy averaged over the batch, as PyTorch's
  // nn.CrossEntropyLoss(reduction='mean'). `logits` [N, K]; `labels` (host)
  // N values in [0, K). Writes dLoss/dLogits = (softmax - onehot) / N into
  // `dlogits` when not null and returns the loss. INVALID_ARGUMENT for a
  // label out of range or a shape mismatch.
  virtual absl::StatusOr<float> SoftmaxCrossEntropy(
      const DeviceTensor& logits, absl::Span<const int32_t> labels,
      DeviceTensor* dlogits) = 0;

  // Softmax cross-entropy over the rows of `logits` [..., K] (a row per
  // token for [N, S, K]) whose label is not `ignore_index`, averaged over
  // those rows: PyTorch's nn.CrossEntropyLoss(ignore_index=-100,
  // reduction='mean') on logits.view(-1, K), the masked-language-model loss
  // (Devlin et al. 2019). `labels` (host): one per row, in [0, K) or
  // `ignore_index`. dlogits = (softmax - onehot) / count on those rows and 0
  // on ignored ones. With every row ignored the loss and dlogits are 0
  // (PyTorch gives NaN). INVALID_ARGUMENT for another label or a label
  // count that is not the row count. The default runs on the host
  // (HostSoftmaxCrossEntropyIgnoring) for host-memory backends and is
  // UNIMPLEMENTED elsewhere; the CUDA backend computes it on the device.
  virtual absl::StatusOr<float> SoftmaxCrossEntropyIgnoring(
      const DeviceTensor& logits, absl::Span<const int32_t> labels,
      int32_t ignore_index, DeviceTensor* dlogits);
};

// Backend factories; the CUDA one exists only in --config=cuda builds.
std::unique_ptr<Backend> NewCpuBackend();
// Whether the CPU backend can compute bf16 precision on this machine
// (oneDNN creates bf16 convolutions and inner products: AVX-512 CPUs);
// FAILED_PRECONDITION saying why not otherwise. Probed once per process.
absl::Status CpuBf16Available();

// Host-side softmax cross-entropy, shared by the CPU backend and tests.
// `logits` is N x K row-major.
absl::StatusOr<float> HostSoftmaxCrossEntropy(const float* logits, int64_t n,
                                              int64_t k,
                                              absl::Span<const int32_t> labels,
                                              float* dlogits);
// The rows of an ignoring cross-entropy that count (label not
// `ignore_index`); INVALID_ARGUMENT as SoftmaxCrossEntropyIgnoring says.
absl::StatusOr<int64_t> CountPredictedRows(absl::Span<const int32_t> labels,
                                           int64_t n, int64_t k,
                                           int32_t ignore_index);
// Backend::SoftmaxCrossEntropyIgnoring on the host: `logits` is n x k
// row-major; ignored rows cost nothing (their dlogits are zeroed).
absl::StatusOr<float> HostSoftmaxCrossEntropyIgnoring(
    const float* logits, int64_t n, int64_t k, absl::Span<const int32_t> labels,
    int32_t ignore_index, float* dlogits);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_BACKEND_H_
