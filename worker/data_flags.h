// Command-line flags shared by pstrain_worker, `pstrain run` and
// train_bench: the dataset (--dataset, --data_dir, --image_size,
// --bad_images, --stream_images, --max_dataset_memory, --augment,
// --num_classes, --synthetic_samples, --seq_len)
// and the backend (--backend,
// --precision, --gpu). Defined once here so that `pstrain run` forwards exactly what a
// worker parses.
//
// Thread-safety: call from main() only.
#ifndef PSTRAIN_WORKER_DATA_FLAGS_H_
#define PSTRAIN_WORKER_DATA_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "catalog/job_config.h"
#include "worker/dataset.h"
#include "worker/job_inputs.h"

namespace pstrain {

// A flag's size in bytes: a whole number, or a number with a suffix K, M,
// G or T (powers of 1024, any case, an optional trailing "B" or "iB"):
// "8G", "512MiB", "1.5g". 0 (or empty) is 0.
struct ByteSize {
  int64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace pstrain

ABSL_DECLARE_FLAG(std::string, dataset);
ABSL_DECLARE_FLAG(std::string, data_dir);
ABSL_DECLARE_FLAG(int, image_size);
ABSL_DECLARE_FLAG(std::string, bad_images);
ABSL_DECLARE_FLAG(bool, stream_images);
ABSL_DECLARE_FLAG(pstrain::ByteSize, max_dataset_memory);
ABSL_DECLARE_FLAG(pstrain::AugmentKind, augment);
ABSL_DECLARE_FLAG(int, num_classes);
ABSL_DECLARE_FLAG(int, seq_len);
ABSL_DECLARE_FLAG(int64_t, synthetic_samples);
ABSL_DECLARE_FLAG(pstrain::BackendKind, backend);
ABSL_DECLARE_FLAG(pstrain::PrecisionKind, precision);
ABSL_DECLARE_FLAG(int, gpu);

namespace pstrain {

// Loads the dataset the flags name. Errors name the flags:
// "--dataset=cifar10 --data_dir=/x: /x/data_batch_1.bin: cannot open ...";
// INVALID_ARGUMENT for a --bad_images other than fail or skip.
absl::StatusOr<Dataset> LoadDatasetFromFlags();

// The dataset the flags name with DatasetOptions::headers_only: its counts,
// shapes and classes without its pixels (image_folder: headers only, and
// the memory check of an in-memory load); errors as LoadDatasetFromFlags'.
absl::StatusOr<Dataset> ListDatasetFromFlags();

// --num_classes, or 30522 (BERT-base's vocabulary) for
// --dataset=synthetic_tokens when it is left at its default.
int NumClassesFromFlags();

// Checks --backend and --gpu: for cuda a CUDA build and a visible GPU
// (worker/job_inputs.h CheckBackend); and --precision on that backend
// (CheckPrecision: tf32 and fp16 need cuda, bf16 on the CPU AVX-512). --backend and --augment are typed
// (catalog/job_config.h): a value that is not a spelling is refused when
// the flags are parsed ("--backend=tpu: expected cpu or cuda").
absl::Status CheckBackendFlags();

// The flags above as "--name=value" arguments, for a child process.
std::vector<std::string> DataAndBackendFlagArgs();

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_FLAGS_H_
