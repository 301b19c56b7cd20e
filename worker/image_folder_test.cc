#include "worker/image_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/dataset.h"
#include "worker/image_write.h"
#include "worker/jpeg_testing.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the test's temporary folder.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/image_folder_test/", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void MakeDirs(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
}

// Known pixels: h x w x c interleaved, distinct per image (`seed`).
std::vector<uint8_t> Pattern(int h, int w, int c, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) {
        // Smooth enough for JPEG at quality 100 to keep it closely.
        p[(static_cast<size_t>(y) * w + x) * c + k] = static_cast<uint8_t>(
            (40 + 9 * x + 7 * y + 50 * k + 13 * seed) % 200 + 20);
      }
    }
  }
  return p;
}

void WritePng(const std::string& path, int h, int w, int c,
              const std::vector<uint8_t>& pixels) {
  MakeDirs(path);
  ASSERT_TRUE(WritePngFile(path, h, w, c, pixels).ok()) << path;
}

void WriteJpeg(const std::string& path, int h, int w, int c,
               const std::vector<uint8_t>& pixels, int quality = 100) {
  MakeDirs(path);
  ASSERT_TRUE(WriteJpegFile(path, h, w, c, pixels, quality).ok()) << path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  MakeDirs(path);
  std::ofstream(path, std::ios::binary) << bytes;
}

// The first `keep` bytes of `from`, written to `to`.
void Truncate(const std::string& from, const std::string& to, size_t keep) {
  WriteAll(to, ReadAll(from).substr(0, keep));
}

// Largest difference between a pixel written as a JPEG at quality 100
// without chroma subsampling and the pixel read back (8-bit levels): the
// patterns below wrap around, and their sharp edges cost a few levels.
constexpr int kJpegTolerance = 6;

// Pixel (y, x, k) of an interleaved image, as a float in [0, 1].
float At(const std::vector<uint8_t>& p, int w, int c, int y, int x, int k) {
  return p[(static_cast<size_t>(y) * w + x) * c + k] * (1.0f / 255.0f);
}

TEST(ImageWriteTest, BadInputIsRefusedAndWritesNothing) {
  const std::string dir = FreshDir("write_errors");
  const std::vector<uint8_t> pixels = Pattern(4, 4, 3, 0);
  const std::string path = dir + "/a.jpg";
  EXPECT_EQ(WriteJpegFile(path, 4, 5, 3, pixels, 90).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteJpegFile(path, 4, 4, 3, pixels, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteJpegFile(path, 2, 2, 4, std::vector<uint8_t>(16), 90).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePngFile(path, 0, 4, 3, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(path));
  const absl::Status missing =
      WriteJpegFile(dir + "/no/such/folder/a.jpg", 4, 4, 3, pixels, 90);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInternal);
  EXPECT_NE(missing.message().find("no/such/folder/a.jpg: cannot write"),
            absl::string_view::npos)
      << missing;
}

TEST(DecodeImageTest, PngDecodesToExactlyThePixelsWritten) {
  const std::string dir = FreshDir("png");
  for (int c : {1, 3}) {
    const std::vector<uint8_t> pixels = Pattern(5, 7, c, c);
    const std::string path = absl::StrCat(dir, "/a", c, ".png");
    WritePng(path, 5, 7, c, pixels);
    absl::StatusOr<DecodedImage> image = DecodeImageFile(path);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->height, 5);
    EXPECT_EQ(image->width, 7);
    EXPECT_EQ(image->channels, c);
    EXPECT_EQ(image->pixels, pixels);
  }
}

// A FIFO where an image should be is an unreadable image, refused at once.
TEST(DecodeImageTest, AFifoIsDataLossWithoutBlocking) {
  const std::string path = FreshDir("fifo") + "/a.jpg";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  const absl::StatusOr<DecodedImage> image = DecodeImageFile(path);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kDataLoss)
      << image.status();
  EXPECT_NE(image.status().message().find("a FIFO"), std::string::npos)
      << image.status();
}

TEST(DecodeImageTest, PngAlphaIsDropped) {
  const std::string dir = FreshDir("png_alpha");
  const std::vector<uint8_t> rgba = Pattern(3, 4, 4, 0);
  WritePng(dir + "/a.png", 3, 4, 4, rgba);
  absl::StatusOr<DecodedImage> image = DecodeImageFile(dir + "/a.png");
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->channels, 3);
  for (size_t j = 0; j < 12; ++j) {
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(image->pixels[3 * j + k], rgba[4 * j + k]);
    }
  }
}

TEST(DecodeImageTest, JpegAtQuality100IsCloseToThePixelsWritten) {
  const std::string dir = FreshDir("jpeg");
  for (int c : {1, 3}) {
    const std::vector<uint8_t> pixels = Pattern(16, 24, c, c);
    const std::string path = absl::StrCat(dir, "/a", c, ".jpg");
    WriteJpeg(path, 16, 24, c, pixels);
    absl::StatusOr<DecodedImage> image = DecodeImageFile(path);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->height, 16);
    EXPECT_EQ(image->width, 24);
    EXPECT_EQ(image->channels, c);
    ASSERT_EQ(image->pixels.size(), pixels.size());
    int worst = 0;
    for (size_t i = 0; i < pixels.size(); ++i) {
      worst = std::max(worst, std::abs(image->pixels[i] - pixels[i]));
    }
    EXPECT_LE(worst, kJpegTolerance) << "channels " << c;
  }
}

TEST(DecodeImageTest, HeaderOnlyGivesSizeAndChannels) {
  const std::string dir = FreshDir("header");
  WriteJpeg(dir + "/a.jpg", 9, 11, 3, Pattern(9, 11, 3, 0));
  absl::StatusOr<DecodedImage> image =
      DecodeImageFile(dir + "/a.jpg", /*header_only=*/true);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->height, 9);
  EXPECT_EQ(image->width, 11);
  EXPECT_EQ(image->channels, 3);
  EXPECT_TRUE(image->pixels.empty());
}

TEST(DecodeImageTest, BrokenFilesAreErrorsNotCrashes) {
  const std::string dir = FreshDir("broken");
  WriteJpeg(dir + "/good.jpg", 32, 32, 3, Pattern(32, 32, 3, 1));
  WritePng(dir + "/good.png", 32, 32, 3, Pattern(32, 32, 3, 2));
  const std::string jpeg = ReadAll(dir + "/good.jpg");
  const std::string png = ReadAll(dir + "/good.png");
  struct Case {
    std::string bytes;
    std::string expected;
  };
  std::string bad_crc = png;
  bad_crc[png.find("IDAT") + 6] ^= 0x55;  // IDAT data, CRC now wrong
  const std::vector<Case> cases = {
      {"", "empty file"},
      {"GIF89a....", "not a JPEG or PNG file (starts with 47 49 46 38)"},
      {jpeg.substr(0, jpeg.size() / 2), "corrupt JPEG (Premature end"},
      {jpeg.substr(0, 3), "corrupt JPEG ("},
      {"\xff\xd8\xff\xe0garbagegarbagegarbage", "corrupt JPEG ("},
      {png.substr(0, png.size() / 2), "corrupt PNG ("},
      {png.substr(0, 8), "corrupt PNG (truncated file)"},
      {png.substr(0, png.size() - 12), "corrupt PNG ("},  // no IEND
      {bad_crc, "corrupt PNG ("},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& b = cases[i].bytes;
    absl::StatusOr<DecodedImage> image =
        DecodeImage(reinterpret_cast<const uint8_t*>(b.data()), b.size());
    ASSERT_FALSE(image.ok()) << "case " << i;
    EXPECT_EQ(image.status().code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_EQ(image.status().message().find(cases[i].expected), 0u)
        << "case " << i << ": " << image.status();
  }
}

TEST(ImageToChwTest, BilinearResizeAsPyTorchAlignCornersFalse) {
  // A 4 x 4 image of identical rows, shrunk to 2 x 2.
  DecodedImage image;
  image.height = image.width = 4;
  image.channels = 1;
  image.pixels = {0, 51, 102, 255, 0, 51, 102, 255,
                  0, 51, 102, 255, 0, 51, 102, 255};
  std::vector<float> down(2 * 2);
  ImageToChw(image, 1, 2, down.data());
  // Scale 2: output x samples 2x + 0.5, halfway between 2x and 2x + 1.
  EXPECT_NEAR(down[0], 25.5f / 255.0f, 1e-6);
  EXPECT_NEAR(down[1], 178.5f / 255.0f, 1e-6);
  EXPECT_NEAR(down[2], 25.5f / 255.0f, 1e-6);

  DecodedImage two;
  two.height = two.width = 2;
  two.channels = 1;
  two.pixels = {0, 100, 200, 40};
  std::vector<float> up(4 * 4);
  ImageToChw(two, 1, 4, up.data());
  // Scale 1/2: sources -0.25 (clamped to 0), 0.25, 0.75, 1.25 (edge).
  const float w[4][2] = {{1, 0}, {0.75f, 0.25f}, {0.25f, 0.75f}, {0, 1}};
  auto p = [&](int y, int x) { return two.pixels[y * 2 + x] / 255.0f; };
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) {
      const float expected = w[y][0] * (w[x][0] * p(0, 0) + w[x][1] * p(0, 1)) +
                             w[y][1] * (w[x][0] * p(1, 0) + w[x][1] * p(1, 1));
      EXPECT_NEAR(up[y * 4 + x], expected, 1e-6) << y << "," << x;
    }
  }
}

TEST(ImageToChwTest, ChannelConversions) {
  DecodedImage rgb;
  rgb.height = rgb.width = 1;
  rgb.channels = 3;
  rgb.pixels = {200, 100, 50};
  float gray;
  ImageToChw(rgb, 1, 1, &gray);
  // PIL: (200 * 19595 + 100 * 38470 + 50 * 7471 + 32768) >> 16 = 124.
  EXPECT_EQ(gray, 124 * (1.0f / 255.0f));
  DecodedImage one;
  one.height = one.width = 1;
  one.channels = 1;
  one.pixels = {77};
  float three[3];
  ImageToChw(one, 3, 1, three);
  for (float v : three) EXPECT_EQ(v, 77 * (1.0f / 255.0f));
}

// root/train/{cat,dog}, root/val/{cat,dog}: JPEG and PNG, gray and RGB.
TEST(ImageFolderTest, ReadsSplitClassFoldersInFixedOrder) {
  const std::string root = FreshDir("split");
  const int s = 8;
  // Written in an order unlike the sorted one.
  WritePng(root + "/train/dog/b.png", s, s, 3, Pattern(s, s, 3, 1));
  WritePng(root + "/train/cat/z.png", s, s, 3, Pattern(s, s, 3, 2));
  WritePng(root + "/train/cat/a.PNG", s, s, 1, Pattern(s, s, 1, 3));
  WriteJpeg(root + "/train/dog/a.jpeg", s, s, 3, Pattern(s, s, 3, 4));
  WriteAll(root + "/train/dog/notes.txt", "not an image");
  WriteAll(root + "/train/.hidden/x.png", "hidden: never read");
  WritePng(root + "/val/dog/v.png", s, s, 3, Pattern(s, s, 3, 5));
  ImageFolderOptions options;
  options.image_size = s;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout, "split_class_folders");
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(d->train.count, 4);
  EXPECT_EQ(d->train.chw[0], 3);  // one RGB image makes the set RGB
  EXPECT_EQ(d->train.chw[1], s);
  EXPECT_EQ(d->train.chw[2], s);
  EXPECT_EQ(d->train.labels, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(d->train.skipped, 0);
  // Sample 0 is cat/a.PNG (gray, copied to R, G and B), sample 1 cat/z.png.
  const int64_t per = 3 * s * s;
  const std::vector<uint8_t> gray = Pattern(s, s, 1, 3);
  const std::vector<uint8_t> z = Pattern(s, s, 3, 2);
  const std::vector<uint8_t> jpeg = Pattern(s, s, 3, 4);
  for (int k = 0; k < 3; ++k) {
    for (int y = 0; y < s; ++y) {
      for (int x = 0; x < s; ++x) {
        const int64_t j = (k * s + y) * s + x;
        EXPECT_EQ(d->train.images[j], At(gray, s, 1, y, x, 0));
        EXPECT_EQ(d->train.images[per + j], At(z, s, 3, y, x, k));
        EXPECT_NEAR(d->train.images[2 * per + j], At(jpeg, s, 3, y, x, k),
                    (kJpegTolerance + 0.5f) / 255);
      }
    }
  }
  ASSERT_EQ(d->test.count, 1);
  EXPECT_EQ(d->test.labels, (std::vector<int32_t>{1}));
  EXPECT_EQ(d->test.chw[0], 3);
}

TEST(ImageFolderTest, GrayOnlyIsOneChannelAndResized) {
  const std::string root = FreshDir("gray");
  WritePng(root + "/a/1.png", 10, 6, 1, Pattern(10, 6, 1, 0));
  WritePng(root + "/b/1.png", 4, 4, 1, Pattern(4, 4, 1, 1));
  ImageFolderOptions options;
  options.image_size = 5;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout, "class_folders");
  EXPECT_EQ(d->train.chw[0], 1);
  EXPECT_EQ(d->train.count, 2);
  EXPECT_EQ(d->train.images.size(), 2u * 25);
  EXPECT_EQ(d->test.count, 0);
  for (float v : d->train.images) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
  options.channels = 3;
  d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.chw[0], 3);
}

TEST(ImageFolderTest, SameResultOnAnyNumberOfThreads) {
  const std::string root = FreshDir("threads");
  for (int i = 0; i < 12; ++i) {
    WriteJpeg(absl::StrCat(root, "/c", i % 3, "/", i, ".jpg"), 20, 20, 3,
              Pattern(20, 20, 3, i), 90);
  }
  ImageFolderOptions options;
  options.image_size = 13;
  options.num_threads = 1;
  absl::StatusOr<ImageFolderDataset> one =
      ReadImageFolderDataset(root, options);
  options.num_threads = 4;
  absl::StatusOr<ImageFolderDataset> four =
      ReadImageFolderDataset(root, options);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(one->train.images, four->train.images);
  EXPECT_EQ(one->train.labels, four->train.labels);
}

TEST(ImageFolderTest, ReadsTinyImagenetLayout) {
  const std::string root = FreshDir("tiny");
  WriteAll(root + "/wnids.txt", "n02124075\nn01443537\n");  // not sorted
  for (const char* wnid : {"n02124075", "n01443537"}) {
    for (int i = 0; i < 3; ++i) {
      WriteJpeg(absl::StrCat(root, "/train/", wnid, "/images/", wnid, "_", i,
                             ".JPEG"),
                64, 64, 3, Pattern(64, 64, 3, i), 90);
    }
    WriteAll(absl::StrCat(root, "/train/", wnid, "/", wnid, "_boxes.txt"),
             "boxes\n");
  }
  WriteJpeg(root + "/val/images/val_0.JPEG", 64, 64, 3, Pattern(64, 64, 3, 7));
  WriteJpeg(root + "/val/images/val_1.JPEG", 64, 64, 1, Pattern(64, 64, 1, 8));
  WriteAll(root + "/val/val_annotations.txt",
           "val_0.JPEG\tn02124075\t0\t32\t44\t62\n"
           "val_1.JPEG\tn01443537\t52\t55\t57\t59\n");
  WriteJpeg(root + "/test/images/test_0.JPEG", 64, 64, 3,
            Pattern(64, 64, 3, 9));  // unlabelled: not read
  ImageFolderOptions options;
  options.image_size = 32;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout, "tiny_imagenet");
  EXPECT_EQ(d->class_names,
            (std::vector<std::string>{"n01443537", "n02124075"}));
  EXPECT_EQ(d->train.count, 6);
  EXPECT_EQ(d->train.labels, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(d->train.chw[0], 3);
  EXPECT_EQ(d->train.chw[1], 32);
  EXPECT_EQ(d->test.count, 2);
  EXPECT_EQ(d->test.labels, (std::vector<int32_t>{1, 0}));

  // A class id missing from wnids.txt is named with its line.
  WriteAll(root + "/val/val_annotations.txt",
           "val_0.JPEG\tn02124075\t0\t32\t44\t62\nval_1.JPEG\tn09999999\n");
  d = ReadImageFolderDataset(root, options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("val_annotations.txt line 2: class "
                                      "n09999999 is not in"),
            std::string::npos)
      << d.status();
}

// A tree with an empty file, a truncated JPEG, a truncated PNG and a file
// that is not an image, among good ones.
std::string TreeWithBrokenFiles() {
  const std::string root = FreshDir("broken_tree");
  WriteJpeg(root + "/a/0.jpg", 16, 16, 3, Pattern(16, 16, 3, 0));
  WritePng(root + "/a/1.png", 16, 16, 3, Pattern(16, 16, 3, 1));
  WriteAll(root + "/a/2_empty.jpg", "");
  // Cut in the scan data: its header is whole.
  Truncate(root + "/a/0.jpg", root + "/b/0_truncated.jpg",
           ReadAll(root + "/a/0.jpg").size() - 40);
  WritePng(root + "/b/1.png", 16, 16, 3, Pattern(16, 16, 3, 2));
  Truncate(root + "/a/1.png", root + "/b/2_truncated.png", 100);
  WriteAll(root + "/b/3_text.png", "hello");
  WriteJpeg(root + "/b/4.jpg", 16, 16, 3, Pattern(16, 16, 3, 3));
  return root;
}

TEST(ImageFolderTest, SkipModeCountsBrokenFiles) {
  const std::string root = TreeWithBrokenFiles();
  ImageFolderOptions options;
  options.image_size = 16;
  options.bad_images = BadImages::kSkip;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 4);
  EXPECT_EQ(d->train.skipped, 4);
  EXPECT_EQ(d->train.labels, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(d->train.first_skipped, root + "/a/2_empty.jpg: empty file");
  // The kept images are the good ones, in order.
  const std::vector<uint8_t> last = Pattern(16, 16, 3, 3);
  EXPECT_NEAR(d->train.images[3 * 768], At(last, 16, 3, 0, 0, 0),
              (kJpegTolerance + 0.5f) / 255);
  const std::vector<uint8_t> b1 = Pattern(16, 16, 3, 2);
  EXPECT_EQ(d->train.images[2 * 768 + 17], At(b1, 16, 3, 1, 1, 0));

  // Through LoadDataset: the same images, standardised.
  DatasetOptions dataset_options;  // skips by default
  dataset_options.image_size = 16;
  absl::StatusOr<Dataset> loaded =
      LoadDataset("image_folder", root, dataset_options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->num_classes, 2);
  EXPECT_EQ(loaded->train.count, 4);
  EXPECT_EQ(loaded->train.chw, (Shape{3, 16, 16}));
  EXPECT_EQ(loaded->channel_mean.size(), 3u);
}

TEST(ImageFolderTest, FailModeNamesTheFirstBrokenFile) {
  const std::string root = TreeWithBrokenFiles();
  ImageFolderOptions options;
  options.image_size = 16;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(d.status().message()),
            root + "/a/2_empty.jpg: empty file");
  // Without it, the truncated JPEG (its header is whole: found when decoded).
  fs::remove(root + "/a/2_empty.jpg");
  d = ReadImageFolderDataset(root, options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(std::string(d.status().message()),
            root +
                "/b/0_truncated.jpg: corrupt JPEG (Premature end of JPEG "
                "file)");
  fs::remove(root + "/b/0_truncated.jpg");
  d = ReadImageFolderDataset(root, options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message().find(root + "/b/2_truncated.png: corrupt PNG"),
            0u)
      << d.status();
  // LoadDataset's error is one line.
  DatasetOptions fail;
  fail.image_size = 16;
  fail.bad_images = BadImages::kFail;
  absl::StatusOr<Dataset> loaded = LoadDataset("image_folder", root, fail);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(std::string(loaded.status().message()).find('\n'),
            std::string::npos);
}

TEST(ImageFolderTest, SkipModeWithNoReadableImageIsAnError) {
  const std::string root = FreshDir("all_bad");
  WriteAll(root + "/a/x.jpg", "nope");
  ImageFolderOptions options;
  options.bad_images = BadImages::kSkip;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("none of its 1 image files"),
            std::string::npos)
      << d.status();
}

TEST(ImageFolderTest, MissingEmptyAndUnknownFoldersAreOneLineErrors) {
  const std::string root = FreshDir("errors");
  absl::StatusOr<ImageFolderDataset> d =
      ReadImageFolderDataset(root + "/missing");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(d.status().message()),
            root + "/missing: no such folder");

  d = ReadImageFolderDataset(root);  // empty: no class folders
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message().find(root + ": unknown layout"), 0u)
      << d.status();

  WriteAll(root + "/cat/readme.txt", "no images here");
  d = ReadImageFolderDataset(root);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(d.status().message()),
            root + "/cat: no image files (*.jpg, *.jpeg, *.png)");

  const std::string split = FreshDir("errors_split");
  WritePng(split + "/train/cat/a.png", 4, 4, 1, Pattern(4, 4, 1, 0));
  WritePng(split + "/val/dog/a.png", 4, 4, 1, Pattern(4, 4, 1, 0));
  d = ReadImageFolderDataset(split);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("has no training folder"),
            std::string::npos)
      << d.status();

  ImageFolderOptions bad;
  bad.image_size = -1;
  EXPECT_EQ(ReadImageFolderDataset(split, bad).status().code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<Dataset> loaded = LoadDataset("image_folder", root + "/x");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
}

// Fashion-MNIST (Debian's dataset-fashion-mnist) written out as PNG class
// folders reads back as the IDX reader's pixels.
TEST(ImageFolderTest, FashionMnistAsPngMatchesIdx) {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  absl::StatusOr<IdxArray> images =
      ReadIdx(data + "/t10k-images-idx3-ubyte.gz");
  absl::StatusOr<IdxArray> labels =
      ReadIdx(data + "/t10k-labels-idx1-ubyte.gz");
  if (absl::IsNotFound(images.status())) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  }
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_TRUE(labels.ok()) << labels.status();
  const std::string root = FreshDir("fashion");
  constexpr int kTrain = 300, kTest = 100, kPixels = 28 * 28;
  for (int i = 0; i < kTrain + kTest; ++i) {
    const std::vector<uint8_t> pixels(images->data.begin() + i * kPixels,
                                      images->data.begin() + (i + 1) * kPixels);
    WritePng(absl::StrCat(root, i < kTrain ? "/train/" : "/test/",
                          static_cast<int>(labels->data[i]), "/",
                          absl::Dec(i, absl::kZeroPad5), ".png"),
             28, 28, 1, pixels);
  }
  ImageFolderOptions options;
  options.image_size = 28;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.chw[0], 1);
  ASSERT_EQ(d->train.count, kTrain);
  ASSERT_EQ(d->test.count, kTest);
  // Class folders "0".."9" sort as the labels; inside, by sample index.
  for (const auto& [split, begin, end] :
       {std::tuple(&d->train, 0, kTrain),
        std::tuple(&d->test, kTrain, kTrain + kTest)}) {
    int64_t k = 0;
    for (int label = 0; label < 10; ++label) {
      for (int i = begin; i < end; ++i) {
        if (labels->data[i] != label) continue;
        ASSERT_EQ(split->labels[k], label);
        for (int j = 0; j < kPixels; ++j) {
          // The IDX reader's expression, so equal to the bit.
          ASSERT_EQ(split->images[k * kPixels + j],
                    images->data[i * kPixels + j] * (1.0f / 255.0f))
              << "sample " << i << " pixel " << j;
        }
        ++k;
      }
    }
    EXPECT_EQ(k, end - begin);
  }
  DatasetOptions dataset_options;
  dataset_options.image_size = 28;
  absl::StatusOr<Dataset> loaded =
      LoadDataset("image_folder", root, dataset_options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->name, "image_folder");
  EXPECT_EQ(loaded->num_classes, 10);
  EXPECT_EQ(loaded->train.chw, (Shape{1, 28, 28}));
  EXPECT_EQ(loaded->test.count, kTest);
}

// Noise on a gradient: every column differs from its neighbours, so an
// upsampled chroma edge that were wrong would show.
std::vector<uint8_t> Noisy(int h, int w, int c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = static_cast<uint8_t>((i / c) % w * 200 / w + rng() % 56);
  }
  return p;
}

TEST(DecodeWindowTest, WindowEqualsTheSameWindowOfAFullDecode) {
  const std::string dir = FreshDir("window");
  struct Kind {
    const char* name;
    int c, hs, vs;
    bool progressive;
  };
  const std::vector<Kind> kinds = {
      {"420", 3, 2, 2, false},  {"422", 3, 2, 1, false},
      {"444", 3, 1, 1, false},  {"420_progressive", 3, 2, 2, true},
      {"gray", 1, 1, 1, false}, {"cmyk", 4, 1, 1, false}};
  std::mt19937 rng(7);
  int windows = 0;
  for (const Kind& k : kinds) {
    const int h = 77, w = 101;  // not multiples of an iMCU
    const std::string path = absl::StrCat(dir, "/", k.name, ".jpg");
    MakeDirs(path);
    testing::JpegLike like;
    like.quality = 85;
    like.h_samp = k.hs;
    like.v_samp = k.vs;
    like.progressive = k.progressive;
    testing::WriteJpegLike(path, h, w, k.c, Noisy(h, w, k.c, 3), like);
    absl::StatusOr<DecodedImage> full = DecodeImageFile(path);
    ASSERT_TRUE(full.ok()) << full.status();
    for (int trial = 0; trial < 60; ++trial) {
      PixelWindow want;
      want.height = 1 + static_cast<int>(rng() % h);
      want.width = 1 + static_cast<int>(rng() % w);
      want.top = static_cast<int>(rng() % (h - want.height + 1));
      want.left = static_cast<int>(rng() % (w - want.width + 1));
      if (trial == 0) want = {0, 0, h, w};
      if (trial == 1) want = {h - 1, w - 1, 1, 1};
      int asked_h = 0, asked_w = 0;
      PixelWindow got;
      absl::StatusOr<DecodedImage> part = DecodeImageFileWindow(
          path,
          [&](int ih, int iw) {
            asked_h = ih;
            asked_w = iw;
            return want;
          },
          &got);
      ASSERT_TRUE(part.ok()) << part.status();
      EXPECT_EQ(asked_h, h);
      EXPECT_EQ(asked_w, w);
      ASSERT_EQ(got.top, want.top);
      ASSERT_EQ(got.left, want.left);
      ASSERT_EQ(part->height, want.height);
      ASSERT_EQ(part->width, want.width);
      ASSERT_EQ(part->channels, full->channels);
      const int c = full->channels;
      int differ = 0;
      for (int y = 0; y < want.height; ++y) {
        for (int x = 0; x < want.width * c; ++x) {
          differ +=
              part->pixels[(static_cast<size_t>(y) * want.width) * c + x] !=
              full->pixels[(static_cast<size_t>(y + want.top) * w + want.left) *
                               c +
                           x];
        }
      }
      EXPECT_EQ(differ, 0) << k.name << " window " << want.height << " x "
                           << want.width << " at (" << want.top << ", "
                           << want.left << ")";
      ++windows;
    }
  }
  EXPECT_EQ(windows, 360);
}

TEST(DecodeWindowTest, PngIsDecodedWholeAndBadWindowsAreRefused) {
  const std::string dir = FreshDir("window_png");
  WritePng(dir + "/a.png", 20, 30, 3, Pattern(20, 30, 3, 1));
  WriteJpeg(dir + "/a.jpg", 20, 30, 3, Pattern(20, 30, 3, 1));
  PixelWindow got;
  absl::StatusOr<DecodedImage> png = DecodeImageFileWindow(
      dir + "/a.png",
      [](int, int) {
        return PixelWindow{2, 3, 4, 5};
      },
      &got);
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(got.top, 0);
  EXPECT_EQ(got.left, 0);
  EXPECT_EQ(got.height, 20);
  EXPECT_EQ(got.width, 30);
  EXPECT_EQ(png->pixels, Pattern(20, 30, 3, 1));
  for (const char* name : {"/a.png", "/a.jpg"}) {
    for (const PixelWindow& bad :
         {PixelWindow{0, 0, 0, 5}, PixelWindow{-1, 0, 2, 2},
          PixelWindow{19, 0, 2, 2}, PixelWindow{0, 29, 1, 2}}) {
      absl::StatusOr<DecodedImage> image = DecodeImageFileWindow(
          dir + name, [&](int, int) { return bad; }, &got);
      ASSERT_FALSE(image.ok()) << name;
      EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(image.status().message().find("expected a non-empty window "
                                              "inside the 20 x 30 image"),
                std::string::npos)
          << image.status();
    }
  }
}

TEST(DecodeWindowTest, DamageOutsideTheWindowIsStillFound) {
  const std::string dir = FreshDir("window_damage");
  MakeDirs(dir + "/a.jpg");
  testing::WriteJpegLike(dir + "/a.jpg", 96, 96, 3, Noisy(96, 96, 3, 5));
  // Cut in the bottom half of the entropy-coded data: the window's rows
  // (the top 8) are whole, the image is not.
  const std::string bytes = ReadAll(dir + "/a.jpg");
  Truncate(dir + "/a.jpg", dir + "/cut.jpg", bytes.size() * 3 / 4);
  PixelWindow got;
  absl::StatusOr<DecodedImage> image = DecodeImageFileWindow(
      dir + "/cut.jpg",
      [](int, int) {
        return PixelWindow{0, 8, 8, 16};
      },
      &got);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(image.status().message().find("cut.jpg: corrupt JPEG (Premature "
                                          "end"),
            std::string::npos)
      << image.status();
}

// image_size 0: every image keeps the size they all share, not square
// here, its pixels copied exactly (no resize).
TEST(ImageFolderTest, KeepsTheSizeEveryImageShares) {
  const std::string root = FreshDir("own_size");
  WritePng(root + "/a/1.png", 6, 4, 1, Pattern(6, 4, 1, 1));
  WritePng(root + "/b/1.png", 6, 4, 1, Pattern(6, 4, 1, 2));
  ImageFolderOptions options;
  options.image_size = 0;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->train.count, 2);
  EXPECT_EQ(d->train.chw[0], 1);
  EXPECT_EQ(d->train.chw[1], 6);
  EXPECT_EQ(d->train.chw[2], 4);
  const std::vector<uint8_t> second = Pattern(6, 4, 1, 2);
  for (int y = 0; y < 6; ++y) {
    for (int x = 0; x < 4; ++x) {
      EXPECT_EQ(d->train.images[24 + y * 4 + x], At(second, 4, 1, y, x, 0));
    }
  }
  absl::StatusOr<ImageFolderListing> listing = ListImageFolder(root, options);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(listing->height, 6);
  EXPECT_EQ(listing->width, 4);
}

// image_size 0 with two sizes: one line naming both and a file of each.
TEST(ImageFolderTest, MixedSizesWithoutImageSizeAreOneLineError) {
  const std::string root = FreshDir("mixed_size");
  WritePng(root + "/a/1.png", 4, 4, 1, Pattern(4, 4, 1, 1));
  WriteJpeg(root + "/a/2.jpg", 4, 4, 1, Pattern(4, 4, 1, 2));
  WriteJpeg(root + "/b/1.jpg", 5, 7, 3, Pattern(5, 7, 3, 3));
  ImageFolderOptions options;
  options.image_size = 0;
  for (const absl::Status& status :
       {ReadImageFolderDataset(root, options).status(),
        ListImageFolder(root, options).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(),
              absl::StrCat(root, ": images differ in size: 4x4 (", root,
                           "/a/1.png) and 7x5 (", root,
                           "/b/1.jpg); set --image_size to resize them all "
                           "to one size"));
  }
  options.image_size = 4;  // a size given: they are resized
  EXPECT_TRUE(ReadImageFolderDataset(root, options).ok());
}

TEST(ImageFolderTest, DecodedBytesAreFloatsOfEveryImage) {
  // Fashion-MNIST's 70,000 images at 224x224, as the OOM.
  EXPECT_EQ(DecodedImageBytes(70000, 1, 224, 224),
            int64_t{70000} * 224 * 224 * 4);
  EXPECT_EQ(DecodedImageBytes(70000, 1, 28, 28), 219520000);
  EXPECT_EQ(FormatBytes(DecodedImageBytes(70000, 1, 224, 224)), "14.05 GB");
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(1500), "1.50 kB");
  EXPECT_TRUE(CheckDecodedBytes("d", 10, 1, 2, 2, 160).ok());
  EXPECT_TRUE(CheckDecodedBytes("d", 10, 1, 2, 2, 0).ok());  // no limit
  const absl::Status over = CheckDecodedBytes("d", 10, 1, 2, 2, 159);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "d: decoding 10 images of 1x2x2 floats needs 160 B, over the "
            "limit of 159 B");
}

// The limit is checked from the headers before any pixel is decoded: a
// file whose pixels are damaged (its header whole) would fail the decode.
TEST(ImageFolderTest, MemoryLimitStopsBeforeDecoding) {
  const std::string root = FreshDir("memory_limit");
  WriteJpeg(root + "/a/1.jpg", 16, 16, 1, Pattern(16, 16, 1, 1));
  Truncate(root + "/a/1.jpg", root + "/b/1.jpg",
           ReadAll(root + "/a/1.jpg").size() - 40);
  ImageFolderOptions options;
  options.image_size = 0;
  EXPECT_EQ(ReadImageFolderDataset(root, options).status().code(),
            absl::StatusCode::kDataLoss);
  options.max_decoded_bytes = 2 * 16 * 16 * 4 - 1;
  absl::StatusOr<ImageFolderDataset> d = ReadImageFolderDataset(root, options);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(d.status().message().find("2 images of 1x16x16 floats needs "
                                      "2.05 kB, over the limit of 2.05 kB"),
            std::string::npos)
      << d.status();
}

// LoadDataset: headers only gives the shapes without pixels and still
// refuses a set over the limit, with the way out on the line.
TEST(ImageFolderTest, DatasetMemoryLimitNamesTheWayOut) {
  const std::string root = FreshDir("dataset_limit");
  for (int i = 0; i < 3; ++i) {
    WritePng(absl::StrCat(root, "/c", i % 2, "/", i, ".png"), 8, 8, 1,
             Pattern(8, 8, 1, i));
  }
  DatasetOptions options;  // image_size 0: the images' 8x8
  options.headers_only = true;
  absl::StatusOr<Dataset> listed = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->train.count, 3);
  EXPECT_EQ(listed->train.chw, (Shape{1, 8, 8}));
  EXPECT_TRUE(listed->train.images.empty());
  EXPECT_TRUE(listed->channel_mean.empty());
  EXPECT_EQ(listed->num_classes, 2);

  for (bool headers_only : {true, false}) {
    options.headers_only = headers_only;
    options.max_dataset_memory_bytes = 3 * 8 * 8 * 4 - 1;
    absl::StatusOr<Dataset> over = LoadDataset("image_folder", root, options);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(over.status().message(),
              absl::StrCat(root,
                           ": decoding 3 images of 1x8x8 floats needs 768 B, "
                           "over the limit of 767 B per worker "
                           "(--max_dataset_memory); "
                           "pass --stream_images to decode batches while "
                           "training, or a smaller --image_size"));
    options.max_dataset_memory_bytes = 3 * 8 * 8 * 4;
    EXPECT_TRUE(LoadDataset("image_folder", root, options).ok());
  }
  // Streaming decodes nothing up front: no limit applies.
  options.stream_images = true;
  options.max_dataset_memory_bytes = 1;
  EXPECT_TRUE(LoadDataset("image_folder", root, options).ok());
}

TEST(ImageFolderTest, MemAvailableIsHalvedForTheDefaultLimit) {
  absl::StatusOr<int64_t> bytes = ParseMemAvailable(
      "MemTotal:       24576000 kB\nMemFree:  100 kB\n"
      "MemAvailable:   20000000 kB\nBuffers: 1 kB\n");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, int64_t{20000000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemTotal: 1 kB\n").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots\n").status().code(),
            absl::StatusCode::kDataLoss);
  DatasetOptions options;
  absl::StatusOr<int64_t> limit = DatasetMemoryLimit(options);
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_GT(*limit, 0);
  options.max_dataset_memory_bytes = 12345;
  EXPECT_EQ(*DatasetMemoryLimit(options), 12345);
}

}  // namespace
}  // namespace pstrain
