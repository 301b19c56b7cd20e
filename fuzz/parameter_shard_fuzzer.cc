// Fuzzes one parameter-server shard (server/parameter_shard.h) in one
// process with a random sequence of requests, as a buggy or hostile worker
// could send them: Initialize (a layout and initial values, also wrong
// ones; restores of later generations), pushes of any worker, key, size,
// step, generation and values (NaN and infinities included), pulls,
// snapshots, broken barriers, step ends and (clipping by global norm)
// step norms. Invariants:
//  - every call ends with one of the documented status codes;
//  - a refused push changes no weight (the model's bytes are the same);
//  - the weights stay finite (an update whose result is not finite, from
//    finite pushes, is not applied) and chunk versions never go back
//    within a generation;
//  - an OK pull hands out every chunk of the shard exactly once (twice
//    when it reports a skipped step), at the version asked for or later.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/partition.h"
#include "fuzz/fuzz_util.h"
#include "server/parameter_shard.h"

namespace pstrain {
namespace {

using fuzz::FuzzInput;
using Key = std::pair<int32_t, int32_t>;

struct Pulled {
  absl::Status status;
  std::map<Key, std::pair<int64_t, std::vector<float>>> chunks;
};

// The shard's weights at min_version or later (no waiting). A sync pull of
// a skipped step's version sends every chunk twice (the second time with
// the restored weights, server/parameter_shard.h); any other pull, once.
Pulled PullNow(ParameterShard& shard, int64_t min_version, int64_t generation) {
  Pulled out;
  std::map<Key, int> visits;
  SkippedStepInfo skipped;
  out.status = shard.Pull(
      min_version, 1, absl::InfinitePast(),
      [&](const ChunkSpec& c, int64_t version, absl::Span<const float> w) {
        const Key key(c.param_id, c.chunk_index);
        ++visits[key];
        FUZZ_CHECK(static_cast<int64_t>(w.size()) == c.num_elements);
        out.chunks[key] = {version, std::vector<float>(w.begin(), w.end())};
      },
      nullptr, nullptr, generation, &skipped,
      [](int64_t, double sum_sq) {
        // +inf where the step's average of finite pushes overflowed float
        // (the shard then refuses that global norm, and the update).
        FUZZ_CHECK(!std::isnan(sum_sq) && sum_sq >= 0);
        return true;
      });
  if (out.status.ok()) {
    for (const auto& [key, n] : visits) {
      FUZZ_CHECK(n == (skipped.step >= 0 ? 2 : 1));
    }
  }
  return out;
}

bool IsOneOf(const absl::Status& s, std::initializer_list<absl::StatusCode> c) {
  for (absl::StatusCode code : c) {
    if (s.code() == code) return true;
  }
  return false;
}

float TakeValue(FuzzInput& in, uint8_t style) {
  switch (style % 4) {
    case 0:
      return static_cast<float>(in.Take<int8_t>()) / 8.0f;
    case 1:
      return in.Take<float>();  // Any bits: NaN, infinities, huge.
    case 2:
      return static_cast<float>(in.Take<int8_t>()) * 1e36f;  // Finite.
    default:
      return 0.5f;
  }
}

void Run(FuzzInput& in) {
  ShardOptions options;
  options.job_id = "fuzz";
  options.num_workers = static_cast<int>(in.Range(1, 3));
  const uint8_t mode = in.Take<uint8_t>();
  options.mode = mode & 1 ? SyncMode::kAsync : SyncMode::kSync;
  if (mode & 2) options.clip_grad_norm = 1.0;
  options.num_shards = static_cast<int>(in.Range(1, 2));
  options.shard_index = static_cast<int>(in.Range(0, options.num_shards - 1));
  options.adam.lr = 0.01f;
  ParameterShard shard(options);

  const int num_params = static_cast<int>(in.Range(1, 4));
  std::vector<int64_t> sizes;
  for (int p = 0; p < num_params; ++p) sizes.push_back(in.Range(1, 40));
  const int64_t partition_bytes = 4 * in.Range(1, 16);
  const int num_buffers = static_cast<int>(in.Range(0, num_params - 1));
  absl::StatusOr<PartitionPlan> plan_or = PartitionPlan::Create(
      sizes, partition_bytes, options.num_shards, num_buffers);
  FUZZ_CHECK(plan_or.ok());
  const PartitionPlan plan = *std::move(plan_or);
  const std::vector<ChunkSpec> mine = plan.ChunksOfShard(options.shard_index);

  // Initial values for every chunk of this shard; a flag byte breaks them.
  // Whether Initialize() was given a NaN or an infinity (the shard takes
  // initial values as they are: then the weights need not stay finite).
  bool nonfinite_init = false;
  auto init_chunks = [&](uint8_t flags, const Pulled* from) {
    std::vector<InitChunk> chunks;
    for (const ChunkSpec& c : mine) {
      InitChunk init;
      init.param_id = c.param_id;
      init.chunk_index = c.chunk_index;
      const Key key(c.param_id, c.chunk_index);
      if (from != nullptr && from->chunks.count(key)) {
        init.values = from->chunks.at(key).second;
        init.version = from->chunks.at(key).first;
      } else {
        for (int64_t i = 0; i < c.num_elements; ++i) {
          init.values.push_back(TakeValue(in, flags >> 4));
          if (!std::isfinite(init.values.back())) nonfinite_init = true;
        }
      }
      chunks.push_back(std::move(init));
    }
    if ((flags & 1) && !chunks.empty()) chunks.pop_back();
    if ((flags & 2) && !chunks.empty()) chunks[0].values.push_back(1.0f);
    if ((flags & 4) && !chunks.empty()) chunks.push_back(chunks[0]);
    if (flags & 8) chunks.emplace_back();
    return chunks;
  };

  absl::Status s = shard.Initialize(sizes, partition_bytes,
                                    init_chunks(in.Take<uint8_t>(), nullptr),
                                    num_buffers, 0);
  FUZZ_CHECK(
      IsOneOf(s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument}));
  if (!s.ok()) {
    // Refused: a clean layout must still be accepted afterwards.
    s = shard.Initialize(sizes, partition_bytes, init_chunks(0, nullptr),
                         num_buffers, 0);
    FUZZ_CHECK(IsOneOf(
        s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument}));
    if (!s.ok()) return;  // Initial values the shard refuses (non-finite).
  }
  std::map<Key, int64_t> last_version;
  int64_t generation = 0;

  for (int op = 0; op < 200 && !in.empty(); ++op) {
    const uint8_t what = in.Take<uint8_t>();
    switch (what % 10) {
      case 0:
      case 1:
      case 2:
      case 3: {  // A push, mostly well formed.
        const uint8_t flags = in.Take<uint8_t>();
        const ChunkSpec& c = plan.chunks()[in.Range(
            0, static_cast<int64_t>(plan.chunks().size()) - 1)];
        int worker = static_cast<int>(in.Range(0, options.num_workers - 1));
        int32_t param_id = c.param_id;
        int32_t chunk_index = c.chunk_index;
        int64_t n = c.num_elements;
        if (flags & 1) worker = in.Take<int8_t>();
        if (flags & 2) param_id = in.Take<int8_t>();
        if (flags & 4) chunk_index = in.Take<int8_t>();
        if (flags & 8) n += in.Range(-2, 2);
        if (n < 0) n = 0;
        const Key key(c.param_id, c.chunk_index);
        int64_t step = last_version.count(key) ? last_version[key] : 0;
        if (flags & 16) step += in.Range(-2, 2);
        const int64_t gen = (flags & 32) ? in.Range(0, 3) : generation;
        std::vector<float> g;
        for (int64_t i = 0; i < n; ++i) g.push_back(TakeValue(in, flags >> 6));
        const Pulled before = PullNow(shard, 0, generation);
        s = shard.Push(worker, param_id, chunk_index, step, g, gen);
        FUZZ_CHECK(IsOneOf(
            s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                absl::StatusCode::kFailedPrecondition,
                absl::StatusCode::kAborted}));
        if (!s.ok() && before.status.ok()) {
          const Pulled after = PullNow(shard, 0, generation);
          if (after.status.ok()) {
            FUZZ_CHECK(after.chunks.size() == before.chunks.size());
            for (const auto& [k, vw] : before.chunks) {
              const auto& aw = after.chunks.at(k);
              FUZZ_CHECK(aw.first == vw.first);
              FUZZ_CHECK(std::memcmp(aw.second.data(), vw.second.data(),
                                     vw.second.size() * sizeof(float)) == 0);
            }
          }
        }
        break;
      }
      case 4: {  // A pull of a version, not waiting.
        const int64_t min_version = in.Range(0, 3);
        const int64_t gen =
            (in.Take<uint8_t>() & 1) ? in.Range(0, 3) : generation;
        const Pulled p = PullNow(shard, min_version, gen);
        FUZZ_CHECK(IsOneOf(p.status, {absl::StatusCode::kOk,
                                      absl::StatusCode::kDeadlineExceeded,
                                      absl::StatusCode::kAborted}));
        if (p.status.ok()) {
          FUZZ_CHECK(p.chunks.size() == mine.size());
          for (const auto& [k, vw] : p.chunks) {
            FUZZ_CHECK(vw.first >= min_version);
            for (float w : vw.second) {
              FUZZ_CHECK(nonfinite_init || std::isfinite(w));
            }
            if (gen == generation) {
              FUZZ_CHECK(vw.first >= last_version[k]);
              last_version[k] = vw.first;
            }
          }
        }
        break;
      }
      case 5: {  // A snapshot, as a checkpoint takes one.
        absl::StatusOr<std::vector<ChunkSnapshot>> snap =
            shard.Snapshot(in.Range(0, 3));
        FUZZ_CHECK(IsOneOf(
            snap.status(),
            {absl::StatusCode::kOk, absl::StatusCode::kFailedPrecondition}));
        if (snap.ok()) FUZZ_CHECK(snap->size() == mine.size());
        break;
      }
      case 6:  // A worker's stream broke.
        shard.BreakBarrier(in.Range(0, 2), "fuzz: worker 0's stream broke");
        break;
      case 7: {  // A restore of a later (or not later) generation.
        const uint8_t flags = in.Take<uint8_t>();
        const Pulled now = PullNow(shard, 0, generation);
        const int64_t gen = generation + in.Range(-1, 2);
        s = shard.Initialize(
            sizes, partition_bytes,
            init_chunks(flags & 0x3f, now.status.ok() ? &now : nullptr),
            num_buffers, gen);
        FUZZ_CHECK(IsOneOf(
            s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                absl::StatusCode::kFailedPrecondition}));
        if (s.ok()) {
          FUZZ_CHECK(gen > generation);
          generation = gen;
          FUZZ_CHECK(shard.generation() == gen);
          last_version.clear();
        }
        break;
      }
      case 8: {  // A step end, maybe reporting a non-finite value.
        const int worker = static_cast<int>(in.Range(-1, options.num_workers));
        const int64_t step = in.Range(-1, 4);
        NonFiniteValue nan;
        nan.value = "nan";
        s = shard.EndStep(worker, step,
                          (in.Take<uint8_t>() & 1) ? &nan : nullptr,
                          generation);
        FUZZ_CHECK(IsOneOf(
            s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                absl::StatusCode::kFailedPrecondition,
                absl::StatusCode::kAborted}));
        break;
      }
      case 9: {  // A step's squared global norm, any double.
        const int worker = static_cast<int>(in.Range(-1, options.num_workers));
        const int64_t step = in.Range(-1, 4);
        s = shard.ApplyStepNorm(worker, step, in.Take<double>(), generation);
        FUZZ_CHECK(IsOneOf(
            s, {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                absl::StatusCode::kFailedPrecondition,
                absl::StatusCode::kAborted}));
        break;
      }
    }
    const ShardStats stats = shard.Stats();
    FUZZ_CHECK(stats.initialized);
    FUZZ_CHECK(stats.generation == generation);
  }
}

}  // namespace
}  // namespace pstrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstrain::fuzz::FuzzInput in(data, size);
  pstrain::Run(in);
  return 0;
}
