// Masked-language-model data (issue 41): token sequences packed from
// tokenized documents, BERT's masking, and a synthetic token stream for
// throughput runs, as the batches a sequence model (models/model.h) takes.
//
// Special ids are text/special_ids.h's (padding 0, [CLS] 2, [SEP] 3, [MASK]
// 4; ordinary tokens from 5).
//
// Thread-safety: plain values and pure functions; an MlmMasker is
// immutable (each call takes its own generator).
#ifndef PSTRAIN_TEXT_MLM_DATA_H_
#define PSTRAIN_TEXT_MLM_DATA_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/tensor.h"
#include "text/special_ids.h"

namespace pstrain {

// A view of `count` sequences of `seq_len` ids, row-major: sequence i is
// ids[i * seq_len, (i + 1) * seq_len). Does not own the ids (a
// TokenSequences or a memory-mapped token file holds them).
struct TokenSpan {
  int64_t seq_len = 0;
  int64_t count = 0;
  const int32_t* ids = nullptr;
};

// Sequences of one length, row-major: sequence i is tokens[i * seq_len,
// (i + 1) * seq_len).
struct TokenSequences {
  int64_t seq_len = 0;
  std::vector<int32_t> tokens;
  int64_t size() const {
    return seq_len > 0 ? static_cast<int64_t>(tokens.size()) / seq_len : 0;
  }
  TokenSpan span() const { return {seq_len, size(), tokens.data()}; }
};

// Packs `documents` (token ids) into sequences of `seq_len` (>= 2): the
// documents' tokens concatenated with [SEP] after each, cut into windows of
// seq_len - 1 tokens, each after a [CLS] (RoBERTa's FULL-SENTENCES packing,
// Liu et al. 2019: a window may cross documents; long documents span
// windows). The last sequence is padded with id 0. INVALID_ARGUMENT for
// seq_len < 2 or no tokens.
absl::StatusOr<TokenSequences> PackSequences(
    const std::vector<std::vector<int32_t>>& documents, int64_t seq_len);

// A token file: packed sequences written once by text:train_tokenizer
// (--tokens_output) and read by processes that must not load SentencePiece
// (third_party/BUILD). Little-endian: the 8 bytes "PSTOKEN1", uint32
// seq_len, uint32 vocab_size, uint64 sequence count, then count * seq_len
// int32 ids. ReadTokenFile reads one whole into memory; the worker
// memory-maps it (worker/token_dataset.h) and checks it with
// ParseTokenFile.
absl::Status WriteTokenFile(const std::string& path,
                            const TokenSequences& sequences, int vocab_size);
struct TokenFile {
  TokenSequences sequences;
  int vocab_size = 0;
};
// DATA_LOSS naming `path` for a file that is not a token file, is cut
// short, exceeds 4 GiB or holds an id outside [0, vocab_size); the file
// reader's errors otherwise (common/regular_file.h).
absl::StatusOr<TokenFile> ReadTokenFile(const std::string& path);

// A token file's `size` bytes at `bytes` (4-byte aligned: a mapping or a
// vector), checked as ReadTokenFile checks a file (every id scanned; the
// errors name `path`): its sequences as a view into those bytes, and its
// vocabulary in *vocab_size. Files over 4 GiB are refused as above only by
// ReadTokenFile; this takes any size.
absl::StatusOr<TokenSpan> ParseTokenFile(const std::string& path,
                                         const uint8_t* bytes, size_t size,
                                         int* vocab_size);

// `count` synthetic sequences of `seq_len` tokens: [CLS], then ids uniform
// in [kFirstPieceId, vocab_size) from a generator seeded by `seed`; no
// padding. The same arguments give the same sequences (the worker's
// "synthetic_tokens" dataset). seq_len >= 2, vocab_size > kFirstPieceId.
TokenSequences SyntheticSequences(int64_t count, int64_t seq_len,
                                  int vocab_size, uint64_t seed);

// One batch for a sequence model.
struct MlmBatch {
  Tensor ids;                   // [N, S], the corrupted token ids.
  Tensor padding_mask;          // [N, S], 1 where ids is padding.
  std::vector<int32_t> labels;  // N * S: the original id where predicted,
                                // kIgnoreLabel (-100) elsewhere.
};

struct MlmMaskingOptions {
  // Fraction of each sequence's candidate tokens (ordinary and unknown
  // ones: not padding, [CLS], [SEP] or [MASK]) to predict, rounded to the
  // nearest count, at least 1.
  double predict_fraction = 0.15;
  // Of the predicted tokens: the fraction replaced by [MASK], and the
  // fraction replaced by a token drawn uniformly from the ordinary ids; the
  // rest stay as they are. BERT's 80/10/10 (Devlin et al. 2019, 3.1).
  double mask_fraction = 0.8;
  double random_fraction = 0.1;
};

// BERT's masking (create_pretraining_data.py's create_masked_lm_predictions,
// without whole-word masking or a cap per sequence): for one sequence,
// choose round(predict_fraction * candidates) positions uniformly without
// replacement, label them with their id, then replace each as the options
// say. Random replacements are ordinary ids only (BERT draws from the
// whole vocabulary, specials included).
class MlmMasker {
 public:
  // `vocab_size` > kFirstPieceId (text/tokenizer.h); fractions in [0, 1]
  // with mask_fraction + random_fraction <= 1. INVALID_ARGUMENT otherwise.
  static absl::StatusOr<MlmMasker> Create(int vocab_size,
                                          const MlmMaskingOptions& options);

  // Masks `ids` (one sequence) in place and writes `labels` (as long).
  void Mask(absl::Span<int32_t> ids, absl::Span<int32_t> labels,
            std::mt19937_64& rng) const;
  int vocab_size() const { return vocab_size_; }

 private:
  MlmMasker(int vocab_size, const MlmMaskingOptions& options)
      : vocab_size_(vocab_size), options_(options) {}
  int vocab_size_;
  MlmMaskingOptions options_;
};

// Sequences `indices` of `sequences` as a batch, each masked with a
// generator seeded from (seed, epoch, index): dynamic masking (RoBERTa:
// every epoch masks anew), the same on any worker and in any batch order.
// Indices must be in [0, sequences.size()).
MlmBatch MakeMlmBatch(const TokenSpan& sequences,
                      absl::Span<const int64_t> indices,
                      const MlmMasker& masker, uint64_t seed, int64_t epoch);
inline MlmBatch MakeMlmBatch(const TokenSequences& sequences,
                             absl::Span<const int64_t> indices,
                             const MlmMasker& masker, uint64_t seed,
                             int64_t epoch) {
  return MakeMlmBatch(sequences.span(), indices, masker, seed, epoch);
}

// A synthetic batch for throughput (no corpus, no tokenizer): `n` sequences
// of `seq_len` tokens, [CLS] then ids uniform in [kFirstPieceId,
// masker.vocab_size()), no padding, masked as above; batch `step` of the
// stream `seed` (the same arguments give the same batch).
MlmBatch SyntheticMlmBatch(int64_t n, int64_t seq_len, const MlmMasker& masker,
                           uint64_t seed, int64_t step);

}  // namespace pstrain

#endif  // PSTRAIN_TEXT_MLM_DATA_H_
