// Dataset files read through a memory mapping (worker/mapped_file.h) rather
// than loaded: plain (not gzipped) IDX files, and pstrain's packed record
// files of fixed-size labelled images.
//
// Packed record file ("records" dataset; all integers little-endian):
//   offset  size  field
//        0     8  magic "PSRECORD" (ASCII, no terminator)
//        8     4  version: 1
//       12     4  dtype of the pixels: 1 = unsigned 8-bit (the only one)
//       16     4  channels C (1 to 4096)
//       20     4  height H (1 to 65536)
//       24     4  width W (1 to 65536)
//       28     4  num_classes (1 to 2^31 - 1)
//       32     8  count: number of records (0 to 2^40)
//       40    24  reserved, zero
//       64        count records of 4 + C*H*W bytes each: the label as an
//                 int32 in [0, num_classes), then the pixels in CHW order
//                 (plane by plane, row by row)
// and nothing after the last record. Fixed-size records make sample i's
// offset 64 + i * (4 + C*H*W), so a shuffled order costs one page touch per
// sample and no index.
//
// Errors name the file and what was expected: NOT_FOUND for a missing file,
// DATA_LOSS for a bad magic, version, dtype, shape or size.
//
// Thread-safety: the readers return immutable mappings, safe to share;
// a RecordWriter is used from one thread.
#ifndef PSTRAIN_WORKER_RECORD_FILE_H_
#define PSTRAIN_WORKER_RECORD_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/mapped_file.h"

namespace pstrain {

inline constexpr char kRecordMagic[8] = {'P', 'S', 'R', 'E',
                                         'C', 'O', 'R', 'D'};
inline constexpr uint32_t kRecordVersion = 1;
inline constexpr uint32_t kRecordDtypeUint8 = 1;
inline constexpr int64_t kRecordHeaderBytes = 64;

struct RecordFileHeader {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
  int64_t count = 0;
  // 4 + channels * height * width.
  int64_t record_bytes() const { return 4 + channels * height * width; }
};

// A mapped record file: its header and its records at file->data() + 64.
struct MappedRecords {
  RecordFileHeader header;
  std::shared_ptr<const MappedFile> file;
};
absl::StatusOr<MappedRecords> MapRecordFile(const std::string& path);

// A mapped plain IDX file (magic 0x000008NN: unsigned bytes, NN dims; see
// worker/dataset.h): its dimensions and its payload at `data`. DATA_LOSS for
// a gzipped file (map only plain ones), a bad magic, a dimension outside
// 1..2^31, or a size other than the header's.
struct MappedIdx {
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  std::shared_ptr<const MappedFile> file;
};
absl::StatusOr<MappedIdx> MapIdxFile(const std::string& path);

// Writes a record file in one pass: the header (count 0), then each
// Append()ed record; Close() writes the count into the header. Memory does
// not grow with the number of records.
class RecordWriter {
 public:
  // INVALID_ARGUMENT for a shape or num_classes outside the header's
  // ranges; the errno of fopen otherwise.
  static absl::StatusOr<std::unique_ptr<RecordWriter>> Open(
      const std::string& path, int64_t channels, int64_t height, int64_t width,
      int64_t num_classes);
  ~RecordWriter();  // Closes the file if Close() was not called (no count).
  // `pixels`: channels * height * width bytes, CHW. INVALID_ARGUMENT for a
  // label outside [0, num_classes).
  absl::Status Append(int32_t label, const uint8_t* pixels);
  // Writes the count and closes; errors of fwrite/fclose name the file.
  absl::Status Close();

 private:
  RecordWriter(std::string path, FILE* file, RecordFileHeader header)
      : path_(std::move(path)), file_(file), header_(header) {}
  const std::string path_;
  FILE* file_;
  RecordFileHeader header_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_RECORD_FILE_H_
