#include "worker/dataset.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::vector<unsigned char> IdxBytes(unsigned char type_dims,
                                    const std::vector<uint32_t>& dims,
                                    const std::vector<unsigned char>& data) {
  std::vector<unsigned char> out = {0, 0, 0x08, type_dims};
  for (uint32_t d : dims) {
    out.push_back(d >> 24);
    out.push_back((d >> 16) & 0xff);
    out.push_back((d >> 8) & 0xff);
    out.push_back(d & 0xff);
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void WritePlain(const std::string& path, const std::vector<unsigned char>& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

void WriteGzip(const std::string& path, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}

TEST(IdxTest, ReadsPlainAndGzip) {
  const std::vector<unsigned char> bytes =
      IdxBytes(3, {2, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255});
  const std::string plain = TempDir() + "/a-idx3-ubyte";
  const std::string gz = TempDir() + "/a-idx3-ubyte.gz";
  WritePlain(plain, bytes);
  WriteGzip(gz, bytes);
  for (const std::string& path : {plain, gz}) {
    absl::StatusOr<IdxArray> a = ReadIdx(path);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 2, 3}));
    EXPECT_EQ(a->data.back(), 255);
  }
}

TEST(IdxTest, RejectsMissingBadMagicTruncatedAndTrailing) {
  const std::string dir = TempDir();
  EXPECT_EQ(ReadIdx(dir + "/missing").status().message(),
            dir +
                "/missing: no such file (expected an IDX file, gzipped or "
                "plain)");
  std::vector<unsigned char> bytes = IdxBytes(1, {3}, {1, 2, 3});
  bytes[2] = 0x09;
  WritePlain(dir + "/magic", bytes);
  EXPECT_EQ(ReadIdx(dir + "/magic").status().message(),
            dir +
                "/magic: bad magic number 0x00000901; expected 0x00000801 "
                "(labels) or 0x00000803 (images)");
  WriteGzip(dir + "/short.gz", IdxBytes(1, {5}, {1, 2, 3}));
  absl::Status status = ReadIdx(dir + "/short.gz").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), dir +
                                  "/short.gz: truncated or corrupt; expected "
                                  "5 bytes of data after the header");
  WritePlain(dir + "/long", IdxBytes(1, {2}, {1, 2, 3}));
  EXPECT_EQ(
      ReadIdx(dir + "/long").status().message(),
      dir + "/long: trailing bytes after the 2 bytes the header declares");
  // A gzip file cut in the middle of its stream.
  std::vector<unsigned char> big(5000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = (i * 7919) % 251;
  WriteGzip(dir + "/cut.gz", IdxBytes(1, {5000}, big));
  FILE* f = std::fopen((dir + "/cut.gz").c_str(), "rb");
  std::vector<unsigned char> gz(100000);
  gz.resize(std::fread(gz.data(), 1, gz.size(), f));
  std::fclose(f);
  gz.resize(gz.size() / 2);
  WritePlain(dir + "/cut.gz", gz);
  EXPECT_EQ(ReadIdx(dir + "/cut.gz").status().code(),
            absl::StatusCode::kDataLoss);
}

// A FIFO where an IDX or CIFAR-10 file should be is refused at once (gzopen
// waited for a writer forever); a symbolic link to a file is followed.
TEST(IdxTest, AFifoIsRefusedWithoutBlockingAndALinkIsFollowed) {
  const std::string dir = TempDir() + "/idx_fifo";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  ASSERT_EQ(mkfifo((dir + "/fifo.gz").c_str(), 0600), 0);
  for (const absl::Status& status :
       {ReadIdx(dir + "/fifo.gz").status(),
        ReadCifarBatch(dir + "/fifo.gz").status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("a FIFO"), std::string::npos) << status;
  }
  WritePlain(dir + "/labels", IdxBytes(1, {2}, {4, 7}));
  ASSERT_EQ(symlink("labels", (dir + "/link").c_str()), 0);
  absl::StatusOr<IdxArray> linked = ReadIdx(dir + "/link");
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->data, (std::vector<uint8_t>{4, 7}));
}

// catalog/catalog.h's list is LoadDataset's: every name in it has a reader
// (which fails here for want of files, not for the name).
TEST(DatasetTest, ReadsEveryCatalogDataset) {
  DatasetOptions o;
  o.image_size = 8;
  o.num_classes = 10;  // Also a vocabulary (synthetic_tokens: > 5).
  o.train_samples = 30;
  o.test_samples = 10;
  for (absl::string_view name : DatasetNames()) {
    absl::Status s =
        LoadDataset(std::string(name), "/nowhere/pstrain", o).status();
    EXPECT_NE(s.code(), absl::StatusCode::kInternal) << name << ": " << s;
    EXPECT_NE(s.code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << s;
  }
}

TEST(DatasetTest, UnknownDatasetAndMismatchedCounts) {
  EXPECT_EQ(LoadDataset("imagenet", "/nowhere").status().message(),
            "unknown dataset \"imagenet\"; expected one of: cifar10, "
            "fashion_mnist, image_folder, mnist, records, synthetic, "
            "synthetic_tokens, tokens");
  const std::string dir = TempDir() + "/ds";
  std::system(("mkdir -p " + dir).c_str());
  WritePlain(dir + "/train-images-idx3-ubyte",
             IdxBytes(3, {3, 2, 2}, std::vector<unsigned char>(12, 9)));
  WritePlain(dir + "/train-labels-idx1-ubyte", IdxBytes(1, {2}, {1, 2}));
  EXPECT_EQ(LoadDataset("mnist", dir).status().message(),
            dir + "/train-images-idx3-ubyte holds 3 images but " + dir +
                "/train-labels-idx1-ubyte holds 2 labels; expected the same "
                "count");
}

TEST(ShardedSamplerTest, WorkersSplitEachGlobalBatchDisjointly) {
  const int64_t n = 1000;
  const ShardedSampler one(n, 0, 1, 5);
  const ShardedSampler w0(n, 0, 2, 5), w1(n, 1, 2, 5);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto all = one.EpochIndices(epoch).ToVector();
    const auto a = w0.EpochIndices(epoch).ToVector();
    const auto b = w1.EpochIndices(epoch).ToVector();
    ASSERT_EQ(a.size(), 500u);
    ASSERT_EQ(b.size(), 500u);
    // Batch i of batch 32 on each of 2 workers == batch i of 64 on one.
    for (int i = 0; i < 15; ++i) {
      std::multiset<int64_t> two(a.begin() + 32 * i, a.begin() + 32 * (i + 1));
      two.insert(b.begin() + 32 * i, b.begin() + 32 * (i + 1));
      std::multiset<int64_t> single(all.begin() + 64 * i,
                                    all.begin() + 64 * (i + 1));
      EXPECT_EQ(two, single) << "epoch " << epoch << " batch " << i;
    }
    std::set<int64_t> seen(a.begin(), a.end());
    seen.insert(b.begin(), b.end());
    EXPECT_EQ(seen.size(), 1000u);
  }
  EXPECT_NE(one.EpochIndices(0).ToVector(), one.EpochIndices(1).ToVector());
}

// The per-position shuffle is a permutation of [0, n) for sizes around the
// powers of 4 its Feistel domain jumps at, depends on the seed, and spreads
// any run of positions over the whole range (no block stays together).
TEST(IndexPermutationTest, IsAPermutationThatDependsOnTheSeedAndSpreads) {
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 15ull, 16ull, 17ull, 1000ull,
                     4095ull, 4096ull, 4097ull, 65537ull}) {
    const IndexPermutation p(n, 11);
    std::vector<bool> hit(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = p(i);
      ASSERT_LT(x, n) << "n " << n << " i " << i;
      ASSERT_FALSE(hit[x]) << "n " << n << ": " << x << " twice";
      hit[x] = true;
    }
  }
  const uint64_t n = 100000;
  const IndexPermutation a(n, 1), b(n, 1), c(n, 2);
  int same_as_c = 0, fixed = 0;
  uint64_t lowest = n, highest = 0;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a(i), b(i));
    same_as_c += a(i) == c(i);
    fixed += a(i) == i;
    if (i < 1000) {
      lowest = std::min(lowest, a(i));
      highest = std::max(highest, a(i));
    }
  }
  EXPECT_LT(same_as_c, 20);  // about 1 expected
  EXPECT_LT(fixed, 20);
  EXPECT_LT(lowest, n / 20);
  EXPECT_GT(highest, n - n / 20);
}

// Two CIFAR-10 records: label, then 1024 red, 1024 green, 1024 blue bytes.
std::vector<unsigned char> CifarRecords(const std::vector<int>& labels) {
  std::vector<unsigned char> bytes;
  for (size_t r = 0; r < labels.size(); ++r) {
    bytes.push_back(static_cast<unsigned char>(labels[r]));
    for (int j = 0; j < 3072; ++j) {
      bytes.push_back(static_cast<unsigned char>((j * 7 + r * 13) % 256));
    }
  }
  return bytes;
}

TEST(CifarTest, ReadsRecordsAndRejectsBadSizesAndLabels) {
  const std::string dir = TempDir() + "/cifar";
  std::system(("mkdir -p " + dir).c_str());
  WritePlain(dir + "/ok.bin", CifarRecords({3, 9}));
  absl::StatusOr<LabeledImages> ok = ReadCifarBatch(dir + "/ok.bin");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->count, 2);
  EXPECT_EQ(ok->chw, (Shape{3, 32, 32}));
  EXPECT_EQ(ok->labels, (std::vector<int32_t>{3, 9}));
  // Record 1, green plane (offset 1024), pixel 5: byte (1029 * 7 + 13) % 256.
  EXPECT_FLOAT_EQ(ok->images[3072 + 1024 + 5],
                  ((1029 * 7 + 13) % 256) / 255.0f);

  std::vector<unsigned char> cut = CifarRecords({1});
  cut.pop_back();
  WritePlain(dir + "/cut.bin", cut);
  EXPECT_EQ(ReadCifarBatch(dir + "/cut.bin").status().message(),
            dir +
                "/cut.bin: 3072 bytes; expected a positive multiple of 3073 "
                "(CIFAR-10 records of 1 label byte and 3072 pixels)");
  WritePlain(dir + "/label.bin", CifarRecords({4, 10}));
  EXPECT_EQ(ReadCifarBatch(dir + "/label.bin").status().message(),
            dir + "/label.bin: record 1 has label 10; expected 0..9");
  EXPECT_EQ(ReadCifarBatch(dir + "/none.bin").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CifarTest, LoadsFiveTrainingBatchesAndTheTestBatchStandardised) {
  const std::string dir = TempDir() + "/cifar10";
  std::system(("mkdir -p " + dir).c_str());
  for (int b = 1; b <= 5; ++b) {
    WritePlain(dir + "/data_batch_" + std::to_string(b) + ".bin",
               CifarRecords({b, b + 1}));
  }
  WritePlain(dir + "/test_batch.bin", CifarRecords({0}));
  absl::StatusOr<Dataset> d = LoadDataset("cifar10", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 10);
  EXPECT_EQ(d->test.count, 1);
  EXPECT_TRUE(d->augment);
  ASSERT_EQ(d->channel_mean.size(), 3u);
  // Each training channel now has mean 0 and variance 1.
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < d->train.count; ++i) {
      for (int j = 0; j < 1024; ++j) {
        const float v = d->train.images[(i * 3 + c) * 1024 + j];
        sum += v;
        sum_sq += double{v} * v;
      }
    }
    const double n = 10 * 1024;
    EXPECT_NEAR(sum / n, 0.0, 1e-4) << "channel " << c;
    EXPECT_NEAR(sum_sq / n, 1.0, 1e-3) << "channel " << c;
  }
}

TEST(SyntheticTest, SizesLabelsAndBadOptions) {
  DatasetOptions o;
  o.image_size = 8;
  o.num_classes = 5;
  o.train_samples = 300;
  o.test_samples = 20;
  absl::StatusOr<Dataset> d = LoadDataset("synthetic", "", o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.chw, (Shape{3, 8, 8}));
  EXPECT_EQ(d->train.count, 300);
  EXPECT_EQ(d->train.stored, 64);
  for (int32_t y : d->train.labels) {
    EXPECT_GE(y, 0);
    EXPECT_LT(y, 5);
  }
  o.num_classes = 1;
  EXPECT_EQ(LoadDataset("synthetic", "", o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AugmentTest, FlipAndCropKeepPixelsFromTheSourceOrZeroPadding) {
  LabeledImages src;
  src.chw = {1, 4, 4};
  src.count = src.stored = 1;
  src.labels = {2};
  for (int i = 0; i < 16; ++i) src.images.push_back(1.0f + i);
  std::mt19937_64 rng(5);
  Tensor images;
  std::vector<int32_t> labels;
  bool saw_shift = false;
  for (int trial = 0; trial < 50; ++trial) {
    GatherBatch(src, std::vector<SampleIndex>{0}, 0, 1, &images, &labels, &rng);
    EXPECT_EQ(labels[0], 2);
    int nonzero = 0;
    for (float v : images.data) {
      if (v == 0.0f) continue;
      ++nonzero;
      EXPECT_TRUE(v >= 1.0f && v <= 16.0f && v == std::floor(v)) << v;
    }
    // A shift of (dy, dx) keeps (4-|dy|) x (4-|dx|) pixels, at least 0.
    if (nonzero < 16) saw_shift = true;
  }
  EXPECT_TRUE(saw_shift);
}

TEST(PrefetcherTest, YieldsTheSameBatchesInOrderAsGatherBatch) {
  LabeledImages src;
  src.chw = {1, 2, 2};
  src.count = src.stored = 20;
  for (int i = 0; i < 20; ++i) {
    src.labels.push_back(i % 10);
    for (int j = 0; j < 4; ++j) src.images.push_back(i * 10.0f + j);
  }
  std::vector<SampleIndex> order;
  for (int i = 19; i >= 0; --i) order.push_back(i);
  BatchPrefetcher prefetcher(src, order, 3, 6, false, 1);
  BatchPrefetcher::Batch batch;
  for (int b = 0; b < 6; ++b) {
    ASSERT_TRUE(prefetcher.Next(&batch));
    Tensor expected;
    std::vector<int32_t> labels;
    GatherBatch(src, order, b * 3, 3, &expected, &labels);
    EXPECT_EQ(batch.images.data, expected.data) << "batch " << b;
    EXPECT_EQ(batch.labels, labels);
  }
  EXPECT_FALSE(prefetcher.Next(&batch));
}

}  // namespace
}  // namespace pstrain
