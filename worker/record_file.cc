#include "worker/record_file.h"

#include <cerrno>
#include <cstring>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
         (uint32_t{p[3]} << 24);
}

uint64_t Le64(const uint8_t* p) {
  return uint64_t{Le32(p)} | (uint64_t{Le32(p + 4)} << 32);
}

void PutLe32(uint32_t v, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void PutLe64(uint64_t v, uint8_t* p) {
  PutLe32(static_cast<uint32_t>(v), p);
  PutLe32(static_cast<uint32_t>(v >> 32), p + 4);
}

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool ShapeOk(int64_t c, int64_t h, int64_t w, int64_t num_classes) {
  return c >= 1 && c <= 4096 && h >= 1 && h <= 65536 && w >= 1 && w <= 65536 &&
         num_classes >= 1 && num_classes <= 0x7fffffff;
}

}  // namespace

absl::StatusOr<MappedRecords> MapRecordFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* p = file->data();
  if (file->size() < static_cast<size_t>(kRecordHeaderBytes)) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", file->size(), " bytes; expected a packed record file (",
        kRecordHeaderBytes, "-byte header starting \"PSRECORD\")"));
  }
  if (std::memcmp(p, kRecordMagic, 8) != 0) {
    return absl::DataLossError(
        absl::StrCat(path,
                     ": bad magic; expected a packed record file "
                     "starting \"PSRECORD\""));
  }
  if (Le32(p + 8) != kRecordVersion || Le32(p + 12) != kRecordDtypeUint8) {
    return absl::DataLossError(
        absl::StrCat(path, ": version ", Le32(p + 8), ", dtype ", Le32(p + 12),
                     "; expected version 1 and dtype 1 (unsigned 8-bit)"));
  }
  MappedRecords out;
  RecordFileHeader& h = out.header;
  h.channels = Le32(p + 16);
  h.height = Le32(p + 20);
  h.width = Le32(p + 24);
  h.num_classes = Le32(p + 28);
  const uint64_t count = Le64(p + 32);
  bool reserved_zero = true;
  for (int i = 40; i < kRecordHeaderBytes; ++i) reserved_zero &= p[i] == 0;
  if (!ShapeOk(h.channels, h.height, h.width, h.num_classes) ||
      count > (uint64_t{1} << 40) || !reserved_zero) {
    return absl::DataLossError(absl::StrCat(
        path, ": header declares ", h.channels, "x", h.height, "x", h.width,
        " images, ", h.num_classes, " classes, ", count,
        " records; expected channels 1-4096, height and width 1-65536, "
        "num_classes >= 1, count <= 2^40 and zero reserved bytes"));
  }
  h.count = static_cast<int64_t>(count);
  const uint64_t expected =
      kRecordHeaderBytes + count * static_cast<uint64_t>(h.record_bytes());
  if (file->size() != expected) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", file->size(), " bytes; the header's ", count,
        " records of ", h.record_bytes(), " bytes make ", expected));
  }
  out.file = std::move(file);
  return out;
}

absl::StatusOr<MappedIdx> MapIdxFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* p = file->data();
  const size_t size = file->size();
  if (size >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
    return absl::DataLossError(absl::StrCat(
        path, ": gzipped; expected a plain IDX file to map (gunzip it)"));
  }
  if (size < 4 || p[0] != 0 || p[1] != 0 || p[2] != 0x08 || p[3] < 1 ||
      p[3] > 4) {
    return absl::DataLossError(
        absl::StrCat(path,
                     ": bad magic number; expected 0x00000801 (labels) or "
                     "0x00000803 (images)"));
  }
  MappedIdx out;
  const int ndims = p[3];
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (size < header) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated or corrupt IDX header"));
  }
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const int64_t dim = Be32(p + 4 + 4 * d);
    if (dim <= 0 || dim > (int64_t{1} << 31)) {
      return absl::DataLossError(absl::StrCat(path, ": dimension ", d, " is ",
                                              dim,
                                              "; expected between 1 and 2^31"));
    }
    out.dims.push_back(dim);
    total *= static_cast<uint64_t>(dim);
    if (total > (uint64_t{1} << 42)) {
      return absl::DataLossError(
          absl::StrCat(path, ": more than 2^42 bytes of data declared"));
    }
  }
  if (size - header != total) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", size - header, " bytes after the header; it declares ",
        total, size - header < total ? " (truncated)" : " (trailing bytes)"));
  }
  out.data = p + header;
  out.file = std::move(file);
  return out;
}

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(
    const std::string& path, int64_t channels, int64_t height, int64_t width,
    int64_t num_classes) {
  if (!ShapeOk(channels, height, width, num_classes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": records of ", channels, "x", height, "x", width, ", ",
        num_classes,
        " classes; expected channels 1-4096, height and width 1-65536, "
        "num_classes >= 1"));
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return ErrnoToStatus(errno, path);
  RecordFileHeader header;
  header.channels = channels;
  header.height = height;
  header.width = width;
  header.num_classes = num_classes;
  auto writer = absl::WrapUnique(new RecordWriter(path, f, header));
  uint8_t zeros[kRecordHeaderBytes] = {};
  if (std::fwrite(zeros, 1, sizeof(zeros), f) != sizeof(zeros)) {
    return ErrnoToStatus(errno, path);
  }
  return writer;
}

RecordWriter::~RecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status RecordWriter::Append(int32_t label, const uint8_t* pixels) {
  if (label < 0 || label >= header_.num_classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": label ", label, " of record ", header_.count,
                     " is outside [0, ", header_.num_classes, ")"));
  }
  uint8_t le[4];
  PutLe32(static_cast<uint32_t>(label), le);
  const size_t n = static_cast<size_t>(header_.record_bytes() - 4);
  if (std::fwrite(le, 1, 4, file_) != 4 ||
      std::fwrite(pixels, 1, n, file_) != n) {
    return ErrnoToStatus(errno, path_);
  }
  ++header_.count;
  return absl::OkStatus();
}

absl::Status RecordWriter::Close() {
  uint8_t h[kRecordHeaderBytes] = {};
  std::memcpy(h, kRecordMagic, 8);
  PutLe32(kRecordVersion, h + 8);
  PutLe32(kRecordDtypeUint8, h + 12);
  PutLe32(static_cast<uint32_t>(header_.channels), h + 16);
  PutLe32(static_cast<uint32_t>(header_.height), h + 20);
  PutLe32(static_cast<uint32_t>(header_.width), h + 24);
  PutLe32(static_cast<uint32_t>(header_.num_classes), h + 28);
  PutLe64(static_cast<uint64_t>(header_.count), h + 32);
  FILE* f = file_;
  file_ = nullptr;
  if (std::fseek(f, 0, SEEK_SET) != 0 ||
      std::fwrite(h, 1, sizeof(h), f) != sizeof(h)) {
    const int error = errno;
    std::fclose(f);
    return ErrnoToStatus(error, path_);
  }
  if (std::fclose(f) != 0) return ErrnoToStatus(errno, path_);
  return absl::OkStatus();
}

}  // namespace pstrain
