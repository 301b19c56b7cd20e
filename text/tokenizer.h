// Tokenization for the masked-language models (issue 41): a SentencePiece
// unigram model (Kudo & Richardson 2018; Debian's libsentencepiece 0.1.97)
// with BERT's special tokens at fixed ids, trained on a corpus of documents
// (TrainTokenizer; the text:train_tokenizer tool) and loaded to turn text
// into token ids (Tokenizer).
//
// Special ids (text/special_ids.h), the same in every model this file
// trains: 0 padding, 1 unknown, 2 [CLS], 3 [SEP], 4 [MASK] (control
// symbols: text never encodes to them); ordinary pieces are ids 5 to
// vocab_size - 1.
//
// Thread-safety: TrainTokenizer may run on any thread (SentencePiece's
// trainer keeps no global state between calls but uses `threads` threads
// of its own). A loaded Tokenizer is immutable: Encode() may be called from
// any number of threads at once.
#ifndef PSTRAIN_TEXT_TOKENIZER_H_
#define PSTRAIN_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "text/special_ids.h"

namespace pstrain::spm {
class Processor;  // text/sentencepiece_shim.h
}  // namespace pstrain::spm

namespace pstrain {

struct TokenizerTrainOptions {
  // Pieces including the five special ones; at least 16. SentencePiece
  // refuses a size larger than the corpus supports (INVALID_ARGUMENT).
  int vocab_size = 8000;
  // Fraction of characters the pieces must cover (SentencePiece's
  // character_coverage; the rest map to unknown). 1.0 keeps every
  // character of an English corpus.
  double character_coverage = 1.0;
  // Documents longer than this many bytes are cut for training only
  // (SentencePiece's max_sentence_length).
  int max_document_bytes = 8192;
  // Trainer threads (the same documents and options, threads included,
  // give the same model).
  int threads = 2;
};

// Trains a unigram model on `documents` (UTF-8; each one "sentence" for
// SentencePiece, newlines inside are fine) and writes it to `model_path`
// (SentencePiece's binary model proto, as `spm_train` writes
// MODEL_PREFIX.model). Deterministic: the same documents and options give
// the same file. Errors: INVALID_ARGUMENT for no documents, a vocab_size
// < 16 or one the corpus cannot fill; SentencePiece's other errors with
// their code, each naming `model_path`.
absl::Status TrainTokenizer(const std::vector<std::string>& documents,
                            const TokenizerTrainOptions& options,
                            const std::string& model_path);

class Tokenizer {
 public:
  // Loads a model TrainTokenizer wrote. NOT_FOUND for a missing file,
  // INVALID_ARGUMENT for a FIFO, a device or a folder in its place (not
  // waited on), DATA_LOSS for one that is not a SentencePiece model or is
  // larger than 256 MiB, FAILED_PRECONDITION
  // for a model whose special ids are not the ones above (another trainer's
  // model), each naming `model_path`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(
      const std::string& model_path);
  ~Tokenizer();

  // The ids of `text`'s pieces (NFKC-normalised, as SentencePiece's
  // default), each in [kUnknownId, vocab_size()) and never a control id.
  std::vector<int32_t> Encode(const std::string& text) const;
  // The text of `ids` (control ids and padding decode to nothing).
  std::string Decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const { return vocab_size_; }

 private:
  explicit Tokenizer(std::unique_ptr<spm::Processor> processor);
  std::unique_ptr<spm::Processor> processor_;
  int vocab_size_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_TEXT_TOKENIZER_H_
