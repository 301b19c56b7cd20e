#include "worker/image_folder_scan.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/regular_file.h"

namespace pstrain {
namespace fs = std::filesystem;
namespace {

bool IsHidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.empty() || name[0] == '.';
}

bool IsImageName(const fs::path& p) {
  const std::string ext = absl::AsciiStrToLower(p.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

bool IsDir(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

bool IsFile(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// Non-hidden subfolders of `dir` by name, sorted.
absl::StatusOr<std::vector<std::string>> Subfolders(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (IsHidden(it->path())) continue;
    if (IsDir(it->path().string())) {
      names.push_back(it->path().filename().string());
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": cannot list it: ", error.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Image files in `dir` and its non-hidden subfolders, sorted by path;
// DATA_LOSS if there are none.
absl::StatusOr<std::vector<std::string>> ImageFilesUnder(
    const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  fs::recursive_directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    if (IsHidden(it->path())) {
      if (it->is_directory(error)) it.disable_recursion_pending();
      continue;
    }
    if (IsImageName(it->path()) && !it->is_directory(error)) {
      files.push_back(it->path().string());
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": cannot list it: ", error.message()));
  }
  if (files.empty()) {
    return absl::DataLossError(
        absl::StrCat(dir, ": no image files (*.jpg, *.jpeg, *.png)"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Class folders `dir`/<name>/..., labelled by `classes` (which must hold
// every folder's name).
absl::Status AddClassFolders(const std::string& dir,
                             const std::vector<std::string>& classes,
                             ImageFiles* list) {
  absl::StatusOr<std::vector<std::string>> names = Subfolders(dir);
  if (!names.ok()) return names.status();
  if (names->empty()) {
    return absl::DataLossError(absl::StrCat(
        dir, ": no class folders (expected ", dir, "/<class>/*.jpg|jpeg|png)"));
  }
  for (const std::string& name : *names) {
    const auto it = std::lower_bound(classes.begin(), classes.end(), name);
    if (it == classes.end() || *it != name) {
      return absl::DataLossError(absl::StrCat(
          dir, "/", name, ": class \"", name, "\" has no training folder"));
    }
    absl::StatusOr<std::vector<std::string>> files =
        ImageFilesUnder(absl::StrCat(dir, "/", name));
    if (!files.ok()) return files.status();
    for (std::string& f : *files) {
      list->paths.push_back(std::move(f));
      list->labels.push_back(static_cast<int32_t>(it - classes.begin()));
    }
  }
  return absl::OkStatus();
}

// The largest class list or annotation table read, in bytes (ImageNet's
// validation labels are 1.5 MB).
constexpr uint64_t kMaxListBytes = uint64_t{256} << 20;

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path) {
  // Never blocks (a FIFO in the file's place is refused) and reads at most
  // kMaxListBytes: a class list or an annotation table, not a dataset.
  absl::StatusOr<std::string> text =
      ReadSmallFile(path, kMaxListBytes, /*follow_symlinks=*/true);
  if (!text.ok()) return absl::DataLossError(text.status().message());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  // As getline: a last newline ends the last line, it starts none.
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// tiny-ImageNet: wnids.txt, train/<wnid>/images, val/images +
// val_annotations.txt.
absl::Status ListTinyImagenet(const std::string& root,
                              std::vector<std::string>* classes,
                              ImageFiles* train, ImageFiles* test) {
  const std::string wnids_path = root + "/wnids.txt";
  absl::StatusOr<std::vector<std::string>> lines = ReadLines(wnids_path);
  if (!lines.ok()) return lines.status();
  std::set<std::string> seen;
  for (size_t i = 0; i < lines->size(); ++i) {
    const std::string wnid(absl::StripAsciiWhitespace((*lines)[i]));
    if (wnid.empty()) continue;
    if (wnid.find('/') != std::string::npos || wnid[0] == '.' ||
        !seen.insert(wnid).second) {
      return absl::DataLossError(absl::StrCat(wnids_path, " line ", i + 1,
                                              ": bad or repeated class id \"",
                                              wnid, "\""));
    }
  }
  if (seen.empty()) {
    return absl::DataLossError(absl::StrCat(wnids_path, ": no class ids"));
  }
  classes->assign(seen.begin(), seen.end());
  const std::string train_dir = root + "/train";
  if (!IsDir(train_dir)) {
    return absl::DataLossError(absl::StrCat(
        train_dir, ": no such folder (tiny-ImageNet layout: ", wnids_path,
        " is there)"));
  }
  for (const std::string& wnid : *classes) {
    if (!IsDir(absl::StrCat(train_dir, "/", wnid))) {
      return absl::DataLossError(absl::StrCat(wnids_path, " lists ", wnid,
                                              " but ", train_dir, "/", wnid,
                                              " is missing"));
    }
  }
  if (absl::Status s = AddClassFolders(train_dir, *classes, train); !s.ok()) {
    return s;
  }
  const std::string val_dir = root + "/val";
  if (!IsDir(val_dir)) return absl::OkStatus();  // no test split
  const std::string annotations = val_dir + "/val_annotations.txt";
  absl::StatusOr<std::vector<std::string>> rows = ReadLines(annotations);
  if (!rows.ok()) return rows.status();
  std::vector<std::pair<std::string, int32_t>> entries;
  for (size_t i = 0; i < rows->size(); ++i) {
    const std::string row(absl::StripAsciiWhitespace((*rows)[i]));
    if (row.empty()) continue;
    std::vector<std::string> fields =
        absl::StrSplit(row, absl::ByAnyChar("\t "), absl::SkipEmpty());
    if (fields.size() < 2 || fields[0].find('/') != std::string::npos) {
      return absl::DataLossError(
          absl::StrCat(annotations, " line ", i + 1,
                       ": expected \"<file>\\t<wnid>...\", got \"", row, "\""));
    }
    const auto it =
        std::lower_bound(classes->begin(), classes->end(), fields[1]);
    if (it == classes->end() || *it != fields[1]) {
      return absl::DataLossError(absl::StrCat(annotations, " line ", i + 1,
                                              ": class ", fields[1],
                                              " is not in ", wnids_path));
    }
    entries.emplace_back(absl::StrCat(val_dir, "/images/", fields[0]),
                         static_cast<int32_t>(it - classes->begin()));
  }
  if (entries.empty()) {
    return absl::DataLossError(absl::StrCat(annotations, ": no images"));
  }
  std::sort(entries.begin(), entries.end());
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].first == entries[i - 1].first) {
      return absl::DataLossError(absl::StrCat(
          annotations, ": ", entries[i].first, " is listed twice"));
    }
  }
  for (auto& [path, label] : entries) {
    test->paths.push_back(std::move(path));
    test->labels.push_back(label);
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<ImageFolderScan> ScanImageFolder(const std::string& root) {
  std::error_code error;
  if (!fs::exists(root, error)) {
    return absl::NotFoundError(absl::StrCat(root, ": no such folder"));
  }
  if (!IsDir(root)) {
    return absl::InvalidArgumentError(absl::StrCat(
        root, ": not a folder (expected a folder of class folders)"));
  }
  ImageFolderScan scan;
  if (IsFile(root + "/wnids.txt")) {
    scan.layout = "tiny_imagenet";
    scan.train_dir = root + "/train";
    if (absl::Status s =
            ListTinyImagenet(root, &scan.class_names, &scan.train, &scan.test);
        !s.ok())
      return s;
    scan.test_dir = root + "/val";
  } else if (IsDir(root + "/train")) {
    scan.layout = "split_class_folders";
    scan.train_dir = root + "/train";
    absl::StatusOr<std::vector<std::string>> classes =
        Subfolders(scan.train_dir);
    if (!classes.ok()) return classes.status();
    scan.class_names = *std::move(classes);
    if (absl::Status s =
            AddClassFolders(scan.train_dir, scan.class_names, &scan.train);
        !s.ok())
      return s;
    for (const char* name : {"/val", "/test"}) {
      if (IsDir(root + name)) {
        scan.test_dir = root + name;
        break;
      }
    }
    if (!scan.test_dir.empty()) {
      if (absl::Status s =
              AddClassFolders(scan.test_dir, scan.class_names, &scan.test);
          !s.ok())
        return s;
    }
  } else {
    absl::StatusOr<std::vector<std::string>> classes = Subfolders(root);
    if (!classes.ok()) return classes.status();
    if (classes->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          root,
          ": unknown layout: no class folders; expected ROOT/<class>/"
          "*.jpg|jpeg|png, ROOT/train/<class>/... beside ROOT/val/<class>/"
          "..., or tiny-ImageNet's wnids.txt, train/<wnid>/images and "
          "val/images with val/val_annotations.txt"));
    }
    scan.layout = "class_folders";
    scan.train_dir = root;
    scan.class_names = *std::move(classes);
    if (absl::Status s = AddClassFolders(root, scan.class_names, &scan.train);
        !s.ok())
      return s;
  }
  return scan;
}

}  // namespace pstrain
