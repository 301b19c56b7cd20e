#include "worker/ps_client.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>  // NOLINT(build/c++11)
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/chunk_message.h"
#include "common/rpc_options.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "common/tls.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "worker/ps_client_step.h"

namespace pstrain {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

grpc::ChannelArguments PsChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, kMaxPingsWithoutData);
  // Each worker's channel to a shard is its own TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

PsClient::PsClient(const PsClientOptions& options, const PartitionPlan& plan)
    : options_(options), plan_(plan), addresses_(options.addresses) {}

void PsClient::Connect(int s) {
  for (int l = first_lane_[s]; l < num_lanes() && lanes_[l].shard == s; ++l) {
    grpc::ChannelArguments args = PsChannelArguments();
    // Its own connection (with the local subchannel pool already; the
    // argument keeps channels apart in a shared pool too).
    args.SetInt("pstrain.channel_index", lanes_[l].channel);
    if (options_.credentials != nullptr) {
      TlsIdentity shard;
      shard.role = TlsRole::kPs;
      shard.index = s;
      shard.job = options_.job_id;  // a shard of another job cannot answer
      SetPeerServerName(shard, &args);
    }
    channels_[l] = grpc::CreateCustomChannel(
        addresses_[s],
        options_.credentials != nullptr ? options_.credentials
                                        : grpc::InsecureChannelCredentials(),
        args);
    push_pull_methods_[l] = std::make_unique<grpc::internal::RpcMethod>(
        kPushPullMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
        channels_[l]);
  }
  stubs_[s] = ParameterServer::NewStub(channels_[first_lane_[s]]);
}

PsClient::~PsClient() {
  AbortStep();
  for (Stream& s : streams_) {
    if (s.context != nullptr) s.context->TryCancel();
  }
  // Ending the calls drops gRPC's references to lent gradients; the leases
  // must outlive them.
  for (Stream& s : streams_) {
    s.stream.reset();
    s.context.reset();
  }
  for (const std::unique_ptr<PayloadLease>& lease : leases_) {
    lease->WaitReleased(absl::Now() + absl::Seconds(10));
  }
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(
    const PsClientOptions& options, const PartitionPlan& plan) {
  if (static_cast<int>(options.addresses.size()) != plan.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.addresses.size(), " PS addresses for a plan of ",
                     plan.num_shards(), " shards"));
  }
  const int channels = options.channels_per_shard;  // 0: automatic
  if (channels < 0 || channels > kMaxChannelsPerShard) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels_per_shard ", options.channels_per_shard,
                     "; expected 1 to ", kMaxChannelsPerShard));
  }
  std::unique_ptr<PsClient> client(new PsClient(options, plan));
  client->tensor_chunks_.resize(plan.param_num_elements().size());
  client->lane_of_chunk_.assign(plan.chunks().size(), -1);
  for (int s = 0; s < plan.num_shards(); ++s) {
    const std::vector<ChunkSpec> chunks = plan.ChunksOfShard(s);
    client->shard_chunks_.push_back(chunks);
    int wanted = channels;
    if (wanted == 0) {
      int64_t bytes = 0;
      for (const ChunkSpec& chunk : chunks) {
        bytes += chunk.num_elements * static_cast<int64_t>(sizeof(float));
      }
      wanted = static_cast<int>(std::min<int64_t>(
          kAutoMaxChannelsPerShard,
          (bytes + kAutoBytesPerChannel - 1) / kAutoBytesPerChannel));
    }
    const int count =
        std::max(1, std::min(wanted, static_cast<int>(chunks.size())));
    client->first_lane_.push_back(client->num_lanes());
    for (int c = 0; c < count; ++c) {
      Lane lane;
      lane.shard = s;
      lane.channel = c;
      lane.count = count;
      client->lanes_.push_back(lane);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int lane = client->first_lane_[s] + static_cast<int>(i) % count;
      client->lanes_[lane].chunks.push_back(static_cast<int>(i));
      client->tensor_chunks_[chunks[i].param_id].emplace_back(
          lane, static_cast<int>(i));
      client->lane_of_chunk_[plan.FindChunk(chunks[i].param_id,
                                            chunks[i].chunk_index)] = lane;
    }
  }
  client->channels_.resize(client->num_lanes());
  client->push_pull_methods_.resize(client->num_lanes());
  client->stubs_.resize(plan.num_shards());
  for (int s = 0; s < plan.num_shards(); ++s) client->Connect(s);
  client->streams_.resize(client->num_lanes());
  for (int s = 0; s < plan.num_shards(); ++s) {
    client->leases_.push_back(std::make_unique<PayloadLease>());
  }
  return client;
}

void PsClient::SetHeader(RequestHeader* header) const {
  header->set_job_id(options_.job_id);
  header->set_worker_id(options_.worker_id);
  header->set_generation(generation_);
}

absl::Status PsClient::ShardError(int shard, const grpc::Status& status) const {
  absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(),
                      absl::StrCat("shard ", shard, " (", addresses_[shard],
                                   "): ", s.message()));
}

absl::Status PsClient::SetAddresses(const std::vector<std::string>& addresses) {
  if (static_cast<int>(addresses.size()) != num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat(addresses.size(), " PS addresses for a client of ",
                     num_shards(), " shards"));
  }
  Reset();
  for (int s = 0; s < num_shards(); ++s) {
    if (addresses[s] == addresses_[s]) continue;
    addresses_[s] = addresses[s];
    Connect(s);
  }
  return absl::OkStatus();
}

void PsClient::Reset() {
  delta_base_ = -1;
  AbortStep();
  absl::MutexLock lock(&streams_mu_);
  for (Stream& s : streams_) {
    if (s.context != nullptr) s.context->TryCancel();
    if (s.stream != nullptr) s.stream->Finish();
    s.stream.reset();
    s.context.reset();
  }
}

grpc::Status PsClient::CloseStream(int lane) {
  Stream& s = streams_[lane];
  s.stream->WritesDone();
  const grpc::Status status = s.stream->Finish();
  absl::MutexLock lock(&streams_mu_);
  s.stream.reset();
  s.context.reset();
  return status;
}

absl::Status PsClient::FinishStream(int lane) {
  const int shard = lanes_[lane].shard;
  const grpc::Status status = CloseStream(lane);
  if (status.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard, " (", addresses_[shard], "): stream ended early"));
  }
  return ShardError(shard, status);
}

absl::Status PsClient::TakeNormPartial(int shard, StepState* state,
                                       const NormSum& partial) {
  // A pull without pushes (of a version whose step was decided) may carry
  // the partial too: not this worker's to answer.
  if (options_.clip_by_global_norm && !state->answer_norm) {
    return absl::OkStatus();
  }
  if (!options_.clip_by_global_norm || partial.step() != state->norm_step()) {
    return absl::DataLossError(absl::StrCat(
        "shard ", shard, " sent a partial norm of step ", partial.step(),
        ", which this worker did not end with clipping"));
  }
  absl::MutexLock lock(&state->mu);
  if (!std::isnan(state->norm_partials[shard])) {
    return absl::DataLossError(absl::StrCat(
        "shard ", shard, " sent two partial norms of step ", partial.step()));
  }
  state->norm_partials[shard] = partial.sum_sq();
  ++state->norm_partials_in;
  return absl::OkStatus();
}

absl::Status PsClient::TakePulledChunk(int lane, StepState* state,
                                       ReceivedChunkMessage& received,
                                       int64_t arrived_us, int64_t bytes,
                                       int64_t* smallest) {
  const int shard = lanes_[lane].shard;
  const TensorChunk& chunk = received.chunk();
  const int index =
      plan_.FindChunk(chunk.key().param_id(), chunk.key().chunk_index());
  if (index < 0 || plan_.chunks()[index].shard != shard) {
    return absl::DataLossError(
        absl::StrCat("shard ", shard, " sent chunk (", chunk.key().param_id(),
                     ", ", chunk.key().chunk_index(), ") it does not own"));
  }
  if (lane_of_chunk_[index] != lane) {
    return absl::DataLossError(
        absl::StrCat("shard ", shard, " sent chunk (", chunk.key().param_id(),
                     ", ", chunk.key().chunk_index(), ") on channel ",
                     lanes_[lane].channel, ", which did not ask for it"));
  }
  const ChunkSpec& c = plan_.chunks()[index];
  if (chunk.sparse() && chunk.row_elements() <= 1 &&
      (!state->pull.pull().has_have_version() ||
       chunk.version() != state->pull.pull().have_version() + 1)) {
    return absl::DataLossError(absl::StrCat(
        "shard ", shard, " sent chunk (", chunk.key().param_id(), ", ",
        chunk.key().chunk_index(), ") of version ", chunk.version(),
        " as a delta, but this worker ",
        state->pull.pull().has_have_version()
            ? absl::StrCat("holds version ", state->pull.pull().have_version())
            : "asked for whole chunks"));
  }
  // One copy, from the received slices into the weights (a table's chunk:
  // the rows asked for, the others left; a delta: its entries).
  RETURN_IF_ERROR(received.ScatterFloatPayload(
      state->weights[c.param_id].subspan(c.offset, c.num_elements)));
  {
    absl::MutexLock lock(&state->mu);
    if (!state->chunk_pulled[index]) {
      state->chunk_pulled[index] = true;
      --state->tensor_missing[c.param_id];
    }
  }
  *smallest =
      *smallest < 0 ? chunk.version() : std::min(*smallest, chunk.version());
  state->largest[lane] =
      std::max(state->largest[lane], static_cast<int64_t>(chunk.version()));
  state->pull_arrivals_us[lane].push_back(arrived_us);
  state->bytes_pulled[lane] += bytes;
  // From the chunk's arrival to its copy into the weights.
  trace::Complete("pull", "ps", arrived_us, trace::NowUs(),
                  {{"step", state->step},
                   {"param", c.param_id},
                   {"chunk", c.chunk_index},
                   {"shard", shard},
                   {"version", chunk.version()}});
  return absl::OkStatus();
}

absl::Status PsClient::PushPullLane(int lane, StepState* state,
                                    int64_t* version) {
  const int shard = lanes_[lane].shard;
  const int channel = lanes_[lane].channel;
  Stream& s = streams_[lane];
  absl::Status pushed;
  if (trace::Enabled()) {
    trace::SetThreadName(
        absl::StrCat("pull shard ", shard, " channel ", channel));
  }
  std::thread pusher([&] { pushed = RunPusher(lane, state); });
  // Ends the step on this shard; a pusher's own error (a failed fence)
  // comes first. `status` OK: the call ended on its own (the shard ended
  // it, or its process or the connection died): the pusher is stopped
  // without cancelling the call, so that Finish() reads the shard's real
  // status. Otherwise this worker gives the call up (cancelled) and
  // `status` is the error.
  auto fail = [&](absl::Status status) {
    {
      absl::MutexLock lock(&state->mu);
      state->stopped[lane] = true;
    }
    if (!status.ok()) {
      absl::MutexLock lock(&streams_mu_);
      s.context->TryCancel();
    }
    pusher.join();
    absl::Status finished = FinishStream(lane);
    bool given_up = false;  // another shard's failure cancelled this call
    {
      absl::MutexLock lock(&state->mu);
      given_up = state->aborted;
    }
    if (status.ok() && !given_up && absl::IsCancelled(finished)) {
      // This worker did not cancel the call: gRPC ended it when the
      // connection died, without a status from the shard.
      finished = absl::UnavailableError(absl::StrCat(
          finished.message(),
          " (the call ended without the shard's status: its process or the "
          "connection died)"));
    }
    if (!pushed.ok() && !absl::IsUnavailable(pushed) &&
        !absl::IsCancelled(pushed)) {
      return pushed;
    }
    return status.ok() ? finished : status;
  };
  grpc::ByteBuffer buffer;
  ReceivedChunkMessage received;
  PushPullResponse envelope;  // the fields besides the chunk
  int64_t smallest = -1;
  size_t received_chunks = 0;
  // Backup workers: shard 0 answers this step's end (StepAdmission) beside
  // the pull, before or after its last message, on its first channel.
  bool awaiting_admission = options_.backup_workers && shard == 0 &&
                            channel == 0 && state->send_step_end;
  bool pull_complete = false;
  while (true) {
    if (!s.stream->Read(&buffer)) return fail(absl::OkStatus());
    const int64_t arrived_us = trace::NowUs();
    const int64_t bytes = static_cast<int64_t>(buffer.Length());
    absl::Status status = received.Parse(&buffer, kPullChunkField, &envelope);
    if (!status.ok()) {
      return fail(absl::DataLossError(
          absl::StrCat("shard ", shard, ": ", status.message())));
    }
    if (envelope.error_code() != 0) {
      // The shard ends the call with that error once this worker
      // half-closes (FinishStream).
      return fail(absl::OkStatus());
    }
    if (envelope.has_admission()) {
      if (!awaiting_admission || envelope.admission().step() != state->step) {
        return fail(absl::DataLossError(absl::StrCat(
            "shard ", shard, " sent an admission to step ",
            envelope.admission().step(), ", which this worker did not end")));
      }
      awaiting_admission = false;
      absl::MutexLock lock(&state->mu);
      state->admission = envelope.admission().admitted() ? 1 : 0;
      if (!pull_complete) continue;
      break;
    }
    if (envelope.has_norm_partial()) {
      status = TakeNormPartial(shard, state, envelope.norm_partial());
      if (!status.ok()) return fail(status);
      continue;
    }
    if (envelope.has_decided_step()) {
      if (!state->pull.pull().announce_decision() ||
          envelope.decided_step() != state->norm_step()) {
        return fail(absl::DataLossError(absl::StrCat(
            "shard ", shard, " announced the decision of step ",
            envelope.decided_step(), ", which this pull did not ask for")));
      }
      status = TakeSwitchedGeneration(lane, state, envelope);
      if (!status.ok()) return fail(status);
      absl::MutexLock lock(&state->mu);
      state->decided = true;
      continue;
    }
    if (envelope.has_skipped_step()) {
      const SkippedStep& skip = envelope.skipped_step();
      SkippedStepInfo& info = state->skipped[lane];
      info.step = skip.step();
      info.worker_id = skip.worker_id();
      info.nonfinite.param_id = skip.nonfinite().param_id();
      info.nonfinite.element = skip.nonfinite().element();
      info.nonfinite.value = skip.nonfinite().value();
    }
    if (received.has_chunk()) {
      status =
          TakePulledChunk(lane, state, received, arrived_us, bytes, &smallest);
      if (!status.ok()) return fail(status);
      ++received_chunks;
    }
    if (envelope.last_of_pull()) {
      status = TakeSwitchedGeneration(lane, state, envelope);
      if (!status.ok()) return fail(status);
      pull_complete = true;
      TakePullEnd(lane, state, envelope);
      if (!awaiting_admission) break;
    }
  }
  // The pull is complete, so the shard has read every push (sync: it
  // needed them; async: they went before the pull): the pusher is done.
  pusher.join();
  if (!pushed.ok()) {
    if (absl::IsUnavailable(pushed)) return FinishStream(lane);
    return pushed;
  }
  // A skipped step's pull sends every chunk twice (the second time
  // restored).
  const size_t expected =
      lanes_[lane].chunks.size() * (state->skipped[lane].step >= 0 ? 2 : 1);
  if (received_chunks != expected) {
    return absl::DataLossError(absl::StrCat(
        "shard ", shard, " answered a pull with ", received_chunks,
        " chunks; expected ", expected,
        lanes_[lane].count > 1 ? absl::StrCat(" on channel ", channel) : ""));
  }
  *version = smallest;
  return absl::OkStatus();
}

absl::Status PsClient::TakeSwitchedGeneration(int lane, StepState* state,
                                              const PushPullResponse& message) {
  if (!message.has_generation()) return absl::OkStatus();
  if (message.generation() != generation_ + 1) {
    return absl::DataLossError(
        absl::StrCat("shard ", lanes_[lane].shard, " says it took generation ",
                     message.generation(),
                     " at the decision this pull waited for; "
                     "this worker works on generation ",
                     generation_, " and expected the next"));
  }
  absl::MutexLock lock(&state->mu);
  state->switched_to[lane] = message.generation();
  if (message.has_decided_step()) state->switch_announced = true;
  return absl::OkStatus();
}

absl::Status PsClient::TakeGenerationSwitch(
    int64_t step, const std::vector<int64_t>& switched_to) {
  int64_t to = -1;
  int lanes_switched = 0;
  for (int64_t g : switched_to) {
    if (g < 0) continue;
    to = g;
    ++lanes_switched;
  }
  if (lanes_switched == 0) return absl::OkStatus();
  if (lanes_switched != num_lanes()) {
    // A reopen came between (a failure): the recovery sorts it out.
    return absl::AbortedError(
        absl::StrCat("only ", lanes_switched, " of ", num_lanes(),
                     " streams to the shards ended step ", step,
                     " with the planned generation ", to));
  }
  // The worker's own scaler takes this step's skip after the exchange,
  // as every member's does (StepLoop): the shards' copy, which has taken
  // it already, is not put into it.
  std::optional<LossScaler::State> own;
  if (loss_scaler_ != nullptr) own = loss_scaler_->state();
  absl::Status ready =
      WaitReady(options_.rpc_timeout, to, /*wait_for_connection=*/false);
  if (own.has_value()) loss_scaler_->Restore(*own);
  RETURN_IF_ERROR(ready);
  if (generation_ != to) {
    return absl::AbortedError(
        absl::StrCat("the shards took generation ", to, " at step ", step,
                     " and were reopened at ", generation_, " since"));
  }
  return absl::OkStatus();
}

void PsClient::TakePullEnd(int lane, StepState* state,
                           const PushPullResponse& last) {
  const int shard = lanes_[lane].shard;
  absl::MutexLock lock(&state->mu);
  if (last.has_checkpoint_step() && shard == 0) {
    state->checkpoint_step =
        std::max(state->checkpoint_step, last.checkpoint_step());
  }
  if (options_.clip_by_global_norm && lanes_[lane].channel == 0 &&
      std::isnan(state->norm_partials[shard])) {
    // No partial by now: none will come (see StepState::norm_missing).
    // (The shard sends it on channel 0's pull only.)
    state->norm_missing = true;
  }
}

absl::StatusOr<int64_t> PsClient::PushPull(
    int64_t step, const std::vector<absl::Span<const float>>& gradients,
    int64_t min_version, int64_t samples,
    const std::vector<absl::Span<float>>& weights) {
  RETURN_IF_ERROR(BeginStep(step, gradients, min_version, samples, weights));
  return FinishStep();
}

absl::StatusOr<int64_t> PsClient::PullDecided(
    int64_t first_step, int64_t version,
    const std::vector<absl::Span<float>>& weights) {
  int64_t pulled = -1;
  const int64_t start =
      options_.clip_by_global_norm
          ? std::max<int64_t>(std::min(first_step + 1, version), 0)
          : version;
  for (int64_t v = start; v <= version; ++v) {
    PullOnly pull_only;
    pull_only.answer_norm = v > first_step;  // the round of step v - 1
    pull_only.full_precision = v == version;
    RETURN_IF_ERROR(BeginStep(v - 1, {}, v, 0, weights, pull_only));
    ASSIGN_OR_RETURN(pulled, FinishStep());
  }
  return pulled;
}

absl::Status PsClient::BeginStep(
    int64_t step, const std::vector<absl::Span<const float>>& gradients,
    int64_t min_version, int64_t samples,
    const std::vector<absl::Span<float>>& weights) {
  return BeginStep(step, gradients, min_version, samples, weights, PullOnly());
}

absl::Status PsClient::BeginStep(
    int64_t step, const std::vector<absl::Span<const float>>& gradients,
    int64_t min_version, int64_t samples,
    const std::vector<absl::Span<float>>& weights, PullOnly pull_only) {
  if (step_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " begun while step ", step_->step,
                     " is still in flight"));
  }
  const int n = num_lanes();
  // A stream's deadline is stream_timeout after its opening (every call
  // has one), while a job may run for many times that: between steps,
  // each stream past half of it is closed the way CloseStreams() closes
  // them (the shard does not take that for the worker leaving) and a new
  // one is opened below, so that no step meets a stream's deadline.
  const absl::Time now = absl::Now();
  absl::Status closed;
  for (int l = 0; l < n; ++l) {
    if (streams_[l].stream == nullptr ||
        now - streams_[l].opened < options_.stream_timeout / 2) {
      continue;
    }
    const grpc::Status status = CloseStream(l);
    if (!status.ok() && closed.ok()) {
      closed = ShardError(lanes_[l].shard, status);
    }
  }
  // An idle stream ends badly only where its shard or the connection
  // failed meanwhile, which the step would have met on it: the step's
  // error (UNAVAILABLE for a dead shard, which a recovery handles).
  RETURN_IF_ERROR(closed);
  step_ = std::make_unique<StepState>();
  StepState* state = step_.get();
  state->step = step;
  state->gradients = gradients;
  state->weights = weights;
  state->rows = rows_;
  SetHeader(state->pull.mutable_header());
  state->pull.mutable_pull()->set_min_version(min_version);
  state->pull.mutable_pull()->set_samples(samples);
  state->full_precision = pull_only.full_precision;
  if (options_.wire_dtype != DTYPE_FLOAT32 && !state->full_precision) {
    state->pull.mutable_pull()->set_wire_dtype(options_.wire_dtype);
  }
  if (options_.priority_pulls) state->pull.mutable_pull()->set_priority(true);
  if (HoldsDeltaBase(weights) && !state->full_precision) {
    state->pull.mutable_pull()->set_have_version(delta_base_);
  }
  // A pull without a push (start, recovery, a late worker's) brings every
  // table whole: the worker's copy is fresh everywhere after it.
  if (!gradients.empty()) AddPullRows(state->pull.mutable_pull());
  last_pull_by_rows_ = state->pull.pull().rows_size() > 0;
  state->pull_first = !gradients.empty() && min_version > 0;
  state->send_step_end = state->pull_first;
  state->answer_norm = options_.clip_by_global_norm &&
                       (state->send_step_end || pull_only.answer_norm);
  if (announce_decisions_ && state->pull_first) {
    state->pull.mutable_pull()->set_announce_decision(true);
  }
  skipped_step_.reset();
  unfinished_step_.reset();
  last_step_late_ = false;
  {
    absl::MutexLock lock(&state->mu);
    state->ready.resize(n);
    state->stopped.assign(n, false);
    state->released.assign(tensor_chunks_.size(), false);
    state->all_released = gradients.empty();
    state->norm_partials.assign(num_shards(), std::nan(""));
    state->chunk_pulled.assign(plan_.chunks().size(), false);
    state->tensor_missing.resize(tensor_chunks_.size());
    for (size_t t = 0; t < tensor_chunks_.size(); ++t) {
      state->tensor_missing[t] = static_cast<int>(tensor_chunks_[t].size());
    }
  }
  state->statuses.assign(n, absl::OkStatus());
  state->versions.assign(n, 0);
  state->largest.assign(n, 0);
  state->skipped.assign(n, SkippedStepInfo());
  {
    absl::MutexLock lock(&state->mu);
    state->switched_to.assign(n, -1);
  }
  state->first_push_us.assign(n, -1);
  state->last_push_us.assign(n, -1);
  state->bytes_pushed.assign(n, 0);
  state->pull_arrivals_us.assign(n, {});
  state->bytes_pulled.assign(n, 0);
  for (int l = 0; l < n; ++l) {
    Stream& stream = streams_[l];
    if (stream.stream == nullptr) {
      stream.opened = absl::Now();
      stream.context = std::make_unique<grpc::ClientContext>();
      stream.context->set_deadline(
          absl::ToChronoTime(stream.opened + options_.stream_timeout));
      // The stream moves grpc::ByteBuffers (common/chunk_message.h),
      // created the way gRPC's generated stubs create theirs.
      stream.stream.reset(grpc::internal::ClientReaderWriterFactory<
                          grpc::ByteBuffer,
                          grpc::ByteBuffer>::Create(channels_[l].get(),
                                                    *push_pull_methods_[l],
                                                    stream.context.get()));
    }
  }
  for (int l = 0; l < n; ++l) {
    state->threads.emplace_back([this, state, l] {
      state->statuses[l] = PushPullLane(l, state, &state->versions[l]);
      if (!state->statuses[l].ok()) CancelStep(state, l);
      absl::MutexLock lock(&state->mu);
      ++state->lanes_ended;
    });
  }
  return absl::OkStatus();
}

void PsClient::PushReady(absl::Span<const int> tensors,
                         std::shared_ptr<CopyFence> fence) {
  if (step_ == nullptr || step_->gradients.empty()) return;
  StepState* state = step_.get();
  absl::MutexLock lock(&state->mu);
  for (int t : tensors) {
    if (t < 0 || t >= static_cast<int>(tensor_chunks_.size()) ||
        state->released[t]) {
      continue;
    }
    state->released[t] = true;
    for (const auto& [lane, index] : tensor_chunks_[t]) {
      state->ready[lane].emplace_back(index, fence);
    }
  }
}

PsStepTimes PsClient::StepTimesOf(const StepState& state) const {
  PsStepTimes times;
  int64_t first_push = -1, last_push = -1, last_arrival = -1;
  for (int s = 0; s < num_lanes(); ++s) {
    times.bytes_pushed += state.bytes_pushed[s];
    times.bytes_pulled += state.bytes_pulled[s];
    if (state.first_push_us[s] >= 0) {
      first_push = first_push < 0
                       ? state.first_push_us[s]
                       : std::min(first_push, state.first_push_us[s]);
    }
    last_push = std::max(last_push, state.last_push_us[s]);
    for (int64_t t : state.pull_arrivals_us[s]) {
      last_arrival = std::max(last_arrival, t);
    }
  }
  if (first_push >= 0) times.push = absl::Microseconds(last_push - first_push);
  if (last_arrival < 0) return times;
  int64_t pull_from = last_push >= 0 ? last_push : last_arrival;
  if (state.send_step_end && last_push >= 0) {
    // The first arrival after the last push (there is one: a chunk cannot
    // pass the barrier before this worker's push of it).
    int64_t first_after = last_arrival;
    for (int s = 0; s < num_lanes(); ++s) {
      for (int64_t t : state.pull_arrivals_us[s]) {
        if (t >= last_push) first_after = std::min(first_after, t);
      }
    }
    // (With staleness the pull may be older and all in already.)
    first_after = std::max(first_after, last_push);
    times.barrier_wait = absl::Microseconds(first_after - last_push);
    pull_from = first_after;
    trace::Complete("barrier wait", "ps", last_push, first_after,
                    {{"step", state.step}});
  }
  times.pull =
      absl::Microseconds(std::max<int64_t>(0, last_arrival - pull_from));
  return times;
}

absl::StatusOr<int64_t> PsClient::FinishStep() {
  if (step_ == nullptr) {
    return absl::FailedPreconditionError("no step begun");
  }
  StepState* state = step_.get();
  ReleaseAll(state);
  for (std::thread& t : state->threads) t.join();
  std::unique_ptr<StepState> done = std::move(step_);
  const int n = num_shards();  // leases are per shard
  last_step_times_ = StepTimesOf(*done);
  // The pushes lent the gradients to gRPC without a copy, and the caller may
  // change them once this returns: wait until gRPC has let go of every
  // slice. After a successful pull this is only gRPC dropping references,
  // since each shard answered the pull after it had read the pushes.
  for (int s = 0; s < n; ++s) {
    if (!leases_[s]->WaitReleased(absl::Now() + options_.rpc_timeout) &&
        done->statuses[first_lane_[s]].ok()) {
      done->statuses[first_lane_[s]] = absl::InternalError(
          absl::StrCat("shard ", s, " (", addresses_[s],
                       "): gRPC still holds the pushed gradients after ",
                       absl::FormatDuration(options_.rpc_timeout)));
    }
  }
  // The first error that is not the cancel of a shard given up because
  // another failed.
  const absl::Status* first = nullptr;
  for (const absl::Status& status : done->statuses) {
    if (status.ok()) continue;
    if (first == nullptr ||
        (absl::IsCancelled(*first) && !absl::IsCancelled(status))) {
      first = &status;
    }
  }
  if (first != nullptr) {
    delta_base_ = -1;
    NoteUnfinished(done.get());
    return *first;
  }
  std::vector<int64_t> switched_to;
  {
    absl::MutexLock lock(&done->mu);
    switched_to = done->switched_to;
  }
  // A planned membership change taken at this step's decision.
  if (absl::Status switched = TakeGenerationSwitch(done->step, switched_to);
      !switched.ok()) {
    delta_base_ = -1;
    return switched;
  }
  // Every shard decides alike (proto/ps.proto StepEnd); a shard without
  // chunks decides nothing.
  for (const SkippedStepInfo& skip : done->skipped) {
    if (skip.step >= 0) skipped_step_ = skip;
  }
  {
    absl::MutexLock lock(&done->mu);
    last_step_late_ =
        options_.backup_workers && done->send_step_end && done->admission == 0;
  }
  if (!done->send_step_end) {
    absl::MutexLock lock(&done->mu);
    if (done->nonfinite != nullptr) {
      SkippedStepInfo own;
      own.step = done->step;
      own.worker_id = options_.worker_id;
      own.nonfinite = *done->nonfinite;
      skipped_step_ = own;
    }
  }
  {
    absl::MutexLock lock(&done->mu);
    if (done->checkpoint_step >= 0) {
      if (announced_generation_ != generation_) {
        announced_checkpoint_step_ = -1;
        announced_generation_ = generation_;
      }
      announced_checkpoint_step_ =
          std::max(announced_checkpoint_step_, done->checkpoint_step);
    }
  }
  last_max_version_ =
      *std::max_element(done->largest.begin(), done->largest.end());
  const int64_t smallest =
      *std::min_element(done->versions.begin(), done->versions.end());
  // Every chunk at one version, in these weights: the next pull's base.
  delta_base_ = -1;
  // (Not after a full-precision pull: a delta against it would mix its
  // fp32 values with the wire's rounding.)
  if (options_.delta_pulls && !done->full_precision &&
      smallest == last_max_version_ && smallest >= 0) {
    delta_base_ = smallest;
    delta_generation_ = generation_;
    delta_weights_.clear();
    for (const absl::Span<float>& w : done->weights) {
      delta_weights_.push_back(w.data());
    }
  }
  return smallest;
}

bool PsClient::HoldsDeltaBase(
    const std::vector<absl::Span<float>>& weights) const {
  if (delta_base_ < 0 || delta_generation_ != generation_ ||
      weights.size() != delta_weights_.size()) {
    return false;
  }
  for (size_t t = 0; t < weights.size(); ++t) {
    if (weights[t].data() != delta_weights_[t]) return false;
  }
  return true;
}

void PsClient::ReleaseAll(StepState* state) {
  absl::MutexLock lock(&state->mu);
  if (state->all_released) return;
  for (size_t t = 0; t < tensor_chunks_.size(); ++t) {
    if (state->released[t]) continue;
    state->released[t] = true;
    for (const auto& [lane, index] : tensor_chunks_[t]) {
      state->ready[lane].emplace_back(index, nullptr);
    }
  }
  state->all_released = true;
}

bool PsClient::AwaitDecision() {
  if (step_ == nullptr) return false;
  StepState* state = step_.get();
  ReleaseAll(state);
  if (sends_verdicts() && state->send_step_end) SayFiniteIfSo(state);
  const int lanes = num_lanes();
  absl::MutexLock lock(&state->mu);
  // With the verdict said, the pushes may still be on the wire: the
  // next forward waits per tensor for the pull, and the backward after
  // it for the whole step (FinishStep()) before it writes gradients.
  auto known = [state, lanes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->aborted || state->lanes_ended == lanes ||
           (state->decided &&
            (state->say_finite || state->pushers_finished == lanes));
  };
  state->mu.Await(absl::Condition(&known));
  return !state->aborted && state->lanes_ended < lanes && state->decided &&
         !state->switch_announced;
}

void PsClient::SayFiniteIfSo(StepState* state) {
  // A chunk's values are final once its copy fence is passed (a device
  // backend's copy to the host staging; GradientsReady()): each fence of
  // a chunk still waiting is passed first, outside the lock, so that the
  // pushers go on meanwhile. After backward no chunk joins `ready`.
  std::vector<std::shared_ptr<CopyFence>> fences;
  {
    absl::MutexLock lock(&state->mu);
    for (int lane = 0; lane < num_lanes(); ++lane) {
      for (const auto& [index, fence] : state->ready[lane]) {
        if (fence != nullptr) fences.push_back(fence);
      }
    }
  }
  for (const std::shared_ptr<CopyFence>& fence : fences) {
    if (!fence->Wait().ok()) return;  // the pusher reports it
  }
  absl::MutexLock lock(&state->mu);
  // Every chunk a pusher took is checked there (a non-finite value sets
  // `nonfinite`); then, under the lock, no pusher takes another, and the
  // chunks still waiting are checked here, as PushChunk() would: neither
  // pushed nor pulled yet, so their values are the step's (a buffer's
  // pushed values are its weights, which its pull writes once every
  // worker pushed it).
  auto checked = [state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->aborted || state->unchecked_taken == 0;
  };
  state->mu.Await(absl::Condition(&checked));
  if (state->aborted || state->nonfinite != nullptr) return;
  for (int lane = 0; lane < num_lanes(); ++lane) {
    const std::vector<ChunkSpec>& chunks = shard_chunks_[lanes_[lane].shard];
    for (const auto& [index, fence] : state->ready[lane]) {
      const ChunkSpec& c = chunks[index];
      const absl::Span<const float> values =
          state->gradients[c.param_id].subspan(c.offset, c.num_elements);
      const ChunkRows* rows = RowsOfChunk(*state->rows, c, values);
      if (FindNonFinite(rows ? rows->Values() : values) >= 0) {
        return;  // the pushers report it
      }
    }
  }
  state->say_finite = true;
}

bool PsClient::AwaitTensor(int t) {
  if (step_ == nullptr || t < 0 ||
      t >= static_cast<int>(tensor_chunks_.size())) {
    return true;
  }
  StepState* state = step_.get();
  const int lanes = num_lanes();
  absl::MutexLock lock(&state->mu);
  // A lane that ended without its chunks failed (or was given up).
  auto in = [state, lanes, t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->tensor_missing[t] == 0 || state->aborted ||
           state->lanes_ended == lanes;
  };
  state->mu.Await(absl::Condition(&in));
  return state->tensor_missing[t] == 0 && !state->aborted;
}

void PsClient::MarkStepNonFinite(const NonFiniteValue& value) {
  if (step_ == nullptr) return;
  absl::MutexLock lock(&step_->mu);
  if (step_->nonfinite == nullptr) {
    step_->nonfinite = std::make_unique<NonFiniteValue>(value);
  }
}

void PsClient::CancelStep(StepState* state, int except) {
  {
    absl::MutexLock lock(&state->mu);
    state->aborted = true;
  }
  absl::MutexLock lock(&streams_mu_);
  for (int l = 0; l < num_lanes(); ++l) {
    if (l != except && streams_[l].context != nullptr) {
      streams_[l].context->TryCancel();
    }
  }
}

void PsClient::AbortStep() {
  if (step_ == nullptr) return;
  CancelStep(step_.get(), -1);
  for (std::thread& t : step_->threads) t.join();
  NoteUnfinished(step_.get());
  step_.reset();
}

void PsClient::NoteUnfinished(StepState* state) {
  if (!state->send_step_end) return;  // no pushes
  absl::MutexLock lock(&state->mu);
  UnfinishedStep unfinished;
  unfinished.step = state->step;
  unfinished.all_pushed = state->pushers_done >= num_lanes();
  unfinished.admission = state->admission;
  unfinished_step_ = unfinished;
}

absl::StatusOr<StatsResponse> PsClient::Stats(int shard) {
  return Stats(shard, options_.rpc_timeout);
}

absl::StatusOr<StatsResponse> PsClient::Stats(int shard,
                                              absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  StatsRequest request;
  SetHeader(request.mutable_header());
  StatsResponse response;
  const grpc::Status status =
      stubs_[shard]->Stats(&context, request, &response);
  if (!status.ok()) return ShardError(shard, status);
  return response;
}

absl::Status PsClient::CloseStreams() {
  absl::Status first_error;
  for (int l = 0; l < num_lanes(); ++l) {
    if (streams_[l].stream == nullptr) continue;
    const grpc::Status status = CloseStream(l);
    if (!status.ok() && first_error.ok()) {
      first_error = ShardError(lanes_[l].shard, status);
    }
  }
  return first_error;
}

}  // namespace pstrain
