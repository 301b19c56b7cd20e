// What a layer is, independent of the backend that runs it: its type and
// hyperparameters, the shapes of its parameters and buffers, its output shape
// and its cost. Backends (backend.h) turn a LayerSpec into a running layer.
//
// Shapes are NCHW fp32 for images, [N, F] for feature vectors and
// [N, S, E] (batch, sequence, hidden; batch first) for transformer
// activations. Parameter shapes follow PyTorch: conv weight OIHW
// [out, in, k, k], linear weight [out_features, in_features], BatchNorm
// weight/bias/running stats [C], and the transformer layers' as their
// PyTorch modules' named_parameters() (see ParamSpecs()).
//
// Thread-safety: plain values and pure functions.
#ifndef PSTRAIN_MODELS_LAYER_SPEC_H_
#define PSTRAIN_MODELS_LAYER_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tensor.h"

namespace pstrain {

enum class LayerType {
  kConv2d,       // groups = 1, square kernel, stride, zero padding.
  kBatchNorm2d,  // per-channel, over N, H, W (Ioffe & Szegedy 2015).
  kRelu,
  kMaxPool2d,      // square window, stride, padding (padded with -inf).
  kAvgPool2d,      // square window; padding counted (count_include_pad).
  kGlobalAvgPool,  // [N, C, H, W] -> [N, C, 1, 1].
  kLinear,         // y = x W^T + b over [N, in_features] or, per token,
                   // [N, S, in_features].
  kDropout,        // inverted dropout: kept values scaled by 1 / (1 - p).
  kFlatten,        // [N, ...] -> [N, prod(...)].
  kAdd,            // two inputs of one shape (the residual add); with
                   // `relu`, max(a + b, 0): the add and its ReLU in one pass.
  // Transformer layers (issue 41; CPU backend only so far).
  kEmbedding,           // token + position embedding: ids [N, S] -> [N, S, E].
  kLayerNorm,           // over the last dim (Ba et al. 2016), weight and bias.
  kGelu,                // x Phi(x), the erf form (Hendrycks & Gimpel 2016).
  kMultiheadAttention,  // self-attention with a key padding mask.
  kTransformerEncoderLayer,  // post-LN attention + GELU feed-forward block.
  kGatherRows,  // rows [..., E] at positions [P] -> [P, E] (MLM head).
};

struct LayerSpec {
  LayerType type = LayerType::kRelu;
  // Conv2d: channels; Linear: features.
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  // Conv2d and pooling.
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t padding = 0;
  // Conv2d and Linear.
  bool bias = true;
  // Dropout probability of zeroing an element.
  float dropout = 0.5f;
  // BatchNorm2d, as PyTorch's defaults: running = (1 - momentum) * running +
  // momentum * batch statistic (unbiased variance), eps added to the
  // variance.
  float momentum = 0.1f;
  float epsilon = 1e-5f;
  // Add: ReLU applied to the sum (LayerSpec::AddRelu()).
  bool relu = false;
  // MultiheadAttention: heads (in_channels divisible by it); Embedding:
  // rows of the position table (longest sequence).
  int64_t heads = 1;
  int64_t max_positions = 0;
  // TransformerEncoderLayer: the feed-forward's inner width.
  int64_t feedforward = 0;

  static LayerSpec Conv2d(int64_t in, int64_t out, int64_t kernel,
                          int64_t stride, int64_t padding, bool bias);
  static LayerSpec BatchNorm2d(int64_t channels);
  static LayerSpec Relu();
  static LayerSpec MaxPool2d(int64_t kernel, int64_t stride, int64_t padding);
  static LayerSpec AvgPool2d(int64_t kernel, int64_t stride, int64_t padding);
  static LayerSpec GlobalAvgPool();
  // y = x W^T + b (torch.nn.Linear). Input [N, in_features] (or any
  // [N, ...] of in_features elements per sample, flattened) -> [N,
  // out_features]; a 3-D input [N, S, in_features] is per token (as
  // nn.Linear over the last dim) -> [N, S, out_features].
  static LayerSpec Linear(int64_t in_features, int64_t out_features);
  static LayerSpec Dropout(float p);
  static LayerSpec Flatten();
  static LayerSpec Add();
  // max(a + b, 0): a residual add with the ReLU that follows it fused (one
  // read of each input and one write forward; backward dA = dB = dY where
  // Y > 0, from the output alone). The same values as Add() then Relu().
  static LayerSpec AddRelu();
  // Token ids [N, S] (fp32 values that are integers in [0, vocab)) ->
  // token_table[id] + position_table[s], [N, S, hidden]; S <= max_positions.
  // As BERT's word and position embeddings (Devlin et al. 2019) without
  // token types; the gradient is scatter-added into the rows used.
  static LayerSpec Embedding(int64_t vocab, int64_t max_positions,
                             int64_t hidden);
  // torch.nn.LayerNorm(hidden, eps): over the last dim of any shape
  // [..., hidden], biased variance, eps added to it.
  static LayerSpec LayerNorm(int64_t hidden, float eps = 1e-5f);
  // torch.nn.functional.gelu's default: x * 0.5 * (1 + erf(x / sqrt(2))).
  static LayerSpec Gelu();
  // torch.nn.MultiheadAttention(hidden, heads, dropout, bias=True,
  // batch_first=True) as self-attention: inputs x [N, S, hidden] and the
  // key padding mask [N, S] (nonzero: that key position is padding and no
  // query attends to it, as key_padding_mask=True); output [N, S, hidden].
  // `dropout` zeroes attention weights in training (inverted, as
  // kDropout).
  static LayerSpec MultiheadAttention(int64_t hidden, int64_t heads,
                                      float dropout);
  // torch.nn.TransformerEncoderLayer(hidden, heads, feedforward, dropout,
  // activation="gelu", batch_first=True, norm_first=False): inputs as
  // MultiheadAttention's; h = norm1(x + dropout(attn(x))), out = norm2(h +
  // dropout(linear2(dropout(gelu(linear1(h)))))) (post-LN, Vaswani et al.
  // 2017), LayerNorm eps 1e-5, `dropout` also inside the attention.
  static LayerSpec TransformerEncoderLayer(int64_t hidden, int64_t heads,
                                           int64_t feedforward, float dropout);
  // BERT's gather_indexes (google-research/bert run_pretraining.py): inputs
  // x [..., hidden] (viewed as R = size / hidden rows) and positions [P]
  // (fp32 values that are integers in [0, R), the flat row index n * S + s
  // of [N, S, hidden]); output [P, hidden], row p = x's row positions[p].
  // The backward scatters dLoss/dOut back (zeros at rows not gathered,
  // sums where a row is gathered twice). The MLM head runs on the
  // predicted positions only.
  static LayerSpec GatherRows(int64_t hidden);
};

// "conv3x3-64", "bn64", "fc512-10", "add+relu", "mha768/12", ...
std::string LayerName(const LayerSpec& spec);
// The type alone, as PyTorch's module names: "conv2d", "batchnorm2d",
// "relu", "maxpool2d", "avgpool2d", "globalavgpool", "linear", "dropout",
// "flatten", "add", "embedding", "layernorm", "gelu",
// "multiheadattention", "transformerencoderlayer", "gatherrows".
std::string LayerTypeName(LayerType type);

// Number of inputs the layer takes (2 for kAdd, kMultiheadAttention,
// kTransformerEncoderLayer and kGatherRows, else 1).
int NumInputs(const LayerSpec& spec);

struct TensorSpec {
  std::string name;  // "weight", "bias", "running_mean", "running_var".
  Shape shape;
};

// Trainable parameters, in PyTorch's order and names: "weight", then
// "bias"; Embedding: "token.weight" [vocab, E], "position.weight"
// [max_positions, E]; MultiheadAttention: "in_proj_weight" [3E, E] (q, k, v
// rows), "in_proj_bias" [3E], "out_proj.weight" [E, E], "out_proj.bias" [E];
// TransformerEncoderLayer: those four prefixed "self_attn.", then
// "linear1.weight" [F, E], "linear1.bias" [F], "linear2.weight" [E, F],
// "linear2.bias" [E], "norm1.weight", "norm1.bias", "norm2.weight",
// "norm2.bias" [E].
std::vector<TensorSpec> ParamSpecs(const LayerSpec& spec);
// Non-trainable buffers (BatchNorm's running mean and variance).
std::vector<TensorSpec> BufferSpecs(const LayerSpec& spec);

// Output shape for the given input shapes. INVALID_ARGUMENT naming the layer
// and the expected shape when they do not fit.
absl::StatusOr<Shape> OutputShape(const LayerSpec& spec,
                                  const std::vector<Shape>& inputs);

// What a layer's Backward() reads besides dLoss/dOut and the layer's own
// state (parameters, saved statistics, dropout masks, pooling workspaces):
// the values of its input and of its output. Every backend keeps to this
// contract (ReLU's backward reads its output alone, as torch's in-place
// ReLU), and the model's memory plan (model.h) reuses the memory of a
// tensor no backward reads once its last forward use is done. A backward
// may still read the shape and layout of any input.
struct BackwardReads {
  bool input = false;
  bool output = false;
};
BackwardReads BackwardReadsOf(const LayerSpec& spec);

// What every backend checks before it builds a transformer layer (kEmbedding,
// kLayerNorm, kGelu, kMultiheadAttention, kTransformerEncoderLayer,
// kGatherRows) with `num_params` parameters: INVALID_ARGUMENT for another
// parameter count than ParamSpecs(spec)'s, heads that do not divide the
// hidden size, or a feed-forward width < 1.
absl::Status CheckTransformerLayer(const LayerSpec& spec, size_t num_params);

// Multiply-accumulates of one forward pass of one sample (FLOPs = 2 x MACs).
// Counts convolutions and linear layers only, as the field's tables do (a
// per-token linear layer S in_features out_features, a linear layer on a
// [R, in_features] sample R in_features out_features);
// attention counts its four projections and its two S x S products
// (4 S E^2 + 2 S^2 E for input [N, S, E]), the encoder layer adds its
// feed-forward (2 S E F).
int64_t ForwardMacsPerSample(const LayerSpec& spec, const Shape& input);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_LAYER_SPEC_H_
