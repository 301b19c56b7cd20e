// The allreduce exchange's steps (worker/allreduce_exchange.h).
#include "worker/allreduce_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "common/wire_dtype.h"

namespace pstrain {

AllreduceExchange::~AllreduceExchange() {
  {
    absl::MutexLock lock(&mu_);
    abort_ = true;
  }
  if (communicator_.joinable()) communicator_.join();
  absl::MutexLock lock(&checkpoint_mu_);
  if (checkpoint_writer_.joinable()) checkpoint_writer_.join();
}

absl::Status AllreduceExchange::Start(
    const std::vector<absl::Span<float>>& weights, const ModelState* resume) {
  if (!elastic_.has_value()) {
    for (const absl::Span<float>& w : weights) {
      RETURN_IF_ERROR(collective_->Broadcast(w.data(), w.size(), 0));
    }
  }
  weights_ = weights;
  const int num_tensors = static_cast<int>(weights.size());
  const int num_params = num_tensors - num_buffers_;
  m_.resize(num_params);
  v_.resize(num_params);
  for (int t = 0; t < num_params; ++t) {
    m_[t].assign(weights[t].size(), 0.0f);
    v_[t].assign(weights[t].size(), 0.0f);
  }
  if (resume != nullptr) {
    // Every worker resumes alike: the optimizer state and its update
    // count (the checkpoint's version: its step in sync and allreduce
    // checkpoints) from the checkpoint; its weights the caller loaded.
    if (resume->m.size() < static_cast<size_t>(num_params) ||
        resume->v.size() < static_cast<size_t>(num_params)) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume: the checkpoint holds optimizer state for ",
                       std::min(resume->m.size(), resume->v.size()),
                       " parameters; the model has ", num_params));
    }
    int64_t version = INT64_MAX;
    for (int t = 0; t < num_params; ++t) {
      if (resume->m[t].size() != weights[t].size() ||
          resume->v[t].size() != weights[t].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resume: the checkpoint's optimizer state of parameter ", t,
            " has ", resume->m[t].size(), " elements; the model's has ",
            weights[t].size()));
      }
      m_[t] = resume->m[t];
      v_[t] = resume->v[t];
      version = std::min(
          version,
          resume->VersionOf(t, 0, static_cast<int64_t>(weights[t].size())));
    }
    step_ = num_params > 0 ? version : 0;
  }
  // Buckets of whole tensors, last tensor first (the first gradients
  // backward produces), each at most bucket_elements_ unless one tensor
  // is larger on its own.
  // A row-sparse table (rows_) has a bucket of its own.
  buckets_.clear();
  int64_t filled = 0;
  for (int t = num_tensors - 1; t >= 0; --t) {
    const int64_t n = static_cast<int64_t>(weights[t].size());
    if (buckets_.empty() || filled + n > bucket_elements_ ||
        RowElements(t) > 0 || RowElements(buckets_.back().back()) > 0) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(t);
    filled += n;
  }
  union_rows_.assign(num_tensors, {});
  row_undo_.assign(num_tensors, {});
  flat_.assign(buckets_.size(), {});
  prev_w_.assign(num_tensors, {});
  prev_m_.assign(num_params, {});
  prev_v_.assign(num_params, {});
  {
    absl::MutexLock lock(&mu_);
    ready_.assign(num_tensors, false);
    fences_.assign(num_tensors, nullptr);
  }
  if (!elastic_.has_value()) return absl::OkStatus();
  // An elastic job's world: the start's membership (a joining worker's
  // is the one that adds it; a standby's, the one that adds it once a
  // Scale did), whose rank 0 gives every rank its state.
  if (elastic_->await_start) {
    ASSIGN_OR_RETURN(const WorkerMembership start, elastic_->await_start());
    return JoinWorld(start, /*sync_state=*/true, /*from_epoch=*/-1);
  }
  return JoinWorld(elastic_->start, /*sync_state=*/true, /*from_epoch=*/-1);
}

void AllreduceExchange::GradientsReady(
    const std::vector<absl::Span<const float>>& gradients, int64_t samples,
    absl::Span<const int> tensors, std::shared_ptr<CopyFence> fence) {
  absl::MutexLock lock(&mu_);
  for (int t : tensors) {
    if (t < 0 || t >= static_cast<int>(ready_.size())) continue;
    ready_[t] = true;
    fences_[t] = fence;
  }
  StartCommunicator(&gradients);
}

absl::Status AllreduceExchange::Step(
    const std::vector<absl::Span<const float>>& gradients, int64_t samples) {
  {
    absl::MutexLock lock(&mu_);
    // Whatever backward did not announce is final now.
    ready_.assign(ready_.size(), true);
    StartCommunicator(&gradients);
  }
  communicator_.join();
  absl::Status communicated;
  {
    absl::MutexLock lock(&mu_);
    communicated = std::move(communicator_status_);
    communicator_status_ = absl::OkStatus();
    ready_.assign(ready_.size(), false);
    fences_.assign(fences_.size(), nullptr);
  }
  RETURN_IF_ERROR(communicated);
  if (topk_.has_value()) {
    // Rank 0 wrote its own in Checkpoint().
    if (checkpoint_heard_ == step_ && collective_->rank() != 0) {
      SaveResiduals(step_);
    }
    // A skipped step's residual is not kept (it pushed nothing).
    if (!skip_.has_value()) compression_.compressor->CommitStep(step_);
  }
  last_traffic_ = std::exchange(traffic_, TopKAllgather::Traffic{});
  // A non-finite average (every worker sees the same sums): the tensors
  // updated before it go back to their state before the step.
  last_skip_.reset();
  if (skip_.has_value()) {
    for (int t : updated_) UndoUpdate(t);
    skip_->step = step_;
    last_skip_ = std::move(skip_);
    skip_.reset();
  }
  updated_.clear();
  own_nonfinite_.reset();
  last_allreduce_ = allreduce_;
  allreduce_ = absl::ZeroDuration();
  ++step_;
  samples_ += samples * collective_->size();
  return absl::OkStatus();
}

void AllreduceExchange::StartCommunicator(
    const std::vector<absl::Span<const float>>* gradients) {
  gradients_ = gradients;
  if (!communicator_.joinable()) {
    communicator_ = std::thread([this] { Communicate(); });
  }
}

void AllreduceExchange::Update(size_t b, float clip) {
  const int size = collective_->size();
  const int64_t step = step_ + 1;
  std::vector<float>& flat = flat_[b];
  if (skip_.has_value()) return;  // an earlier bucket decided the step
  // A sum comes back to be divided by the workers (the average) in the
  // pass that scans it.
  const bool divide = size > 1 && !averaged_ && !ReturnsAverages(b);
  const int64_t bad =
      divide ? ScaleFindingNonFinite(absl::MakeSpan(flat),
                                     1.0f / static_cast<float>(size))
             : FindNonFinite(flat);
  if (bad >= 0) {
    SkippedStepInfo skip;
    int64_t offset = bad;
    for (int t : buckets_[b]) {
      const int64_t n = static_cast<int64_t>(weights_[t].size());
      if (offset < n) {
        skip.nonfinite.param_id = t;
        skip.nonfinite.element = offset;
        break;
      }
      offset -= n;
    }
    skip.nonfinite.value = NonFiniteText(flat[bad]);
    // This worker's own value, if it held one (else another worker's).
    if (own_nonfinite_.has_value()) {
      skip.worker_id = collective_->rank();
      skip.nonfinite = *own_nonfinite_;
    }
    skip_ = std::move(skip);
    return;
  }
  float* average = flat.data();
  for (int t : buckets_[b]) {
    const int64_t n = static_cast<int64_t>(weights_[t].size());
    if (clip != 1.0f && t < num_params()) {
      for (int64_t i = 0; i < n; ++i) average[i] *= clip;
    }
    if (RowElements(t) > 0) {
      UpdateRows(t, step, average);
      average += n;
      continue;
    }
    prev_w_[t].resize(n);
    float* const prev = prev_w_[t].data();
    float* const w = weights_[t].data();
    if (t >= num_params()) {
      std::copy(w, w + n, prev);
      std::copy(average, average + n, w);
    } else {
      const bool updates_m = UpdatesFirstMoment(adam_);
      const bool updates_v = UpdatesSecondMoment(adam_);
      if (updates_m) prev_m_[t].resize(n);
      if (updates_v) prev_v_[t].resize(n);
      // The undo copy a block at a time, so the update reads it back from
      // the cache (element by element the same arithmetic).
      auto at = [](std::vector<float>& v, int64_t i) {
        return v.empty() ? nullptr : v.data() + i;
      };
      constexpr int64_t kBlock = 16384;  // elements
      for (int64_t i = 0; i < n; i += kBlock) {
        const int64_t len = std::min(kBlock, n - i);
        std::copy(w + i, w + i + len, prev + i);
        OptimizerUpdateInto(adam_, step, prev + i, average + i, at(m_[t], i),
                            at(v_[t], i), w + i, at(prev_m_[t], i),
                            at(prev_v_[t], i), len);
      }
      if (updates_m) m_[t].swap(prev_m_[t]);
      if (updates_v) v_[t].swap(prev_v_[t]);
    }
    updated_.push_back(t);
    average += n;
  }
}

void AllreduceExchange::UpdateRows(int t, int64_t step, const float* average) {
  // The union's rows of the average (every other row's is 0); where SGD
  // moves every row, the average as it is, already dense.
  const int64_t d = RowElements(t);
  const int64_t num_rows = static_cast<int64_t>(weights_[t].size()) / d;
  RowValues grad;
  if (SgdMovesEveryRow(adam_)) {
    AllRows(absl::MakeConstSpan(average, num_rows * d), d, &grad);
  } else {
    grad.rows = union_rows_[t];
    grad.values.resize(grad.rows.size() * d);
    for (size_t k = 0; k < grad.rows.size(); ++k) {
      std::copy(average + int64_t{grad.rows[k]} * d,
                average + (int64_t{grad.rows[k]} + 1) * d,
                grad.values.data() + k * d);
    }
  }
  if (!LazyUpdateRows(adam_, step, step - 1, d, num_rows, grad,
                      weights_[t].data(), m_[t].data(), v_[t].data(),
                      &row_undo_[t])) {
    // As a shard's chunk whose rows overflow: put back (by LazyUpdateRows),
    // the rest of the step applied.
    std::fprintf(stderr,
                 "update of tensor %d for step %lld overflowed in one of its "
                 "rows (%zu touched); not applied\n",
                 t, static_cast<long long>(step_), union_rows_[t].size());
    return;
  }
  updated_.push_back(t);
}

void AllreduceExchange::UndoUpdate(int t) {
  if (RowElements(t) > 0) {
    UndoRows(RowElements(t), &row_undo_[t], weights_[t].data(), m_[t].data(),
             v_[t].data());
    return;
  }
  std::copy(prev_w_[t].begin(), prev_w_[t].end(), weights_[t].data());
  if (t < static_cast<int>(m_.size())) {
    if (UpdatesFirstMoment(adam_)) m_[t].swap(prev_m_[t]);
    if (UpdatesSecondMoment(adam_)) v_[t].swap(prev_v_[t]);
  }
}

namespace {

// Calls `each(k, e)` for each run [k, e) of `ids` (ascending) that lies in
// one chunk of `per_chunk` rows: the groups a PS push encodes together.
template <typename Each>
void ForEachChunkOfRows(const std::vector<uint32_t>& ids, int64_t per_chunk,
                        Each each) {
  const int64_t count = static_cast<int64_t>(ids.size());
  for (int64_t k = 0; k < count;) {
    int64_t e = k + 1;
    while (e < count && ids[e] / per_chunk == ids[k] / per_chunk) ++e;
    each(k, e);
    k = e;
  }
}

}  // namespace

absl::Status AllreduceExchange::AllgatherRows(size_t b) {
  const int t = buckets_[b][0];
  const int64_t d = RowElements(t);
  std::vector<float>& flat = flat_[b];
  const int64_t num_rows = static_cast<int64_t>(flat.size()) / d;
  // This step's rows (SetStepRows); none announced: every row.
  std::vector<uint32_t> all;
  const std::vector<uint32_t>* mine = &all;
  if (t < static_cast<int>(step_rows_.size()) && !step_rows_[t].empty()) {
    mine = &step_rows_[t];
  } else {
    all.resize(num_rows);
    for (int64_t r = 0; r < num_rows; ++r) all[r] = static_cast<uint32_t>(r);
  }
  for (size_t k = 0; k < mine->size(); ++k) {
    if ((*mine)[k] >= num_rows || (k > 0 && (*mine)[k] <= (*mine)[k - 1])) {
      return absl::InternalError(absl::StrCat(
          "rows of tensor ", t, ": this worker's row ", (*mine)[k], " at ", k,
          " is not ascending below the table's ", num_rows));
    }
  }
  const int size = collective_->size();
  int64_t count = static_cast<int64_t>(mine->size());
  std::vector<int64_t> counts(size);
  RETURN_IF_ERROR(collective_->Allgather(&count, sizeof(count), counts.data()));
  traffic_.sent += (size - 1) * 8;
  traffic_.received += (size - 1) * 8;
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  // This rank's message, padded to the longest: row ids, (fp16) each row's
  // scale exponent, then the rows' values in the wire dtype. A 16-bit wire
  // encodes them chunk by chunk of the partition (fp16: one exponent a
  // chunk), as a PS push of the chunk's rows is encoded.
  const int value_bytes = WireBytesPerElement(wire_dtype_);
  const bool fp16 = wire_dtype_ == DTYPE_FLOAT16;
  const int64_t exponents_at = most * 4;
  const int64_t values_at = exponents_at + (fp16 ? most * 4 : 0);
  const int64_t bytes = values_at + most * d * value_bytes;
  const int64_t per_chunk =
      std::max<int64_t>(1, rows_.partition_bytes / (4 * d));
  // Where the rows would cost more than the ring (each rank receives
  // (W - 1) x the message, against the ring's 2 (W - 1) / W x 4n and the
  // ids' (W - 1) x 4 x most: W x (bytes - ids) >= 2 x 4n, as many ranks
  // touching most of a table: BERT's 30k-token vocabulary at 12k tokens a
  // worker), the ids go alone and the rows as a dense fp32 ring allreduce
  // of each rank's (wire-rounded) rows and zeros: the same sums (up to the
  // order of additions with three or more ranks).
  const bool dense =
      size > 1 && static_cast<int64_t>(size) * (bytes - exponents_at) >=
                      2 * 4 * static_cast<int64_t>(flat.size());
  const int64_t sent = dense ? exponents_at : bytes;
  row_message_.assign(sent, 0);
  uint8_t* const message = row_message_.data();
  std::memcpy(message, mine->data(), 4 * count);
  if (dense || value_bytes == 2) {
    // The rows, one after the other, to round or encode.
    row_values_.resize(count * d);
    for (int64_t k = 0; k < count; ++k) {
      std::copy(flat.begin() + int64_t{(*mine)[k]} * d,
                flat.begin() + (int64_t{(*mine)[k]} + 1) * d,
                row_values_.begin() + k * d);
    }
  }
  if (dense) {
    ForEachChunkOfRows(*mine, per_chunk, [&](int64_t k, int64_t e) {
      RoundThroughWire(wire_dtype_,
                       absl::MakeSpan(row_values_.data() + k * d, (e - k) * d));
    });
    std::fill(flat.begin(), flat.end(), 0.0f);
    for (int64_t k = 0; k < count; ++k) {
      std::copy(row_values_.begin() + k * d, row_values_.begin() + (k + 1) * d,
                flat.begin() + int64_t{(*mine)[k]} * d);
    }
  } else if (value_bytes == 4) {
    // fp32: each row straight from the bucket into the message.
    for (int64_t k = 0; k < count; ++k) {
      std::memcpy(message + values_at + 4 * k * d,
                  flat.data() + int64_t{(*mine)[k]} * d, 4 * d);
    }
  } else {
    row_halves_.resize(count * d);
    std::vector<int32_t> exponents(count, 0);
    ForEachChunkOfRows(*mine, per_chunk, [&](int64_t k, int64_t e) {
      const absl::Span<const float> chunk(row_values_.data() + k * d,
                                          (e - k) * d);
      const int exponent = fp16 ? ScaleExponent(chunk) : 0;
      EncodeHalves(chunk, wire_dtype_, exponent, row_halves_.data() + k * d);
      std::fill(exponents.begin() + k, exponents.begin() + e, exponent);
    });
    if (fp16) {
      std::memcpy(message + exponents_at, exponents.data(), 4 * count);
    }
    std::memcpy(message + values_at, row_halves_.data(), 2 * count * d);
  }
  row_gathered_.resize(static_cast<size_t>(sent) * size);
  RETURN_IF_ERROR(collective_->Allgather(message, sent, row_gathered_.data()));
  traffic_.sent += (size - 1) * sent;
  traffic_.received += (size - 1) * sent;
  if (dense) {
    RETURN_IF_ERROR(collective_->AllreduceSum(flat.data(), flat.size()));
    const int64_t ring =
        2 * (size - 1) * 4 * static_cast<int64_t>(flat.size()) / size;
    traffic_.sent += ring;
    traffic_.received += ring;
  } else {
    // Every rank's rows, in rank order, into zeros.
    std::fill(flat.begin(), flat.end(), 0.0f);
  }
  // The union's ids (and, from the messages, the rows).
  std::vector<uint32_t>& rows = union_rows_[t];
  rows.clear();
  std::vector<uint32_t> ids;
  std::vector<float> row(d);
  std::vector<uint16_t> row_halves(d);
  for (int r = 0; r < size; ++r) {
    const uint8_t* in = row_gathered_.data() + static_cast<size_t>(r) * sent;
    ids.resize(counts[r]);
    std::memcpy(ids.data(), in, 4 * counts[r]);
    for (int64_t k = 0; k < counts[r]; ++k) {
      if (ids[k] >= num_rows) {
        return absl::InternalError(absl::StrCat("rows of tensor ", t, ": rank ",
                                                r, " sent row ", ids[k],
                                                " of a table of ", num_rows));
      }
      if (dense) continue;
      const uint8_t* at = in + values_at + k * d * value_bytes;
      if (value_bytes == 4) {
        std::memcpy(row.data(), at, 4 * d);
      } else {
        int32_t exponent = 0;
        if (fp16) std::memcpy(&exponent, in + exponents_at + 4 * k, 4);
        std::memcpy(row_halves.data(), at, 2 * d);
        DecodeHalves(row_halves.data(), wire_dtype_, exponent,
                     absl::MakeSpan(row));
      }
      float* into = flat.data() + int64_t{ids[k]} * d;
      for (int64_t j = 0; j < d; ++j) into[j] += row[j];
    }
    rows.insert(rows.end(), ids.begin(), ids.end());
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return absl::OkStatus();
}

bool AllreduceExchange::AllReady(const std::vector<int>& tensors) const {
  for (int t : tensors) {
    if (!ready_[t]) return false;
  }
  return true;
}

void AllreduceExchange::Communicate() {
  if (trace::Enabled()) trace::SetThreadName("allreduce");
  if (absl::Status s = BeginTopKStep(); !s.ok()) {
    absl::MutexLock lock(&mu_);
    communicator_status_ = std::move(s);
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const std::vector<int>& bucket = buckets_[b];
    std::vector<std::shared_ptr<CopyFence>> fences;
    const std::vector<absl::Span<const float>>* gradients = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto bucket_ready = [this, &bucket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return abort_ || AllReady(bucket);
      };
      mu_.Await(absl::Condition(&bucket_ready));
      if (abort_) return;
      for (int t : bucket) {
        if (fences_[t] != nullptr && std::find(fences.begin(), fences.end(),
                                               fences_[t]) == fences.end()) {
          fences.push_back(fences_[t]);
        }
      }
      gradients = gradients_;
    }
    absl::Status s;
    for (const std::shared_ptr<CopyFence>& fence : fences) {
      s.Update(fence->Wait());
    }
    std::vector<float>& flat = flat_[b];
    const bool rows = RowElements(bucket[0]) > 0;
    if (s.ok()) {
      if (topk_.has_value() && !rows) {
        // Top-k reads the parameters' gradients where they are (they stay
        // until Step returns); only the buffers' (the bucket's first) go
        // in, and the sums overwrite the rest (no fill of it here).
        size_t total = 0;
        for (int t : bucket) total += (*gradients)[t].size();
        flat.resize(total);
        float* at = flat.data();
        for (int t : bucket) {
          if (t < num_params()) continue;
          const absl::Span<const float> g = (*gradients)[t];
          at = std::copy(g.begin(), g.end(), at);
        }
      } else {
        flat.clear();
        for (int t : bucket) {
          flat.insert(flat.end(), (*gradients)[t].begin(),
                      (*gradients)[t].end());
        }
      }
      if (!own_nonfinite_.has_value()) {
        // Where this worker's own gradients hold one, to name it.
        for (int t : bucket) {
          const int64_t bad = FindNonFinite((*gradients)[t]);
          if (bad >= 0) {
            NonFiniteValue own;
            own.param_id = t;
            own.element = bad;
            own.value = NonFiniteText((*gradients)[t][bad]);
            own_nonfinite_ = std::move(own);
            break;
          }
        }
      }
      trace::Scope traced(
          "allreduce", "allreduce",
          {{"step", step_},
           {"bucket", static_cast<int64_t>(b)},
           {"bytes", static_cast<int64_t>(flat.size() * (wire16() ? 2 : 4))},
           {"topk", topk_.has_value() ? 1 : 0}});
      const absl::Time start = absl::Now();
      s = rows                ? AllgatherRows(b)
          : topk_.has_value() ? AllgatherTopK(b, *gradients)
          : wire16()          ? Allreduce16(b)
                     : collective_->AllreduceSum(flat.data(), flat.size());
      allreduce_ += absl::Now() - start;
      if (s.ok() && !rows && !topk_.has_value()) {
        // A 16-bit wire's buffers go in fp32.
        int64_t bytes = 0;
        for (int t : bucket) {
          const bool buffer = t >= static_cast<int>(m_.size());
          bytes += static_cast<int64_t>(weights_[t].size()) *
                   (wire16() && !buffer ? 2 : 4);
        }
        traffic_.sent += RingBytes(bytes);
        traffic_.received += RingBytes(bytes);
      }
    }
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      communicator_status_ = std::move(s);
      return;
    }
    if (clip_grad_norm_ > 0) continue;  // the norm needs every bucket
    trace::Scope traced("update", "allreduce",
                        {{"step", step_}, {"bucket", static_cast<int64_t>(b)}});
    Update(b);
  }
  if (clip_grad_norm_ > 0) {
    const float clip = ClipCoefficient();
    averaged_ = true;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      trace::Scope traced(
          "update", "allreduce",
          {{"step", step_}, {"bucket", static_cast<int64_t>(b)}});
      Update(b, clip);
    }
    averaged_ = false;
  }
}

float AllreduceExchange::ClipCoefficient() {
  const int size = collective_->size();
  double sum = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<float>& flat = flat_[b];
    if (size > 1 && !ReturnsAverages(b)) {
      const float scale = 1.0f / static_cast<float>(size);
      for (float& x : flat) x *= scale;
    }
    const float* g = flat.data();
    for (int t : buckets_[b]) {
      const int64_t n = static_cast<int64_t>(weights_[t].size());
      if (t < num_params()) {
        for (int64_t i = 0; i < n; ++i) {
          sum += static_cast<double>(g[i]) * g[i];
        }
      }
      g += n;
    }
  }
  const float norm = static_cast<float>(std::sqrt(sum));
  if (!std::isfinite(norm)) return 1.0f;
  const float clip = static_cast<float>(clip_grad_norm_) / (norm + 1e-6f);
  return std::min(clip, 1.0f);
}

absl::Status AllreduceExchange::Allreduce16(size_t b) {
  const int size = collective_->size();
  std::vector<float>& flat = flat_[b];
  // A bucket holds consecutive tensors, last first, and the buffers are
  // the model's last tensors: its buffers' elements come first.
  int64_t buffers = 0;
  for (int t : buckets_[b]) {
    if (t >= num_params()) buffers += static_cast<int64_t>(weights_[t].size());
  }
  const int64_t params = static_cast<int64_t>(flat.size()) - buffers;
  const float inverse = 1.0f / static_cast<float>(size);
  absl::Span<float> grads(flat.data() + buffers, params);
  for (float& x : grads) x *= inverse;
  int exponent = 0;
  if (wire_dtype_ == DTYPE_FLOAT16 && params > 0) {
    float largest = 0;
    for (float x : grads) largest = std::max(largest, std::fabs(x));
    RETURN_IF_ERROR(collective_->AllreduceMax(&largest, 1));
    // A bound on every partial sum; non-finite: any scale (the step is
    // skipped for the value; a NaN is encoded as one).
    const float bound = largest * static_cast<float>(size);
    exponent = std::isfinite(bound)
                   ? ScaleExponent(absl::MakeConstSpan(&bound, 1))
                   : 0;
  }
  std::vector<uint16_t>& halves = halves_;
  halves.resize(params);
  EncodeHalves(grads, wire_dtype_, exponent, halves.data());
  RETURN_IF_ERROR(
      collective_->AllreduceSum16(halves.data(), halves.size(), wire_dtype_));
  DecodeHalves(halves.data(), wire_dtype_, exponent, grads);
  if (buffers > 0) {
    RETURN_IF_ERROR(collective_->AllreduceSum(flat.data(), buffers));
    for (int64_t i = 0; i < buffers; ++i) flat[i] *= inverse;
  }
  return absl::OkStatus();
}

absl::Status AllreduceExchange::AllgatherTopK(
    size_t b, const std::vector<absl::Span<const float>>& gradients) {
  std::vector<float>& flat = flat_[b];
  int64_t buffers = 0;
  std::vector<int> params;
  std::vector<absl::Span<const float>> grads;
  for (int t : buckets_[b]) {
    if (t >= num_params()) {
      buffers += static_cast<int64_t>(weights_[t].size());
    } else {
      params.push_back(t);
      grads.push_back(gradients[t]);
    }
  }
  if (buffers > 0) {
    RETURN_IF_ERROR(collective_->AllreduceSum(flat.data(), buffers));
    traffic_.sent += RingBytes(4 * buffers);
    traffic_.received += RingBytes(4 * buffers);
  }
  RETURN_IF_ERROR(topk_->SumBucket(
      *collective_, params, grads,
      absl::MakeSpan(flat).subspan(static_cast<size_t>(buffers))));
  const TopKAllgather::Traffic pairs = topk_->TakeTraffic();
  traffic_.sent += pairs.sent;
  traffic_.received += pairs.received;
  return absl::OkStatus();
}

absl::Status AllreduceExchange::BeginTopKStep() {
  if (!topk_.has_value()) return absl::OkStatus();
  compression_.compressor->BeginStep(step_);
  checkpoint_heard_ = -1;
  if (!saves_residuals()) return absl::OkStatus();
  int64_t announced = collective_->rank() == 0 ? announced_.load() : -1;
  if (collective_->size() > 1) {
    RETURN_IF_ERROR(BroadcastInt64(*collective_, &announced, 1, 0));
  }
  checkpoint_heard_ = announced;
  return absl::OkStatus();
}

std::unique_ptr<GradientExchange> CreateAllreduceExchange(
    Collective* collective, const OptimizerOptions& adam, int64_t bucket_bytes,
    int num_buffers, double clip_grad_norm, DType wire_dtype,
    std::optional<ElasticWorld> elastic, ExchangeCompression compression,
    AllreduceRows rows) {
  return std::make_unique<AllreduceExchange>(
      collective, adam, bucket_bytes, num_buffers, clip_grad_norm, wire_dtype,
      std::move(elastic), std::move(compression), std::move(rows));
}

}  // namespace pstrain
