#include "worker/image_folder.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/image_folder_scan.h"

namespace pstrain {
namespace {

// Runs fn(i) for i in [0, n) on `threads` threads. With `stop_on_failure`,
// once fn returns false no further index is handed out; every index below
// the failing one has been handed out already and still runs, so the
// lowest failing index is found whatever the timing.
void ParallelFor(int64_t n, int threads, bool stop_on_failure,
                 const std::function<bool(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    for (;;) {
      if (stop.load()) return;
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      if (!fn(i) && stop_on_failure) stop.store(true);
    }
  };
  const int64_t count = std::min<int64_t>(std::max(threads, 1), n);
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

// The first failure of `errors` (in file order), if any.
const absl::Status* FirstError(const std::vector<absl::Status>& errors) {
  for (const absl::Status& s : errors) {
    if (!s.ok()) return &s;
  }
  return nullptr;
}

// The shape every image of a dataset is decoded to (ProbeHeaders).
struct ProbedShape {
  int channels = 0;
  int height = 0;
  int width = 0;
};

// Decodes the files of `list` whose header probe succeeded (errors[i] OK)
// into a split of `shape` images.
absl::StatusOr<ImageFolderSplit> DecodeSplit(const std::string& where,
                                             const ImageFiles& list,
                                             std::vector<absl::Status> errors,
                                             const ProbedShape& shape,
                                             const ImageFolderOptions& options,
                                             int threads) {
  const bool fail = options.bad_images == BadImages::kFail;
  const int channels = shape.channels;
  const int64_t per = int64_t{channels} * shape.height * shape.width;
  std::vector<int64_t> slot_of(list.paths.size(), -1);
  int64_t slots = 0;
  for (size_t i = 0; i < list.paths.size(); ++i) {
    if (errors[i].ok()) slot_of[i] = slots++;
  }
  ImageFolderSplit split;
  split.chw[0] = channels;
  split.chw[1] = shape.height;
  split.chw[2] = shape.width;
  split.images.resize(static_cast<size_t>(slots * per));
  ParallelFor(
      static_cast<int64_t>(list.paths.size()), threads, fail, [&](int64_t i) {
        if (slot_of[i] < 0) return false;  // its header failed
        absl::StatusOr<DecodedImage> image = DecodeImageFile(list.paths[i]);
        if (!image.ok()) {
          errors[i] = image.status();
          return false;
        }
        ImageToChw(*image, channels, shape.height, shape.width,
                   split.images.data() + slot_of[i] * per);
        return true;
      });
  if (const absl::Status* first = FirstError(errors); first != nullptr) {
    if (fail) return *first;
    split.first_skipped = std::string(first->message());
  }
  // Close the gaps left by files that failed only when decoded.
  int64_t kept = 0;
  for (size_t i = 0; i < list.paths.size(); ++i) {
    if (!errors[i].ok()) {
      ++split.skipped;
      continue;
    }
    if (slot_of[i] != kept) {
      std::memmove(split.images.data() + kept * per,
                   split.images.data() + slot_of[i] * per, sizeof(float) * per);
    }
    split.labels.push_back(list.labels[i]);
    ++kept;
  }
  split.count = kept;
  split.images.resize(static_cast<size_t>(kept * per));
  if (kept == 0 && !list.paths.empty()) {
    return absl::DataLossError(absl::StrCat(
        where, ": none of its ", list.paths.size(),
        " image files could be read (first: ", split.first_skipped, ")"));
  }
  return split;
}

}  // namespace

int64_t DecodedImageBytes(int64_t count, int channels, int height, int width) {
  return count * channels * height * width *
         static_cast<int64_t>(sizeof(float));
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB"};
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1000;
  int unit = 0;
  while (value >= 1000 && unit < 3) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  return text;
}

absl::Status CheckDecodedBytes(const std::string& root, int64_t count,
                               int channels, int height, int width,
                               int64_t max_bytes) {
  const int64_t bytes = DecodedImageBytes(count, channels, height, width);
  if (max_bytes <= 0 || bytes <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(root, ": decoding ", count, " images of ", channels, "x",
                   height, "x", width, " floats needs ", FormatBytes(bytes),
                   ", over the limit of ", FormatBytes(max_bytes)));
}

namespace {

// INVALID_ARGUMENT naming the options if they are out of range.
absl::Status CheckOptions(const std::string& root,
                          const ImageFolderOptions& options) {
  if (options.image_size < 0 || options.image_size > 4096 ||
      (options.channels != 0 && options.channels != 1 &&
       options.channels != 3) ||
      options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        root, ": image_size ", options.image_size, ", channels ",
        options.channels, ", num_threads ", options.num_threads,
        "; expected image_size 0 (the images' own) to 4096, channels 0 "
        "(detect), 1 or 3, "
        "num_threads >= 0"));
  }
  return absl::OkStatus();
}

int ThreadsOf(const ImageFolderOptions& options) {
  return options.num_threads > 0
             ? options.num_threads
             : static_cast<int>(
                   std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

// Reads the header of every file of `train` and `test` (in that order):
// each file's error (OK where the header reads), and the shape they are
// decoded to: options.channels, or 3 if any header is colour, else 1; and
// options.image_size square, or with 0 the size every readable header has
// (INVALID_ARGUMENT naming two sizes and a file of each if they differ).
absl::StatusOr<ProbedShape> ProbeHeaders(
    const std::string& root, const ImageFiles& train, const ImageFiles& test,
    const ImageFolderOptions& options, int threads,
    std::vector<absl::Status>* train_errors,
    std::vector<absl::Status>* test_errors) {
  const size_t num_train = train.paths.size();
  std::vector<std::string> all = train.paths;
  all.insert(all.end(), test.paths.begin(), test.paths.end());
  std::vector<absl::Status> errors(all.size());
  std::vector<uint8_t> colour(all.size(), 0);
  std::vector<std::pair<int, int>> sizes(all.size());  // height, width
  ParallelFor(static_cast<int64_t>(all.size()), threads,
              /*stop_on_failure=*/false, [&](int64_t i) {
                absl::StatusOr<DecodedImage> header =
                    DecodeImageFile(all[i], /*header_only=*/true);
                if (!header.ok()) {
                  errors[i] = header.status();
                  return false;
                }
                colour[i] = header->channels == 3;
                sizes[i] = {header->height, header->width};
                return true;
              });
  ProbedShape shape;
  shape.channels = options.channels;
  if (shape.channels == 0) {
    shape.channels = std::any_of(colour.begin(), colour.end(),
                                 [](uint8_t c) { return c != 0; })
                         ? 3
                         : 1;
  }
  shape.height = shape.width = options.image_size;
  if (options.image_size == 0) {
    size_t first = all.size();  // the first readable file
    for (size_t i = 0; i < all.size(); ++i) {
      if (!errors[i].ok()) continue;
      if (first == all.size()) {
        first = i;
        std::tie(shape.height, shape.width) = sizes[i];
      } else if (sizes[i] != sizes[first]) {
        return absl::InvalidArgumentError(
            absl::StrCat(root, ": images differ in size: ", sizes[first].second,
                         "x", sizes[first].first, " (", all[first], ") and ",
                         sizes[i].second, "x", sizes[i].first, " (", all[i],
                         "); set --image_size to resize them all to one size"));
      }
    }
  }
  train_errors->assign(errors.begin(), errors.begin() + num_train);
  test_errors->assign(errors.begin() + num_train, errors.end());
  return shape;
}

// `list` less the files whose header failed (errors[i] not OK), counted in
// *skipped with the first in *first_skipped; with kFail the first is the
// error. DATA_LOSS when a non-empty list keeps nothing.
absl::StatusOr<ImageFiles> KeepReadable(const std::string& where,
                                        const ImageFiles& list,
                                        const std::vector<absl::Status>& errors,
                                        BadImages bad_images, int64_t* skipped,
                                        std::string* first_skipped) {
  ImageFiles kept;
  for (size_t i = 0; i < list.paths.size(); ++i) {
    if (!errors[i].ok()) {
      if (bad_images == BadImages::kFail) return errors[i];
      if (first_skipped->empty()) {
        *first_skipped = std::string(errors[i].message());
      }
      ++*skipped;
      continue;
    }
    kept.paths.push_back(list.paths[i]);
    kept.labels.push_back(list.labels[i]);
  }
  if (kept.paths.empty() && !list.paths.empty()) {
    return absl::DataLossError(absl::StrCat(
        where, ": none of its ", list.paths.size(),
        " image files could be read (first: ", *first_skipped, ")"));
  }
  return kept;
}

}  // namespace

absl::StatusOr<ImageFolderListing> ListImageFolder(
    const std::string& root, const ImageFolderOptions& options) {
  RETURN_IF_ERROR(CheckOptions(root, options));
  ASSIGN_OR_RETURN(ImageFolderScan scan, ScanImageFolder(root));
  ImageFolderListing listing;
  listing.layout = scan.layout;
  listing.class_names = std::move(scan.class_names);
  std::vector<absl::Status> train_errors, test_errors;
  ASSIGN_OR_RETURN(
      const ProbedShape shape,
      ProbeHeaders(root, scan.train, scan.test, options, ThreadsOf(options),
                   &train_errors, &test_errors));
  listing.channels = shape.channels;
  listing.height = shape.height;
  listing.width = shape.width;
  absl::StatusOr<ImageFiles> kept_train =
      KeepReadable(scan.train_dir, scan.train, train_errors, options.bad_images,
                   &listing.skipped, &listing.first_skipped);
  if (!kept_train.ok()) return kept_train.status();
  listing.train = *std::move(kept_train);
  absl::StatusOr<ImageFiles> kept_test =
      KeepReadable(scan.test_dir, scan.test, test_errors, options.bad_images,
                   &listing.skipped, &listing.first_skipped);
  if (!kept_test.ok()) return kept_test.status();
  listing.test = *std::move(kept_test);
  return listing;
}

absl::StatusOr<ImageFolderDataset> ReadImageFolderDataset(
    const std::string& root, const ImageFolderOptions& options) {
  RETURN_IF_ERROR(CheckOptions(root, options));
  ASSIGN_OR_RETURN(ImageFolderScan scan, ScanImageFolder(root));
  ImageFolderDataset dataset;
  dataset.layout = scan.layout;
  dataset.class_names = std::move(scan.class_names);
  const int threads = ThreadsOf(options);
  // Headers first, of every file: they decide the channel count before any
  // pixel is stored. Files that fail here are reported by DecodeSplit, in
  // file order with those that fail only when decoded.
  std::vector<absl::Status> train_errors, test_errors;
  ASSIGN_OR_RETURN(const ProbedShape shape,
                   ProbeHeaders(root, scan.train, scan.test, options, threads,
                                &train_errors, &test_errors));
  // The decoded set's size, from the headers, before any pixel.
  const auto readable = [](const std::vector<absl::Status>& errors) {
    return std::count_if(errors.begin(), errors.end(),
                         [](const absl::Status& s) { return s.ok(); });
  };
  RETURN_IF_ERROR(CheckDecodedBytes(
      root, readable(train_errors) + readable(test_errors), shape.channels,
      shape.height, shape.width, options.max_decoded_bytes));
  absl::StatusOr<ImageFolderSplit> train_split =
      DecodeSplit(scan.train_dir, scan.train, std::move(train_errors), shape,
                  options, threads);
  if (!train_split.ok()) return train_split.status();
  dataset.train = *std::move(train_split);
  absl::StatusOr<ImageFolderSplit> test_split =
      DecodeSplit(scan.test_dir, scan.test, std::move(test_errors), shape,
                  options, threads);
  if (!test_split.ok()) return test_split.status();
  dataset.test = *std::move(test_split);
  return dataset;
}

}  // namespace pstrain
