// TensorBoard event files: scalars (loss, learning rate, samples/sec, ...)
// that `tensorboard --logdir DIR` plots, written without TensorFlow.
//
// File: DIR/events.out.tfevents.<unix seconds>.<host> (a ".N" suffix when a
// file of that name exists already). Content: TFRecord records, each
//
//   uint64 length | uint32 masked CRC-32C of the length's 8 bytes |
//   length bytes of data | uint32 masked CRC-32C of the data
//
// (integers little-endian; mask in common/crc32c.h), whose data is a
// serialized Event (proto/tensorboard_event.proto, TensorFlow's field
// numbers): first {wall_time, file_version: "brain.Event:2"}, then one
// {wall_time, step, summary {value {tag, simple_value}...}} per
// WriteScalars call.
//
// Units: wall_time is seconds since the Unix epoch (a double, as
// TensorFlow's); steps are whatever the caller counts (pstrain: training
// steps of this worker); values are float32 (TensorBoard's simple_value).
//
// Durability: every event is handed to the OS (fflush) before WriteScalars
// returns, so a TensorBoard watching the folder sees it; nothing is fsynced,
// and a crash mid-write can leave a torn last record (TensorBoard's reader
// waits for the rest of it; ReadTfRecords reports DATA_LOSS).
//
// Errors: Create fails (NOT_FOUND, PERMISSION_DENIED, INTERNAL, naming the
// path) if the folder cannot be created or the file opened. A failed write
// is returned by that call and by every later one (the file is then
// incomplete); nothing aborts.
//
// Thread-compatible: one writer must not be used by two threads at once;
// distinct writers (distinct folders) are independent.
#ifndef PSTRAIN_COMMON_TENSORBOARD_H_
#define PSTRAIN_COMMON_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace pstrain {

// The first event's file_version: TensorBoard reads files that start so.
inline constexpr char kTensorBoardFileVersion[] = "brain.Event:2";

struct TensorBoardScalar {
  // The series' name; "/" groups series in TensorBoard ("train/loss").
  std::string tag;
  float value = 0;
};

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if needed, opens a new event file in it
  // named after `now` and this host, and writes the file_version event.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(
      const std::string& dir, absl::Time now = absl::Now());

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  // Closes the file; an error then is lost (call Close() to see it).
  ~TensorBoardWriter();

  // The event file's path.
  const std::string& path() const { return path_; }

  // One event at `step` and `wall_time` holding every scalar of `scalars`
  // (an empty span writes nothing).
  absl::Status WriteScalars(int64_t step,
                            absl::Span<const TensorBoardScalar> scalars,
                            absl::Time wall_time = absl::Now());

  // Flushes and closes the file; later writes fail with FAILED_PRECONDITION.
  absl::Status Close();

 private:
  TensorBoardWriter(std::string path, std::FILE* file)
      : path_(std::move(path)), file_(file) {}
  // Frames `data` as one record, writes and flushes it.
  absl::Status WriteRecord(absl::string_view data);

  const std::string path_;
  std::FILE* file_;
  absl::Status error_;  // The first failure; sticky.
};

// One TFRecord: `data` framed as above.
std::string EncodeTfRecord(absl::string_view data);

// The data of every record in `contents` (a whole TFRecord file), in order.
// DATA_LOSS naming the record's index and byte offset if a length or data
// CRC does not match or the file ends inside a record.
absl::StatusOr<std::vector<std::string>> ReadTfRecords(
    absl::string_view contents);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TENSORBOARD_H_
