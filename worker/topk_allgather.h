// Top-k compression with error feedback in mode allreduce (the job's
// `compression: "topk:R"` with `mode: allreduce`; issue 39 item 3): a sparse
// allgather in place of the dense ring allreduce.
//
// Each step, for each bucket of the allreduce exchange
// (worker/gradient_exchange.h), every rank compresses each chunk of the
// bucket's parameter gradients with its own TopKCompressor
// (worker/topk_compression.h: its residual added, the k = ceil(R * n)
// entries of the largest magnitude selected, the rest kept as its next
// residual), exactly as a PS worker compresses the same chunk: the chunks
// are those of the job's partition (PartitionPlan, common/partition.h:
// each tensor cut into chunks of at most `partition_bytes`), so a top-k
// allreduce job selects what a top-k PS job of the same partition_bytes
// pushes. Every rank's pairs then travel in one allgather
// (Collective::Allgather: k is a function of the step and the chunk's
// size, the same on every rank), and every rank sums them into zeros in
// rank order: the same sums on every rank, which are the sums a shard makes
// of the same sparse pushes (with two ranks, bit for bit: a + b = b + a).
// As in Renggli et al., "SparCML" (SC 2019) and Shi et al., "A
// Distributed Synchronous SGD Algorithm with Global Top-k Sparsification"
// (ICDCS 2019), which gather each worker's top-k rather than reduce dense
// buffers; an allgather costs each rank (W - 1) x its pairs' bytes in.
//
// Wire: a rank's message is its bucket's k values in the job's wire dtype
// (fp32 4 bytes; bf16 and fp16 2, each chunk's values encoded as a PS push
// encodes them: common/wire_dtype.h), so a 16-bit wire's values arrive
// rounded exactly as RoundThroughWire rounds them, which is the rounding
// the compressor fed back into the residual; then (float16) each chunk's
// scale exponent (int32); then each chunk's offsets as a PS push sends
// them (TensorChunk.index_gaps, proto/ps.proto: the first offset, then
// each minus the one before, one varint each, protobuf's encoding; about
// 1.3 bytes an offset at 1%, against a uint32's 4). The gaps' bytes
// differ by rank, so every rank's length goes first (an 8-byte allgather)
// and every message is padded to the longest.
//
// Where the pairs would cost more than the dense buffer (the warm-up's
// first, dense steps: W x the longest message >= 2 x 4 n bytes, the ring
// allreduce's traffic at fp32; decided before the lengths' round where a
// byte an offset already reaches it), the bucket goes as a dense fp32 ring
// allreduce of the selected (wire-rounded) values and zeros instead: the
// same sums (up to the order of additions with three or more ranks), fewer
// bytes. The choice depends on the step and every rank's lengths only, so
// every rank makes the same.
//
// Thread-compatible: one thread (the exchange's communication thread)
// calls SumBucket(); the compressor's BeginStep() and CommitStep() are the
// caller's, between steps.
#ifndef PSTRAIN_WORKER_TOPK_ALLGATHER_H_
#define PSTRAIN_WORKER_TOPK_ALLGATHER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/wire_dtype.h"
#include "worker/collective.h"
#include "worker/topk_compression.h"

namespace pstrain {

class TopKAllgather {
 public:
  // `compressor` (not owned) holds the rank's residuals of the model's
  // parameters; `chunk_elements` > 0: the partition's chunk bound in
  // elements (partition_bytes / 4); `wire`: the values' dtype.
  TopKAllgather(TopKCompressor* compressor, int64_t chunk_elements, DType wire);

  // One bucket: `gradients[i]` is this rank's gradient of parameter tensor
  // `tensors[i]` (ids of the compressor's tensors, of its sizes). On
  // return `sum` (the tensors' elements one after the other, in that
  // order; at least their total) holds, per element, the sum over the
  // ranks of what each selected (0 where no rank selected it). `sum` may be
  // the gradients' own memory laid out so: they are read first. The
  // compressor's step must have begun (BeginStep). Errors: INTERNAL where
  // a gradient's size is not its tensor's, or `sum` is short; the
  // collective's; INTERNAL where a rank's pairs do not fit its chunk (a
  // rank of another model or step).
  absl::Status SumBucket(Collective& collective, absl::Span<const int> tensors,
                         absl::Span<const absl::Span<const float>> gradients,
                         absl::Span<float> sum);

  // Bytes this rank sent and received in the SumBucket() calls since the
  // last Take (the ring's: allgather (W - 1) x (8 + the longest message)
  // each way; dense fallback 2 (W - 1) / W x 4 n each way, and (W - 1) x 8
  // more where the lengths' round decided it).
  struct Traffic {
    int64_t sent = 0;
    int64_t received = 0;
  };
  Traffic TakeTraffic();

 private:
  // Compresses each chunk of `gradients` (of `tensors`) into the
  // selections below; returns the bucket's elements (at most `capacity`).
  absl::StatusOr<int64_t> Select(
      absl::Span<const int> tensors,
      absl::Span<const absl::Span<const float>> gradients, int64_t capacity);
  // The dense fallback: the selections, wire-rounded, in zeros, summed by
  // the ring over `bucket`.
  absl::Status SumDense(Collective& collective, absl::Span<float> bucket);
  // This rank's message (the wire above) into message_; returns its bytes.
  int64_t Encode();
  // Adds rank `rank`'s message of `bytes` at `in` into `bucket`.
  absl::Status Accumulate(int rank, const uint8_t* in, int64_t bytes,
                          absl::Span<float> bucket);

  TopKCompressor* const compressor_;
  const int64_t chunk_elements_;
  const DType wire_;
  Traffic traffic_;
  // Scratch kept between buckets: the chunks' selections, this rank's
  // message, and every rank's.
  std::vector<uint32_t> indices_;
  std::vector<float> values_;
  std::vector<uint32_t> chunk_indices_;
  std::vector<float> chunk_values_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> chunk_sizes_;
  std::vector<uint16_t> halves_;
  std::vector<int32_t> exponents_;
  std::vector<int64_t> lengths_;
  std::vector<uint8_t> message_;
  std::vector<uint8_t> gathered_;
  std::vector<float> decoded_;
  std::vector<int64_t> positions_;  // Accumulate(): the pairs' in the bucket
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TOPK_ALLGATHER_H_
