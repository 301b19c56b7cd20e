#include "cli/eval_command.h"

#include <cstdio>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/command_help.h"
#include "common/flags_util.h"
#include "common/regular_file.h"
#include "models/backend_factory.h"
#include "models/model.h"
#include "models/model_file.h"
#include "worker/checkpoint.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"
#include "worker/input_pipeline.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

}  // namespace

int EvalCommand(const std::string& checkpoint, int batch_size) {
  absl::Status ignored =
      CheckIgnoredDataFlags(absl::GetFlag(FLAGS_dataset), "eval");
  if (ignored.ok()) {
    ignored = CheckIgnoredBackendFlags(absl::GetFlag(FLAGS_backend), "eval");
  }
  if (!ignored.ok()) return Fail(2, std::string(ignored.message()));
  if (checkpoint.empty()) {
    return Fail(2,
                "--checkpoint: expected a model file, a checkpoint_dir or a "
                "step-<N> folder of one");
  }
  // A checkpoint's model file is read against its manifest (size, crc32,
  // model, dataset, step, tensors).
  absl::StatusOr<CheckpointModelFile> file = FindModelFile(checkpoint);
  if (!file.ok()) return Fail(2, std::string(file.status().message()));
  const std::string& path = file->path;
  absl::StatusOr<ModelFileInfo> info = ReadModelFileInfo(path, file->options);
  if (!info.ok()) return Fail(2, std::string(info.status().message()));
  if (file->manifest && (info->model != file->manifest->job.model ||
                         info->dataset != file->manifest->job.dataset ||
                         info->steps != file->manifest->step)) {
    return Fail(2,
                absl::StrCat(path, ": a ", EscapeForMessage(info->model),
                             " of dataset ", EscapeForMessage(info->dataset),
                             " at step ", info->steps, "; its manifest says ",
                             EscapeForMessage(file->manifest->job.model), ", ",
                             EscapeForMessage(file->manifest->job.dataset),
                             ", step ", file->manifest->step));
  }
  if (absl::Status s = CheckBackendFlags(); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<Dataset> dataset = LoadDatasetFromFlags();
  if (!dataset.ok()) return Fail(2, std::string(dataset.status().message()));
  if (TestSamples(*dataset) == 0) {
    return Fail(2, absl::StrCat("--dataset=", dataset->name,
                                ": no test split to evaluate on; expected a "
                                "dataset with one (image folders: train/ and "
                                "test/, or tiny-ImageNet's val/; records: "
                                "test.records)"));
  }
  if (dataset->test.chw != info->input_chw ||
      dataset->num_classes != info->num_classes) {
    return Fail(
        2, absl::StrCat(path, ": a ", info->model, " for ",
                        ShapeToString(info->input_chw), " inputs and ",
                        info->num_classes, " classes; dataset ", dataset->name,
                        " has ", ShapeToString(dataset->test.chw), " and ",
                        dataset->num_classes));
  }
  // The inputs the model learned: its training set's standardisation, not
  // the evaluated dataset's (files written before these keys: the
  // dataset's own).
  if (!info->input_mean.empty()) {
    if (absl::Status s =
            StandardiseAs(info->input_mean, info->input_stddev, &*dataset);
        !s.ok()) {
      return Fail(2, absl::StrCat(path, ": ", s.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_gpu));
  if (!backend.ok()) return Fail(2, std::string(backend.status().message()));
  if (const PrecisionKind precision = absl::GetFlag(FLAGS_precision);
      precision != PRECISION_UNSPECIFIED) {
    if (absl::Status s = (*backend)->SetPrecision(precision); !s.ok()) {
      return Fail(2, std::string(s.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(info->model, info->input_chw, info->num_classes,
                    ModelOptions(), backend->get());
  if (!model.ok()) return Fail(2, std::string(model.status().message()));
  if (file->manifest) {
    if (absl::Status s =
            CheckManifestModel(*file->manifest, (*model)->PsTensorNames(),
                               (*model)->PsTensorShapes(),
                               static_cast<int>((*model)->buffers().size()));
        !s.ok()) {
      return Fail(2, std::string(s.message()));
    }
  }
  if (absl::Status s = LoadModelFile(path, model->get(), file->options);
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  if (batch_size < 1 || batch_size > 65536) {
    return Fail(
        2, absl::StrCat("--batch_size: ", batch_size, "; expected 1 to 65536"));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<Evaluation> eval =
      EvaluateModel(**model, *dataset, batch_size,
                    InputThreadsForCores(
                        static_cast<int>(std::thread::hardware_concurrency())));
  if (!eval.ok()) return Fail(1, eval.status().ToString());
  std::printf(
      "%s: %s after %lld steps, %s test set (%lld samples) on %s: test loss "
      "%.4f, test accuracy: %.4f (%.2f sec)\n",
      path.c_str(), info->model.c_str(), static_cast<long long>(info->steps),
      dataset->name.c_str(), static_cast<long long>(dataset->test.count),
      (*backend)->name().c_str(), eval->loss, eval->accuracy,
      absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}

}  // namespace pstrain
