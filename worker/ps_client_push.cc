// PsClient's pushes: each lane's pusher thread writes the chunks backward
// lets go (PushReady), in the order they become ready (priority pulls: the
// front layers' first among those waiting), the step's verdict when it
// comes due, then the step's end and the pull request (the lane's reader is
// PushPullLane, in ps_client.cc).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/chunk_message.h"
#include "common/nonfinite.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "worker/ps_client.h"
#include "worker/ps_client_step.h"

namespace pstrain {

absl::Status PsClient::PushChunk(int lane, StepState* state,
                                 const PushPullRequest& envelope,
                                 const ChunkSpec& c) {
  const int shard = lanes_[lane].shard;
  Stream& s = streams_[lane];
  const absl::Span<const float> values =
      state->gradients[c.param_id].subspan(c.offset, c.num_elements);
  // The step's first non-finite value (this chunk's element `element`).
  auto found = [&](int64_t element, float value) {
    absl::MutexLock lock(&state->mu);
    if (state->nonfinite == nullptr) {
      state->nonfinite = std::make_unique<NonFiniteValue>();
      state->nonfinite->param_id = c.param_id;
      state->nonfinite->element = element;
      state->nonfinite->value = NonFiniteText(value);
    }
  };
  bool skip;
  {
    absl::MutexLock lock(&state->mu);
    skip = state->nonfinite != nullptr;
  }
  // A row-sparse table's chunk goes as the step's rows (ps_client_rows.cc).
  const ChunkRows* rows = RowsOfChunk(*state->rows, c, values);
  const absl::Span<const float> scanned = rows ? rows->Values() : values;
  if (!skip) {
    const int64_t bad = FindNonFinite(scanned);
    if (bad >= 0) {
      skip = true;
      found(rows ? rows->ElementOf(c, bad) : c.offset + bad, scanned[bad]);
    }
  }
  // Top-k compression (worker/topk_compression.h) of a parameter's chunk
  // (buffers go dense, a row-sparse table's chunk by its rows): the
  // residual is added and the sum's largest entries go; a sum that
  // overflowed skips the step as a gradient's non-finite value would.
  thread_local std::vector<uint32_t> topk_indices;
  thread_local std::vector<float> topk_values;
  TopKCompressor* const topk = options_.compressor;
  const bool sparse = !skip && topk != nullptr &&
                      c.param_id < topk->num_tensors() && c.row_elements == 0;
  if (sparse) {
    // (A parameter's chunk: it goes in the job's wire dtype, whose
    // rounding the residual keeps.)
    topk->Compress(c.param_id, c.offset, values, &topk_indices, &topk_values,
                   options_.wire_dtype);
    const int64_t bad = FindNonFinite(topk_values);
    if (bad >= 0) {
      skip = true;
      found(c.offset + topk_indices[bad], topk_values[bad]);
    }
  }
  {
    absl::MutexLock lock(&state->mu);
    --state->unchecked_taken;  // checked (WritePushes() took it)
  }
  if (options_.before_push_write) options_.before_push_write(c);
  // Buffers (BatchNorm's running statistics) travel fp32 on every wire,
  // as the shards send them back (push_pull_session.cc) and as allreduce
  // averages them.
  const DType wire =
      plan_.is_buffer(c.param_id) ? DTYPE_FLOAT32 : options_.wire_dtype;
  const int64_t push_start_us = trace::NowUs();
  grpc::ByteBuffer message;
  if (skip) {
    PushPullRequest skipped = envelope;
    SkippedPush* push = skipped.mutable_skipped_push();
    push->mutable_key()->set_param_id(c.param_id);
    push->mutable_key()->set_chunk_index(c.chunk_index);
    push->set_step(state->step);
    message = EncodeSmallMessage(skipped);
  } else if (sparse && SparseAtLeastDense(topk_indices, c.num_elements,
                                          WireBytesPerElement(wire))) {
    // A warm-up's dense end (half the entries or more pushed): the same
    // chunk as zeros and the selected values, at the dense chunk's bytes
    // (the shard densifies a sparse push into exactly this).
    thread_local std::vector<float> dense;
    dense.assign(c.num_elements, 0.0f);
    for (size_t i = 0; i < topk_indices.size(); ++i) {
      dense[topk_indices[i]] = topk_values[i];
    }
    message = EncodeChunkMessage(envelope, kPushChunkField, c.param_id,
                                 c.chunk_index, state->step, dense,
                                 /*lease=*/nullptr, wire);
  } else if (sparse) {
    message = EncodeSparseChunkMessage(
        envelope, kPushChunkField, c.param_id, c.chunk_index, state->step,
        c.num_elements, topk_indices, topk_values, wire);
  } else if (rows != nullptr) {
    message = EncodeRowsPush(envelope, c, state->step, *rows);
  } else {
    message =
        EncodeChunkMessage(envelope, kPushChunkField, c.param_id, c.chunk_index,
                           state->step, values, leases_[shard].get(), wire);
  }
  const int64_t bytes = static_cast<int64_t>(message.Length());
  if (!s.stream->Write(message)) {
    return absl::UnavailableError("stream broke");
  }
  const int64_t push_end_us = trace::NowUs();
  if (state->first_push_us[lane] < 0) {
    state->first_push_us[lane] = push_start_us;
  }
  state->last_push_us[lane] = push_end_us;
  state->bytes_pushed[lane] += bytes;
  trace::Complete("push", "ps", push_start_us, push_end_us,
                  {{"step", state->step},
                   {"param", c.param_id},
                   {"chunk", c.chunk_index},
                   {"shard", shard},
                   {"channel", lanes_[lane].channel},
                   {"bytes", bytes}});
  return absl::OkStatus();
}

absl::Status PsClient::WriteStepEnd(int lane, StepState* state,
                                    const PushPullRequest& envelope,
                                    bool verdict_sent) {
  const int shard = lanes_[lane].shard;
  Stream& s = streams_[lane];
  // The end of the step, once every shard's chunks have been checked, so
  // that every shard hears the same report.
  PushPullRequest end = envelope;
  end.mutable_step_end()->set_step(state->step);
  if (lanes_[lane].count > 1) {
    // The shard takes it once the other lanes' PushesSent are in.
    end.mutable_step_end()->set_channels(lanes_[lane].count);
  }
  const bool backups = options_.backup_workers;
  if (backups) {
    end.mutable_step_end()->set_samples(state->pull.pull().samples());
  }
  {
    absl::MutexLock lock(&state->mu);
    ++state->pushers_done;
  }
  const int lanes = num_lanes();
  // Backup workers: shard 0 first; the others with its answer.
  const bool wait_admission = backups && shard > 0;
  auto all_pushed = [state, lanes, wait_admission]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
                          return state->pushers_done == lanes &&
                                 (!wait_admission || state->admission >= 0);
                        };
  while (true) {
    // While other lanes still push, the step's verdict may come due: it
    // goes now, so that this shard can announce the decision before the
    // other shards' pushes are in.
    absl::ReleasableMutexLock lock(&state->mu);
    auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
      return state->aborted || state->stopped[lane] || all_pushed() ||
             (state->say_finite && !verdict_sent);
    };
    state->mu.Await(absl::Condition(&go));
    if (state->aborted || state->stopped[lane]) {
      return absl::CancelledError("step aborted");
    }
    if (all_pushed()) break;
    verdict_sent = true;
    lock.Release();
    RETURN_IF_ERROR(WriteVerdict(lane, state, envelope));
  }
  {
    absl::MutexLock lock(&state->mu);
    if (backups) {
      end.mutable_step_end()->set_admission(
          shard == 0              ? StepEnd::ADMISSION_DECIDE
          : state->admission == 1 ? StepEnd::ADMITTED
                                  : StepEnd::LATE);
    }
    if (state->nonfinite != nullptr) {
      NonFinite* report = end.mutable_step_end()->mutable_nonfinite();
      report->set_param_id(state->nonfinite->param_id);
      report->set_element(state->nonfinite->element);
      report->set_value(state->nonfinite->value);
    }
  }
  if (shard > 0 && state->step == options_.hold_step_end) {
    HoldStepEnd(lane, state, envelope, verdict_sent);
  }
  if (!s.stream->Write(EncodeSmallMessage(end))) {
    return absl::UnavailableError("stream broke");
  }
  if (state->answer_norm) {
    RETURN_IF_ERROR(WriteStepNorm(lane, state, envelope));
  }
  return absl::OkStatus();
}

absl::Status PsClient::WriteStepNorm(int lane, StepState* state,
                                     const PushPullRequest& envelope) {
  Stream& s = streams_[lane];
  const bool backups = options_.backup_workers;
  // The squared global norm: every shard's partial, added in shard
  // order, so every worker sends every shard the same sum.
  PushPullRequest norm = envelope;
  norm.mutable_step_norm()->set_step(state->norm_step());
  {
    absl::MutexLock lock(&state->mu);
    const int shards = num_shards();
    // Backup workers: a late worker's step is not in the norm.
    auto all_in = [state, lane, shards,
                   backups]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
      return state->aborted || state->stopped[lane] ||
             state->norm_partials_in == shards || state->norm_missing ||
             (backups && state->admission == 0);
    };
    state->mu.Await(absl::Condition(&all_in));
    if (state->aborted || state->stopped[lane]) {
      return absl::CancelledError("step aborted");
    }
    // Decided (or to be) without this worker's sum.
    if (state->norm_partials_in < shards) return absl::OkStatus();
    double sum_sq = 0;
    for (double partial : state->norm_partials) sum_sq += partial;
    norm.mutable_step_norm()->set_sum_sq(sum_sq);
  }
  if (!s.stream->Write(EncodeSmallMessage(norm))) {
    return absl::UnavailableError("stream broke");
  }
  return absl::OkStatus();
}

grpc::ByteBuffer PsClient::PullOf(int lane, const StepState& state) const {
  if (lanes_[lane].count == 1) return EncodeSmallMessage(state.pull);
  PushPullRequest pull = state.pull;
  pull.mutable_pull()->set_channel(lanes_[lane].channel);
  pull.mutable_pull()->set_channels(lanes_[lane].count);
  // The step's samples count once per shard.
  if (lanes_[lane].channel > 0) pull.mutable_pull()->set_samples(0);
  return EncodeSmallMessage(pull);
}

void PsClient::HoldStepEnd(int lane, StepState* state,
                           const PushPullRequest& envelope, bool verdict_sent) {
  // Said already while the other lanes pushed, or now.
  bool said = verdict_sent && sends_verdicts() && lanes_[lane].channel == 0;
  if (!verdict_sent && sends_verdicts()) {
    bool finite = false;
    {
      absl::MutexLock lock(&state->mu);
      auto due = [state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return state->say_finite || state->aborted;
      };
      finite =
          state->mu.AwaitWithTimeout(absl::Condition(&due), absl::Minutes(1)) &&
          state->say_finite;
    }
    said = finite && WriteVerdict(lane, state, envelope).ok();
  }
  std::fprintf(stderr, "worker %d: holding step %lld's end from shard %d%s\n",
               options_.worker_id, static_cast<long long>(state->step),
               lanes_[lane].shard, said ? " after its verdict" : "");
  while (true) absl::SleepFor(absl::Hours(1));
}

absl::Status PsClient::WriteVerdict(int lane, StepState* state,
                                    const PushPullRequest& envelope) {
  PushPullRequest verdict = envelope;
  verdict.mutable_step_verdict()->set_step(state->step);
  const int64_t start_us = trace::NowUs();
  if (!streams_[lane].stream->Write(EncodeSmallMessage(verdict))) {
    return absl::UnavailableError("stream broke");
  }
  trace::Complete("verdict", "ps", start_us, trace::NowUs(),
                  {{"step", state->step}, {"shard", lanes_[lane].shard}});
  return absl::OkStatus();
}

absl::Status PsClient::WritePushes(int lane, StepState* state) {
  const int shard = lanes_[lane].shard;
  Stream& s = streams_[lane];
  if (state->pull_first && !s.stream->Write(PullOf(lane, *state))) {
    return absl::UnavailableError("stream broke");
  }
  PushPullRequest envelope;
  SetHeader(envelope.mutable_header());
  // The step's verdict (AwaitDecision()) goes on the shard's first lane,
  // once, before the lane's next write.
  bool verdict_sent = !state->send_step_end || lanes_[lane].channel != 0;
  while (true) {
    std::pair<int, std::shared_ptr<CopyFence>> next;
    bool say = false;
    {
      absl::MutexLock lock(&state->mu);
      auto go = [state, lane,
                 &verdict_sent]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return state->aborted || state->stopped[lane] || state->all_released ||
               !state->ready[lane].empty() ||
               (state->say_finite && !verdict_sent);
      };
      state->mu.Await(absl::Condition(&go));
      if (state->aborted || state->stopped[lane]) {
        return absl::CancelledError("step aborted");
      }
      if (state->say_finite && !verdict_sent) {
        say = verdict_sent = true;
      } else if (state->ready[lane].empty()) {
        break;  // all released and pushed
      } else {
        // Priority pulls: the front layers' chunks first (shard_chunks_
        // is in plan order), so that their barriers complete first.
        auto it = state->ready[lane].begin();
        if (options_.priority_pulls) {
          it = std::min_element(
              state->ready[lane].begin(), state->ready[lane].end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        next = std::move(*it);
        state->ready[lane].erase(it);
        ++state->unchecked_taken;  // until PushChunk() checked it
      }
    }
    if (say) {
      RETURN_IF_ERROR(WriteVerdict(lane, state, envelope));
      continue;
    }
    if (next.second != nullptr) {
      absl::Status fenced = next.second->Wait();
      if (!fenced.ok()) {
        absl::MutexLock lock(&state->mu);
        --state->unchecked_taken;
        return fenced;
      }
    }
    RETURN_IF_ERROR(
        PushChunk(lane, state, envelope, shard_chunks_[shard][next.first]));
  }
  if (state->send_step_end && lanes_[lane].channel == 0) {
    RETURN_IF_ERROR(WriteStepEnd(lane, state, envelope, verdict_sent));
  } else if (state->send_step_end) {
    // This lane's pushes are in: the shard's first lane ends the step.
    {
      absl::MutexLock lock(&state->mu);
      ++state->pushers_done;
    }
    PushPullRequest sent = envelope;
    sent.mutable_pushes_sent()->set_step(state->step);
    if (!s.stream->Write(EncodeSmallMessage(sent))) {
      return absl::UnavailableError("stream broke");
    }
  }
  if (!state->pull_first && !s.stream->Write(PullOf(lane, *state))) {
    return absl::UnavailableError("stream broke");
  }
  // A pull without pushes that answers its step's norm (PullDecided()).
  if (state->answer_norm && !state->send_step_end &&
      lanes_[lane].channel == 0) {
    return WriteStepNorm(lane, state, envelope);
  }
  return absl::OkStatus();
}

absl::Status PsClient::RunPusher(int lane, StepState* state) {
  if (trace::Enabled()) {
    trace::SetThreadName(absl::StrCat("push shard ", lanes_[lane].shard,
                                      " channel ", lanes_[lane].channel));
  }
  const absl::Status pushed = WritePushes(lane, state);
  {
    absl::MutexLock lock(&state->mu);
    ++state->pushers_finished;
  }
  // The pusher's own error (a failed fence): the shard will not answer
  // without this worker's pushes, so end the call for the reader's read to
  // return. Not when the pusher was stopped: the reader saw the call end
  // (a shard's in-band error, whose status Finish() is still to read, or
  // a broken stream), or another stream failed and CancelStep() cancelled
  // every call.
  bool stopped;
  {
    absl::MutexLock lock(&state->mu);
    stopped = state->aborted || state->stopped[lane];
  }
  if (!pushed.ok() && !absl::IsUnavailable(pushed) && !stopped) {
    absl::MutexLock lock(&streams_mu_);
    streams_[lane].context->TryCancel();
  }
  return pushed;
}

}  // namespace pstrain
