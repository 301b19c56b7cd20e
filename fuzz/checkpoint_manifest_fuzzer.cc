// Fuzzes the checkpoint manifest reader (worker/checkpoint.h): the input is
// DIR/step-N/manifest.json, read by ReadLatestCheckpoint through DIR/latest
// as a resumed job does. The manifest guards itself with a crc32 of its
// canonical JSON; so that the fuzzer gets past it, an input that parses as
// a JSON object has that field set to the right value when its first byte
// is not '#' (inputs that begin with '#' are read as they are, to fuzz the
// check itself).
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint.h"
#include "zlib.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using json = nlohmann::json;
  std::string text(reinterpret_cast<const char*>(data), size);
  if (text.empty() || text[0] != '#') {
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      j.erase("crc32");
      // As worker/checkpoint.cc's ManifestCrc.
      const std::string canonical = j.dump(1);
      j["crc32"] = static_cast<uint32_t>(
          crc32(0L, reinterpret_cast<const Bytef*>(canonical.data()),
                static_cast<uInt>(canonical.size())));
      text = j.dump(1);
    }
  } else {
    text.erase(0, 1);
  }
  const std::string dir = pstrain::fuzz::ScratchDir() + "/ckpt";
  std::error_code error;
  std::filesystem::create_directories(dir + "/step-7", error);
  pstrain::fuzz::WriteFileOrDie(dir + "/latest", "step-7\n");
  pstrain::fuzz::WriteFileOrDie(dir + "/step-7/manifest.json", text);
  absl::StatusOr<pstrain::CheckpointManifest> m =
      pstrain::ReadLatestCheckpoint(dir);
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == absl::StatusCode::kDataLoss ||
               m.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(m->job.num_shards >= 1);
  FUZZ_CHECK(m->shard_files.size() == static_cast<size_t>(m->job.num_shards));
  FUZZ_CHECK(m->job.tensor_names.size() == m->job.tensor_shapes.size());
  FUZZ_CHECK(m->job.num_buffers >= 0 &&
             m->job.num_buffers <=
                 static_cast<int>(m->job.tensor_names.size()));
  for (const auto& shape : m->job.tensor_shapes) {
    for (int64_t d : shape) FUZZ_CHECK(d > 0);
  }
  // Loading it: the shard files it names are not there (or are not what it
  // says); an error, never a crash.
  (void)pstrain::LoadCheckpointState(*m, m->job.tensor_names,
                                     m->job.tensor_shapes, m->job.num_buffers)
      .ok();
  return 0;
}
