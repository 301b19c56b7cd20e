// Test helper: reads the PyTorch layer fixtures in testdata/
// (gen_layers_fixture.py, gen_transformer_fixture.py): "case NAME", then
// lines "TAG n v1 ... vn", then "end".
#ifndef PSTRAIN_MODELS_LAYER_FIXTURE_H_
#define PSTRAIN_MODELS_LAYER_FIXTURE_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {

struct FixtureCase {
  std::string name;
  // Tag ("input", "param:weight", "grad:bias", ...) -> values.
  std::map<std::string, std::vector<float>> values;
};

// The cases of the fixture at `path` (relative to the test's runfiles
// root); a missing file fails the test and gives no cases.
inline std::vector<FixtureCase> ReadLayerFixture(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << "missing " << path;
  std::vector<FixtureCase> cases;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "case") {
      cases.emplace_back();
      in >> cases.back().name;
    } else if (!tag.empty() && tag != "end" && !cases.empty()) {
      int64_t n = 0;
      in >> n;
      std::vector<float> v(n);
      for (float& x : v) in >> x;
      cases.back().values[tag] = v;
    }
  }
  return cases;
}

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_LAYER_FIXTURE_H_
