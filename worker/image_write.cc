#include "worker/image_write.h"

// clang-format off
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

absl::Status CheckImage(const char* format, int height, int width, int channels,
                        size_t bytes, bool rgba_allowed) {
  if (height < 1 || width < 1 || height > 65500 || width > 65500) {
    return absl::InvalidArgumentError(
        absl::StrCat(format, ": ", width, " x ", height,
                     " pixels; expected 1 to 65500 each way"));
  }
  if (channels != 1 && channels != 3 && !(rgba_allowed && channels == 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat(format, ": ", channels, " channels; expected 1 or 3",
                     rgba_allowed ? " or 4" : ""));
  }
  const size_t expected = static_cast<size_t>(height) * width * channels;
  if (bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        format, ": ", bytes, " bytes of pixels; expected ", expected));
  }
  return absl::OkStatus();
}

// `bytes` to `path`, or the partial file removed and an INTERNAL error.
absl::Status WriteBytes(const std::string& path, const uint8_t* data,
                        size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out.write(reinterpret_cast<const char*>(data), size);
  if (out) out.close();
  if (!out) {
    const int error = errno;
    std::remove(path.c_str());
    return absl::InternalError(
        absl::StrCat(path, ": cannot write: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- JPEG --

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg sees only this part
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  JpegErrors* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  longjmp(errors->jump, 1);
}

void JpegOutputMessage(j_common_ptr) {}

// Only plain C state between setjmp and a longjmp: no destructor is skipped.
// The encoded bytes are in *out (malloc'd by libjpeg, freed by the caller).
bool EncodeJpeg(jpeg_compress_struct* cinfo, JpegErrors* errors, int height,
                int width, int channels, const uint8_t* pixels, int quality,
                unsigned char** out, unsigned long* out_size) {
  if (setjmp(errors->jump) != 0) return false;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, out, out_size);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  cinfo->input_components = channels;
  cinfo->in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(cinfo);
  jpeg_set_quality(cinfo, quality, TRUE);
  for (int k = 0; k < cinfo->num_components; ++k) {  // 4:4:4
    cinfo->comp_info[k].h_samp_factor = 1;
    cinfo->comp_info[k].v_samp_factor = 1;
  }
  jpeg_start_compress(cinfo, TRUE);
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels) +
                   static_cast<size_t>(cinfo->next_scanline) * width * channels;
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

// ----------------------------------------------------------------- PNG --

struct PngSink {
  std::vector<uint8_t>* bytes;
};

void PngWrite(png_structp png, png_bytep data, png_size_t size) {
  PngSink* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  sink->bytes->insert(sink->bytes->end(), data, data + size);
}

void PngFlush(png_structp) {}

void PngError(png_structp png, png_const_charp message) {
  char* out = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(out, 200, "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

bool EncodePng(png_structp png, png_infop info, int height, int width,
               int channels, const uint8_t* pixels) {
  if (setjmp(png_jmpbuf(png)) != 0) return false;
  png_set_IHDR(png, info, static_cast<png_uint_32>(width),
               static_cast<png_uint_32>(height), 8,
               channels == 1   ? PNG_COLOR_TYPE_GRAY
               : channels == 3 ? PNG_COLOR_TYPE_RGB
                               : PNG_COLOR_TYPE_RGBA,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < height; ++y) {
    png_write_row(png, const_cast<png_bytep>(pixels) +
                           static_cast<size_t>(y) * width * channels);
  }
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

absl::Status WriteJpegFile(const std::string& path, int height, int width,
                           int channels, const std::vector<uint8_t>& pixels,
                           int quality) {
  if (absl::Status s = CheckImage("JPEG", height, width, channels,
                                  pixels.size(), /*rgba_allowed=*/false);
      !s.ok()) {
    return s;
  }
  if (quality < 1 || quality > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("JPEG quality ", quality, "; expected 1 to 100"));
  }
  jpeg_compress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = JpegErrorExit;
  errors.mgr.output_message = JpegOutputMessage;
  errors.message[0] = '\0';
  unsigned char* encoded = nullptr;
  unsigned long encoded_size = 0;
  const bool ok = EncodeJpeg(&cinfo, &errors, height, width, channels,
                             pixels.data(), quality, &encoded, &encoded_size);
  jpeg_destroy_compress(&cinfo);
  absl::Status status = ok ? WriteBytes(path, encoded, encoded_size)
                           : absl::InternalError(absl::StrCat(
                                 path, ": JPEG encoder: ", errors.message));
  std::free(encoded);
  return status;
}

absl::Status WritePngFile(const std::string& path, int height, int width,
                          int channels, const std::vector<uint8_t>& pixels) {
  if (absl::Status s = CheckImage("PNG", height, width, channels, pixels.size(),
                                  /*rgba_allowed=*/true);
      !s.ok()) {
    return s;
  }
  char message[200] = "";
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, message,
                                            PngError, PngWarning);
  if (png == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": PNG encoder: no memory"));
  }
  png_infop info = png_create_info_struct(png);
  std::vector<uint8_t> encoded;
  PngSink sink{&encoded};
  png_set_write_fn(png, &sink, PngWrite, PngFlush);
  const bool ok = info != nullptr &&
                  EncodePng(png, info, height, width, channels, pixels.data());
  png_destroy_write_struct(&png, &info);
  if (!ok) {
    return absl::InternalError(absl::StrCat(path, ": PNG encoder: ", message));
  }
  return WriteBytes(path, encoded.data(), encoded.size());
}

}  // namespace pstrain
