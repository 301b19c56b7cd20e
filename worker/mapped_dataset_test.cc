// The memory-mapped readers against the loaded ones on the same data (plain
// IDX against gzipped and loaded IDX; packed records against CIFAR-10's
// binary batches, which scale bytes the same way, b / 255): the same
// statistics, and the same batches, bit for bit, for a sampler seed, with
// and without augmentation.
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/dataset.h"
#include "worker/record_file.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string MakeDir(const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& b,
                bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
    gzclose(f);
    return;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

std::vector<uint8_t> Idx(const std::vector<uint32_t>& dims,
                         const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) out.push_back((d >> s) & 0xff);
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

struct RawSplit {
  std::vector<uint8_t> pixels;  // count * per
  std::vector<uint8_t> labels;
};

RawSplit RandomSplit(int count, int per, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  RawSplit s;
  s.pixels.resize(static_cast<size_t>(count) * per);
  for (uint8_t& p : s.pixels) p = static_cast<uint8_t>(rng() % 256);
  for (int i = 0; i < count; ++i) s.labels.push_back(rng() % classes);
  return s;
}

void WriteRecords(const std::string& path, const RawSplit& split, int c, int h,
                  int w, int classes) {
  absl::StatusOr<std::unique_ptr<RecordWriter>> writer =
      RecordWriter::Open(path, c, h, w, classes);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const size_t per = static_cast<size_t>(c) * h * w;
  for (size_t i = 0; i < split.labels.size(); ++i) {
    ASSERT_TRUE(
        (*writer)->Append(split.labels[i], &split.pixels[i * per]).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

// Every batch of two epochs of two workers (augmented and not), and the
// whole test split, are the same in `a` and `b`.
void ExpectSameBatches(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.train.count, b.train.count);
  ASSERT_EQ(a.test.count, b.test.count);
  ASSERT_EQ(a.train.chw, b.train.chw);
  ASSERT_EQ(a.num_classes, b.num_classes);
  ASSERT_EQ(a.channel_mean, b.channel_mean);  // Bit for bit.
  ASSERT_EQ(a.channel_stddev, b.channel_stddev);
  for (int worker = 0; worker < 2; ++worker) {
    const ShardedSampler sampler(a.train.count, worker, 2, 17);
    for (int epoch = 0; epoch < 2; ++epoch) {
      const std::vector<SampleIndex> order =
          sampler.EpochIndices(epoch).ToVector();
      for (bool augment : {false, true}) {
        std::mt19937_64 rng_a(epoch * 10 + worker), rng_b(epoch * 10 + worker);
        for (size_t begin = 0; begin + 8 <= order.size(); begin += 8) {
          Tensor ia, ib;
          std::vector<int32_t> la, lb;
          GatherBatch(a.train, order, begin, 8, &ia, &la,
                      augment ? &rng_a : nullptr);
          GatherBatch(b.train, order, begin, 8, &ib, &lb,
                      augment ? &rng_b : nullptr);
          ASSERT_EQ(la, lb) << "batch at " << begin;
          ASSERT_EQ(ia.shape, ib.shape);
          ASSERT_EQ(0, std::memcmp(ia.data.data(), ib.data.data(),
                                   ia.data.size() * sizeof(float)))
              << "worker " << worker << " epoch " << epoch << " augment "
              << augment << " batch at " << begin;
        }
      }
    }
  }
  std::vector<SampleIndex> all(a.test.count);
  for (int64_t i = 0; i < a.test.count; ++i) all[i] = i;
  Tensor ta, tb;
  std::vector<int32_t> la, lb;
  GatherBatch(a.test, all, 0, all.size(), &ta, &la);
  GatherBatch(b.test, all, 0, all.size(), &tb, &lb);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(0, std::memcmp(ta.data.data(), tb.data.data(),
                           ta.data.size() * sizeof(float)));
}

TEST(MappedDatasetTest, MappedIdxGivesTheLoadedBatches) {
  const RawSplit train = RandomSplit(203, 7 * 6, 10, 1);
  const RawSplit test = RandomSplit(31, 7 * 6, 10, 2);
  const std::string plain = MakeDir("idx_plain");
  const std::string gz = MakeDir("idx_gz");
  for (bool gzip : {false, true}) {
    const std::string dir = gzip ? gz : plain;
    const std::string ext = gzip ? ".gz" : "";
    WriteBytes(dir + "/train-images-idx3-ubyte" + ext,
               Idx({203, 7, 6}, train.pixels), gzip);
    WriteBytes(dir + "/train-labels-idx1-ubyte" + ext, Idx({203}, train.labels),
               gzip);
    WriteBytes(dir + "/t10k-images-idx3-ubyte" + ext,
               Idx({31, 7, 6}, test.pixels), gzip);
    WriteBytes(dir + "/t10k-labels-idx1-ubyte" + ext, Idx({31}, test.labels),
               gzip);
  }

  DatasetOptions in_memory;
  in_memory.map_files = false;
  absl::StatusOr<Dataset> loaded_gz = LoadDataset("mnist", gz, in_memory);
  absl::StatusOr<Dataset> loaded_plain = LoadDataset("mnist", plain, in_memory);
  absl::StatusOr<Dataset> mapped = LoadDataset("mnist", plain);
  // Gzipped files are decompressed once into bytes read as a mapping's.
  absl::StatusOr<Dataset> inflated = LoadDataset("mnist", gz);
  ASSERT_TRUE(loaded_gz.ok()) << loaded_gz.status();
  ASSERT_TRUE(loaded_plain.ok()) << loaded_plain.status();
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE(inflated.ok()) << inflated.status();
  EXPECT_EQ(loaded_gz->train.mapped, nullptr);
  EXPECT_EQ(loaded_plain->train.mapped, nullptr);
  EXPECT_NE(mapped->train.mapped, nullptr);
  EXPECT_TRUE(mapped->train.images.empty());
  ASSERT_NE(inflated->train.mapped, nullptr);
  EXPECT_EQ(inflated->train.mapped->pixel_file, nullptr);
  EXPECT_TRUE(inflated->train.images.empty());
  EXPECT_EQ(inflated->channel_mean, loaded_gz->channel_mean);
  EXPECT_EQ(inflated->channel_stddev, loaded_gz->channel_stddev);
  ExpectSameBatches(*loaded_gz, *loaded_plain);
  ExpectSameBatches(*loaded_gz, *mapped);
  ExpectSameBatches(*loaded_gz, *inflated);
}

TEST(MappedDatasetTest, RgbRecordsGiveTheCifarReadersBatches) {
  // Five training batches of 12 and a test batch of 9, in CIFAR-10's format
  // and as records.
  const std::string cifar = MakeDir("cifar_small");
  const std::string records = MakeDir("records_rgb");
  RawSplit train, test;
  for (int b = 0; b <= 5; ++b) {
    const int count = b == 0 ? 9 : 12;
    const RawSplit part = RandomSplit(count, 3072, 10, 100 + b);
    std::vector<uint8_t> bytes;
    for (int i = 0; i < count; ++i) {
      bytes.push_back(part.labels[i]);
      bytes.insert(bytes.end(), part.pixels.begin() + i * 3072,
                   part.pixels.begin() + (i + 1) * 3072);
    }
    RawSplit& into = b == 0 ? test : train;
    into.pixels.insert(into.pixels.end(), part.pixels.begin(),
                       part.pixels.end());
    into.labels.insert(into.labels.end(), part.labels.begin(),
                       part.labels.end());
    WriteBytes(b == 0 ? cifar + "/test_batch.bin"
                      : cifar + "/data_batch_" + std::to_string(b) + ".bin",
               bytes, false);
  }
  WriteRecords(records + "/train.records", train, 3, 32, 32, 10);
  WriteRecords(records + "/test.records", test, 3, 32, 32, 10);
  absl::StatusOr<Dataset> loaded = LoadDataset("cifar10", cifar);
  absl::StatusOr<Dataset> mapped = LoadDataset("records", records);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ExpectSameBatches(*loaded, *mapped);
}

TEST(MappedDatasetTest, RecordsWithoutATestFileHaveAnEmptyTestSplit) {
  const std::string dir = MakeDir("records_no_test");
  WriteRecords(dir + "/train.records", RandomSplit(5, 4, 3, 9), 1, 2, 2, 3);
  absl::StatusOr<Dataset> d = LoadDataset("records", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_classes, 3);
  EXPECT_EQ(d->train.count, 5);
  EXPECT_EQ(d->test.count, 0);
}

TEST(MappedDatasetTest, BadFilesAreOneLineDataLossNamingTheFile) {
  const std::string dir = MakeDir("records_bad");
  const std::string path = dir + "/train.records";
  WriteRecords(path, RandomSplit(4, 4, 3, 9), 1, 2, 2, 3);
  // Truncated: one byte short.
  ::truncate(path.c_str(), 64 + 4 * 8 - 1);
  absl::StatusOr<Dataset> d = LoadDataset("records", dir);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find(path), std::string::npos);
  EXPECT_NE(d.status().message().find("4 records of 8 bytes make 96"),
            std::string::npos)
      << d.status();
  EXPECT_EQ(d.status().message().find('\n'), std::string::npos);

  WriteBytes(path, std::vector<uint8_t>(96, 'x'), false);
  d = LoadDataset("records", dir);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("bad magic"), std::string::npos);

  // A label outside [0, num_classes) in a mapped IDX file.
  const std::string idx = MakeDir("idx_bad_label");
  WriteBytes(idx + "/train-images-idx3-ubyte", Idx({2, 1, 1}, {1, 2}), false);
  WriteBytes(idx + "/train-labels-idx1-ubyte", Idx({2}, {3, 12}), false);
  WriteBytes(idx + "/t10k-images-idx3-ubyte", Idx({1, 1, 1}, {1}), false);
  WriteBytes(idx + "/t10k-labels-idx1-ubyte", Idx({1}, {0}), false);
  d = LoadDataset("mnist", idx);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("label 12 of sample 1"),
            std::string::npos)
      << d.status();

  // Trailing bytes after a mapped IDX file's data.
  WriteBytes(idx + "/train-labels-idx1-ubyte", Idx({2}, {3, 1, 0}), false);
  d = LoadDataset("mnist", idx);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("trailing bytes"), std::string::npos)
      << d.status();
}

TEST(MappedDatasetTest, WriterRefusesLabelsOutsideTheClasses) {
  absl::StatusOr<std::unique_ptr<RecordWriter>> w =
      RecordWriter::Open(TempDir() + "/refuse.records", 1, 1, 1, 4);
  ASSERT_TRUE(w.ok());
  const uint8_t pixel = 0;
  EXPECT_EQ((*w)->Append(4, &pixel).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Append(-1, &pixel).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*w)->Append(3, &pixel).ok());
  EXPECT_TRUE((*w)->Close().ok());
  EXPECT_EQ(
      RecordWriter::Open(TempDir() + "/x.records", 0, 1, 1, 4).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// A FIFO where a data file should be is refused at once (INVALID_ARGUMENT
// naming it), not waited on.
TEST(MappedDatasetTest, AFifoIsRefusedWithoutBlocking) {
  const std::string path = TempDir() + "/mapped_fifo";
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  const auto mapped = MappedFile::Open(path);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument)
      << mapped.status();
  EXPECT_NE(mapped.status().message().find("a FIFO"), std::string::npos)
      << mapped.status();
}

TEST(MappedDatasetTest, MappedFileReleaseKeepsTheBytes) {
  const std::string path = TempDir() + "/release.bin";
  std::vector<uint8_t> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = i * 31 % 251;
  WriteBytes(path, bytes, false);
  absl::StatusOr<std::unique_ptr<MappedFile>> f =
      MappedFile::Open(path, /*release_every_bytes=*/4096);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->size(), bytes.size());
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < bytes.size(); i += 4096) {
      ASSERT_EQ((*f)->data()[i], bytes[i]);
      (*f)->NoteRead(4096);
    }
    (*f)->ReleaseResident();
  }
  EXPECT_EQ(0, std::memcmp((*f)->data(), bytes.data(), bytes.size()));
  EXPECT_EQ(MappedFile::Open(TempDir() + "/missing.bin").status().code(),
            absl::StatusCode::kNotFound);
}

// `pstrain eval` standardises another dataset with a model's statistics:
// every value, in memory and mapped, is (pixel / 255 - mean) / stddev with
// the statistics given, not the dataset's own; its own change nothing.
TEST(MappedDatasetTest, StandardiseAsUsesTheGivenStatistics) {
  // Pixels in [0, 127]: statistics far from a model's trained on [0, 255].
  RawSplit train = RandomSplit(50, 5 * 4, 10, 7);
  RawSplit test = RandomSplit(13, 5 * 4, 10, 8);
  for (RawSplit* split : {&train, &test}) {
    for (uint8_t& p : split->pixels) p /= 2;
  }
  const std::string dir = MakeDir("idx_dark");
  WriteBytes(dir + "/train-images-idx3-ubyte", Idx({50, 5, 4}, train.pixels),
             false);
  WriteBytes(dir + "/train-labels-idx1-ubyte", Idx({50}, train.labels), false);
  WriteBytes(dir + "/t10k-images-idx3-ubyte", Idx({13, 5, 4}, test.pixels),
             false);
  WriteBytes(dir + "/t10k-labels-idx1-ubyte", Idx({13}, test.labels), false);
  const std::vector<double> mean = {0.2860}, stddev = {0.3530};
  DatasetOptions in_memory;
  in_memory.map_files = false;
  for (bool map : {false, true}) {
    absl::StatusOr<Dataset> d =
        LoadDataset("mnist", dir, map ? DatasetOptions() : in_memory);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->test.mapped != nullptr, map);
    ASSERT_LT(d->channel_mean[0], 0.26);
    ASSERT_TRUE(StandardiseAs(mean, stddev, &*d).ok());
    EXPECT_EQ(d->channel_mean, mean);
    EXPECT_EQ(d->channel_stddev, stddev);
    for (const auto& [split, raw] :
         {std::make_pair(&d->train, &train), std::make_pair(&d->test, &test)}) {
      std::vector<SampleIndex> all(split->count);
      for (int64_t i = 0; i < split->count; ++i) all[i] = i;
      Tensor images;
      std::vector<int32_t> labels;
      GatherBatch(*split, all, 0, all.size(), &images, &labels);
      ASSERT_EQ(images.data.size(), raw->pixels.size());
      for (size_t i = 0; i < raw->pixels.size(); ++i) {
        const double want = (raw->pixels[i] / 255.0 - mean[0]) / stddev[0];
        ASSERT_NEAR(images.data[i], want, 1e-6 * (1 + std::abs(want)))
            << "map " << map << " value " << i;
      }
    }
  }
  // A dataset's own statistics (to a model file's 9 digits) change nothing.
  absl::StatusOr<Dataset> a = LoadDataset("mnist", dir, in_memory);
  absl::StatusOr<Dataset> b = LoadDataset("mnist", dir, in_memory);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<double> own_mean = {a->channel_mean[0] * (1 + 3e-9)};
  ASSERT_TRUE(StandardiseAs(own_mean, a->channel_stddev, &*a).ok());
  EXPECT_EQ(a->train.images, b->train.images);
  EXPECT_EQ(a->test.images, b->test.images);
  // Bad statistics: refused, nothing changed.
  EXPECT_EQ(StandardiseAs({0.1, 0.2, 0.3}, {1, 1, 1}, &*a).message(),
            "input statistics for 3 and 3 channels (mean, stddev); dataset "
            "mnist has 1");
  EXPECT_EQ(StandardiseAs({0.1}, {0}, &*a).message(),
            "input statistics of channel 0: mean 0.1, stddev 0; expected "
            "finite values and a positive stddev");
  EXPECT_EQ(StandardiseAs({NAN}, {1}, &*a).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->test.images, b->test.images);
}

}  // namespace
}  // namespace pstrain
