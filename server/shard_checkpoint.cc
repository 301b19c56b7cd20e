#include "server/shard_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

constexpr int kChunkColumns = 5;

std::string ChunkName(const ChunkSpec& spec, char what) {
  return absl::StrCat(spec.param_id, ":", spec.offset, ":", spec.num_elements,
                      ":", std::string(1, what));
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(path, ": not a valid pstrain shard checkpoint: ", what));
}

// realpath(3) of `path`, or INTERNAL naming it and errno.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot resolve it: ", std::strerror(errno)));
  }
  return std::string(resolved);
}

// ShardCheckpointPath and CheckShardCheckpointPath: the step folder is made
// only where `create`; else a missing one is fine (nothing is made).
absl::StatusOr<std::string> StepFolderPath(const std::string& root,
                                           int64_t step, int shard_index,
                                           bool create) {
  if (root.empty()) {
    return absl::FailedPreconditionError(
        "this shard takes no checkpoints: the job has no checkpoint_dir");
  }
  if (step < 0 || shard_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint of step ", step, " for shard ", shard_index,
                     ": expected a step and a shard index >= 0"));
  }
  struct stat st;
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint folder ", root, ": not a folder on this shard's host"));
  }
  const std::string step_dir = absl::StrCat(root, "/step-", step);
  const std::string file =
      absl::StrCat(step_dir, "/shard-", shard_index, ".safetensors");
  if (::lstat(step_dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::InternalError(
          absl::StrCat(step_dir, ": ", std::strerror(errno)));
    }
    if (!create) return file;
    // Worker 0 usually made it first; EEXIST is then a race with it, and
    // the lstat below checks what is there.
    if (::mkdir(step_dir.c_str(), 0777) != 0 && errno != EEXIST) {
      return absl::InternalError(
          absl::StrCat(step_dir, ": cannot create it: ", std::strerror(errno)));
    }
    if (::lstat(step_dir.c_str(), &st) != 0) {
      return absl::InternalError(
          absl::StrCat(step_dir, ": ", std::strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        step_dir, ": not a folder (",
        S_ISLNK(st.st_mode) ? "a symbolic link" : "another kind of file",
        "); a shard writes checkpoints only into folders inside ", root));
  }
  absl::StatusOr<std::string> real_root = RealPath(root);
  if (!real_root.ok()) return real_root.status();
  absl::StatusOr<std::string> real_step = RealPath(step_dir);
  if (!real_step.ok()) return real_step.status();
  if (*real_step != absl::StrCat(*real_root, "/step-", step)) {
    return absl::PermissionDeniedError(
        absl::StrCat(step_dir, ": resolves to ", *real_step,
                     ", outside the checkpoint folder ", *real_root));
  }
  return file;
}

}  // namespace

absl::StatusOr<std::string> ShardCheckpointPath(const std::string& root,
                                                int64_t step, int shard_index) {
  return StepFolderPath(root, step, shard_index, /*create=*/true);
}

absl::Status CheckShardCheckpointPath(const std::string& root, int64_t step,
                                      int shard_index) {
  return StepFolderPath(root, step, shard_index, /*create=*/false).status();
}

absl::Status RemoveOldShardCheckpoints(const std::string& root, int shard_index,
                                       int64_t written_step,
                                       int64_t latest_step, int keep) {
  if (keep <= 0 || root.empty()) return absl::OkStatus();
  const std::string file = absl::StrCat("shard-", shard_index, ".safetensors");
  // Kept: the newest `keep` of those below the written one, or with
  // worker 0's latest, of those at or below it.
  const int64_t complete_up_to = latest_step >= 0 && latest_step < written_step
                                     ? latest_step
                                     : written_step - 1;
  std::vector<int64_t> older;
  std::vector<int64_t> remove;
  std::error_code error;
  for (const std::filesystem::directory_entry& e :
       std::filesystem::directory_iterator(root, error)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(absl::string_view(name).substr(5), &step) ||
        step == written_step) {
      continue;
    }
    struct stat st;
    const std::string path = absl::StrCat(root, "/", name, "/", file);
    if (!e.is_directory(error) || e.is_symlink(error) ||
        ::lstat(path.c_str(), &st) != 0) {
      continue;
    }
    (step <= complete_up_to ? older : remove).push_back(step);
  }
  std::sort(older.rbegin(), older.rend());
  for (size_t i = static_cast<size_t>(keep); i < older.size(); ++i) {
    remove.push_back(older[i]);
  }
  // Each step folder is opened without following a link (one put in its
  // place since the listing is not followed), and the file removed in it.
  const int root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) {
    return absl::InternalError(
        absl::StrCat(root, ": cannot open it: ", std::strerror(errno)));
  }
  absl::Status status;
  for (const int64_t step : remove) {
    const std::string name = absl::StrCat("step-", step);
    const int step_fd = ::openat(
        root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (step_fd < 0) continue;
    if (::unlinkat(step_fd, file.c_str(), 0) != 0 && errno != ENOENT &&
        status.ok()) {
      status = absl::InternalError(absl::StrCat(
          root, "/", name, "/", file,
          ": cannot remove an old checkpoint file: ", std::strerror(errno)));
    }
    ::close(step_fd);
    // Only if empty (worker 0's files stay), and never a link.
    ::unlinkat(root_fd, name.c_str(), AT_REMOVEDIR);
  }
  ::close(root_fd);
  return status;
}

absl::StatusOr<safetensors::WriteResult> WriteShardCheckpoint(
    const std::string& path, const std::vector<ChunkSnapshot>& chunks,
    int shard_index, int num_shards, int64_t step,
    const safetensors::WriteOptions& options) {
  std::vector<int64_t> table;
  std::vector<safetensors::TensorView> views;
  for (const ChunkSnapshot& c : chunks) {
    table.insert(table.end(),
                 {c.spec.param_id, c.spec.offset, c.spec.num_elements,
                  c.version, c.is_buffer ? 1 : 0});
  }
  views.push_back(safetensors::I64View(
      "chunks", {static_cast<int64_t>(chunks.size()), kChunkColumns}, table));
  for (const ChunkSnapshot& c : chunks) {
    const std::vector<int64_t> shape = {c.spec.num_elements};
    views.push_back(
        safetensors::F32View(ChunkName(c.spec, 'w'), shape, c.weights));
    if (c.is_buffer) continue;
    views.push_back(safetensors::F32View(ChunkName(c.spec, 'm'), shape, c.m));
    views.push_back(safetensors::F32View(ChunkName(c.spec, 'v'), shape, c.v));
  }
  return safetensors::Write(path, views,
                            {{"format", kShardCheckpointFormat},
                             {"shard", absl::StrCat(shard_index)},
                             {"num_shards", absl::StrCat(num_shards)},
                             {"step", absl::StrCat(step)}},
                            options);
}

absl::StatusOr<std::vector<ChunkSnapshot>> ReadShardCheckpoint(
    const std::string& path, const safetensors::ReadOptions& options) {
  absl::StatusOr<safetensors::File> file =
      safetensors::File::Read(path, options);
  if (!file.ok()) return file.status();
  auto format = file->metadata().find("format");
  if (format == file->metadata().end() ||
      format->second != kShardCheckpointFormat) {
    return Corrupt(path, absl::StrCat("metadata \"format\" is not \"",
                                      kShardCheckpointFormat, "\""));
  }
  const safetensors::Tensor* table = file->Find("chunks");
  if (table == nullptr || table->dtype != safetensors::Dtype::kI64 ||
      table->shape.size() != 2 || table->shape[1] != kChunkColumns) {
    return Corrupt(path, "no I64 tensor \"chunks\" of shape [N, 5]");
  }
  const int64_t n = table->shape[0];
  std::vector<int64_t> rows(n * kChunkColumns);
  std::memcpy(rows.data(), table->bytes.data(), rows.size() * sizeof(int64_t));
  std::vector<ChunkSnapshot> chunks(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* r = &rows[i * kChunkColumns];
    if (r[0] < 0 || r[0] > INT32_MAX || r[1] < 0 || r[2] <= 0 ||
        r[1] > INT64_MAX - r[2] || r[3] < 0 || (r[4] != 0 && r[4] != 1)) {
      return Corrupt(path, absl::StrCat("row ", i, " of \"chunks\" (", r[0],
                                        ", ", r[1], ", ", r[2], ", ", r[3],
                                        ", ", r[4], ") is out of range"));
    }
    ChunkSnapshot& c = chunks[i];
    c.spec.param_id = static_cast<int32_t>(r[0]);
    c.spec.offset = r[1];
    c.spec.num_elements = r[2];
    c.version = r[3];
    c.is_buffer = r[4] == 1;
    const std::vector<int64_t> shape = {c.spec.num_elements};
    for (const auto& [what, out] :
         {std::pair<char, std::vector<float>*>{'w', &c.weights},
          {'m', &c.m},
          {'v', &c.v}}) {
      if (what != 'w' && c.is_buffer) continue;
      absl::StatusOr<std::vector<float>> values =
          file->ReadFloats(ChunkName(c.spec, what), shape);
      if (!values.ok()) {
        return Corrupt(path, std::string(values.status().message()));
      }
      *out = *std::move(values);
    }
  }
  return chunks;
}

int64_t ModelState::VersionOf(int t, int64_t offset, int64_t n) const {
  int64_t version = INT64_MAX;
  for (const Range& r : versions[t]) {
    if (r.offset < offset + n && offset < r.offset + r.num_elements) {
      version = std::min(version, r.version);
    }
  }
  return version == INT64_MAX ? 0 : version;
}

absl::StatusOr<ModelState> Assemble(
    const std::vector<int64_t>& tensor_num_elements,
    const std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>>&
        files) {
  const size_t num_tensors = tensor_num_elements.size();
  ModelState state;
  state.weights.resize(num_tensors);
  state.m.resize(num_tensors);
  state.v.resize(num_tensors);
  state.versions.resize(num_tensors);
  // Which file gave each range, to name both in an overlap.
  std::vector<std::map<int64_t, std::pair<int64_t, std::string>>> seen(
      num_tensors);
  std::vector<int> is_buffer(num_tensors, -1);
  for (const auto& [path, chunks] : files) {
    for (const ChunkSnapshot& c : chunks) {
      const int t = c.spec.param_id;
      if (t < 0 || static_cast<size_t>(t) >= num_tensors) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": holds PS tensor ", t, " but the model has ",
                         num_tensors, " (a checkpoint of another model?)"));
      }
      const int64_t size = tensor_num_elements[t];
      if (c.spec.offset + c.spec.num_elements > size) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": PS tensor ", t, " elements [", c.spec.offset, ", ",
            c.spec.offset + c.spec.num_elements, ") pass its ", size,
            " elements in this model (a checkpoint of another model?)"));
      }
      if (is_buffer[t] >= 0 && is_buffer[t] != (c.is_buffer ? 1 : 0)) {
        return absl::DataLossError(
            absl::StrCat(path, ": PS tensor ", t,
                         " is a buffer in one chunk, not in another"));
      }
      is_buffer[t] = c.is_buffer ? 1 : 0;
      auto& ranges = seen[t];
      auto next = ranges.lower_bound(c.spec.offset);
      const bool overlaps_next =
          next != ranges.end() &&
          next->first < c.spec.offset + c.spec.num_elements;
      const bool overlaps_prev =
          next != ranges.begin() &&
          std::prev(next)->first + std::prev(next)->second.first >
              c.spec.offset;
      if (overlaps_next || overlaps_prev) {
        const auto& other = overlaps_next ? *next : *std::prev(next);
        return absl::DataLossError(absl::StrCat(
            path, ": PS tensor ", t, " elements from ", c.spec.offset,
            " overlap a chunk of ", other.second.second));
      }
      ranges[c.spec.offset] = {c.spec.num_elements, path};
      if (state.weights[t].empty()) {
        state.weights[t].assign(size, 0.0f);
        if (!c.is_buffer) {
          state.m[t].assign(size, 0.0f);
          state.v[t].assign(size, 0.0f);
        }
      }
      std::copy(c.weights.begin(), c.weights.end(),
                state.weights[t].begin() + c.spec.offset);
      if (!c.is_buffer) {
        std::copy(c.m.begin(), c.m.end(), state.m[t].begin() + c.spec.offset);
        std::copy(c.v.begin(), c.v.end(), state.v[t].begin() + c.spec.offset);
      }
      state.versions[t].push_back(
          {c.spec.offset, c.spec.num_elements, c.version});
    }
  }
  for (size_t t = 0; t < num_tensors; ++t) {
    int64_t covered = 0;
    for (const auto& [offset, range] : seen[t]) {
      if (offset != covered) break;
      covered += range.first;
    }
    if (covered != tensor_num_elements[t]) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint: PS tensor ", t, " has elements from ", covered, " of ",
          tensor_num_elements[t], " in no shard file (a shard file missing?)"));
    }
    std::sort(state.versions[t].begin(), state.versions[t].end(),
              [](const ModelState::Range& a, const ModelState::Range& b) {
                return a.offset < b.offset;
              });
  }
  return state;
}

}  // namespace pstrain
