#include "worker/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {
namespace {

// Reads exactly `n` bytes; false at a short read.
bool ReadExactly(gzFile f, void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
    const int got = gzread(f, p, chunk);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t BigEndian32(const unsigned char b[4]) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

// Finds "<dir>/<base>.gz" or "<dir>/<base>".
std::string FindFile(const std::string& dir, const std::string& base) {
  struct stat st;
  const std::string gz = absl::StrCat(dir, "/", base, ".gz");
  if (stat(gz.c_str(), &st) == 0) return gz;
  return absl::StrCat(dir, "/", base);
}

absl::StatusOr<LabeledImages> LoadSplit(const std::string& dir,
                                        const std::string& prefix,
                                        int num_classes) {
  const std::string images_path =
      FindFile(dir, absl::StrCat(prefix, "-images-idx3-ubyte"));
  const std::string labels_path =
      FindFile(dir, absl::StrCat(prefix, "-labels-idx1-ubyte"));
  absl::StatusOr<IdxArray> images = ReadIdx(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdx(labels_path);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() != 3) {
    return absl::DataLossError(absl::StrCat(
        images_path,
        ": expected an image file (magic 0x00000803, 3 dims), got ",
        images->dims.size(), " dims"));
  }
  if (labels->dims.size() != 1) {
    return absl::DataLossError(absl::StrCat(
        labels_path, ": expected a label file (magic 0x00000801, 1 dim), got ",
        labels->dims.size(), " dims"));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::DataLossError(absl::StrCat(
        images_path, " holds ", images->dims[0], " images but ", labels_path,
        " holds ", labels->dims[0], " labels; expected the same count"));
  }
  LabeledImages out;
  out.count = images->dims[0];
  out.chw = {1, images->dims[1], images->dims[2]};
  out.images.resize(images->data.size());
  for (size_t i = 0; i < images->data.size(); ++i) {
    out.images[i] = images->data[i] * (1.0f / 255.0f);
  }
  out.labels.resize(out.count);
  for (int64_t i = 0; i < out.count; ++i) {
    const int label = labels->data[i];
    if (label >= num_classes) {
      return absl::DataLossError(
          absl::StrCat(labels_path, ": label ", label, " of sample ", i,
                       " is outside [0, ", num_classes, ")"));
    }
    out.labels[i] = label;
  }
  return out;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no such file (expected an IDX file, gzipped or plain)"));
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoToStatus(errno, path);
  IdxArray out;
  absl::Status status;
  unsigned char header[4];
  if (!ReadExactly(f, header, 4)) {
    status = absl::DataLossError(
        absl::StrCat(path, ": truncated or corrupt (no IDX header)"));
  } else if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 ||
             header[3] < 1 || header[3] > 4) {
    status = absl::DataLossError(
        absl::StrCat(path, ": bad magic number 0x",
                     absl::Hex(BigEndian32(header), absl::kZeroPad8),
                     "; expected 0x00000801 (labels) or 0x00000803 (images)"));
  } else {
    int64_t total = 1;
    for (int d = 0; d < header[3]; ++d) {
      unsigned char dim[4];
      if (!ReadExactly(f, dim, 4)) {
        status = absl::DataLossError(
            absl::StrCat(path, ": truncated or corrupt IDX header"));
        break;
      }
      const int64_t size = BigEndian32(dim);
      if (size <= 0 || size > (int64_t{1} << 31)) {
        status = absl::DataLossError(
            absl::StrCat(path, ": dimension ", d, " is ", size,
                         "; expected between 1 and 2^31"));
        break;
      }
      out.dims.push_back(size);
      total *= size;
      if (total > (int64_t{1} << 34)) {
        status = absl::DataLossError(
            absl::StrCat(path, ": more than 2^34 bytes of data declared"));
        break;
      }
    }
    if (status.ok()) {
      out.data.resize(total);
      if (!ReadExactly(f, out.data.data(), out.data.size())) {
        status = absl::DataLossError(
            absl::StrCat(path, ": truncated or corrupt; expected ", total,
                         " bytes of data after the header"));
      } else {
        char extra;
        if (gzread(f, &extra, 1) != 0) {
          status = absl::DataLossError(
              absl::StrCat(path, ": trailing bytes after the ", total,
                           " bytes the header declares"));
        }
      }
    }
  }
  gzclose(f);
  if (!status.ok()) return status;
  return out;
}

std::string KnownDatasets() { return "fashion_mnist, mnist"; }

absl::StatusOr<Dataset> LoadDataset(const std::string& name,
                                    const std::string& data_dir) {
  if (name != "fashion_mnist" && name != "mnist") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown dataset \"", name, "\"; expected one of: ", KnownDatasets()));
  }
  Dataset dataset;
  dataset.name = name;
  dataset.num_classes = 10;
  absl::StatusOr<LabeledImages> train = LoadSplit(data_dir, "train", 10);
  if (!train.ok()) return train.status();
  absl::StatusOr<LabeledImages> test = LoadSplit(data_dir, "t10k", 10);
  if (!test.ok()) return test.status();
  if (train->chw != test->chw) {
    return absl::DataLossError(
        absl::StrCat(data_dir, ": train and test images differ in size"));
  }
  // Standardise both splits with the training set's pixel mean and standard
  // deviation (as torchvision's Normalize with the dataset's statistics).
  double sum = 0, sum_sq = 0;
  for (float x : train->images) {
    sum += x;
    sum_sq += double{x} * x;
  }
  const double n =
      static_cast<double>(std::max<size_t>(train->images.size(), 1));
  const double mean = sum / n;
  const double stddev = std::sqrt(std::max(sum_sq / n - mean * mean, 1e-12));
  for (LabeledImages* split : {&*train, &*test}) {
    for (float& x : split->images) {
      x = static_cast<float>((x - mean) / stddev);
    }
  }
  dataset.train = *std::move(train);
  dataset.test = *std::move(test);
  dataset.pixel_mean = mean;
  dataset.pixel_stddev = stddev;
  return dataset;
}

ShardedSampler::ShardedSampler(int64_t num_samples, int worker_id,
                               int num_workers, uint64_t seed)
    : num_samples_(num_samples),
      worker_id_(worker_id),
      num_workers_(num_workers),
      seed_(seed) {}

std::vector<int64_t> ShardedSampler::EpochIndices(int epoch) const {
  std::vector<int64_t> order(num_samples_);
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with an explicit generator, so every process (and every
  // standard library) derives the same permutation.
  std::mt19937_64 rng(seed_ * 1000003ull + static_cast<uint64_t>(epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const int64_t j =
        static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  std::vector<int64_t> mine;
  mine.reserve(samples_per_worker());
  for (int64_t k = 0; k < samples_per_worker(); ++k) {
    mine.push_back(order[worker_id_ + k * num_workers_]);
  }
  return mine;
}

void GatherBatch(const LabeledImages& source,
                 const std::vector<int64_t>& indices, size_t begin, size_t n,
                 Tensor* images, std::vector<int32_t>* labels) {
  const int64_t per = NumElements(source.chw);
  images->Resize(
      {static_cast<int64_t>(n), source.chw[0], source.chw[1], source.chw[2]});
  labels->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = indices[begin + i];
    std::memcpy(&images->data[i * per], &source.images[s * per],
                per * sizeof(float));
    (*labels)[i] = source.labels[s];
  }
}

}  // namespace pstrain
