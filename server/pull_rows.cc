#include "server/pull_rows.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/chunk_message.h"
#include "common/wire_dtype.h"

namespace pstrain {

absl::StatusOr<PullRowSets> ParsePullRows(const PullRequest& pull,
                                          const PartitionPlan& plan) {
  PullRowSets out;
  if (pull.rows().empty()) return out;
  const int num_tensors = static_cast<int>(plan.param_num_elements().size());
  if (pull.rows_size() > num_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull names rows of ", pull.rows_size(),
                     " tables; the layout has ", num_tensors, " tensors"));
  }
  out.asked.assign(num_tensors, false);
  out.rows.resize(num_tensors);
  for (const PullRows& entry : pull.rows()) {
    const int32_t p = entry.param_id();
    if (p < 0 || p >= num_tensors || plan.row_elements(p) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull names rows of tensor ", p, "; expected a row-sparse tensor"));
    }
    if (out.asked[p]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pull names rows of tensor ", p, " twice"));
    }
    const int64_t table_rows =
        plan.param_num_elements()[p] / plan.row_elements(p);
    const std::string& bytes = entry.row_ids();
    const int64_t k = static_cast<int64_t>(bytes.size() / sizeof(uint32_t));
    if (bytes.size() % sizeof(uint32_t) != 0 || k > table_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull's rows of tensor ", p, ": ", bytes.size(),
          " bytes; expected 4 per row id, at most ", table_rows, " ids"));
    }
    std::vector<uint32_t>& ids = out.rows[p];
    ids.resize(k);
    if (k > 0) std::memcpy(ids.data(), bytes.data(), bytes.size());
    for (int64_t i = 0; i < k; ++i) {
      if (ids[i] >= table_rows || (i > 0 && ids[i] <= ids[i - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pull's rows of tensor ", p, ": id ", i, " is ", ids[i],
            "; expected strictly ascending ids below ", table_rows));
      }
    }
    out.asked[p] = true;
  }
  return out;
}

grpc::ByteBuffer EncodeRowsReply(const ChunkSpec& spec, int64_t version,
                                 absl::Span<const float> weights,
                                 const std::vector<uint32_t>& asked, DType wire,
                                 int64_t* payload_bytes) {
  const int64_t d = spec.row_elements;
  const int64_t first = spec.offset / d;
  const int64_t last = first + spec.num_elements / d;  // exclusive
  auto begin = std::lower_bound(asked.begin(), asked.end(), first);
  auto end = std::lower_bound(begin, asked.end(), last);
  thread_local std::vector<uint32_t> rows;
  thread_local std::vector<float> values;
  rows.clear();
  values.clear();
  for (auto it = begin; it != end; ++it) {
    const int64_t local = *it - first;
    rows.push_back(static_cast<uint32_t>(local));
    values.insert(values.end(), weights.begin() + local * d,
                  weights.begin() + (local + 1) * d);
  }
  *payload_bytes =
      IndexGapBytes(rows) +
      static_cast<int64_t>(values.size() * WireBytesPerElement(wire));
  const PushPullResponse no_fields;
  return EncodeSparseChunkMessage(no_fields, kPullChunkField, spec.param_id,
                                  spec.chunk_index, version, spec.num_elements,
                                  rows, values, wire, d);
}

}  // namespace pstrain
