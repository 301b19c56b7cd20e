// A model: a directed acyclic graph of layers (a chain with residual adds)
// ending in logits, trained with softmax cross-entropy, running on one
// Backend; and the model zoo.
//
// Image zoo (input NCHW fp32 [N, C, H, W], output [N, num_classes] logits).
// Each model adapts its stem to the input size:
//  - "mlp":    flatten, fc(C*H*W)-256, ReLU, fc256-128, ReLU, fc128-K.
//  - "lenet5": conv5x5-6 (pad 2), ReLU, maxpool2, conv5x5-16, ReLU, maxpool2,
//              fc-120, ReLU, fc120-84, ReLU, fc84-K (LeCun et al. 1998 with
//              ReLU and max pooling; 61,706 parameters at 28x28x1, K = 10).
//  - "alexnet": torchvision's AlexNet (Krizhevsky 2014 "one weird trick"
//              variant). H > 64: the ImageNet stem conv11x11/4 and 3x3/2 max
//              pools (61,100,840 parameters at 224x224x3, K = 1000); H <= 64:
//              a conv3x3/1 stem and 2x2/2 max pools. The classifier takes the
//              flattened features (at 224 they are 6x6, where torchvision's
//              adaptive average pool is the identity).
//  - "vgg16":  torchvision's VGG-16 (configuration D, no BatchNorm; 138,357,544
//              parameters at 224x224x3, K = 1000). A 2x2 max pool is skipped
//              once the feature map is 1x1 (28x28 inputs).
//  - "resnet18", "resnet34" (basic blocks), "resnet50", "resnet101"
//              (bottleneck blocks, stride on the 3x3 as torchvision's v1.5),
//              He et al. 2016. Stem: H > 64: conv7x7/2, BN, ReLU,
//              maxpool3x3/2 (ImageNet; ResNet-50 has 25,557,032 parameters
//              at 224x224x3, K = 1000, as torchvision); 32 < H <= 64:
//              conv3x3/1, BN, ReLU, maxpool3x3/2; H <= 32: conv3x3/1, BN,
//              ReLU and no max pool (the CIFAR ResNets). Convolutions have no
//              bias; global average pooling; fc to K.
// Initialisation as torchvision: ResNet and VGG convolutions Kaiming-normal
// (fan_out, ReLU gain; He et al. 2015), BatchNorm weight 1 and bias 0, VGG's
// linear layers N(0, 0.01) with zero bias; everything else PyTorch's default
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
//
// Sequence zoo (issue 41): masked-language models after BERT (Devlin et al.
// 2019) without token types, next-sentence head or pooler. input_chw is {S}
// (the sequence length, 1 <= S <= 512); inputs are token ids [N, S] (fp32
// whole numbers in [0, vocab)) and a key padding mask [N, S] (nonzero: a
// padding position no token attends to); num_classes is the vocabulary
// size; logits are [N, S, vocab]; labels are one per token, kIgnoreLabel
// (-100) where the token is not predicted. Layers, named as the PyTorch
// module tools/torch/torch_models.py builds (its state_dict keys):
//   embeddings        token [vocab, E] + position [512, E] embedding
//   embeddings.norm   LayerNorm(E), then embeddings.dropout
//   layers.I          TransformerEncoderLayer(E, heads, F, dropout,
//                     "gelu", post-LN) with the padding mask, I = 0..L-1
//   head.gather       the rows of the predicted positions, [P, E]
//                     (BERT's gather_indexes: a training step's positions
//                     are the tokens whose label is not kIgnoreLabel, so
//                     the head and its logits cost P / (N S) of a
//                     per-token head, about 15%; Forward gathers every
//                     position)
//   head.dense, head.gelu, head.norm: Linear(E, E) per row, GELU,
//                     LayerNorm(E) (BERT's MLM transform)
//   head.decoder      logits = h embeddings.token.weight^T + head.decoder.bias
//                     (the weight tied to the token embedding: one PS
//                     tensor, its gradient the sum of both uses)
// LayerNorm eps 1e-5 everywhere (PyTorch's default; BERT used 1e-12).
//  - "bert_tiny": L 2, E 128, 2 heads, F 512 (Turc et al. 2019's BERT-Tiny
//    shape); 1,535,872 parameters at vocab 8192.
//  - "bert_base": L 12, E 768, 12 heads, F 3072; 109,512,762 parameters at
//    vocab 30522 (BERT-base's WordPiece vocabulary).
//  - "bert_tiny_untied", "bert_base_untied": the same with head.decoder a
//    Linear(E, vocab) of its own (weight [vocab, E] N(0, 0.02), bias 0;
//    vocab x E more parameters), so the token embedding's gradient touches
//    only the rows of the batch's ids (PsTensorRowElements(); issue 41's
//    row-sparse tables).
// Initialisation as BERT: weights N(0, 0.02), biases 0, LayerNorm 1 and 0.
//
// Parameters and buffers: params() are trained by the PS's Adam; buffers()
// (BatchNorm running mean and variance) are sent to the PS with every push
// and averaged there over workers without Adam (see server/parameter_shard.h)
// so that evaluation uses statistics of all workers' data. The PS sees the
// params, then the buffers, as one list of tensors ("PS tensors").
//
// Host staging: the PS client reads gradients from and writes weights to
// host memory. HostGradients() and HostWeights() are spans over it, one per
// PS tensor. On the CPU backend they are the model's own tensors (no copy);
// on CUDA they are pinned buffers, filled by device-to-host copies issued as
// each layer's backward finishes (overlapping the rest of the backward pass)
// and copied to the device by LoadHostWeights() on the copy stream.
//
// Thread-compatible: one Model per training thread.
#ifndef PSTRAIN_MODELS_MODEL_H_
#define PSTRAIN_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "models/backend.h"
#include "models/layer_spec.h"
#include "models/tensor.h"

namespace pstrain {

// Called on the training thread during ForwardBackward() as gradients
// become final: `tensors` are PS tensor indices (one layer's parameters as
// its backward finishes; the BatchNorm buffers once, at the end), and their
// host staging (HostGradients()) may be read once `fence` has been waited
// on, from any thread, until the next ForwardBackward(). Gradient-bucket
// allreduce and the PS pushes start from here (worker/gradient_exchange.h).
using GradientsReadyFn = std::function<void(absl::Span<const int> tensors,
                                            std::shared_ptr<CopyFence> fence)>;

// Wall time one layer took, summed over the steps since
// Model::EnableLayerTiming(true) (ms). With timing on, the backend is
// synchronized before and after every layer's forward and backward, so each
// figure is that layer's own device time and the steps themselves get slower
// (a profile, not a throughput measurement).
struct LayerTime {
  std::string name;  // The node's name ("layer1.0.conv1"), or "loss".
  std::string type;  // LayerTypeName(): "conv2d", ..., or "loss".
  std::string spec;  // LayerName(): "conv3x3-64", ..., or "cross_entropy".
  double forward_ms = 0;
  double backward_ms = 0;  // Includes accumulating a shared input's gradient.
};

struct ModelOptions {
  // Seed of the initial weights (the same on every worker).
  uint64_t seed = 1;
  // Seed of dropout masks (differs per worker).
  uint64_t dropout_seed = 1;
  // The memory plan (models/memory_plan.h): layer outputs, their gradients
  // and accumulation scratch share slots wherever their lifetimes in a
  // training step do not overlap; an output no backward reads
  // (layer_spec.h BackwardReadsOf) lives only until its last forward use, a
  // gradient from its first write to its producer's backward, and a ReLU
  // that is its input's only consumer runs in place (forward and backward).
  // Slots are allocated when an input shape is first seen, then reused:
  // the same values bit for bit, about a third of the memory on ResNets, and
  // no allocation in a steady-state step. false: every output and gradient
  // keeps its own memory for the model's life (the layout before the plan,
  // kept to compare against).
  bool memory_plan = true;
  // Sequence models: the dropout probability of the embeddings, the
  // attention weights and the encoder blocks (BERT's 0.1); 0 for
  // deterministic steps (PyTorch comparisons).
  float transformer_dropout = 0.1f;
  // ResNets: each residual add and the ReLU after it as one layer
  // (LayerSpec::AddRelu(), node "layerS.B.add"; the same values); false:
  // an "add" and a "relu" node, as before.
  bool fuse_add_relu = true;
};

// A batch's predicted tokens, where a sequence model's MLM head runs: the
// flat row index n * S + s (fp32, as Model::ForwardAt takes it) and the
// label of every token whose label is not kIgnoreLabel, in order.
struct PredictedTokens {
  std::vector<float> positions;
  std::vector<int32_t> labels;
};
// Fills *out from `labels` (N * S, one per token), reusing its storage.
void FindPredictedTokens(absl::Span<const int32_t> labels,
                         PredictedTokens* out);

class Model {
 public:
  // Builds zoo model `name` on `backend` (not owned; must outlive the model)
  // for inputs `input_chw` = {C, H, W} ({S} for a sequence model) and
  // `num_classes` outputs (the vocabulary of a sequence model); the names
  // are catalog/catalog.h's ModelNames(). INVALID_ARGUMENT naming the
  // known models for an unknown name, or naming the layer whose input shape
  // does not fit.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const std::string& name, const Shape& input_chw, int num_classes,
      const ModelOptions& options, Backend* backend);

  const std::string& name() const { return name_; }
  // {C, H, W} of one input sample; {S} for a sequence model.
  const Shape& input_chw() const { return input_chw_; }
  // Whether the model takes token ids and a padding mask ("bert_*").
  bool sequence_model() const { return sequence_; }
  Backend* backend() const { return backend_; }
  const std::vector<Param*>& params() const { return params_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  // Element counts of the PS tensors: params, then buffers.
  std::vector<int64_t> PsTensorNumElements() const;
  // Row-sparse PS tensors (issue 41; common/partition.h): per PS tensor,
  // its elements per row D where its gradient touches only the rows of the
  // batch's ids (an untied token embedding [vocab, D]: every other row's
  // gradient is exactly zero), else 0. A tied table's gradient is dense.
  std::vector<int64_t> PsTensorRowElements() const;
  // Names and shapes of the PS tensors, in the same order (checkpoints).
  std::vector<std::string> PsTensorNames() const;
  std::vector<Shape> PsTensorShapes() const;
  int num_ps_tensors() const {
    return static_cast<int>(params_.size() + buffers_.size());
  }
  // Trainable parameters (buffers not counted, as torchvision's tables).
  int64_t NumParameters() const;
  int64_t ForwardMacsPerSample() const;
  // ForwardMacsPerSample's count by PS tensor, in PsTensorNumElements'
  // order: each layer's multiply-accumulates split over its own parameters
  // by their sizes (a convolution's weight takes nearly all, its bias the
  // rest); buffers 0. Sums to ForwardMacsPerSample() up to the splits'
  // rounding, less the layers that own no parameter (a tied MLM decoder).
  std::vector<int64_t> ForwardMacsPerPsTensor() const;
  // One line per layer: name, type, output shape per sample, parameters.
  std::string Summary() const;

  // Forward pass of `input` (host, [N, C, H, W]; token ids [N, S] for a
  // sequence model, with no padding) in eval mode (BatchNorm running
  // statistics, no dropout) or training mode. Returns the logits on the host
  // [N, num_classes] ([N, S, vocab]), valid until the next call.
  absl::StatusOr<const Tensor*> Forward(const Tensor& input,
                                        bool training = false);
  // A sequence model's forward with the key padding mask `padding_mask`
  // (host, [N, S], nonzero = padding). INVALID_ARGUMENT for an image model,
  // a mask of another shape, or a sample that is all padding.
  absl::StatusOr<const Tensor*> Forward(const Tensor& input,
                                        const Tensor& padding_mask,
                                        bool training = false);
  // A sequence model's eval-mode forward with the MLM head at `positions`
  // only (flat row indices n * S + s in [0, N S), as a training step runs
  // it at the predicted tokens): logits [P, vocab] on the host, row p for
  // positions[p], valid until the next call. INVALID_ARGUMENT for an image
  // model, no positions, or one out of range.
  absl::StatusOr<const Tensor*> ForwardAt(const Tensor& input,
                                          const Tensor& padding_mask,
                                          const std::vector<float>& positions);

  // Training forward and backward on one batch. Fills every Param::grad with
  // d(mean cross-entropy)/d(param) and the host gradient staging with the
  // gradients and the current buffer values; returns the loss. Calls
  // `on_ready` (when set) for every PS tensor, in the order backward
  // produces them. A sequence model takes N x S labels (row-major, one per
  // token) and averages over the tokens whose label is not kIgnoreLabel
  // (Backend::SoftmaxCrossEntropyIgnoring; the MLM loss); this form has no
  // padding. The logits are not copied to the host.
  absl::StatusOr<float> ForwardBackward(
      const Tensor& input, absl::Span<const int32_t> labels,
      const GradientsReadyFn& on_ready = nullptr);
  // A sequence model's training step with the key padding mask (as
  // Forward's).
  absl::StatusOr<float> ForwardBackward(
      const Tensor& input, const Tensor& padding_mask,
      absl::Span<const int32_t> labels,
      const GradientsReadyFn& on_ready = nullptr);

  // The last ForwardBackward()'s wall times (host clock): the forward with
  // the loss, and the backward with the gradients' staging and on_ready
  // calls, up to its closing synchronize. On an asynchronous backend
  // (CUDA) forward's figure is its kernels' launch and their wait falls in
  // backward's. With tracing on (common/trace.h), the same as "forward" and
  // per-layer "backward" events (args: layer index, first_param, params).
  absl::Duration last_forward_time() const { return last_forward_time_; }
  absl::Duration last_backward_time() const { return last_backward_time_; }

  // Host staging, one span per PS tensor (see above).
  const std::vector<absl::Span<float>>& HostWeights() { return host_weights_; }
  const std::vector<absl::Span<const float>>& HostGradients() {
    return host_gradients_;
  }
  // Copies HostWeights() into the model's params and buffers (with a
  // weights gate on a device backend: at the next forward, see
  // set_weights_gate()).
  absl::Status LoadHostWeights();
  // Copies the model's params and buffers into HostWeights().
  absl::Status StoreHostWeights();

  // Priority pulls: ForwardBackward() asks `gate` (not owned; null: none)
  // before each layer's forward for the layer's PS tensors, and for all of
  // them before backward, so that the first layers' forward runs while the
  // last layers' weights are still arriving. On a device backend (CUDA)
  // LoadHostWeights() then copies nothing: the forward copies each
  // layer's tensors from the host staging once the gate lets them
  // through, and any other forward (evaluation) first asks the gate for
  // all of them and copies them all.
  void set_weights_gate(WeightsGate* gate) { weights_gate_ = gate; }

  // Whether ForwardBackward() fills the host staging (HostGradients()) and
  // calls on_ready; on by default. Off for a loop that keeps the update on
  // the backend (AdamStep()), which then copies nothing to the host.
  void set_stage_gradients(bool on) { stage_gradients_ = on; }

  // fp16 precision's loss scale (optim/loss_scaler.h): ForwardBackward()
  // multiplies dLoss/dLogits by `scale` and divides each parameter's
  // gradient by it as soon as its layer's backward (tied gradients
  // included) is done, before the host staging or on_ready see it
  // (GradScaler's scale() and unscale_()); the loss it returns is not
  // scaled. 1 (the default): neither multiplication runs. A power of two
  // changes no finite gradient's value unless it overflows (to infinity)
  // or underflows.
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }
  // Whether every parameter gradient of the last ForwardBackward() is
  // finite (a single-process loop's overflow test; the PS worker's
  // exchange scans the host staging itself).
  absl::StatusOr<bool> GradientsFinite();

  // One Adam/AdamW step of every param on the backend (Backend::AdamUpdate)
  // from the gradients of the last ForwardBackward(), with Adam's m and v
  // kept on the backend (zero before the first step): the local optimizer
  // of a single-process loop, as PyTorch's torch.optim.Adam on the GPU
  // (bench/train_bench). The PS path does not use it: the shards own the
  // optimizer there. Buffers are untouched (BatchNorm updates them).
  // RESOURCE_EXHAUSTED when the state does not fit.
  absl::Status AdamStep(const AdamOptions& options);

  // Bytes of device (or host) memory the model holds for layer outputs,
  // their gradients and accumulation scratch, for the last input shape:
  // the memory plan's slots, or without it every tensor's own. Not counted:
  // params, their gradients, buffers, Adam state, the input and the
  // backend's own workspaces.
  int64_t ActivationBytes() const;

  // Per-layer timing (see LayerTime); turning it on clears the sums.
  void EnableLayerTiming(bool on);
  // One entry per layer in forward order, then "loss"; empty when off.
  const std::vector<LayerTime>& LayerTimes() const { return layer_times_; }

 private:
  struct Node;
  Model() = default;
  absl::Status Finish(const Shape& input_chw);
  // The input's (and a sequence model's padding mask's) shape for a batch
  // of 1: {1, C, H, W} or {1, S}.
  Shape InputSampleShape() const;
  // Checks and copies the input (and the mask: null is no padding) to the
  // backend, then runs every layer's forward; the logits stay on it. A
  // sequence model's head runs at `positions` (flat row indices n * S + s;
  // null: every position, in order).
  absl::Status RunForward(const Tensor& input, const Tensor* padding_mask,
                          bool training,
                          const std::vector<float>* positions = nullptr);
  // Asks weights_gate_ for a node's parameters and buffers, and copies
  // them to the device if the device's copies are stale.
  absl::Status AwaitWeightsOf(const Node& node);
  // Copies host weights [first, first + count) (PS tensor order: params,
  // then buffers) to the device; nothing on host-memory backends.
  absl::Status CopyWeightsToDevice(int first, int count);
  // The device tensor a node's input `i` names (a node, the model's input
  // or its padding mask).
  DeviceTensor* InputTensor(int i);
  // ForwardBackward's body (padding_mask null: no padding).
  absl::StatusOr<float> TrainStep(const Tensor& input,
                                  const Tensor* padding_mask,
                                  absl::Span<const int32_t> labels,
                                  const GradientsReadyFn& on_ready);
  // Adds the gradients of the parameters tied to `owner`'s into its own
  // (after its backward overwrote them).
  absl::Status AddTiedGradients(const Node& owner);
  // The last forward's logits into host_logits_ (a sequence model's
  // `all_positions`: as [N, S, vocab], else [P, vocab]).
  absl::StatusOr<const Tensor*> CopyLogitsToHost(bool all_positions = true);
  absl::Status CopyGradientsToHost(const Node& node);
  // Places every node's output, gradient and accumulation scratch for
  // inputs of shape `input` (and a sequence model's `positions` head
  // positions) in slots_ (ModelOptions::memory_plan).
  absl::Status PlanMemory(const Shape& input, int64_t positions);
  // on_ready(PS tensors [first_tensor, first_tensor + count), a fence after
  // the copies issued so far); nothing when on_ready is unset or count is 0.
  absl::Status NotifyReady(const GradientsReadyFn& on_ready, int first_tensor,
                           int count);

  std::string name_;
  Backend* backend_ = nullptr;
  Shape input_chw_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Param*> params_;
  std::vector<Buffer*> buffers_;
  DeviceTensor input_;
  bool sequence_ = false;
  DeviceTensor padding_mask_;      // Sequence models: [N, S], 1 = padding.
  std::vector<float> no_padding_;  // Zeros, the mask of unpadded inputs.
  // Sequence models: the head's positions [P] (flat row indices), and a
  // training step's positions and labels there (host).
  DeviceTensor positions_;
  std::vector<float> all_positions_;
  PredictedTokens step_predicted_;
  DeviceTensor scratch_;  // Accumulation scratch without the memory plan.
  bool memory_plan_ = true;
  Shape planned_input_;            // The input shape slots_ are laid out for,
  int64_t planned_positions_ = 0;  // and the head positions.
  std::vector<DeviceTensor> slots_;
  DeviceTensor dlogits_;
  Tensor host_logits_;
  std::vector<absl::Span<float>> host_weights_;
  std::vector<absl::Span<const float>> host_gradients_;
  // Pinned staging on backends without host memory.
  std::vector<float*> host_blocks_;
  // With timing on, waits for the backend and adds the ms since `start` to
  // layer_times_[entry]'s forward or backward sum; with it off, nothing.
  absl::Status AddLayerTime(absl::Time start, size_t entry, bool backward);

  bool stage_gradients_ = true;
  float loss_scale_ = 1.0f;
  WeightsGate* weights_gate_ = nullptr;
  // A device backend with a gate: LoadHostWeights() was called and the
  // device holds older weights than the host staging until a forward
  // copies them.
  bool device_weights_stale_ = false;
  // AdamStep()'s state, one m and v per param, and its update count.
  std::vector<DeviceTensor> adam_m_, adam_v_;
  int64_t adam_step_ = 0;

  bool time_layers_ = false;
  std::vector<LayerTime> layer_times_;  // nodes_, then the loss.
  absl::Duration last_forward_time_;
  absl::Duration last_backward_time_;

  friend class ModelBuilder;

 public:
  ~Model();
};

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MODEL_H_
