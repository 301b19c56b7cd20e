// Test-only: JPEG files as cameras and PIL write them, for the decoder's
// tests (image_write's WriteJpegFile writes 4:4:4 baseline only).
//
// Thread-safety: reentrant. Failures are gtest failures (ADD_FAILURE).
#ifndef PSTRAIN_WORKER_JPEG_TESTING_H_
#define PSTRAIN_WORKER_JPEG_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pstrain {
namespace testing {

struct JpegLike {
  int quality = 90;
  // Luma sampling factors over chroma's: 2 x 2 is 4:2:0 (libjpeg's and
  // PIL's default), 2 x 1 is 4:2:2, 1 x 1 is 4:4:4. Colour images only.
  int h_samp = 2;
  int v_samp = 2;
  bool progressive = false;
};

// Writes `pixels` (h x w x c interleaved bytes; c = 1 gray, 3 RGB, 4 CMYK)
// to `path` as a JPEG with libjpeg-turbo; the folder must exist.
void WriteJpegLike(const std::string& path, int h, int w, int c,
                   const std::vector<uint8_t>& pixels,
                   const JpegLike& like = JpegLike());

}  // namespace testing
}  // namespace pstrain

#endif  // PSTRAIN_WORKER_JPEG_TESTING_H_
