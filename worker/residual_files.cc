#include "worker/residual_files.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

constexpr char kFormat[] = "pstrain-residual-1";

absl::Status WrongFile(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

// The file's metadata, checked: format, step, worker; its generation.
absl::StatusOr<int64_t> CheckMetadata(const safetensors::File& file, int worker,
                                      int64_t step) {
  const std::map<std::string, std::string>& meta = file.metadata();
  auto field = [&](const char* key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? "" : it->second;
  };
  if (field("format") != kFormat) {
    return WrongFile(file.path(),
                     absl::StrCat("metadata format \"", field("format"),
                                  "\"; expected ", kFormat));
  }
  int64_t saved_step = -1, saved_worker = -1, generation = -1;
  if (!absl::SimpleAtoi(field("step"), &saved_step) || saved_step != step ||
      !absl::SimpleAtoi(field("worker"), &saved_worker) ||
      saved_worker != worker ||
      !absl::SimpleAtoi(field("generation"), &generation) || generation < 0) {
    return WrongFile(
        file.path(),
        absl::StrCat("metadata step \"", field("step"), "\", worker \"",
                     field("worker"), "\", generation \"", field("generation"),
                     "\"; expected step ", step, ", worker ", worker,
                     " and a generation"));
  }
  return generation;
}

}  // namespace

std::string ResidualFileName(int worker) {
  return absl::StrCat("residual-", worker, ".safetensors");
}

absl::Status WriteResidualFile(
    const std::string& step_dir, int worker, int64_t step, int64_t generation,
    const std::vector<std::string>& names,
    const std::vector<absl::Span<const float>>& residuals) {
  if (names.size() != residuals.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        residuals.size(), " residuals for ", names.size(), " parameter names"));
  }
  std::error_code error;
  std::filesystem::create_directories(step_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat(step_dir, ": cannot create it: ", error.message()));
  }
  // As a shard's step folder (server/shard_checkpoint.h): a link put in
  // its place is refused, not followed.
  if (std::filesystem::is_symlink(step_dir, error) ||
      !std::filesystem::is_directory(step_dir, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_dir,
                     ": not a folder (a link or another file); expected the "
                     "checkpoint's step folder"));
  }
  std::vector<safetensors::TensorView> views;
  for (size_t t = 0; t < names.size(); ++t) {
    views.push_back(safetensors::F32View(
        names[t], {static_cast<int64_t>(residuals[t].size())}, residuals[t]));
  }
  const std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"step", absl::StrCat(step)},
      {"worker", absl::StrCat(worker)},
      {"generation", absl::StrCat(generation)}};
  return safetensors::Write(
             absl::StrCat(step_dir, "/", ResidualFileName(worker)), views,
             metadata)
      .status();
}

absl::StatusOr<std::vector<std::vector<float>>> ReadResidualFile(
    const std::string& step_dir, int worker, int64_t step,
    const std::vector<std::string>& names, const std::vector<int64_t>& sizes) {
  ASSIGN_OR_RETURN(safetensors::File file,
                   safetensors::File::Read(
                       absl::StrCat(step_dir, "/", ResidualFileName(worker))));
  RETURN_IF_ERROR(CheckMetadata(file, worker, step).status());
  if (file.tensors().size() != names.size()) {
    return WrongFile(file.path(),
                     absl::StrCat(file.tensors().size(), " tensors; expected ",
                                  names.size(), " (one per parameter)"));
  }
  std::vector<std::vector<float>> residuals;
  for (size_t t = 0; t < names.size(); ++t) {
    absl::StatusOr<const safetensors::Tensor*> tensor =
        file.Get(names[t], safetensors::Dtype::kF32, {sizes[t]});
    if (!tensor.ok()) {
      return absl::DataLossError(std::string(tensor.status().message()));
    }
    std::vector<float> values(sizes[t]);
    std::memcpy(values.data(), (*tensor)->bytes.data(),
                values.size() * sizeof(float));
    residuals.push_back(std::move(values));
  }
  return residuals;
}

absl::Status WaitForResidualFiles(const std::string& step_dir,
                                  absl::Span<const int> workers, int64_t step,
                                  int64_t generation, absl::Time deadline,
                                  const std::atomic<bool>* abandoned) {
  std::vector<bool> found(workers.size(), false);
  while (true) {
    std::vector<int> missing;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (found[i]) continue;
      const int w = workers[i];
      absl::StatusOr<safetensors::File> file = safetensors::File::Read(
          absl::StrCat(step_dir, "/", ResidualFileName(w)));
      if (file.ok()) {
        absl::StatusOr<int64_t> saved = CheckMetadata(*file, w, step);
        if (!saved.ok()) return saved.status();
        // Another generation's: a timeline abandoned by a restore, which
        // this one's write replaces.
        if (*saved == generation) {
          found[i] = true;
          continue;
        }
      } else if (!absl::IsNotFound(file.status())) {
        return file.status();
      }
      missing.push_back(w);
    }
    if (missing.empty()) return absl::OkStatus();
    if (abandoned != nullptr && abandoned->load()) {
      return absl::CancelledError(absl::StrCat(
          step_dir,
          ": a step failed while waiting for the residual files of "
          "worker(s) ",
          absl::StrJoin(missing, ", ")));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          step_dir, ": no residual file of step ", step, ", generation ",
          generation, " from worker(s) ", absl::StrJoin(missing, ", ")));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<bool> RestoreResidualFile(const std::string& step_dir,
                                         int worker, int64_t step, int64_t tag,
                                         const std::vector<std::string>& names,
                                         TopKCompressor* compressor) {
  if (step_dir.empty() || !compressor->options().error_feedback) {
    RETURN_IF_ERROR(compressor->Reset(0, {}));
    return false;
  }
  std::vector<int64_t> sizes;
  for (int t = 0; t < compressor->num_state_tensors(); ++t) {
    sizes.push_back(compressor->state_size(t));
  }
  absl::StatusOr<std::vector<std::vector<float>>> residuals =
      ReadResidualFile(step_dir, worker, step, names, sizes);
  if (absl::IsNotFound(residuals.status())) {
    RETURN_IF_ERROR(compressor->Reset(0, {}));
    return false;
  }
  RETURN_IF_ERROR(residuals.status());
  RETURN_IF_ERROR(compressor->Reset(tag, *residuals));
  return true;
}

}  // namespace pstrain
