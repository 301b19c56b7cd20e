// The model zoo's architectures (model.h's list): a ModelBuilder appends
// each architecture's layers to a new Model and draws its initial weights.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "models/dropout_mask.h"
#include "models/model.h"
#include "models/model_internal.h"

namespace pstrain {
namespace {

using model_internal::kBertMaxPositions;
using model_internal::kHeadPositions;
using model_internal::kInput;
using model_internal::kPaddingMask;

enum class Init {
  kDefault,        // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  kKaimingFanOut,  // N(0, 2 / (out * k * k)), bias 0 (torchvision ResNet).
  kNormal001,      // N(0, 0.01), bias 0 (torchvision VGG's linear layers).
  kBert,           // N(0, 0.02), biases 0, LayerNorm 1 and 0 (BERT's).
};

// A parameter of a new node that is an earlier node's: `param` of the new
// layer reads `owner_param` of node `owner`.
struct Tie {
  std::string param;
  int owner;
  std::string owner_param;
};

}  // namespace

// Appends layers to a model under construction, tracking shapes for a batch
// of 1 and drawing initial weights on the host.
class ModelBuilder {
 public:
  ModelBuilder(Model* model, const ModelOptions& options)
      : model_(model),
        rng_(options.seed),
        dropout_seed_(options.dropout_seed),
        fuse_add_relu_(options.fuse_add_relu) {}

  // Adds `spec` named `name` on `inputs` (default: the last node). Returns
  // the node index; errors are kept and returned by status().
  int Add(const std::string& name, const LayerSpec& spec,
          std::vector<int> inputs = {}, Init init = Init::kDefault,
          const std::vector<Tie>& ties = {}) {
    if (!status_.ok()) return last_;
    if (inputs.empty()) inputs = {last_};
    std::vector<Shape> in_shapes;
    for (int i : inputs) in_shapes.push_back(shape(i));
    absl::StatusOr<Shape> out = OutputShape(spec, in_shapes);
    if (!out.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          model_->name_, ": layer ", name, ": ", out.status().message()));
      return last_;
    }
    auto node = std::make_unique<Model::Node>();
    node->name = name;
    node->spec = spec;
    node->inputs = inputs;
    node->sample_shape = *out;
    Backend* backend = model_->backend_;
    node->out = DeviceTensor(backend);
    node->grad = DeviceTensor(backend);
    node->accum = DeviceTensor(backend);
    const std::vector<TensorSpec> param_specs = ParamSpecs(spec);
    const std::vector<TensorSpec> buffer_specs = BufferSpecs(spec);
    node->params.resize(param_specs.size() - ties.size());
    node->tied.resize(ties.size());
    node->buffers.resize(buffer_specs.size());
    std::vector<Param*> params;
    std::vector<Buffer*> buffers;
    size_t owned = 0, tied = 0;
    for (size_t i = 0; i < param_specs.size(); ++i) {
      auto tie = std::find_if(ties.begin(), ties.end(), [&](const Tie& t) {
        return t.param == param_specs[i].name;
      });
      if (tie != ties.end()) {
        Param& p = node->tied[tied++];
        if (!TieTo(*tie, param_specs[i], &p)) return last_;
        params.push_back(&p);
        continue;
      }
      if (owned == node->params.size()) {
        Check(absl::InternalError(absl::StrCat(
            name, ": a tie names no ", "parameter of ", LayerName(spec))));
        return last_;
      }
      Param& p = node->params[owned++];
      p.name = absl::StrCat(name, ".", param_specs[i].name);
      p.value = DeviceTensor(backend);
      p.grad = DeviceTensor(backend);
      if (!Check(p.value.Resize(param_specs[i].shape)) ||
          !Check(p.grad.Resize(param_specs[i].shape))) {
        return last_;
      }
      std::vector<float> host(p.value.size());
      Initialise(spec, init, param_specs[i].name, &host);
      if (!Check(backend->CopyToDevice(host.data(), host.size(),
                                       p.value.data()))) {
        return last_;
      }
      params.push_back(&p);
    }
    for (size_t i = 0; i < buffer_specs.size(); ++i) {
      Buffer& b = node->buffers[i];
      b.name = absl::StrCat(name, ".", buffer_specs[i].name);
      b.value = DeviceTensor(backend);
      if (!Check(b.value.Resize(buffer_specs[i].shape))) return last_;
      // running_mean 0, running_var 1.
      std::vector<float> host(b.value.size(),
                              buffer_specs[i].name == "running_var" ? 1 : 0);
      if (!Check(backend->CopyToDevice(host.data(), host.size(),
                                       b.value.data())) ||
          !Check(backend->Synchronize())) {
        return last_;
      }
      buffers.push_back(&b);
    }
    if (!Check(backend->Synchronize())) return last_;
    // Mixed, not added: with seed * stride + node, worker w's call c
    // (workers' dropout seeds differ by 1) drew worker 0's call c + w mask.
    const uint64_t seed =
        SplitMix64(dropout_seed_ ^ SplitMix64(model_->nodes_.size()));
    absl::StatusOr<std::unique_ptr<Layer>> layer =
        backend->CreateLayer(spec, std::move(params), std::move(buffers), seed);
    if (!Check(layer.status())) return last_;
    node->layer = *std::move(layer);
    model_->nodes_.push_back(std::move(node));
    last_ = static_cast<int>(model_->nodes_.size()) - 1;
    return last_;
  }

  Shape shape(int node) const {
    // A batch of 1's head positions: every one of its S.
    if (node == kHeadPositions) return {model_->input_chw_[0]};
    if (node < 0) return model_->InputSampleShape();
    return model_->nodes_[node]->sample_shape;
  }
  int last() const { return last_; }
  bool fuse_add_relu() const { return fuse_add_relu_; }
  const absl::Status& status() const { return status_; }

 private:
  bool Check(const absl::Status& status) {
    if (!status.ok() && status_.ok()) status_ = status;
    return status.ok();
  }

  // Makes `p` (spec `spec` of the node being added) read `tie`'s owner
  // parameter: a view of its value, a gradient of its own that the owner's
  // backward adds in.
  bool TieTo(const Tie& tie, const TensorSpec& spec, Param* p) {
    Param* owner = nullptr;
    if (tie.owner >= 0 && tie.owner < static_cast<int>(model_->nodes_.size())) {
      Model::Node& node = *model_->nodes_[tie.owner];
      for (Param& q : node.params) {
        if (q.name == absl::StrCat(node.name, ".", tie.owner_param)) owner = &q;
      }
    }
    if (owner == nullptr || owner->value.shape() != spec.shape) {
      Check(absl::InternalError(absl::StrCat(
          "tie of ", spec.name, " ", ShapeToString(spec.shape), " to node ",
          tie.owner, "'s ", tie.owner_param, ": no such parameter or shape")));
      return false;
    }
    Backend* backend = model_->backend_;
    p->name = owner->name;
    p->value = DeviceTensor(backend);
    p->value.SetView(owner->value.data(), owner->value.size());
    p->grad = DeviceTensor(backend);
    if (!Check(p->value.Resize(spec.shape)) ||
        !Check(p->grad.Resize(spec.shape))) {
      return false;
    }
    model_->nodes_[tie.owner]->tied_grads.emplace_back(p, owner);
    return true;
  }

  void Initialise(const LayerSpec& spec, Init init, const std::string& what,
                  std::vector<float>* values) {
    if (spec.type == LayerType::kBatchNorm2d) {
      std::fill(values->begin(), values->end(), what == "weight" ? 1.0f : 0.0f);
      return;
    }
    if (init == Init::kBert) {
      // "weight"/"bias" of a LayerNorm, "norm1.weight" of an encoder block.
      const bool norm =
          spec.type == LayerType::kLayerNorm || absl::StartsWith(what, "norm");
      if (absl::EndsWith(what, "bias") || norm) {
        const bool one = norm && absl::EndsWith(what, "weight");
        std::fill(values->begin(), values->end(), one ? 1.0f : 0.0f);
        return;
      }
      std::normal_distribution<float> dist(0.0f, 0.02f);
      for (float& x : *values) x = dist(rng_);
      return;
    }
    const bool bias = what == "bias";
    if (init == Init::kKaimingFanOut || init == Init::kNormal001) {
      if (bias) {
        std::fill(values->begin(), values->end(), 0.0f);
        return;
      }
      const double fan_out = spec.type == LayerType::kConv2d
                                 ? spec.out_channels * spec.kernel * spec.kernel
                                 : spec.out_channels;
      const float stddev = init == Init::kNormal001
                               ? 0.01f
                               : static_cast<float>(std::sqrt(2.0 / fan_out));
      std::normal_distribution<float> dist(0.0f, stddev);
      for (float& x : *values) x = dist(rng_);
      return;
    }
    const double fan_in = spec.type == LayerType::kConv2d
                              ? spec.in_channels * spec.kernel * spec.kernel
                              : spec.in_channels;
    const float bound = static_cast<float>(1.0 / std::sqrt(fan_in));
    std::uniform_real_distribution<float> dist(-bound, bound);
    for (float& x : *values) x = dist(rng_);
  }

  Model* model_;
  std::mt19937_64 rng_;
  const uint64_t dropout_seed_;
  const bool fuse_add_relu_;
  int last_ = kInput;
  absl::Status status_;
};

namespace {

void BuildMlp(ModelBuilder& b, int num_classes) {
  b.Add("flatten", LayerSpec::Flatten());
  const int64_t features = b.shape(b.last())[1];
  b.Add("fc1", LayerSpec::Linear(features, 256));
  b.Add("relu1", LayerSpec::Relu());
  b.Add("fc2", LayerSpec::Linear(256, 128));
  b.Add("relu2", LayerSpec::Relu());
  b.Add("fc3", LayerSpec::Linear(128, num_classes));
}

void BuildLenet5(ModelBuilder& b, int64_t channels, int num_classes) {
  b.Add("conv1", LayerSpec::Conv2d(channels, 6, 5, 1, 2, true));
  b.Add("relu1", LayerSpec::Relu());
  b.Add("pool1", LayerSpec::MaxPool2d(2, 2, 0));
  b.Add("conv2", LayerSpec::Conv2d(6, 16, 5, 1, 0, true));
  b.Add("relu2", LayerSpec::Relu());
  b.Add("pool2", LayerSpec::MaxPool2d(2, 2, 0));
  b.Add("flatten", LayerSpec::Flatten());
  b.Add("fc1", LayerSpec::Linear(b.shape(b.last())[1], 120));
  b.Add("relu3", LayerSpec::Relu());
  b.Add("fc2", LayerSpec::Linear(120, 84));
  b.Add("relu4", LayerSpec::Relu());
  b.Add("fc3", LayerSpec::Linear(84, num_classes));
}

void BuildAlexnet(ModelBuilder& b, int64_t channels, int64_t size,
                  int num_classes) {
  const bool imagenet = size > 64;
  const LayerSpec pool =
      imagenet ? LayerSpec::MaxPool2d(3, 2, 0) : LayerSpec::MaxPool2d(2, 2, 0);
  b.Add("features.0", imagenet
                          ? LayerSpec::Conv2d(channels, 64, 11, 4, 2, true)
                          : LayerSpec::Conv2d(channels, 64, 3, 1, 1, true));
  b.Add("features.1", LayerSpec::Relu());
  b.Add("features.2", pool);
  b.Add("features.3", LayerSpec::Conv2d(64, 192, 5, 1, 2, true));
  b.Add("features.4", LayerSpec::Relu());
  b.Add("features.5", pool);
  b.Add("features.6", LayerSpec::Conv2d(192, 384, 3, 1, 1, true));
  b.Add("features.7", LayerSpec::Relu());
  b.Add("features.8", LayerSpec::Conv2d(384, 256, 3, 1, 1, true));
  b.Add("features.9", LayerSpec::Relu());
  b.Add("features.10", LayerSpec::Conv2d(256, 256, 3, 1, 1, true));
  b.Add("features.11", LayerSpec::Relu());
  b.Add("features.12", pool);
  b.Add("flatten", LayerSpec::Flatten());
  b.Add("classifier.0", LayerSpec::Dropout(0.5f));
  b.Add("classifier.1", LayerSpec::Linear(b.shape(b.last())[1], 4096));
  b.Add("classifier.2", LayerSpec::Relu());
  b.Add("classifier.3", LayerSpec::Dropout(0.5f));
  b.Add("classifier.4", LayerSpec::Linear(4096, 4096));
  b.Add("classifier.5", LayerSpec::Relu());
  b.Add("classifier.6", LayerSpec::Linear(4096, num_classes));
}

void BuildVgg16(ModelBuilder& b, int64_t channels, int num_classes) {
  const int kPool = 0;
  const int config[] = {64,    64,  kPool, 128, 128,   kPool, 256, 256, 256,
                        kPool, 512, 512,   512, kPool, 512,   512, 512, kPool};
  int64_t in = channels;
  int index = 0;
  for (int c : config) {
    if (c == kPool) {
      if (b.shape(b.last())[2] >= 2) {
        b.Add(absl::StrCat("features.", index), LayerSpec::MaxPool2d(2, 2, 0));
      }
      ++index;
      continue;
    }
    b.Add(absl::StrCat("features.", index++),
          LayerSpec::Conv2d(in, c, 3, 1, 1, true), {}, Init::kKaimingFanOut);
    b.Add(absl::StrCat("features.", index++), LayerSpec::Relu());
    in = c;
  }
  b.Add("flatten", LayerSpec::Flatten());
  b.Add("classifier.0", LayerSpec::Linear(b.shape(b.last())[1], 4096), {},
        Init::kNormal001);
  b.Add("classifier.1", LayerSpec::Relu());
  b.Add("classifier.2", LayerSpec::Dropout(0.5f));
  b.Add("classifier.3", LayerSpec::Linear(4096, 4096), {}, Init::kNormal001);
  b.Add("classifier.4", LayerSpec::Relu());
  b.Add("classifier.5", LayerSpec::Dropout(0.5f));
  b.Add("classifier.6", LayerSpec::Linear(4096, num_classes), {},
        Init::kNormal001);
}

// conv (no bias, Kaiming) then BatchNorm.
int ConvBn(ModelBuilder& b, const std::string& conv, const std::string& bn,
           int input, int64_t in, int64_t out, int64_t k, int64_t stride) {
  b.Add(conv, LayerSpec::Conv2d(in, out, k, stride, k / 2, false), {input},
        Init::kKaimingFanOut);
  return b.Add(bn, LayerSpec::BatchNorm2d(out));
}

void BuildResnet(ModelBuilder& b, int64_t channels, int64_t size,
                 const std::vector<int>& blocks, bool bottleneck,
                 int num_classes) {
  const int64_t expansion = bottleneck ? 4 : 1;
  if (size > 64) {
    ConvBn(b, "conv1", "bn1", kInput, channels, 64, 7, 2);
  } else {
    ConvBn(b, "conv1", "bn1", kInput, channels, 64, 3, 1);
  }
  b.Add("relu", LayerSpec::Relu());
  if (size > 32) b.Add("maxpool", LayerSpec::MaxPool2d(3, 2, 1));
  int64_t in = 64;
  const int64_t planes_of_stage[] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = planes_of_stage[stage];
    for (int i = 0; i < blocks[stage]; ++i) {
      const std::string p = absl::StrCat("layer", stage + 1, ".", i, ".");
      const int64_t stride = (i == 0 && stage > 0) ? 2 : 1;
      const int block_input = b.last();
      int x;
      if (bottleneck) {
        x = ConvBn(b, p + "conv1", p + "bn1", block_input, in, planes, 1, 1);
        x = b.Add(p + "relu1", LayerSpec::Relu());
        x = ConvBn(b, p + "conv2", p + "bn2", x, planes, planes, 3, stride);
        x = b.Add(p + "relu2", LayerSpec::Relu());
        x = ConvBn(b, p + "conv3", p + "bn3", x, planes, planes * expansion, 1,
                   1);
      } else {
        x = ConvBn(b, p + "conv1", p + "bn1", block_input, in, planes, 3,
                   stride);
        x = b.Add(p + "relu1", LayerSpec::Relu());
        x = ConvBn(b, p + "conv2", p + "bn2", x, planes, planes, 3, 1);
      }
      int shortcut = block_input;
      if (stride != 1 || in != planes * expansion) {
        shortcut = ConvBn(b, p + "downsample.0", p + "downsample.1",
                          block_input, in, planes * expansion, 1, stride);
      }
      if (b.fuse_add_relu()) {
        b.Add(p + "add", LayerSpec::AddRelu(), {x, shortcut});
      } else {
        b.Add(p + "add", LayerSpec::Add(), {x, shortcut});
        b.Add(p + "relu", LayerSpec::Relu());
      }
      in = planes * expansion;
    }
  }
  b.Add("avgpool", LayerSpec::GlobalAvgPool());
  b.Add("flatten", LayerSpec::Flatten());
  b.Add("fc", LayerSpec::Linear(in, num_classes));
}

struct BertConfig {
  int layers;
  int64_t hidden;
  int64_t heads;
  int64_t feedforward;
};

// model.h's sequence zoo: embeddings, L post-LN encoder blocks with the
// padding mask, and the MLM head tied to the token embedding (`untied`:
// with its own decoder weight).
void BuildBert(ModelBuilder& b, const BertConfig& c, int64_t vocab,
               float dropout, bool untied = false) {
  const int embeddings = b.Add(
      "embeddings", LayerSpec::Embedding(vocab, kBertMaxPositions, c.hidden),
      {kInput}, Init::kBert);
  b.Add("embeddings.norm", LayerSpec::LayerNorm(c.hidden), {}, Init::kBert);
  if (dropout > 0) b.Add("embeddings.dropout", LayerSpec::Dropout(dropout));
  for (int i = 0; i < c.layers; ++i) {
    b.Add(absl::StrCat("layers.", i),
          LayerSpec::TransformerEncoderLayer(c.hidden, c.heads, c.feedforward,
                                             dropout),
          {b.last(), kPaddingMask}, Init::kBert);
  }
  b.Add("head.gather", LayerSpec::GatherRows(c.hidden),
        {b.last(), kHeadPositions});
  b.Add("head.dense", LayerSpec::Linear(c.hidden, c.hidden), {}, Init::kBert);
  b.Add("head.gelu", LayerSpec::Gelu());
  b.Add("head.norm", LayerSpec::LayerNorm(c.hidden), {}, Init::kBert);
  if (untied) {
    b.Add("head.decoder", LayerSpec::Linear(c.hidden, vocab), {}, Init::kBert);
    return;
  }
  b.Add("head.decoder", LayerSpec::Linear(c.hidden, vocab), {}, Init::kBert,
        {{"weight", embeddings, "token.weight"}});
}

}  // namespace

namespace model_internal {

absl::Status BuildArchitecture(const std::string& name, const Shape& input_chw,
                               int num_classes, const ModelOptions& options,
                               Model* model) {
  const bool sequence = IsSequenceModel(name);
  ModelBuilder b(model, options);
  const int64_t c = input_chw[0];
  const int64_t size = sequence ? 0 : std::min(input_chw[1], input_chw[2]);
  if (name == "mlp") {
    BuildMlp(b, num_classes);
  } else if (name == "lenet5") {
    BuildLenet5(b, c, num_classes);
  } else if (name == "alexnet") {
    BuildAlexnet(b, c, size, num_classes);
  } else if (name == "vgg16") {
    BuildVgg16(b, c, num_classes);
  } else if (name == "resnet18") {
    BuildResnet(b, c, size, {2, 2, 2, 2}, false, num_classes);
  } else if (name == "resnet34") {
    BuildResnet(b, c, size, {3, 4, 6, 3}, false, num_classes);
  } else if (name == "resnet50") {
    BuildResnet(b, c, size, {3, 4, 6, 3}, true, num_classes);
  } else if (name == "resnet101") {
    BuildResnet(b, c, size, {3, 4, 23, 3}, true, num_classes);
  } else if (name == "bert_tiny") {
    BuildBert(b, {2, 128, 2, 512}, num_classes, options.transformer_dropout);
  } else if (name == "bert_base") {
    BuildBert(b, {12, 768, 12, 3072}, num_classes, options.transformer_dropout);
  } else if (name == "bert_tiny_untied") {
    BuildBert(b, {2, 128, 2, 512}, num_classes, options.transformer_dropout,
              /*untied=*/true);
  } else if (name == "bert_base_untied") {
    BuildBert(b, {12, 768, 12, 3072}, num_classes, options.transformer_dropout,
              /*untied=*/true);
  } else {
    return absl::InternalError(absl::StrCat(
        "model \"", name, "\" is in catalog/catalog.h but has no builder"));
  }
  return b.status();
}

}  // namespace model_internal
}  // namespace pstrain
