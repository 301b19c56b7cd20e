#include "tools/bigmnist.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/dataset.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A 28x28 "digit": a thick ring or bar, varying with i.
std::vector<uint8_t> Digit(int i) {
  std::vector<uint8_t> img(784, 0);
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x) {
      const double r = std::hypot(x - 13.5, y - 13.5);
      const bool on = i % 2 == 0
                          ? (r > 6 + i % 3 && r < 10 + i % 3)
                          : (std::abs(x - 10 - i % 7) < 3 && y > 4 && y < 24);
      if (on) img[y * 28 + x] = static_cast<uint8_t>(200 + (x + y + i) % 56);
    }
  }
  return img;
}

double Correlation(const std::vector<uint8_t>& a,
                   const std::vector<uint8_t>& b) {
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += a[i], mb += b[i];
  ma /= a.size();
  mb /= b.size();
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

TEST(DeformImageTest, DeterministicForASeedCloseToTheSourceButNotEqual) {
  const DeformOptions options;
  double min_corr = 1.0, sum_corr = 0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<uint8_t> src = Digit(i);
    std::vector<uint8_t> a(784), b(784), c(784);
    DeformImage(src.data(), 28, 28, options, 1000 + i, a.data());
    DeformImage(src.data(), 28, 28, options, 1000 + i, b.data());
    DeformImage(src.data(), 28, 28, options, 5000 + i, c.data());
    EXPECT_EQ(a, b) << "image " << i;
    EXPECT_NE(a, c) << "image " << i;
    EXPECT_NE(a, src) << "image " << i;
    const double corr = Correlation(a, src);
    min_corr = std::min(min_corr, corr);
    sum_corr += corr;
  }
  // Small deformations: every image still resembles its source (Pearson
  // correlation of the pixels; 200 Fashion-MNIST images give min 0.20, mean
  // 0.66 with these options, thin shapes less).
  EXPECT_GT(min_corr, 0.1);
  EXPECT_GT(sum_corr / 40, 0.45);
  EXPECT_LT(sum_corr / 40, 0.99);
}

TEST(DeformImageTest, NoDeformationIsTheIdentity) {
  DeformOptions none;
  none.max_rotation_deg = none.max_scale = none.max_shear = 0;
  none.max_translation_px = none.elastic_alpha = none.elastic_sigma = 0;
  const std::vector<uint8_t> src = Digit(3);
  std::vector<uint8_t> out(784);
  DeformImage(src.data(), 28, 28, none, 7, out.data());
  EXPECT_EQ(out, src);
}

void WriteIdx(const std::string& path, const std::vector<uint32_t>& dims,
              const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = {0, 0, 8, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back((d >> s) & 0xff);
  }
  b.insert(b.end(), data.begin(), data.end());
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

std::string ReadAll(const std::string& path) {
  std::string s;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

TEST(WriteBigMnistTest, LabelsKeptOutputReadableAndThreadCountFree) {
  const std::string in = TempDir() + "/bigmnist_in";
  ::mkdir(in.c_str(), 0755);
  constexpr int kCount = 20;
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < kCount; ++i) {
    const std::vector<uint8_t> d = Digit(i);
    pixels.insert(pixels.end(), d.begin(), d.end());
    labels.push_back(i % 10);
  }
  WriteIdx(in + "/train-images-idx3-ubyte", {kCount, 28, 28}, pixels);
  WriteIdx(in + "/train-labels-idx1-ubyte", {kCount}, labels);
  WriteIdx(in + "/t10k-images-idx3-ubyte", {5, 28, 28},
           std::vector<uint8_t>(pixels.begin(), pixels.begin() + 5 * 784));
  WriteIdx(in + "/t10k-labels-idx1-ubyte", {5},
           std::vector<uint8_t>(labels.begin(), labels.begin() + 5));
  BigMnistOptions o;
  o.input_dir = in;
  o.copies = 3;
  o.include_originals = true;
  o.seed = 9;
  o.threads = 1;
  o.output_dir = TempDir() + "/bigmnist_1";
  ASSERT_TRUE(WriteBigMnist(o).ok());
  o.threads = 4;
  o.output_dir = TempDir() + "/bigmnist_4";
  ASSERT_TRUE(WriteBigMnist(o).ok());
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}) {
    const std::string one = ReadAll(TempDir() + "/bigmnist_1/" + f);
    EXPECT_FALSE(one.empty());
    EXPECT_EQ(one, ReadAll(TempDir() + "/bigmnist_4/" + f)) << f;
  }
  absl::StatusOr<IdxArray> images =
      ReadIdx(TempDir() + "/bigmnist_1/train-images-idx3-ubyte");
  absl::StatusOr<IdxArray> out_labels =
      ReadIdx(TempDir() + "/bigmnist_1/train-labels-idx1-ubyte");
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_TRUE(out_labels.ok()) << out_labels.status();
  EXPECT_EQ(images->dims, (std::vector<int64_t>{3 * kCount, 28, 28}));
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < kCount; ++i) {
      EXPECT_EQ(out_labels->data[k * kCount + i], labels[i]);
      const std::vector<uint8_t> got(
          images->data.begin() + (k * kCount + i) * 784,
          images->data.begin() + (k * kCount + i + 1) * 784);
      const std::vector<uint8_t> src(pixels.begin() + i * 784,
                                     pixels.begin() + (i + 1) * 784);
      if (k == 0) {
        EXPECT_EQ(got, src);
      } else {
        EXPECT_NE(got, src);
        EXPECT_GT(Correlation(got, src), 0.1);
      }
    }
  }
  // The worker's reader takes it (mapped) with the test set unchanged.
  absl::StatusOr<Dataset> d = LoadDataset("mnist", TempDir() + "/bigmnist_1");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 3 * kCount);
  EXPECT_EQ(d->test.count, 5);
  EXPECT_NE(d->train.mapped, nullptr);
  EXPECT_EQ(d->train.label(2 * kCount + 7), labels[7]);

  o.copies = 0;
  EXPECT_EQ(WriteBigMnist(o).code(), absl::StatusCode::kInvalidArgument);
  o.copies = 1;
  o.input_dir = TempDir() + "/no_such_dir";
  EXPECT_EQ(WriteBigMnist(o).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pstrain
