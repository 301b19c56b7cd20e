// Fuzzes a whole checkpoint as a resumed job and `pstrain eval` read it
// (worker/checkpoint.h): the manifest together with the files it lists,
// not the manifest alone (checkpoint_manifest_fuzzer). The input is
//   byte 0: flags; then a 2-byte little-endian length and that many bytes
//   of DIR/step-7/manifest.json; a 2-byte length and DIR/step-7/
//   shard-0.safetensors; the rest is DIR/step-7/model.safetensors.
// Flags: bit 0 sets the manifest's own crc32 right, bit 1 sets the size and
// crc32 it lists for each file to the file's (so that the fuzzer gets past
// the checksums into the files and their agreement with the manifest);
// bits 2-3 put a hostile file in place of one: 1 a FIFO for the shard file,
// 2 a link to /dev/zero for the model file, 3 a link to /dev/zero for the
// manifest. Every read must end (no hang on a FIFO, no endless read of
// /dev/zero) with a result or an error of a documented code; a checkpoint
// that loads must agree with itself.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/safetensors.h"
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint.h"
#include "zlib.h"

namespace {

using json = nlohmann::json;

uint32_t Crc32(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

// A section: its 2-byte length, then its bytes (what is left if shorter).
std::string Section(pstrain::fuzz::FuzzInput& in) {
  const size_t n = in.Take<uint16_t>();
  std::string out;
  while (out.size() < n && !in.empty()) out.push_back(in.Take<char>());
  return out;
}

bool Documented(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kNotFound;
}

// The manifest with the files' sizes and crc32 and its own crc32 set as the
// flags say; `text` as it is if it is not a JSON object.
std::string FixManifest(const std::string& text, uint8_t flags,
                        const std::string& shard, const std::string& model) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return text;
  if (flags & 2) {
    auto fix = [](json& f, const std::string& bytes) {
      if (!f.is_object()) return;
      f["size_bytes"] = bytes.size();
      f["crc32"] = Crc32(bytes);
    };
    if (j.contains("shards") && j["shards"].is_array() &&
        !j["shards"].empty()) {
      fix(j["shards"][0], shard);
    }
    if (j.contains("model_file")) fix(j["model_file"], model);
  }
  if (flags & 1) {
    j.erase("crc32");
    j["crc32"] = Crc32(j.dump(1));  // As worker/checkpoint.cc's ManifestCrc.
  }
  return j.dump(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstrain::fuzz::FuzzInput in(data, size);
  const uint8_t flags = in.Take<uint8_t>();
  const std::string manifest_text = Section(in);
  const std::string shard = Section(in);
  const std::string model(in.Rest());
  const std::string manifest = FixManifest(manifest_text, flags, shard, model);

  const std::string dir = pstrain::fuzz::ScratchDir() + "/ckpt";
  const std::string step_dir = dir + "/step-7";
  std::error_code error;
  std::filesystem::remove_all(dir, error);  // A FIFO or link of the last run.
  std::filesystem::create_directories(step_dir, error);
  pstrain::fuzz::WriteFileOrDie(dir + "/latest", "step-7\n");
  const std::string files[3][2] = {{"/manifest.json", manifest},
                                   {"/shard-0.safetensors", shard},
                                   {"/model.safetensors", model}};
  const int hostile = (flags >> 2) & 3;
  for (int i = 0; i < 3; ++i) {
    const std::string path = step_dir + files[i][0];
    if (hostile == 1 && i == 1) {
      FUZZ_CHECK(::mkfifo(path.c_str(), 0600) == 0);
    } else if ((hostile == 2 && i == 2) || (hostile == 3 && i == 0)) {
      FUZZ_CHECK(::symlink("/dev/zero", path.c_str()) == 0);
    } else {
      pstrain::fuzz::WriteFileOrDie(path, files[i][1]);
    }
  }

  // As a resumed job reads it.
  absl::StatusOr<pstrain::CheckpointManifest> m =
      pstrain::ReadLatestCheckpoint(dir);
  if (!m.ok()) {
    FUZZ_CHECK(Documented(m.status()));
    return 0;
  }
  FUZZ_CHECK(hostile != 3);
  const pstrain::DataPosition& p = m->position;
  FUZZ_CHECK(m->step == 7);
  FUZZ_CHECK(p.steps_per_epoch >= 1 && p.step_in_epoch < p.steps_per_epoch);
  FUZZ_CHECK(p.epoch * p.steps_per_epoch + p.step_in_epoch == m->step);
  FUZZ_CHECK(p.batch_size >= 1 && p.num_workers >= 1);
  FUZZ_CHECK(m->shard_files.size() == static_cast<size_t>(m->job.num_shards));
  FUZZ_CHECK(m->job.num_buffers >= 0 &&
             m->job.num_buffers <=
                 static_cast<int>(m->job.tensor_names.size()));
  absl::StatusOr<pstrain::ModelState> state = pstrain::LoadCheckpointState(
      *m, m->job.tensor_names, m->job.tensor_shapes, m->job.num_buffers);
  if (state.ok()) {
    FUZZ_CHECK(hostile != 1);
    FUZZ_CHECK(state->weights.size() == m->job.tensor_names.size());
    for (size_t t = 0; t < state->weights.size(); ++t) {
      int64_t n = 1;
      for (const int64_t d : m->job.tensor_shapes[t]) n *= d;
      FUZZ_CHECK(static_cast<int64_t>(state->weights[t].size()) == n);
    }
  } else {
    FUZZ_CHECK(Documented(state.status()));
  }

  // As `pstrain eval --checkpoint=DIR` reads it.
  absl::StatusOr<pstrain::CheckpointModelFile> found =
      pstrain::FindModelFile(dir);
  if (!found.ok()) {
    FUZZ_CHECK(Documented(found.status()));
    return 0;
  }
  FUZZ_CHECK(found->manifest.has_value());
  FUZZ_CHECK(!found->options.follow_symlinks);
  absl::StatusOr<pstrain::safetensors::File> file =
      pstrain::safetensors::File::Read(found->path, found->options);
  if (!file.ok()) {
    FUZZ_CHECK(Documented(file.status()));
    return 0;
  }
  FUZZ_CHECK(hostile != 2);
  FUZZ_CHECK(file->crc32() == found->manifest->model_file.crc32);
  FUZZ_CHECK(file->size_bytes() == found->manifest->model_file.size_bytes);
  return 0;
}
