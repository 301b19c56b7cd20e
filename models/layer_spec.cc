#include "models/layer_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pstrain {

LayerSpec LayerSpec::Conv2d(int64_t in, int64_t out, int64_t kernel,
                            int64_t stride, int64_t padding, bool bias) {
  LayerSpec s;
  s.type = LayerType::kConv2d;
  s.in_channels = in;
  s.out_channels = out;
  s.kernel = kernel;
  s.stride = stride;
  s.padding = padding;
  s.bias = bias;
  return s;
}

LayerSpec LayerSpec::BatchNorm2d(int64_t channels) {
  LayerSpec s;
  s.type = LayerType::kBatchNorm2d;
  s.in_channels = s.out_channels = channels;
  return s;
}

LayerSpec LayerSpec::Relu() { return LayerSpec(); }

LayerSpec LayerSpec::MaxPool2d(int64_t kernel, int64_t stride,
                               int64_t padding) {
  LayerSpec s;
  s.type = LayerType::kMaxPool2d;
  s.kernel = kernel;
  s.stride = stride;
  s.padding = padding;
  return s;
}

LayerSpec LayerSpec::AvgPool2d(int64_t kernel, int64_t stride,
                               int64_t padding) {
  LayerSpec s = MaxPool2d(kernel, stride, padding);
  s.type = LayerType::kAvgPool2d;
  return s;
}

LayerSpec LayerSpec::GlobalAvgPool() {
  LayerSpec s;
  s.type = LayerType::kGlobalAvgPool;
  return s;
}

LayerSpec LayerSpec::Linear(int64_t in_features, int64_t out_features) {
  LayerSpec s;
  s.type = LayerType::kLinear;
  s.in_channels = in_features;
  s.out_channels = out_features;
  return s;
}

LayerSpec LayerSpec::Dropout(float p) {
  LayerSpec s;
  s.type = LayerType::kDropout;
  s.dropout = p;
  return s;
}

LayerSpec LayerSpec::Flatten() {
  LayerSpec s;
  s.type = LayerType::kFlatten;
  return s;
}

LayerSpec LayerSpec::Add() {
  LayerSpec s;
  s.type = LayerType::kAdd;
  return s;
}

LayerSpec LayerSpec::AddRelu() {
  LayerSpec s = Add();
  s.relu = true;
  return s;
}

LayerSpec LayerSpec::Embedding(int64_t vocab, int64_t max_positions,
                               int64_t hidden) {
  LayerSpec s;
  s.type = LayerType::kEmbedding;
  s.in_channels = vocab;
  s.out_channels = hidden;
  s.max_positions = max_positions;
  return s;
}

LayerSpec LayerSpec::LayerNorm(int64_t hidden, float eps) {
  LayerSpec s;
  s.type = LayerType::kLayerNorm;
  s.in_channels = s.out_channels = hidden;
  s.epsilon = eps;
  return s;
}

LayerSpec LayerSpec::Gelu() {
  LayerSpec s;
  s.type = LayerType::kGelu;
  return s;
}

LayerSpec LayerSpec::MultiheadAttention(int64_t hidden, int64_t heads,
                                        float dropout) {
  LayerSpec s;
  s.type = LayerType::kMultiheadAttention;
  s.in_channels = s.out_channels = hidden;
  s.heads = heads;
  s.dropout = dropout;
  return s;
}

LayerSpec LayerSpec::TransformerEncoderLayer(int64_t hidden, int64_t heads,
                                             int64_t feedforward,
                                             float dropout) {
  LayerSpec s = MultiheadAttention(hidden, heads, dropout);
  s.type = LayerType::kTransformerEncoderLayer;
  s.feedforward = feedforward;
  return s;
}

LayerSpec LayerSpec::GatherRows(int64_t hidden) {
  LayerSpec s;
  s.type = LayerType::kGatherRows;
  s.in_channels = s.out_channels = hidden;
  return s;
}

std::string LayerName(const LayerSpec& s) {
  switch (s.type) {
    case LayerType::kConv2d:
      return absl::StrCat("conv", s.kernel, "x", s.kernel, "-", s.out_channels,
                          s.stride > 1 ? absl::StrCat("/", s.stride) : "");
    case LayerType::kBatchNorm2d:
      return absl::StrCat("bn", s.in_channels);
    case LayerType::kRelu:
      return "relu";
    case LayerType::kMaxPool2d:
      return absl::StrCat("maxpool", s.kernel);
    case LayerType::kAvgPool2d:
      return absl::StrCat("avgpool", s.kernel);
    case LayerType::kGlobalAvgPool:
      return "globalavgpool";
    case LayerType::kLinear:
      return absl::StrCat("fc", s.in_channels, "-", s.out_channels);
    case LayerType::kDropout:
      return absl::StrCat("dropout", s.dropout);
    case LayerType::kFlatten:
      return "flatten";
    case LayerType::kAdd:
      return s.relu ? "add+relu" : "add";
    case LayerType::kEmbedding:
      return absl::StrCat("embedding", s.in_channels, "x", s.out_channels,
                          "+pos", s.max_positions);
    case LayerType::kLayerNorm:
      return absl::StrCat("layernorm", s.in_channels);
    case LayerType::kGelu:
      return "gelu";
    case LayerType::kMultiheadAttention:
      return absl::StrCat("mha", s.in_channels, "/", s.heads);
    case LayerType::kTransformerEncoderLayer:
      return absl::StrCat("encoder", s.in_channels, "/", s.heads, "-",
                          s.feedforward);
    case LayerType::kGatherRows:
      return absl::StrCat("gather", s.in_channels);
  }
  return "?";
}

std::string LayerTypeName(LayerType type) {
  switch (type) {
    case LayerType::kConv2d:
      return "conv2d";
    case LayerType::kBatchNorm2d:
      return "batchnorm2d";
    case LayerType::kRelu:
      return "relu";
    case LayerType::kMaxPool2d:
      return "maxpool2d";
    case LayerType::kAvgPool2d:
      return "avgpool2d";
    case LayerType::kGlobalAvgPool:
      return "globalavgpool";
    case LayerType::kLinear:
      return "linear";
    case LayerType::kDropout:
      return "dropout";
    case LayerType::kFlatten:
      return "flatten";
    case LayerType::kAdd:
      return "add";
    case LayerType::kEmbedding:
      return "embedding";
    case LayerType::kLayerNorm:
      return "layernorm";
    case LayerType::kGelu:
      return "gelu";
    case LayerType::kMultiheadAttention:
      return "multiheadattention";
    case LayerType::kTransformerEncoderLayer:
      return "transformerencoderlayer";
    case LayerType::kGatherRows:
      return "gatherrows";
  }
  return "?";
}

int NumInputs(const LayerSpec& spec) {
  switch (spec.type) {
    case LayerType::kAdd:
    case LayerType::kMultiheadAttention:
    case LayerType::kTransformerEncoderLayer:
    case LayerType::kGatherRows:
      return 2;
    default:
      return 1;
  }
}

std::vector<TensorSpec> ParamSpecs(const LayerSpec& s) {
  switch (s.type) {
    case LayerType::kConv2d: {
      std::vector<TensorSpec> p = {
          {"weight", {s.out_channels, s.in_channels, s.kernel, s.kernel}}};
      if (s.bias) p.push_back({"bias", {s.out_channels}});
      return p;
    }
    case LayerType::kLinear:
      return {{"weight", {s.out_channels, s.in_channels}},
              {"bias", {s.out_channels}}};
    case LayerType::kBatchNorm2d:
    case LayerType::kLayerNorm:
      return {{"weight", {s.in_channels}}, {"bias", {s.in_channels}}};
    case LayerType::kEmbedding:
      return {{"token.weight", {s.in_channels, s.out_channels}},
              {"position.weight", {s.max_positions, s.out_channels}}};
    case LayerType::kMultiheadAttention:
      return {{"in_proj_weight", {3 * s.in_channels, s.in_channels}},
              {"in_proj_bias", {3 * s.in_channels}},
              {"out_proj.weight", {s.in_channels, s.in_channels}},
              {"out_proj.bias", {s.in_channels}}};
    case LayerType::kTransformerEncoderLayer: {
      LayerSpec attention = s;
      attention.type = LayerType::kMultiheadAttention;
      std::vector<TensorSpec> p = ParamSpecs(attention);
      for (TensorSpec& t : p) t.name = "self_attn." + t.name;
      const int64_t e = s.in_channels, f = s.feedforward;
      p.insert(p.end(), {{"linear1.weight", {f, e}},
                         {"linear1.bias", {f}},
                         {"linear2.weight", {e, f}},
                         {"linear2.bias", {e}},
                         {"norm1.weight", {e}},
                         {"norm1.bias", {e}},
                         {"norm2.weight", {e}},
                         {"norm2.bias", {e}}});
      return p;
    }
    default:
      return {};
  }
}

std::vector<TensorSpec> BufferSpecs(const LayerSpec& s) {
  if (s.type != LayerType::kBatchNorm2d) return {};
  return {{"running_mean", {s.in_channels}}, {"running_var", {s.in_channels}}};
}

namespace {

absl::Status BadInput(const LayerSpec& s, const Shape& in,
                      absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      LayerName(s), ": input ", ShapeToString(in), "; expected ", expected));
}

absl::StatusOr<Shape> WindowOutput(const LayerSpec& s, const Shape& in,
                                   int64_t channels) {
  if (in.size() != 4 || (channels > 0 && in[1] != channels)) {
    return BadInput(s, in,
                    channels > 0 ? absl::StrCat("[N, ", channels, ", H, W]")
                                 : "[N, C, H, W]");
  }
  const int64_t oh = (in[2] + 2 * s.padding - s.kernel) / s.stride + 1;
  const int64_t ow = (in[3] + 2 * s.padding - s.kernel) / s.stride + 1;
  if (in[2] + 2 * s.padding < s.kernel || in[3] + 2 * s.padding < s.kernel ||
      oh <= 0 || ow <= 0) {
    return BadInput(s, in,
                    absl::StrCat("H, W >= ", s.kernel - 2 * s.padding,
                                 " (the window with its padding)"));
  }
  return Shape{in[0], channels > 0 ? channels : in[1], oh, ow};
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const LayerSpec& s,
                                  const std::vector<Shape>& inputs) {
  if (static_cast<int>(inputs.size()) != NumInputs(s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        LayerName(s), ": ", inputs.size(), " inputs; expected ", NumInputs(s)));
  }
  const Shape& in = inputs[0];
  switch (s.type) {
    case LayerType::kConv2d: {
      absl::StatusOr<Shape> out = WindowOutput(s, in, s.in_channels);
      if (!out.ok()) return out.status();
      (*out)[1] = s.out_channels;
      return out;
    }
    case LayerType::kMaxPool2d:
    case LayerType::kAvgPool2d:
      return WindowOutput(s, in, 0);
    case LayerType::kBatchNorm2d:
      if (in.size() != 4 || in[1] != s.in_channels) {
        return BadInput(s, in, absl::StrCat("[N, ", s.in_channels, ", H, W]"));
      }
      return in;
    case LayerType::kGlobalAvgPool:
      if (in.size() != 4) return BadInput(s, in, "[N, C, H, W]");
      return Shape{in[0], in[1], 1, 1};
    case LayerType::kLinear:
      if (in.size() == 3 && in[2] == s.in_channels) {
        return Shape{in[0], in[1], s.out_channels};
      }
      if (in.empty() || in[0] <= 0 ||
          NumElements(in) != in[0] * s.in_channels) {
        return BadInput(s, in,
                        absl::StrCat("[N, ", s.in_channels, "] (",
                                     s.in_channels, " features per sample)"));
      }
      return Shape{in[0], s.out_channels};
    case LayerType::kFlatten:
      if (in.empty() || in[0] <= 0) return BadInput(s, in, "a batch axis");
      return Shape{in[0], NumElements(in) / in[0]};
    case LayerType::kAdd:
      if (inputs[0] != inputs[1]) {
        return BadInput(s, inputs[1],
                        absl::StrCat(ShapeToString(inputs[0]),
                                     " (both inputs of one shape)"));
      }
      return in;
    case LayerType::kRelu:
    case LayerType::kDropout:
    case LayerType::kGelu:
      return in;
    case LayerType::kLayerNorm:
      if (in.empty() || in.back() != s.in_channels) {
        return BadInput(s, in, absl::StrCat("[..., ", s.in_channels, "]"));
      }
      return in;
    case LayerType::kEmbedding:
      if (in.size() != 2 || in[1] < 1 || in[1] > s.max_positions) {
        return BadInput(s, in,
                        absl::StrCat("token ids [N, S] with 1 <= S <= ",
                                     s.max_positions, " (max_positions)"));
      }
      return Shape{in[0], in[1], s.out_channels};
    case LayerType::kMultiheadAttention:
    case LayerType::kTransformerEncoderLayer:
      if (s.type == LayerType::kTransformerEncoderLayer && s.feedforward < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(s), ": feedforward ", s.feedforward, "; expected >= 1"));
      }
      if (s.heads < 1 || s.in_channels % s.heads != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(s), ": hidden ", s.in_channels,
                         " is not a multiple of heads ", s.heads));
      }
      if (in.size() != 3 || in[2] != s.in_channels) {
        return BadInput(s, in, absl::StrCat("[N, S, ", s.in_channels, "]"));
      }
      if (inputs[1] != Shape{in[0], in[1]}) {
        return BadInput(s, inputs[1],
                        absl::StrCat("the key padding mask [", in[0], ", ",
                                     in[1], "] as the second input"));
      }
      return in;
    case LayerType::kGatherRows:
      if (in.empty() || in.back() != s.in_channels) {
        return BadInput(s, in, absl::StrCat("[..., ", s.in_channels, "]"));
      }
      if (inputs[1].size() != 1 || inputs[1][0] < 1) {
        return BadInput(s, inputs[1], "positions [P] with P >= 1");
      }
      return Shape{inputs[1][0], s.in_channels};
  }
  return absl::InternalError("unknown layer type");
}

int64_t ForwardMacsPerSample(const LayerSpec& s, const Shape& input) {
  switch (s.type) {
    case LayerType::kConv2d: {
      absl::StatusOr<Shape> out = OutputShape(s, {input});
      if (!out.ok()) return 0;
      return (*out)[1] * (*out)[2] * (*out)[3] * s.in_channels * s.kernel *
             s.kernel;
    }
    case LayerType::kLinear: {
      // A sample's tokens [1, S, in], or its rows [R, in] (the MLM head's
      // gathered positions), or one row [1, ...].
      const bool per_token = input.size() == 3 && input[2] == s.in_channels;
      const bool rows = input.size() == 2 && input[1] == s.in_channels;
      return (per_token ? input[1]
              : rows    ? input[0]
                        : 1) *
             s.in_channels * s.out_channels;
    }
    case LayerType::kMultiheadAttention: {
      if (input.size() != 3) return 0;
      const int64_t seq = input[1], e = s.in_channels;
      return 4 * seq * e * e + 2 * seq * seq * e;
    }
    case LayerType::kTransformerEncoderLayer: {
      if (input.size() != 3) return 0;
      LayerSpec attention = s;
      attention.type = LayerType::kMultiheadAttention;
      return ForwardMacsPerSample(attention, input) +
             2 * input[1] * s.in_channels * s.feedforward;
    }
    default:
      return 0;
  }
}

BackwardReads BackwardReadsOf(const LayerSpec& spec) {
  switch (spec.type) {
    case LayerType::kConv2d:       // dW from x.
    case LayerType::kBatchNorm2d:  // x with the saved mean and variance.
    case LayerType::kLinear:       // dW from x.
      return {true, false};
    case LayerType::kRelu:  // dx = dy where y > 0.
      return {false, true};
    case LayerType::kMaxPool2d:  // cuDNN finds the maximum from x and y.
      return {true, true};
    case LayerType::kAvgPool2d:
    case LayerType::kGlobalAvgPool:
    case LayerType::kDropout:  // The mask.
    case LayerType::kFlatten:
    case LayerType::kGatherRows:  // The positions (a model input).
      return {false, false};
    case LayerType::kAdd:  // With the ReLU: dA = dB = dY where Y > 0.
      return {false, spec.relu};
    case LayerType::kEmbedding:           // The ids: rows the gradient goes to.
    case LayerType::kLayerNorm:           // x with the saved mean and variance.
    case LayerType::kGelu:                // dx = dy (Phi(x) + x phi(x)).
    case LayerType::kMultiheadAttention:  // dW_in from x; the rest saved.
    case LayerType::kTransformerEncoderLayer:  // As attention.
      return {true, false};
  }
  return {true, true};
}

absl::Status CheckTransformerLayer(const LayerSpec& spec, size_t num_params) {
  if (num_params != ParamSpecs(spec).size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(LayerName(spec), ": ", num_params,
                     " parameters; expected ", ParamSpecs(spec).size()));
  }
  if (spec.type == LayerType::kMultiheadAttention &&
      (spec.heads < 1 || spec.in_channels % spec.heads != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(LayerName(spec), ": hidden ", spec.in_channels,
                     " is not a multiple of heads ", spec.heads));
  }
  if (spec.type == LayerType::kTransformerEncoderLayer &&
      (spec.heads < 1 || spec.in_channels % spec.heads != 0 ||
       spec.feedforward < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(LayerName(spec), ": hidden ", spec.in_channels,
                     " not a multiple of heads ", spec.heads,
                     " or feedforward ", spec.feedforward, " < 1"));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
