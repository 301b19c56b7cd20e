// PsClient's calls on the shards' state rather than on a step: install
// it (Initialize, InitializeAs), find and raise the generation after a
// failure (HighestGeneration, Restore, Reopen), wait for it (WaitReady),
// and checkpoint it (Checkpoint); see worker/ps_client.h.
#include <algorithm>
#include <functional>
#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/membership.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

absl::Status PsClient::Initialize(
    const std::vector<absl::Span<const float>>& params,
    const ModelState* resume) {
  return InitializeAs(params, resume, 0);
}

absl::StatusOr<int64_t> PsClient::HighestGeneration(
    absl::Duration timeout, std::vector<int>* uninitialised,
    std::vector<int64_t>* decided_steps) {
  int64_t highest = 0;
  for (int s = 0; s < num_shards(); ++s) {
    ASSIGN_OR_RETURN(const StatsResponse response, Stats(s, timeout));
    highest = std::max(highest, response.generation());
    if (uninitialised != nullptr && !response.initialized()) {
      uninitialised->push_back(s);
    }
    if (decided_steps != nullptr) {
      decided_steps->push_back(response.decided_step());
    }
  }
  return highest;
}

absl::StatusOr<int64_t> PsClient::Restore(
    const std::vector<absl::Span<const float>>& weights,
    const ModelState& state, absl::Duration timeout,
    const WorkerMembership* membership) {
  ASSIGN_OR_RETURN(const int64_t highest, HighestGeneration(timeout));
  const int64_t generation = highest + 1;
  RETURN_IF_ERROR(InitializeAs(weights, &state, generation, membership));
  generation_ = generation;
  return generation;
}

absl::StatusOr<int64_t> PsClient::Reopen(absl::Duration timeout,
                                         const WorkerMembership* membership) {
  std::vector<int> restarted;
  std::vector<int64_t> decided;
  ASSIGN_OR_RETURN(const int64_t highest,
                   HighestGeneration(timeout, &restarted, &decided));
  if (!restarted.empty()) {
    // The ordinary shard death: nothing to reopen, the checkpoint it is.
    const bool one = restarted.size() == 1;
    return absl::FailedPreconditionError(absl::StrCat(
        one ? "shard " : "shards ", absl::StrJoin(restarted, ", "),
        one ? " was restarted and holds" : " were restarted and hold",
        " no state, so every shard restores the checkpoint"));
  }
  const int64_t generation = highest + 1;
  // Shards that decided different steps (a worker died between its step
  // ends to two of them) reopen at the smallest version any stands at, one
  // a step past it undoing that step. Otherwise shard 0 at its own version
  // (the shards of a job with backup workers may decide steps until the
  // reopen freezes them) and the others at the same. Async keeps each
  // chunk's version (not checked).
  const auto [least, most] =
      std::minmax_element(decided.begin(), decided.end());
  int64_t version = least == decided.end() || *least == *most ? -1 : *least + 1;
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    InitResponse response;
    auto writer = stubs_[s]->Init(&context, &response);
    InitRequest first = FirstInitRequest(generation, membership);
    first.set_reopen(true);
    first.clear_loss_scaler();  // a reopen keeps the shard's
    // A shard that cannot stays at the old generation until the restore.
    first.set_reopen_version(version);
    writer->Write(first);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (!status.ok()) {
      absl::Status error = ShardError(s, status);
      if (s > 0 && absl::IsFailedPrecondition(error)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard 0 reopened at version ", version, " but ", error.message()));
      }
      return error;
    }
    if (s == 0) version = response.version();
  }
  generation_ = generation;
  return version;
}

InitRequest PsClient::FirstInitRequest(
    int64_t generation, const WorkerMembership* membership) const {
  InitRequest first;
  SetHeader(first.mutable_header());
  ModelLayout* layout = first.mutable_layout();
  for (int64_t n : plan_.param_num_elements()) {
    layout->add_param_num_elements(n);
  }
  layout->set_partition_bytes(plan_.partition_bytes());
  layout->set_num_buffers(plan_.num_buffers());
  layout->set_num_shards(plan_.num_shards());
  for (int64_t d : plan_.param_row_elements()) {
    layout->add_param_row_elements(d);
  }
  first.set_generation(generation);
  if (membership != nullptr) {
    MembershipToProto(*membership, first.mutable_membership());
  }
  if (loss_scaler_ != nullptr) {
    first.mutable_loss_scaler()->set_scale(loss_scaler_->state().scale);
    first.mutable_loss_scaler()->set_growth_tracker(
        loss_scaler_->state().growth_tracker);
  }
  return first;
}

absl::Status PsClient::InitializeAs(
    const std::vector<absl::Span<const float>>& params,
    const ModelState* resume, int64_t generation,
    const WorkerMembership* membership) {
  // Every shard's stream at once: a restore of a large model (an elastic
  // job's move of the state onto new shards) is bound by the copies and
  // the network, which the shards share out.
  return ForEachShard([&](int s) {
    return InitializeShard(s, params, resume, generation, membership);
  });
}

absl::Status PsClient::ForEachShard(
    const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> statuses(num_shards());
  std::vector<std::thread> threads;
  for (int s = 1; s < num_shards(); ++s) {
    threads.emplace_back([&, s] { statuses[s] = fn(s); });
  }
  statuses[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status PsClient::InitializeShard(
    int s, const std::vector<absl::Span<const float>>& params,
    const ModelState* resume, int64_t generation,
    const WorkerMembership* membership) {
  grpc::ClientContext context;
  SetDeadline(&context, options_.rpc_timeout);
  // The job's first Init (generation 0): the shard has registered, but a
  // first connection may still fail once (a refused or reset handshake on
  // a loaded host): gRPC retries it until the deadline instead of failing
  // the job at its start. A restore (a higher generation) fails fast, so
  // that its recovery asks the coordinator for a restarted shard's
  // address again.
  context.set_wait_for_ready(generation == 0);
  InitResponse response;
  auto writer = stubs_[s]->Init(&context, &response);
  bool ok = writer->Write(FirstInitRequest(generation, membership));
  for (const ChunkSpec& c : shard_chunks_[s]) {
    if (!ok) break;
    InitRequest request;
    SetHeader(request.mutable_header());
    const int64_t version =
        resume == nullptr
            ? 0
            : resume->VersionOf(c.param_id, c.offset, c.num_elements);
    EncodeFloatChunk(c.param_id, c.chunk_index, version,
                     params[c.param_id].subspan(c.offset, c.num_elements),
                     request.mutable_chunk());
    if (resume != nullptr && !resume->m[c.param_id].empty()) {
      EncodeFloatChunk(c.param_id, c.chunk_index, version,
                       absl::MakeConstSpan(resume->m[c.param_id])
                           .subspan(c.offset, c.num_elements),
                       request.mutable_adam_m());
      EncodeFloatChunk(c.param_id, c.chunk_index, version,
                       absl::MakeConstSpan(resume->v[c.param_id])
                           .subspan(c.offset, c.num_elements),
                       request.mutable_adam_v());
    }
    ok = writer->Write(request);
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return ShardError(s, status);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::WithPartition(
    int64_t partition_bytes, TopKCompressor* compressor) const {
  ASSIGN_OR_RETURN(
      PartitionPlan plan,
      PartitionPlan::Create(plan_.param_num_elements(), partition_bytes,
                            plan_.num_shards(), plan_.num_buffers(),
                            plan_.param_row_elements()));
  PsClientOptions options = options_;
  options.addresses = addresses_;
  if (compressor != nullptr) options.compressor = compressor;
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, Create(options, plan));
  client->generation_ = generation_;
  client->loss_scaler_ = loss_scaler_;
  return client;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::WithShards(
    const std::vector<std::string>& addresses) const {
  if (addresses.empty() ||
      static_cast<int>(addresses.size()) > PartitionPlan::kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat(addresses.size(), " PS addresses; expected 1 to ",
                     PartitionPlan::kMaxShards));
  }
  ASSIGN_OR_RETURN(
      PartitionPlan plan,
      PartitionPlan::Create(plan_.param_num_elements(), plan_.partition_bytes(),
                            static_cast<int>(addresses.size()),
                            plan_.num_buffers(), plan_.param_row_elements()));
  PsClientOptions options = options_;
  options.addresses = addresses;
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, Create(options, plan));
  client->generation_ = generation_;
  client->membership_ = membership_;
  client->joining_ = joining_;
  client->loss_scaler_ = loss_scaler_;
  return client;
}

absl::StatusOr<ModelState> PsClient::ExportState(absl::Duration timeout,
                                                 bool one_version) {
  ASSIGN_OR_RETURN(const int64_t highest, HighestGeneration(timeout));
  const int64_t generation = highest + 1;
  // Every shard's export at once (as InitializeAs()), each chunk decoded
  // straight into its place in the whole tensors (the shards' threads
  // write disjoint ranges and chunk slots).
  ModelState state;
  const std::vector<int64_t>& sizes = plan_.param_num_elements();
  state.weights.resize(sizes.size());
  state.m.resize(sizes.size());
  state.v.resize(sizes.size());
  state.versions.resize(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    state.weights[t].resize(sizes[t]);
    if (!plan_.is_buffer(static_cast<int32_t>(t))) {
      state.m[t].resize(sizes[t]);
      state.v[t].resize(sizes[t]);
    }
  }
  std::vector<int64_t> chunk_versions(plan_.chunks().size(), -1);
  RETURN_IF_ERROR(ForEachShard([&](int s) {
    return ExportShard(s, generation, timeout, &state, &chunk_versions);
  }));
  // Every chunk once (ExportShard() refused a second), and (one_version,
  // sync) one version throughout.
  int64_t version = -1;
  for (size_t i = 0; i < plan_.chunks().size(); ++i) {
    const ChunkSpec& c = plan_.chunks()[i];
    if (chunk_versions[i] < 0) {
      return absl::DataLossError(absl::StrCat(
          "shard ", c.shard, " (", addresses_[c.shard],
          ") did not export chunk (", c.param_id, ", ", c.chunk_index, ")"));
    }
    if (one_version && version >= 0 && chunk_versions[i] != version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", c.shard, " (", addresses_[c.shard], ") is at version ",
          chunk_versions[i], " and another chunk at ", version,
          ": the shards cannot move to a new layout at one step"));
    }
    version = chunk_versions[i];
    state.versions[c.param_id].push_back(
        {c.offset, c.num_elements, chunk_versions[i]});
  }
  for (std::vector<ModelState::Range>& ranges : state.versions) {
    std::sort(ranges.begin(), ranges.end(),
              [](const ModelState::Range& a, const ModelState::Range& b) {
                return a.offset < b.offset;
              });
  }
  generation_ = generation;
  return state;
}

absl::Status PsClient::ExportShard(int s, int64_t generation,
                                   absl::Duration timeout, ModelState* state,
                                   std::vector<int64_t>* chunk_versions) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  ExportRequest request;
  SetHeader(request.mutable_header());
  request.set_generation(generation);
  auto reader = stubs_[s]->Export(&context, request);
  ExportResponse response;
  absl::Status bad;
  const std::string shard = absl::StrCat("shard ", s, " (", addresses_[s], ")");
  while (bad.ok() && reader->Read(&response)) {
    const ChunkKey& key = response.chunk().key();
    const int global = plan_.FindChunk(key.param_id(), key.chunk_index());
    if (global < 0 || plan_.chunks()[global].shard != s) {
      bad = absl::DataLossError(
          absl::StrCat(shard, " exported chunk (", key.param_id(), ", ",
                       key.chunk_index(), "), which is not its own"));
      break;
    }
    if ((*chunk_versions)[global] >= 0) {
      bad = absl::DataLossError(absl::StrCat(shard, " exported chunk (",
                                             key.param_id(), ", ",
                                             key.chunk_index(), ") twice"));
      break;
    }
    const ChunkSpec& c = plan_.chunks()[global];
    auto into = [&](std::vector<float>& tensor) {
      return absl::MakeSpan(tensor).subspan(c.offset, c.num_elements);
    };
    // DecodeFloatChunkInto refuses a size other than the plan's.
    bad = DecodeFloatChunkInto(response.chunk(),
                               into(state->weights[c.param_id]));
    if (bad.ok() && !plan_.is_buffer(c.param_id)) {
      bad = DecodeFloatChunkInto(response.adam_m(), into(state->m[c.param_id]));
      if (bad.ok()) {
        bad =
            DecodeFloatChunkInto(response.adam_v(), into(state->v[c.param_id]));
      }
    }
    if (bad.ok() && response.chunk().version() < 0) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("chunk (", key.param_id(), ", ", key.chunk_index(),
                       ") at version ", response.chunk().version()));
    }
    if (!bad.ok()) {
      bad = absl::DataLossError(absl::StrCat(shard, ": ", bad.message()));
      break;
    }
    (*chunk_versions)[global] = response.chunk().version();
  }
  if (!bad.ok()) {
    context.TryCancel();
    reader->Finish().ok();
    return bad;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return ShardError(s, status);
  return absl::OkStatus();
}

absl::Status PsClient::WaitReady(absl::Duration timeout, int64_t min_generation,
                                 bool wait_for_connection,
                                 int64_t* shards_partition_bytes) {
  const absl::Time deadline = absl::Now() + timeout;
  int64_t generation = min_generation;
  int64_t partition_bytes = plan_.partition_bytes();
  std::optional<LossScaler::State> scaler;  // shard 0's
  // Until every shard answers at the same generation (a shard already
  // restored further raises the bar for the others).
  for (int s = 0; s < num_shards();) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    // At a job's start the shard may still be starting.
    context.set_wait_for_ready(wait_for_connection);
    WaitReadyRequest request;
    SetHeader(request.mutable_header());
    request.set_min_generation(generation);
    request.set_until_member(joining_);
    WaitReadyResponse response;
    const grpc::Status status =
        stubs_[s]->WaitReady(&context, request, &response);
    if (!status.ok()) return ShardError(s, status);
    const std::vector<int64_t> sizes(
        response.layout().param_num_elements().begin(),
        response.layout().param_num_elements().end());
    if (response.generation() > generation) {
      generation = response.generation();
      s = 0;
      continue;
    }
    // Shards of one generation share a partition (--partition_bytes=auto:
    // shard 0's is the one this client adopts).
    if (shards_partition_bytes != nullptr && s == 0) {
      partition_bytes = response.layout().partition_bytes();
    }
    if (s == 0 && response.has_membership()) {
      // Every shard of a generation has its membership (worker 0 sends
      // it to each).
      absl::StatusOr<WorkerMembership> m =
          MembershipFromProto(response.membership(), kMaxMembershipWorkers);
      if (!m.ok()) return ShardError(s, ToGrpcStatus(m.status()));
      membership_ = *std::move(m);
    }
    if (s == 0) {
      scaler.reset();
      if (response.has_loss_scaler()) {
        const LossScalerState& sent = response.loss_scaler();
        scaler = LossScaler::State{sent.scale(), sent.growth_tracker()};
        if (!scaler->valid()) {
          return absl::DataLossError(absl::StrCat(
              "shard 0 (", addresses_[0], ") sent a loss scale of ",
              sent.scale(), " with growth tracker ", sent.growth_tracker()));
        }
      }
    }
    if (response.layout().num_shards() != 0 &&
        response.layout().num_shards() != plan_.num_shards()) {
      // An elastic job whose worker 0 moved the state onto another number
      // of shards: the caller asks the coordinator for their addresses
      // again (worker/recovery.h retries UNAVAILABLE).
      return absl::UnavailableError(
          absl::StrCat("shard ", s, " (", addresses_[s], ") is one of ",
                       response.layout().num_shards(),
                       " shards now; this worker knew ", plan_.num_shards()));
    }
    if (sizes != plan_.param_num_elements() ||
        response.layout().partition_bytes() != partition_bytes ||
        response.layout().num_buffers() != plan_.num_buffers() ||
        !std::equal(response.layout().param_row_elements().begin(),
                    response.layout().param_row_elements().end(),
                    plan_.param_row_elements().begin(),
                    plan_.param_row_elements().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " (", addresses_[s],
          ") was initialised with a different model layout (", sizes.size(),
          " tensors, chunks of ", response.layout().partition_bytes(),
          " bytes) than this worker's (", plan_.param_num_elements().size(),
          " tensors, chunks of ", partition_bytes, " bytes)"));
    }
    ++s;
  }
  generation_ = generation;
  if (shards_partition_bytes != nullptr) {
    *shards_partition_bytes = partition_bytes;
  }
  if (loss_scaler_ != nullptr && scaler.has_value()) {
    loss_scaler_->Restore(*scaler);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointResponse>> PsClient::Checkpoint(
    int64_t step, int64_t end_step, bool wait) {
  std::vector<CheckpointResponse> responses(num_shards());
  // Backup workers: shard 0 picks the cut and holds its admissions until
  // the others have registered it (proto/ps.proto pick_step).
  const bool pick = options_.backup_workers && !wait;
  auto call = [&](int s, bool pick_step, bool release) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    CheckpointRequest request;
    SetHeader(request.mutable_header());
    request.set_step(step);
    request.set_wait(wait);
    request.set_pick_step(pick_step);
    if (pick_step) request.set_end_step(std::max<int64_t>(0, end_step));
    request.set_release(release);
    CheckpointResponse released;
    const grpc::Status status = stubs_[s]->Checkpoint(
        &context, request, release ? &released : &responses[s]);
    return status.ok() ? absl::OkStatus() : ShardError(s, status);
  };
  for (int s = 0; s < num_shards(); ++s) {
    absl::Status status = call(s, pick && s == 0, false);
    if (pick && s == 0 && status.ok()) step = responses[0].step();
    if (!status.ok()) {
      if (pick && s > 0) call(0, false, true).IgnoreError();
      return status;
    }
  }
  if (pick) RETURN_IF_ERROR(call(0, false, true));
  return responses;
}

absl::StatusOr<int64_t> PsClient::HoldAndSettle(int64_t step,
                                                absl::Duration timeout) {
  if (!options_.backup_workers) {
    return absl::FailedPreconditionError(
        "a hold of shard 0's admissions: backup workers only");
  }
  const absl::Time deadline = absl::Now() + timeout;
  int64_t cut = 0;
  {
    grpc::ClientContext context;
    SetDeadline(&context, std::min(timeout, options_.rpc_timeout));
    CheckpointRequest request;
    SetHeader(request.mutable_header());
    request.set_step(step);
    request.set_pick_step(true);
    request.set_hold_only(true);
    CheckpointResponse response;
    const grpc::Status status =
        stubs_[0]->Checkpoint(&context, request, &response);
    if (!status.ok()) return ShardError(0, status);
    cut = response.step();
  }
  // The admitted ends of the steps before the cut reach every shard; no
  // shard can decide the cut while shard 0 holds it.
  for (int s = 0; s < num_shards(); ++s) {
    while (true) {
      ASSIGN_OR_RETURN(const StatsResponse response,
                       Stats(s, std::min(timeout, options_.rpc_timeout)));
      if (response.decided_step() >= cut - 1) break;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard ", s, " decided step ", response.decided_step(), " and not ",
            cut - 1, " within ", absl::FormatDuration(timeout),
            " of shard 0's hold of step ", cut));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  return cut;
}

}  // namespace pstrain
