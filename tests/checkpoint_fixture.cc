#include "tests/checkpoint_fixture.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partition.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "models/model_file.h"
#include "worker/ps_client.h"

namespace pstrain::testing {
namespace {

// A 32-bit mix of (a, b, c) (splitmix64's finaliser).
uint32_t Mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull +
               c * 0x94d049bb133111ebull + 1;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

// A uniform value in [-1, 1).
float Unit(uint32_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits)) * (1.0f / 2147483648.f);
}

// Whether two float arrays are equal bit for bit.
bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

}  // namespace

float InitialValue(int t, int64_t i) { return 0.1f * Unit(Mix(0, t, i)); }

float GradientValue(int64_t step, int t, int64_t i) {
  // Magnitudes from 1e-4 to 1e-2 and both signs, so that Adam's m and v
  // differ from element to element.
  const uint32_t bits = Mix(step, t, i);
  return Unit(bits) * ((bits & 1) ? 1e-2f : 1e-4f);
}

float BufferValue(int64_t step, int t, int64_t i) {
  return static_cast<float>(step) + static_cast<float>((t + i) % 64) / 64.0f;
}

absl::StatusOr<std::unique_ptr<FixtureModel>> FixtureModel::Zoo(
    const std::string& name, const Shape& input_chw, int num_classes) {
  std::unique_ptr<FixtureModel> m(new FixtureModel());
  m->name_ = name;
  m->num_classes_ = num_classes;
  ASSIGN_OR_RETURN(m->backend_, Backend::Create("cpu"));
  ASSIGN_OR_RETURN(m->model_, Model::Create(name, input_chw, num_classes,
                                            ModelOptions(), m->backend_.get()));
  m->names_ = m->model_->PsTensorNames();
  for (const Shape& s : m->model_->PsTensorShapes()) m->shapes_.push_back(s);
  m->num_elements_ = m->model_->PsTensorNumElements();
  m->num_buffers_ = static_cast<int>(m->model_->buffers().size());
  return m;
}

std::unique_ptr<FixtureModel> FixtureModel::Synthetic(
    const std::vector<int64_t>& sizes, int num_buffers) {
  std::unique_ptr<FixtureModel> m(new FixtureModel());
  m->name_ = "synthetic";
  for (size_t t = 0; t < sizes.size(); ++t) {
    const bool buffer = t + num_buffers >= sizes.size();
    m->names_.push_back(absl::StrCat(buffer ? "buffer." : "param.", t));
    m->shapes_.push_back({sizes[t]});
    m->num_elements_.push_back(sizes[t]);
  }
  m->num_buffers_ = num_buffers;
  return m;
}

int64_t FixtureModel::total_elements() const {
  int64_t n = 0;
  for (int64_t e : num_elements_) n += e;
  return n;
}

absl::StatusOr<safetensors::WriteResult> FixtureModel::SaveModelFile(
    const std::vector<absl::Span<float>>& weights, const std::string& path,
    int64_t step, const safetensors::WriteOptions& write_options) const {
  if (model_ != nullptr) {
    ModelFileInfo info;
    info.model = name_;
    info.input_chw = model_->input_chw();
    info.num_classes = num_classes_;
    info.steps = step;
    info.dataset = "checkpoint_fixture";
    return ::pstrain::SaveModelFile(*model_, weights, info, path,
                                    write_options);
  }
  std::vector<safetensors::TensorView> views;
  for (size_t t = 0; t < weights.size(); ++t) {
    views.push_back(safetensors::F32View(names_[t], shapes_[t], weights[t]));
  }
  return safetensors::Write(path, views,
                            {{"format", "pstrain.checkpoint_fixture/1"},
                             {"step", absl::StrCat(step)}},
                            write_options);
}

absl::Status FixtureModel::CheckModelFile(
    const std::string& dir, const CheckpointManifest::File& file,
    const std::vector<std::vector<float>>& weights) const {
  const std::string path = absl::StrCat(dir, "/", file.name);
  safetensors::ReadOptions options;
  options.size_bytes = file.size_bytes;
  options.crc32 = file.crc32;
  ASSIGN_OR_RETURN(safetensors::File read,
                   safetensors::File::Read(path, options));
  if (model_ != nullptr) {
    // Through the model file reader, as `pstrain eval` and --init_from load
    // it (PyTorch's layouts back to the PS tensors').
    RETURN_IF_ERROR(LoadModelFile(path, model_.get()));
    const std::vector<absl::Span<float>>& host = model_->HostWeights();
    for (size_t t = 0; t < weights.size(); ++t) {
      if (!SameBits(host[t], weights[t])) {
        return absl::DataLossError(
            absl::StrCat(path, ": tensor \"", names_[t], "\" differs"));
      }
    }
    return absl::OkStatus();
  }
  for (size_t t = 0; t < weights.size(); ++t) {
    ASSIGN_OR_RETURN(std::vector<float> values,
                     read.ReadFloats(names_[t], shapes_[t]));
    if (!SameBits(values, weights[t])) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor \"", names_[t], "\" differs"));
    }
  }
  return absl::OkStatus();
}

ExpectedState::ExpectedState(const FixtureModel* model, const AdamOptions& adam)
    : model_(model), adam_(adam) {
  const size_t n = model->num_elements().size();
  weights_.resize(n);
  m_.resize(n);
  v_.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const int64_t size = model->num_elements()[t];
    weights_[t].resize(size);
    const bool buffer = t + model->num_buffers() >= n;
    for (int64_t i = 0; i < size; ++i) {
      weights_[t][i] = buffer ? BufferValue(0, t, i) : InitialValue(t, i);
    }
    if (!buffer) {
      m_[t].assign(size, 0.0f);
      v_[t].assign(size, 0.0f);
    }
  }
}

void ExpectedState::AdvanceTo(int64_t step) {
  const size_t n = weights_.size();
  const size_t num_params = n - model_->num_buffers();
  std::vector<float> g;
  for (; step_ < step; ++step_) {
    const int64_t s = step_ + 1;
    for (size_t t = 0; t < n; ++t) {
      const int64_t size = static_cast<int64_t>(weights_[t].size());
      if (t >= num_params) {
        for (int64_t i = 0; i < size; ++i) {
          weights_[t][i] = BufferValue(s, t, i);
        }
        continue;
      }
      g.resize(size);
      for (int64_t i = 0; i < size; ++i) g[i] = GradientValue(s, t, i);
      AdamUpdate(adam_, s, weights_[t].data(), g.data(), m_[t].data(),
                 v_[t].data(), size);
    }
  }
}

absl::Status ExpectedState::Check(const ModelState& state) const {
  const size_t n = weights_.size();
  if (state.weights.size() != n) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint has ", state.weights.size(), " tensors; expected ", n));
  }
  for (size_t t = 0; t < n; ++t) {
    const std::string& name = model_->names()[t];
    if (!SameBits(state.weights[t], weights_[t])) {
      return absl::DataLossError(absl::StrCat(
          "tensor \"", name, "\": weights differ from step ", step_, "'s"));
    }
    if (!SameBits(state.m[t], m_[t]) || !SameBits(state.v[t], v_[t])) {
      return absl::DataLossError(absl::StrCat(
          "tensor \"", name, "\": Adam m or v differ from step ", step_, "'s"));
    }
    int64_t covered = 0;
    for (const ModelState::Range& r : state.versions[t]) {
      if (r.version != step_) {
        return absl::DataLossError(
            absl::StrCat("tensor \"", name, "\": elements from ", r.offset,
                         " at version ", r.version, "; expected ", step_));
      }
      covered += r.num_elements;
    }
    if (covered != static_cast<int64_t>(weights_[t].size())) {
      return absl::DataLossError(
          absl::StrCat("tensor \"", name, "\": versions cover ", covered,
                       " of ", weights_[t].size(), " elements"));
    }
  }
  return absl::OkStatus();
}

DataPosition FixturePosition(int64_t step) {
  DataPosition p;
  p.steps_per_epoch = 7;
  p.epoch = step / p.steps_per_epoch;
  p.step_in_epoch = step % p.steps_per_epoch;
  p.seed = 1;
  p.batch_size = 4;
  p.num_workers = 1;
  return p;
}

absl::StatusOr<std::unique_ptr<CheckpointRig>> CheckpointRig::Create(
    const FixtureModel* model, const RigOptions& options) {
  std::unique_ptr<CheckpointRig> rig(new CheckpointRig());
  rig->model_ = model;
  const size_t n = model->num_elements().size();
  const size_t num_params = n - model->num_buffers();
  rig->weight_storage_.resize(n);
  rig->gradient_storage_.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const int64_t size = model->num_elements()[t];
    rig->weight_storage_[t].resize(size);
    for (int64_t i = 0; i < size; ++i) {
      rig->weight_storage_[t][i] =
          t < num_params ? InitialValue(t, i) : BufferValue(0, t, i);
    }
    rig->gradient_storage_[t].resize(size);
    rig->weights_.emplace_back(rig->weight_storage_[t]);
    rig->gradients_.emplace_back(rig->gradient_storage_[t]);
  }

  ShardOptions shard_options;
  shard_options.num_workers = 1;
  shard_options.adam = options.adam;
  shard_options.checkpoint_dir = options.checkpoint_dir;
  rig->shards_ =
      std::make_unique<LocalShards>(options.num_shards, shard_options);
  ASSIGN_OR_RETURN(
      PartitionPlan plan,
      PartitionPlan::Create(model->num_elements(), options.partition_bytes,
                            options.num_shards, model->num_buffers()));
  PsClientOptions client_options;
  client_options.addresses = rig->shards_->addresses();
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Create(client_options, plan));
  rig->exchange_ = CreatePsExchange(std::move(client), /*sync=*/true,
                                    /*chief=*/true, absl::Seconds(60));

  ModelState resume;
  bool resumed = false;
  if (options.resume) {
    absl::StatusOr<CheckpointManifest> manifest =
        ReadLatestCheckpoint(options.checkpoint_dir);
    if (manifest.ok()) {
      ASSIGN_OR_RETURN(
          resume, LoadCheckpointState(*manifest, model->names(),
                                      model->shapes(), model->num_buffers()));
      for (size_t t = 0; t < n; ++t) {
        std::copy(resume.weights[t].begin(), resume.weights[t].end(),
                  rig->weight_storage_[t].begin());
      }
      rig->step_ = manifest->step;
      resumed = true;
    } else if (!absl::IsNotFound(manifest.status())) {
      return manifest.status();
    }
  }
  RETURN_IF_ERROR(
      rig->exchange_->Start(rig->weights_, resumed ? &resume : nullptr));

  CheckpointJobInfo job;
  job.mode = MODE_SYNC;
  job.model = model->name();
  job.dataset = "checkpoint_fixture";
  job.num_shards = options.num_shards;
  job.partition_bytes = options.partition_bytes;
  job.adam = options.adam;
  job.tensor_names = model->names();
  job.tensor_shapes = model->shapes();
  job.num_buffers = model->num_buffers();
  rig->writer_ = std::make_unique<CheckpointWriter>(
      options.checkpoint_dir, options.keep_checkpoints, std::move(job),
      rig->exchange_.get(),
      [model](const std::vector<absl::Span<float>>& weights,
              const std::string& path, int64_t step,
              const safetensors::WriteOptions& write_options) {
        return model->SaveModelFile(weights, path, step, write_options);
      });
  return rig;
}

CheckpointRig::~CheckpointRig() {
  // The writer's background thread uses the exchange: it goes first.
  writer_.reset();
  exchange_.reset();
}

absl::Status CheckpointRig::Step() {
  const int64_t s = step_ + 1;
  const size_t n = gradient_storage_.size();
  const size_t num_params = n - model_->num_buffers();
  for (size_t t = 0; t < n; ++t) {
    std::vector<float>& g = gradient_storage_[t];
    for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
      g[i] = t < num_params ? GradientValue(s, t, i) : BufferValue(s, t, i);
    }
  }
  RETURN_IF_ERROR(exchange_->Step(gradients_, /*samples=*/4));
  step_ = s;
  return absl::OkStatus();
}

absl::Status CheckpointRig::BeginCheckpoint() {
  return writer_->Begin(step_, /*end_step=*/0, FixturePosition(step_),
                        weights_);
}

}  // namespace pstrain::testing
