// Row-sparse chunks on a shard (issue 41): an embedding table's chunk
// (common/partition.h cuts it on whole rows) takes pushes of the rows a
// worker's batch touched, averages them over the step's workers and applies
// the optimizer lazily, to the touched rows only (optim/sparse_adam.h).
//
// Averaging (sync): the union of the workers' rows, each row summed in
// worker-id order over every averaged worker (a worker that did not touch
// it adds +0.0, as a dense push of zeros would) and scaled by 1 / |workers|:
// bit for bit the rows of the dense average of the same pushes densified,
// whose other rows are 0. So a row touched by some workers only is averaged
// over all the step's workers, as torch.optim.SparseAdam sees the sum of
// the workers' sparse gradients (coalesced) divided by W.
//
// The update, as each optimizer's PyTorch reference defines it for a
// sparse gradient: Adam as torch.optim.SparseAdam, lazily (only the union's
// rows have m and v decayed and w moved; the step count t is the chunk's
// version + 1, every step counting; no weight decay: SparseAdam has none),
// SGD as torch.optim.SGD on a sparse gradient. Plain SGD moves the touched
// rows only (w - lr * g: a zero gradient moves nothing). With momentum,
// PyTorch 1.13's SGD keeps the buffer of a sparse gradient as a sparse
// tensor, buf.mul_(momentum).add_(grad): every row with a momentum moves,
// as the dense update of the densified gradient moves it (torch.equal of
// the two, checked with Debian's python3-torch). With weight decay PyTorch
// refuses a sparse gradient (grad.add(param): "add(sparse, dense) is not
// supported"); here its L2 term is the dense one, every row decayed, as a
// dense table's. So with momentum or weight decay every row of the chunk
// is updated, an untouched one by a zero gradient: with SGD the row update
// equals the dense one bit for bit, and the rows still travel alone (only
// the shard's optimizer work is the chunk's); with Adam it does not (dense
// Adam decays every row's moments each step).
//
// Thread-compatible: the shard calls these under the chunk's lock.
#ifndef PSTRAIN_SERVER_ROW_SPARSE_H_
#define PSTRAIN_SERVER_ROW_SPARSE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "optim/optimizer.h"

namespace pstrain {

// Some rows of one chunk: `rows` are row offsets in the chunk, strictly
// ascending; `values` holds rows.size() * row_elements floats, row-major.
struct RowValues {
  std::vector<uint32_t> rows;
  std::vector<float> values;
};

// The rows' previous weights and optimizer state, kept to undo an update
// (a skipped step, a reopen) or one that overflowed; `m` empty after SGD's
// without momentum and `v` after any SGD's (those leave them as they
// were).
struct RowUndo {
  std::vector<uint32_t> rows;
  std::vector<float> w, m, v;
};

// INVALID_ARGUMENT naming chunk (param_id, chunk_index) unless `rows` are
// strictly ascending and below `num_rows` and `values` holds row_elements
// floats per row (a push from the network, or a caller's).
absl::Status CheckRowValues(int32_t param_id, int32_t chunk_index,
                            int64_t num_rows, int64_t row_elements,
                            const RowValues& rows);

// Every row of a dense chunk of `values.size()` elements (a dense push to a
// row-sparse chunk: every row touched).
void AllRows(absl::Span<const float> values, int64_t row_elements,
             RowValues* out);

// The average of `pushes` (in worker-id order, each non-null) as described
// above, into `out` (its memory reused).
void AverageRows(const std::vector<const RowValues*>& pushes,
                 int64_t row_elements, RowValues* out);

// Whether `options` move every row of a chunk on a sparse gradient (SGD
// with momentum or weight decay, above), not just the touched ones.
bool SgdMovesEveryRow(const OptimizerOptions& options);

// Update number `step` (1-based) of `grad`'s rows (strictly ascending and
// below `num_rows`, as CheckRowValues and AverageRows leave them; every
// one of the chunk's `num_rows` where SgdMovesEveryRow), in place in the
// chunk's w, m and v (each num_rows * row_elements floats), at the lr of
// ScheduledLr(options, lr_step): `lr_step` is step - 1 but in an async
// shard, where it is the pushing worker's step (OptimizerUpdateAtInto).
// The updated rows' state before goes to `undo` first. Returns whether
// every new weight is finite; if not, the rows are already put back.
bool LazyUpdateRows(const OptimizerOptions& options, int64_t step,
                    int64_t lr_step, int64_t row_elements, int64_t num_rows,
                    const RowValues& grad, float* w, float* m, float* v,
                    RowUndo* undo);

// Puts `undo`'s rows back and clears it.
void UndoRows(int64_t row_elements, RowUndo* undo, float* w, float* m,
              float* v);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_ROW_SPARSE_H_
