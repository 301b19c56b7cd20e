#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/flags_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "zlib.h"

namespace pstrain {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kManifest[] = "manifest.json";
constexpr char kModelFile[] = "model.safetensors";

std::string ShardFileName(int shard) {
  return absl::StrCat("shard-", shard, ".safetensors");
}

absl::Status BadManifest(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

uint32_t ManifestCrc(const json& j) {
  const std::string text = j.dump(1);
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(text.data()),
            static_cast<uInt>(text.size())));
}

json FileJson(const CheckpointManifest::File& f) {
  return {{"file", f.name}, {"size_bytes", f.size_bytes}, {"crc32", f.crc32}};
}

// The field `key` of object `j` as T, or DATA_LOSS naming it.
template <typename T>
absl::StatusOr<T> Field(const std::string& path, const json& j,
                        const std::string& key) {
  if (!j.is_object() || !j.contains(key)) {
    return BadManifest(path, absl::StrCat("no \"", key, "\""));
  }
  const json& v = j.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is not a string"));
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is not true/false"));
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is not a number"));
    }
  } else {
    if (!v.is_number_integer() ||
        (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      return BadManifest(
          path, absl::StrCat("\"", key, "\" is not a non-negative integer"));
    }
    if (v.get<uint64_t>() >
        static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is out of range"));
    }
  }
  return v.get<T>();
}

absl::StatusOr<CheckpointManifest::File> FileField(const std::string& path,
                                                   const json& j) {
  CheckpointManifest::File f;
  ASSIGN_OR_RETURN(f.name, Field<std::string>(path, j, "file"));
  if (f.name.empty() || f.name.find('/') != std::string::npos ||
      f.name == "." || f.name == "..") {
    return BadManifest(path, absl::StrCat("file name \"", f.name,
                                          "\" is not a plain file name"));
  }
  ASSIGN_OR_RETURN(f.size_bytes, Field<uint64_t>(path, j, "size_bytes"));
  ASSIGN_OR_RETURN(f.crc32, Field<uint32_t>(path, j, "crc32"));
  return f;
}

// Makes the names in `folder` durable (fsync of the folder itself).
absl::Status SyncFolder(const std::string& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, folder);
  const int synced = fsync(fd);
  const int error = errno;
  close(fd);
  return synced == 0 ? absl::OkStatus() : ErrnoToStatus(error, folder);
}

// The step DIR/latest names, or -1 if it names none.
int64_t LatestStep(const std::string& dir) {
  std::string text;
  int64_t step = -1;
  if (!ReadFile(absl::StrCat(dir, "/latest"), &text).ok()) return -1;
  absl::string_view name = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&name, "step-") || !absl::SimpleAtoi(name, &step)) {
    return -1;
  }
  return step;
}

// With no checkpoint write in flight and DIR/latest at `latest`: removes
// every step folder but `latest` and the newest `keep` - 1 older ones that
// have a manifest. Folders after `latest` and folders without a manifest are
// what a killed writer left (a write or a removal cut short), and do not
// count as checkpoints. A manifest goes first, so that a removal cut short
// leaves no checkpoint behind. Errors are ignored: a folder left is removed
// next time.
void RemoveOldCheckpoints(const std::string& dir, int64_t latest, int keep) {
  std::vector<int64_t> older;
  std::vector<int64_t> remove;
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, error)) {
    const std::string name = e.path().filename().string();
    int64_t s = 0;
    if (!absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(absl::string_view(name).substr(5), &s) ||
        s == latest) {
      continue;
    }
    if (s < latest && fs::exists(e.path() / kManifest, error)) {
      older.push_back(s);
    } else {
      remove.push_back(s);
    }
  }
  std::sort(older.rbegin(), older.rend());
  for (size_t i = std::max(keep - 1, 0); i < older.size(); ++i) {
    remove.push_back(older[i]);
  }
  for (int64_t s : remove) {
    const std::string step_dir = absl::StrCat(dir, "/step-", s);
    fs::remove(absl::StrCat(step_dir, "/", kManifest), error);
    fs::remove_all(step_dir, error);
  }
}

}  // namespace

std::string CheckpointStepDir(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/step-", step);
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& step_dir) {
  const std::string path = absl::StrCat(step_dir, "/", kManifest);
  std::string text;
  RETURN_IF_ERROR(ReadFile(path, &text));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return BadManifest(path, "not a JSON object");
  }
  // The manifest's own checksum: crc32 of its canonical form without it.
  ASSIGN_OR_RETURN(const uint32_t crc, Field<uint32_t>(path, j, "crc32"));
  j.erase("crc32");
  if (ManifestCrc(j) != crc) {
    return BadManifest(path, "crc32 does not match its contents");
  }
  CheckpointManifest m;
  m.dir = step_dir;
  ASSIGN_OR_RETURN(std::string format, Field<std::string>(path, j, "format"));
  if (format != kCheckpointFormat) {
    return BadManifest(path,
                       absl::StrCat("format \"", format, "\"; expected \"",
                                    kCheckpointFormat, "\""));
  }
  ASSIGN_OR_RETURN(m.step, Field<int64_t>(path, j, "step"));
  CheckpointJobInfo& job = m.job;
  ASSIGN_OR_RETURN(job.mode, Field<std::string>(path, j, "mode"));
  ASSIGN_OR_RETURN(job.model, Field<std::string>(path, j, "model"));
  ASSIGN_OR_RETURN(job.dataset, Field<std::string>(path, j, "dataset"));
  ASSIGN_OR_RETURN(job.num_shards, Field<int>(path, j, "num_shards"));
  ASSIGN_OR_RETURN(job.partition_bytes,
                   Field<int64_t>(path, j, "partition_bytes"));
  if (job.num_shards < 1 || job.num_shards > 4096) {
    return BadManifest(path, absl::StrCat("num_shards ", job.num_shards,
                                          "; expected 1 to 4096"));
  }
  const std::string opt_path = path + " optimizer";
  const json empty = json::object();
  const json& opt = j.contains("optimizer") ? j["optimizer"] : empty;
  ASSIGN_OR_RETURN(std::string opt_name,
                   Field<std::string>(opt_path, opt, "name"));
  if (opt_name == "sgd") {
    job.adam.kind = OptimizerKind::kSgd;
  } else if (opt_name != "adam") {
    return BadManifest(path, absl::StrCat("optimizer \"", opt_name,
                                          "\"; expected \"adam\" or \"sgd\""));
  }
  ASSIGN_OR_RETURN(job.adam.lr, Field<float>(opt_path, opt, "lr"));
  ASSIGN_OR_RETURN(job.adam.beta1, Field<float>(opt_path, opt, "beta1"));
  ASSIGN_OR_RETURN(job.adam.beta2, Field<float>(opt_path, opt, "beta2"));
  ASSIGN_OR_RETURN(job.adam.epsilon, Field<float>(opt_path, opt, "epsilon"));
  ASSIGN_OR_RETURN(job.adam.weight_decay,
                   Field<float>(opt_path, opt, "weight_decay"));
  if (job.adam.kind == OptimizerKind::kSgd) {
    // SGD's checkpoint: m holds the momentum buffer, v zeros.
    ASSIGN_OR_RETURN(job.adam.momentum,
                     Field<float>(opt_path, opt, "momentum"));
    ASSIGN_OR_RETURN(job.adam.dampening,
                     Field<float>(opt_path, opt, "dampening"));
    ASSIGN_OR_RETURN(job.adam.nesterov, Field<bool>(opt_path, opt, "nesterov"));
  }
  const std::string pos_path = path + " data_position";
  const json& pos = j.contains("data_position") ? j["data_position"] : empty;
  DataPosition& p = m.position;
  ASSIGN_OR_RETURN(p.epoch, Field<int64_t>(pos_path, pos, "epoch"));
  ASSIGN_OR_RETURN(p.step_in_epoch,
                   Field<int64_t>(pos_path, pos, "step_in_epoch"));
  ASSIGN_OR_RETURN(p.steps_per_epoch,
                   Field<int64_t>(pos_path, pos, "steps_per_epoch"));
  ASSIGN_OR_RETURN(p.seed, Field<uint64_t>(pos_path, pos, "seed"));
  ASSIGN_OR_RETURN(p.batch_size, Field<int64_t>(pos_path, pos, "batch_size"));
  ASSIGN_OR_RETURN(p.num_workers, Field<int64_t>(pos_path, pos, "num_workers"));
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    return BadManifest(path, "no \"tensors\" array");
  }
  for (const json& t : j["tensors"]) {
    ASSIGN_OR_RETURN(std::string name, Field<std::string>(path, t, "name"));
    ASSIGN_OR_RETURN(bool buffer, Field<bool>(path, t, "buffer"));
    if (!t.contains("shape") || !t["shape"].is_array()) {
      return BadManifest(path,
                         absl::StrCat("tensor \"", name, "\" has no shape"));
    }
    std::vector<int64_t> shape;
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
        return BadManifest(
            path, absl::StrCat("tensor \"", name, "\" has a bad shape"));
      }
      shape.push_back(d.get<int64_t>());
    }
    job.tensor_names.push_back(name);
    job.tensor_shapes.push_back(shape);
    if (buffer) ++job.num_buffers;
  }
  if (!j.contains("shards") || !j["shards"].is_array() ||
      j["shards"].size() != static_cast<size_t>(job.num_shards)) {
    return BadManifest(path, absl::StrCat("\"shards\" does not list ",
                                          job.num_shards, " files"));
  }
  for (const json& s : j["shards"]) {
    ASSIGN_OR_RETURN(CheckpointManifest::File f, FileField(path, s));
    m.shard_files.push_back(f);
  }
  if (!j.contains("model_file")) return BadManifest(path, "no \"model_file\"");
  ASSIGN_OR_RETURN(m.model_file, FileField(path, j["model_file"]));
  return m;
}

absl::StatusOr<CheckpointManifest> ReadLatestCheckpoint(
    const std::string& dir) {
  const std::string latest = absl::StrCat(dir, "/latest");
  std::error_code error;
  if (!fs::exists(latest, error)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no checkpoint (no file \"latest\")"));
  }
  std::string text;
  RETURN_IF_ERROR(ReadFile(latest, &text));
  absl::string_view name = absl::StripAsciiWhitespace(text);
  if (!absl::StartsWith(name, "step-") ||
      name.find('/') != absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(
        latest, ": expected \"step-<N>\", got \"", name.substr(0, 40), "\""));
  }
  return ReadCheckpointManifest(absl::StrCat(dir, "/", name));
}

absl::StatusOr<ModelState> LoadCheckpointState(
    const CheckpointManifest& manifest, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes, int num_buffers) {
  const std::string where = absl::StrCat(manifest.dir, "/", kManifest);
  if (manifest.job.tensor_names.size() != names.size() ||
      manifest.job.num_buffers != num_buffers) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", manifest.job.tensor_names.size(), " tensors (",
        manifest.job.num_buffers, " buffers) of model \"", manifest.job.model,
        "\"; this job's model has ", names.size(), " (", num_buffers, ")"));
  }
  std::vector<int64_t> sizes;
  for (size_t t = 0; t < names.size(); ++t) {
    if (manifest.job.tensor_names[t] != names[t] ||
        manifest.job.tensor_shapes[t] != shapes[t]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor ", t, " is \"", manifest.job.tensor_names[t],
          "\" of another shape or name than this model's \"", names[t], "\""));
    }
    int64_t n = 1;
    for (int64_t d : shapes[t]) n *= d;
    sizes.push_back(n);
  }
  std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>> files;
  for (const CheckpointManifest::File& f : manifest.shard_files) {
    const std::string path = absl::StrCat(manifest.dir, "/", f.name);
    safetensors::ReadOptions options;
    options.size_bytes = f.size_bytes;
    options.crc32 = f.crc32;
    ASSIGN_OR_RETURN(std::vector<ChunkSnapshot> chunks,
                     ReadShardCheckpoint(path, options));
    files.emplace_back(path, std::move(chunks));
  }
  absl::StatusOr<ModelState> state = Assemble(sizes, files);
  if (!state.ok()) return state.status();
  for (size_t t = 0; t < names.size(); ++t) {
    const bool buffer = t + num_buffers >= names.size();
    if (state->m[t].empty() != buffer) {
      return absl::DataLossError(absl::StrCat(
          manifest.dir, ": tensor \"", names[t], "\" ",
          buffer ? "is a buffer but has Adam state" : "has no Adam state"));
    }
  }
  return state;
}

CheckpointWriter::CheckpointWriter(std::string dir, int keep,
                                   CheckpointJobInfo job,
                                   GradientExchange* exchange,
                                   SaveModelFn save_model)
    : dir_(std::move(dir)),
      keep_(std::max(keep, 1)),
      job_(std::move(job)),
      exchange_(exchange),
      save_model_(std::move(save_model)) {}

CheckpointWriter::~CheckpointWriter() {
  if (background_.joinable()) background_.join();
}

absl::Status CheckpointWriter::Wait() {
  if (background_.joinable()) background_.join();
  absl::MutexLock lock(&mu_);
  absl::Status status = std::move(background_status_);
  background_status_ = absl::OkStatus();
  return status;
}

int64_t CheckpointWriter::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

std::string CheckpointWriter::latest_path() const {
  absl::MutexLock lock(&mu_);
  return latest_path_;
}

absl::Status CheckpointWriter::Begin(
    int64_t step, const DataPosition& position,
    const std::vector<absl::Span<float>>& weights) {
  RETURN_IF_ERROR(Wait());
  // What a writer killed before this one left (this step's folder among
  // them) goes first, so that DIR holds at most keep + 1 step folders.
  if (const int64_t latest = LatestStep(dir_); latest >= 0) {
    RemoveOldCheckpoints(dir_, latest, keep_);
  }
  const std::string step_dir = CheckpointStepDir(dir_, step);
  std::error_code error;
  fs::create_directories(step_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat(step_dir, ": cannot create it: ", error.message()));
  }
  RETURN_IF_ERROR(exchange_
                      ->Checkpoint(step, step_dir, /*wait=*/false)
                      .status());
  // Into the previous checkpoint's copy (its writer is done): no fresh
  // memory to touch on the training thread.
  weights_copy_.resize(weights.size());
  for (size_t t = 0; t < weights.size(); ++t) {
    weights_copy_[t].assign(weights[t].begin(), weights[t].end());
  }
  background_ = std::thread([this, step, position]() {
    absl::Status s = Finish(step, position, weights_copy_);
    absl::MutexLock lock(&mu_);
    background_status_ = s;
  });
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Finish(
    int64_t step, const DataPosition& position,
    const std::vector<std::vector<float>>& weights) {
  const std::string step_dir = CheckpointStepDir(dir_, step);
  // The model file while the shards write theirs, then the shards' replies.
  std::vector<absl::Span<float>> spans;
  for (const std::vector<float>& w : weights) {
    spans.emplace_back(const_cast<float*>(w.data()), w.size());
  }
  // Every file of the folder is fsynced by its writer, the folder once
  // after them (the shards write theirs without the folder's fsync too).
  const std::string model_path = absl::StrCat(step_dir, "/", kModelFile);
  safetensors::WriteOptions in_folder;
  in_folder.sync_folder = false;
  absl::StatusOr<safetensors::WriteResult> model_file =
      save_model_(spans, model_path, step, in_folder);
  ASSIGN_OR_RETURN(
      std::vector<CheckpointResponse> shards,
      exchange_->Checkpoint(step, step_dir, /*wait=*/true));
  RETURN_IF_ERROR(model_file.status());
  // The data files' names, then the step folder's own, are durable before
  // the manifest can exist.
  RETURN_IF_ERROR(SyncFolder(step_dir));
  RETURN_IF_ERROR(SyncFolder(dir_));

  json j;
  j["format"] = kCheckpointFormat;
  j["step"] = step;
  j["mode"] = job_.mode;
  j["model"] = job_.model;
  j["dataset"] = job_.dataset;
  j["num_shards"] = job_.num_shards;
  j["partition_bytes"] = job_.partition_bytes;
  j["optimizer"] = {{"name", std::string(OptimizerName(job_.adam.kind))},
                    {"lr", job_.adam.lr},
                    {"beta1", job_.adam.beta1},
                    {"beta2", job_.adam.beta2},
                    {"epsilon", job_.adam.epsilon},
                    {"weight_decay", job_.adam.weight_decay},
                    {"step_count", step}};
  if (job_.adam.kind == OptimizerKind::kSgd) {
    j["optimizer"]["momentum"] = job_.adam.momentum;
    j["optimizer"]["dampening"] = job_.adam.dampening;
    j["optimizer"]["nesterov"] = job_.adam.nesterov;
  }
  j["data_position"] = {{"epoch", position.epoch},
                        {"step_in_epoch", position.step_in_epoch},
                        {"steps_per_epoch", position.steps_per_epoch},
                        {"seed", position.seed},
                        {"batch_size", position.batch_size},
                        {"num_workers", position.num_workers}};
  json tensors = json::array();
  for (size_t t = 0; t < job_.tensor_names.size(); ++t) {
    tensors.push_back(
        {{"name", job_.tensor_names[t]},
         {"shape", job_.tensor_shapes[t]},
         {"buffer", t + job_.num_buffers >= job_.tensor_names.size()}});
  }
  j["tensors"] = tensors;
  json files = json::array();
  for (int s = 0; s < job_.num_shards; ++s) {
    json f = FileJson({ShardFileName(s),
                       static_cast<uint64_t>(shards[s].size_bytes()),
                       shards[s].crc32()});
    f["min_version"] = shards[s].min_version();
    f["max_version"] = shards[s].max_version();
    files.push_back(f);
  }
  j["shards"] = files;
  j["model_file"] =
      FileJson({kModelFile, model_file->size_bytes, model_file->crc32});
  j["crc32"] = ManifestCrc(j);
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(step_dir, "/", kManifest),
                                      j.dump(1) + "\n"));
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir_, "/latest"),
                                      absl::StrCat("step-", step, "\n")));
  {
    absl::MutexLock lock(&mu_);
    ++completed_;
    latest_path_ = step_dir;
  }
  // Keep the newest `keep_` checkpoints; older ones go only now that the new
  // one is durable and named by `latest`.
  RemoveOldCheckpoints(dir_, step, keep_);
  return absl::OkStatus();
}

}  // namespace pstrain
