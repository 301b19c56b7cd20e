#include "text/corpus.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/regular_file.h"

namespace pstrain {
namespace {

constexpr uint64_t kMaxFortuneFileBytes = uint64_t{64} << 20;

void AddEntry(std::string* entry, std::vector<std::string>* entries) {
  absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(*entry);
  if (!absl::StripLeadingAsciiWhitespace(trimmed).empty()) {
    entries->emplace_back(trimmed);
  }
  entry->clear();
}

// The names of the fortune databases in `dir`, sorted.
absl::StatusOr<std::vector<std::string>> ListDatabases(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    const int error = errno;
    return absl::NotFoundError(absl::StrCat(
        dir, ": cannot list: ", std::strerror(error),
        dir == kFortunesDir ? " (install Debian's fortunes package)" : ""));
  }
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || name.find('.') != std::string::npos) {
      continue;
    }
    struct stat st;
    const std::string path = absl::StrCat(dir, "/", name);
    if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      names.push_back(name);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> SplitFortunes(absl::string_view text) {
  std::vector<std::string> entries;
  std::string entry;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StripTrailingAsciiWhitespace(line) == "%") {
      AddEntry(&entry, &entries);
      continue;
    }
    absl::StrAppend(&entry, line, "\n");
  }
  AddEntry(&entry, &entries);
  return entries;
}

absl::StatusOr<std::vector<std::string>> ReadFortunes(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDatabases(dir);
  if (!names.ok()) return names.status();
  std::vector<std::string> documents;
  for (const std::string& name : *names) {
    absl::StatusOr<std::string> text =
        ReadSmallFile(absl::StrCat(dir, "/", name), kMaxFortuneFileBytes);
    if (!text.ok()) return text.status();
    for (std::string& entry : SplitFortunes(*text)) {
      documents.push_back(std::move(entry));
    }
  }
  if (documents.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": no fortune entries in ", names->size(), " files"));
  }
  return documents;
}

}  // namespace pstrain
