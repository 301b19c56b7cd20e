// mlm_batches: writes the masked batches that the workers of a job on the
// "tokens" dataset train on (worker/token_dataset.h: the same sampler,
// epoch permutation and BERT masking), so that a reference outside pstrain
// (tools/torch/bert_compare.py) trains on exactly the same data in the
// same order.
//
//   mlm_batches --data_dir=DIR --workers=2 --batch_size=8 --steps=100
//       --seed=1 --output=/tmp/batches.bin
//
// Output, little-endian: the 8 bytes "PSMLMB01", then int32 workers,
// batch_size, seq_len, steps, vocab; then for each step s (in order of the
// run's global steps, epoch s / steps_per_epoch) and each worker w: ids
// int32 [batch_size * seq_len], padding mask uint8 [same] (1 = padding),
// labels int32 [same] (-100 where not predicted). Steps per epoch as a job
// with max_steps_per_epoch = --steps_per_epoch (0: every full batch).
//
// Exit 0 when written, 2 with one line on a bad flag or dataset.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "text/mlm_data.h"
#include "worker/dataset.h"
#include "worker/token_dataset.h"

ABSL_FLAG(std::string, data_dir, "", "Folder holding train.tokens.");
ABSL_FLAG(int, workers, 2, "Workers of the job.");
ABSL_FLAG(int, batch_size, 8, "Sequences per step per worker.");
ABSL_FLAG(int, steps, 100, "Global steps to write.");
ABSL_FLAG(int64_t, steps_per_epoch, 0,
          "The job's max_steps_per_epoch (0: every full batch).");
ABSL_FLAG(uint64_t, seed, 1, "The job's seed.");
ABSL_FLAG(std::string, output, "", "Path of the file to write.");

namespace {

template <typename T>
void Put(std::ofstream& out, const T* data, size_t n) {
  out.write(reinterpret_cast<const char*>(data),
            static_cast<std::streamsize>(n * sizeof(T)));
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kProgram[] = "mlm_batches";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "mlm_batches --help");
  const int workers = absl::GetFlag(FLAGS_workers);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (workers < 1 || batch < 1 || steps < 1 ||
      absl::GetFlag(FLAGS_output).empty()) {
    pstrain::PrintError(kProgram,
                        "expected --workers, --batch_size and --steps >= 1 "
                        "and an --output");
    return 2;
  }
  absl::StatusOr<pstrain::Dataset> dataset =
      pstrain::LoadDataset("tokens", absl::GetFlag(FLAGS_data_dir));
  if (!dataset.ok()) {
    pstrain::PrintError(kProgram, dataset.status().message());
    return 2;
  }
  const pstrain::TokenData& tokens = *dataset->tokens;
  absl::StatusOr<pstrain::MlmMasker> masker =
      pstrain::MlmMasker::Create(tokens.vocab_size, {});
  if (!masker.ok()) {
    pstrain::PrintError(kProgram, masker.status().message());
    return 2;
  }
  int64_t per_epoch = dataset->train.count / workers / batch;
  if (absl::GetFlag(FLAGS_steps_per_epoch) > 0) {
    per_epoch = std::min(per_epoch, absl::GetFlag(FLAGS_steps_per_epoch));
  }
  if (per_epoch < 1) {
    pstrain::PrintError(kProgram, "no full batch per worker in train.tokens");
    return 2;
  }
  std::ofstream out(absl::GetFlag(FLAGS_output), std::ios::binary);
  out.write("PSMLMB01", 8);
  const int32_t header[5] = {workers, batch,
                             static_cast<int32_t>(tokens.seq_len), steps,
                             tokens.vocab_size};
  Put(out, header, 5);
  for (int s = 0; s < steps; ++s) {
    const int epoch = static_cast<int>(s / per_epoch);
    const int64_t index = s % per_epoch;
    for (int w = 0; w < workers; ++w) {
      const pstrain::ShardedSampler sampler(dataset->train.count, w, workers,
                                            seed);
      const pstrain::MlmBatch b =
          pstrain::TokenBatch(tokens.train, sampler.EpochIndices(epoch),
                              index * batch, batch, *masker, seed, epoch);
      std::vector<int32_t> ids(b.ids.data.begin(), b.ids.data.end());
      std::vector<uint8_t> mask(b.padding_mask.data.begin(),
                                b.padding_mask.data.end());
      Put(out, ids.data(), ids.size());
      Put(out, mask.data(), mask.size());
      Put(out, b.labels.data(), b.labels.size());
    }
  }
  out.close();
  if (!out) {
    pstrain::PrintError(
        kProgram, absl::StrCat(absl::GetFlag(FLAGS_output), ": cannot write"));
    return 1;
  }
  std::printf("mlm_batches: %d steps x %d workers x %d sequences of %lld\n",
              steps, workers, batch, static_cast<long long>(tokens.seq_len));
  return 0;
}
