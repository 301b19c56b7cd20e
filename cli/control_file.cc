#include "cli/control_file.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/regular_file.h"

namespace pstrain {
namespace {

constexpr char kExpected[] =
    "expected [num_workers=N] [num_ps=M] [at_step=S], with num_workers, "
    "num_ps or both";

// At most this many bytes are read per Poll (a runaway writer cannot make
// the run read without bound).
constexpr int64_t kMaxPollBytes = 1 << 20;

}  // namespace

absl::StatusOr<ScaleLine> ParseControlLine(absl::string_view line) {
  ScaleLine scale;
  bool has_workers = false;
  bool has_ps = false;
  bool has_step = false;
  const std::string quoted =
      absl::StrCat("\"", line.substr(0, ControlFile::kMaxLineBytes), "\"");
  for (absl::string_view word :
       absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(word, absl::MaxSplits('=', 1));
    if (kv.first == "num_workers" && !has_workers &&
        absl::SimpleAtoi(kv.second, &scale.num_workers) &&
        scale.num_workers >= 1) {
      has_workers = true;
    } else if (kv.first == "num_ps" && !has_ps &&
               absl::SimpleAtoi(kv.second, &scale.num_ps) &&
               scale.num_ps >= 1) {
      has_ps = true;
    } else if (kv.first == "at_step" && !has_step &&
               absl::SimpleAtoi(kv.second, &scale.at_step) &&
               scale.at_step >= 0) {
      has_step = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(quoted, ": \"", word, "\"; ", kExpected,
                       " (N >= 1, M >= 1, S >= 0, each once)"));
    }
  }
  if (!has_workers && !has_ps) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, ": ", kExpected));
  }
  return scale;
}

std::vector<ScaleLine> ControlFile::Poll() {
  std::vector<ScaleLine> requests;
  // Never blocks: a FIFO or a device in the file's place is refused (a
  // warning, once) rather than waited on by the run's supervisor.
  absl::StatusOr<RegularFile> file =
      OpenRegularFile(path_, /*follow_symlinks=*/true);
  if (!file.ok()) {
    const std::string message(file.status().message());
    if (file.status().code() != absl::StatusCode::kNotFound &&
        message != warned_) {
      std::fprintf(stderr, "pstrain: warning: %s; ignored\n", message.c_str());
      std::fflush(stderr);
    }
    warned_ = message;
    return requests;
  }
  warned_.clear();
  const int64_t size = static_cast<int64_t>(file->size_bytes());
  if (size < offset_) {  // written anew
    offset_ = 0;
    line_ = 0;
  }
  if (size == offset_) return requests;
  const int64_t want = std::min(size - offset_, kMaxPollBytes);
  std::string bytes(static_cast<size_t>(want), '\0');
  if (!file->ReadAt(path_, static_cast<uint64_t>(offset_), bytes.data(),
                    static_cast<uint64_t>(want))
           .ok()) {
    return requests;  // it shrank meanwhile: read again at the next poll
  }
  size_t start = 0;
  while (start < bytes.size()) {
    size_t end = bytes.find('\n', start);
    size_t next = end + 1;
    if (end == std::string::npos) {
      // An unfinished line waits for its newline, unless it is already too
      // long to be one.
      if (bytes.size() - start <= kMaxLineBytes) break;
      end = next = bytes.size();
    }
    ++line_;
    const absl::string_view line = absl::StripAsciiWhitespace(
        absl::string_view(bytes).substr(start, end - start));
    start = next;
    if (line.empty() || line[0] == '#') continue;
    absl::StatusOr<ScaleLine> scale =
        line.size() > kMaxLineBytes
            ? absl::InvalidArgumentError(
                  absl::StrCat("a line of ", line.size(),
                               " bytes; expected at most ", kMaxLineBytes))
            : ParseControlLine(line);
    if (!scale.ok()) {
      std::fprintf(stderr, "pstrain: warning: %s:%d: %s; ignored\n",
                   path_.c_str(), line_,
                   std::string(scale.status().message()).c_str());
      std::fflush(stderr);
      continue;
    }
    requests.push_back(*scale);
  }
  offset_ += static_cast<int64_t>(start);
  return requests;
}

}  // namespace pstrain
