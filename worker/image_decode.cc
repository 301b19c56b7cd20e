#include "worker/image_decode.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"

namespace pstrain {
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
constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  // Never blocks: a FIFO, a device or a folder in the file's place is an
  // unreadable image (DATA_LOSS naming it); symbolic links are followed.
  absl::StatusOr<RegularFile> file =
      OpenRegularFile(path, /*follow_symlinks=*/true);
  if (file.status().code() == absl::StatusCode::kInvalidArgument) {
    return absl::DataLossError(file.status().message());
  }
  if (!file.ok()) return file.status();
  const uint64_t size = file->size_bytes();
  if (size > kMaxImageFileBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size,
                                            " bytes (expected at most ",
                                            kMaxImageFileBytes, ")"));
  }
  // One read of the size the file has now (a file that shrinks meanwhile is
  // a read error).
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  absl::Status read =
      file->ReadAt(path, 0, reinterpret_cast<char*>(bytes.data()), size);
  if (!read.ok()) return read;
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

void ImageToChw(const DecodedImage& image, int channels, int height, int width,
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
    ResizePlane(source.data(), image.height, image.width, height, width,
                out + static_cast<size_t>(ch) * height * width);
  }
}

void ImageToChw(const DecodedImage& image, int channels, int size, float* out) {
  ImageToChw(image, channels, size, size, out);
}

}  // namespace pstrain
