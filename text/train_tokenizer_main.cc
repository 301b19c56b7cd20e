// train_tokenizer: trains the SentencePiece tokenizer of the masked-language
// models (text/tokenizer.h) on the fortune(6) corpus (text/corpus.h) and
// reports how it encodes that corpus.
//
//   train_tokenizer --output=/data/fortunes-8k.model --vocab_size=8000
//       --tokens_output=/data/fortunes-8k-128.tokens --seq_len=128
//
// Exit 0 when written, 2 with one line on a bad flag or a missing corpus,
// 1 when training or the write fails.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "text/corpus.h"
#include "text/mlm_data.h"
#include "text/tokenizer.h"

ABSL_FLAG(std::string, corpus_dir, pstrain::kFortunesDir,
          "Folder of fortune databases (Debian's fortunes package).");
ABSL_FLAG(std::string, output, "", "Path of the tokenizer model to write.");
ABSL_FLAG(int, vocab_size, 8000,
          "Pieces, the five special ids included (>= 16).");
ABSL_FLAG(int, seq_len, 128,
          "Tokens per sequence (with [CLS]) of --tokens_output and the "
          "report.");
ABSL_FLAG(std::string, tokens_output, "",
          "If set, the whole corpus encoded and packed into sequences of "
          "--seq_len, written as a token file (text/mlm_data.h).");
ABSL_FLAG(int, threads, 2, "Trainer threads.");

int main(int argc, char** argv) {
  constexpr char kProgram[] = "train_tokenizer";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "train_tokenizer --help");
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) {
    pstrain::PrintError(kProgram, "--output is required");
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> documents =
      pstrain::ReadFortunes(absl::GetFlag(FLAGS_corpus_dir));
  if (!documents.ok()) {
    pstrain::PrintError(kProgram, documents.status().message());
    return 2;
  }
  pstrain::TokenizerTrainOptions options;
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.threads = absl::GetFlag(FLAGS_threads);
  const absl::Time start = absl::Now();
  absl::Status status = pstrain::TrainTokenizer(*documents, options, output);
  if (!status.ok()) {
    pstrain::PrintError(kProgram, status.message());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const double train_s = absl::ToDoubleSeconds(absl::Now() - start);
  absl::StatusOr<std::unique_ptr<pstrain::Tokenizer>> tokenizer =
      pstrain::Tokenizer::Load(output);
  if (!tokenizer.ok()) {
    pstrain::PrintError(kProgram, tokenizer.status().message());
    return 1;
  }
  std::vector<std::vector<int32_t>> encoded;
  int64_t tokens = 0, unknown = 0, bytes = 0;
  for (const std::string& doc : *documents) {
    encoded.push_back((*tokenizer)->Encode(doc));
    tokens += static_cast<int64_t>(encoded.back().size());
    bytes += static_cast<int64_t>(doc.size());
    for (int32_t id : encoded.back()) unknown += id == pstrain::kUnknownId;
  }
  absl::StatusOr<pstrain::TokenSequences> sequences =
      pstrain::PackSequences(encoded, absl::GetFlag(FLAGS_seq_len));
  if (!sequences.ok()) {
    pstrain::PrintError(kProgram, sequences.status().message());
    return 2;
  }
  const std::string tokens_output = absl::GetFlag(FLAGS_tokens_output);
  if (!tokens_output.empty()) {
    status = pstrain::WriteTokenFile(tokens_output, *sequences,
                                     (*tokenizer)->vocab_size());
    if (!status.ok()) {
      pstrain::PrintError(kProgram, status.message());
      return 1;
    }
  }
  std::printf(
      "train_tokenizer: wrote %s (vocab %d) in %.1f s from %zu documents, "
      "%lld bytes\n"
      "  %lld tokens (%.2f bytes/token, %lld unknown), %lld sequences of "
      "%d\n",
      output.c_str(), (*tokenizer)->vocab_size(), train_s, documents->size(),
      static_cast<long long>(bytes), static_cast<long long>(tokens),
      tokens > 0 ? static_cast<double>(bytes) / tokens : 0.0,
      static_cast<long long>(unknown),
      static_cast<long long>(sequences->size()), absl::GetFlag(FLAGS_seq_len));
  if (!tokens_output.empty()) {
    std::printf("  token file %s\n", tokens_output.c_str());
  }
  return 0;
}
