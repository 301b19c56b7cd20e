#include "tools/bigmnist.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
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

constexpr const char* kIdxNames[] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// A source folder `in` (made): `count` training digits with labels i % 10,
// and the first 5 of them as the test set. Its training pixels and labels.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> WriteSource(
    const std::string& in, int count) {
  ::mkdir(in.c_str(), 0755);
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < count; ++i) {
    const std::vector<uint8_t> d = Digit(i);
    pixels.insert(pixels.end(), d.begin(), d.end());
    labels.push_back(i % 10);
  }
  const uint32_t n = static_cast<uint32_t>(count);
  WriteIdx(in + "/train-images-idx3-ubyte", {n, 28, 28}, pixels);
  WriteIdx(in + "/train-labels-idx1-ubyte", {n}, labels);
  WriteIdx(in + "/t10k-images-idx3-ubyte", {5, 28, 28},
           std::vector<uint8_t>(pixels.begin(), pixels.begin() + 5 * 784));
  WriteIdx(in + "/t10k-labels-idx1-ubyte", {5},
           std::vector<uint8_t>(labels.begin(), labels.begin() + 5));
  return {pixels, labels};
}

TEST(WriteBigMnistTest, LabelsKeptOutputReadableAndThreadCountFree) {
  const std::string in = TempDir() + "/bigmnist_in";
  constexpr int kCount = 20;
  const auto [pixels, labels] = WriteSource(in, kCount);
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

// An output that would replace the source is refused before anything is
// read or written: the input folder however spelled, or an output file that
// is an input file by another name. A link at an output name to anything
// else is replaced by the new file, never written through.
TEST(WriteBigMnistTest, NeverReplacesTheSource) {
  const std::string in = TempDir() + "/bigmnist_source";
  WriteSource(in, 20);
  std::vector<std::string> before;
  for (const char* name : kIdxNames) before.push_back(ReadAll(in + "/" + name));
  auto source_unchanged = [&](const std::string& why) {
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(ReadAll(in + "/" + kIdxNames[i]) == before[i])
          << why << ": " << kIdxNames[i] << " changed";
    }
  };
  BigMnistOptions o;
  o.input_dir = in;
  o.copies = 2;
  const std::string link = TempDir() + "/bigmnist_source_link";
  ASSERT_EQ(::symlink(in.c_str(), link.c_str()), 0);
  for (const std::string& out : {in, in + "/", in + "/./", link}) {
    o.output_dir = out;
    const absl::Status s = WriteBigMnist(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << out;
    EXPECT_EQ(std::string(s.message())
                  .rfind("--output_dir=" + out +
                             ": the same folder as --input_dir=" + in,
                         0),
              0u)
        << s;
    source_unchanged(out);
  }
  // An output file that is an input file: a hard link, a symbolic one.
  const std::string hard = TempDir() + "/bigmnist_hard";
  const std::string soft = TempDir() + "/bigmnist_soft";
  ::mkdir(hard.c_str(), 0755);
  ::mkdir(soft.c_str(), 0755);
  ASSERT_EQ(::link((in + "/train-images-idx3-ubyte").c_str(),
                   (hard + "/train-images-idx3-ubyte").c_str()),
            0);
  ASSERT_EQ(::symlink((in + "/t10k-labels-idx1-ubyte").c_str(),
                      (soft + "/t10k-labels-idx1-ubyte").c_str()),
            0);
  for (const auto& [out, name] :
       {std::pair<std::string, std::string>{hard, "train-images-idx3-ubyte"},
        {soft, "t10k-labels-idx1-ubyte"}}) {
    o.output_dir = out;
    const absl::Status s = WriteBigMnist(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << out;
    EXPECT_NE(s.message().find("--output_dir=" + out + ": its " + name +
                               " is the input " + in + "/" + name),
              std::string::npos)
        << s;
    source_unchanged(out);
  }
  // A link to another file at an output name: replaced, not written through;
  // no temporary file left.
  const std::string over = TempDir() + "/bigmnist_over_link";
  const std::string victim = TempDir() + "/bigmnist_victim";
  ::mkdir(over.c_str(), 0755);
  WriteIdx(victim, {1}, {7});
  const std::string victim_bytes = ReadAll(victim);
  ASSERT_EQ(
      ::symlink(victim.c_str(), (over + "/train-labels-idx1-ubyte").c_str()),
      0);
  o.output_dir = over;
  ASSERT_TRUE(WriteBigMnist(o).ok());
  EXPECT_TRUE(ReadAll(victim) == victim_bytes) << victim << " written through";
  for (const char* name : kIdxNames) {
    struct stat st;
    ASSERT_EQ(::lstat((over + "/" + name).c_str(), &st), 0) << name;
    EXPECT_TRUE(S_ISREG(st.st_mode)) << name;
    EXPECT_NE(::lstat((over + "/" + name + ".tmp").c_str(), &st), 0) << name;
  }
  source_unchanged("after a good run");
}

}  // namespace
}  // namespace pstrain
