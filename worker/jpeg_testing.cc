#include "worker/jpeg_testing.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on

#include "gtest/gtest.h"

namespace pstrain {
namespace testing {

void WriteJpegLike(const std::string& path, int h, int w, int c,
                   const std::vector<uint8_t>& pixels, const JpegLike& like) {
  ASSERT_EQ(pixels.size(), static_cast<size_t>(h) * w * c) << path;
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : (c == 4 ? JCS_CMYK : JCS_RGB);
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, like.quality, TRUE);
  if (c == 3) {
    cinfo.comp_info[0].h_samp_factor = like.h_samp;
    cinfo.comp_info[0].v_samp_factor = like.v_samp;
  }
  if (like.progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * w * c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
}

}  // namespace testing
}  // namespace pstrain
