#include "worker/job_inputs.h"

#include "absl/strings/str_cat.h"
#include "models/backend.h"

namespace pstrain {

absl::StatusOr<Dataset> LoadDatasetNamed(const std::string& name,
                                         const std::string& dir,
                                         const DatasetOptions& options,
                                         absl::string_view prefix) {
  absl::StatusOr<Dataset> dataset = LoadDataset(name, dir, options);
  if (!dataset.ok()) {
    const std::string where =
        name == "synthetic"
            ? absl::StrCat(prefix, "dataset=synthetic ", prefix,
                           "image_size=", options.image_size, " ", prefix,
                           "num_classes=", options.num_classes, " ", prefix,
                           "synthetic_samples=", options.train_samples)
            : absl::StrCat(prefix, "dataset=", name, " ", prefix,
                           "data_dir=", dir);
    return absl::Status(dataset.status().code(),
                        absl::StrCat(where, ": ", dataset.status().message()));
  }
  return dataset;
}

absl::Status CheckBackend(BackendKind backend, int gpu,
                          absl::string_view prefix) {
  if (backend == BACKEND_CPU) return absl::OkStatus();
  if (backend != BACKEND_CUDA) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "backend: ", static_cast<int>(backend),
                     "; expected cpu or cuda"));
  }
  absl::Status status = Backend::CudaAvailable(gpu);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(prefix, "backend=cuda --gpu=", gpu, ": ",
                                     status.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckPrecision(BackendKind backend, PrecisionKind precision,
                            absl::string_view prefix) {
  const std::string field = absl::StrCat(prefix, "precision");
  absl::Status status = CheckPrecisionOnBackend(precision, backend, field);
  if (status.ok() && backend == BACKEND_CPU && precision == PRECISION_BF16) {
    status = CpuBf16Available();
  }
  return status;
}

}  // namespace pstrain
