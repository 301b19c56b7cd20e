#include "catalog/catalog.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace pstrain {
namespace {

// Sorted; Model::Create builds each.
constexpr absl::string_view kModels[] = {
    "alexnet",   "bert_base",        "bert_base_untied",
    "bert_tiny", "bert_tiny_untied", "lenet5",
    "mlp",       "resnet101",        "resnet18",
    "resnet34",  "resnet50",         "vgg16"};

// Sorted; LoadDataset reads each.
constexpr absl::string_view kDatasets[] = {
    "cifar10", "fashion_mnist", "image_folder",     "mnist",
    "records", "synthetic",     "synthetic_tokens", "tokens"};

bool Contains(absl::Span<const absl::string_view> names,
              absl::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

absl::Span<const absl::string_view> ModelNames() { return kModels; }

absl::Span<const absl::string_view> DatasetNames() { return kDatasets; }

bool IsKnownModel(absl::string_view name) {
  return Contains(ModelNames(), name);
}

bool IsKnownDataset(absl::string_view name) {
  return Contains(DatasetNames(), name);
}

bool IsSequenceModel(absl::string_view model) {
  return absl::StartsWith(model, "bert_");
}

bool HasUntiedEmbedding(absl::string_view model) {
  return IsSequenceModel(model) && absl::EndsWith(model, "_untied");
}

bool IsTokenDataset(absl::string_view dataset) {
  return dataset == "tokens" || dataset == "synthetic_tokens";
}

std::string KnownModels() { return absl::StrJoin(ModelNames(), ", "); }

std::string KnownDatasets() { return absl::StrJoin(DatasetNames(), ", "); }

}  // namespace pstrain
