#include "worker/input_pipeline.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/image_write.h"
#include "worker/jpeg_testing.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                       "/input_pipeline_test/", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> Pattern(int h, int w, int c, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) {
        p[(static_cast<size_t>(y) * w + x) * c + k] = static_cast<uint8_t>(
            (40 + 9 * x + 7 * y + 50 * k + 13 * seed) % 200 + 20);
      }
    }
  }
  return p;
}

// 30 JPEG files of several sizes, one of them grayscale.
ImageFiles MakeFiles(const std::string& dir) {
  ImageFiles files;
  for (int i = 0; i < 30; ++i) {
    const int h = 40 + (i % 3) * 12, w = 36 + (i % 4) * 10;
    const int c = i == 7 ? 1 : 3;
    const std::string path = absl::StrCat(dir, "/", i, ".jpg");
    testing::WriteJpegLike(path, h, w, c, Pattern(h, w, c, i));
    files.paths.push_back(path);
    files.labels.push_back(i % 5);
  }
  return files;
}

std::vector<InputPipeline::Batch> AllBatches(const ImageFiles& files,
                                             const InputPipelineOptions& o,
                                             int64_t num_batches) {
  std::vector<SampleIndex> order(files.paths.size());
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  absl::StatusOr<std::unique_ptr<InputPipeline>> p =
      InputPipeline::Create(files, order, num_batches, o);
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<InputPipeline::Batch> out;
  if (!p.ok()) return out;
  InputPipeline::Batch batch;
  while (true) {
    absl::StatusOr<bool> more = (*p)->Next(&batch);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    out.push_back(batch);
  }
  return out;
}

TEST(InputPipelineTest, SameBatchesForOneAndFourThreads) {
  const ImageFiles files = MakeFiles(FreshDir("threads"));
  for (auto crop : {AugmentOptions::Crop::kRandomResizedCrop,
                    AugmentOptions::Crop::kPadCrop}) {
    InputPipelineOptions o;
    o.batch_size = 4;
    o.seed = 11;
    o.augment.crop = crop;
    o.augment.out_size = 32;
    o.augment.mean = {0.485f, 0.456f, 0.406f};
    o.augment.stddev = {0.229f, 0.224f, 0.225f};
    o.threads = 1;
    o.prefetch_batches = 1;
    const std::vector<InputPipeline::Batch> one = AllBatches(files, o, 7);
    o.threads = 4;
    o.prefetch_batches = 3;
    const std::vector<InputPipeline::Batch> four = AllBatches(files, o, 7);
    ASSERT_EQ(one.size(), 7u);
    ASSERT_EQ(four.size(), 7u);
    for (size_t b = 0; b < one.size(); ++b) {
      EXPECT_EQ(one[b].labels, four[b].labels);
      ASSERT_EQ(one[b].images.shape, (Shape{4, 3, 32, 32}));
      EXPECT_EQ(
          0, std::memcmp(one[b].images.data.data(), four[b].images.data.data(),
                         one[b].images.data.size() * sizeof(float)))
          << "batch " << b;
    }
    // Labels follow the order (reversed), and another seed crops elsewhere.
    EXPECT_EQ(one[0].labels,
              (std::vector<int32_t>{29 % 5, 28 % 5, 27 % 5, 26 % 5}));
    o.seed = 12;
    const std::vector<InputPipeline::Batch> other = AllBatches(files, o, 7);
    EXPECT_NE(
        0, std::memcmp(one[0].images.data.data(), other[0].images.data.data(),
                       one[0].images.data.size() * sizeof(float)));
  }
}

// The pipeline decodes only the window of each JPEG its crop reads and
// reuses the storage of the batches handed back to it. Against PNG copies of
// the JPEGs' full decodes (decoded whole, into fresh batches), every crop
// and channel conversion gives the same bytes.
TEST(InputPipelineTest, DecodingOnlyTheCropWindowGivesTheSameBatches) {
  const std::string dir = FreshDir("window");
  const ImageFiles jpegs = MakeFiles(dir);
  ImageFiles pngs = jpegs;
  for (std::string& path : pngs.paths) {
    absl::StatusOr<DecodedImage> full = DecodeImageFile(path);
    ASSERT_TRUE(full.ok()) << full.status();
    path += ".png";
    ASSERT_TRUE(WritePngFile(path, full->height, full->width, full->channels,
                             full->pixels)
                    .ok());
  }
  std::vector<SampleIndex> order(jpegs.paths.size());
  std::iota(order.begin(), order.end(), 0);
  for (auto crop :
       {AugmentOptions::Crop::kRandomResizedCrop,
        AugmentOptions::Crop::kPadCrop, AugmentOptions::Crop::kResize}) {
    for (int channels : {1, 3}) {
      InputPipelineOptions o;
      o.batch_size = 5;
      o.seed = 3;
      o.threads = 2;
      o.augment.crop = crop;
      o.augment.out_size = 48;  // crops are enlarged and shrunk
      o.augment.channels = channels;
      const std::vector<InputPipeline::Batch> from_jpeg =
          AllBatches(jpegs, o, 6);
      ASSERT_EQ(from_jpeg.size(), 6u);
      // AllBatches reads the order reversed.
      std::vector<SampleIndex> reversed(order.rbegin(), order.rend());
      absl::StatusOr<std::unique_ptr<InputPipeline>> p =
          InputPipeline::Create(pngs, reversed, 6, o);
      ASSERT_TRUE(p.ok()) << p.status();
      for (int b = 0; b < 6; ++b) {
        InputPipeline::Batch fresh;
        absl::StatusOr<bool> more = (*p)->Next(&fresh);
        ASSERT_TRUE(more.ok() && *more) << more.status();
        ASSERT_EQ(fresh.images.shape, from_jpeg[b].images.shape);
        EXPECT_EQ(0, std::memcmp(fresh.images.data.data(),
                                 from_jpeg[b].images.data.data(),
                                 fresh.images.data.size() * sizeof(float)))
            << "batch " << b << ", crop " << static_cast<int>(crop)
            << ", channels " << channels;
      }
    }
  }
}

TEST(AugmentImageTest, ResizeMatchesImageToChwAndFlipMirrors) {
  DecodedImage image;
  image.height = 20;
  image.width = 30;
  image.channels = 3;
  image.pixels = Pattern(20, 30, 3, 4);
  AugmentOptions o;
  o.crop = AugmentOptions::Crop::kResize;
  o.hflip = false;
  for (int size : {20, 13, 41}) {
    o.out_size = size;
    std::vector<float> ours(3 * size * size), reference(3 * size * size);
    AugmentImage(image, o, 1, ours.data());
    ImageToChw(image, 3, size, reference.data());
    for (size_t i = 0; i < ours.size(); ++i) {
      // Rounding of the sample positions differs: within 1e-5 (0.3% of
      // one 8-bit level).
      ASSERT_NEAR(ours[i], reference[i], 1e-5) << "size " << size << " " << i;
    }
  }
  // A flip of every image: the mirror of the unflipped output.
  o.out_size = 16;
  std::vector<float> plain(3 * 256), flipped(3 * 256);
  AugmentImage(image, o, 1, plain.data());
  o.hflip = true;
  int flips = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    AugmentImage(image, o, seed, flipped.data());
    bool mirrored = true, same = true;
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 16; ++y) {
        for (int x = 0; x < 16; ++x) {
          const float v = flipped[(c * 16 + y) * 16 + x];
          mirrored &= v == plain[(c * 16 + y) * 16 + 15 - x];
          same &= v == plain[(c * 16 + y) * 16 + x];
        }
      }
    }
    EXPECT_TRUE(mirrored || same) << seed;
    flips += mirrored;
  }
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, 8);
}

TEST(AugmentImageTest, PadCropIsAShiftWithZeroBorders) {
  DecodedImage image;
  image.height = image.width = 12;
  image.channels = 1;
  image.pixels = Pattern(12, 12, 1, 2);
  AugmentOptions o;
  o.crop = AugmentOptions::Crop::kPadCrop;
  o.out_size = 12;
  o.pad = 3;
  o.hflip = false;
  o.channels = 1;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> out(144);
    AugmentImage(image, o, seed, out.data());
    bool found = false;
    for (int dy = -3; dy <= 3 && !found; ++dy) {
      for (int dx = -3; dx <= 3 && !found; ++dx) {
        bool match = true;
        for (int y = 0; y < 12 && match; ++y) {
          for (int x = 0; x < 12 && match; ++x) {
            const int sy = y + dy, sx = x + dx;
            const float want = (sy < 0 || sy >= 12 || sx < 0 || sx >= 12)
                                   ? 0.0f
                                   : image.pixels[sy * 12 + sx] / 255.0f;
            match = std::fabs(out[y * 12 + x] - want) < 1e-6f;
          }
        }
        found = match;
      }
    }
    EXPECT_TRUE(found) << "seed " << seed;
  }
}

TEST(InputPipelineTest, CorruptFileAndBadOptionsAreErrors) {
  const std::string dir = FreshDir("corrupt");
  ImageFiles files = MakeFiles(dir);
  {
    FILE* f = std::fopen(files.paths[5].c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fclose(f);
    fs::resize_file(files.paths[5], size / 3);
  }
  InputPipelineOptions o;
  o.batch_size = 3;
  o.threads = 2;
  o.augment.out_size = 8;
  std::vector<SampleIndex> order(30);
  std::iota(order.begin(), order.end(), 0);
  absl::StatusOr<std::unique_ptr<InputPipeline>> p =
      InputPipeline::Create(files, order, 10, o);
  ASSERT_TRUE(p.ok()) << p.status();
  InputPipeline::Batch batch;
  EXPECT_TRUE(*(*p)->Next(&batch));
  absl::StatusOr<bool> second = (*p)->Next(&batch);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(second.status().message().find(files.paths[5]), std::string::npos)
      << second.status();
  EXPECT_FALSE(*(*p)->Next(&batch));  // Finished after the error.

  EXPECT_EQ(InputPipeline::Create(files, order, 11, o).status().code(),
            absl::StatusCode::kInvalidArgument);  // 33 > 30 samples.
  o.threads = 0;
  EXPECT_EQ(InputPipeline::Create(files, order, 1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.threads = 1;
  o.augment.mean = {0.5f};
  EXPECT_EQ(InputPipeline::Create(files, order, 1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.augment.mean.clear();
  EXPECT_EQ(InputPipeline::Create(files, std::vector<SampleIndex>{99}, 1, o)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The policy (field 41 of /proc/self/task/TID/stat) of every thread of
// this process.
std::vector<int> ThreadPolicies() {
  std::vector<int> policies;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    FILE* f = std::fopen((task.path() / "stat").c_str(), "r");
    if (f == nullptr) continue;
    char line[1024] = {0};
    const size_t n = std::fread(line, 1, sizeof(line) - 1, f);
    std::fclose(f);
    // The fields after the command name, which ends at the last ')'.
    const char* p = std::strrchr(line, ')');
    if (n == 0 || p == nullptr) continue;
    int field = 2;
    for (; *p != 0 && field < 41; ++p) field += *p == ' ';
    policies.push_back(std::atoi(p));
  }
  return policies;
}

// idle_priority: the decoding threads run under SCHED_IDLE (5), and still
// give the same batches.
TEST(InputPipelineTest, IdlePriorityThreadsRunUnderSchedIdle) {
  const std::string dir = FreshDir("idle");
  ImageFiles files = MakeFiles(dir);
  InputPipelineOptions o;
  o.batch_size = 3;
  o.threads = 2;
  o.prefetch_batches = 2;
  o.augment.out_size = 8;
  std::vector<SampleIndex> order(30);
  std::iota(order.begin(), order.end(), 0);
  absl::StatusOr<std::unique_ptr<InputPipeline>> plain =
      InputPipeline::Create(files, order, 10, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  InputPipeline::Batch expected;
  ASSERT_TRUE(*(*plain)->Next(&expected));
  plain->reset();
  o.idle_priority = true;
  absl::StatusOr<std::unique_ptr<InputPipeline>> idle =
      InputPipeline::Create(files, order, 10, o);
  ASSERT_TRUE(idle.ok()) << idle.status();
  InputPipeline::Batch batch;
  ASSERT_TRUE(*(*idle)->Next(&batch));
  EXPECT_EQ(batch.images.data, expected.images.data);
  EXPECT_EQ(batch.labels, expected.labels);
  // Both threads set their policy as they start (one may not have yet).
  std::vector<int> policies;
  for (int tries = 0; tries < 500; ++tries) {
    policies = ThreadPolicies();
    if (std::count(policies.begin(), policies.end(), SCHED_IDLE) == 2) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(std::count(policies.begin(), policies.end(), SCHED_IDLE), 2)
      << "policies: " << ::testing::PrintToString(policies);
}

TEST(InputThreadsTest, AQuarterOfTheCoresLeavingTheStepSome) {
  EXPECT_EQ(InputThreadsForCores(1), 1);
  EXPECT_EQ(InputThreadsForCores(2), 1);
  EXPECT_EQ(InputThreadsForCores(8), 2);
  EXPECT_EQ(InputThreadsForCores(16), 4);
}

}  // namespace
}  // namespace pstrain
