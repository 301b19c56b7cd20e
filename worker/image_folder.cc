#include "worker/image_folder.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace pstrain {
namespace fs = std::filesystem;
namespace {

std::string Hex4(const uint8_t* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : " ",
                    absl::Hex(data[i], absl::kZeroPad2));
  }
  return out;
}

absl::Status TooLarge(const char* format, int64_t width, int64_t height) {
  return absl::DataLossError(absl::StrCat(format, " of ", width, " x ", height,
                                          " pixels: too large (at most ",
                                          kMaxImagePixels, " pixels)"));
}

// Whether `w` is non-empty and inside a height x width image.
bool WindowInside(const PixelWindow& w, int height, int width) {
  return w.height >= 1 && w.width >= 1 && w.top >= 0 && w.left >= 0 &&
         w.top <= height - w.height && w.left <= width - w.width;
}

absl::Status BadWindow(const PixelWindow& w, int height, int width) {
  return absl::InvalidArgumentError(absl::StrCat(
      "window of ", w.height, " x ", w.width, " pixels at row ", w.top,
      ", column ", w.left, ": expected a non-empty window inside the ", height,
      " x ", width, " image"));
}

// ---------------------------------------------------------------- JPEG --

// libjpeg's error manager with a way out: error_exit longjmps back to the
// decoder instead of calling exit(); warnings that mean damaged pixels are
// kept; nothing is printed.
struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg sees only this part
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool damaged;
  char warning[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  JpegErrors* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  longjmp(errors->jump, 1);
}

void JpegEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  JpegErrors* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  ++cinfo->err->num_warnings;
  // Extraneous bytes before a marker are skipped; the pixels are whole.
  if (cinfo->err->msg_code == JWRN_EXTRANEOUS_DATA) return;
  if (!errors->damaged) {
    (*cinfo->err->format_message)(cinfo, errors->warning);
    errors->damaged = true;
  }
}

void JpegOutputMessage(j_common_ptr) {}

struct JpegState {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  bool created = false;
  bool bad_window = false;  // the picked window is not inside the image
};

// Columns decoded beyond a cropped side of a window and dropped
// (DecodeImageFileWindow): libjpeg-turbo's fancy upsampling treats a
// cropped edge as the image's edge, which changes the edge column.
constexpr int kCropMargin = 2;

// The libjpeg calls, between setjmp and the last call that may longjmp. No
// object with a destructor lives in this frame, and everything it changes is
// reached through pointers, so the longjmp leaves nothing undefined.
// `pick` (may be null: the whole image) chooses the window decoded; *window
// is set to it, and `row` is scratch for a cropped scanline.
bool RunJpeg(JpegState* s, const uint8_t* data, size_t size, bool header_only,
             const WindowPicker* pick, DecodedImage* out,
             std::vector<uint8_t>* cmyk, std::vector<uint8_t>* row,
             PixelWindow* window) {
  if (setjmp(s->errors.jump) != 0) return false;
  jpeg_create_decompress(&s->cinfo);
  s->created = true;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  out->width = static_cast<int>(s->cinfo.image_width);
  out->height = static_cast<int>(s->cinfo.image_height);
  const J_COLOR_SPACE space = s->cinfo.jpeg_color_space;
  out->channels = space == JCS_GRAYSCALE ? 1 : 3;
  if (header_only || int64_t{out->width} * out->height > kMaxImagePixels) {
    return true;
  }
  *window = {0, 0, out->height, out->width};
  if (pick != nullptr) {
    *window = (*pick)(out->height, out->width);
    if (!WindowInside(*window, out->height, out->width)) {
      s->bad_window = true;  // DecodeJpeg reports it.
      return true;
    }
  }
  if (space == JCS_GRAYSCALE) {
    s->cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (space == JCS_CMYK || space == JCS_YCCK) {
    s->cinfo.out_color_space = JCS_CMYK;
  } else {
    s->cinfo.out_color_space = JCS_RGB;
  }
  jpeg_start_decompress(&s->cinfo);
  const size_t components = static_cast<size_t>(s->cinfo.output_components);
  // A progressive file whose scans leave coefficients out is smoothed
  // across blocks (do_block_smoothing), and a cropped row is smoothed
  // differently at its edges (image_decode_fuzzer found it): progressive
  // files are decoded whole, and the window copied out.
  const bool whole = s->cinfo.progressive_mode;
  const bool crop = window->width < out->width;
  size_t skip = 0;  // bytes of a decoded row left of the window
  if (whole) {
    skip = components * window->left;
    row->resize(components * s->cinfo.output_width);
  } else if (crop) {
    // Moved left to an iMCU boundary by libjpeg-turbo, width grown to match.
    JDIMENSION x =
        static_cast<JDIMENSION>(std::max(0, window->left - kCropMargin));
    JDIMENSION width = static_cast<JDIMENSION>(
        std::min(out->width, window->left + window->width + kCropMargin) -
        static_cast<int>(x));
    jpeg_crop_scanline(&s->cinfo, &x, &width);
    skip = components * (window->left - x);
    row->resize(components * s->cinfo.output_width);
  }
  const size_t row_bytes = components * window->width;
  std::vector<uint8_t>* target =
      s->cinfo.out_color_space == JCS_CMYK ? cmyk : &out->pixels;
  target->resize(row_bytes * window->height);
  const JDIMENSION top = static_cast<JDIMENSION>(window->top);
  const JDIMENSION bottom = top + static_cast<JDIMENSION>(window->height);
  if (whole) {
    while (s->cinfo.output_scanline < top) {
      JSAMPROW into = row->data();
      jpeg_read_scanlines(&s->cinfo, &into, 1);
    }
  } else if (top > 0) {
    jpeg_skip_scanlines(&s->cinfo, top);
  }
  const bool copy = crop || whole;  // decoded rows wider than the window
  while (s->cinfo.output_scanline < bottom) {
    uint8_t* to = target->data() + row_bytes * (s->cinfo.output_scanline - top);
    JSAMPROW into = copy ? row->data() : to;
    jpeg_read_scanlines(&s->cinfo, &into, 1);
    if (copy) std::memcpy(to, row->data() + skip, row_bytes);
  }
  // The rest is entropy-decoded only (no transform) but for its last row,
  // so that damage below the window is found as a full decode finds it.
  // (jpeg_skip_scanlines to the very end only moves the counter.)
  const JDIMENSION left = s->cinfo.output_height - s->cinfo.output_scanline;
  if (left > 0) {
    if (left > 1) jpeg_skip_scanlines(&s->cinfo, left - 1);
    row->resize(components * s->cinfo.output_width);
    JSAMPROW last = row->data();
    jpeg_read_scanlines(&s->cinfo, &last, 1);
  }
  jpeg_finish_decompress(&s->cinfo);
  return true;
}

absl::StatusOr<DecodedImage> DecodeJpeg(const uint8_t* data, size_t size,
                                        bool header_only,
                                        const WindowPicker* pick,
                                        PixelWindow* window) {
  DecodedImage out;
  std::vector<uint8_t> cmyk, row;
  PixelWindow picked;
  JpegState s;
  s.cinfo.err = jpeg_std_error(&s.errors.mgr);
  s.errors.mgr.error_exit = JpegErrorExit;
  s.errors.mgr.emit_message = JpegEmitMessage;
  s.errors.mgr.output_message = JpegOutputMessage;
  s.errors.damaged = false;
  s.errors.message[0] = s.errors.warning[0] = '\0';
  const bool ok =
      RunJpeg(&s, data, size, header_only, pick, &out, &cmyk, &row, &picked);
  if (s.created) jpeg_destroy_decompress(&s.cinfo);
  if (!ok) {
    return absl::DataLossError(
        absl::StrCat("corrupt JPEG (", s.errors.message, ")"));
  }
  if (s.errors.damaged) {
    return absl::DataLossError(
        absl::StrCat("corrupt JPEG (", s.errors.warning, ")"));
  }
  if (int64_t{out.width} * out.height > kMaxImagePixels) {
    return TooLarge("JPEG", out.width, out.height);
  }
  if (header_only) return out;
  if (s.bad_window) return BadWindow(picked, out.height, out.width);
  out.height = picked.height;
  out.width = picked.width;
  if (window != nullptr) *window = picked;
  if (!cmyk.empty()) {
    // Adobe's CMYK JPEGs store inverted values: R = C * K / 255.
    out.pixels.resize(cmyk.size() / 4 * 3);
    for (size_t i = 0, j = 0; i < cmyk.size(); i += 4, j += 3) {
      const unsigned k = cmyk[i + 3];
      for (int c = 0; c < 3; ++c) {
        out.pixels[j + c] =
            static_cast<uint8_t>((cmyk[i + c] * k + 127u) / 255u);
      }
    }
  }
  return out;
}

// ----------------------------------------------------------------- PNG --

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngInput input;
  char message[256];
};

void PngError(png_structp png, png_const_charp message) {
  PngState* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  PngInput* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (n > in->size - in->pos) png_error(png, "truncated file");
  std::memcpy(out, in->data + in->pos, n);
  in->pos += n;
}

// The libpng calls under setjmp; as RunJpeg, nothing with a destructor
// lives in this frame.
bool RunPng(PngState* s, bool header_only, DecodedImage* out,
            std::vector<png_bytep>* rows) {
  if (setjmp(png_jmpbuf(s->png)) != 0) return false;
  png_set_read_fn(s->png, &s->input, PngRead);
  png_set_user_limits(s->png, 1u << 20, 1u << 20);
  png_read_info(s->png, s->info);
  out->width = static_cast<int>(png_get_image_width(s->png, s->info));
  out->height = static_cast<int>(png_get_image_height(s->png, s->info));
  const int color = png_get_color_type(s->png, s->info);
  out->channels = (color & PNG_COLOR_MASK_COLOR) != 0 ? 3 : 1;
  if (header_only || int64_t{out->width} * out->height > kMaxImagePixels) {
    return true;
  }
  // To 8-bit gray or RGB: palettes and low bit depths expanded, 16-bit to
  // its high byte, alpha (tRNS included) dropped.
  png_set_expand(s->png);
  png_set_strip_16(s->png);
  png_set_strip_alpha(s->png);
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  const size_t row_bytes = png_get_rowbytes(s->png, s->info);
  if (row_bytes != static_cast<size_t>(out->width) * out->channels) {
    png_error(s->png, "unexpected row size after conversion to 8 bits");
  }
  out->pixels.resize(row_bytes * out->height);
  rows->resize(out->height);
  for (int y = 0; y < out->height; ++y) {
    (*rows)[y] = out->pixels.data() + row_bytes * y;
  }
  png_read_image(s->png, rows->data());
  png_read_end(s->png, nullptr);
  return true;
}

absl::StatusOr<DecodedImage> DecodePng(const uint8_t* data, size_t size,
                                       bool header_only) {
  DecodedImage out;
  std::vector<png_bytep> rows;
  PngState s;
  s.input = {data, size, 0};
  s.message[0] = '\0';
  s.png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, PngError, PngWarning);
  if (s.png == nullptr) {
    return absl::ResourceExhaustedError("libpng: cannot create a reader");
  }
  s.info = png_create_info_struct(s.png);
  bool ok = s.info != nullptr;
  if (ok) ok = RunPng(&s, header_only, &out, &rows);
  png_destroy_read_struct(&s.png, s.info != nullptr ? &s.info : nullptr,
                          nullptr);
  if (!ok) {
    return absl::DataLossError(absl::StrCat("corrupt PNG (", s.message, ")"));
  }
  if (int64_t{out.width} * out.height > kMaxImagePixels) {
    return TooLarge("PNG", out.width, out.height);
  }
  return out;
}

// Largest image file read, in bytes.
constexpr std::streamoff kMaxImageFileBytes = std::streamoff{1} << 30;

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  // One read of the size the file has now (a file that shrinks meanwhile is
  // a read error).
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0);
  if (size < 0 || size > kMaxImageFileBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size,
                                            " bytes (expected at most ",
                                            kMaxImageFileBytes, ")"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    return absl::DataLossError(absl::StrCat(path, ": read error"));
  }
  return bytes;
}

// ------------------------------------------------------------- resize --

// One plane of `ih` x `iw` floats to `oh` x `ow`, bilinear with half-pixel
// centres (PyTorch's upsample_bilinear2d, align_corners=False).
void ResizePlane(const float* in, int ih, int iw, int oh, int ow, float* out) {
  if (ih == oh && iw == ow) {
    std::memcpy(out, in, sizeof(float) * oh * ow);
    return;
  }
  struct Tap {
    int i0, i1;
    float l0, l1;
  };
  auto taps = [](int in_size, int size) {
    std::vector<Tap> t(size);
    const float scale = static_cast<float>(in_size) / size;
    for (int o = 0; o < size; ++o) {
      float src = scale * (o + 0.5f) - 0.5f;
      if (src < 0) src = 0;
      const int i0 = std::min(static_cast<int>(src), in_size - 1);
      const int i1 = i0 + (i0 < in_size - 1 ? 1 : 0);
      const float l1 = src - i0;
      t[o] = {i0, i1, 1.0f - l1, l1};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(ih, oh), tx = taps(iw, ow);
  for (int y = 0; y < oh; ++y) {
    const float* r0 = in + static_cast<size_t>(ty[y].i0) * iw;
    const float* r1 = in + static_cast<size_t>(ty[y].i1) * iw;
    float* o = out + static_cast<size_t>(y) * ow;
    for (int x = 0; x < ow; ++x) {
      const Tap& t = tx[x];
      o[x] = ty[y].l0 * (t.l0 * r0[t.i0] + t.l1 * r0[t.i1]) +
             ty[y].l1 * (t.l0 * r1[t.i0] + t.l1 * r1[t.i1]);
    }
  }
}

// ------------------------------------------------------------ folders --

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

using FileList = ImageFiles;

// Class folders `dir`/<name>/..., labelled by `classes` (which must hold
// every folder's name).
absl::Status AddClassFolders(const std::string& dir,
                             const std::vector<std::string>& classes,
                             FileList* list) {
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

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::DataLossError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// tiny-ImageNet: wnids.txt, train/<wnid>/images, val/images +
// val_annotations.txt.
absl::Status ListTinyImagenet(const std::string& root,
                              std::vector<std::string>* classes,
                              FileList* train, FileList* test) {
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

void ImageToChwSized(const DecodedImage& image, int channels, int oh, int ow,
                     float* out);

// Decodes the files of `list` whose header probe succeeded (errors[i] OK)
// into a split of `shape` images.
absl::StatusOr<ImageFolderSplit> DecodeSplit(const std::string& where,
                                             const FileList& list,
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
        ImageToChwSized(*image, channels, shape.height, shape.width,
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

namespace {

// DecodeImage, and DecodeImageFileWindow's decode when `pick` is set.
absl::StatusOr<DecodedImage> DecodeAny(const uint8_t* data, size_t size,
                                       bool header_only,
                                       const WindowPicker* pick,
                                       PixelWindow* window) {
  if (size == 0) return absl::DataLossError("empty file");
  static constexpr uint8_t kPng[8] = {0x89, 'P',  'N',  'G',
                                      '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    return DecodeJpeg(data, size, header_only, pick, window);
  }
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) {
    absl::StatusOr<DecodedImage> image = DecodePng(data, size, header_only);
    if (!image.ok() || pick == nullptr) return image;
    // libpng decodes whole images: the window is the image.
    const PixelWindow picked = (*pick)(image->height, image->width);
    if (!WindowInside(picked, image->height, image->width)) {
      return BadWindow(picked, image->height, image->width);
    }
    *window = {0, 0, image->height, image->width};
    return image;
  }
  return absl::DataLossError(absl::StrCat(
      "not a JPEG or PNG file (starts with ", Hex4(data, size), ")"));
}

absl::StatusOr<DecodedImage> DecodeFile(const std::string& path,
                                        bool header_only,
                                        const WindowPicker* pick,
                                        PixelWindow* window) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<DecodedImage> image =
      DecodeAny(bytes->data(), bytes->size(), header_only, pick, window);
  if (!image.ok()) {
    return absl::Status(image.status().code(),
                        absl::StrCat(path, ": ", image.status().message()));
  }
  return image;
}

}  // namespace

absl::StatusOr<DecodedImage> DecodeImage(const uint8_t* data, size_t size,
                                         bool header_only) {
  return DecodeAny(data, size, header_only, nullptr, nullptr);
}

absl::StatusOr<DecodedImage> DecodeImageFile(const std::string& path,
                                             bool header_only) {
  return DecodeFile(path, header_only, nullptr, nullptr);
}

absl::StatusOr<DecodedImage> DecodeImageWindow(const uint8_t* data, size_t size,
                                               WindowPicker pick,
                                               PixelWindow* decoded) {
  return DecodeAny(data, size, /*header_only=*/false, &pick, decoded);
}

absl::StatusOr<DecodedImage> DecodeImageFileWindow(const std::string& path,
                                                   WindowPicker pick,
                                                   PixelWindow* decoded) {
  return DecodeFile(path, /*header_only=*/false, &pick, decoded);
}

namespace {

// ImageToChw to `oh` x `ow` planes.
void ImageToChwSized(const DecodedImage& image, int channels, int oh, int ow,
                     float* out) {
  const size_t plane = static_cast<size_t>(image.height) * image.width;
  std::vector<float> source(plane);
  const uint8_t* p = image.pixels.data();
  const int c = image.channels;
  for (int ch = 0; ch < channels; ++ch) {
    if (c == 1 || channels == 3) {
      // Gray to gray, gray copied to each of R, G, B, or one of R, G, B.
      const int from = c == 1 ? 0 : ch;
      for (size_t j = 0; j < plane; ++j) {
        source[j] = p[j * c + from] * (1.0f / 255.0f);
      }
    } else {
      // RGB to gray: PIL's convert("L").
      for (size_t j = 0; j < plane; ++j) {
        const uint32_t luma = (p[3 * j] * 19595u + p[3 * j + 1] * 38470u +
                               p[3 * j + 2] * 7471u + 0x8000u) >>
                              16;
        source[j] = luma * (1.0f / 255.0f);
      }
    }
    ResizePlane(source.data(), image.height, image.width, oh, ow,
                out + static_cast<size_t>(ch) * oh * ow);
  }
}

}  // namespace

void ImageToChw(const DecodedImage& image, int channels, int size, float* out) {
  ImageToChwSized(image, channels, size, size, out);
}

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

// The layout under `root`, its classes and the files of each split (not
// yet probed); `test_dir` the test split's folder ("" without one).
absl::Status ListLayout(const std::string& root,
                        const ImageFolderOptions& options, std::string* layout,
                        std::vector<std::string>* class_names, FileList* train,
                        FileList* test, std::string* test_dir) {
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
  std::error_code error;
  if (!fs::exists(root, error)) {
    return absl::NotFoundError(absl::StrCat(root, ": no such folder"));
  }
  if (!IsDir(root)) {
    return absl::InvalidArgumentError(absl::StrCat(
        root, ": not a folder (expected a folder of class folders)"));
  }
  if (IsFile(root + "/wnids.txt")) {
    *layout = "tiny_imagenet";
    if (absl::Status s = ListTinyImagenet(root, class_names, train, test);
        !s.ok())
      return s;
    *test_dir = root + "/val";
  } else if (IsDir(root + "/train")) {
    *layout = "split_class_folders";
    const std::string train_dir = root + "/train";
    absl::StatusOr<std::vector<std::string>> classes = Subfolders(train_dir);
    if (!classes.ok()) return classes.status();
    *class_names = *std::move(classes);
    if (absl::Status s = AddClassFolders(train_dir, *class_names, train);
        !s.ok())
      return s;
    for (const char* name : {"/val", "/test"}) {
      if (IsDir(root + name)) {
        *test_dir = root + name;
        break;
      }
    }
    if (!test_dir->empty()) {
      if (absl::Status s = AddClassFolders(*test_dir, *class_names, test);
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
    *layout = "class_folders";
    *class_names = *std::move(classes);
    if (absl::Status s = AddClassFolders(root, *class_names, train); !s.ok())
      return s;
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
    const std::string& root, const FileList& train, const FileList& test,
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
absl::StatusOr<FileList> KeepReadable(const std::string& where,
                                      const FileList& list,
                                      const std::vector<absl::Status>& errors,
                                      BadImages bad_images, int64_t* skipped,
                                      std::string* first_skipped) {
  FileList kept;
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
  ImageFolderListing listing;
  FileList train, test;
  std::string test_dir;
  if (absl::Status s =
          ListLayout(root, options, &listing.layout, &listing.class_names,
                     &train, &test, &test_dir);
      !s.ok())
    return s;
  std::vector<absl::Status> train_errors, test_errors;
  ASSIGN_OR_RETURN(const ProbedShape shape,
                   ProbeHeaders(root, train, test, options, ThreadsOf(options),
                                &train_errors, &test_errors));
  listing.channels = shape.channels;
  listing.height = shape.height;
  listing.width = shape.width;
  absl::StatusOr<FileList> kept_train =
      KeepReadable(listing.layout == "class_folders" ? root : root + "/train",
                   train, train_errors, options.bad_images, &listing.skipped,
                   &listing.first_skipped);
  if (!kept_train.ok()) return kept_train.status();
  listing.train = *std::move(kept_train);
  absl::StatusOr<FileList> kept_test =
      KeepReadable(test_dir, test, test_errors, options.bad_images,
                   &listing.skipped, &listing.first_skipped);
  if (!kept_test.ok()) return kept_test.status();
  listing.test = *std::move(kept_test);
  return listing;
}

absl::StatusOr<ImageFolderDataset> ReadImageFolderDataset(
    const std::string& root, const ImageFolderOptions& options) {
  ImageFolderDataset dataset;
  FileList train, test;
  std::string test_dir;
  if (absl::Status s =
          ListLayout(root, options, &dataset.layout, &dataset.class_names,
                     &train, &test, &test_dir);
      !s.ok())
    return s;
  const int threads = ThreadsOf(options);
  // Headers first, of every file: they decide the channel count before any
  // pixel is stored. Files that fail here are reported by DecodeSplit, in
  // file order with those that fail only when decoded.
  std::vector<absl::Status> train_errors, test_errors;
  ASSIGN_OR_RETURN(const ProbedShape shape,
                   ProbeHeaders(root, train, test, options, threads,
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
      DecodeSplit(dataset.layout == "class_folders" ? root : root + "/train",
                  train, std::move(train_errors), shape, options, threads);
  if (!train_split.ok()) return train_split.status();
  dataset.train = *std::move(train_split);
  absl::StatusOr<ImageFolderSplit> test_split = DecodeSplit(
      test_dir, test, std::move(test_errors), shape, options, threads);
  if (!test_split.ok()) return test_split.status();
  dataset.test = *std::move(test_split);
  return dataset;
}

}  // namespace pstrain
