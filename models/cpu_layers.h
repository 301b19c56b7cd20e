// The CPU backend's CNN layers: convolution, linear, batch normalisation,
// ReLU, max/average/global-average pooling, add, flatten and dropout, on
// oneDNN 2.6 primitives over host memory (layer_spec.h says what each
// computes, after its PyTorch module). Internal to models/: the CPU
// backend's CreateLayer() calls it.
//
// Activations are NCHW, or oneDNN's channel-blocked nChw16c / nChw8c
// (DeviceTensor::layout) between a convolution and the flatten; parameters
// are dense (OIHW for convolutions). Shapes are checked when the model is
// built (layer_spec.h OutputShape). Errors: FAILED_PRECONDITION for a
// backward without a training forward of the same shape; INTERNAL for a
// oneDNN error (its message).
//
// Thread-safety: as backend.h's layers, one training thread per layer;
// primitives are created under cpu_dnnl::CreationMutex().
#ifndef PSTRAIN_MODELS_CPU_LAYERS_H_
#define PSTRAIN_MODELS_CPU_LAYERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/backend.h"
#include "models/layer_spec.h"

namespace pstrain {

// The layer for a spec of type kConv2d, kLinear, kBatchNorm2d, kRelu,
// kMaxPool2d, kAvgPool2d, kGlobalAvgPool, kAdd, kFlatten or kDropout, with
// `params` and `buffers` as ParamSpecs(spec) and BufferSpecs(spec) list
// them; `seed` drives the dropout mask; `bf16`: convolutions and linear
// layers compute in bf16 with fp32 accumulation (Backend::SetPrecision).
// INVALID_ARGUMENT for another type.
absl::StatusOr<std::unique_ptr<Layer>> NewCpuCnnLayer(
    const LayerSpec& spec, std::vector<Param*> params,
    std::vector<Buffer*> buffers, uint64_t seed, bool bf16);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CPU_LAYERS_H_
