// Token datasets for the sequence models (issue 41; models/model.h's
// bert_tiny and bert_base), read by LoadDataset (worker/dataset.h):
//  - "tokens": token files (text/mlm_data.h, "PSTOKEN1") written by
//    text:train_tokenizer: data_dir/train.tokens, and data_dir/test.tokens
//    (the held-out split; absent: test.count 0). Memory-mapped like the
//    IDX and record files (worker/mapped_file.h): a split is a view into
//    its mapping, checked once at load (header, size, every id below the
//    vocabulary), and each batch's pages are handed back as it is read.
//  - "synthetic_tokens": a synthetic token stream for throughput runs (as
//    the seeds' benchmark): [CLS] then uniform ordinary ids of a
//    vocabulary of num_classes, seq_len tokens, no padding; sample i is
//    sequence i % 65536 of a fixed pool (DatasetOptions.seed), masked as
//    that pool entry; 128 test sequences.
//
// A loaded token dataset is a Dataset whose `tokens` is set: train.chw and
// test.chw are {seq_len}, train.count and test.count the sequences, and
// num_classes the vocabulary, so that the sampler, the step counts and
// Model::Create read it as they read images. The splits' images and labels
// stay empty: batches come from TokenBatch.
//
// Batches: BERT's masking (MakeMlmBatch) seeded per (seed, epoch,
// sequence), so a sequence is masked the same way whichever worker, batch
// or number of workers trains it (dynamic masking: each epoch anew).
//
// Thread-safety: a loaded TokenData is immutable and may be shared;
// TokenBatch may run on any thread.
#ifndef PSTRAIN_WORKER_TOKEN_DATASET_H_
#define PSTRAIN_WORKER_TOKEN_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "text/mlm_data.h"
#include "worker/dataset.h"
#include "worker/mapped_file.h"

namespace pstrain {

// One split of a token dataset.
struct TokenSplit {
  // The sequences (a view into `file` or `pool`); empty for a missing
  // test file.
  TokenSpan sequences;
  // Sample i is sequence i % sequences.count (synthetic: a pool smaller
  // than the split; a file: the count itself).
  int64_t count = 0;
  std::shared_ptr<const MappedFile> file;      // "tokens"
  std::shared_ptr<const TokenSequences> pool;  // "synthetic_tokens"
};

struct TokenData {
  int vocab_size = 0;
  int64_t seq_len = 0;
  TokenSplit train;
  TokenSplit test;
};

// Pool size of "synthetic_tokens": at most this many distinct sequences
// (32 MiB at 128 tokens).
inline constexpr int64_t kSyntheticTokenPool = 65536;
// "synthetic_tokens" without a DatasetOptions.seq_len.
inline constexpr int64_t kDefaultSeqLen = 128;
// "synthetic_tokens": test sequences, at most (of test_samples): a bert_base
// evaluation of 1,000 would outlast a short throughput run on a CPU.
inline constexpr int64_t kSyntheticTokenTestSamples = 128;

// Loads token dataset `name` ("tokens" or "synthetic_tokens") from
// `data_dir` with options.seq_len (0: the file's, or kDefaultSeqLen),
// options.num_classes (the synthetic vocabulary), train_samples,
// test_samples and seed. Errors: NOT_FOUND naming data_dir/train.tokens
// when it is missing; DATA_LOSS naming the file for one that is not a
// token file, is cut short or holds an id outside its vocabulary, or when
// the test file's vocabulary or length differs from the train file's;
// INVALID_ARGUMENT for a seq_len other than the file's (naming both), a
// seq_len outside [2, 512] or a synthetic vocabulary <= kFirstPieceId.
absl::StatusOr<Dataset> LoadTokenDataset(const std::string& name,
                                         const std::string& data_dir,
                                         const DatasetOptions& options);

// Samples order[begin, begin + n) of `split` as a masked batch (ids [n, S],
// padding mask [n, S], labels n * S), masked by `masker` with seed (seed,
// epoch, sequence). The order's entries must be below split.count.
MlmBatch TokenBatch(const TokenSplit& split, const SampleOrder& order,
                    int64_t begin, int64_t n, const MlmMasker& masker,
                    uint64_t seed, int64_t epoch);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TOKEN_DATASET_H_
