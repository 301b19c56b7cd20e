// Internal to //models:model: what model.cc (the model at run time) and
// model_zoo.cc (the architectures, built once by Model::Create) share.
// Not thread-safe: a Model and its nodes belong to one thread at a time,
// as model.h says of Model.
#ifndef PSTRAIN_MODELS_MODEL_INTERNAL_H_
#define PSTRAIN_MODELS_MODEL_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "models/backend.h"
#include "models/layer_spec.h"
#include "models/model.h"
#include "models/tensor.h"

namespace pstrain {

struct Model::Node {
  std::string name;
  LayerSpec spec;
  std::vector<int> inputs;    // -1: the model's input.
  std::vector<Param> params;  // Owned: PS tensors.
  std::vector<Buffer> buffers;
  // Parameters read from an earlier node (a tied weight: the MLM decoder's
  // is the token embedding's): `value` a view of the owner's, `grad` this
  // node's own, added into the owner's after the owner's backward.
  std::vector<Param> tied;
  // On an owner: (a later node's tied parameter, the owned one it reads).
  std::vector<std::pair<const Param*, Param*>> tied_grads;
  int first_param = 0;   // Index of params[0] in Model::params_.
  int first_buffer = 0;  // Index of buffers[0] in Model::buffers_.
  std::unique_ptr<Layer> layer;
  Shape sample_shape;  // Output shape for a batch of 1.
  DeviceTensor out;
  DeviceTensor grad;
  // With the memory plan: where this node's backward puts the gradient it
  // adds into an input's that another consumer wrote first.
  DeviceTensor accum;
  bool grad_written = false;
};

namespace model_internal {

// A node's inputs besides earlier nodes (Model::Node::inputs):
constexpr int kInput = -1;
constexpr int kPaddingMask = -2;    // Sequence models' second input.
constexpr int kHeadPositions = -3;  // And the MLM head's positions [P].

// BERT's learned position table: 512 rows (the longest sequence).
constexpr int64_t kBertMaxPositions = 512;

// Adds `name`'s layers to `model` (Model::Create's, whose nodes are still
// empty) and draws their initial weights with `options.seed`. `input_chw`
// and `num_classes` are checked by the caller. Returns InvalidArgument for
// a layer whose shapes do not fit (the model's name and the layer's in the
// message) and Internal for a catalog model without a builder.
absl::Status BuildArchitecture(const std::string& name, const Shape& input_chw,
                               int num_classes, const ModelOptions& options,
                               Model* model);

}  // namespace model_internal
}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MODEL_INTERNAL_H_
