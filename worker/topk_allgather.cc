#include "worker/topk_allgather.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pstrain {

TopKAllgather::TopKAllgather(TopKCompressor* compressor, int64_t chunk_elements,
                             DType wire)
    : compressor_(compressor),
      chunk_elements_(std::max<int64_t>(1, chunk_elements)),
      wire_(wire) {}

TopKAllgather::Traffic TopKAllgather::TakeTraffic() {
  return std::exchange(traffic_, Traffic{});
}

absl::Status TopKAllgather::SumBucket(Collective& collective,
                                      absl::Span<const int> tensors,
                                      absl::Span<float> flat) {
  // This rank's selection, chunk by chunk (the partition's chunks of each
  // tensor, in order): counts_[c] pairs, their offsets within the chunk
  // in indices_ and their values in values_.
  indices_.clear();
  values_.clear();
  counts_.clear();
  std::vector<int64_t> chunk_sizes;
  int64_t position = 0;
  for (int t : tensors) {
    const int64_t n = compressor_->size(t);
    if (position + n > static_cast<int64_t>(flat.size())) {
      return absl::InternalError(absl::StrCat(
          "top-k allgather: tensor ", t, " of ", n, " elements at ", position,
          " overruns its bucket of ", flat.size()));
    }
    for (int64_t offset = 0; offset < n; offset += chunk_elements_) {
      const int64_t length = std::min(chunk_elements_, n - offset);
      compressor_->Compress(t, offset, flat.subspan(position + offset, length),
                            &chunk_indices_, &chunk_values_, wire_);
      indices_.insert(indices_.end(), chunk_indices_.begin(),
                      chunk_indices_.end());
      values_.insert(values_.end(), chunk_values_.begin(), chunk_values_.end());
      counts_.push_back(static_cast<int64_t>(chunk_indices_.size()));
      chunk_sizes.push_back(length);
    }
    position += n;
  }
  const int64_t pairs = static_cast<int64_t>(indices_.size());
  const int64_t chunks = static_cast<int64_t>(counts_.size());
  const bool fp16 = wire_ == DTYPE_FLOAT16;
  const int value_bytes = WireBytesPerElement(wire_);
  const int64_t bytes =
      4 * pairs + (fp16 ? 4 * chunks : 0) + value_bytes * pairs;
  const int size = collective.size();
  const int64_t dense_bytes = 4 * position;

  if (static_cast<int64_t>(size) * bytes >= 2 * dense_bytes) {
    // Dense fallback: the selections (rounded as the wire would round them)
    // in zeros, summed by the ring.
    std::fill(flat.begin(), flat.begin() + position, 0.0f);
    int64_t pair = 0;
    int64_t base = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      absl::Span<float> values(values_.data() + pair, counts_[c]);
      RoundThroughWire(wire_, values);
      for (int64_t i = 0; i < counts_[c]; ++i) {
        flat[base + indices_[pair + i]] = values[i];
      }
      // The chunk's start: the chunks lie one after the other.
      base += chunk_sizes[c];
      pair += counts_[c];
    }
    RETURN_IF_ERROR(collective.AllreduceSum(flat.data(), position));
    const int64_t ring = size > 1 ? 2 * (size - 1) * dense_bytes / size : 0;
    traffic_.sent += ring;
    traffic_.received += ring;
    return absl::OkStatus();
  }

  // This rank's message: offsets, (fp16) exponents, values.
  message_.resize(bytes);
  uint8_t* out = message_.data();
  std::memcpy(out, indices_.data(), 4 * pairs);
  out += 4 * pairs;
  if (value_bytes == 4) {
    std::memcpy(out, values_.data(), 4 * pairs);
  } else {
    std::vector<uint16_t> halves(pairs);
    std::vector<int32_t> exponents(chunks, 0);
    int64_t pair = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      absl::Span<const float> values(values_.data() + pair, counts_[c]);
      if (fp16) exponents[c] = ScaleExponent(values);
      EncodeHalves(values, wire_, exponents[c], halves.data() + pair);
      pair += counts_[c];
    }
    if (fp16) {
      std::memcpy(out, exponents.data(), 4 * chunks);
      out += 4 * chunks;
    }
    std::memcpy(out, halves.data(), 2 * pairs);
  }
  gathered_.resize(static_cast<size_t>(bytes) * size);
  RETURN_IF_ERROR(
      collective.Allgather(message_.data(), bytes, gathered_.data()));
  traffic_.sent += (size - 1) * bytes;
  traffic_.received += (size - 1) * bytes;

  // Every rank's pairs, in rank order, into zeros.
  std::fill(flat.begin(), flat.begin() + position, 0.0f);
  std::vector<uint32_t> offsets(pairs);
  std::vector<int32_t> exponents(fp16 ? chunks : 0);
  std::vector<uint16_t> halves(value_bytes == 2 ? pairs : 0);
  decoded_.resize(pairs);
  for (int r = 0; r < size; ++r) {
    const uint8_t* in = gathered_.data() + static_cast<size_t>(r) * bytes;
    std::memcpy(offsets.data(), in, 4 * pairs);
    in += 4 * pairs;
    if (value_bytes == 4) {
      std::memcpy(decoded_.data(), in, 4 * pairs);
    } else {
      if (fp16) {
        std::memcpy(exponents.data(), in, 4 * chunks);
        in += 4 * chunks;
      }
      std::memcpy(halves.data(), in, 2 * pairs);
    }
    int64_t pair = 0;
    int64_t base = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      if (value_bytes == 2) {
        DecodeHalves(halves.data() + pair, wire_, fp16 ? exponents[c] : 0,
                     absl::Span<float>(decoded_.data() + pair, counts_[c]));
      }
      for (int64_t i = 0; i < counts_[c]; ++i) {
        const uint32_t offset = offsets[pair + i];
        if (offset >= static_cast<uint64_t>(chunk_sizes[c])) {
          return absl::InternalError(
              absl::StrCat("top-k allgather: rank ", r, " sent offset ", offset,
                           " in a chunk of ", chunk_sizes[c], " elements"));
        }
        flat[base + offset] += decoded_[pair + i];
      }
      base += chunk_sizes[c];
      pair += counts_[c];
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
