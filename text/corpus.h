// A real English corpus from a Debian package: the fortune(6) databases of
// `fortunes` (/usr/share/games/fortunes, 2.5 MB of quotations, jokes and
// definitions in UTF-8, about 15,000 entries), read as documents for
// tokenizer training and masked-language-model data (issue 41).
//
// A fortune file is a sequence of entries separated by lines that hold a
// single "%"; its index (.dat) and UTF-8 alias (.u8, a symbolic link) sit
// beside it.
//
// Thread-safety: plain functions.
#ifndef PSTRAIN_TEXT_CORPUS_H_
#define PSTRAIN_TEXT_CORPUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// Where Debian's `fortunes` package puts its databases.
inline constexpr char kFortunesDir[] = "/usr/share/games/fortunes";

// The entries of fortune file `text`, in file order: each one's lines
// (without the "%" separators), trailing whitespace removed; entries that
// are empty or only whitespace are dropped.
std::vector<std::string> SplitFortunes(absl::string_view text);

// The entries of every fortune database in `dir` (regular files whose name
// has no extension, in name order; .dat indexes, .u8 links and folders
// skipped). Errors: NOT_FOUND naming `dir` when it cannot be listed (with
// "install Debian's fortunes package" for the default folder),
// INVALID_ARGUMENT when it holds no entries, and the file reader's
// (common/regular_file.h; files over 64 MiB are DATA_LOSS).
absl::StatusOr<std::vector<std::string>> ReadFortunes(
    const std::string& dir = kFortunesDir);

}  // namespace pstrain

#endif  // PSTRAIN_TEXT_CORPUS_H_
