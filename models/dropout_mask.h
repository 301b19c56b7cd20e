// Dropout masks shared by the CPU and CUDA backends: a counter-based draw,
// so that any element's keep-or-drop is computed on its own (the CPU fills a
// mask on every thread, a CUDA kernel on every GPU thread) and both
// backends draw the same mask for the same layer seed.
//
// Element i of a layer's c-th training forward (c = 1, 2, ...) is kept iff
//   u = (SplitMix64(s ^ SplitMix64(i)) >> 40) / 2^24 < keep,
//   s = seed + c * kDropoutCallStride,
// and its mask value is then 1 / keep, else 0 (inverted dropout, as
// torch.nn.Dropout). u has 24 bits, so keep is honoured to 2^-24.
// SplitMix64: Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators" (OOPSLA 2014), java.util.SplittableRandom's mixer; the
// counter-based design is Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC 2011), whose Philox PyTorch's CUDA dropout uses.
//
// Header-only, host and device (nvcc compiles it into models/cuda's
// kernels). Pure functions: thread-safe.
#ifndef PSTRAIN_MODELS_DROPOUT_MASK_H_
#define PSTRAIN_MODELS_DROPOUT_MASK_H_

#include <cstdint>

#if defined(__CUDACC__)
#define PSTRAIN_HOST_DEVICE __host__ __device__
#else
#define PSTRAIN_HOST_DEVICE
#endif

namespace pstrain {

// The golden-ratio increment of SplitMix64: call c's seed is
// seed + c * kDropoutCallStride.
inline constexpr uint64_t kDropoutCallStride = 0x9E3779B97F4A7C15ull;

PSTRAIN_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seed of a layer's `call`-th training forward (call >= 1).
PSTRAIN_HOST_DEVICE inline uint64_t DropoutCallSeed(uint64_t layer_seed,
                                                    uint64_t call) {
  return layer_seed + kDropoutCallStride * call;
}

// The layer seed of a transformer encoder block's k-th dropout (k = 0: the
// attention's own, `seed` unchanged; 1, 2, 3: after the attention, inside
// and after the feed-forward): both backends' blocks. Mixed rather than
// offset by multiples of kDropoutCallStride, so that no dropout's call c
// seed is another's call c' seed.
PSTRAIN_HOST_DEVICE inline uint64_t EncoderDropoutSeed(uint64_t seed,
                                                       uint64_t k) {
  return k == 0 ? seed : SplitMix64(seed ^ SplitMix64(k));
}

// Element i's mask value for call seed `call_seed`: `scale` (1 / keep) if
// kept, else 0.
PSTRAIN_HOST_DEVICE inline float DropoutMaskValue(uint64_t call_seed, int64_t i,
                                                  float keep, float scale) {
  const uint64_t r =
      SplitMix64(call_seed ^ SplitMix64(static_cast<uint64_t>(i)));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  return u < keep ? scale : 0.0f;
}

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_DROPOUT_MASK_H_
