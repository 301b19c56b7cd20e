// Loading a job's dataset and checking its backend, with errors that name
// the inputs: shared by the command-line flags (worker/data_flags.h) and
// the job spec a worker gets from its coordinator.
//
// Thread-safety: plain functions.
#ifndef PSTRAIN_WORKER_JOB_INPUTS_H_
#define PSTRAIN_WORKER_JOB_INPUTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "catalog/job_config.h"
#include "worker/dataset.h"

namespace pstrain {

// Loads dataset `name` from `dir`; errors name the inputs, each written as
// prefix + "name=value" ("--" for flags, "" for a job spec's fields).
absl::StatusOr<Dataset> LoadDatasetNamed(const std::string& name,
                                         const std::string& dir,
                                         const DatasetOptions& options,
                                         absl::string_view prefix);

// Checks a backend and GPU index: a cuda backend needs a CUDA build and a
// visible GPU (FAILED_PRECONDITION naming them with `prefix` as above:
// "--backend=cuda --gpu=0: this build has no CUDA backend; ...");
// INVALID_ARGUMENT for BACKEND_UNSPECIFIED or a number outside the enum.
absl::Status CheckBackend(BackendKind backend, int gpu,
                          absl::string_view prefix);

// Whether `backend` computes `precision` (PRECISION_UNSPECIFIED: its
// default) on this machine: catalog/job_config.h CheckPrecisionOnBackend,
// and for bf16 on the CPU whether oneDNN creates bf16 primitives here
// (CpuBf16Available: FAILED_PRECONDITION on a CPU without AVX-512). CUDA's
// bf16 needs compute capability 8.0, checked where the worker creates its
// backend. `prefix` as CheckBackend's ("--" for flags).
absl::Status CheckPrecision(BackendKind backend, PrecisionKind precision,
                            absl::string_view prefix);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_JOB_INPUTS_H_
