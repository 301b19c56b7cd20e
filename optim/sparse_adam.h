// Lazy (row-sparse) Adam for embedding tables: the update of the rows a
// step's gradient touches, and nothing else.
//
// Semantics: PyTorch 1.13's `torch.optim.SparseAdam` (the lazy Adam that
// TensorFlow Addons' `LazyAdam` also defines): only the rows present in the
// gradient have their first and second moments decayed and their weights
// moved; an untouched row keeps w, m and v exactly. The step count t is the
// table's (every step of the job counts, touched or not), so the bias
// correction of a row that was untouched for a while uses the global t, as
// SparseAdam's per-parameter `state['step']` does. Per touched element, in
// SparseAdam's order and rounding (torch/optim/_functional.py sparse_adam;
// scalars in double, rounded to float once as PyTorch does for a Python
// scalar):
//   u1 = (g - m) * float(1 - beta1);   m' = m + u1
//   u2 = (g * g - v) * float(1 - beta2); v' = v + u2
//   w' = w + float(-lr * sqrt(1 - beta2^t) / (1 - beta1^t)) * (m' / (sqrt(v') +
//   eps))
// It differs from AdamUpdate (optim/adam.h) both in which rows move (dense
// Adam decays every row's moments each step) and in its rounding order
// (the bias correction folded into the step size). SparseAdam has no
// weight decay; callers refuse one.
//
// Duplicate row ids: SparseAdam coalesces them (sums their values) before
// the update; here the caller passes each row once (the shard refuses a
// push with a repeated row, and sums workers' rows itself).
//
// Thread-compatible: callers serialise updates of one table.
#ifndef PSTRAIN_OPTIM_SPARSE_ADAM_H_
#define PSTRAIN_OPTIM_SPARSE_ADAM_H_

#include <cstdint>

#include "absl/types/span.h"
#include "optim/adam.h"

namespace pstrain {

// The per-step scalars of the update above (rounded to float once).
struct SparseAdamConstants {
  float one_minus_beta1;  // float(1 - beta1), 1 - beta1 in double
  float one_minus_beta2;
  float neg_step_size;  // float(-lr * sqrt(1 - beta2^t) / (1 - beta1^t))
  float epsilon;
};
// `step` is 1-based (the first update is step 1). options.weight_decay is
// ignored (see above).
SparseAdamConstants SparseAdamConstantsFor(const AdamOptions& options,
                                           int64_t step);

// Applies update number `step` to the rows `rows` of a table of
// `row_elements` elements per row, in place. `values` holds the rows'
// gradients, row-major: rows.size() * row_elements floats, values[k *
// row_elements + j] for element j of row rows[k]. `w`, `m`, `v` are the
// table's (or a chunk's) arrays, indexed by row * row_elements + j; every
// row id must be a row of them (unchecked: callers validate), and no row
// may repeat. Returns whether every new weight is finite (checked in the
// same loop; the caller undoes the rows itself if not).
bool SparseAdamRows(const AdamOptions& options, int64_t step,
                    int64_t row_elements, absl::Span<const uint32_t> rows,
                    const float* values, float* w, float* m, float* v);

}  // namespace pstrain

#endif  // PSTRAIN_OPTIM_SPARSE_ADAM_H_
