// train_tokenizer: trains the SentencePiece tokenizer of the masked-language
// models (text/tokenizer.h) on the fortune(6) corpus (text/corpus.h) and
// reports how it encodes that corpus.
//
//   train_tokenizer --output=/data/fortunes-8k.model --vocab_size=8000
//       --tokens_output=/data/fortunes-8k-128.tokens --seq_len=128
//   train_tokenizer --output=/data/fortunes/tokenizer.model
//       --tokens_dir=/data/fortunes     # train.tokens, test.tokens
//
// --tokens_dir writes the dataset the workers read ("tokens",
// worker/token_dataset.h): every --test_every-th document (by its order in
// the corpus) packed into test.tokens, the held-out split, the others into
// train.tokens. The tokenizer is trained on every document either way.
//
// Exit 0 when written, 2 with one line on a bad flag or a missing corpus,
// 1 when training or the write fails.
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
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
ABSL_FLAG(std::string, tokens_dir, "",
          "If set, a folder (created if missing) to write the corpus into "
          "as the \"tokens\" dataset: train.tokens, and test.tokens holding "
          "every --test_every-th document.");
ABSL_FLAG(int, test_every, 20,
          "--tokens_dir: document i is held out when i % test_every == "
          "test_every - 1 (>= 2).");
ABSL_FLAG(int, threads, 2, "Trainer threads.");

namespace {

// Writes `documents` (encoded) as --tokens_dir's train.tokens and
// test.tokens (test_every >= 2); one line naming what failed otherwise.
absl::Status WriteTokenDir(const std::string& dir,
                           const std::vector<std::vector<int32_t>>& documents,
                           int64_t seq_len, int test_every, int vocab_size) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot create the folder: ", error.message()));
  }
  std::vector<std::vector<int32_t>> train, test;
  for (size_t i = 0; i < documents.size(); ++i) {
    (i % test_every == static_cast<size_t>(test_every - 1) ? test : train)
        .push_back(documents[i]);
  }
  for (const auto& [name, split] :
       {std::pair<const char*, const std::vector<std::vector<int32_t>>*>{
            "train", &train},
        {"test", &test}}) {
    absl::StatusOr<pstrain::TokenSequences> sequences =
        pstrain::PackSequences(*split, seq_len);
    if (!sequences.ok()) return sequences.status();
    const std::string path = absl::StrCat(dir, "/", name, ".tokens");
    absl::Status status = pstrain::WriteTokenFile(path, *sequences, vocab_size);
    if (!status.ok()) return status;
    std::printf("  %s: %lld sequences of %lld\n", path.c_str(),
                static_cast<long long>(sequences->size()),
                static_cast<long long>(seq_len));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kProgram[] = "train_tokenizer";
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "train_tokenizer --help");
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) {
    pstrain::PrintError(kProgram, "--output is required");
    return 2;
  }
  if (absl::GetFlag(FLAGS_test_every) < 2) {
    pstrain::PrintError(
        kProgram, absl::StrCat("--test_every=", absl::GetFlag(FLAGS_test_every),
                               ": expected >= 2 (1 holds out all)"));
    return 2;
  }
  // Every flag and output place before the training (minutes on a large
  // corpus): they were checked only once it was done.
  pstrain::ExitOnFlagError(
      kProgram,
      pstrain::FirstError(
          {pstrain::CheckFlagRange(
               "vocab_size", absl::GetFlag(FLAGS_vocab_size), 16, 1 << 20),
           pstrain::CheckFlagRange("seq_len", absl::GetFlag(FLAGS_seq_len), 2,
                                   1 << 16),
           pstrain::CheckFlagRange("threads", absl::GetFlag(FLAGS_threads), 1,
                                   1024),
           pstrain::CheckOutputFile("output", output),
           pstrain::CheckOutputFile("tokens_output",
                                    absl::GetFlag(FLAGS_tokens_output)),
           pstrain::CheckOutputFolder("tokens_dir",
                                      absl::GetFlag(FLAGS_tokens_dir))}));
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
  const std::string tokens_dir = absl::GetFlag(FLAGS_tokens_dir);
  if (!tokens_dir.empty()) {
    status = WriteTokenDir(tokens_dir, encoded, absl::GetFlag(FLAGS_seq_len),
                           absl::GetFlag(FLAGS_test_every),
                           (*tokenizer)->vocab_size());
    if (!status.ok()) {
      pstrain::PrintError(kProgram, status.message());
      return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
  }
  return 0;
}
