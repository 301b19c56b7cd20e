// Writing 8-bit images as JPEG (libjpeg-turbo) and PNG (libpng) files: the
// other direction of worker/image_folder, for tools that lay a dataset out
// as an image folder and for tests that make image files.
//
// Pixels are `height` x `width` x `channels` interleaved bytes (HWC, row
// after row; channels 1 = gray, 3 = RGB, and for PNG also 4 = RGBA).
// The file is written whole to `path` (its folder must exist); on an error
// the partial file is removed.
//
// Errors: INVALID_ARGUMENT for sizes or channel counts the format does not
// take, or a pixel buffer of the wrong size; INTERNAL naming the path for a
// file that cannot be opened or written, or an encoder error (libjpeg's
// message; libpng's). Nothing is printed and the process never exits:
// libjpeg and libpng errors are caught (setjmp/longjmp in their handlers).
//
// Thread-safety: reentrant; different files may be written concurrently.
#ifndef PSTRAIN_WORKER_IMAGE_WRITE_H_
#define PSTRAIN_WORKER_IMAGE_WRITE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

// Baseline JPEG at `quality` (1 to 100, libjpeg's scale), without chroma
// subsampling (4:4:4), so that gray and colour edges survive as well as the
// quality allows.
absl::Status WriteJpegFile(const std::string& path, int height, int width,
                           int channels, const std::vector<uint8_t>& pixels,
                           int quality);

// PNG, 8 bits per channel, no interlacing: decodes to exactly `pixels`.
absl::Status WritePngFile(const std::string& path, int height, int width,
                          int channels, const std::vector<uint8_t>& pixels);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_IMAGE_WRITE_H_
