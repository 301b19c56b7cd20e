#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catalog/catalog.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "models/memory_plan.h"
#include "models/model_internal.h"

namespace pstrain {

namespace {

using model_internal::kBertMaxPositions;
using model_internal::kHeadPositions;
using model_internal::kInput;
using model_internal::kPaddingMask;

}  // namespace

void FindPredictedTokens(absl::Span<const int32_t> labels,
                         PredictedTokens* out) {
  out->positions.clear();
  out->labels.clear();
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == kIgnoreLabel) continue;
    out->positions.push_back(static_cast<float>(i));
    out->labels.push_back(labels[i]);
  }
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const std::string& name, const Shape& input_chw, int num_classes,
    const ModelOptions& options, Backend* backend) {
  const bool sequence = IsSequenceModel(name);
  if (sequence && (input_chw.size() != 1 || input_chw[0] < 1 ||
                   input_chw[0] > kBertMaxPositions)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": input ", ShapeToString(input_chw),
                     "; expected [S], the sequence length, with 1 <= S <= ",
                     kBertMaxPositions));
  }
  if (!sequence && (input_chw.size() != 3 || NumElements(input_chw) <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model input ", ShapeToString(input_chw),
                     "; expected [C, H, W] with positive sizes"));
  }
  if (num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes ", num_classes, "; expected >= 2"));
  }
  if (!IsKnownModel(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model \"", name, "\"; expected one of: ", KnownModels()));
  }
  std::unique_ptr<Model> model(new Model());
  model->name_ = name;
  model->backend_ = backend;
  model->input_chw_ = input_chw;
  model->input_ = DeviceTensor(backend);
  model->sequence_ = sequence;
  model->padding_mask_ = DeviceTensor(backend);
  model->positions_ = DeviceTensor(backend);
  model->scratch_ = DeviceTensor(backend);
  model->dlogits_ = DeviceTensor(backend);
  model->memory_plan_ = options.memory_plan;
  RETURN_IF_ERROR(model_internal::BuildArchitecture(
      name, input_chw, num_classes, options, model.get()));
  absl::Status finished = model->Finish(input_chw);
  if (!finished.ok()) return finished;
  return model;
}

absl::Status Model::Finish(const Shape& input_chw) {
  for (auto& node : nodes_) {
    node->first_param = static_cast<int>(params_.size());
    node->first_buffer = static_cast<int>(buffers_.size());
    for (Param& p : node->params) params_.push_back(&p);
    for (Buffer& b : node->buffers) buffers_.push_back(&b);
  }
  // Host staging: alias the tensors on host-memory backends, else pinned
  // buffers (one block per tensor).
  const bool alias = backend_->host_memory();
  auto staging = [&](DeviceTensor& t) -> absl::StatusOr<float*> {
    if (alias) return t.data();
    absl::StatusOr<float*> block = backend_->AllocateHost(t.size());
    if (block.ok()) host_blocks_.push_back(*block);
    return block;
  };
  for (Param* p : params_) {
    absl::StatusOr<float*> w = staging(p->value);
    if (!w.ok()) return w.status();
    absl::StatusOr<float*> g = staging(p->grad);
    if (!g.ok()) return g.status();
    host_weights_.push_back(absl::MakeSpan(*w, p->value.size()));
    host_gradients_.push_back(absl::MakeConstSpan(*g, p->grad.size()));
  }
  for (Buffer* b : buffers_) {
    absl::StatusOr<float*> w = staging(b->value);
    if (!w.ok()) return w.status();
    absl::StatusOr<float*> g = staging(b->value);
    if (!g.ok()) return g.status();
    host_weights_.push_back(absl::MakeSpan(*w, b->value.size()));
    host_gradients_.push_back(absl::MakeConstSpan(*g, b->value.size()));
  }
  return StoreHostWeights();
}

Shape Model::InputSampleShape() const {
  Shape shape = {1};
  shape.insert(shape.end(), input_chw_.begin(), input_chw_.end());
  return shape;
}

DeviceTensor* Model::InputTensor(int i) {
  if (i == kInput) return &input_;
  if (i == kPaddingMask) return &padding_mask_;
  if (i == kHeadPositions) return &positions_;
  return &nodes_[i]->out;
}

Model::~Model() {
  nodes_.clear();
  for (float* block : host_blocks_) backend_->FreeHost(block);
}

std::vector<int64_t> Model::PsTensorNumElements() const {
  std::vector<int64_t> sizes;
  for (const Param* p : params_) sizes.push_back(p->value.size());
  for (const Buffer* b : buffers_) sizes.push_back(b->value.size());
  return sizes;
}

std::vector<int64_t> Model::PsTensorRowElements() const {
  std::vector<int64_t> rows(params_.size() + buffers_.size(), 0);
  for (const auto& node : nodes_) {
    if (node->spec.type == LayerType::kEmbedding && node->tied_grads.empty()) {
      rows[node->first_param] = node->spec.out_channels;  // token.weight
    }
  }
  return rows;
}

std::vector<std::string> Model::PsTensorNames() const {
  std::vector<std::string> names;
  for (const Param* p : params_) names.push_back(p->name);
  for (const Buffer* b : buffers_) names.push_back(b->name);
  return names;
}

std::vector<Shape> Model::PsTensorShapes() const {
  std::vector<Shape> shapes;
  for (const Param* p : params_) shapes.push_back(p->value.shape());
  for (const Buffer* b : buffers_) shapes.push_back(b->value.shape());
  return shapes;
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const Param* p : params_) n += p->value.size();
  return n;
}

int64_t Model::ForwardMacsPerSample() const {
  int64_t macs = 0;
  for (const auto& node : nodes_) {
    const Shape in = node->inputs[0] < 0
                         ? InputSampleShape()
                         : nodes_[node->inputs[0]]->sample_shape;
    macs += pstrain::ForwardMacsPerSample(node->spec, in);
  }
  return macs;
}

std::vector<int64_t> Model::ForwardMacsPerPsTensor() const {
  std::vector<int64_t> macs(params_.size() + buffers_.size(), 0);
  for (const auto& node : nodes_) {
    const Shape in = node->inputs[0] < 0
                         ? InputSampleShape()
                         : nodes_[node->inputs[0]]->sample_shape;
    const int64_t layer = pstrain::ForwardMacsPerSample(node->spec, in);
    int64_t elements = 0;
    for (const Param& p : node->params) elements += p.value.size();
    if (layer == 0 || elements == 0) continue;
    for (size_t i = 0; i < node->params.size(); ++i) {
      macs[node->first_param + i] = static_cast<int64_t>(
          static_cast<double>(layer) *
          static_cast<double>(node->params[i].value.size()) /
          static_cast<double>(elements));
    }
  }
  return macs;
}

std::string Model::Summary() const {
  std::string out;
  for (const auto& node : nodes_) {
    int64_t n = 0;
    for (const Param& p : node->params) n += p.value.size();
    // Per sample: without the batch axis of 1 (the MLM head's rows, S per
    // sample, are shown whole).
    const bool batch_axis =
        node->sample_shape.size() > 1 && node->sample_shape[0] == 1;
    Shape shape(node->sample_shape.begin() + (batch_axis ? 1 : 0),
                node->sample_shape.end());
    absl::StrAppendFormat(&out, "  %-24s %-16s %-18s %lld\n", node->name,
                          LayerName(node->spec), ShapeToString(shape),
                          static_cast<long long>(n));
  }
  return out;
}

void Model::EnableLayerTiming(bool on) {
  time_layers_ = on;
  layer_times_.clear();
  if (!on) return;
  for (const auto& node : nodes_) {
    layer_times_.push_back({node->name, LayerTypeName(node->spec.type),
                            LayerName(node->spec), 0, 0});
  }
  layer_times_.push_back({"loss", "loss", "softmax_cross_entropy", 0, 0});
}

absl::Status Model::AddLayerTime(absl::Time start, size_t entry,
                                 bool backward) {
  if (!time_layers_) return absl::OkStatus();
  absl::Status s = backend_->Synchronize();
  if (!s.ok()) return s;
  LayerTime& t = layer_times_[entry];
  (backward ? t.backward_ms : t.forward_ms) +=
      absl::ToDoubleMilliseconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::StatusOr<const Tensor*> Model::Forward(const Tensor& input,
                                             bool training) {
  absl::Status s = RunForward(input, nullptr, training);
  if (!s.ok()) return s;
  return CopyLogitsToHost();
}

absl::StatusOr<const Tensor*> Model::Forward(const Tensor& input,
                                             const Tensor& padding_mask,
                                             bool training) {
  absl::Status s = RunForward(input, &padding_mask, training);
  if (!s.ok()) return s;
  return CopyLogitsToHost();
}

absl::StatusOr<const Tensor*> Model::ForwardAt(
    const Tensor& input, const Tensor& padding_mask,
    const std::vector<float>& positions) {
  if (!sequence_ || positions.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": ForwardAt with ", positions.size(),
        " positions; expected a sequence model and at least one position"));
  }
  absl::Status s =
      RunForward(input, &padding_mask, /*training=*/false, &positions);
  if (!s.ok()) return s;
  return CopyLogitsToHost(/*all_positions=*/false);
}

absl::StatusOr<const Tensor*> Model::CopyLogitsToHost(bool all_positions) {
  const DeviceTensor& logits = nodes_.back()->out;
  // A sequence model's head that ran at every position, in order:
  // [N, S, vocab].
  host_logits_.Resize(
      sequence_ && all_positions
          ? Shape{input_.shape()[0], input_.shape()[1], logits.shape().back()}
          : logits.shape());
  absl::Status s = backend_->CopyToHost(logits.data(), logits.size(),
                                        host_logits_.data.data());
  if (!s.ok()) return s;
  s = backend_->Synchronize();
  if (!s.ok()) return s;
  return &host_logits_;
}

absl::Status Model::RunForward(const Tensor& input, const Tensor* padding_mask,
                               bool training,
                               const std::vector<float>* positions) {
  const Shape sample = InputSampleShape();
  const bool fits =
      input.shape.size() == sample.size() && input.shape[0] > 0 &&
      std::equal(sample.begin() + 1, sample.end(), input.shape.begin() + 1);
  if (!fits && sequence_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": input ", ShapeToString(input.shape),
                     "; expected token ids [N, ", input_chw_[0], "]"));
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": input ", ShapeToString(input.shape), "; expected [N, ",
        input_chw_[0], ", ", input_chw_[1], ", ", input_chw_[2], "]"));
  }
  if (padding_mask != nullptr &&
      (!sequence_ || padding_mask->shape != input.shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": padding mask ", ShapeToString(padding_mask->shape),
        sequence_ ? absl::StrCat("; expected the input's ",
                                 ShapeToString(input.shape))
                  : "; only sequence models take one"));
  }
  absl::Status s = input_.Resize(input.shape);
  if (!s.ok()) return s;
  input_.set_layout(0);
  if (sequence_ && input.size() > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": input ", ShapeToString(input.shape),
        "; expected at most 2^24 tokens (fp32 row indices are exact below)"));
  }
  if (sequence_ && positions == nullptr) {
    if (static_cast<int64_t>(all_positions_.size()) != input.size()) {
      all_positions_.resize(input.size());
      for (int64_t i = 0; i < input.size(); ++i) all_positions_[i] = i;
    }
    positions = &all_positions_;
  }
  const int64_t num_positions =
      positions != nullptr ? static_cast<int64_t>(positions->size()) : 0;
  if (memory_plan_ &&
      (input.shape != planned_input_ || num_positions != planned_positions_)) {
    s = PlanMemory(input.shape, num_positions);
    if (!s.ok()) return s;
  }
  s = backend_->CopyToDevice(input.data.data(), input.size(), input_.data());
  if (!s.ok()) return s;
  if (sequence_) {
    s = padding_mask_.Resize(input.shape);
    if (!s.ok()) return s;
    padding_mask_.set_layout(0);
    if (padding_mask != nullptr) {
      s = backend_->CopyToDevice(padding_mask->data.data(),
                                 padding_mask->size(), padding_mask_.data());
    } else {
      no_padding_.assign(input.size(), 0.0f);
      s = backend_->CopyToDevice(no_padding_.data(), input.size(),
                                 padding_mask_.data());
    }
    if (!s.ok()) return s;
    s = positions_.Resize({num_positions});
    if (!s.ok()) return s;
    positions_.set_layout(0);
    s = backend_->CopyToDevice(positions->data(), num_positions,
                               positions_.data());
    if (!s.ok()) return s;
  }
  // Priority pulls: a training forward asks for each layer's weights as it
  // reaches the layer (AwaitWeightsOf(), which also copies them to a
  // device); any other forward of weights still arriving waits for all.
  const bool gated = training && weights_gate_ != nullptr;
  if (!gated && device_weights_stale_) {
    s = weights_gate_ != nullptr ? weights_gate_->AwaitAll() : absl::OkStatus();
    if (!s.ok()) return s;
    s = CopyWeightsToDevice(0, static_cast<int>(host_weights_.size()));
    if (!s.ok()) return s;
    device_weights_stale_ = false;
  }
  if (time_layers_) {  // Work queued before is not the first layer's.
    s = backend_->Synchronize();
    if (!s.ok()) return s;
  }
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const std::unique_ptr<Node>& node = nodes_[n];
    const absl::Time start = absl::Now();
    std::vector<const DeviceTensor*> in;
    std::vector<Shape> shapes;
    for (int i : node->inputs) {
      in.push_back(InputTensor(i));
      shapes.push_back(in.back()->shape());
    }
    absl::StatusOr<Shape> out_shape = OutputShape(node->spec, shapes);
    if (!out_shape.ok()) return out_shape.status();
    s = node->out.Resize(*out_shape);
    if (!s.ok()) return s;
    if (gated) {
      s = AwaitWeightsOf(*node);
      if (!s.ok()) return s;
    }
    s = node->layer->Forward(in, &node->out, training);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(node->name, ": ", s.message()));
    }
    s = AddLayerTime(start, n, /*backward=*/false);
    if (!s.ok()) return s;
  }
  const DeviceTensor& logits = nodes_.back()->out;
  if (logits.layout() != 0) {
    return absl::InternalError(
        absl::StrCat(name_, ": logits in layout ", logits.layout()));
  }
  return absl::OkStatus();
}

absl::Status Model::PlanMemory(const Shape& input, int64_t positions) {
  const int n_nodes = static_cast<int>(nodes_.size());
  std::vector<Shape> shapes(n_nodes);
  std::vector<std::vector<int>> consumers(n_nodes);
  for (int n = 0; n < n_nodes; ++n) {
    std::vector<Shape> in;
    for (int i : nodes_[n]->inputs) {
      // The mask has the ids' shape.
      in.push_back(i == kHeadPositions ? Shape{positions}
                   : i < 0             ? input
                                       : shapes[i]);
      if (i >= 0) consumers[i].push_back(n);
    }
    absl::StatusOr<Shape> out = OutputShape(nodes_[n]->spec, in);
    if (!out.ok()) return out.status();
    shapes[n] = *out;
  }
  // Step times: forward of node n at n, the loss at n_nodes, backward of
  // node n at Back(n). Lifetimes: outputs [0, N), gradients [N, 2N),
  // accumulation scratch [2N, 3N).
  auto back = [&](int n) { return 2 * n_nodes - n; };
  std::vector<Lifetime> life(3 * n_nodes);
  std::vector<int> out_at(n_nodes), grad_at(n_nodes);
  for (int n = 0; n < n_nodes; ++n) {
    out_at[n] = n;
    grad_at[n] = n_nodes + n;
    const int64_t elements = NumElements(shapes[n]);
    Lifetime& out = life[n];
    out = {elements, n, n};
    if (BackwardReadsOf(nodes_[n]->spec).output) out.last = back(n);
    if (n + 1 == n_nodes) out.last = n_nodes;  // The loss reads the logits.
    for (int c : consumers[n]) {
      out.last = std::max(out.last, c);
      if (BackwardReadsOf(nodes_[c]->spec).input) {
        out.last = std::max(out.last, back(c));
      }
    }
    if (n + 1 == n_nodes || consumers[n].empty()) continue;
    // The last consumer's backward writes the gradient first; every other
    // consumer's adds into it from its own scratch.
    life[n_nodes + n] = {elements, back(consumers[n].back()), back(n)};
    for (size_t k = 0; k + 1 < consumers[n].size(); ++k) {
      const int c = consumers[n][k];
      Lifetime& accum = life[2 * n_nodes + c];
      accum = {std::max(accum.elements, elements), back(c), back(c)};
    }
  }
  // In-place ReLU: a ReLU that is its input's only consumer writes its
  // output over the input (which no backward reads) and its input gradient
  // over its output gradient.
  std::vector<int> in_place;
  for (int r = 0; r + 1 < n_nodes; ++r) {
    const Node& relu = *nodes_[r];
    const int x = relu.inputs[0];
    if (relu.spec.type == LayerType::kRelu && x >= 0 &&
        consumers[x].size() == 1 && !consumers[r].empty() &&
        !BackwardReadsOf(nodes_[x]->spec).output) {
      in_place.push_back(r);
    }
  }
  auto merge = [&](int into, int from) {
    life[into].first = std::min(life[into].first, life[from].first);
    life[into].last = std::max(life[into].last, life[from].last);
    life[from].last = life[from].first - 1;
  };
  // Forward order for outputs, backward order for gradients, so that a
  // chain of in-place ReLUs ends in one lifetime.
  for (int r : in_place) {
    const int x = nodes_[r]->inputs[0];
    merge(out_at[x], out_at[r]);
    out_at[r] = out_at[x];
  }
  for (auto r = in_place.rbegin(); r != in_place.rend(); ++r) {
    const int x = nodes_[*r]->inputs[0];
    merge(grad_at[*r], grad_at[x]);
    grad_at[x] = grad_at[*r];
  }
  const SlotPlan plan = PlanSlots(life);
  slots_.resize(plan.slot_elements.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].backend() == nullptr) slots_[i] = DeviceTensor(backend_);
    // A slot only grows: a smaller batch (evaluation) keeps the memory.
    const int64_t elements = std::max(plan.slot_elements[i], slots_[i].size());
    absl::Status s = slots_[i].Resize({elements});
    if (!s.ok()) return s;
  }
  auto place = [&](int lifetime, DeviceTensor* t) {
    const int slot = plan.slot_of[lifetime];
    if (slot >= 0) t->SetView(slots_[slot].data(), slots_[slot].size());
  };
  for (int n = 0; n < n_nodes; ++n) {
    place(out_at[n], &nodes_[n]->out);
    place(grad_at[n], &nodes_[n]->grad);
    place(2 * n_nodes + n, &nodes_[n]->accum);
  }
  planned_input_ = input;
  planned_positions_ = positions;
  return absl::OkStatus();
}

int64_t Model::ActivationBytes() const {
  int64_t elements = 0;
  if (memory_plan_) {
    for (const DeviceTensor& slot : slots_) elements += slot.size();
  } else {
    for (const auto& node : nodes_) {
      elements += node->out.size() + node->grad.size();
    }
    elements += scratch_.size();
  }
  return elements * static_cast<int64_t>(sizeof(float));
}

absl::Status Model::CopyGradientsToHost(const Node& node) {
  if (backend_->host_memory() || !stage_gradients_) return absl::OkStatus();
  for (size_t i = 0; i < node.params.size(); ++i) {
    const DeviceTensor& g = node.params[i].grad;
    absl::Status s = backend_->CopyToHost(
        g.data(), g.size(),
        const_cast<float*>(host_gradients_[node.first_param + i].data()));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Model::AwaitWeightsOf(const Node& node) {
  const int first_buffer = static_cast<int>(params_.size()) + node.first_buffer;
  for (size_t i = 0; i < node.params.size(); ++i) {
    absl::Status s =
        weights_gate_->AwaitTensor(node.first_param + static_cast<int>(i));
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < node.buffers.size(); ++i) {
    absl::Status s =
        weights_gate_->AwaitTensor(first_buffer + static_cast<int>(i));
    if (!s.ok()) return s;
  }
  if (!device_weights_stale_) return absl::OkStatus();
  RETURN_IF_ERROR(CopyWeightsToDevice(node.first_param,
                                      static_cast<int>(node.params.size())));
  return CopyWeightsToDevice(first_buffer,
                             static_cast<int>(node.buffers.size()));
}

absl::Status Model::CopyWeightsToDevice(int first, int count) {
  if (backend_->host_memory()) return absl::OkStatus();
  const int num_params = static_cast<int>(params_.size());
  for (int i = first; i < first + count; ++i) {
    DeviceTensor& t =
        i < num_params ? params_[i]->value : buffers_[i - num_params]->value;
    RETURN_IF_ERROR(
        backend_->CopyToDevice(host_weights_[i].data(), t.size(), t.data()));
  }
  return absl::OkStatus();
}

absl::Status Model::NotifyReady(const GradientsReadyFn& on_ready,
                                int first_tensor, int count) {
  if (!on_ready || count == 0 || !stage_gradients_) return absl::OkStatus();
  std::vector<int> tensors(count);
  for (int i = 0; i < count; ++i) tensors[i] = first_tensor + i;
  absl::StatusOr<std::shared_ptr<CopyFence>> fence = backend_->RecordCopies();
  if (!fence.ok()) return fence.status();
  on_ready(tensors, *std::move(fence));
  return absl::OkStatus();
}

absl::StatusOr<float> Model::ForwardBackward(const Tensor& input,
                                             absl::Span<const int32_t> labels,
                                             const GradientsReadyFn& on_ready) {
  return TrainStep(input, nullptr, labels, on_ready);
}

absl::StatusOr<float> Model::ForwardBackward(const Tensor& input,
                                             const Tensor& padding_mask,
                                             absl::Span<const int32_t> labels,
                                             const GradientsReadyFn& on_ready) {
  return TrainStep(input, &padding_mask, labels, on_ready);
}

absl::Status Model::AddTiedGradients(const Node& owner) {
  for (const auto& [tied, param] : owner.tied_grads) {
    absl::Status s = backend_->Accumulate(tied->grad.data(), tied->grad.size(),
                                          param->grad.data());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<float> Model::TrainStep(const Tensor& input,
                                       const Tensor* padding_mask,
                                       absl::Span<const int32_t> labels,
                                       const GradientsReadyFn& on_ready) {
  const absl::Time forward_start = absl::Now();
  if (sequence_) {
    // The MLM head runs at the predicted positions only: their flat row
    // indices and labels (one ignored row when no token is predicted).
    if (static_cast<int64_t>(labels.size()) != input.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": ", labels.size(), " labels for input ",
                       ShapeToString(input.shape), "; expected one a token"));
    }
    FindPredictedTokens(labels, &step_predicted_);
    if (step_predicted_.positions.empty()) {
      step_predicted_.positions.push_back(0.0f);
      step_predicted_.labels.push_back(kIgnoreLabel);
    }
    labels = step_predicted_.labels;
  }
  absl::Status s = RunForward(input, padding_mask, /*training=*/true,
                              sequence_ ? &step_predicted_.positions : nullptr);
  if (!s.ok()) return s;
  const DeviceTensor& device_logits = nodes_.back()->out;
  s = dlogits_.Resize(device_logits.shape());
  if (!s.ok()) return s;
  dlogits_.set_layout(0);
  const absl::Time loss_start = absl::Now();
  absl::StatusOr<float> loss =
      sequence_
          ? backend_->SoftmaxCrossEntropyIgnoring(device_logits, labels,
                                                  kIgnoreLabel, &dlogits_)
          : backend_->SoftmaxCrossEntropy(device_logits, labels, &dlogits_);
  if (!loss.ok()) return loss.status();
  if (loss_scale_ != 1.0f) {
    s = backend_->Scale(loss_scale_, dlogits_.data(), dlogits_.size());
    if (!s.ok()) return s;
  }
  s = AddLayerTime(loss_start, nodes_.size(), /*backward=*/false);
  if (!s.ok()) return s;
  if (weights_gate_ != nullptr) {
    // Backward overwrites the gradients the last step's pushes lent out.
    s = weights_gate_->AwaitAll();
    if (!s.ok()) return s;
    // Every layer's forward copied its tensors.
    device_weights_stale_ = false;
  }
  const absl::Time backward_start = absl::Now();
  last_forward_time_ = backward_start - forward_start;
  trace::Complete("forward", "compute", absl::ToUnixMicros(forward_start),
                  absl::ToUnixMicros(backward_start));
  for (auto& node : nodes_) node->grad_written = false;
  for (size_t n = nodes_.size(); n-- > 0;) {
    Node& node = *nodes_[n];
    const absl::Time start = absl::Now();
    const DeviceTensor& dout = n + 1 == nodes_.size() ? dlogits_ : node.grad;
    if (n + 1 < nodes_.size() && !node.grad_written) {
      return absl::InternalError(
          absl::StrCat(name_, ": output of ", node.name, " is never used"));
    }
    std::vector<const DeviceTensor*> in;
    std::vector<DeviceTensor*> din;
    std::vector<int> accumulate_into;  // Producer of each scratch use.
    DeviceTensor& accum = memory_plan_ ? node.accum : scratch_;
    for (int i : node.inputs) {
      if (i < 0) {  // The input and the padding mask have no gradient.
        in.push_back(InputTensor(i));
        din.push_back(nullptr);
        continue;
      }
      Node& producer = *nodes_[i];
      in.push_back(&producer.out);
      if (!producer.grad_written) {
        s = producer.grad.Resize(producer.out.shape());
        if (!s.ok()) return s;
        producer.grad.set_layout(producer.out.layout());
        producer.grad_written = true;
        din.push_back(&producer.grad);
      } else {
        if (!accumulate_into.empty()) {
          return absl::InternalError(absl::StrCat(
              name_, ": ", node.name, " needs two accumulated gradients"));
        }
        s = accum.Resize(producer.out.shape());
        if (!s.ok()) return s;
        accum.set_layout(producer.out.layout());
        accumulate_into.push_back(i);
        din.push_back(&accum);
      }
    }
    s = node.layer->Backward(in, node.out, dout, din);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(node.name, ": ", s.message()));
    }
    for (int i : accumulate_into) {
      s = backend_->Accumulate(accum.data(), accum.size(),
                               nodes_[i]->grad.data());
      if (!s.ok()) return s;
    }
    s = AddTiedGradients(node);
    if (!s.ok()) return s;
    if (loss_scale_ != 1.0f) {  // unscale_
      for (Param& p : node.params) {
        s = backend_->Scale(1.0f / loss_scale_, p.grad.data(), p.grad.size());
        if (!s.ok()) return s;
      }
    }
    s = AddLayerTime(start, n, /*backward=*/true);
    if (!s.ok()) return s;
    // Start the device-to-host copy of this layer's gradients while the
    // backward pass goes on.
    s = CopyGradientsToHost(node);
    if (!s.ok()) return s;
    trace::Complete("backward", "compute", absl::ToUnixMicros(start),
                    trace::NowUs(),
                    {{"layer", static_cast<int64_t>(n)},
                     {"first_param", node.first_param},
                     {"params", static_cast<int64_t>(node.params.size())}});
    s = NotifyReady(on_ready, node.first_param,
                    static_cast<int>(node.params.size()));
    if (!s.ok()) return s;
  }
  if (!backend_->host_memory() && stage_gradients_) {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const DeviceTensor& v = buffers_[i]->value;
      s = backend_->CopyToHost(
          v.data(), v.size(),
          const_cast<float*>(host_gradients_[params_.size() + i].data()));
      if (!s.ok()) return s;
    }
  }
  s = NotifyReady(on_ready, static_cast<int>(params_.size()),
                  static_cast<int>(buffers_.size()));
  if (!s.ok()) return s;
  s = backend_->Synchronize();
  if (!s.ok()) return s;
  last_backward_time_ = absl::Now() - backward_start;
  return *loss;
}

absl::StatusOr<bool> Model::GradientsFinite() {
  std::vector<const DeviceTensor*> grads;
  for (const Param* p : params_) grads.push_back(&p->grad);
  return backend_->AllFinite(grads);
}

absl::Status Model::AdamStep(const AdamOptions& options) {
  if (adam_m_.empty()) {
    int64_t largest = 0;
    for (const Param* p : params_) largest = std::max(largest, p->value.size());
    const std::vector<float> zeros(largest, 0.0f);
    for (const Param* p : params_) {
      for (auto* state : {&adam_m_, &adam_v_}) {
        state->emplace_back(backend_);
        absl::Status s = state->back().Resize(p->value.shape());
        if (!s.ok()) return s;
        s = backend_->CopyToDevice(zeros.data(), p->value.size(),
                                   state->back().data());
        if (!s.ok()) return s;
      }
    }
    // The copies read `zeros`, which goes out of scope below.
    absl::Status s = backend_->Synchronize();
    if (!s.ok()) return s;
  }
  ++adam_step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    absl::Status s = backend_->AdamUpdate(options, adam_step_, p.value.data(),
                                          p.grad.data(), adam_m_[i].data(),
                                          adam_v_[i].data(), p.value.size());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Model::LoadHostWeights() {
  if (backend_->host_memory()) return absl::OkStatus();
  if (weights_gate_ != nullptr) {
    // The weights may still be arriving: the next forward copies them.
    device_weights_stale_ = true;
    return absl::OkStatus();
  }
  return CopyWeightsToDevice(0, static_cast<int>(host_weights_.size()));
}

absl::Status Model::StoreHostWeights() {
  if (backend_->host_memory()) return absl::OkStatus();
  for (size_t i = 0; i < host_weights_.size(); ++i) {
    const DeviceTensor& t = i < params_.size()
                                ? params_[i]->value
                                : buffers_[i - params_.size()]->value;
    absl::Status s =
        backend_->CopyToHost(t.data(), t.size(), host_weights_[i].data());
    if (!s.ok()) return s;
  }
  return backend_->Synchronize();
}

}  // namespace pstrain
