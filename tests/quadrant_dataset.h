// A learnable synthetic dataset for tests that train: 28x28x1 images whose
// label (0..3 of 10 classes) is the brightest quadrant, on uniform noise in
// [0, 0.5) with 0.5 added to that quadrant. Deterministic for a seed.
#ifndef PSTRAIN_TESTS_QUADRANT_DATASET_H_
#define PSTRAIN_TESTS_QUADRANT_DATASET_H_

#include <cstdint>
#include <random>

#include "worker/dataset.h"

namespace pstrain {
namespace testing {

inline Dataset MakeQuadrantDataset(int64_t train_count, int64_t test_count,
                                   uint64_t seed) {
  Dataset d;
  d.name = "synthetic";
  d.num_classes = 10;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.5f);
  for (LabeledImages* split : {&d.train, &d.test}) {
    split->chw = {1, 28, 28};
    split->count = split == &d.train ? train_count : test_count;
    split->stored = split->count;
    split->images.resize(split->count * 784);
    split->labels.resize(split->count);
    for (int64_t i = 0; i < split->count; ++i) {
      const int label = static_cast<int>(rng() % 4);
      split->labels[i] = label;
      for (int y = 0; y < 28; ++y) {
        for (int x = 0; x < 28; ++x) {
          const int quadrant = (y >= 14) * 2 + (x >= 14);
          split->images[i * 784 + y * 28 + x] =
              noise(rng) + (quadrant == label ? 0.5f : 0.0f);
        }
      }
    }
  }
  return d;
}

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_TESTS_QUADRANT_DATASET_H_
