// Fuzzes the image decoders a worker runs on the files of an image folder
// (worker/image_folder.h: libjpeg-turbo and libpng behind setjmp error
// handlers), whole and windowed as the input pipeline decodes a crop.
// Input: 4 bytes choosing the window (top, left, height, width as fractions
// of the image), then the file's bytes. Invariants: a failure is DATA_LOSS
// (never a crash, an exit or a print); the windowed decode fails exactly
// when the whole decode does (damage outside the window is still found);
// when both succeed the window's pixels are the whole decode's.
#include <algorithm>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "worker/image_folder.h"

namespace {

// Images above this many pixels are only probed: decoding a forged
// 8192 x 8192 header of noise would make each input take seconds.
constexpr int64_t kMaxDecodedPixels = int64_t{1} << 22;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstrain::fuzz::FuzzInput in(data, size);
  const uint8_t f[4] = {in.Take<uint8_t>(), in.Take<uint8_t>(),
                        in.Take<uint8_t>(), in.Take<uint8_t>()};
  const size_t n = in.size();
  const uint8_t* bytes = data + (size - n);
  absl::StatusOr<pstrain::DecodedImage> header =
      pstrain::DecodeImage(bytes, n, /*header_only=*/true);
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  FUZZ_CHECK(header->pixels.empty());
  if (int64_t{header->height} * header->width > kMaxDecodedPixels) return 0;
  absl::StatusOr<pstrain::DecodedImage> whole = pstrain::DecodeImage(bytes, n);
  pstrain::PixelWindow picked, decoded;
  absl::StatusOr<pstrain::DecodedImage> part = pstrain::DecodeImageWindow(
      bytes, n,
      [&](int h, int w) {
        picked.height = 1 + f[2] * (h - 1) / 255;
        picked.width = 1 + f[3] * (w - 1) / 255;
        picked.top = f[0] * (h - picked.height) / 255;
        picked.left = f[1] * (w - picked.width) / 255;
        return picked;
      },
      &decoded);
  FUZZ_CHECK(whole.ok() == part.ok());
  if (!whole.ok()) {
    FUZZ_CHECK(whole.status().code() == absl::StatusCode::kDataLoss);
    FUZZ_CHECK(part.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  const int c = whole->channels;
  FUZZ_CHECK(c == 1 || c == 3);
  FUZZ_CHECK(whole->pixels.size() ==
             static_cast<size_t>(whole->height) * whole->width * c);
  FUZZ_CHECK(part->channels == c);
  FUZZ_CHECK(part->height == decoded.height && part->width == decoded.width);
  FUZZ_CHECK(part->pixels.size() ==
             static_cast<size_t>(part->height) * part->width * c);
  // The decoded window holds the picked one and lies inside the image.
  FUZZ_CHECK(decoded.top >= 0 && decoded.left >= 0 &&
             decoded.top <= picked.top && decoded.left <= picked.left &&
             decoded.top + decoded.height >= picked.top + picked.height &&
             decoded.left + decoded.width >= picked.left + picked.width &&
             decoded.top + decoded.height <= whole->height &&
             decoded.left + decoded.width <= whole->width);
  for (int y = 0; y < decoded.height; ++y) {
    const uint8_t* a =
        &part->pixels[static_cast<size_t>(y) * decoded.width * c];
    const uint8_t* b =
        &whole->pixels[(static_cast<size_t>(y + decoded.top) * whole->width +
                        decoded.left) *
                       c];
    FUZZ_CHECK(std::equal(a, a + static_cast<size_t>(decoded.width) * c, b));
  }
  return 0;
}
