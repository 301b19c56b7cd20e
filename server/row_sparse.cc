#include "server/row_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "optim/sparse_adam.h"

namespace pstrain {

absl::Status CheckRowValues(int32_t param_id, int32_t chunk_index,
                            int64_t num_rows, int64_t row_elements,
                            const RowValues& rows) {
  const int64_t k = static_cast<int64_t>(rows.rows.size());
  if (k > num_rows ||
      static_cast<int64_t>(rows.values.size()) != k * row_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row push to chunk (", param_id, ", ", chunk_index, ") has ", k,
        " rows and ", rows.values.size(), " values; expected at most ",
        num_rows, " rows of ", row_elements, " values each"));
  }
  for (int64_t i = 0; i < k; ++i) {
    if (rows.rows[i] >= num_rows ||
        (i > 0 && rows.rows[i] <= rows.rows[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("row push to chunk (", param_id, ", ", chunk_index,
                       "): row ", i, " is ", rows.rows[i],
                       "; expected strictly ascending rows below ", num_rows));
    }
  }
  return absl::OkStatus();
}

void AllRows(absl::Span<const float> values, int64_t row_elements,
             RowValues* out) {
  const int64_t n = static_cast<int64_t>(values.size()) / row_elements;
  out->rows.resize(n);
  for (int64_t r = 0; r < n; ++r) out->rows[r] = static_cast<uint32_t>(r);
  out->values.assign(values.begin(), values.end());
}

void AverageRows(const std::vector<const RowValues*>& pushes,
                 int64_t row_elements, RowValues* out) {
  out->rows.clear();
  for (const RowValues* p : pushes) {
    out->rows.insert(out->rows.end(), p->rows.begin(), p->rows.end());
  }
  std::sort(out->rows.begin(), out->rows.end());
  out->rows.erase(std::unique(out->rows.begin(), out->rows.end()),
                  out->rows.end());
  const size_t k = out->rows.size();
  const int64_t d = row_elements;
  out->values.assign(k * d, 0.0f);
  // Each push's cursor into its rows (both ascending).
  std::vector<size_t> at(pushes.size(), 0);
  for (size_t i = 0; i < k; ++i) {
    float* sum = out->values.data() + i * d;
    for (size_t w = 0; w < pushes.size(); ++w) {
      const RowValues& p = *pushes[w];
      const bool touched =
          at[w] < p.rows.size() && p.rows[at[w]] == out->rows[i];
      const float* g = touched ? p.values.data() + at[w] * d : nullptr;
      if (w == 0) {
        // As the dense sum: it starts from the first worker's values.
        if (touched) std::copy(g, g + d, sum);
      } else {
        for (int64_t j = 0; j < d; ++j) sum[j] += touched ? g[j] : 0.0f;
      }
      if (touched) ++at[w];
    }
    if (pushes.size() > 1) {
      const float scale = 1.0f / static_cast<float>(pushes.size());
      for (int64_t j = 0; j < d; ++j) sum[j] *= scale;
    }
  }
}

namespace {

// Copies rows `rows` of `from` (row_elements each) to `to`, packed.
void Gather(absl::Span<const uint32_t> rows, int64_t d, const float* from,
            std::vector<float>* to) {
  to->resize(rows.size() * d);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(to->data() + i * d, from + int64_t{rows[i]} * d,
                sizeof(float) * d);
  }
}

void Scatter(absl::Span<const uint32_t> rows, int64_t d,
             const std::vector<float>& from, float* to) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(to + int64_t{rows[i]} * d, from.data() + i * d,
                sizeof(float) * d);
  }
}

}  // namespace

bool SgdMovesEveryRow(const OptimizerOptions& options) {
  return options.kind == OptimizerKind::kSgd &&
         (options.momentum != 0.0f || options.weight_decay != 0.0f);
}

bool LazyUpdateRows(const OptimizerOptions& options, int64_t step,
                    int64_t lr_step, int64_t row_elements, int64_t num_rows,
                    const RowValues& grad, float* w, float* m, float* v,
                    RowUndo* undo) {
  const int64_t d = row_elements;
  // SGD's momentum buffer and weight decay act on every row (above): every
  // row is updated, an untouched one with a zero gradient, as the dense
  // update of the densified gradient (element by element the same
  // arithmetic, so bit for bit).
  const bool every_row = SgdMovesEveryRow(options);
  if (every_row) {
    undo->rows.resize(num_rows);
    for (int64_t r = 0; r < num_rows; ++r) {
      undo->rows[r] = static_cast<uint32_t>(r);
    }
    undo->w.assign(w, w + num_rows * d);
  } else {
    undo->rows = grad.rows;
    Gather(grad.rows, d, w, &undo->w);
  }
  // The moments the update writes (SGD: m only with momentum, never v).
  undo->m.clear();
  undo->v.clear();
  if (UpdatesFirstMoment(options)) Gather(undo->rows, d, m, &undo->m);
  if (UpdatesSecondMoment(options)) Gather(undo->rows, d, v, &undo->v);
  const float lr = static_cast<float>(ScheduledLr(options, lr_step));
  bool finite = true;
  if (options.kind == OptimizerKind::kSgd) {
    const absl::Span<const uint32_t> rows = undo->rows;
    const std::vector<float> zeros(every_row ? d : 0, 0.0f);
    size_t next = 0;  // grad's next row
    for (const uint32_t r : rows) {
      const float* g = zeros.data();
      if (next < grad.rows.size() && grad.rows[next] == r) {
        g = grad.values.data() + next++ * d;
      }
      const int64_t base = int64_t{r} * d;
      SgdUpdate(options, lr, step, w + base, g, m + base, d);
    }
    for (size_t i = 0; i < rows.size() && finite; ++i) {
      const float* row = w + int64_t{rows[i]} * d;
      for (int64_t j = 0; j < d; ++j) finite &= std::isfinite(row[j]);
    }
  } else {
    AdamOptions adam = options;
    adam.lr = lr;
    finite =
        SparseAdamRows(adam, step, d, grad.rows, grad.values.data(), w, m, v);
  }
  if (!finite) UndoRows(d, undo, w, m, v);
  return finite;
}

void UndoRows(int64_t row_elements, RowUndo* undo, float* w, float* m,
              float* v) {
  Scatter(undo->rows, row_elements, undo->w, w);
  if (!undo->m.empty()) Scatter(undo->rows, row_elements, undo->m, m);
  if (!undo->v.empty()) Scatter(undo->rows, row_elements, undo->v, v);
  undo->rows.clear();
}

}  // namespace pstrain
