// The catalog of model and dataset names a job spec may give: the one list
// that job validation (coordinator/job_spec.cc), the model zoo
// (models/model_zoo.cc: Model::Create builds each model named here) and the
// dataset readers (worker/dataset.cc: LoadDataset reads each dataset named
// here) share. models/model_test.cc and worker/dataset_test.cc check that
// every name here is built or read.
//
// This package depends on Abseil only, so the coordinator and the PS
// validate a job without linking oneDNN, libjpeg or libpng
// (scripts/check_deps.sh checks it).
//
// Thread-safety: constants and pure functions.
#ifndef PSTRAIN_CATALOG_CATALOG_H_
#define PSTRAIN_CATALOG_CATALOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pstrain {

// The model zoo's names, sorted: "alexnet", "bert_base",
// "bert_base_untied", "bert_tiny", "bert_tiny_untied", "lenet5", "mlp",
// "resnet101", "resnet18", "resnet34", "resnet50", "vgg16" (the BERTs take
// token sequences: models/model.h).
absl::Span<const absl::string_view> ModelNames();

// The datasets' names, sorted: "cifar10", "fashion_mnist", "image_folder",
// "mnist", "records", "synthetic" (images), "synthetic_tokens", "tokens"
// (token sequences: worker/token_dataset.h).
absl::Span<const absl::string_view> DatasetNames();

bool IsKnownModel(absl::string_view name);
bool IsKnownDataset(absl::string_view name);

// Whether model `model` takes token sequences (the BERTs) and whether
// dataset `dataset` holds them; a job pairs sequence models with token
// datasets only (coordinator/job_spec.cc).
bool IsSequenceModel(absl::string_view model);
bool IsTokenDataset(absl::string_view dataset);
// Whether model `model` has an embedding table whose gradient is row-sparse
// (the "_untied" BERTs: their MLM decoder has its own weight, so the token
// embedding's gradient touches the batch's token rows only), which
// JobSpec.sparse_embeddings pushes and pulls by row (issue 41).
bool HasUntiedEmbedding(absl::string_view model);

// The names joined with ", ", for error messages: "alexnet, lenet5, ...".
std::string KnownModels();
std::string KnownDatasets();

}  // namespace pstrain

#endif  // PSTRAIN_CATALOG_CATALOG_H_
