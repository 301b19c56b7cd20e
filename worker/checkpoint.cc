#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/regular_file.h"
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
// Read limits: a manifest lists every tensor's name and shape (ResNet-50's
// is 60 KB); `latest` holds "step-<N>\n".
constexpr uint64_t kMaxManifestBytes = 16 << 20;
constexpr uint64_t kMaxLatestBytes = 64;
// Bounds of a manifest's fields that nothing else bounds: the job spec's
// (coordinator/job_spec.h) where it has one.
constexpr int kMaxShards = 4096;
constexpr int64_t kMaxStepsPerEpoch = int64_t{1} << 40;
constexpr int64_t kMaxBatchSize = 65536;
constexpr int64_t kMaxWorkers = 4096;
constexpr int64_t kMaxLossScalerGrowthTracker = int64_t{1} << 40;
constexpr size_t kMaxTensors = 1 << 20;
constexpr size_t kMaxTensorDims = 8;
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
constexpr size_t kMaxNameBytes = 4096;

// Text from a file, quoted for a one-line message.
std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", EscapeForMessage(text), "\"");
}

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
    if (v.get_ref<const std::string&>().size() > kMaxNameBytes) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is longer than ",
                                            kMaxNameBytes, " bytes"));
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) {
      return BadManifest(path, absl::StrCat("\"", key, "\" is not true/false"));
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number() || !std::isfinite(v.get<T>())) {
      return BadManifest(path,
                         absl::StrCat("\"", key, "\" is not a finite number"));
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

// A manifest's "loss_scaler" object (fp16 precision), or DATA_LOSS naming
// the field out of range.
absl::StatusOr<LossScaler::State> LossScalerField(const std::string& manifest,
                                                  const json& j) {
  const std::string path = manifest + " loss_scaler";
  LossScaler::State state;
  ASSIGN_OR_RETURN(state.scale, Field<float>(path, j, "scale"));
  ASSIGN_OR_RETURN(state.growth_tracker,
                   Field<int64_t>(path, j, "growth_tracker"));
  if (state.scale <= 0) {
    return BadManifest(
        path, absl::StrCat("scale ", state.scale, "; expected above 0"));
  }
  if (state.growth_tracker > kMaxLossScalerGrowthTracker) {
    return BadManifest(
        path, absl::StrCat("growth_tracker ", state.growth_tracker,
                           "; expected 0 to ", kMaxLossScalerGrowthTracker));
  }
  return state;
}

absl::StatusOr<CheckpointManifest::File> FileField(const std::string& path,
                                                   const json& j) {
  CheckpointManifest::File f;
  ASSIGN_OR_RETURN(f.name, Field<std::string>(path, j, "file"));
  if (f.name.empty() || f.name.find('/') != std::string::npos ||
      f.name == "." || f.name == "..") {
    return BadManifest(path, absl::StrCat("file name ", Quoted(f.name),
                                          " is not a plain file name"));
  }
  ASSIGN_OR_RETURN(f.size_bytes, Field<uint64_t>(path, j, "size_bytes"));
  ASSIGN_OR_RETURN(f.crc32, Field<uint32_t>(path, j, "crc32"));
  // The smallest safetensors file is its 8-byte length and "{}".
  if (f.size_bytes < 10 || f.size_bytes > safetensors::kMaxFileBytes) {
    return BadManifest(
        path,
        absl::StrCat("file ", Quoted(f.name), ": size_bytes ", f.size_bytes,
                     "; expected 10 to ", safetensors::kMaxFileBytes));
  }
  return f;
}

// `value` of field `name` within [lo, hi] (finite), or DATA_LOSS naming it.
absl::Status CheckBetween(const std::string& path, absl::string_view name,
                          double value, double lo, double hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return BadManifest(
      path, absl::StrCat(name, " ", value, "; expected ", lo, " to ", hi));
}

// An optimizer's hyperparameters within the job spec's ranges.
absl::Status CheckOptimizer(const std::string& path,
                            const OptimizerOptions& o) {
  RETURN_IF_ERROR(CheckBetween(path, "optimizer lr", o.lr, 1e-30, 10));
  RETURN_IF_ERROR(CheckBetween(path, "optimizer epsilon", o.epsilon, 1e-30, 1));
  RETURN_IF_ERROR(
      CheckBetween(path, "optimizer weight_decay", o.weight_decay, 0, 1));
  RETURN_IF_ERROR(CheckBetween(path, "optimizer dampening", o.dampening, 0, 1));
  const std::pair<const char*, float> below_one[] = {
      {"beta1", o.beta1}, {"beta2", o.beta2}, {"momentum", o.momentum}};
  for (const auto& [name, value] : below_one) {
    if (!(value >= 0 && value < 1)) {
      return BadManifest(path, absl::StrCat("optimizer ", name, " ", value,
                                            "; expected 0 <= ", name, " < 1"));
    }
  }
  return absl::OkStatus();
}

// The data position against itself and the checkpoint's step: a position
// is where step `step`'s successor takes its batch.
absl::Status CheckPosition(const std::string& path, int64_t step,
                           const DataPosition& p) {
  const std::string where = path + " data_position";
  if (p.steps_per_epoch < 1 || p.steps_per_epoch > kMaxStepsPerEpoch) {
    return BadManifest(where,
                       absl::StrCat("steps_per_epoch ", p.steps_per_epoch,
                                    "; expected 1 to ", kMaxStepsPerEpoch));
  }
  if (p.step_in_epoch >= p.steps_per_epoch) {
    return BadManifest(where,
                       absl::StrCat("step_in_epoch ", p.step_in_epoch,
                                    "; expected less than steps_per_epoch ",
                                    p.steps_per_epoch));
  }
  // Without an offset every epoch had steps_per_epoch steps; with one (an
  // elastic job's, worker/data_position.h) the epoch's steps before the
  // checkpoint's are at most its step.
  int64_t position_step = 0;
  if (p.offset >= 0) {
    if (p.epoch < 0 || p.step_in_epoch < 0 || p.step_in_epoch > step) {
      return BadManifest(
          where,
          absl::StrCat("epoch ", p.epoch, ", step_in_epoch ", p.step_in_epoch,
                       " do not fit the checkpoint's "
                       "step ",
                       step));
    }
  } else if (p.offset != -1) {
    return BadManifest(
        where, absl::StrCat("offset ", p.offset, "; expected 0 or more"));
  } else if (__builtin_mul_overflow(p.epoch, p.steps_per_epoch,
                                    &position_step) ||
             __builtin_add_overflow(position_step, p.step_in_epoch,
                                    &position_step) ||
             position_step != step) {
    return BadManifest(
        where,
        absl::StrCat("epoch ", p.epoch, " x steps_per_epoch ",
                     p.steps_per_epoch, " + step_in_epoch ", p.step_in_epoch,
                     " is not the checkpoint's step ", step));
  }
  if (p.batch_size < 1 || p.batch_size > kMaxBatchSize) {
    return BadManifest(where, absl::StrCat("batch_size ", p.batch_size,
                                           "; expected 1 to ", kMaxBatchSize));
  }
  if (p.num_workers < 1 || p.num_workers > kMaxWorkers) {
    return BadManifest(where, absl::StrCat("num_workers ", p.num_workers,
                                           "; expected 1 to ", kMaxWorkers));
  }
  return absl::OkStatus();
}

// The "tensors" list: names unique and bounded, shapes of positive
// dimensions whose product is bounded, buffers after every parameter.
absl::Status ReadTensors(const std::string& path, const json& j,
                         CheckpointJobInfo* job) {
  if (!j.contains("tensors") || !j["tensors"].is_array() ||
      j["tensors"].empty() || j["tensors"].size() > kMaxTensors) {
    return BadManifest(path, absl::StrCat("no \"tensors\" array of 1 to ",
                                          kMaxTensors, " tensors"));
  }
  std::set<std::string> names;
  for (const json& t : j["tensors"]) {
    ASSIGN_OR_RETURN(std::string name, Field<std::string>(path, t, "name"));
    ASSIGN_OR_RETURN(bool buffer, Field<bool>(path, t, "buffer"));
    const std::string what = absl::StrCat("tensor ", Quoted(name));
    if (name.empty() || !names.insert(name).second) {
      return BadManifest(path, absl::StrCat(what, " is empty or listed twice"));
    }
    if (!buffer && job->num_buffers > 0) {
      return BadManifest(path,
                         absl::StrCat(what, " is a parameter after a buffer"));
    }
    if (!t.contains("shape") || !t["shape"].is_array() ||
        t["shape"].size() > kMaxTensorDims) {
      return BadManifest(path, absl::StrCat(what, " has no shape of at most ",
                                            kMaxTensorDims, " dimensions"));
    }
    std::vector<int64_t> shape;
    int64_t elements = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0 ||
          __builtin_mul_overflow(elements, d.get<int64_t>(), &elements) ||
          elements > kMaxTensorElements) {
        return BadManifest(
            path, absl::StrCat(what,
                               " has a dimension that is not positive, "
                               "or more than ",
                               kMaxTensorElements, " elements"));
      }
      shape.push_back(d.get<int64_t>());
    }
    job->tensor_names.push_back(name);
    job->tensor_shapes.push_back(shape);
    if (buffer) ++job->num_buffers;
  }
  return absl::OkStatus();
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

// Writes `contents` to `path` atomically and durably, as
// WriteFileAtomically does, but with its temporary file `path`.tmp created
// O_EXCL|O_NOFOLLOW after removing whatever had that name (a link left
// there is removed, never written through), mode 0666 less the umask.
absl::Status WriteCheckpointFile(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, tmp);
  }
  const int fd = open(
      tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoToStatus(errno, tmp);
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  const int error = errno;
  const bool written = left == 0 && fsync(fd) == 0;
  if (close(fd) != 0 || !written) {
    unlink(tmp.c_str());
    return ErrnoToStatus(written ? errno : error, absl::StrCat(tmp, ": write"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_error = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(rename_error, path);
  }
  const size_t slash = path.find_last_of('/');
  return SyncFolder(slash == std::string::npos ? "." : path.substr(0, slash));
}

// The step DIR/latest names, or -1 if it names none.
int64_t LatestStep(const std::string& dir) {
  std::string text;
  int64_t step = -1;
  absl::StatusOr<std::string> read =
      ReadSmallFile(absl::StrCat(dir, "/latest"), kMaxLatestBytes);
  if (!read.ok()) return -1;
  text = *std::move(read);
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
  ASSIGN_OR_RETURN(const std::string text,
                   ReadSmallFile(path, kMaxManifestBytes));
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
                       absl::StrCat("format ", Quoted(format), "; expected \"",
                                    kCheckpointFormat, "\""));
  }
  ASSIGN_OR_RETURN(m.step, Field<int64_t>(path, j, "step"));
  // The folder's name says the step too (not when read through another
  // name, such as a copy's).
  absl::string_view folder = absl::StripSuffix(step_dir, "/");
  folder = folder.substr(folder.rfind('/') + 1);
  int64_t folder_step = 0;
  if (absl::ConsumePrefix(&folder, "step-") &&
      absl::SimpleAtoi(folder, &folder_step) && folder_step != m.step) {
    return BadManifest(
        path, absl::StrCat("step ", m.step, " in folder step-", folder_step));
  }
  CheckpointJobInfo& job = m.job;
  ASSIGN_OR_RETURN(const std::string mode, Field<std::string>(path, j, "mode"));
  absl::StatusOr<Mode> parsed_mode = ParseMode(mode);
  if (!parsed_mode.ok()) {
    return BadManifest(path, absl::StrCat("mode ", Quoted(mode),
                                          "; expected sync, async or "
                                          "allreduce"));
  }
  job.mode = *parsed_mode;
  ASSIGN_OR_RETURN(job.model, Field<std::string>(path, j, "model"));
  ASSIGN_OR_RETURN(job.dataset, Field<std::string>(path, j, "dataset"));
  ASSIGN_OR_RETURN(job.num_shards, Field<int>(path, j, "num_shards"));
  ASSIGN_OR_RETURN(job.partition_bytes,
                   Field<int64_t>(path, j, "partition_bytes"));
  if (job.num_shards < 1 || job.num_shards > kMaxShards) {
    return BadManifest(path, absl::StrCat("num_shards ", job.num_shards,
                                          "; expected 1 to ", kMaxShards));
  }
  if (job.partition_bytes < 1) {
    return BadManifest(path,
                       absl::StrCat("partition_bytes ", job.partition_bytes,
                                    "; expected at least 1"));
  }
  const std::string opt_path = path + " optimizer";
  const json empty = json::object();
  const json& opt = j.contains("optimizer") ? j["optimizer"] : empty;
  ASSIGN_OR_RETURN(std::string opt_name,
                   Field<std::string>(opt_path, opt, "name"));
  // Written as OptimizerName(kind) (optim/optimizer.h): a job spec's
  // spelling (catalog/job_config.h).
  const absl::StatusOr<OptimizerAlgorithm> algorithm = ParseOptimizer(opt_name);
  if (!algorithm.ok()) {
    return BadManifest(path, absl::StrCat("optimizer ", Quoted(opt_name),
                                          "; expected \"adam\" or \"sgd\""));
  }
  if (*algorithm == OPTIMIZER_SGD) job.adam.kind = OptimizerKind::kSgd;
  ASSIGN_OR_RETURN(job.adam.lr, Field<float>(opt_path, opt, "lr"));
  ASSIGN_OR_RETURN(job.adam.beta1, Field<float>(opt_path, opt, "beta1"));
  ASSIGN_OR_RETURN(job.adam.beta2, Field<float>(opt_path, opt, "beta2"));
  ASSIGN_OR_RETURN(job.adam.epsilon, Field<float>(opt_path, opt, "epsilon"));
  ASSIGN_OR_RETURN(job.adam.weight_decay,
                   Field<float>(opt_path, opt, "weight_decay"));
  ASSIGN_OR_RETURN(const int64_t step_count,
                   Field<int64_t>(opt_path, opt, "step_count"));
  if (step_count != m.step) {
    return BadManifest(opt_path, absl::StrCat("step_count ", step_count,
                                              "; expected the step, ", m.step));
  }
  if (job.adam.kind == OptimizerKind::kSgd) {
    // SGD's checkpoint: m holds the momentum buffer, v zeros.
    ASSIGN_OR_RETURN(job.adam.momentum,
                     Field<float>(opt_path, opt, "momentum"));
    ASSIGN_OR_RETURN(job.adam.dampening,
                     Field<float>(opt_path, opt, "dampening"));
    ASSIGN_OR_RETURN(job.adam.nesterov, Field<bool>(opt_path, opt, "nesterov"));
  }
  RETURN_IF_ERROR(CheckOptimizer(opt_path, job.adam));
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
  if (pos.is_object() && pos.contains("offset")) {
    ASSIGN_OR_RETURN(p.offset, Field<int64_t>(pos_path, pos, "offset"));
  }
  RETURN_IF_ERROR(CheckPosition(path, m.step, p));
  RETURN_IF_ERROR(ReadTensors(path, j, &job));
  if (!j.contains("shards") || !j["shards"].is_array() ||
      j["shards"].size() != static_cast<size_t>(job.num_shards)) {
    return BadManifest(path, absl::StrCat("\"shards\" does not list ",
                                          job.num_shards, " files"));
  }
  for (const json& s : j["shards"]) {
    ASSIGN_OR_RETURN(CheckpointManifest::File f, FileField(path, s));
    const std::string expected = ShardFileName(m.shard_files.size());
    if (f.name != expected) {
      return BadManifest(
          path, absl::StrCat("shard ", m.shard_files.size(), " is file ",
                             Quoted(f.name), "; expected \"", expected, "\""));
    }
    ASSIGN_OR_RETURN(const int64_t min_version,
                     Field<int64_t>(path, s, "min_version"));
    ASSIGN_OR_RETURN(const int64_t max_version,
                     Field<int64_t>(path, s, "max_version"));
    if (min_version > max_version) {
      return BadManifest(path,
                         absl::StrCat(expected, ": min_version ", min_version,
                                      " after max_version ", max_version));
    }
    m.shard_files.push_back(f);
  }
  // Optional (older manifests have none): the job's checkpoints so far.
  if (j.contains("checkpoint_count")) {
    ASSIGN_OR_RETURN(m.checkpoint_count,
                     Field<int64_t>(path, j, "checkpoint_count"));
  }
  if (j.contains("loss_scaler")) {
    ASSIGN_OR_RETURN(m.loss_scaler, LossScalerField(path, j["loss_scaler"]));
  }
  if (!j.contains("model_file")) return BadManifest(path, "no \"model_file\"");
  ASSIGN_OR_RETURN(m.model_file, FileField(path, j["model_file"]));
  if (m.model_file.name != kModelFile) {
    return BadManifest(path,
                       absl::StrCat("model_file is ", Quoted(m.model_file.name),
                                    "; expected \"", kModelFile, "\""));
  }
  return m;
}

absl::StatusOr<CheckpointManifest> ReadLatestCheckpoint(
    const std::string& dir) {
  const std::string latest = absl::StrCat(dir, "/latest");
  absl::StatusOr<std::string> text = ReadSmallFile(latest, kMaxLatestBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no checkpoint (no file \"latest\")"));
  }
  if (!text.ok()) return text.status();
  absl::string_view name = absl::StripAsciiWhitespace(*text);
  absl::string_view number = name;
  int64_t step = 0;
  if (!absl::ConsumePrefix(&number, "step-") ||
      !absl::SimpleAtoi(number, &step) || step < 0 ||
      name != absl::StrCat("step-", step)) {
    return absl::DataLossError(
        absl::StrCat(latest, ": expected \"step-<N>\", got ", Quoted(name)));
  }
  return ReadCheckpointManifest(CheckpointStepDir(dir, step));
}

absl::Status CheckManifestModel(const CheckpointManifest& manifest,
                                const std::vector<std::string>& names,
                                const std::vector<std::vector<int64_t>>& shapes,
                                int num_buffers) {
  const std::string where = absl::StrCat(manifest.dir, "/", kManifest);
  if (manifest.job.tensor_names.size() != names.size() ||
      manifest.job.num_buffers != num_buffers) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", manifest.job.tensor_names.size(), " tensors (",
        manifest.job.num_buffers, " buffers) of model ",
        Quoted(manifest.job.model), "; this job's model has ", names.size(),
        " (", num_buffers, ")"));
  }
  for (size_t t = 0; t < names.size(); ++t) {
    if (manifest.job.tensor_names[t] != names[t] ||
        manifest.job.tensor_shapes[t] != shapes[t]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor ", t, " is ", Quoted(manifest.job.tensor_names[t]),
          " of another shape or name than this model's \"", names[t], "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelState> LoadCheckpointState(
    const CheckpointManifest& manifest, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes, int num_buffers) {
  RETURN_IF_ERROR(CheckManifestModel(manifest, names, shapes, num_buffers));
  std::vector<int64_t> sizes;
  for (size_t t = 0; t < names.size(); ++t) {
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

absl::StatusOr<CheckpointModelFile> FindModelFile(const std::string& path) {
  CheckpointModelFile found;
  auto from_manifest = [&](CheckpointManifest manifest) {
    found.path = absl::StrCat(manifest.dir, "/", manifest.model_file.name);
    found.options.size_bytes = manifest.model_file.size_bytes;
    found.options.crc32 = manifest.model_file.crc32;
    found.manifest = std::move(manifest);
    return found;
  };
  std::error_code error;
  const fs::path given(path);
  // lstat: a link in place of a checkpoint's file is the reader's to
  // refuse, with its own message.
  auto present = [&](const fs::path& p) {
    return fs::symlink_status(p, error).type() != fs::file_type::not_found;
  };
  if (fs::is_directory(given, error)) {
    const std::string dir(absl::StripSuffix(path, "/"));
    if (present(given / kManifest)) {  // DIR/step-<N>
      ASSIGN_OR_RETURN(CheckpointManifest m, ReadCheckpointManifest(dir));
      return from_manifest(std::move(m));
    }
    if (present(given / kModelFile)) {  // A job's final model.
      found.path = absl::StrCat(dir, "/", kModelFile);
      return found;
    }
    if (present(given / "latest")) {  // A job that ended before its end.
      ASSIGN_OR_RETURN(CheckpointManifest m, ReadLatestCheckpoint(dir));
      return from_manifest(std::move(m));
    }
    return absl::NotFoundError(absl::StrCat(
        dir, ": no ", kModelFile, ", no ", kManifest,
        " and no checkpoint (\"latest\"); expected a model file, a job's "
        "checkpoint_dir or one of its step-<N> folders"));
  }
  // A file: a checkpoint's model file is checked against the manifest
  // beside it.
  const fs::path folder = given.has_parent_path() ? given.parent_path() : ".";
  if (given.filename() == kModelFile && present(folder / kManifest)) {
    ASSIGN_OR_RETURN(CheckpointManifest m,
                     ReadCheckpointManifest(folder.string()));
    return from_manifest(std::move(m));
  }
  found.path = path;
  found.options.follow_symlinks = true;  // A file the user named.
  return found;
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

void CheckpointWriter::ContinueCount(int64_t checkpoints_before) {
  absl::MutexLock lock(&mu_);
  checkpoints_before_ = checkpoints_before;
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
    int64_t step, int64_t end_step, const DataPosition& position,
    const std::vector<absl::Span<float>>& weights,
    const std::function<DataPosition(int64_t)>& position_of) {
  if (begun_step_ > step && InFlight()) {
    // Backup workers: shard 0 picked the cut in flight where the other
    // workers were, ahead of this worker's step still. Its residual file
    // from this worker is written on this thread once its step reaches the
    // cut, so waiting here would wait for ourselves; the checkpoint in
    // flight, of a later step, stands for this one.
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Wait());
  // What a writer killed before this one left (this step's folder among
  // them) goes first, so that DIR holds at most keep + 1 step folders.
  const int64_t latest = LatestStep(dir_);
  if (latest >= 0) RemoveOldCheckpoints(dir_, latest, keep_);
  std::string step_dir = CheckpointStepDir(dir_, step);
  std::error_code error;
  fs::create_directories(step_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat(step_dir, ": cannot create it: ", error.message()));
  }
  absl::StatusOr<std::vector<CheckpointResponse>> begun_or =
      exchange_->Checkpoint(step, end_step, latest, step_dir, /*wait=*/false);
  if (absl::IsOutOfRange(begun_or.status())) {
    fs::remove(step_dir, error);  // empty: nothing was written there
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointResponse> begun, std::move(begun_or));
  // Backup workers: shard 0 picked a later cut (PsClient::Checkpoint); the
  // checkpoint is of that step, its data position that step's.
  DataPosition at = position;
  if (!begun.empty() && begun[0].step() > step) {
    fs::remove(step_dir, error);  // empty: nothing was written there
    step = begun[0].step();
    step_dir = CheckpointStepDir(dir_, step);
    fs::create_directories(step_dir, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat(step_dir, ": cannot create it: ", error.message()));
    }
    if (position_of) {
      at = position_of(step);
    } else if (at.steps_per_epoch > 0) {
      at.epoch = step / at.steps_per_epoch;
      at.step_in_epoch = step % at.steps_per_epoch;
    }
  }
  // Into the previous checkpoint's copy (its writer is done): no fresh
  // memory to touch on the training thread.
  weights_copy_.resize(weights.size());
  for (size_t t = 0; t < weights.size(); ++t) {
    weights_copy_[t].assign(weights[t].begin(), weights[t].end());
  }
  begun_step_ = step;
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = true;
  }
  std::optional<LossScaler::State> loss_scaler;
  if (loss_scaler_ != nullptr) loss_scaler = loss_scaler_->state();
  background_ = std::thread([this, step, position = at, loss_scaler]() {
    absl::Status s = Finish(step, position, loss_scaler, weights_copy_);
    absl::MutexLock lock(&mu_);
    background_status_ = s;
    in_flight_ = false;
  });
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Finish(
    int64_t step, const DataPosition& position,
    const std::optional<LossScaler::State>& loss_scaler,
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
      absl::UnknownError("not written");
  if (!model_from_shards_) {
    model_file = save_model_(spans, model_path, step, in_folder);
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointResponse> shards,
                   exchange_->Checkpoint(step, /*end_step=*/0,
                                         /*latest_step=*/-1, step_dir,
                                         /*wait=*/true));
  // One file per shard of the layout the cut was taken on: an elastic job's
  // worker 0 may have moved the state onto another number of shards since
  // the job began (issue 40), and a membership change waits for the
  // checkpoint in flight, so the count is the replies'.
  const int num_shards = static_cast<int>(shards.size());
  if (model_from_shards_) {
    // Worker 0's weights are not the cut's (see set_model_from_shards()):
    // the model file comes from the shard files just written.
    CheckpointManifest written;
    written.dir = step_dir;
    written.step = step;
    written.job = job_;
    written.job.num_shards = num_shards;
    for (int s = 0; s < num_shards; ++s) {
      written.shard_files.push_back(
          {ShardFileName(s), static_cast<uint64_t>(shards[s].size_bytes()),
           shards[s].crc32()});
    }
    ASSIGN_OR_RETURN(ModelState cut,
                     LoadCheckpointState(written, job_.tensor_names,
                                         job_.tensor_shapes, job_.num_buffers));
    spans.clear();
    for (std::vector<float>& w : cut.weights) spans.emplace_back(w);
    model_file = save_model_(spans, model_path, step, in_folder);
  }
  RETURN_IF_ERROR(model_file.status());
  // The data files' names, then the step folder's own, are durable before
  // the manifest can exist.
  RETURN_IF_ERROR(SyncFolder(step_dir));
  RETURN_IF_ERROR(SyncFolder(dir_));

  json j;
  j["format"] = kCheckpointFormat;
  j["step"] = step;
  j["mode"] = std::string(Spelling(job_.mode));
  j["model"] = job_.model;
  j["dataset"] = job_.dataset;
  j["num_shards"] = num_shards;
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
  if (position.offset >= 0) j["data_position"]["offset"] = position.offset;
  if (loss_scaler.has_value()) {
    j["loss_scaler"] = {{"scale", loss_scaler->scale},
                        {"growth_tracker", loss_scaler->growth_tracker}};
  }
  json tensors = json::array();
  for (size_t t = 0; t < job_.tensor_names.size(); ++t) {
    tensors.push_back(
        {{"name", job_.tensor_names[t]},
         {"shape", job_.tensor_shapes[t]},
         {"buffer", t + job_.num_buffers >= job_.tensor_names.size()}});
  }
  j["tensors"] = tensors;
  json files = json::array();
  for (int s = 0; s < num_shards; ++s) {
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
  {
    absl::MutexLock lock(&mu_);
    j["checkpoint_count"] = checkpoints_before_ + completed_ + 1;
  }
  j["crc32"] = ManifestCrc(j);
  RETURN_IF_ERROR(WriteCheckpointFile(absl::StrCat(step_dir, "/", kManifest),
                                      j.dump(1) + "\n"));
  RETURN_IF_ERROR(WriteCheckpointFile(absl::StrCat(dir_, "/latest"),
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
