#include "worker/dataset.h"

#include <zlib.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

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

TEST(DatasetTest, UnknownDatasetAndMismatchedCounts) {
  EXPECT_EQ(LoadDataset("imagenet", "/nowhere").status().message(),
            "unknown dataset \"imagenet\"; expected one of: fashion_mnist, "
            "mnist");
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
    const auto all = one.EpochIndices(epoch);
    const auto a = w0.EpochIndices(epoch), b = w1.EpochIndices(epoch);
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
  EXPECT_NE(one.EpochIndices(0), one.EpochIndices(1));
}

}  // namespace
}  // namespace pstrain
