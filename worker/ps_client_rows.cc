// PsClient's row-sparse tables (issue 41; worker/ps_client.h SetStepRows):
// a table's chunk pushed as the rows the step touched, and the pull's rows
// of the next step.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "worker/ps_client.h"

namespace pstrain {

void PsClient::SetStepRows(std::vector<std::vector<uint32_t>> touched,
                           std::vector<std::vector<uint32_t>> next,
                           bool pull_rows) {
  auto rows = std::make_shared<StepRows>();
  rows->pull_rows = pull_rows;
  const size_t n = plan_.param_num_elements().size();
  rows->by_rows.assign(n, false);
  touched.resize(n);
  next.resize(n);
  for (size_t p = 0; p < n; ++p) {
    rows->by_rows[p] = plan_.row_elements(static_cast<int32_t>(p)) > 0;
  }
  rows->touched = std::move(touched);
  rows->next = std::move(next);
  rows_ = std::move(rows);
}

const PsClient::ChunkRows* PsClient::RowsOfChunk(
    const StepRows& step_rows, const ChunkSpec& c,
    absl::Span<const float> values) {
  if (c.row_elements == 0 ||
      step_rows.by_rows.size() <= static_cast<size_t>(c.param_id) ||
      !step_rows.by_rows[c.param_id]) {
    return nullptr;
  }
  thread_local ChunkRows out;
  std::vector<uint32_t>* rows = &out.rows;
  std::vector<float>* row_values = &out.values;
  const int64_t d = c.row_elements;
  const int64_t first = c.offset / d;
  const int64_t last = first + c.num_elements / d;
  const std::vector<uint32_t>& touched = step_rows.touched[c.param_id];
  auto begin = std::lower_bound(touched.begin(), touched.end(), first);
  auto end = std::lower_bound(begin, touched.end(), last);
  rows->clear();
  row_values->clear();
  for (auto it = begin; it != end; ++it) {
    const int64_t local = *it - first;
    rows->push_back(static_cast<uint32_t>(local));
    row_values->insert(row_values->end(), values.begin() + local * d,
                       values.begin() + (local + 1) * d);
  }
  return &out;
}

grpc::ByteBuffer PsClient::EncodeRowsPush(const PushPullRequest& envelope,
                                          const ChunkSpec& c, int64_t step,
                                          const ChunkRows& rows) const {
  return EncodeSparseChunkMessage(envelope, kPushChunkField, c.param_id,
                                  c.chunk_index, step, c.num_elements,
                                  rows.rows, rows.values, options_.wire_dtype,
                                  c.row_elements);
}

void PsClient::AddPullRows(PullRequest* pull) const {
  if (!rows_->pull_rows) return;  // every table whole
  for (size_t p = 0; p < rows_->by_rows.size(); ++p) {
    if (!rows_->by_rows[p]) continue;
    PullRows* entry = pull->add_rows();
    entry->set_param_id(static_cast<int32_t>(p));
    const std::vector<uint32_t>& ids = rows_->next[p];
    entry->set_row_ids(reinterpret_cast<const char*>(ids.data()),
                       ids.size() * sizeof(uint32_t));
  }
}

}  // namespace pstrain
