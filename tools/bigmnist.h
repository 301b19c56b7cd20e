// bigMNIST: an N-times larger MNIST or Fashion-MNIST made by deterministic
// deformations of the original images, written as IDX files that
// --dataset=mnist / fashion_mnist read (memory-mapped, worker/dataset.h),
// so the bigMNIST experiments (about 8 million digits) can be rerun at any
// size, as the infinite-MNIST work (Loosli, Canu and Bottou 2007) did with
// its own deformations.
//
// Each output image is one source image through
//  1. a small random affine map about the image centre: rotation by
//     theta ~ U(-max_rotation_deg, max_rotation_deg), isotropic scale
//     s ~ U(1 - max_scale, 1 + max_scale), horizontal shear
//     k ~ U(-max_shear, max_shear) and translation t ~ U(-max_translation_px,
//     max_translation_px) per axis: output pixel p samples the source at
//     R(theta) Sh(k) (p - c) / s + c - t + d(p), c the centre;
//  2. plus the elastic distortion of Simard, Steinkraus and Platt 2003
//     ("Best Practices for Convolutional Neural Networks Applied to Visual
//     Document Analysis", section 2): d(p) = alpha * (G_sigma * u)(p), with
//     u a field of independent U(-1, 1) x and y displacements per pixel and
//     G_sigma a normalised Gaussian of standard deviation sigma pixels
//     (truncated at 4 sigma, zero outside the image, as scipy's
//     gaussian_filter(mode="constant")); the paper's alpha = 34, sigma = 4;
//  3. bilinear sampling, zero outside the source, rounded to the nearest
//     byte.
// The random numbers of output image o come from a generator seeded with a
// hash of (seed, o) alone, so the output is the same bytes for a seed
// whatever the number of threads.
//
// Thread-safety: DeformImage is reentrant; WriteBigMnist runs its own
// threads and returns when they are done.
#ifndef PSTRAIN_TOOLS_BIGMNIST_H_
#define PSTRAIN_TOOLS_BIGMNIST_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pstrain {

struct DeformOptions {
  double max_rotation_deg = 10.0;   // degrees
  double max_scale = 0.1;           // fraction: scale in [0.9, 1.1]
  double max_shear = 0.15;          // x += k * y, |k| <= 0.15
  double max_translation_px = 2.0;  // pixels, per axis
  double elastic_alpha = 34.0;      // pixels per unit of smoothed field
  double elastic_sigma = 4.0;       // pixels; 0 turns elastic off
};

// Writes the deformation of `in` (height x width bytes, row by row) drawn
// with `seed` to `out` (the same size; must not alias `in`).
void DeformImage(const uint8_t* in, int height, int width,
                 const DeformOptions& options, uint64_t seed, uint8_t* out);

struct BigMnistOptions {
  // Folder with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]
  // and the t10k-* pair (MNIST or Fashion-MNIST).
  std::string input_dir;
  // Folder for the plain IDX output (made if missing): train-* with
  // copies * N images, output image k * N + i being copy k of source image
  // i with its label; t10k-* copied from the input unchanged (the test set
  // stays the original one). Never input_dir (however spelled), and none
  // of its files may be an input file by another name (a link); each file
  // is written as <name>.tmp and renamed over <name>.
  std::string output_dir;
  int64_t copies = 10;
  // Copy 0 is the source image itself (not deformed) when set.
  bool include_originals = false;
  uint64_t seed = 1;
  int threads = 1;
  DeformOptions deform;
};

// Streams the output: memory holds the source set and one block of 8192
// output images, whatever `copies` is. INVALID_ARGUMENT for copies < 1, more
// than 2^31 output images, threads < 1 or negative deformation bounds, and
// for an output that would replace an input (output_dir above), before
// anything is read or written; ReadIdx's errors for the input; the errno
// of a write, naming the file.
absl::Status WriteBigMnist(const BigMnistOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_BIGMNIST_H_
