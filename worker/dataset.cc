#include "worker/dataset.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "catalog/catalog.h"
#include "common/regular_file.h"
#include "common/status_macros.h"
#include "worker/image_folder.h"
#include "worker/record_file.h"
#include "worker/token_dataset.h"

namespace pstrain {
namespace {

// `path`, gzipped or plain, open for gzread(): opened as OpenRegularFile
// does (a FIFO or device in its place is refused, not waited on; symbolic
// links are followed, as Debian's dataset packages use them), its size in
// *size_bytes. The caller gzclose()s it.
absl::StatusOr<gzFile> OpenGzipped(const std::string& path,
                                   uint64_t* size_bytes) {
  ASSIGN_OR_RETURN(RegularFile file,
                   OpenRegularFile(path, /*follow_symlinks=*/true));
  *size_bytes = file.size_bytes();
  // gzdopen() owns the descriptor it is given; `file` closes its own.
  const int fd = ::dup(file.fd());
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat(path, ": dup"));
  gzFile f = gzdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": no memory for zlib's reader"));
  }
  return f;
}

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

// value_of for bytes as read, in every channel: the float the loaded path
// stores, b * (1 / 255) for IDX (LoadSplit) or b / 255 for records (as
// ReadCifarBatch and torchvision's ToTensor; the two differ in the last bit
// for some b).
enum class Scale { kTimesReciprocal, kDivide };
std::vector<float> UnitScaleTable(int64_t channels, Scale scale) {
  std::vector<float> table(static_cast<size_t>(channels) * 256);
  for (size_t i = 0; i < table.size(); ++i) {
    const float b = static_cast<float>(i % 256);
    table[i] = scale == Scale::kDivide ? b / 255.0f : b * (1.0f / 255.0f);
  }
  return table;
}

// A split of IDX images and labels as bytes (mapped files, or gzipped files
// decompressed into buffers): checked, with b / 255 as each byte's value
// (the owners of the bytes are the caller's to attach).
absl::StatusOr<LabeledImages> IdxByteSplit(const std::string& images_path,
                                           const std::string& labels_path,
                                           const MappedIdx& images,
                                           const MappedIdx& labels) {
  if (images.dims.size() != 3) {
    return absl::DataLossError(absl::StrCat(
        images_path,
        ": expected an image file (magic 0x00000803, 3 dims), got ",
        images.dims.size(), " dims"));
  }
  if (labels.dims.size() != 1) {
    return absl::DataLossError(absl::StrCat(
        labels_path, ": expected a label file (magic 0x00000801, 1 dim), got ",
        labels.dims.size(), " dims"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::DataLossError(absl::StrCat(
        images_path, " holds ", images.dims[0], " images but ", labels_path,
        " holds ", labels.dims[0], " labels; expected the same count"));
  }
  LabeledImages out;
  out.count = out.stored = images.dims[0];
  out.chw = {1, images.dims[1], images.dims[2]};
  auto mapped = std::make_shared<MappedSplit>();
  mapped->pixels = images.data;
  mapped->pixel_stride = images.dims[1] * images.dims[2];
  mapped->pixel_file = images.file;
  mapped->labels = labels.data;
  mapped->label_stride = 1;
  mapped->label_bytes = 1;
  mapped->label_file = labels.file;
  mapped->value_of = UnitScaleTable(1, Scale::kTimesReciprocal);
  out.mapped = std::move(mapped);
  return out;
}

absl::StatusOr<LabeledImages> MapIdxSplit(const std::string& images_path,
                                          const std::string& labels_path) {
  ASSIGN_OR_RETURN(const MappedIdx images, MapIdxFile(images_path));
  ASSIGN_OR_RETURN(const MappedIdx labels, MapIdxFile(labels_path));
  return IdxByteSplit(images_path, labels_path, images, labels);
}

// A gzipped IDX split, decompressed once into byte buffers and read as a
// mapped split is: a quarter of the memory of floats, and no conversion
// or standardising pass (each byte's standardised value is a table's).
absl::StatusOr<LabeledImages> InflateIdxSplit(const std::string& images_path,
                                              const std::string& labels_path) {
  ASSIGN_OR_RETURN(IdxArray image_bytes, ReadIdx(images_path));
  ASSIGN_OR_RETURN(IdxArray label_bytes, ReadIdx(labels_path));
  auto pixels =
      std::make_shared<const std::vector<uint8_t>>(std::move(image_bytes.data));
  auto labels =
      std::make_shared<const std::vector<uint8_t>>(std::move(label_bytes.data));
  MappedIdx images, label_view;
  images.dims = std::move(image_bytes.dims);
  images.data = pixels->data();
  label_view.dims = std::move(label_bytes.dims);
  label_view.data = labels->data();
  ASSIGN_OR_RETURN(LabeledImages out,
                   IdxByteSplit(images_path, labels_path, images, label_view));
  out.mapped->pixel_buffer = std::move(pixels);
  out.mapped->label_buffer = std::move(labels);
  return out;
}

absl::StatusOr<LabeledImages> LoadSplit(const std::string& dir,
                                        const std::string& prefix,
                                        int num_classes, bool map_files) {
  const std::string images_path =
      FindIdxFile(dir, absl::StrCat(prefix, "-images-idx3-ubyte"));
  const std::string labels_path =
      FindIdxFile(dir, absl::StrCat(prefix, "-labels-idx1-ubyte"));
  struct stat st;
  // A missing file goes to ReadIdx, whose error says what was looked for.
  // Labels are checked against num_classes by LoadDataset's pass.
  if (map_files && !absl::EndsWith(images_path, ".gz") &&
      !absl::EndsWith(labels_path, ".gz") &&
      stat(images_path.c_str(), &st) == 0 &&
      stat(labels_path.c_str(), &st) == 0) {
    return MapIdxSplit(images_path, labels_path);
  }
  if (map_files) return InflateIdxSplit(images_path, labels_path);
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

void MappedSplit::NoteSequentialRead(int64_t pixel_bytes) const {
  if (pixel_file != nullptr) pixel_file->NoteRead(pixel_bytes);
}

void MappedSplit::NoteSampleRead(int64_t pixel_bytes) const {
  if (pixel_file == nullptr) return;
  pixel_file->NoteRandomRead(pixel_bytes);
  if (label_file != pixel_file) label_file->NoteRandomRead(label_bytes);
}

void MappedSplit::ReleaseResident() const {
  if (pixel_file == nullptr) return;
  pixel_file->ReleaseResident();
  label_file->ReleaseResident();
}

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  uint64_t size_bytes = 0;
  absl::StatusOr<gzFile> opened = OpenGzipped(path, &size_bytes);
  if (absl::IsNotFound(opened.status())) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no such file (expected an IDX file, gzipped or plain)"));
  }
  if (!opened.ok()) return opened.status();
  gzFile f = *opened;
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

absl::StatusOr<LabeledImages> ReadCifarBatch(const std::string& path) {
  constexpr int64_t kRecord = 1 + 3 * 32 * 32;
  uint64_t size_bytes = 0;
  absl::StatusOr<gzFile> opened = OpenGzipped(path, &size_bytes);
  if (absl::IsNotFound(opened.status())) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no such file (expected a CIFAR-10 binary batch)"));
  }
  if (!opened.ok()) return opened.status();
  gzFile f = *opened;
  if (size_bytes == 0 || size_bytes % kRecord != 0) {
    gzclose(f);
    return absl::DataLossError(absl::StrCat(
        path, ": ", size_bytes, " bytes; expected a positive multiple of ",
        kRecord, " (CIFAR-10 records of 1 label byte and 3072 pixels)"));
  }
  std::vector<uint8_t> raw(size_bytes);
  const bool ok = ReadExactly(f, raw.data(), raw.size());
  gzclose(f);
  if (!ok) return absl::DataLossError(absl::StrCat(path, ": short read"));
  LabeledImages out;
  out.chw = {3, 32, 32};
  out.count = out.stored = static_cast<int64_t>(size_bytes) / kRecord;
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

LabeledImages FromImageFiles(ImageFiles files, int channels, int height,
                             int width) {
  LabeledImages out;
  out.chw = {channels, height, width};
  out.count = static_cast<int64_t>(files.paths.size());
  out.stored = 0;
  out.labels = files.labels;
  out.files = std::make_shared<const ImageFiles>(std::move(files));
  return out;
}

// `over` (CheckDecodedBytes's RESOURCE_EXHAUSTED) with where the limit
// comes from and the two ways out.
absl::Status WithMemoryAdvice(const absl::Status& over,
                              const DatasetOptions& o) {
  return absl::ResourceExhaustedError(absl::StrCat(
      over.message(),
      o.max_dataset_memory_bytes > 0
          ? " per worker (--max_dataset_memory)"
          : " per worker (half of the memory available; "
            "--max_dataset_memory changes it)",
      "; pass --stream_images to decode batches while training, or a "
      "smaller --image_size"));
}

void WarnSkipped(const std::string& dir, int64_t skipped, int64_t total,
                 const std::string& first) {
  std::fprintf(stderr,
               "warning: image_folder %s: skipped %lld of %lld images that "
               "could not be read; the first: %s\n",
               dir.c_str(), static_cast<long long>(skipped),
               static_cast<long long>(total), first.c_str());
}

// CheckDecodedBytes against options' limit, with the way out when over.
absl::Status CheckDatasetMemory(const std::string& dir, int64_t count,
                                int channels, int height, int width,
                                const DatasetOptions& o) {
  ASSIGN_OR_RETURN(const int64_t limit, DatasetMemoryLimit(o));
  absl::Status s =
      CheckDecodedBytes(dir, count, channels, height, width, limit);
  if (!absl::IsResourceExhausted(s)) return s;
  return WithMemoryAdvice(s, o);
}

absl::StatusOr<Dataset> ListedImageFolder(const std::string& dir,
                                          const DatasetOptions& o) {
  ImageFolderOptions options;
  options.image_size = o.image_size;
  options.bad_images = o.bad_images;
  ASSIGN_OR_RETURN(ImageFolderListing listing, ListImageFolder(dir, options));
  const int64_t count = static_cast<int64_t>(listing.train.paths.size() +
                                             listing.test.paths.size());
  if (o.stream_images && listing.height != listing.width) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": images of ", listing.width, "x", listing.height,
        " are not square; streamed batches are square: set --image_size"));
  }
  if (!o.stream_images) {
    RETURN_IF_ERROR(CheckDatasetMemory(dir, count, listing.channels,
                                       listing.height, listing.width, o));
  }
  if (listing.skipped > 0) {
    WarnSkipped(dir, listing.skipped, listing.skipped + count,
                listing.first_skipped);
  }
  Dataset dataset;
  dataset.num_classes = static_cast<int>(listing.class_names.size());
  dataset.train = FromImageFiles(std::move(listing.train), listing.channels,
                                 listing.height, listing.width);
  dataset.test = FromImageFiles(std::move(listing.test), listing.channels,
                                listing.height, listing.width);
  return dataset;
}

absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir,
                                        const DatasetOptions& o) {
  if (o.stream_images || o.headers_only) return ListedImageFolder(dir, o);
  ImageFolderOptions options;
  options.image_size = o.image_size;
  options.bad_images = o.bad_images;
  ASSIGN_OR_RETURN(options.max_decoded_bytes, DatasetMemoryLimit(o));
  absl::StatusOr<ImageFolderDataset> folder =
      ReadImageFolderDataset(dir, options);
  if (absl::IsResourceExhausted(folder.status())) {
    return WithMemoryAdvice(folder.status(), o);
  }
  if (!folder.ok()) return folder.status();
  const int64_t skipped = folder->train.skipped + folder->test.skipped;
  if (skipped > 0) {
    const std::string& first = folder->train.first_skipped.empty()
                                   ? folder->test.first_skipped
                                   : folder->train.first_skipped;
    WarnSkipped(dir, skipped,
                skipped + folder->train.count + folder->test.count, first);
  }
  Dataset dataset;
  dataset.num_classes = static_cast<int>(folder->class_names.size());
  dataset.train = FromImageFolderSplit(std::move(folder->train));
  dataset.test = FromImageFolderSplit(std::move(folder->test));
  return dataset;
}

absl::StatusOr<LabeledImages> MapRecordSplit(const std::string& path,
                                             int64_t* num_classes) {
  ASSIGN_OR_RETURN(MappedRecords records, MapRecordFile(path));
  const RecordFileHeader& h = records.header;
  LabeledImages out;
  out.chw = {h.channels, h.height, h.width};
  out.count = out.stored = h.count;
  auto mapped = std::make_shared<MappedSplit>();
  const uint8_t* first = records.file->data() + kRecordHeaderBytes;
  mapped->labels = first;
  mapped->label_stride = h.record_bytes();
  mapped->label_bytes = 4;
  mapped->pixels = first + 4;
  mapped->pixel_stride = h.record_bytes();
  mapped->pixel_file = records.file;
  mapped->label_file = std::move(records.file);
  mapped->value_of = UnitScaleTable(h.channels, Scale::kDivide);
  out.mapped = std::move(mapped);
  *num_classes = std::max(*num_classes, h.num_classes);
  return out;
}

absl::StatusOr<Dataset> LoadRecords(const std::string& dir) {
  Dataset dataset;
  int64_t num_classes = 0;
  ASSIGN_OR_RETURN(dataset.train,
                   MapRecordSplit(dir + "/train.records", &num_classes));
  const std::string test_path = dir + "/test.records";
  struct stat st;
  if (::stat(test_path.c_str(), &st) == 0) {
    ASSIGN_OR_RETURN(dataset.test, MapRecordSplit(test_path, &num_classes));
    if (dataset.test.chw != dataset.train.chw) {
      return absl::DataLossError(absl::StrCat(
          test_path, ": images of ", dataset.test.chw[0], "x",
          dataset.test.chw[1], "x", dataset.test.chw[2], "; expected ",
          dataset.train.chw[0], "x", dataset.train.chw[1], "x",
          dataset.train.chw[2], " as in train.records"));
    }
  } else {
    dataset.test.chw = dataset.train.chw;
  }
  if (num_classes > (1 << 24)) {
    return absl::DataLossError(absl::StrCat(dir, ": record files declare ",
                                            num_classes,
                                            " classes; expected at most 2^24"));
  }
  dataset.num_classes = static_cast<int>(num_classes);
  return dataset;
}

// Per-channel sums of the split's pixels in [0, 1] and of their squares, in
// the order the loaded path sums them (sample by sample, each plane row by
// row), so both paths get the same statistics bit for bit. Checks a mapped
// split's labels on the way. Mapped pages are released as they are read.
absl::Status SumChannels(const LabeledImages& split, int num_classes,
                         const std::string& where, std::vector<double>* sum,
                         std::vector<double>* sum_sq, int64_t* values) {
  const int64_t channels = split.chw[0];
  const int64_t plane = split.chw[1] * split.chw[2];
  sum->assign(channels, 0.0);
  sum_sq->assign(channels, 0.0);
  *values = split.stored * plane;
  if (split.files != nullptr) {
    // A sample of the files, evenly spaced, decoded as the pipeline will.
    const int64_t k = std::min(split.count, kStreamStatsSamples);
    std::vector<float> chw(static_cast<size_t>(channels * plane));
    int64_t used = 0;
    for (int64_t s = 0; s < k; ++s) {
      const int64_t i = s * split.count / k;
      absl::StatusOr<DecodedImage> image =
          DecodeImageFile(split.files->paths[i]);
      if (!image.ok()) continue;  // found again when its batch is decoded
      ImageToChw(*image, static_cast<int>(channels),
                 static_cast<int>(split.chw[1]), chw.data());
      for (int64_t c = 0; c < channels; ++c) {
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < plane; ++j) {
          const double v = chw[c * plane + j];
          s1 += v;
          s2 += v * v;
        }
        (*sum)[c] += s1;
        (*sum_sq)[c] += s2;
      }
      ++used;
    }
    *values = used * plane;
  }
  for (int64_t i = 0; i < split.stored; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      double s = (*sum)[c], s2 = (*sum_sq)[c];
      if (split.mapped != nullptr) {
        const MappedSplit& m = *split.mapped;
        const uint8_t* p = m.pixels + i * m.pixel_stride + c * plane;
        const float* value = &m.value_of[c * 256];
        for (int64_t j = 0; j < plane; ++j) {
          const float v = value[p[j]];
          s += v;
          s2 += double{v} * v;
        }
      } else {
        const float* p = &split.images[(i * channels + c) * plane];
        for (int64_t j = 0; j < plane; ++j) {
          s += p[j];
          s2 += double{p[j]} * p[j];
        }
      }
      (*sum)[c] = s;
      (*sum_sq)[c] = s2;
    }
    if (split.mapped != nullptr) {
      split.mapped->NoteSequentialRead(channels * plane);
    }
  }
  if (split.mapped != nullptr) {
    for (int64_t i = 0; i < split.count; ++i) {
      const int32_t label = split.label(i);
      if (label < 0 || label >= num_classes) {
        return absl::DataLossError(
            absl::StrCat(where, ": label ", label, " of sample ", i,
                         " is outside [0, ", num_classes, ")"));
      }
    }
    split.mapped->ReleaseResident();
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> MakeSynthetic(DatasetOptions o) {
  if (o.image_size == 0) o.image_size = 224;
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

absl::Status CheckModelTakesDataset(const std::string& model,
                                    const Dataset& dataset) {
  const bool sequence = IsSequenceModel(model);
  if (sequence == (dataset.tokens != nullptr)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model ", model, " takes ", sequence ? "token sequences" : "images",
      " but dataset ", dataset.name, " holds ",
      sequence ? "images" : "token sequences", "; expected ",
      sequence ? "dataset tokens or synthetic_tokens"
               : "an image dataset (not tokens or synthetic_tokens)"));
}

absl::StatusOr<Dataset> LoadDataset(const std::string& name,
                                    const std::string& data_dir,
                                    const DatasetOptions& options) {
  if (!IsKnownDataset(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown dataset \"", name, "\"; expected one of: ", KnownDatasets()));
  }
  if (IsTokenDataset(name)) return LoadTokenDataset(name, data_dir, options);
  absl::StatusOr<Dataset> loaded;
  if (name == "fashion_mnist" || name == "mnist") {
    Dataset dataset;
    dataset.num_classes = 10;
    absl::StatusOr<LabeledImages> train =
        LoadSplit(data_dir, "train", 10, options.map_files);
    if (!train.ok()) return train.status();
    absl::StatusOr<LabeledImages> test =
        LoadSplit(data_dir, "t10k", 10, options.map_files);
    if (!test.ok()) return test.status();
    dataset.train = *std::move(train);
    dataset.test = *std::move(test);
    loaded = std::move(dataset);
  } else if (name == "cifar10") {
    loaded = LoadCifar10(data_dir);
  } else if (name == "image_folder") {
    loaded = LoadImageFolder(data_dir, options);
  } else if (name == "records") {
    loaded = LoadRecords(data_dir);
  } else if (name == "synthetic") {
    loaded = MakeSynthetic(options);
  } else {
    return absl::InternalError(absl::StrCat(
        "dataset \"", name, "\" is in catalog/catalog.h but has no reader"));
  }
  if (!loaded.ok()) return loaded.status();
  Dataset& dataset = *loaded;
  dataset.name = name;
  if (dataset.train.chw != dataset.test.chw) {
    return absl::DataLossError(
        absl::StrCat(data_dir, ": train and test images differ in size"));
  }
  if (options.headers_only) return loaded;
  // Standardise both splits with the training set's per-channel mean and
  // standard deviation (as torchvision's Normalize with the dataset's
  // statistics). Mapped splits get the standardised value of each byte.
  const int64_t channels = dataset.train.chw[0];
  const int64_t plane = dataset.train.chw[1] * dataset.train.chw[2];
  std::vector<double> sums, sums_sq, unused, unused_sq;
  int64_t values = 0, unused_values = 0;
  RETURN_IF_ERROR(SumChannels(dataset.train, dataset.num_classes,
                              absl::StrCat(data_dir, " (train)"), &sums,
                              &sums_sq, &values));
  if (dataset.test.mapped != nullptr) {
    RETURN_IF_ERROR(SumChannels(dataset.test, dataset.num_classes,
                                absl::StrCat(data_dir, " (test)"), &unused,
                                &unused_sq, &unused_values));
  }
  for (int64_t c = 0; c < channels; ++c) {
    const double n = static_cast<double>(std::max<int64_t>(values, 1));
    const double mean = sums[c] / n;
    const double stddev =
        std::sqrt(std::max(sums_sq[c] / n - mean * mean, 1e-12));
    dataset.channel_mean.push_back(mean);
    dataset.channel_stddev.push_back(stddev);
    for (LabeledImages* split : {&dataset.train, &dataset.test}) {
      if (split->mapped != nullptr) {
        float* value = &split->mapped->value_of[c * 256];
        for (int b = 0; b < 256; ++b) {
          value[b] = static_cast<float>((value[b] - mean) / stddev);
        }
        continue;
      }
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

absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, " kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib < 0) {
      return absl::DataLossError(absl::StrCat(
          "/proc/meminfo: \"MemAvailable:", line, "\"; expected N kB"));
    }
    return kib * 1024;
  }
  return absl::NotFoundError("/proc/meminfo: no MemAvailable line");
}

absl::StatusOr<int64_t> DatasetMemoryLimit(const DatasetOptions& options) {
  if (options.max_dataset_memory_bytes > 0) {
    return options.max_dataset_memory_bytes;
  }
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<int64_t> available = ParseMemAvailable(text.str());
  if (!in.is_open() || !available.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the memory available is unknown (",
                     in.is_open() ? available.status().message()
                                  : "cannot read /proc/meminfo",
                     "); set --max_dataset_memory"));
  }
  return *available / 2;
}

std::string FindIdxFile(const std::string& dir, const std::string& base) {
  struct stat st;
  const std::string gz = absl::StrCat(dir, "/", base, ".gz");
  if (stat(gz.c_str(), &st) == 0) return gz;
  return absl::StrCat(dir, "/", base);
}

int32_t LabeledImages::label(int64_t i) const {
  if (mapped == nullptr) return labels[i];
  const uint8_t* p = mapped->labels + i * mapped->label_stride;
  if (mapped->label_bytes == 1) return p[0];
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) |
                              (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
}

ShardedSampler::ShardedSampler(int64_t num_samples, int worker_id,
                               int num_workers, uint64_t seed)
    : num_samples_(num_samples),
      worker_id_(worker_id),
      num_workers_(num_workers),
      seed_(seed) {}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

IndexPermutation::IndexPermutation(uint64_t n, uint64_t seed) : n_(n) {
  half_bits_ = 1;
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) {
    ++half_bits_;
  }
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  std::mt19937_64 rng(seed);
  for (uint64_t& key : keys_) key = rng();
}

uint64_t IndexPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (const uint64_t key : keys_) {
    const uint64_t next = left ^ (Mix64(right ^ key) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  // A permutation of [0, 2^(2h)) restricted to [0, n) by cycle walking: the
  // cycle through i re-enters [0, n), so this ends.
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

SampleOrder::SampleOrder(std::vector<SampleIndex> list)
    : list_(std::move(list)), size_(static_cast<int64_t>(list_.size())) {}

SampleOrder SampleOrder::Share(const IndexPermutation& permutation,
                               int64_t first, int num_workers, int64_t count) {
  SampleOrder order;
  order.shared_ = true;
  order.permutation_ = permutation;
  order.worker_id_ = first;
  order.num_workers_ = num_workers;
  order.size_ = count;
  return order;
}

std::vector<SampleIndex> SampleOrder::ToVector() const {
  std::vector<SampleIndex> out(static_cast<size_t>(size_));
  for (int64_t k = 0; k < size_; ++k) out[static_cast<size_t>(k)] = (*this)[k];
  return out;
}

SampleOrder ShardedSampler::EpochIndices(int epoch) const {
  return EpochSlice(epoch, 0, worker_id_, num_workers_, samples_per_worker());
}

SampleOrder ShardedSampler::EpochSlice(int epoch, int64_t offset, int rank,
                                       int members, int64_t count) const {
  const uint64_t seed = seed_ * 1000003ull + static_cast<uint64_t>(epoch);
  return SampleOrder::Share(
      IndexPermutation(static_cast<uint64_t>(num_samples_), seed),
      offset + rank, members, count);
}

void GatherBatch(const LabeledImages& source, const SampleOrder& indices,
                 size_t begin, size_t n, Tensor* images,
                 std::vector<int32_t>* labels, std::mt19937_64* augment) {
  const int64_t c = source.chw[0], h = source.chw[1], w = source.chw[2];
  const int64_t per = c * h * w;
  images->Resize({static_cast<int64_t>(n), c, h, w});
  labels->resize(n);
  constexpr int kPad = 4;
  std::vector<float> scratch;
  const MappedSplit* mapped = source.mapped.get();
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = indices[begin + i];
    float* dst = &images->data[i * per];
    (*labels)[i] = source.label(s);
    const float* src;
    if (mapped != nullptr) {
      // Bytes to standardised floats through the table; straight into the
      // batch when there is no augmentation.
      float* out = dst;
      if (augment != nullptr) {
        scratch.resize(per);
        out = scratch.data();
      }
      const uint8_t* p = mapped->pixels + s * mapped->pixel_stride;
      const int64_t plane = h * w;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* value = &mapped->value_of[ch * 256];
        for (int64_t j = 0; j < plane; ++j) {
          out[ch * plane + j] = value[p[ch * plane + j]];
        }
      }
      mapped->NoteSampleRead(per);
      if (augment == nullptr) continue;
      src = out;
    } else {
      src = &source.images[(s % source.stored) * per];
      if (augment == nullptr) {
        std::memcpy(dst, src, per * sizeof(float));
        continue;
      }
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
                                 SampleOrder indices, int64_t batch_size,
                                 int64_t num_batches, bool augment,
                                 uint64_t seed, int depth)
    : source_(source),
      indices_(std::move(indices)),
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
