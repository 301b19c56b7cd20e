// The control file of `pstrain run --control_file=PATH` (issue 40): how a
// running local job is scaled, since a signal carries no number. Each line
// appended to the file is one request:
//
//   [num_workers=N] [num_ps=M] [at_step=S]
//
// with num_workers, num_ps or both (a Scale of the job to N workers and M
// shards at the first step boundary at or after S; 0 or none: the next; a
// count left out stays as it is). Empty lines and lines starting with '#' are
// skipped. The file need not exist when the run starts; a line is read
// once it ends with a newline; a file that shrinks (written anew) is read
// again from its start.
//
// Thread-safety: one ControlFile is polled by one thread.
#ifndef PSTRAIN_CLI_CONTROL_FILE_H_
#define PSTRAIN_CLI_CONTROL_FILE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

struct ScaleLine {
  int num_workers = 0;  // 0: unchanged
  int num_ps = 0;       // 0: unchanged
  int64_t at_step = 0;
};

// One line (without its newline). INVALID_ARGUMENT, one line, naming what
// was expected: "\"workers=3\": expected [num_workers=N] [num_ps=M]
// [at_step=S], with num_workers, num_ps or both".
absl::StatusOr<ScaleLine> ParseControlLine(absl::string_view line);

class ControlFile {
 public:
  // The longest line read, bytes; longer ones are refused (a warning).
  static constexpr size_t kMaxLineBytes = 256;

  explicit ControlFile(std::string path) : path_(std::move(path)) {}

  // The requests of the complete lines added since the last call. A line
  // that does not parse is printed as a warning on stderr ("pstrain:
  // warning: PATH:LINE: ...; ignored") and left out. A file that cannot
  // be read (not there yet) gives none; one that is not a regular file (a
  // FIFO, a device, a folder) gives none and a warning, once, without
  // blocking.
  std::vector<ScaleLine> Poll();

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  // Bytes of the file consumed, and lines read so far.
  int64_t offset_ = 0;
  int line_ = 0;
  // The last warning about the file itself (not a regular file), so that
  // it is printed once, not at every poll.
  std::string warned_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CLI_CONTROL_FILE_H_
