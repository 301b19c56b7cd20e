// Lazy Adam against fixed vectors from PyTorch 1.13's torch.optim.SparseAdam
// (testdata/gen_sparse_adam_fixture.py): bit for bit on the touched rows'
// weights and moments, and every untouched row's w, m and v as the
// reference leaves them (unchanged).
#include "optim/sparse_adam.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::vector<float> ReadFloats(std::istringstream& in) {
  std::vector<float> out;
  double x;
  while (in >> x) out.push_back(static_cast<float>(x));
  return out;
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Counts elements whose bits differ, printing the first few.
int CountMismatches(const std::vector<float>& got,
                    const std::vector<float>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int wrong = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (Bits(got[i]) == Bits(want[i])) continue;
    if (++wrong <= 3) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs "
                    << want[i];
    }
  }
  return wrong;
}

TEST(SparseAdamTest, MatchesPyTorchSparseAdamBitForBit) {
  std::ifstream file("testdata/sparse_adam_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/sparse_adam_fixture.txt";
  std::string line, name;
  int cases = 0, checked = 0;
  int64_t d = 0;
  AdamOptions options;
  std::vector<float> w, m, v, w_before;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    int step = 0;
    in >> tag;
    if (tag == "case") {
      int rows, steps;
      double lr, b1, b2, eps;
      in >> name >> lr >> b1 >> b2 >> eps >> rows >> d >> steps;
      options =
          AdamOptions{static_cast<float>(lr), static_cast<float>(b1),
                      static_cast<float>(b2), static_cast<float>(eps), 0.0f};
      ++cases;
    } else if (tag == "w0") {
      w = ReadFloats(in);
      m.assign(w.size(), 0.0f);
      v.assign(w.size(), 0.0f);
    } else if (tag == "g") {
      int k;
      in >> step >> k;
      std::vector<uint32_t> rows(k);
      for (int i = 0; i < k; ++i) in >> rows[i];
      const std::vector<float> values = ReadFloats(in);
      ASSERT_EQ(values.size(), static_cast<size_t>(k * d));
      w_before = w;
      EXPECT_TRUE(SparseAdamRows(options, step, d, rows, values.data(),
                                 w.data(), m.data(), v.data()));
    } else if (tag == "w" || tag == "m" || tag == "v") {
      in >> step;
      const std::vector<float>& got = tag == "w" ? w : tag == "m" ? m : v;
      EXPECT_EQ(0, CountMismatches(
                       got, ReadFloats(in),
                       name + " step " + std::to_string(step) + " " + tag));
      ++checked;
    }
  }
  EXPECT_EQ(cases, 3);
  EXPECT_EQ(checked, 3 * 7 * 3);
}

TEST(SparseAdamTest, UntouchedRowsKeepEveryBit) {
  AdamOptions options;
  options.lr = 0.05f;
  const int64_t d = 3;
  std::vector<float> w = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<float> m(9, 0.25f), v(9, 0.5f);
  const std::vector<uint32_t> rows = {1};
  const std::vector<float> g = {0.1f, -0.2f, 0.0f};
  ASSERT_TRUE(SparseAdamRows(options, 3, d, rows, g.data(), w.data(), m.data(),
                             v.data()));
  for (int i : {0, 1, 2, 6, 7, 8}) {
    EXPECT_EQ(w[i], static_cast<float>(i + 1));
    EXPECT_EQ(m[i], 0.25f);
    EXPECT_EQ(v[i], 0.5f);
  }
  // A touched element whose gradient is 0 still decays its moments.
  EXPECT_LT(m[5], 0.25f);
  EXPECT_LT(v[5], 0.5f);
  EXPECT_NE(w[5], 6.0f);
}

TEST(SparseAdamTest, ReportsANonFiniteWeight) {
  AdamOptions options;
  options.lr = 3e38f;  // moves the weight by ~3e38 upwards
  std::vector<float> w = {3e38f}, m = {0}, v = {0};
  const std::vector<uint32_t> rows = {0};
  const std::vector<float> g = {-1.0f};
  EXPECT_FALSE(SparseAdamRows(options, 1, 1, rows, g.data(), w.data(), m.data(),
                              v.data()));
}

}  // namespace
}  // namespace pstrain
