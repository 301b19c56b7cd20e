#include "text/tokenizer.h"

#include <fstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "text/sentencepiece_shim.h"

namespace pstrain {
namespace {

// SentencePiece's status as ours (the one place its codes are converted),
// its message prefixed with `context`. Its codes are absl's numbering.
absl::Status FromSentencePiece(const spm::Result& result,
                               const std::string& context) {
  if (result.code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(result.code),
                      absl::StrCat(context, ": ", result.message));
}

}  // namespace

absl::Status TrainTokenizer(const std::vector<std::string>& documents,
                            const TokenizerTrainOptions& options,
                            const std::string& model_path) {
  if (documents.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": no documents to train a tokenizer on"));
  }
  if (options.vocab_size < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": vocab_size ", options.vocab_size, "; expected >= 16"));
  }
  // No sampling or shuffling of the input (SentencePiece's only random
  // choices), so the model depends on the documents and options alone.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "unigram"},
      {"vocab_size", absl::StrCat(options.vocab_size)},
      {"character_coverage", absl::StrCat(options.character_coverage)},
      {"max_sentence_length", absl::StrCat(options.max_document_bytes)},
      {"num_threads", absl::StrCat(options.threads)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"pad_id", absl::StrCat(kPadId)},
      {"unk_id", absl::StrCat(kUnknownId)},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"control_symbols", "[CLS],[SEP],[MASK]"},
      {"minloglevel", "1"},  // Warnings and errors only.
  };
  std::string model;
  absl::Status status =
      FromSentencePiece(spm::Train(args, documents, &model), model_path);
  if (!status.ok()) return status;
  std::ofstream file(model_path, std::ios::binary | std::ios::trunc);
  file.write(model.data(), static_cast<std::streamsize>(model.size()));
  file.close();
  if (!file) {
    return absl::UnavailableError(
        absl::StrCat(model_path, ": cannot write the tokenizer model"));
  }
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::unique_ptr<spm::Processor> processor)
    : processor_(std::move(processor)), vocab_size_(processor_->PieceSize()) {}

Tokenizer::~Tokenizer() = default;

// The largest tokenizer model read, in bytes (a 32k-piece model is ~0.8
// MB; SentencePiece models of 250k pieces are ~5 MB).
constexpr uint64_t kMaxModelBytes = uint64_t{256} << 20;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& model_path) {
  // Never blocks (a FIFO in the file's place is refused); a model is a few
  // MB, so at most kMaxModelBytes is read.
  absl::StatusOr<std::string> bytes =
      ReadSmallFile(model_path, kMaxModelBytes, /*follow_symlinks=*/true);
  if (!bytes.ok()) {
    return absl::Status(
        bytes.status().code(),
        absl::StrCat(bytes.status().message(), " (the tokenizer model)"));
  }
  spm::Result loaded;
  std::unique_ptr<spm::Processor> processor =
      spm::Processor::Load(*bytes, &loaded);
  if (processor == nullptr) {
    return absl::DataLossError(absl::StrCat(
        model_path, ": not a SentencePiece model: ", loaded.message));
  }
  const bool specials = processor->PieceSize() > kFirstPieceId &&
                        processor->PadId() == kPadId &&
                        processor->UnkId() == kUnknownId &&
                        processor->PieceToId("[CLS]") == kClsId &&
                        processor->PieceToId("[SEP]") == kSepId &&
                        processor->PieceToId("[MASK]") == kMaskId;
  if (!specials) {
    return absl::FailedPreconditionError(absl::StrCat(
        model_path,
        ": special ids are not pad 0, unk 1, [CLS] 2, [SEP] 3, [MASK] 4 "
        "(train it with text:train_tokenizer)"));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(processor)));
}

std::vector<int32_t> Tokenizer::Encode(const std::string& text) const {
  const std::vector<int> ids = processor_->Encode(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  return processor_->Decode(std::vector<int>(ids.begin(), ids.end()));
}

}  // namespace pstrain
