// text/: the fortune corpus, the SentencePiece tokenizer trained on it,
// sequence packing, token files, BERT masking and the synthetic stream.
// Needs Debian's fortunes package (scripts/setup.sh installs it). No model
// here: this binary links SentencePiece, so it must not link protobuf
// (third_party/BUILD); text/bert_fortunes_test trains bert_tiny on the
// corpus through a token file.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/tensor.h"
#include "text/corpus.h"
#include "text/mlm_data.h"
#include "text/tokenizer.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(Corpus, SplitsEntriesOnPercentLines) {
  EXPECT_EQ(SplitFortunes("One.\n%\nTwo\nlines.  \n%\n\n%\n   \n%\nLast."),
            (std::vector<std::string>{"One.", "Two\nlines.", "Last."}));
  EXPECT_TRUE(SplitFortunes("%\n%\n").empty());
}

TEST(Corpus, ReadsDatabasesAndSkipsIndexesAndLinks) {
  const std::string dir = absl::StrCat(TempDir(), "/fortunes_test");
  ASSERT_EQ(system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()),
            0);
  EXPECT_EQ(ReadFortunes(dir).status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile(dir + "/b", "Bee.\n%\nBuzz.\n");
  WriteFile(dir + "/a", "Ant.\n");
  WriteFile(dir + "/a.dat", "binary index");
  ASSERT_EQ(symlink("a", (dir + "/a.u8").c_str()), 0);
  absl::StatusOr<std::vector<std::string>> docs = ReadFortunes(dir);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ(*docs, (std::vector<std::string>{"Ant.", "Bee.", "Buzz."}));
  EXPECT_EQ(ReadFortunes(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Packing, ClsFirstSepAfterEachDocumentPaddedAtTheEnd) {
  absl::StatusOr<TokenSequences> packed =
      PackSequences({{10, 11, 12}, {}, {20, 21}}, 4);
  ASSERT_TRUE(packed.ok()) << packed.status();
  // Stream 10 11 12 SEP 20 21 SEP in windows of 3 after [CLS].
  EXPECT_EQ(packed->tokens,
            (std::vector<int32_t>{kClsId, 10, 11, 12, kClsId, kSepId, 20, 21,
                                  kClsId, kSepId, kPadId, kPadId}));
  EXPECT_EQ(packed->size(), 3);
  EXPECT_EQ(PackSequences({{5}}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackSequences({{}}, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// 2,000 synthetic sequences of 128: 127 candidates each, so 19 predicted
// (round(0.15 * 127)); of the predicted, 80% [MASK], 10% another token,
// 10% unchanged, each within 5 standard deviations.
TEST(Masking, PredictsFifteenPercentSplitEightyTenTen) {
  absl::StatusOr<MlmMasker> masker = MlmMasker::Create(1000, {});
  ASSERT_TRUE(masker.ok()) << masker.status();
  const int64_t n = 2000, s = 128;
  MlmBatch batch = SyntheticMlmBatch(n, s, *masker, 7, 0);
  int64_t masked = 0, replaced = 0, kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    int predicted = 0;
    EXPECT_EQ(batch.ids.data[i * s], kClsId);
    EXPECT_EQ(batch.labels[i * s], kIgnoreLabel);
    for (int64_t t = 0; t < s; ++t) {
      const int32_t label = batch.labels[i * s + t];
      const int32_t id = static_cast<int32_t>(batch.ids.data[i * s + t]);
      EXPECT_EQ(batch.padding_mask.data[i * s + t], 0.0f);
      if (label == kIgnoreLabel) continue;
      ++predicted;
      EXPECT_GE(label, kFirstPieceId);
      EXPECT_LT(label, 1000);
      if (id == kMaskId) {
        ++masked;
      } else if (id == label) {
        ++kept;
      } else {
        EXPECT_GE(id, kFirstPieceId);
        ++replaced;
      }
    }
    EXPECT_EQ(predicted, 19) << "sequence " << i;
  }
  const double total = static_cast<double>(masked + replaced + kept);
  auto expect_fraction = [&](int64_t count, double p, const char* what) {
    const double sd = std::sqrt(p * (1 - p) / total);
    EXPECT_NEAR(count / total, p, 5 * sd) << what;
  };
  expect_fraction(masked, 0.8, "[MASK]");
  // A random replacement equals the original 1 time in 995.
  expect_fraction(replaced, 0.1 * 994 / 995, "random token");
  expect_fraction(kept, 0.1 + 0.1 / 995, "unchanged");
}

TEST(Masking, SeededPerSequenceAndEpoch) {
  absl::StatusOr<MlmMasker> masker = MlmMasker::Create(500, {});
  ASSERT_TRUE(masker.ok());
  EXPECT_EQ(SyntheticMlmBatch(4, 64, *masker, 3, 9).ids.data,
            SyntheticMlmBatch(4, 64, *masker, 3, 9).ids.data);
  EXPECT_NE(SyntheticMlmBatch(4, 64, *masker, 3, 9).ids.data,
            SyntheticMlmBatch(4, 64, *masker, 3, 10).ids.data);
  TokenSequences sequences;
  sequences.seq_len = 32;
  for (int i = 0; i < 4 * 32; ++i) sequences.tokens.push_back(5 + i % 400);
  const std::vector<int64_t> forward = {0, 1, 2, 3}, backward = {3, 2, 1, 0};
  const MlmBatch a = MakeMlmBatch(sequences, forward, *masker, 1, 0);
  const MlmBatch b = MakeMlmBatch(sequences, backward, *masker, 1, 0);
  const MlmBatch c = MakeMlmBatch(sequences, forward, *masker, 1, 1);
  // Sequence 2's mask does not depend on its place in the batch.
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(a.labels[2 * 32 + t], b.labels[1 * 32 + t]);
    EXPECT_EQ(a.ids.data[2 * 32 + t], b.ids.data[1 * 32 + t]);
  }
  EXPECT_NE(a.labels, c.labels);  // Another epoch masks anew.
  MlmMaskingOptions bad;
  bad.mask_fraction = 0.95;
  EXPECT_EQ(MlmMasker::Create(500, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MlmMasker::Create(5, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, TrainingIsDeterministicAndErrorsAreNamed) {
  absl::StatusOr<std::vector<std::string>> docs = ReadFortunes();
  ASSERT_TRUE(docs.ok()) << docs.status();
  docs->resize(600);
  TokenizerTrainOptions options;
  options.vocab_size = 300;
  const std::string a = TempDir() + "/a.model", b = TempDir() + "/b.model";
  ASSERT_TRUE(TrainTokenizer(*docs, options, a).ok());
  ASSERT_TRUE(TrainTokenizer(*docs, options, b).ok());
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(fa), {}),
            std::string(std::istreambuf_iterator<char>(fb), {}));
  EXPECT_EQ(TrainTokenizer({}, options, a).code(),
            absl::StatusCode::kInvalidArgument);
  options.vocab_size = 8;
  EXPECT_EQ(TrainTokenizer(*docs, options, a).message(),
            absl::StrCat(a, ": vocab_size 8; expected >= 16"));
  EXPECT_EQ(Tokenizer::Load(TempDir() + "/none.model").status().code(),
            absl::StatusCode::kNotFound);
  WriteFile(TempDir() + "/junk.model", "not a model");
  EXPECT_EQ(Tokenizer::Load(TempDir() + "/junk.model").status().code(),
            absl::StatusCode::kDataLoss);
  // A FIFO in the model's place is refused, not waited on.
  const std::string fifo = TempDir() + "/fifo.model";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(Tokenizer::Load(fifo).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenFile, RoundTripsAndRefusesDamage) {
  TokenSequences sequences;
  sequences.seq_len = 3;
  sequences.tokens = {kClsId, 7, 8, kClsId, kSepId, kPadId};
  const std::string path = TempDir() + "/t.tokens";
  ASSERT_TRUE(WriteTokenFile(path, sequences, 9).ok());
  absl::StatusOr<TokenFile> read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->vocab_size, 9);
  EXPECT_EQ(read->sequences.seq_len, 3);
  EXPECT_EQ(read->sequences.tokens, sequences.tokens);
  ASSERT_TRUE(WriteTokenFile(path, sequences, 8).ok());  // 8 is out of range.
  EXPECT_EQ(ReadTokenFile(path).status().message(),
            absl::StrCat(path,
                         ": not a pstrain token file: id 8 of sequence 0 "
                         "outside [0, 8)"));
  WriteFile(path, "PSTOKEN1 and then too little");
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kDataLoss);
  WriteFile(path, "");
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kDataLoss);
}

// The whole corpus with a 2,000-piece vocabulary.
TEST(FortunesCorpus, TokenizerRoundTripsEnglish) {
  absl::StatusOr<std::vector<std::string>> docs = ReadFortunes();
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_GT(docs->size(), 10000u);
  TokenizerTrainOptions options;
  options.vocab_size = 2000;
  const std::string path = TempDir() + "/fortunes.model";
  absl::Status trained = TrainTokenizer(*docs, options, path);
  ASSERT_TRUE(trained.ok()) << trained;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 2000);
  const std::string text = "A day for firm decisions!!!!! Or is it?";
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ((*tokenizer)->Decode(ids), text);
  int64_t tokens = 0, unknown = 0;
  for (size_t i = 0; i < docs->size(); i += 10) {
    for (int32_t id : (*tokenizer)->Encode((*docs)[i])) {
      EXPECT_TRUE(id >= kFirstPieceId || id == kUnknownId) << id;
      ++tokens;
      unknown += id == kUnknownId;
    }
  }
  EXPECT_EQ(unknown, 0) << "of " << tokens;  // character_coverage 1.0.
}

}  // namespace
}  // namespace pstrain
