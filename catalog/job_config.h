// A job's choices as types: the enums of proto/job.proto (Mode,
// BackendKind, CollectiveKind, ComputeKind, AugmentKind, OptimizerAlgorithm,
// LrScheduleKind), parsed from the spellings that job specs and flags carry
// and printed back, and JobConfig, the job's spec with its choices parsed
// once.
//
// Why the spec keeps text fields: users write `mode: "sync"` in spec files
// and `--mode=sync` on command lines. The protobuf text format reads an
// enum field only as its identifier (`mode: MODE_SYNC`), so turning
// JobSpec.mode into an enum would refuse every spec written so far. The
// spelled fields stay `bytes` in JobSpec, and a JobConfig carries the typed
// values beside the spec: each process parses the choices once, where it
// reads a spec (coordinator/job_spec.h ResolveJobSpec) or a flag
// (AbslParseFlag below), and reads the enums from then on; no code compares
// the text of a choice.
//
// The spellings (each enum's first spelling is the one printed):
//   mode                   sync, async, allreduce
//   backend                cpu, cuda
//   collective             gloo, nccl; "" is COLLECTIVE_NONE (PS modes)
//   compute                model, synthetic
//   augment                none, random_resized_crop, pad_crop; "" is none
//   optimizer.name         adam, adamw (the same: OPTIMIZER_ADAM), sgd
//   optimizer.lr_schedule  constant, step, cosine
//   precision              fp32, tf32, bf16, fp16; "" is the backend's
//                          default (fp32 on cpu, tf32 on cuda)
// Spellings are exact: case, spaces and other text are refused.
//
// Errors: INVALID_ARGUMENT, one line naming the field, the value (quoted,
// control bytes and quotes escaped, cut at 300 bytes) and the spellings, as
// coordinator/job_spec.h's: `mode: "semi"; expected sync, async or
// allreduce`.
//
// Depends on Abseil and the job proto only: the coordinator and the PS
// read it without linking oneDNN, libjpeg or libpng (scripts/check_deps.sh).
//
// Thread-safety: pure functions; a JobConfig is a value.
#ifndef PSTRAIN_CATALOG_JOB_CONFIG_H_
#define PSTRAIN_CATALOG_JOB_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"
#include "worker/topk_compression.h"

namespace pstrain {

// Each parses one spelling (table above); `field` names the field or flag
// in the error ("mode", "--mode", "optimizer.name").
absl::StatusOr<Mode> ParseMode(absl::string_view text,
                               absl::string_view field = "mode");
absl::StatusOr<BackendKind> ParseBackend(absl::string_view text,
                                         absl::string_view field = "backend");
absl::StatusOr<CollectiveKind> ParseCollective(
    absl::string_view text, absl::string_view field = "collective");
absl::StatusOr<ComputeKind> ParseCompute(absl::string_view text,
                                         absl::string_view field = "compute");
absl::StatusOr<AugmentKind> ParseAugment(absl::string_view text,
                                         absl::string_view field = "augment");
absl::StatusOr<OptimizerAlgorithm> ParseOptimizer(
    absl::string_view text, absl::string_view field = "optimizer.name");
absl::StatusOr<LrScheduleKind> ParseLrSchedule(
    absl::string_view text, absl::string_view field = "optimizer.lr_schedule");
// "" is PRECISION_UNSPECIFIED (the backend's default, DefaultPrecision).
absl::StatusOr<PrecisionKind> ParsePrecision(
    absl::string_view text, absl::string_view field = "precision");
// What PRECISION_UNSPECIFIED means on `backend`: fp32 on cpu, tf32 on cuda
// (PyTorch's default for cuDNN convolutions); `precision` otherwise.
PrecisionKind ResolvePrecision(PrecisionKind precision, BackendKind backend);
// OK if `backend` computes `precision`; INVALID_ARGUMENT naming both and
// why otherwise (tf32 on cpu: CPUs have no TF32 arithmetic). `field` names
// the flag or field ("precision", "--precision").
absl::Status CheckPrecisionOnBackend(PrecisionKind precision,
                                     BackendKind backend,
                                     absl::string_view field = "precision");

// The spelling of a value, as a spec or a flag writes it: "sync", "cpu",
// "gloo", "model", "none", "adam", "constant". COLLECTIVE_NONE is ""; an
// UNSPECIFIED value, or a number outside the enum, is "".
absl::string_view Spelling(Mode mode);
absl::string_view Spelling(BackendKind backend);
absl::string_view Spelling(CollectiveKind collective);
absl::string_view Spelling(ComputeKind compute);
absl::string_view Spelling(AugmentKind augment);
absl::string_view Spelling(OptimizerAlgorithm optimizer);
absl::string_view Spelling(LrScheduleKind schedule);
absl::string_view Spelling(PrecisionKind precision);

// A job's spec and its parsed choices. Built by ParseJobChoices (choices
// only) or coordinator/job_spec.h ResolveJobSpec (after the whole
// validation); the choices' text in `spec` is what was parsed.
struct JobConfig {
  JobSpec spec;
  Mode mode = MODE_SYNC;
  BackendKind backend = BACKEND_CPU;
  // COLLECTIVE_NONE in the PS modes.
  CollectiveKind collective = COLLECTIVE_NONE;
  ComputeKind compute = COMPUTE_MODEL;
  AugmentKind augment = AUGMENT_NONE;
  OptimizerAlgorithm optimizer = OPTIMIZER_ADAM;
  LrScheduleKind lr_schedule = LR_SCHEDULE_CONSTANT;
  // What the layers compute in (spec.precision resolved: never
  // UNSPECIFIED).
  PrecisionKind precision = PRECISION_FP32;
  // How gradients and weights travel (spec.wire_dtype; common/wire_dtype.h):
  // DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16.
  DType wire_dtype = DTYPE_FLOAT32;
  // Top-k compression of pushes (spec.compression, spec.no_error_feedback,
  // spec.momentum_correction with the optimizer's momentum or Adam's
  // betas and epsilon;
  // worker/topk_compression.h); disabled: none.
  CompressionOptions compression;

  // Modes sync and async: the job has parameter servers.
  bool has_ps() const { return mode != MODE_ALLREDUCE; }
};

// Parses the choices of `spec` (read after ApplyJobDefaults: an empty mode,
// backend, compute, optimizer name or schedule is refused), in this order:
// backend, mode, collective, compute, augment, optimizer.name,
// optimizer.lr_schedule, precision (empty: the backend's default),
// wire_dtype (empty: fp32), compression (empty: none). Also refuses a
// precision the backend does not compute (CheckPrecisionOnBackend), a
// collective outside mode allreduce ("collective: \"gloo\" with mode sync;
// expected none (only allreduce has one)"), the compression fields that
// would shape nothing (no_error_feedback and the warm-up without a
// compression), dense_pulls with mode allreduce or without a compression,
// and momentum_correction without a compression with error feedback, with
// sgd without momentum, or with compression_freeze_adam_variance (the one
// line names the field and what was expected); every other check is
// ValidateJobSpec's. The config holds a copy of `spec`.
absl::StatusOr<JobConfig> ParseJobChoices(const JobSpec& spec);

// The mode of a spec resolved before (a stored one: the coordinator's job
// table); MODE_UNSPECIFIED if its text is none.
Mode ModeOf(const JobSpec& spec);

// Command-line flags of these types (ABSL_FLAG(pstrain::Mode, mode, ...))
// take the same spellings; the error names the values.
bool AbslParseFlag(absl::string_view text, Mode* value, std::string* error);
bool AbslParseFlag(absl::string_view text, BackendKind* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, CollectiveKind* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, ComputeKind* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, AugmentKind* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, OptimizerAlgorithm* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, LrScheduleKind* value,
                   std::string* error);
bool AbslParseFlag(absl::string_view text, PrecisionKind* value,
                   std::string* error);
std::string AbslUnparseFlag(Mode value);
std::string AbslUnparseFlag(BackendKind value);
std::string AbslUnparseFlag(CollectiveKind value);
std::string AbslUnparseFlag(ComputeKind value);
std::string AbslUnparseFlag(AugmentKind value);
std::string AbslUnparseFlag(OptimizerAlgorithm value);
std::string AbslUnparseFlag(LrScheduleKind value);
std::string AbslUnparseFlag(PrecisionKind value);

}  // namespace pstrain

#endif  // PSTRAIN_CATALOG_JOB_CONFIG_H_
