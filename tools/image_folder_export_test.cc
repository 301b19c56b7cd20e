#include "tools/image_folder_export.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "worker/dataset.h"
#include "worker/image_folder.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR")) + "/image_folder_export/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A plain (not gzipped) IDX file of unsigned bytes: magic 0x0000080N, then
// N big-endian int32 dimensions, then the bytes.
void WriteIdx(const std::string& path, const std::vector<int>& dims,
              const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  const uint8_t magic[4] = {0, 0, 8, static_cast<uint8_t>(dims.size())};
  out.write(reinterpret_cast<const char*>(magic), 4);
  for (int d : dims) {
    const uint8_t be[4] = {
        static_cast<uint8_t>(d >> 24), static_cast<uint8_t>(d >> 16),
        static_cast<uint8_t>(d >> 8), static_cast<uint8_t>(d)};
    out.write(reinterpret_cast<const char*>(be), 4);
  }
  out.write(reinterpret_cast<const char*>(data.data()), data.size());
}

constexpr int kSide = 8;

// Image i (i < 27): a smooth ramp whose top-left pixel is 8 * i + 4, so a
// read-back image names its source index.
uint8_t Pixel(int i, int y, int x) {
  return static_cast<uint8_t>(8 * i + 4 + 2 * x + y);
}

// `n` images labelled i % classes, written as the four IDX files of an
// MNIST-style folder (the test split: `test_n` more of the same kind).
std::string MakeIdxFolder(const std::string& name, int n, int test_n,
                          int classes) {
  const std::string dir = FreshDir(name);
  for (const auto& [prefix, count, first] :
       {std::tuple<std::string, int, int>{"train", n, 0},
        {"t10k", test_n, n}}) {
    std::vector<uint8_t> images, labels;
    for (int i = first; i < first + count; ++i) {
      for (int y = 0; y < kSide; ++y) {
        for (int x = 0; x < kSide; ++x) images.push_back(Pixel(i, y, x));
      }
      labels.push_back(static_cast<uint8_t>(i % classes));
    }
    WriteIdx(dir + "/" + prefix + "-images-idx3-ubyte", {count, kSide, kSide},
             images);
    WriteIdx(dir + "/" + prefix + "-labels-idx1-ubyte", {count}, labels);
  }
  return dir;
}

// Every read-back image is its source's pixels (within `tolerance` levels)
// and its label's class folder is the source's label.
void ExpectSameImages(const ImageFolderDataset& read,
                      const ImageFolderSplit& split, int first, int count,
                      int classes, double tolerance) {
  ASSERT_EQ(split.count, count);
  ASSERT_EQ(split.chw[0], 1);
  ASSERT_EQ(split.chw[1], kSide);
  std::vector<bool> seen(count, false);
  for (int64_t k = 0; k < split.count; ++k) {
    const float* p = split.images.data() + k * kSide * kSide;
    const int i = static_cast<int>(std::lround((p[0] * 255 - 4) / 8));
    ASSERT_GE(i, first);
    ASSERT_LT(i, first + count);
    EXPECT_FALSE(seen[i - first]) << i;
    seen[i - first] = true;
    EXPECT_EQ(std::stoi(read.class_names[split.labels[k]]), i % classes) << i;
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        EXPECT_NEAR(p[y * kSide + x] * 255, Pixel(i, y, x), tolerance)
            << "image " << i << " at " << y << "," << x;
      }
    }
  }
}

TEST(ImageFolderExportTest, PngTreeReadsBackExactlyWithTheSameLabels) {
  // 12 classes: two-digit folder names, so "02" sorts before "10".
  const std::string in = MakeIdxFolder("png_in", 18, 6, 12);
  ImageFolderExportOptions o;
  o.input_dir = in;
  o.output_dir = FreshDir("png_out");
  o.format = "png";
  o.threads = 3;
  absl::StatusOr<ImageFolderExportResult> result = ExportIdxAsImageFolder(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train_images, 18);
  EXPECT_EQ(result->test_images, 6);
  EXPECT_GT(result->bytes, 0);
  EXPECT_TRUE(fs::exists(o.output_dir + "/train/02/02.png"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/test/09/3.png"));
  ImageFolderOptions read_options;
  read_options.image_size = kSide;
  absl::StatusOr<ImageFolderDataset> read =
      ReadImageFolderDataset(o.output_dir, read_options);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->layout, "split_class_folders");
  ASSERT_EQ(read->class_names.size(), 12u);
  EXPECT_EQ(read->class_names[2], "02");
  EXPECT_EQ(read->class_names[10], "10");
  ExpectSameImages(*read, read->train, 0, 18, 12, 0.01);
  ExpectSameImages(*read, read->test, 18, 6, 12, 0.01);
}

TEST(ImageFolderExportTest, JpegTreeIsCloseToThePixels) {
  const std::string in = MakeIdxFolder("jpeg_in", 10, 4, 10);
  ImageFolderExportOptions o;
  o.input_dir = in;
  o.output_dir = FreshDir("jpeg_out");
  o.quality = 95;
  ASSERT_TRUE(ExportIdxAsImageFolder(o).ok());
  EXPECT_TRUE(fs::exists(o.output_dir + "/train/3/3.jpg"));
  ImageFolderOptions read_options;
  read_options.image_size = kSide;
  absl::StatusOr<ImageFolderDataset> read =
      ReadImageFolderDataset(o.output_dir, read_options);
  ASSERT_TRUE(read.ok()) << read.status();
  // Smooth ramps at quality 95, 4:4:4: a few levels at most.
  ExpectSameImages(*read, read->train, 0, 10, 10, 4.0);
  ExpectSameImages(*read, read->test, 10, 4, 10, 4.0);
}

TEST(ImageFolderExportTest, BadInputIsOneErrorAndOverwritesNothing) {
  const std::string in = MakeIdxFolder("bad_in", 4, 2, 2);
  ImageFolderExportOptions o;
  o.input_dir = in;
  o.output_dir = FreshDir("bad_out");
  o.format = "gif";
  EXPECT_EQ(ExportIdxAsImageFolder(o).status().message(),
            "--format=gif: expected jpeg or png");
  o.format = "jpeg";
  o.quality = 101;
  EXPECT_EQ(ExportIdxAsImageFolder(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.quality = 90;
  o.input_dir = in + "/missing";
  EXPECT_EQ(ExportIdxAsImageFolder(o).status().code(),
            absl::StatusCode::kNotFound);
  o.input_dir = in;
  ASSERT_TRUE(ExportIdxAsImageFolder(o).ok());
  const absl::Status again = ExportIdxAsImageFolder(o).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("already holds train/"),
            absl::string_view::npos)
      << again;
}

}  // namespace
}  // namespace pstrain
