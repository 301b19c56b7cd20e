// Datasets for the workers:
//  - the IDX format of MNIST and Fashion-MNIST (LeCun's format: big-endian
//    magic 0x00000801 for labels, 0x00000803 for images, then the
//    dimensions, then unsigned bytes), read gzipped or plain through zlib;
//  - the CIFAR-10 binary format (Krizhevsky 2009: records of 1 label byte and
//    3072 pixel bytes, the red, green and blue 32x32 planes; data_batch_1..5
//    .bin for training, test_batch.bin for test, 10,000 records each);
//  - "image_folder": JPEG and PNG files in class folders, or in the
//    tiny-ImageNet layout (worker/image_folder.h), resized to --image_size;
//  - "records": pstrain's packed record files (worker/record_file.h),
//    data_dir/train.records and data_dir/test.records (optional);
//  - "synthetic": fixed-seed random images of --image_size and labels of
//    --num_classes, for throughput runs without a dataset on disk (as the
//    field's benchmark tools do);
//  - "tokens" and "synthetic_tokens": token sequences for the sequence
//    models (worker/token_dataset.h);
// and the sharded sampler, augmentation and a batch prefetcher.
//
// Datasets larger than memory: plain (not gzipped) IDX files and record
// files are memory-mapped (worker/mapped_file.h), not loaded: a split keeps
// only a pointer to its bytes and a 256-entry table per channel from a byte
// to its standardised value, so resident memory does not grow with the
// number of samples. The mapped and loaded paths give bit-identical
// batches: the table holds exactly the float the loaded path computes, and
// the per-channel statistics are summed in the same order.
//
// Thread-compatible: a loaded Dataset is immutable and may be shared.
#ifndef PSTRAIN_WORKER_DATASET_H_
#define PSTRAIN_WORKER_DATASET_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tensor.h"
#include "worker/image_folder.h"
#include "worker/mapped_file.h"

namespace pstrain {

// One IDX file: its dimensions and its unsigned-byte payload.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads `path` (gzip or plain; a symbolic link is followed). Errors name
// the file and what was expected: NOT_FOUND if missing; INVALID_ARGUMENT
// for a FIFO, device or folder in its place (refused without waiting for a
// writer; common/regular_file.h); DATA_LOSS for a bad magic number, a
// truncated or corrupt file, or trailing bytes.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);

// "<dir>/<base>.gz" if it exists, else "<dir>/<base>" (an IDX file of an
// MNIST-style folder, e.g. base "train-images-idx3-ubyte").
std::string FindIdxFile(const std::string& dir, const std::string& base);

struct MappedSplit;  // Below.
struct TokenData;    // worker/token_dataset.h

// Images [N, C, H, W] and labels in [0, num_classes). LoadDataset scales
// pixels to [0, 1] (as torchvision's ToTensor), then standardises each
// channel with the training set's mean and standard deviation (as
// Normalize).
struct LabeledImages {
  Shape chw;
  int64_t count = 0;
  // stored * C * H * W values; sample i is image i % stored (stored ==
  // count except for synthetic data, which keeps a small pool of images).
  std::vector<float> images;
  int64_t stored = 0;
  std::vector<int32_t> labels;  // count values (empty when mapped)
  // Set for a memory-mapped split: `images` and `labels` are then empty
  // and samples are read from the mapping by GatherBatch.
  std::shared_ptr<MappedSplit> mapped;
  // Set for a streamed image_folder split (DatasetOptions.stream_images):
  // `images` is empty (stored 0), `labels` holds every label, and batches
  // come from an InputPipeline over these files (worker/input_pipeline.h),
  // not from GatherBatch.
  std::shared_ptr<const ImageFiles> files;

  // Label of sample i (from `labels` or the mapping).
  int32_t label(int64_t i) const;
};

// The bytes of a memory-mapped split: sample i's C*H*W pixel bytes (CHW) at
// pixels + i * pixel_stride and its label at labels + i * label_stride, one
// unsigned byte (IDX) or an int32 little-endian (records). The bytes live in
// the mapped files, or (a gzipped IDX split, decompressed once at load) in
// the buffers, and the files are null.
struct MappedSplit {
  std::shared_ptr<const MappedFile> pixel_file;
  std::shared_ptr<const MappedFile> label_file;
  std::shared_ptr<const std::vector<uint8_t>> pixel_buffer;
  std::shared_ptr<const std::vector<uint8_t>> label_buffer;
  const uint8_t* pixels = nullptr;
  int64_t pixel_stride = 0;
  const uint8_t* labels = nullptr;
  int64_t label_stride = 0;
  int label_bytes = 1;  // 1 or 4
  // value_of[c * 256 + b]: the float of byte b in channel c; b / 255 as
  // read, the standardised value once LoadDataset has standardised.
  std::vector<float> value_of;

  // The mapped files' page accounting (MappedFile::NoteRead, NoteRandomRead
  // and ReleaseResident); no-ops for bytes held in the buffers.
  void NoteSequentialRead(int64_t pixel_bytes) const;
  void NoteSampleRead(int64_t pixel_bytes) const;
  void ReleaseResident() const;
};

struct Dataset {
  std::string name;
  int num_classes = 0;
  LabeledImages train;
  LabeledImages test;
  // Per-channel statistics of the training pixels in [0, 1], used to
  // standardise both splits (Fashion-MNIST: 0.2860 and 0.3530).
  std::vector<double> channel_mean;
  std::vector<double> channel_stddev;
  // Random crop with 4 pixels of zero padding and horizontal flip for
  // training batches (CIFAR-10, as in He et al. 2016).
  bool augment = false;
  // Set for a token dataset (worker/token_dataset.h): the splits' chw is
  // {seq_len}, their counts are sequences, num_classes is the vocabulary,
  // and batches come from TokenBatch, not GatherBatch.
  std::shared_ptr<const TokenData> tokens;
};

// Training images decoded for a streamed image_folder's channel mean and
// standard deviation: at most this many, evenly spaced by index.
inline constexpr int64_t kStreamStatsSamples = 1024;

struct DatasetOptions {
  // Synthetic data: images are channels x image_size x image_size (0: 224).
  // image_folder: every image is resized to image_size x image_size; 0: the
  // images keep the size they all share (INVALID_ARGUMENT naming two sizes
  // found when they differ), as torchvision's ImageFolder without a Resize.
  int image_size = 0;
  // image_folder: skip and count unreadable images (a one-line warning on
  // stderr names the count and the first), or fail naming the first. Skip
  // by default because a job spec has no field for it yet: workers started
  // from a spec skip (and warn), while --bad_images (default fail) decides
  // for `pstrain run`, which loads the dataset itself before any worker
  // starts, and for train_bench.
  BadImages bad_images = BadImages::kSkip;
  // image_folder: list the files and read their headers only; the workers
  // decode each batch as they train (worker/input_pipeline.h), so memory
  // does not grow with the dataset. The channel statistics come from 1024
  // training images spread evenly over the set (kStreamStatsSamples).
  bool stream_images = false;
  // image_folder in memory: the most bytes the decoded images (both splits,
  // as floats, in each process that loads them) may take; 0: half of
  // /proc/meminfo's MemAvailable when loading starts. Estimated from the
  // headers before any pixel is decoded; over it, RESOURCE_EXHAUSTED with
  // the figure, the limit and the way out (--stream_images or a smaller
  // --image_size). Not used with stream_images.
  int64_t max_dataset_memory_bytes = 0;
  // Read no pixels: image_folder lists its files and reads their headers
  // only (the memory check above still applies), and no split is
  // standardised (channel_mean and channel_stddev stay empty). The counts,
  // shapes, labels and classes are those of a full load: for checks before
  // a job starts, in a process that does not train.
  bool headers_only = false;
  // Synthetic data only (num_classes: the vocabulary of synthetic_tokens).
  int channels = 3;
  int num_classes = 1000;
  int64_t train_samples = 12800;
  int64_t test_samples = 1000;
  uint64_t seed = 1;
  // Token datasets: tokens per sequence (worker/token_dataset.h; 0: the
  // token file's, or 128 synthetic).
  int seq_len = 0;
  // Memory-map plain IDX files (true) or read them into memory (false);
  // the batches are the same either way. Gzipped IDX files are always
  // read into memory, record files always mapped.
  bool map_files = true;
};

// "fashion_mnist" or "mnist" from `data_dir` (train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz], t10k-...); "cifar10" from `data_dir`
// (data_batch_1.bin ... data_batch_5.bin, test_batch.bin); "records" from
// `data_dir` (train.records; test.records if present, else test.count 0;
// num_classes is the larger of the files' headers); "image_folder"
// from `data_dir` in any layout ReadImageFolderDataset reads (classes sorted
// by name; the "class_folders" layout has no test split: test.count is 0),
// with options.image_size and options.bad_images; "synthetic" from
// `options`; "tokens" and "synthetic_tokens" as LoadTokenDataset
// (worker/token_dataset.h). The names are catalog/catalog.h's
// DatasetNames().
// INVALID_ARGUMENT for an unknown dataset name or bad synthetic
// sizes; the ReadIdx errors; DATA_LOSS when images and labels disagree in
// count, a label is out of range, or a CIFAR file is not a whole number of
// 3073-byte records (naming the file); MapIdxFile's and MapRecordFile's
// errors (worker/record_file.h), and DATA_LOSS when record files differ in
// shape; ReadImageFolderDataset's errors.
absl::StatusOr<Dataset> LoadDataset(const std::string& name,
                                    const std::string& data_dir,
                                    const DatasetOptions& options = {});

// Re-standardises both splits of `dataset` (as LoadDataset left them:
// standardised with its own training split's statistics) to
// (x - mean[c]) / stddev[c], x the pixel in [0, 1]: the statistics a model
// was trained with (models/model_file.h input_mean and input_stddev), so
// that `pstrain eval` scores a model on the inputs it learned whatever
// dataset it evaluates. In-memory and synthetic images are rewritten, a
// mapped split's byte tables (MappedSplit::value_of) likewise, and a
// streamed split's pipeline takes channel_mean and channel_stddev, which
// become `mean` and `stddev`. Statistics within 1e-8 (relative) of the
// dataset's change nothing (a model file keeps 9 significant digits, so
// a model scored on its own dataset sees the values it was trained on,
// bit for bit). INVALID_ARGUMENT, nothing changed: a token dataset, one
// headers_only loaded, `mean` or `stddev` without one value per channel,
// a value not finite or a stddev not positive.
absl::Status StandardiseAs(const std::vector<double>& mean,
                           const std::vector<double>& stddev, Dataset* dataset);

// A sequence model (catalog/catalog.h IsSequenceModel) trains on token
// sequences, an image model on images: INVALID_ARGUMENT naming both
// otherwise.
absl::Status CheckModelTakesDataset(const std::string& model,
                                    const Dataset& dataset);

// MemAvailable of /proc/meminfo's `text`, in bytes; NOT_FOUND without the
// line, DATA_LOSS for a line that is not "MemAvailable: N kB".
absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo);

// options.max_dataset_memory_bytes, or when 0 half of MemAvailable now
// (UNAVAILABLE when /proc/meminfo cannot be read or parsed).
absl::StatusOr<int64_t> DatasetMemoryLimit(const DatasetOptions& options);

// Reads one CIFAR-10 binary batch file: NOT_FOUND if missing;
// INVALID_ARGUMENT if not a regular file (as ReadIdx); DATA_LOSS if its
// size is not a positive multiple of 3073 bytes or a label is >= 10.
// Pixels scaled to [0, 1], not standardised.
absl::StatusOr<LabeledImages> ReadCifarBatch(const std::string& path);

// A training sample's index in its split: a split holds at most
// kMaxSamples samples (IDX counts are 32-bit too).
using SampleIndex = uint32_t;
inline constexpr int64_t kMaxSamples = 0xffffffff;

// SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014): a bijective 64-bit mix,
// the same on every platform and standard library.
uint64_t Mix64(uint64_t z);

// A pseudo-random permutation of [0, n), computed per position, with no
// table: a balanced Feistel network of 4 rounds (Luby and Rackoff, "How to
// construct pseudorandom permutations from pseudorandom functions", 1988)
// over the smallest even number of bits 2h with 2^(2h) >= n, whose round
// function is SplitMix64's finaliser of (half ^ round key), and cycle
// walking (Black and Rogaway, "Ciphers with Arbitrary Finite Domains",
// CT-RSA 2002): a value >= n is encrypted again until it falls in [0, n),
// fewer than 4 times on average since 2^(2h) < 4n. TensorFlow's
// tf.random.experimental.index_shuffle shuffles datasets the same way.
// The round keys come from std::mt19937_64(seed), so every process and
// every standard library computes the same permutation.
//
// Thread-safety: immutable after construction.
class IndexPermutation {
 public:
  IndexPermutation() = default;
  IndexPermutation(uint64_t n, uint64_t seed);
  // The image of position i, for i < n.
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_ = 0;
  int half_bits_ = 0;
  uint64_t half_mask_ = 0;
  uint64_t keys_[4] = {0, 0, 0, 0};
};

// The order of one worker's samples in one epoch: either its share of a
// permutation (positions w, w + W, w + 2W, ... of an IndexPermutation),
// computed per position with no table, or an explicit list (evaluation,
// tests, benchmarks). Copyable; a share is a few words.
//
// Thread-safety: immutable after construction.
class SampleOrder {
 public:
  SampleOrder() = default;
  // An explicit list (a std::vector converts).
  SampleOrder(std::vector<SampleIndex> list);  // NOLINT(runtime/explicit)
  // Positions first, first + num_workers, ... of `permutation`, `count` of
  // them (first: a worker's id, plus the epoch's offset where it resumes
  // after a membership change).
  static SampleOrder Share(const IndexPermutation& permutation, int64_t first,
                           int num_workers, int64_t count);

  SampleIndex operator[](int64_t k) const {
    if (!shared_) return list_[static_cast<size_t>(k)];
    return static_cast<SampleIndex>(
        permutation_(static_cast<uint64_t>(worker_id_ + k * num_workers_)));
  }
  int64_t size() const { return size_; }
  std::vector<SampleIndex> ToVector() const;

 private:
  bool shared_ = false;
  std::vector<SampleIndex> list_;
  IndexPermutation permutation_;
  int64_t worker_id_ = 0;
  int64_t num_workers_ = 1;
  int64_t size_ = 0;
};

// Splits each epoch's shuffled order of the training set among workers the
// way PyTorch's DistributedSampler does: worker w of W takes positions
// w, w + W, w + 2W, ... of the permutation. So batch i of every worker with
// batch size b together holds exactly batch i of one worker with batch W*b:
// the invariant sync mode relies on. Each worker gets floor(N / W) samples,
// so every worker runs the same number of steps.
//
// The shuffle is a permutation of indices only, not of the data, and it is
// computed per position (IndexPermutation): no table, so a worker's memory
// does not grow with the dataset's size. A block shuffle
// (shuffling runs of adjacent samples) would read files sequentially, but
// keeps neighbours together in a batch and changes the order of every
// existing run; with fixed-size records at computed offsets a random order
// costs one page touch per sample, which mapped reads afford.
class ShardedSampler {
 public:
  // 0 <= num_samples <= kMaxSamples (the trainer refuses larger splits).
  ShardedSampler(int64_t num_samples, int worker_id, int num_workers,
                 uint64_t seed);
  // The samples of `worker_id` for `epoch`, in training order.
  SampleOrder EpochIndices(int epoch) const;
  // An elastic job's share (worker/data_position.h): `count` samples of
  // `epoch`'s permutation from position `offset`, the member of rank
  // `rank` of `members` taking offset + rank, offset + rank + members, ...
  SampleOrder EpochSlice(int epoch, int64_t offset, int rank, int members,
                         int64_t count) const;
  int64_t samples_per_worker() const { return num_samples_ / num_workers_; }

 private:
  const int64_t num_samples_;
  const int worker_id_;
  const int num_workers_;
  const uint64_t seed_;
};

// Copies samples `indices` of `source` into a batch tensor [n, C, H, W] and
// labels (a mapped split's bytes go through its value_of table). With `augment`
// (non-null), each image is randomly flipped horizontally and cropped from its
// 4-pixel zero-padded version (padding 0 is the standardised value of the
// channel mean).
void GatherBatch(const LabeledImages& source, const SampleOrder& indices,
                 size_t begin, size_t n, Tensor* images,
                 std::vector<int32_t>* labels,
                 std::mt19937_64* augment = nullptr);

// Prepares the training batches of one epoch on a background thread, up to
// `depth` batches ahead, so data loading overlaps training.
//
// Thread-safety: Next() from one thread; the producer is internal.
class BatchPrefetcher {
 public:
  struct Batch {
    Tensor images;
    std::vector<int32_t> labels;
  };
  // Batches i = 0 .. num_batches-1 of `batch_size` from `indices`.
  // `source` must outlive the prefetcher.
  BatchPrefetcher(const LabeledImages& source, SampleOrder indices,
                  int64_t batch_size, int64_t num_batches, bool augment,
                  uint64_t seed, int depth = 2);
  ~BatchPrefetcher();
  // The next batch, in order; false after the last.
  bool Next(Batch* batch);

 private:
  void Produce();

  const LabeledImages& source_;
  const SampleOrder indices_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const bool augment_;
  const int depth_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool stop_ = false;
  int64_t consumed_ = 0;
  std::thread thread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATASET_H_
