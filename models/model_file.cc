#include "models/model_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/nonfinite.h"
#include "common/regular_file.h"
#include "common/safetensors.h"

namespace pstrain {
namespace {

constexpr char kFormat[] = "pstrain.model/1";
constexpr char kRunningMean[] = ".running_mean";
constexpr char kBatchesTracked[] = ".num_batches_tracked";

struct NamedShape {
  std::string name;
  Shape shape;
};

// The model's PS tensors in HostWeights() order: parameters, then buffers.
std::vector<NamedShape> PsTensors(const Model& model) {
  std::vector<NamedShape> out;
  for (const Param* p : model.params()) {
    out.push_back({p->name, p->value.shape()});
  }
  for (const Buffer* b : model.buffers()) {
    out.push_back({b->name, b->value.shape()});
  }
  return out;
}

std::string JoinDoubles(const std::vector<double>& values) {
  return absl::StrJoin(values, ",", [](std::string* out, double v) {
    absl::StrAppend(out, absl::StrFormat("%.9g", v));
  });
}

// Parses "a,b,c" into `out`; false for an empty or malformed list.
bool SplitDoubles(absl::string_view text, std::vector<double>* out) {
  out->clear();
  if (text.empty()) return false;
  for (absl::string_view d : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(d, &v) || !std::isfinite(v)) return false;
    out->push_back(v);
  }
  return true;
}

}  // namespace

std::string ModelFilePath(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::StrCat(absl::StripSuffix(path, "/"), "/model.safetensors");
  }
  return path;
}

absl::StatusOr<safetensors::WriteResult> SaveModelFile(
    const Model& model, absl::Span<const absl::Span<float>> weights,
    const ModelFileInfo& info, const std::string& path,
    const safetensors::WriteOptions& options) {
  const std::vector<NamedShape> tensors = PsTensors(model);
  if (weights.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", weights.size(), " weight tensors for model ",
                     model.name(), ", which has ", tensors.size()));
  }
  std::vector<safetensors::TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (static_cast<int64_t>(weights[i].size()) !=
        NumElements(tensors[i].shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", tensors[i].name, "' has ", weights[i].size(),
          " elements; its shape ", ShapeToString(tensors[i].shape), " has ",
          NumElements(tensors[i].shape)));
    }
    views.push_back(
        safetensors::F32View(tensors[i].name, tensors[i].shape, weights[i]));
  }
  // torch.nn.BatchNorm2d's counter, one per layer that has running stats.
  const int64_t steps = info.steps;
  for (const Buffer* b : model.buffers()) {
    if (!absl::EndsWith(b->name, kRunningMean)) continue;
    views.push_back(safetensors::I64View(
        absl::StrCat(absl::StripSuffix(b->name, kRunningMean), kBatchesTracked),
        {}, absl::MakeConstSpan(&steps, 1)));
  }
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"model", info.model},
      {"input_chw", absl::StrJoin(info.input_chw, ",")},
      {"num_classes", absl::StrCat(info.num_classes)},
      {"steps", absl::StrCat(info.steps)},
      {"dataset", info.dataset},
  };
  if (!info.input_mean.empty()) {
    metadata["input_mean"] = JoinDoubles(info.input_mean);
    metadata["input_stddev"] = JoinDoubles(info.input_stddev);
  }
  return safetensors::Write(path, views, metadata, options);
}

safetensors::ReadOptions UserFileOptions() {
  safetensors::ReadOptions options;
  options.follow_symlinks = true;
  return options;
}

absl::StatusOr<ModelFileInfo> ReadModelFileInfo(const std::string& path) {
  return ReadModelFileInfo(path, UserFileOptions());
}

absl::StatusOr<ModelFileInfo> ReadModelFileInfo(
    const std::string& path, const safetensors::ReadOptions& options) {
  absl::StatusOr<safetensors::File> file =
      safetensors::File::Read(path, options);
  if (!file.ok()) return file.status();
  const std::map<std::string, std::string>& m = file->metadata();
  auto get = [&](const char* key) -> std::string {
    auto it = m.find(key);
    return it == m.end() ? "" : it->second;
  };
  if (get("format") != kFormat) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a pstrain model file (metadata \"format\" is \"",
        EscapeForMessage(get("format")), "\"; expected \"", kFormat, "\")"));
  }
  ModelFileInfo info;
  info.model = get("model");
  info.dataset = get("dataset");
  for (absl::string_view d : absl::StrSplit(get("input_chw"), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v) || v <= 0) {
      info.input_chw.clear();
      break;
    }
    info.input_chw.push_back(v);
  }
  const size_t dims = info.input_chw.size();
  if (info.model.empty() || (dims != 3 && dims != 1) ||
      !absl::SimpleAtoi(get("num_classes"), &info.num_classes) ||
      info.num_classes <= 0 || !absl::SimpleAtoi(get("steps"), &info.steps)) {
    return absl::DataLossError(absl::StrCat(
        path, ": bad model metadata (model \"", EscapeForMessage(info.model),
        "\", input_chw \"", EscapeForMessage(get("input_chw")),
        "\", num_classes \"", EscapeForMessage(get("num_classes")),
        "\", steps \"", EscapeForMessage(get("steps")), "\")"));
  }
  // Optional (files before these keys have neither); if present, one
  // finite mean and one positive stddev per input channel.
  const std::string mean = get("input_mean"), stddev = get("input_stddev");
  if (!mean.empty() || !stddev.empty()) {
    const size_t channels = dims == 3 ? info.input_chw[0] : 0;
    if (!SplitDoubles(mean, &info.input_mean) ||
        !SplitDoubles(stddev, &info.input_stddev) ||
        info.input_mean.size() != channels ||
        info.input_stddev.size() != channels ||
        *std::min_element(info.input_stddev.begin(), info.input_stddev.end()) <=
            0) {
      return absl::DataLossError(absl::StrCat(
          path, ": bad input standardisation metadata (input_mean \"",
          EscapeForMessage(mean), "\", input_stddev \"",
          EscapeForMessage(stddev), "\"; expected ", channels,
          " comma-separated values each, stddev > 0)"));
    }
  }
  return info;
}

absl::Status LoadModelFile(const std::string& path, Model* model) {
  return LoadModelFile(path, model, UserFileOptions());
}

absl::Status LoadModelFile(const std::string& path, Model* model,
                           const safetensors::ReadOptions& options) {
  absl::StatusOr<safetensors::File> file =
      safetensors::File::Read(path, options);
  if (!file.ok()) return file.status();
  const std::vector<NamedShape> tensors = PsTensors(*model);
  // Everything is checked before any weight is written.
  std::vector<const safetensors::Tensor*> found;
  absl::flat_hash_set<std::string> names;
  for (const NamedShape& t : tensors) {
    // NOT_FOUND when absent, INVALID_ARGUMENT for another dtype or shape.
    absl::StatusOr<const safetensors::Tensor*> checked =
        file->Get(t.name, safetensors::Dtype::kF32, t.shape);
    if (!checked.ok()) return checked.status();
    // A NaN or infinity would train (or evaluate) to nonsense and be saved
    // again: refused, naming the tensor.
    const safetensors::Tensor& tensor = **checked;
    const int64_t bad = FindNonFinite(
        absl::MakeConstSpan(reinterpret_cast<const float*>(tensor.bytes.data()),
                            static_cast<size_t>(tensor.num_elements)));
    if (bad >= 0) {
      float value = 0;
      std::memcpy(&value, tensor.bytes.data() + bad * sizeof(float),
                  sizeof(float));
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", t.name, "' element ", bad, " is ",
          NonFiniteText(value), "; a model's weights must be finite"));
    }
    found.push_back(*checked);
    names.insert(t.name);
  }
  for (const safetensors::Tensor& f : file->tensors()) {
    if (!names.contains(f.name) && !absl::EndsWith(f.name, kBatchesTracked)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", EscapeForMessage(f.name),
          "' is not a parameter or buffer of model ", model->name(), " (",
          ShapeToString(model->input_chw()), " input)"));
    }
  }
  const std::vector<absl::Span<float>>& host = model->HostWeights();
  for (size_t i = 0; i < found.size(); ++i) {
    std::memcpy(host[i].data(), found[i]->bytes.data(), found[i]->bytes.size());
  }
  return model->LoadHostWeights();
}

}  // namespace pstrain
