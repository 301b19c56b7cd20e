#include "catalog/job_config.h"

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"

namespace pstrain {
namespace {

// One spelling of an enum value; an enum's first spelling of a value is the
// one printed.
template <typename E>
struct Choice {
  absl::string_view spelling;
  E value;
};

constexpr Choice<Mode> kModes[] = {
    {"sync", MODE_SYNC}, {"async", MODE_ASYNC}, {"allreduce", MODE_ALLREDUCE}};
constexpr Choice<BackendKind> kBackends[] = {{"cpu", BACKEND_CPU},
                                             {"cuda", BACKEND_CUDA}};
// "" (none) is not listed: it is no collective, not one to name.
constexpr Choice<CollectiveKind> kCollectives[] = {{"gloo", COLLECTIVE_GLOO},
                                                   {"nccl", COLLECTIVE_NCCL}};
constexpr Choice<ComputeKind> kComputes[] = {{"model", COMPUTE_MODEL},
                                             {"synthetic", COMPUTE_SYNTHETIC}};
constexpr Choice<AugmentKind> kAugments[] = {
    {"none", AUGMENT_NONE},
    {"random_resized_crop", AUGMENT_RANDOM_RESIZED_CROP},
    {"pad_crop", AUGMENT_PAD_CROP}};
constexpr Choice<OptimizerAlgorithm> kOptimizers[] = {{"adam", OPTIMIZER_ADAM},
                                                      {"adamw", OPTIMIZER_ADAM},
                                                      {"sgd", OPTIMIZER_SGD}};
constexpr Choice<LrScheduleKind> kLrSchedules[] = {
    {"constant", LR_SCHEDULE_CONSTANT},
    {"step", LR_SCHEDULE_STEP},
    {"cosine", LR_SCHEDULE_COSINE}};
// "" (the backend's default) is not listed: it is no precision to name.
constexpr Choice<PrecisionKind> kPrecisions[] = {{"fp32", PRECISION_FP32},
                                                 {"tf32", PRECISION_TF32},
                                                 {"bf16", PRECISION_BF16},
                                                 {"fp16", PRECISION_FP16}};

// "a, b or c".
template <typename E, size_t N>
std::string Expected(const Choice<E> (&choices)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    absl::StrAppend(&out, choices[i].spelling);
  }
  return out;
}

// The value as an error quotes it: escaped (control bytes, quotes and
// backslashes), at most 300 bytes of it.
std::string Quoted(absl::string_view text) {
  constexpr size_t kMaxQuoted = 300;
  const bool cut = text.size() > kMaxQuoted;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuoted)),
                      cut ? "..." : "", "\"");
}

// `empty` is what "" means (parsed as a spelling); nullptr: refused.
template <typename E, size_t N>
absl::StatusOr<E> Parse(absl::string_view text, absl::string_view field,
                        const Choice<E> (&choices)[N],
                        const E* empty = nullptr) {
  if (text.empty() && empty != nullptr) return *empty;
  for (const Choice<E>& choice : choices) {
    if (choice.spelling == text) return choice.value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", Quoted(text), "; expected ", Expected(choices)));
}

template <typename E, size_t N>
absl::string_view SpellingIn(E value, const Choice<E> (&choices)[N]) {
  for (const Choice<E>& choice : choices) {
    if (choice.value == value) return choice.spelling;
  }
  return "";
}

// AbslParseFlag's form of Parse: the error is what absl prints after
// "Illegal value '...' specified for flag '...'; ".
template <typename E>
bool ParseFlag(const absl::StatusOr<E>& parsed, E* value, std::string* error,
               const std::string& expected) {
  if (!parsed.ok()) {
    *error = absl::StrCat("expected ", expected);
    return false;
  }
  *value = *parsed;
  return true;
}

}  // namespace

absl::StatusOr<Mode> ParseMode(absl::string_view text,
                               absl::string_view field) {
  return Parse(text, field, kModes);
}

absl::StatusOr<BackendKind> ParseBackend(absl::string_view text,
                                         absl::string_view field) {
  return Parse(text, field, kBackends);
}

absl::StatusOr<CollectiveKind> ParseCollective(absl::string_view text,
                                               absl::string_view field) {
  constexpr CollectiveKind kNone = COLLECTIVE_NONE;
  return Parse(text, field, kCollectives, &kNone);
}

absl::StatusOr<ComputeKind> ParseCompute(absl::string_view text,
                                         absl::string_view field) {
  return Parse(text, field, kComputes);
}

absl::StatusOr<AugmentKind> ParseAugment(absl::string_view text,
                                         absl::string_view field) {
  constexpr AugmentKind kNone = AUGMENT_NONE;
  return Parse(text, field, kAugments, &kNone);
}

absl::StatusOr<OptimizerAlgorithm> ParseOptimizer(absl::string_view text,
                                                  absl::string_view field) {
  return Parse(text, field, kOptimizers);
}

absl::StatusOr<LrScheduleKind> ParseLrSchedule(absl::string_view text,
                                               absl::string_view field) {
  return Parse(text, field, kLrSchedules);
}

absl::StatusOr<PrecisionKind> ParsePrecision(absl::string_view text,
                                             absl::string_view field) {
  constexpr PrecisionKind kDefault = PRECISION_UNSPECIFIED;
  return Parse(text, field, kPrecisions, &kDefault);
}

PrecisionKind ResolvePrecision(PrecisionKind precision, BackendKind backend) {
  if (precision != PRECISION_UNSPECIFIED) return precision;
  return backend == BACKEND_CUDA ? PRECISION_TF32 : PRECISION_FP32;
}

absl::Status CheckPrecisionOnBackend(PrecisionKind precision,
                                     BackendKind backend,
                                     absl::string_view field) {
  if (precision == PRECISION_TF32 && backend != BACKEND_CUDA) {
    // TF32 is the tensor cores' format (NVIDIA Ampere and later); silently
    // computing fp32 instead would report a precision that never ran.
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"tf32\" with backend ", Spelling(backend),
        "; expected fp32 or bf16 (TF32 is a format of NVIDIA tensor cores; "
        "CPUs have no TF32 arithmetic)"));
  }
  if (precision == PRECISION_FP16 && backend != BACKEND_CUDA) {
    // Emulating it (fp32 arithmetic on values rounded to fp16) would be
    // slower than fp32 and measure nothing a user of a CPU wants.
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"fp16\" with backend ", Spelling(backend),
        "; expected fp32 or bf16 (oneDNN 2.6 has no fp16 convolution or "
        "inner product on CPUs; bf16 has fp32's range and needs no loss "
        "scaling)"));
  }
  return absl::OkStatus();
}

absl::string_view Spelling(Mode mode) { return SpellingIn(mode, kModes); }
absl::string_view Spelling(BackendKind backend) {
  return SpellingIn(backend, kBackends);
}
absl::string_view Spelling(CollectiveKind collective) {
  return SpellingIn(collective, kCollectives);
}
absl::string_view Spelling(ComputeKind compute) {
  return SpellingIn(compute, kComputes);
}
absl::string_view Spelling(AugmentKind augment) {
  return SpellingIn(augment, kAugments);
}
absl::string_view Spelling(OptimizerAlgorithm optimizer) {
  return SpellingIn(optimizer, kOptimizers);
}
absl::string_view Spelling(LrScheduleKind schedule) {
  return SpellingIn(schedule, kLrSchedules);
}
absl::string_view Spelling(PrecisionKind precision) {
  return SpellingIn(precision, kPrecisions);
}

namespace {

// The compression fields of `spec` into config->compression (the mode and
// optimizer already parsed): INVALID_ARGUMENT where one would shape nothing
// or is out of range.
absl::Status ParseCompressionChoices(const JobSpec& spec, JobConfig* config) {
  const OptimizerSpec& o = spec.optimizer();
  ASSIGN_OR_RETURN(config->compression, ParseCompression(spec.compression()));
  config->compression.error_feedback = !spec.no_error_feedback();
  config->compression.warmup_steps = spec.compression_warmup_steps();
  if (spec.compression_warmup_steps() < 0 ||
      (spec.compression_warmup_steps() > 0 && !config->compression.enabled())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression_warmup_steps: ", spec.compression_warmup_steps(),
        "; expected 0, or a positive step count with a compression"));
  }
  const double warmup_start = spec.compression_warmup_start();
  if (warmup_start != 0) {
    if (spec.compression_warmup_steps() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compression_warmup_start: ", warmup_start,
          " without compression_warmup_steps; expected 0 (it is where the "
          "warm-up's fraction starts)"));
    }
    if (!(warmup_start >= config->compression.topk_ratio &&
          warmup_start <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compression_warmup_start: ", warmup_start,
          "; expected 0 (dense) or a fraction in [",
          config->compression.topk_ratio,
          ", 1] (from topk:R's R to dense; Deep Gradient Compression's is "
          "0.25)"));
    }
    config->compression.warmup_start = warmup_start;
  }
  if (spec.no_error_feedback() && !config->compression.enabled()) {
    return absl::InvalidArgumentError(
        "no_error_feedback: true without a compression; expected a "
        "compression such as topk:0.01 (error feedback keeps what top-k "
        "did not send)");
  }
  if (spec.dense_pulls() && config->mode == MODE_ALLREDUCE) {
    // Top-k in allreduce sums every rank's pairs on every rank
    // (worker/topk_allgather.h): nothing is pulled.
    return absl::InvalidArgumentError(
        "dense_pulls: true with mode allreduce; expected false (an "
        "allreduce job pulls nothing: every worker sums the others' top-k "
        "pairs itself)");
  }
  if (spec.dense_pulls() && !config->compression.enabled()) {
    return absl::InvalidArgumentError(
        "dense_pulls: true without a compression; expected a compression "
        "such as topk:0.01 (only sparse pushes make the deltas that pulls "
        "would otherwise send; every other job's pulls are whole)");
  }
  if (spec.momentum_correction()) {
    if (!config->compression.enabled() || spec.no_error_feedback()) {
      return absl::InvalidArgumentError(
          "momentum_correction: true without a compression with error "
          "feedback; expected a compression such as topk:0.01 (the velocity "
          "accumulates into the residual)");
    }
    if (config->optimizer == OPTIMIZER_SGD && !(o.momentum() > 0)) {
      // DGC moves the momentum before the selection; plain SGD has none.
      return absl::InvalidArgumentError(
          "momentum_correction: true with optimizer sgd without momentum; "
          "expected momentum > 0, or adam (the workers keep the optimizer's "
          "momentum, or Adam's moments, before the selection)");
    }
    if (spec.compression_freeze_adam_variance()) {
      return absl::InvalidArgumentError(
          "momentum_correction: true with compression_freeze_adam_variance; "
          "expected one of them (with momentum correction Adam's moments "
          "are on the workers and the shards apply plain SGD: there is no "
          "shard variance to freeze)");
    }
    if (config->optimizer == OPTIMIZER_ADAM) {
      config->compression.adam = true;
      config->compression.beta1 = o.beta1();
      config->compression.beta2 = o.beta2();
      config->compression.epsilon = o.epsilon();
    } else {
      config->compression.momentum = o.momentum();
      config->compression.dampening = o.dampening();
      config->compression.nesterov = o.nesterov();
    }
  }
  config->compression.dense_steps = spec.compression_dense_steps();
  if (spec.compression_dense_steps() < 0 ||
      (spec.compression_dense_steps() > 0 && !config->compression.enabled())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression_dense_steps: ", spec.compression_dense_steps(),
        "; expected 0, or a positive step count with a compression"));
  }
  if (spec.compression_freeze_adam_variance() &&
      (config->optimizer != OPTIMIZER_ADAM ||
       spec.compression_dense_steps() <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression_freeze_adam_variance: true with optimizer ", o.name(),
        " and compression_dense_steps ", spec.compression_dense_steps(),
        "; expected adam with compression_dense_steps > 0 (the variance is "
        "taken from the dense steps)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobChoices(const JobSpec& spec) {
  JobConfig config;
  ASSIGN_OR_RETURN(config.backend, ParseBackend(spec.backend()));
  ASSIGN_OR_RETURN(config.mode, ParseMode(spec.mode()));
  if (config.mode != MODE_ALLREDUCE && !spec.collective().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective: ", Quoted(spec.collective()), " with mode ",
                     spec.mode(), "; expected none (only allreduce has one)"));
  }
  ASSIGN_OR_RETURN(config.collective, ParseCollective(spec.collective()));
  ASSIGN_OR_RETURN(config.compute, ParseCompute(spec.compute()));
  ASSIGN_OR_RETURN(config.augment, ParseAugment(spec.augment()));
  const OptimizerSpec& o = spec.optimizer();
  ASSIGN_OR_RETURN(config.optimizer, ParseOptimizer(o.name()));
  ASSIGN_OR_RETURN(config.lr_schedule, ParseLrSchedule(o.lr_schedule()));
  ASSIGN_OR_RETURN(const PrecisionKind precision,
                   ParsePrecision(spec.precision()));
  RETURN_IF_ERROR(CheckPrecisionOnBackend(precision, config.backend));
  config.precision = ResolvePrecision(precision, config.backend);
  if (!spec.wire_dtype().empty()) {
    ASSIGN_OR_RETURN(config.wire_dtype, ParseWireDtype(spec.wire_dtype()));
  }
  RETURN_IF_ERROR(ParseCompressionChoices(spec, &config));
  config.spec = spec;
  return config;
}

Mode ModeOf(const JobSpec& spec) {
  return ParseMode(spec.mode()).value_or(MODE_UNSPECIFIED);
}

bool AbslParseFlag(absl::string_view text, Mode* value, std::string* error) {
  return ParseFlag(ParseMode(text), value, error, Expected(kModes));
}
bool AbslParseFlag(absl::string_view text, BackendKind* value,
                   std::string* error) {
  return ParseFlag(ParseBackend(text), value, error, Expected(kBackends));
}
bool AbslParseFlag(absl::string_view text, CollectiveKind* value,
                   std::string* error) {
  return ParseFlag(ParseCollective(text), value, error, Expected(kCollectives));
}
bool AbslParseFlag(absl::string_view text, ComputeKind* value,
                   std::string* error) {
  return ParseFlag(ParseCompute(text), value, error, Expected(kComputes));
}
bool AbslParseFlag(absl::string_view text, AugmentKind* value,
                   std::string* error) {
  return ParseFlag(ParseAugment(text), value, error, Expected(kAugments));
}
bool AbslParseFlag(absl::string_view text, OptimizerAlgorithm* value,
                   std::string* error) {
  return ParseFlag(ParseOptimizer(text), value, error, Expected(kOptimizers));
}
bool AbslParseFlag(absl::string_view text, LrScheduleKind* value,
                   std::string* error) {
  return ParseFlag(ParseLrSchedule(text), value, error, Expected(kLrSchedules));
}
bool AbslParseFlag(absl::string_view text, PrecisionKind* value,
                   std::string* error) {
  return ParseFlag(
      ParsePrecision(text), value, error,
      absl::StrCat(Expected(kPrecisions), " (empty: the backend's default)"));
}

std::string AbslUnparseFlag(Mode value) { return std::string(Spelling(value)); }
std::string AbslUnparseFlag(BackendKind value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(CollectiveKind value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(ComputeKind value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(AugmentKind value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(OptimizerAlgorithm value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(LrScheduleKind value) {
  return std::string(Spelling(value));
}
std::string AbslUnparseFlag(PrecisionKind value) {
  return std::string(Spelling(value));
}

}  // namespace pstrain
