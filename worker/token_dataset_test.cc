#include "worker/token_dataset.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "text/special_ids.h"
#include "worker/dataset.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A folder holding train.tokens of `count` sequences of `seq_len` (vocab
// 100, sequence i's tokens i + 5, ... mod 95 + 5) and, with `test`, a
// test.tokens of 3.
std::string MakeTokenDir(const std::string& name, int64_t count,
                         int64_t seq_len, bool test = true) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  auto sequences = [&](int64_t n) {
    TokenSequences s;
    s.seq_len = seq_len;
    for (int64_t i = 0; i < n; ++i) {
      s.tokens.push_back(kClsId);
      for (int64_t t = 1; t < seq_len; ++t) {
        s.tokens.push_back(static_cast<int32_t>(5 + (i + t) % 95));
      }
    }
    return s;
  };
  EXPECT_TRUE(
      WriteTokenFile(dir + "/train.tokens", sequences(count), 100).ok());
  if (test) {
    EXPECT_TRUE(WriteTokenFile(dir + "/test.tokens", sequences(3), 100).ok());
  }
  return dir;
}

void Corrupt(const std::string& path, size_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(TokenDatasetTest, LoadsBothSplitsMapped) {
  const std::string dir = MakeTokenDir("both", 40, 16);
  absl::StatusOr<Dataset> d = LoadDataset("tokens", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(d->tokens, nullptr);
  EXPECT_EQ(d->num_classes, 100);
  EXPECT_EQ(d->train.chw, Shape({16}));
  EXPECT_EQ(d->train.count, 40);
  EXPECT_EQ(d->test.count, 3);
  EXPECT_NE(d->tokens->train.file, nullptr);
  // The view reads the file's ids.
  EXPECT_EQ(d->tokens->train.sequences.ids[16 * 7 + 1], 5 + 8);
}

TEST(TokenDatasetTest, NoTestFileMeansNoHeldOutSplit) {
  const std::string dir = MakeTokenDir("train_only", 10, 8, /*test=*/false);
  absl::StatusOr<Dataset> d = LoadDataset("tokens", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->test.count, 0);
}

TEST(TokenDatasetTest, SeqLenMustMatchTheFile) {
  const std::string dir = MakeTokenDir("seq_len", 10, 8);
  DatasetOptions o;
  o.seq_len = 8;
  EXPECT_TRUE(LoadDataset("tokens", dir, o).ok());
  o.seq_len = 128;
  absl::Status s = LoadDataset("tokens", dir, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "seq_len 128, but " + dir +
                             "/train.tokens holds sequences of 8 tokens; "
                             "expected 0 or 8");
}

TEST(TokenDatasetTest, MissingAndCorruptFilesAreNamed) {
  absl::Status missing = LoadDataset("tokens", TempDir() + "/none").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("/none/train.tokens"), std::string::npos)
      << missing;

  const std::string bad_magic = MakeTokenDir("bad_magic", 10, 8);
  Corrupt(bad_magic + "/train.tokens", 0, "PSTOKENX");
  absl::Status s = LoadDataset("tokens", bad_magic).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), bad_magic +
                             "/train.tokens: not a pstrain token file: no "
                             "PSTOKEN1 header");

  const std::string short_file = MakeTokenDir("short", 10, 8);
  std::filesystem::resize_file(short_file + "/train.tokens",
                               24 + 10 * 8 * 4 - 4);
  s = LoadDataset("tokens", short_file).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("10 sequences of 8 in 340 bytes"),
            std::string::npos)
      << s;

  // A test file that does not match the training file's vocabulary.
  const std::string other = MakeTokenDir("other_test", 10, 8);
  TokenSequences one;
  one.seq_len = 8;
  one.tokens.assign(8, kClsId);
  ASSERT_TRUE(WriteTokenFile(other + "/test.tokens", one, 50).ok());
  s = LoadDataset("tokens", other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("test.tokens: vocabulary 50"), std::string::npos)
      << s;
}

TEST(TokenDatasetTest, OutOfRangeIdIsRefusedNamingItsSequence) {
  const std::string dir = MakeTokenDir("out_of_range", 10, 8);
  // Sequence 3, token 2: id 100 in a vocabulary of 100.
  const int32_t id = 100;
  Corrupt(dir + "/train.tokens", 24 + (3 * 8 + 2) * 4,
          std::string(reinterpret_cast<const char*>(&id), 4));
  absl::Status s = LoadDataset("tokens", dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), dir +
                             "/train.tokens: not a pstrain token file: id 100 "
                             "of sequence 3 outside [0, 100)");
  const int32_t negative = -1;
  Corrupt(dir + "/train.tokens", 24 + (3 * 8 + 2) * 4,
          std::string(reinterpret_cast<const char*>(&negative), 4));
  EXPECT_EQ(LoadDataset("tokens", dir).status().code(),
            absl::StatusCode::kDataLoss);
}

// Worker w of W takes positions w, w + W, ... of the epoch's permutation:
// the workers' shares are disjoint, and together the batches of W workers
// of batch b are the batch of one worker of batch W * b, masked alike.
TEST(TokenDatasetTest, ShardsSequencesAcrossWorkersWithTheSameMasks) {
  const std::string dir = MakeTokenDir("shards", 48, 16);
  absl::StatusOr<Dataset> d = LoadDataset("tokens", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<MlmMasker> masker = MlmMasker::Create(100, {});
  ASSERT_TRUE(masker.ok());
  const int64_t s = 16;
  for (int workers : {2, 3}) {
    std::set<SampleIndex> seen;
    // Batch 1 of one worker of batch 4 * workers, row by row.
    ShardedSampler one(48, 0, 1, /*seed=*/7);
    const MlmBatch whole = TokenBatch(d->tokens->train, one.EpochIndices(2),
                                      4 * workers, 4 * workers, *masker, 7, 2);
    const SampleOrder all = one.EpochIndices(2);
    for (int w = 0; w < workers; ++w) {
      ShardedSampler sampler(48, w, workers, /*seed=*/7);
      const SampleOrder order = sampler.EpochIndices(2);
      EXPECT_EQ(order.size(), 48 / workers);
      for (int64_t k = 0; k < order.size(); ++k) {
        EXPECT_TRUE(seen.insert(order[k]).second) << order[k];
      }
      const MlmBatch part =
          TokenBatch(d->tokens->train, order, 4, 4, *masker, 7, 2);
      for (int64_t r = 0; r < 4; ++r) {
        // Row r of worker w is position 4W + r*W + w of the permutation.
        const int64_t row = r * workers + w;
        ASSERT_EQ(order[4 + r], all[4 * workers + row]);
        for (int64_t t = 0; t < s; ++t) {
          EXPECT_EQ(part.ids.data[r * s + t], whole.ids.data[row * s + t]);
          EXPECT_EQ(part.labels[r * s + t], whole.labels[row * s + t]);
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(48 / workers * workers));
  }
}

TEST(TokenDatasetTest, SyntheticTokensRepeatAPool) {
  DatasetOptions o;
  o.num_classes = 30522;
  o.train_samples = kSyntheticTokenPool + 10;
  o.test_samples = 4;
  absl::StatusOr<Dataset> d = LoadDataset("synthetic_tokens", "", o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.chw, Shape({kDefaultSeqLen}));
  EXPECT_EQ(d->num_classes, 30522);
  EXPECT_EQ(d->train.count, kSyntheticTokenPool + 10);
  EXPECT_EQ(d->tokens->train.sequences.count, kSyntheticTokenPool);
  EXPECT_EQ(d->test.count, 4);
  absl::StatusOr<MlmMasker> masker = MlmMasker::Create(30522, {});
  ASSERT_TRUE(masker.ok());
  const std::vector<SampleIndex> order = {3, kSyntheticTokenPool + 3};
  const MlmBatch b = TokenBatch(d->tokens->train, order, 0, 2, *masker, 1, 0);
  for (int64_t t = 0; t < kDefaultSeqLen; ++t) {
    EXPECT_EQ(b.ids.data[t], b.ids.data[kDefaultSeqLen + t]);
  }
  o.num_classes = 5;
  EXPECT_EQ(LoadDataset("synthetic_tokens", "", o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.num_classes = 100;
  o.seq_len = 513;
  EXPECT_EQ(LoadDataset("synthetic_tokens", "", o).status().message(),
            "seq_len 513; expected 2 to 512 (the models' position table)");
}

}  // namespace
}  // namespace pstrain
