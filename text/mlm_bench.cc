// mlm_bench: training throughput of a sequence model (models/model.h:
// bert_tiny, bert_base) on the synthetic token stream (text/mlm_data.h),
// without the parameter server: forward + backward + a local Adam step
// (Model::AdamStep) on a new masked batch each step, timed over --steps
// after --warmup steps. One row per run:
//
//   bazel-bin/text/mlm_bench --model=bert_base --batch_size=4 --steps=3
//
// samples/s = batch_size * steps / seconds; tokens/s = samples/s * seq_len;
// GFLOP/s = 3 * 2 * ForwardMacsPerSample * samples/s (backward counted as
// twice the forward, as the field's tables do).
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "models/backend.h"
#include "models/model.h"
#include "text/mlm_data.h"

ABSL_FLAG(std::string, model, "bert_tiny", "bert_tiny or bert_base.");
ABSL_FLAG(int, batch_size, 8, "Sequences per step.");
ABSL_FLAG(int, seq_len, 128, "Tokens per sequence.");
ABSL_FLAG(int, vocab_size, 30522, "Vocabulary (BERT's WordPiece: 30522).");
ABSL_FLAG(int, steps, 5, "Timed steps.");
ABSL_FLAG(int, warmup, 1, "Untimed steps first.");
ABSL_FLAG(double, dropout, 0.1, "Transformer dropout.");
ABSL_FLAG(bool, layer_times, false,
          "After the timed steps, one more step with per-layer timing "
          "(Model::EnableLayerTiming), printed per layer.");

int main(int argc, char** argv) {
  constexpr char kProgram[] = "mlm_bench";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "mlm_bench --help");
  const int n = absl::GetFlag(FLAGS_batch_size);
  const int s = absl::GetFlag(FLAGS_seq_len);
  const int vocab = absl::GetFlag(FLAGS_vocab_size);
  absl::StatusOr<pstrain::MlmMasker> masker =
      pstrain::MlmMasker::Create(vocab, {});
  if (!masker.ok() || n < 1 || absl::GetFlag(FLAGS_steps) < 1) {
    pstrain::PrintError(kProgram, masker.ok() ? "--batch_size and --steps "
                                                "must be >= 1"
                                              : masker.status().message());
    return 2;
  }
  std::unique_ptr<pstrain::Backend> cpu = pstrain::NewCpuBackend();
  pstrain::ModelOptions options;
  options.transformer_dropout =
      static_cast<float>(absl::GetFlag(FLAGS_dropout));
  absl::StatusOr<std::unique_ptr<pstrain::Model>> model =
      pstrain::Model::Create(absl::GetFlag(FLAGS_model), {s}, vocab, options,
                             cpu.get());
  if (!model.ok()) {
    pstrain::PrintError(kProgram, model.status().message());
    return 2;
  }
  (*model)->set_stage_gradients(false);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  absl::Time start = absl::Now();
  float loss = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) start = absl::Now();
    const pstrain::MlmBatch batch =
        pstrain::SyntheticMlmBatch(n, s, *masker, 1, step);
    absl::StatusOr<float> l =
        (*model)->ForwardBackward(batch.ids, batch.padding_mask, batch.labels);
    absl::Status adam = l.ok() ? (*model)->AdamStep({}) : l.status();
    if (!adam.ok()) {
      pstrain::PrintError(kProgram, adam.message());
      return 1;
    }
    loss = *l;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double samples_per_sec = n * steps / seconds;
  const double gmacs = (*model)->ForwardMacsPerSample() / 1e9;
  std::printf("# %-10s %6s %5s %6s %10s %10s %10s %9s %8s %7s\n", "model",
              "batch", "seq", "vocab", "params", "step_ms", "samples/s",
              "tokens/s", "GFLOP/s", "loss");
  std::printf("  %-10s %6d %5d %6d %10lld %10.1f %10.2f %10.0f %9.1f %8.3f\n",
              absl::GetFlag(FLAGS_model).c_str(), n, s, vocab,
              static_cast<long long>((*model)->NumParameters()),
              1e3 * seconds / steps, samples_per_sec, samples_per_sec * s,
              6 * gmacs * samples_per_sec, loss);
  if (!absl::GetFlag(FLAGS_layer_times)) return 0;
  (*model)->EnableLayerTiming(true);
  const pstrain::MlmBatch batch =
      pstrain::SyntheticMlmBatch(n, s, *masker, 1, warmup + steps);
  absl::StatusOr<float> l =
      (*model)->ForwardBackward(batch.ids, batch.padding_mask, batch.labels);
  if (!l.ok()) {
    pstrain::PrintError(kProgram, l.status().message());
    return 1;
  }
  std::printf("# %-20s %-24s %12s %12s\n", "layer", "spec", "forward_ms",
              "backward_ms");
  for (const pstrain::LayerTime& t : (*model)->LayerTimes()) {
    std::printf("  %-20s %-24s %12.1f %12.1f\n", t.name.c_str(), t.spec.c_str(),
                t.forward_ms, t.backward_ms);
  }
  return 0;
}
