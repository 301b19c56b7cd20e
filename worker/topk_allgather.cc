#include "worker/topk_allgather.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"

namespace pstrain {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

TopKAllgather::TopKAllgather(TopKCompressor* compressor, int64_t chunk_elements,
                             DType wire)
    : compressor_(compressor),
      chunk_elements_(std::max<int64_t>(1, chunk_elements)),
      wire_(wire) {}

TopKAllgather::Traffic TopKAllgather::TakeTraffic() {
  return std::exchange(traffic_, Traffic{});
}

absl::StatusOr<int64_t> TopKAllgather::Select(
    absl::Span<const int> tensors,
    absl::Span<const absl::Span<const float>> gradients, int64_t capacity) {
  indices_.clear();
  values_.clear();
  counts_.clear();
  chunk_sizes_.clear();
  if (gradients.size() != tensors.size()) {
    return absl::InternalError(
        absl::StrCat("top-k allgather: ", gradients.size(), " gradients for ",
                     tensors.size(), " tensors"));
  }
  // Every size first: nothing is compressed (no residual written) for a
  // bucket that does not fit.
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = compressor_->size(tensors[i]);
    if (static_cast<int64_t>(gradients[i].size()) != n) {
      return absl::InternalError(
          absl::StrCat("top-k allgather: tensor ", tensors[i], " has ", n,
                       " elements; its gradient ", gradients[i].size()));
    }
    total += n;
  }
  if (total > capacity) {
    return absl::InternalError(absl::StrCat("top-k allgather: the bucket has ",
                                            total, " elements; the sum holds ",
                                            capacity));
  }
  int64_t position = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int t = tensors[i];
    const int64_t n = compressor_->size(t);
    const absl::Span<const float> gradient = gradients[i];
    for (int64_t offset = 0; offset < n; offset += chunk_elements_) {
      const int64_t length = std::min(chunk_elements_, n - offset);
      compressor_->Compress(t, offset, gradient.subspan(offset, length),
                            &chunk_indices_, &chunk_values_, wire_);
      indices_.insert(indices_.end(), chunk_indices_.begin(),
                      chunk_indices_.end());
      values_.insert(values_.end(), chunk_values_.begin(), chunk_values_.end());
      counts_.push_back(static_cast<int64_t>(chunk_indices_.size()));
      chunk_sizes_.push_back(length);
    }
    position += n;
  }
  return position;
}

absl::Status TopKAllgather::SumDense(Collective& collective,
                                     absl::Span<float> flat) {
  std::fill(flat.begin(), flat.end(), 0.0f);
  int64_t pair = 0;
  int64_t base = 0;
  for (size_t c = 0; c < counts_.size(); ++c) {
    absl::Span<float> values(values_.data() + pair, counts_[c]);
    RoundThroughWire(wire_, values);
    for (int64_t i = 0; i < counts_[c]; ++i) {
      flat[base + indices_[pair + i]] = values[i];
    }
    // The chunk's start: the chunks lie one after the other.
    base += chunk_sizes_[c];
    pair += counts_[c];
  }
  RETURN_IF_ERROR(collective.AllreduceSum(flat.data(), flat.size()));
  const int size = collective.size();
  const int64_t dense_bytes = 4 * static_cast<int64_t>(flat.size());
  const int64_t ring = size > 1 ? 2 * (size - 1) * dense_bytes / size : 0;
  traffic_.sent += ring;
  traffic_.received += ring;
  return absl::OkStatus();
}

int64_t TopKAllgather::Encode() {
  const int64_t pairs = static_cast<int64_t>(indices_.size());
  const int64_t chunks = static_cast<int64_t>(counts_.size());
  const bool fp16 = wire_ == DTYPE_FLOAT16;
  const int value_bytes = WireBytesPerElement(wire_);
  int64_t gap_bytes = 0;
  int64_t pair = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    gap_bytes +=
        IndexGapBytes(absl::MakeConstSpan(indices_.data() + pair, counts_[c]));
    pair += counts_[c];
  }
  const int64_t bytes =
      value_bytes * pairs + (fp16 ? 4 * chunks : 0) + gap_bytes;
  message_.resize(bytes);
  uint8_t* out = message_.data();
  if (value_bytes == 4) {
    std::memcpy(out, values_.data(), 4 * pairs);
    out += 4 * pairs;
  } else {
    halves_.resize(pairs);
    exponents_.assign(chunks, 0);
    pair = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      absl::Span<const float> values(values_.data() + pair, counts_[c]);
      if (fp16) exponents_[c] = ScaleExponent(values);
      EncodeHalves(values, wire_, exponents_[c], halves_.data() + pair);
      pair += counts_[c];
    }
    std::memcpy(out, halves_.data(), 2 * pairs);
    out += 2 * pairs;
    if (fp16) {
      std::memcpy(out, exponents_.data(), 4 * chunks);
      out += 4 * chunks;
    }
  }
  // Each chunk's offsets as varint gaps from the chunk's start.
  pair = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    uint32_t before = 0;
    for (int64_t i = 0; i < counts_[c]; ++i) {
      const uint32_t at = indices_[pair + i];
      out = CodedOutputStream::WriteVarint32ToArray(at - before, out);
      before = at;
    }
    pair += counts_[c];
  }
  return bytes;
}

absl::Status TopKAllgather::Accumulate(int rank, const uint8_t* in,
                                       int64_t bytes, absl::Span<float> flat) {
  const int64_t pairs = static_cast<int64_t>(indices_.size());
  const int64_t chunks = static_cast<int64_t>(counts_.size());
  const bool fp16 = wire_ == DTYPE_FLOAT16;
  const int value_bytes = WireBytesPerElement(wire_);
  // The fixed part (values, exponents) fits: Sum() checked every rank's
  // message is at least as long.
  decoded_.resize(pairs);
  if (value_bytes == 4) {
    std::memcpy(decoded_.data(), in, 4 * pairs);
  } else {
    halves_.resize(pairs);
    std::memcpy(halves_.data(), in, 2 * pairs);
    exponents_.assign(chunks, 0);
    if (fp16) std::memcpy(exponents_.data(), in + 2 * pairs, 4 * chunks);
    int64_t pair = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      DecodeHalves(halves_.data() + pair, wire_, exponents_[c],
                   absl::Span<float>(decoded_.data() + pair, counts_[c]));
      pair += counts_[c];
    }
  }
  const int64_t fixed = value_bytes * pairs + (fp16 ? 4 * chunks : 0);
  // The offsets first, checked, as positions in the bucket; then the sums,
  // each position's cache line fetched ahead (the pairs are scattered over
  // the bucket, a miss each).
  CodedInputStream gaps(in + fixed, static_cast<int>(bytes - fixed));
  positions_.resize(pairs);
  int64_t pair = 0;
  int64_t base = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t offset = 0;
    for (int64_t i = 0; i < counts_[c]; ++i) {
      uint32_t gap = 0;
      if (!gaps.ReadVarint32(&gap) || (i > 0 && gap == 0)) {
        return absl::InternalError(
            absl::StrCat("top-k allgather: rank ", rank,
                         " sent a truncated or repeated offset in chunk ", c));
      }
      offset += gap;
      if (offset >= static_cast<uint64_t>(chunk_sizes_[c])) {
        return absl::InternalError(absl::StrCat(
            "top-k allgather: rank ", rank, " sent offset ", offset,
            " in a chunk of ", chunk_sizes_[c], " elements"));
      }
      positions_[pair + i] = base + static_cast<int64_t>(offset);
    }
    base += chunk_sizes_[c];
    pair += counts_[c];
  }
  constexpr int64_t kAhead = 16;  // pairs
  float* const sum = flat.data();
  const int64_t* const at = positions_.data();
  const float* const value = decoded_.data();
  for (int64_t i = 0; i < pairs; ++i) {
    if (i + kAhead < pairs) __builtin_prefetch(sum + at[i + kAhead], 1);
    sum[at[i]] += value[i];
  }
  return absl::OkStatus();
}

absl::Status TopKAllgather::SumBucket(
    Collective& collective, absl::Span<const int> tensors,
    absl::Span<const absl::Span<const float>> gradients,
    absl::Span<float> sum) {
  ASSIGN_OR_RETURN(
      const int64_t position,
      Select(tensors, gradients, static_cast<int64_t>(sum.size())));
  absl::Span<float> bucket = sum.first(position);
  const int64_t pairs = static_cast<int64_t>(indices_.size());
  const int64_t chunks = static_cast<int64_t>(counts_.size());
  const int value_bytes = WireBytesPerElement(wire_);
  const int64_t fixed =
      value_bytes * pairs + (wire_ == DTYPE_FLOAT16 ? 4 * chunks : 0);
  const int size = collective.size();
  const int64_t dense_bytes = 4 * position;
  // Every rank knows every rank's k, so the fixed part and the least the
  // gaps take (a byte each) decide the dense steps without a round.
  if (static_cast<int64_t>(size) * (fixed + pairs) >= 2 * dense_bytes) {
    return SumDense(collective, bucket);
  }
  const int64_t bytes = Encode();
  // The gaps' bytes differ by rank: every rank's length first, then every
  // message padded to the longest.
  lengths_.resize(size);
  RETURN_IF_ERROR(collective.Allgather(&bytes, sizeof(bytes), lengths_.data()));
  const int64_t longest = *std::max_element(lengths_.begin(), lengths_.end());
  traffic_.sent += (size - 1) * static_cast<int64_t>(sizeof(bytes));
  traffic_.received += (size - 1) * static_cast<int64_t>(sizeof(bytes));
  for (int r = 0; r < size; ++r) {
    if (lengths_[r] < fixed + pairs || lengths_[r] > fixed + 5 * pairs) {
      return absl::InternalError(
          absl::StrCat("top-k allgather: rank ", r, " sent a message of ",
                       lengths_[r], " bytes; expected ", fixed + pairs, " to ",
                       fixed + 5 * pairs, " for its ", pairs, " pairs"));
    }
  }
  if (static_cast<int64_t>(size) * longest >= 2 * dense_bytes) {
    return SumDense(collective, bucket);
  }
  message_.resize(longest, 0);
  gathered_.resize(static_cast<size_t>(longest) * size);
  RETURN_IF_ERROR(
      collective.Allgather(message_.data(), longest, gathered_.data()));
  traffic_.sent += (size - 1) * longest;
  traffic_.received += (size - 1) * longest;

  // Every rank's pairs, in rank order, into zeros.
  std::fill(bucket.begin(), bucket.end(), 0.0f);
  for (int r = 0; r < size; ++r) {
    RETURN_IF_ERROR(
        Accumulate(r, gathered_.data() + static_cast<size_t>(r) * longest,
                   lengths_[r], bucket));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
