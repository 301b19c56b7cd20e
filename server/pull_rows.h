// The rows a pull asks for (PullRequest.rows; issue 41): parsed and checked
// once when the pull is queued, then used to cut each row-sparse chunk's
// reply down to the requested rows it holds.
//
// Thread-compatible; a parsed PullRowSets is immutable and shared by the
// pull's writer.
#ifndef PSTRAIN_SERVER_PULL_ROWS_H_
#define PSTRAIN_SERVER_PULL_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/partition.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/ps.pb.h"

namespace pstrain {

// Per tensor of the plan: whether the pull names it, and its row ids
// (strictly ascending, below the table's row count).
struct PullRowSets {
  std::vector<bool> asked;
  std::vector<std::vector<uint32_t>> rows;
};

// Parses `pull.rows()` against `plan`. INVALID_ARGUMENT, naming the entry,
// for more entries than tensors, a param_id outside the plan or not
// row-sparse, a tensor named twice, row_ids not 4 bytes per id, or ids not
// strictly ascending (a duplicate) or past the table's rows. An empty
// pull.rows() gives an empty PullRowSets (every chunk whole).
absl::StatusOr<PullRowSets> ParsePullRows(const PullRequest& pull,
                                          const PartitionPlan& plan);

// The pull reply of chunk `spec` (weights of `version`): a row-sparse chunk
// of the rows of `asked` it holds (global row ids; row offsets on the
// wire), values in `wire`. `*payload_bytes`: the values' and indices'
// bytes.
grpc::ByteBuffer EncodeRowsReply(const ChunkSpec& spec, int64_t version,
                                 absl::Span<const float> weights,
                                 const std::vector<uint32_t>& asked, DType wire,
                                 int64_t* payload_bytes);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PULL_ROWS_H_
