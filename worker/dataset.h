// Datasets for the workers: the IDX format of MNIST and Fashion-MNIST
// (LeCun's format: big-endian magic 0x00000801 for labels, 0x00000803 for
// images, then the dimensions, then unsigned bytes), read gzipped or plain
// through zlib; and the sharded sampler.
//
// Thread-compatible: a loaded Dataset is immutable and may be shared.
#ifndef PSTRAIN_WORKER_DATASET_H_
#define PSTRAIN_WORKER_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tensor.h"

namespace pstrain {

// One IDX file: its dimensions and its unsigned-byte payload.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads `path` (gzip or plain). Errors name the file and what was expected:
// NOT_FOUND if missing; DATA_LOSS for a bad magic number, a truncated or
// corrupt file, or trailing bytes.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);

// Images [N, C, H, W] and labels in [0, num_classes). LoadDataset scales
// pixels to [0, 1] (as torchvision's ToTensor), then standardises them with
// the training set's mean and standard deviation (as Normalize).
struct LabeledImages {
  Shape chw;
  int64_t count = 0;
  std::vector<float> images;  // count * C * H * W
  std::vector<int32_t> labels;
};

struct Dataset {
  std::string name;
  int num_classes = 0;
  LabeledImages train;
  LabeledImages test;
  // Statistics of the training pixels in [0, 1], used to standardise both
  // splits (Fashion-MNIST: 0.2860 and 0.3530).
  double pixel_mean = 0;
  double pixel_stddev = 1;
};

// "fashion_mnist" or "mnist" from `data_dir` (train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz], t10k-...). INVALID_ARGUMENT for an unknown
// dataset name; the ReadIdx errors, and DATA_LOSS when images and labels
// disagree in count or a label is out of range.
absl::StatusOr<Dataset> LoadDataset(const std::string& name,
                                    const std::string& data_dir);

std::string KnownDatasets();

// Splits each epoch's shuffled order of the training set among workers the
// way PyTorch's DistributedSampler does: worker w of W takes positions
// w, w + W, w + 2W, ... of the permutation. So batch i of every worker with
// batch size b together holds exactly batch i of one worker with batch W*b:
// the invariant sync mode relies on. Each worker gets floor(N / W) samples,
// so every worker runs the same number of steps.
class ShardedSampler {
 public:
  ShardedSampler(int64_t num_samples, int worker_id, int num_workers,
                 uint64_t seed);
  // The sample indices of `worker_id` for `epoch`, in training order.
  std::vector<int64_t> EpochIndices(int epoch) const;
  int64_t samples_per_worker() const { return num_samples_ / num_workers_; }

 private:
  const int64_t num_samples_;
  const int worker_id_;
  const int num_workers_;
  const uint64_t seed_;
};

// Copies samples `indices` of `source` into a batch tensor [n, C, H, W] and
// labels.
void GatherBatch(const LabeledImages& source,
                 const std::vector<int64_t>& indices, size_t begin, size_t n,
                 Tensor* images, std::vector<int32_t>* labels);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATASET_H_
