// Decoding one JPEG or PNG image, with libjpeg-turbo and libpng, and turning
// it into the float planes a model reads (worker/image_folder.h reads whole
// folders of them; worker/input_pipeline.h streams them).
//
// Pixels: each image is decoded to 8-bit grayscale or RGB (palette PNGs to
// RGB; 16-bit PNGs keep the high byte; alpha is dropped, not composited;
// CMYK JPEGs are read as Adobe's inverted CMYK), converted to the wanted
// channel count (gray to RGB by copying the plane; RGB to gray with the
// ITU-R 601-2 luma weights in PIL's integer form, (19595 R + 38470 G +
// 7471 B + 2^15) >> 16), scaled to [0, 1] (value / 255, as torchvision's
// ToTensor) and resized (ImageToChw). The resize is bilinear with half-pixel
// centres, as PyTorch's F.interpolate(mode="bilinear", align_corners=False,
// antialias=False) and OpenCV's INTER_LINEAR: output pixel x samples the
// input at max(0, (x + 0.5) * in / out - 0.5), between the two nearest
// pixels (the last one repeated at the edge). No antialiasing: shrinking by
// more than 2x drops detail (torchvision's Resize on PIL images
// antialiases). An image already of the size is copied exactly.
//
// Errors (absl::Status, one line): DATA_LOSS for an unreadable image
// ("corrupt JPEG (Premature end of JPEG file)"), with "PATH: " before it
// when read from a file. A JPEG counts as corrupt when libjpeg fails or
// warns (premature end, bad Huffman code, ...), except for its "extraneous
// bytes before marker" warning, which leaves the pixels whole. Decoding
// never prints and never exits the process: libjpeg and libpng errors are
// caught (setjmp/longjmp in their error handlers).
//
// Thread-safety: the functions are reentrant and may run concurrently on
// different inputs.
#ifndef PSTRAIN_WORKER_IMAGE_DECODE_H_
#define PSTRAIN_WORKER_IMAGE_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace pstrain {

// One decoded image: height x width pixels of `channels` (1: gray, 3: RGB)
// interleaved 8-bit values, row by row (HWC).
struct DecodedImage {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

// Largest image DecodeImage accepts, in pixels (width * height); larger ones
// are DATA_LOSS ("too large"), before anything is allocated for them.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

// Decodes a JPEG or PNG held in memory (the format from its signature).
// DATA_LOSS with the reason, without a file name: "empty file", "not a JPEG
// or PNG file (starts with 47 49 46 38)", "corrupt JPEG (...)", "corrupt PNG
// (...)", "... too large". `header_only`: reads the header alone and leaves
// `pixels` empty (height, width and channels set).
absl::StatusOr<DecodedImage> DecodeImage(const uint8_t* data, size_t size,
                                         bool header_only = false);

// Reads and decodes the file at `path`; errors as DecodeImage's, with
// "PATH: " before them; NOT_FOUND if it cannot be opened; DATA_LOSS for a
// FIFO, a device or a folder in its place (refused without waiting).
absl::StatusOr<DecodedImage> DecodeImageFile(const std::string& path,
                                             bool header_only = false);

// A window of an image's pixels: rows [top, top + height), columns
// [left, left + width).
struct PixelWindow {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// Picks the window to decode from the image's full height and width (from
// its header); called once, before any pixel is decoded. It must return a
// non-empty window inside the image.
using WindowPicker = absl::FunctionRef<PixelWindow(int height, int width)>;

// Reads the file at `path` and decodes the part of it that covers
// pick(height, width), as TensorFlow's decode_and_crop_jpeg: the returned
// image holds the pixels of *decoded, the window they cover in the full
// image (the picked window for a JPEG; the whole image for a PNG, which
// libpng decodes whole). The pixels equal the same window of
// DecodeImageFile's.
//
// JPEG: libjpeg-turbo inverse-transforms, upsamples and colour-converts
// only the picked rows and the iMCU columns that cover the picked columns
// (jpeg_crop_scanline, jpeg_skip_scanlines; libjpeg.txt "Partial image
// decompression"). Two more columns are decoded on each cropped side and
// dropped: libjpeg-turbo's fancy upsampling treats a cropped edge as the
// image's edge, so those columns may differ from a full decode's. The rows
// outside the window are still entropy-decoded, so a corrupt or truncated
// file is found exactly as by a full decode. Progressive JPEGs are decoded
// whole and the window copied out: with scans missing, libjpeg smooths
// across blocks, differently at a cropped edge.
//
// Errors: DecodeImageFile's; INVALID_ARGUMENT naming the path if the picked
// window is empty or not inside the image.
absl::StatusOr<DecodedImage> DecodeImageFileWindow(const std::string& path,
                                                   WindowPicker pick,
                                                   PixelWindow* decoded);

// DecodeImageFileWindow of bytes held in memory; errors as DecodeImage's.
absl::StatusOr<DecodedImage> DecodeImageWindow(const uint8_t* data, size_t size,
                                               WindowPicker pick,
                                               PixelWindow* decoded);

// Writes `image` as `channels` (1 or 3) planes of height x width floats in
// [0, 1] at `out` (channels * height * width values, NCHW order for one
// image), converting channels and resizing as the file comment says.
// `image` holds pixels (not header_only) and height, width >= 1.
void ImageToChw(const DecodedImage& image, int channels, int height, int width,
                float* out);

// ImageToChw to size x size planes.
void ImageToChw(const DecodedImage& image, int channels, int size, float* out);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_IMAGE_DECODE_H_
