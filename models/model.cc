#include "models/model.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const std::string& name,
                                                     const Shape& input_chw,
                                                     int num_classes,
                                                     uint64_t seed) {
  if (input_chw.size() != 3 || NumElements(input_chw) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model input ", ShapeToString(input_chw),
                     "; expected [C, H, W] with positive sizes"));
  }
  if (num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes ", num_classes, "; expected >= 2"));
  }
  std::unique_ptr<Model> model(new Model());
  model->name_ = name;
  model->input_chw_ = input_chw;
  std::mt19937_64 rng(seed);
  auto& layers = model->layers_;
  const int64_t c = input_chw[0];
  if (name == "mlp") {
    layers.push_back(MakeFlatten());
    layers.push_back(MakeLinear(NumElements(input_chw), 256, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeLinear(256, 128, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeLinear(128, num_classes, rng));
  } else if (name == "lenet5") {
    layers.push_back(MakeConv2d(c, 6, 5, 1, 2, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeMaxPool2d(2, 2));
    layers.push_back(MakeConv2d(6, 16, 5, 1, 0, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeMaxPool2d(2, 2));
    layers.push_back(MakeFlatten());
    // 16 x 5 x 5 = 400 for 28x28 inputs; other sizes adapt.
    const int64_t h = ((input_chw[1]) / 2 - 4) / 2;
    const int64_t w = ((input_chw[2]) / 2 - 4) / 2;
    if (h <= 0 || w <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lenet5: input ", ShapeToString(input_chw),
                       " is too small; expected H, W >= 12"));
    }
    layers.push_back(MakeLinear(16 * h * w, 120, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeLinear(120, 84, rng));
    layers.push_back(MakeRelu());
    layers.push_back(MakeLinear(84, num_classes, rng));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model \"", name, "\"; expected one of: ", KnownModels()));
  }
  // Check the chain of shapes once, for a batch of 1.
  Shape shape = {1, input_chw[0], input_chw[1], input_chw[2]};
  for (const auto& layer : layers) {
    absl::StatusOr<Shape> out = layer->OutputShape(shape);
    if (!out.ok()) return out.status();
    shape = *out;
    for (Param* p : layer->params()) model->params_.push_back(p);
  }
  model->activations_.resize(layers.size() + 1);
  model->grads_.resize(layers.size() + 1);
  return model;
}

std::string Model::KnownModels() { return "lenet5, mlp"; }

bool Model::IsKnown(const std::string& name) {
  return name == "lenet5" || name == "mlp";
}

std::vector<int64_t> Model::ParamNumElements() const {
  std::vector<int64_t> sizes;
  for (const Param* p : params_) sizes.push_back(p->value.size());
  return sizes;
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const Param* p : params_) n += p->value.size();
  return n;
}

int64_t Model::ForwardMacsPerSample() const {
  Shape shape = {1, input_chw_[0], input_chw_[1], input_chw_[2]};
  int64_t macs = 0;
  for (const auto& layer : layers_) {
    macs += layer->ForwardMacsPerSample(shape);
    shape = *layer->OutputShape(shape);
  }
  return macs;
}

absl::StatusOr<const Tensor*> Model::Forward(const Tensor& input) {
  if (input.shape.size() != 4 || input.shape[1] != input_chw_[0] ||
      input.shape[2] != input_chw_[1] || input.shape[3] != input_chw_[2]) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": input ", ShapeToString(input.shape), "; expected [N, ",
        input_chw_[0], ", ", input_chw_[1], ", ", input_chw_[2], "]"));
  }
  const Tensor* in = &input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(*in, &activations_[i + 1]);
    in = &activations_[i + 1];
  }
  return in;
}

absl::StatusOr<float> Model::ForwardBackward(
    const Tensor& input, const std::vector<int32_t>& labels) {
  absl::StatusOr<const Tensor*> logits = Forward(input);
  if (!logits.ok()) return logits.status();
  absl::StatusOr<float> loss =
      SoftmaxCrossEntropy(**logits, labels, &grads_.back());
  if (!loss.ok()) return loss.status();
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor& in = i == 0 ? input : activations_[i];
    layers_[i]->Backward(in, activations_[i + 1], grads_[i + 1],
                         i == 0 ? nullptr : &grads_[i]);
  }
  return *loss;
}

}  // namespace pstrain
