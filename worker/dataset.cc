#include "worker/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/image_folder.h"

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
  out.stored = out.count;
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

namespace {
// Sorted; LoadDataset() reads each.
constexpr const char* kDatasets[] = {"cifar10", "fashion_mnist", "image_folder",
                                     "mnist", "synthetic"};
}  // namespace

std::string KnownDatasets() { return absl::StrJoin(kDatasets, ", "); }

bool IsKnownDataset(const std::string& name) {
  return std::find(std::begin(kDatasets), std::end(kDatasets), name) !=
         std::end(kDatasets);
}

absl::StatusOr<LabeledImages> ReadCifarBatch(const std::string& path) {
  constexpr int64_t kRecord = 1 + 3 * 32 * 32;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (st.st_size <= 0 || st.st_size % kRecord != 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", st.st_size, " bytes; expected a positive multiple of ",
        kRecord, " (CIFAR-10 records of 1 label byte and 3072 pixels)"));
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  std::vector<uint8_t> raw(st.st_size);
  const bool ok = ReadExactly(f, raw.data(), raw.size());
  gzclose(f);
  if (!ok) return absl::DataLossError(absl::StrCat(path, ": short read"));
  LabeledImages out;
  out.chw = {3, 32, 32};
  out.count = out.stored = st.st_size / kRecord;
  out.images.resize(out.count * 3072);
  out.labels.resize(out.count);
  for (int64_t i = 0; i < out.count; ++i) {
    const uint8_t* rec = &raw[i * kRecord];
    if (rec[0] >= 10) {
      return absl::DataLossError(absl::StrCat(
          path, ": record ", i, " has label ", rec[0], "; expected 0..9"));
    }
    out.labels[i] = rec[0];
    for (int j = 0; j < 3072; ++j) {
      out.images[i * 3072 + j] = rec[1 + j] / 255.0f;
    }
  }
  return out;
}

namespace {

absl::StatusOr<Dataset> LoadCifar10(const std::string& dir) {
  Dataset dataset;
  dataset.num_classes = 10;
  dataset.train.chw = {3, 32, 32};
  for (int b = 1; b <= 5; ++b) {
    absl::StatusOr<LabeledImages> batch =
        ReadCifarBatch(absl::StrCat(dir, "/data_batch_", b, ".bin"));
    if (!batch.ok()) return batch.status();
    LabeledImages& train = dataset.train;
    train.images.insert(train.images.end(), batch->images.begin(),
                        batch->images.end());
    train.labels.insert(train.labels.end(), batch->labels.begin(),
                        batch->labels.end());
    train.count += batch->count;
  }
  dataset.train.stored = dataset.train.count;
  absl::StatusOr<LabeledImages> test =
      ReadCifarBatch(absl::StrCat(dir, "/test_batch.bin"));
  if (!test.ok()) return test.status();
  dataset.test = *std::move(test);
  dataset.augment = true;
  return dataset;
}

LabeledImages FromImageFolderSplit(ImageFolderSplit split) {
  LabeledImages out;
  out.chw = {split.chw[0], split.chw[1], split.chw[2]};
  out.count = out.stored = split.count;
  out.images = std::move(split.images);
  out.labels = std::move(split.labels);
  return out;
}

absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir,
                                        const DatasetOptions& o) {
  ImageFolderOptions options;
  options.image_size = o.image_size;
  options.bad_images = o.bad_images;
  ASSIGN_OR_RETURN(ImageFolderDataset folder,
                   ReadImageFolderDataset(dir, options));
  const int64_t skipped = folder.train.skipped + folder.test.skipped;
  if (skipped > 0) {
    const std::string& first = folder.train.first_skipped.empty()
                                   ? folder.test.first_skipped
                                   : folder.train.first_skipped;
    std::fprintf(stderr,
                 "warning: image_folder %s: skipped %lld of %lld images that "
                 "could not be read; the first: %s\n",
                 dir.c_str(), static_cast<long long>(skipped),
                 static_cast<long long>(skipped + folder.train.count +
                                        folder.test.count),
                 first.c_str());
  }
  Dataset dataset;
  dataset.num_classes = static_cast<int>(folder.class_names.size());
  dataset.train = FromImageFolderSplit(std::move(folder.train));
  dataset.test = FromImageFolderSplit(std::move(folder.test));
  return dataset;
}

absl::StatusOr<Dataset> MakeSynthetic(const DatasetOptions& o) {
  if (o.image_size < 1 || o.channels < 1 || o.num_classes < 2 ||
      o.train_samples < 1 || o.test_samples < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic data: image_size ", o.image_size, ", channels ", o.channels,
        ", num_classes ", o.num_classes, ", samples ", o.train_samples, "/",
        o.test_samples,
        "; expected sizes >= 1, num_classes >= 2 and samples >= 1"));
  }
  Dataset dataset;
  dataset.num_classes = o.num_classes;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  auto make = [&](int64_t count, LabeledImages* split) {
    constexpr int64_t kPool = 64;
    split->chw = {o.channels, o.image_size, o.image_size};
    split->count = count;
    split->stored = std::min(count, kPool);
    split->images.resize(split->stored * NumElements(split->chw));
    for (float& x : split->images) x = pixel(rng);
    split->labels.resize(count);
    for (int32_t& y : split->labels) {
      y = static_cast<int32_t>(rng() % static_cast<uint64_t>(o.num_classes));
    }
  };
  make(o.train_samples, &dataset.train);
  make(o.test_samples, &dataset.test);
  return dataset;
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const std::string& name,
                                    const std::string& data_dir,
                                    const DatasetOptions& options) {
  absl::StatusOr<Dataset> loaded;
  if (name == "fashion_mnist" || name == "mnist") {
    Dataset dataset;
    dataset.num_classes = 10;
    absl::StatusOr<LabeledImages> train = LoadSplit(data_dir, "train", 10);
    if (!train.ok()) return train.status();
    absl::StatusOr<LabeledImages> test = LoadSplit(data_dir, "t10k", 10);
    if (!test.ok()) return test.status();
    dataset.train = *std::move(train);
    dataset.test = *std::move(test);
    loaded = std::move(dataset);
  } else if (name == "cifar10") {
    loaded = LoadCifar10(data_dir);
  } else if (name == "image_folder") {
    loaded = LoadImageFolder(data_dir, options);
  } else if (name == "synthetic") {
    loaded = MakeSynthetic(options);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown dataset \"", name, "\"; expected one of: ", KnownDatasets()));
  }
  if (!loaded.ok()) return loaded.status();
  Dataset& dataset = *loaded;
  dataset.name = name;
  if (dataset.train.chw != dataset.test.chw) {
    return absl::DataLossError(
        absl::StrCat(data_dir, ": train and test images differ in size"));
  }
  // Standardise both splits with the training set's per-channel mean and
  // standard deviation (as torchvision's Normalize with the dataset's
  // statistics).
  const int64_t channels = dataset.train.chw[0];
  const int64_t plane = dataset.train.chw[1] * dataset.train.chw[2];
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < dataset.train.stored; ++i) {
      const float* p = &dataset.train.images[(i * channels + c) * plane];
      for (int64_t j = 0; j < plane; ++j) {
        sum += p[j];
        sum_sq += double{p[j]} * p[j];
      }
    }
    const double n =
        static_cast<double>(std::max<int64_t>(dataset.train.stored * plane, 1));
    const double mean = sum / n;
    const double stddev = std::sqrt(std::max(sum_sq / n - mean * mean, 1e-12));
    dataset.channel_mean.push_back(mean);
    dataset.channel_stddev.push_back(stddev);
    for (LabeledImages* split : {&dataset.train, &dataset.test}) {
      for (int64_t i = 0; i < split->stored; ++i) {
        float* p = &split->images[(i * channels + c) * plane];
        for (int64_t j = 0; j < plane; ++j) {
          p[j] = static_cast<float>((p[j] - mean) / stddev);
        }
      }
    }
  }
  return loaded;
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
                 Tensor* images, std::vector<int32_t>* labels,
                 std::mt19937_64* augment) {
  const int64_t c = source.chw[0], h = source.chw[1], w = source.chw[2];
  const int64_t per = c * h * w;
  images->Resize({static_cast<int64_t>(n), c, h, w});
  labels->resize(n);
  constexpr int kPad = 4;
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = indices[begin + i];
    const float* src = &source.images[(s % source.stored) * per];
    float* dst = &images->data[i * per];
    (*labels)[i] = source.labels[s];
    if (augment == nullptr) {
      std::memcpy(dst, src, per * sizeof(float));
      continue;
    }
    // Crop offset in [-4, 4] of the padded image, and a coin for the flip.
    const int dy = static_cast<int>((*augment)() % (2 * kPad + 1)) - kPad;
    const int dx = static_cast<int>((*augment)() % (2 * kPad + 1)) - kPad;
    const bool flip = ((*augment)() & 1) != 0;
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t y = 0; y < h; ++y) {
        const int64_t sy = y + dy;
        float* row = dst + (ch * h + y) * w;
        for (int64_t x = 0; x < w; ++x) {
          const int64_t sx = (flip ? w - 1 - x : x) + dx;
          row[x] = (sy < 0 || sy >= h || sx < 0 || sx >= w)
                       ? 0.0f
                       : src[(ch * h + sy) * w + sx];
        }
      }
    }
  }
}

BatchPrefetcher::BatchPrefetcher(const LabeledImages& source,
                                 const std::vector<int64_t>& indices,
                                 int64_t batch_size, int64_t num_batches,
                                 bool augment, uint64_t seed, int depth)
    : source_(source),
      indices_(indices),
      batch_size_(batch_size),
      num_batches_(num_batches),
      augment_(augment),
      depth_(std::max(depth, 1)),
      rng_(seed) {
  thread_ = std::thread([this] { Produce(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::Produce() {
  for (int64_t i = 0; i < num_batches_; ++i) {
    Batch batch;
    GatherBatch(source_, indices_, i * batch_size_, batch_size_, &batch.images,
                &batch.labels, augment_ ? &rng_ : nullptr);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] {
      return stop_ || static_cast<int>(ready_.size()) < depth_;
    });
    if (stop_) return;
    ready_.push_back(std::move(batch));
    cv_.notify_all();
  }
}

bool BatchPrefetcher::Next(Batch* batch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ >= num_batches_) return false;
  cv_.wait(lock, [this] { return !ready_.empty(); });
  *batch = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  cv_.notify_all();
  return true;
}

}  // namespace pstrain
