// PsClient's calls on the shards' state rather than on a step: install
// it (Initialize, InitializeAs), find and raise the generation after a
// failure (HighestGeneration, Restore, Reopen), wait for it (WaitReady),
// and checkpoint it (Checkpoint); see worker/ps_client.h.
#include <algorithm>
#include <atomic>
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
#include "common/trace.h"
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

absl::Status PsClient::PlanReopen(int64_t version,
                                  const WorkerMembership& membership,
                                  absl::Duration timeout) {
  for (int s = 0; s < num_shards(); ++s) {
    if (plan_.ChunksOfShard(s).empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", s,
                       " owns no chunk of the model, so it decides no step "
                       "at which a planned membership change could be taken"));
    }
  }
  return ForEachShard([&](int s) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    InitResponse response;
    auto writer = stubs_[s]->Init(&context, &response);
    InitRequest first = FirstInitRequest(generation_ + 1, &membership);
    first.set_reopen(true);
    first.set_reopen_at_decision(true);
    first.set_reopen_version(version);
    first.clear_loss_scaler();  // the shards keep theirs
    writer->Write(first);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (!status.ok()) return ShardError(s, status);
    return absl::OkStatus();
  });
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
  first.set_lr_total_steps(options_.lr_total_steps);
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
  trace::Scope traced("init shard", "elastic",
                      {{"shard", s}, {"generation", generation}});
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

absl::StatusOr<int64_t> PsClient::MoveStateTo(
    PsClient& next, int64_t version, const WorkerMembership* membership,
    absl::Duration timeout) {
  ASSIGN_OR_RETURN(const int64_t old_highest, HighestGeneration(timeout));
  ASSIGN_OR_RETURN(const int64_t new_highest, next.HighestGeneration(timeout));
  const int64_t export_generation = std::max(old_highest, new_highest) + 1;
  const int64_t generation = export_generation + 1;
  // One Init stream per new shard; the export threads write to it in turn.
  struct Sink {
    grpc::ClientContext context;
    InitResponse response;
    std::unique_ptr<grpc::ClientWriter<InitRequest>> writer;
    absl::Mutex mu;
    bool open ABSL_GUARDED_BY(mu) = true;
  };
  std::vector<std::unique_ptr<Sink>> sinks;
  for (int s = 0; s < next.num_shards(); ++s) {
    auto sink = std::make_unique<Sink>();
    SetDeadline(&sink->context, timeout);
    sink->writer = next.stubs_[s]->Init(&sink->context, &sink->response);
    absl::MutexLock lock(&sink->mu);
    sink->open =
        sink->writer->Write(next.FirstInitRequest(generation, membership));
    sinks.push_back(std::move(sink));
  }
  // A new shard whose stream broke: its Finish() below says why.
  std::atomic<int> broken{-1};
  auto forward = [&](int s, InitRequest& request) {
    Sink& sink = *sinks[s];
    absl::MutexLock lock(&sink.mu);
    if (sink.open) sink.open = sink.writer->Write(request);
    if (sink.open) return absl::OkStatus();
    int none = -1;
    broken.compare_exchange_strong(none, s);
    return absl::UnavailableError(absl::StrCat("the init stream to new shard ",
                                               s, " (", next.addresses_[s],
                                               ") broke"));
  };
  std::vector<int64_t> chunk_versions(plan_.chunks().size(), -1);
  absl::Status moved = ForEachShard([&](int s) {
    return ForwardShard(s, export_generation, version, timeout, next, forward,
                        &chunk_versions);
  });
  for (size_t i = 0; moved.ok() && i < plan_.chunks().size(); ++i) {
    const ChunkSpec& c = plan_.chunks()[i];
    if (chunk_versions[i] < 0) {
      moved = absl::DataLossError(absl::StrCat(
          "shard ", c.shard, " (", addresses_[c.shard],
          ") did not export chunk (", c.param_id, ", ", c.chunk_index, ")"));
    }
  }
  generation_ = export_generation;
  // Every export is read out: the new shards may apply their chunks now
  // (after an error every Init is cancelled, so that no shard applies a
  // part). The first new shard's error, or the one whose stream broke.
  absl::Status restored;
  for (int s = 0; s < next.num_shards(); ++s) {
    Sink& sink = *sinks[s];
    if (!moved.ok() && s != broken.load()) sink.context.TryCancel();
    sink.writer->WritesDone();
    const grpc::Status status = sink.writer->Finish();
    if ((moved.ok() || s == broken.load()) && restored.ok() && !status.ok()) {
      restored = next.ShardError(s, status);
    }
  }
  if (!restored.ok()) return restored;
  if (!moved.ok()) return moved;
  next.generation_ = generation;
  return generation;
}

absl::Status PsClient::ForwardShard(
    int s, int64_t generation, int64_t version, absl::Duration timeout,
    const PsClient& next,
    const std::function<absl::Status(int, InitRequest&)>& sink,
    std::vector<int64_t>* chunk_versions) {
  trace::Scope traced("export shard", "elastic",
                      {{"shard", s}, {"generation", generation}});
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  ExportRequest request;
  SetHeader(request.mutable_header());
  request.set_generation(generation);
  auto reader = stubs_[s]->Export(&context, request);
  ExportResponse response;
  InitRequest forwarded;
  next.SetHeader(forwarded.mutable_header());
  absl::Status bad;
  const std::string shard = absl::StrCat("shard ", s, " (", addresses_[s], ")");
  while (bad.ok() && reader->Read(&response)) {
    const ChunkKey& key = response.chunk().key();
    const std::string chunk =
        absl::StrCat("chunk (", key.param_id(), ", ", key.chunk_index(), ")");
    const int global = plan_.FindChunk(key.param_id(), key.chunk_index());
    if (global < 0 || plan_.chunks()[global].shard != s) {
      bad = absl::DataLossError(
          absl::StrCat(shard, " exported ", chunk, ", which is not its own"));
      break;
    }
    if ((*chunk_versions)[global] >= 0) {
      bad = absl::DataLossError(
          absl::StrCat(shard, " exported ", chunk, " twice"));
      break;
    }
    const ChunkSpec& c = plan_.chunks()[global];
    bad = CheckFloatChunk(response.chunk(), c.num_elements);
    if (bad.ok() && !plan_.is_buffer(c.param_id)) {
      bad = CheckFloatChunk(response.adam_m(), c.num_elements);
      if (bad.ok()) bad = CheckFloatChunk(response.adam_v(), c.num_elements);
    }
    const int64_t at = response.chunk().version();
    if (bad.ok() && at < 0) {
      bad = absl::InvalidArgumentError(absl::StrCat(chunk, " at version ", at));
    }
    if (!bad.ok()) {
      bad = absl::DataLossError(absl::StrCat(shard, ": ", bad.message()));
      break;
    }
    if (version >= 0 && at != version) {
      bad = absl::FailedPreconditionError(
          absl::StrCat(shard, " exported ", chunk, " at version ", at,
                       " but the shards settled at ", version,
                       ": they cannot move to a new layout at one step"));
      break;
    }
    (*chunk_versions)[global] = at;
    // The export's buffers go on as they came (no copy on this worker).
    forwarded.mutable_chunk()->Swap(response.mutable_chunk());
    forwarded.clear_adam_m();
    forwarded.clear_adam_v();
    if (!plan_.is_buffer(c.param_id)) {
      forwarded.mutable_adam_m()->Swap(response.mutable_adam_m());
      forwarded.mutable_adam_v()->Swap(response.mutable_adam_v());
    }
    // The same chunk in `next`'s plan (chunks do not depend on the number
    // of shards), owned by another shard maybe.
    const int in_next = next.plan_.FindChunk(key.param_id(), key.chunk_index());
    if (in_next < 0) {
      bad = absl::InternalError(absl::StrCat(chunk, " is in no new shard"));
      break;
    }
    bad = sink(next.plan_.chunks()[in_next].shard, forwarded);
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
    int64_t step, int64_t end_step, int64_t latest_step, bool wait) {
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
    if (!wait && latest_step >= 0) request.set_latest_step(latest_step);
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
