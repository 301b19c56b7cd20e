#include "worker/token_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/special_ids.h"

namespace pstrain {
namespace {

// The longest sequence the models take (their position table, model.h).
constexpr int64_t kMaxSeqLen = 512;

absl::Status CheckSeqLen(int64_t seq_len, const std::string& where) {
  if (seq_len < 2 || seq_len > kMaxSeqLen) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "seq_len ", seq_len, "; expected 2 to ", kMaxSeqLen,
                     " (the models' position table)"));
  }
  return absl::OkStatus();
}

// Maps and checks token file `path` into `split`; its vocabulary into
// *vocab_size.
absl::Status MapTokenSplit(const std::string& path, TokenSplit* split,
                           int* vocab_size) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(split->sequences, ParseTokenFile(path, file->data(),
                                                    file->size(), vocab_size));
  file->ReleaseResident();  // The check read every page once.
  split->count = split->sequences.count;
  split->file = std::move(file);
  return absl::OkStatus();
}

absl::StatusOr<TokenData> MapTokenFiles(const std::string& data_dir,
                                        int64_t seq_len) {
  TokenData data;
  const std::string train = absl::StrCat(data_dir, "/train.tokens");
  const std::string test = absl::StrCat(data_dir, "/test.tokens");
  RETURN_IF_ERROR(MapTokenSplit(train, &data.train, &data.vocab_size));
  data.seq_len = data.train.sequences.seq_len;
  if (seq_len != 0 && seq_len != data.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len ", seq_len, ", but ", train, " holds sequences of ",
        data.seq_len, " tokens; expected 0 or ", data.seq_len));
  }
  RETURN_IF_ERROR(CheckSeqLen(data.seq_len, absl::StrCat(train, ": ")));
  if (data.vocab_size <= kFirstPieceId) {
    return absl::DataLossError(absl::StrCat(
        train, ": vocabulary ", data.vocab_size, "; expected > ", kFirstPieceId,
        " (the special ids and at least one piece)"));
  }
  struct stat st;
  if (::stat(test.c_str(), &st) != 0) return data;  // No held-out split.
  int test_vocab = 0;
  RETURN_IF_ERROR(MapTokenSplit(test, &data.test, &test_vocab));
  if (test_vocab != data.vocab_size ||
      data.test.sequences.seq_len != data.seq_len) {
    return absl::DataLossError(
        absl::StrCat(test, ": vocabulary ", test_vocab, ", sequences of ",
                     data.test.sequences.seq_len, "; expected ", train, "'s ",
                     data.vocab_size, " and ", data.seq_len));
  }
  return data;
}

TokenSplit SyntheticSplit(int64_t count, int64_t seq_len, int vocab,
                          uint64_t seed) {
  TokenSplit split;
  split.pool = std::make_shared<const TokenSequences>(SyntheticSequences(
      std::min(count, kSyntheticTokenPool), seq_len, vocab, seed));
  split.sequences = split.pool->span();
  split.count = count;
  return split;
}

}  // namespace

absl::StatusOr<Dataset> LoadTokenDataset(const std::string& name,
                                         const std::string& data_dir,
                                         const DatasetOptions& options) {
  auto data = std::make_shared<TokenData>();
  if (name == "tokens") {
    ASSIGN_OR_RETURN(*data, MapTokenFiles(data_dir, options.seq_len));
  } else if (name == "synthetic_tokens") {
    data->seq_len = options.seq_len != 0 ? options.seq_len : kDefaultSeqLen;
    RETURN_IF_ERROR(CheckSeqLen(data->seq_len, ""));
    data->vocab_size = options.num_classes;
    if (data->vocab_size <= kFirstPieceId || options.train_samples < 1 ||
        options.test_samples < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "synthetic tokens: vocabulary (num_classes) ", data->vocab_size, ", ",
          options.train_samples, " training and ", options.test_samples,
          " test sequences; expected a vocabulary > ", kFirstPieceId,
          " and >= 1 training sequence"));
    }
    data->train = SyntheticSplit(options.train_samples, data->seq_len,
                                 data->vocab_size, options.seed);
    data->test = SyntheticSplit(
        std::min(options.test_samples, kSyntheticTokenTestSamples),
        data->seq_len, data->vocab_size, options.seed + 1);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset \"", name, "\"; expected tokens or synthetic_tokens"));
  }
  Dataset dataset;
  dataset.name = name;
  dataset.num_classes = data->vocab_size;
  for (auto [split, from] : {std::pair{&dataset.train, &data->train},
                             std::pair{&dataset.test, &data->test}}) {
    split->chw = {data->seq_len};
    split->count = from->count;
  }
  dataset.tokens = std::move(data);
  return dataset;
}

MlmBatch TokenBatch(const TokenSplit& split, const SampleOrder& order,
                    int64_t begin, int64_t n, const MlmMasker& masker,
                    uint64_t seed, int64_t epoch) {
  std::vector<int64_t> indices(n);
  for (int64_t i = 0; i < n; ++i) {
    // A synthetic split larger than its pool repeats the pool.
    indices[i] = static_cast<int64_t>(order[begin + i]) % split.sequences.count;
  }
  MlmBatch batch = MakeMlmBatch(split.sequences, indices, masker, seed, epoch);
  if (split.file != nullptr) {
    split.file->NoteRandomRead(static_cast<uint64_t>(n) *
                               split.sequences.seq_len * sizeof(int32_t));
  }
  return batch;
}

}  // namespace pstrain
