#include "server/ps_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_message.h"
#include "common/membership.h"
#include "common/partition.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "common/trace.h"
#include "server/push_pull_session.h"
#include "server/shard_checkpoint.h"

namespace pstrain {
namespace {

// The shard count a layout names (ModelLayout.num_shards; 0: the shard's
// configured count), which must hold `options`' shard, after the bound on
// its row widths (none, or one per tensor: the plan checks each; the count
// is bounded here, before the copy): INVALID_ARGUMENT otherwise.
absl::StatusOr<int> LayoutShards(const ModelLayout& layout,
                                 const ShardOptions& options) {
  if (layout.param_row_elements_size() > layout.param_num_elements_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout has ", layout.param_row_elements_size(),
                     " row widths for ", layout.param_num_elements_size(),
                     " tensors; expected one per tensor or none"));
  }
  const int num_shards =
      layout.num_shards() != 0 ? layout.num_shards() : options.num_shards;
  if (num_shards <= options.shard_index ||
      num_shards > PartitionPlan::kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout has ", num_shards, " shards; shard ",
                     options.shard_index, " expected ", options.shard_index + 1,
                     " to ", PartitionPlan::kMaxShards));
  }
  return num_shards;
}

// Init's chunks after its first message, each checked against `plan` as
// it arrives, before its bytes are decoded (owned by `shard_index`, once,
// of the plan's size), so what Init holds is bounded by this shard's part
// of the layout; `elements` counts their weights. INVALID_ARGUMENT
// naming the chunk otherwise.
grpc::Status ReadInitChunks(grpc::ServerReader<InitRequest>* reader,
                            const PartitionPlan& plan, int shard_index,
                            std::vector<InitChunk>* chunks, int64_t* elements) {
  InitRequest request;
  std::vector<bool> seen(plan.chunks().size(), false);
  while (reader->Read(&request)) {
    InitChunk chunk;
    chunk.param_id = request.chunk().key().param_id();
    chunk.chunk_index = request.chunk().key().chunk_index();
    const int global = plan.FindChunk(chunk.param_id, chunk.chunk_index);
    if (global < 0 || plan.chunks()[global].shard != shard_index) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("init chunk (", chunk.param_id, ", ", chunk.chunk_index,
                       ") is not owned by shard ", shard_index,
                       " in the layout sent"));
    }
    if (seen[global]) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("init chunk (", chunk.param_id, ", ",
                                       chunk.chunk_index, ") sent twice"));
    }
    seen[global] = true;
    const int64_t expected = plan.chunks()[global].num_elements;
    for (const TensorChunk* part :
         {&request.chunk(), request.has_adam_m() ? &request.adam_m() : nullptr,
          request.has_adam_v() ? &request.adam_v() : nullptr}) {
      if (part != nullptr && part->num_elements() != expected) {
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("init chunk (", chunk.param_id, ", ",
                         chunk.chunk_index, ") has ", part->num_elements(),
                         " elements; the layout says ", expected));
      }
    }
    absl::Status status = DecodeFloatChunk(request.chunk(), &chunk.values);
    if (!status.ok()) return ToGrpcStatus(status);
    chunk.version = request.chunk().version();
    if (request.has_adam_m())
      status = DecodeFloatChunk(request.adam_m(), &chunk.m);
    if (status.ok() && request.has_adam_v()) {
      status = DecodeFloatChunk(request.adam_v(), &chunk.v);
    }
    if (!status.ok()) return ToGrpcStatus(status);
    *elements += static_cast<int64_t>(chunk.values.size());
    chunks->push_back(std::move(chunk));
  }
  return grpc::Status::OK;
}

}  // namespace

PsService::PsService(ParameterShard* shard, absl::Duration pull_timeout,
                     bool authorize, absl::Duration write_timeout)
    : shard_(shard),
      pull_timeout_(pull_timeout),
      write_timeout_(write_timeout),
      authorizer_(authorize),
      last_request_unix_ms_(absl::ToUnixMillis(absl::Now())),
      done_(shard->options().num_workers, false),
      steps_ended_(shard->options().num_workers, -1),
      removed_(shard->options().num_workers, false) {
  // PushPull moves grpc::ByteBuffers (common/chunk_message.h), not protobuf
  // messages: its handler is replaced by one of ByteBuffer type, the way
  // gRPC's generated code registers handlers. 2 is PushPull's index in
  // proto/ps.proto's service.
  MarkMethodStreamed(
      2,
      new grpc::internal::BidiStreamingHandler<PsService, grpc::ByteBuffer,
                                               grpc::ByteBuffer>(
          [](PsService* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*
                 stream) { return service->PushPullStream(context, stream); },
          this));
  watchdog_ = std::thread([this] { WatchWrites(); });
}

void PsService::WatchWrites() {
  absl::MutexLock lock(&watch_mu_);
  while (true) {
    // A CondVar, not Await(Condition): absl::Mutex evaluates an Await
    // condition on whichever thread unlocks watch_mu_ (a gRPC thread adding
    // its stream), and a condition object on this stack, rebuilt each turn,
    // was a data race to TSan (the uninstrumented Abseil hides the order).
    if (!stopping_) watch_cv_.WaitWithTimeout(&watch_mu_, absl::Seconds(1));
    if (stopping_) return;
    const int64_t now = absl::ToUnixMillis(absl::Now());
    const int64_t limit = absl::ToInt64Milliseconds(write_timeout_);
    for (WriteWatch* watch : watches_) {
      const int64_t since = watch->since_ms.load();
      if (since != 0 && now - since > limit) watch->context->TryCancel();
    }
  }
}

PsService::~PsService() {
  {
    absl::MutexLock lock(&watch_mu_);
    stopping_ = true;
    watch_cv_.Signal();
  }
  watchdog_.join();
  // A writer still waiting for a deferred cut gives up; no chunk copies
  // itself into snapshot_ once it is gone.
  Close();
  std::thread writer;
  {
    absl::MutexLock lock(&checkpoint_mu_);
    writer = std::move(checkpoint_writer_);
  }
  if (writer.joinable()) writer.join();
  if (deferred_snapshot()) shard_->CancelDeferredSnapshot();
}

grpc::Status PsService::Checkpoint(grpc::ServerContext* context,
                                   const CheckpointRequest* request,
                                   CheckpointResponse* response) {
  Touch();
  if (grpc::Status denied =
          Authorize(*context, "Checkpoint", request->header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  if (closing_.load()) return ClosingStatus();
  EnterLayout();
  absl::Cleanup left = [this] { LeaveLayout(); };
  if (request->header().worker_id() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "only worker 0 asks for checkpoints");
  }
  if (request->release()) {
    shard_->ReleaseCheckpointHold();
    return grpc::Status::OK;
  }
  if (request->hold_only()) {
    if (!request->pick_step()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "checkpoint hold_only without pick_step: a hold is "
                          "of the step shard 0 picks");
    }
    absl::StatusOr<int64_t> cut =
        shard_->HoldFirstUndecidedStep(request->step(), absl::Seconds(10));
    if (!cut.ok()) return ToGrpcStatus(cut.status());
    response->set_step(*cut);
    return grpc::Status::OK;
  }
  const int shard_index = shard_->options().shard_index;
  int64_t step = request->step();
  // Every wait below ends before the caller's deadline (so that it reads
  // this answer, not its own DEADLINE_EXCEEDED) and within the pull
  // timeout, a call without a deadline included.
  const absl::Time deadline = CheckpointWaitDeadline(*context);
  absl::MutexLock lock(&checkpoint_mu_);
  if (request->wait()) return AwaitCheckpointLocked(step, deadline, response);
  if (request->end_step() < 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("checkpoint end_step ", request->end_step(),
                     ": expected the job's number of steps (>= 0)"));
  }
  // One write at a time: the one in flight finishes first (before shard 0
  // holds any admissions for this one).
  if (grpc::Status busy = JoinCheckpointWriterLocked(deadline); !busy.ok()) {
    return busy;
  }
  if (request->pick_step()) {
    // Backup workers: the cut is shard 0's to pick (its admissions), held
    // while worker 0 registers it on the other shards.
    absl::StatusOr<int64_t> cut = shard_->HoldCheckpointStep(
        step, request->end_step(), absl::Seconds(10));
    if (!cut.ok()) return ToGrpcStatus(cut.status());
    step = *cut;
  }
  absl::Cleanup release = [this, pick = request->pick_step()] {
    if (pick) shard_->ReleaseCheckpointHold();
  };
  response->set_step(step);
  // The request is checked before anything is made on the shard's host:
  // the step folder is made only for a cut that will be written. The
  // file's path comes from the shard's own configuration; the request
  // names only the step (server/shard_checkpoint.h).
  const ShardOptions& o = shard_->options();
  status = CheckShardCheckpointPath(o.checkpoint_dir, step, o.shard_index);
  if (!status.ok()) return ToGrpcStatus(status);
  // Within a generation worker 0's steps only grow: a step behind the
  // last cut begun would rewrite an older checkpoint's file.
  if (const int64_t begun = AnnouncedCheckpointStep(); step < begun) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("shard ", shard_index, " began a checkpoint of step ",
                     begun, " in generation ", shard_->generation(),
                     " already; a checkpoint of step ", step, " is behind it"));
  }
  if (snapshot_ == nullptr) {
    snapshot_ = std::make_shared<std::vector<ChunkSnapshot>>();
  }
  // Bounded staleness or backup workers (StepPolicy::checkpoint_cut()):
  // the chunks reach the step at different times, so each copies itself
  // when it gets there (ParameterShard::BeginDeferredSnapshot) and the
  // writer waits for the last; else every chunk is at the step now.
  status = deferred_snapshot()
               ? shard_->BeginDeferredSnapshot(step, snapshot_.get())
               : shard_->SnapshotInto(step, snapshot_.get());
  if (!status.ok()) return ToGrpcStatus(status);
  absl::StatusOr<std::string> path =
      ShardCheckpointPath(o.checkpoint_dir, step, o.shard_index);
  if (!path.ok()) {
    if (deferred_snapshot()) shard_->CancelDeferredSnapshot();
    return ToGrpcStatus(path.status());
  }
  std::move(release).Cancel();
  checkpoint_step_ = step;
  AnnounceCheckpointStep(step);
  checkpoint_done_ = false;
  checkpoint_status_ = absl::OkStatus();
  checkpoint_result_.Clear();
  // The layout's shard count (an elastic job's may change after).
  const int num_shards = shard_->plan().num_shards();
  // A deferred cut that does not come within a pull timeout for each step
  // the slowest worker may still have to end before it (staleness s: s + 1;
  // a worker that stopped short of it would have failed a pull by then) is
  // given up, and the checkpoint fails with DEADLINE_EXCEEDED.
  const absl::Time cut_deadline =
      absl::Now() + pull_timeout_ * shard_->policy().open_steps();
  const int64_t latest_step =
      request->has_latest_step() ? request->latest_step() : -1;
  checkpoint_writer_ = std::thread([this, step, latest_step, num_shards,
                                    cut_deadline, path = *std::move(path),
                                    chunks = snapshot_]() {
    WriteCheckpoint(step, latest_step, num_shards, cut_deadline, path, *chunks);
  });
  return grpc::Status::OK;
}

grpc::Status PsService::AwaitCheckpointLocked(int64_t step, absl::Time deadline,
                                              CheckpointResponse* response) {
  const int shard_index = shard_->options().shard_index;
  if (step != checkpoint_step_) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("shard ", shard_index, " began no checkpoint of step ",
                     step, " (the last begun: ", checkpoint_step_, ")"));
  }
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) {
    return checkpoint_done_ || closing_.load();
  };
  checkpoint_mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!checkpoint_done_) {
    if (closing_.load()) return ClosingStatus();
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("shard ", shard_index, ": checkpoint of step ", step,
                     " is still being written"));
  }
  if (!checkpoint_status_.ok()) return ToGrpcStatus(checkpoint_status_);
  *response = checkpoint_result_;
  return grpc::Status::OK;
}

void PsService::WriteCheckpoint(int64_t step, int64_t latest_step,
                                int num_shards, absl::Time cut_deadline,
                                const std::string& path,
                                const std::vector<ChunkSnapshot>& chunks) {
  const ShardOptions& o = shard_->options();
  // The file's contents are fsynced; its folder is the caller's to fsync,
  // once for every file of the checkpoint (proto/ps.proto).
  safetensors::WriteOptions in_folder;
  in_folder.sync_folder = false;
  const absl::Status cut =
      deferred_snapshot()
          ? shard_->AwaitDeferredSnapshot(step, cut_deadline, &closing_)
          : absl::OkStatus();
  // Before the write, as worker 0 removes its own (so the disk holds at
  // most keep + 1 files of the shard's state even while it writes): a
  // stolen worker 0 key can ask for a file a step, but the shard keeps
  // keep + 1 of them, whatever `latest_step` says. What it cannot remove
  // fails nothing and is left to the next write.
  if (cut.ok()) {
    RemoveOldShardCheckpoints(o.checkpoint_dir, o.shard_index, step,
                              latest_step, o.keep_checkpoints)
        .IgnoreError();
  }
  absl::StatusOr<safetensors::WriteResult> written =
      cut.ok() ? WriteShardCheckpoint(path, chunks, o.shard_index, num_shards,
                                      step, in_folder)
               : absl::StatusOr<safetensors::WriteResult>(cut);
  CheckpointResponse result;
  int64_t min_version = INT64_MAX, max_version = 0;
  for (const ChunkSnapshot& c : chunks) {
    min_version = std::min(min_version, c.version);
    max_version = std::max(max_version, c.version);
  }
  result.set_step(step);
  result.set_num_chunks(static_cast<int64_t>(chunks.size()));
  result.set_min_version(chunks.empty() ? 0 : min_version);
  result.set_max_version(max_version);
  if (written.ok()) {
    result.set_size_bytes(static_cast<int64_t>(written->size_bytes));
    result.set_crc32(written->crc32);
  }
  absl::MutexLock lock(&checkpoint_mu_);
  checkpoint_status_ = written.status();
  checkpoint_result_ = result;
  checkpoint_done_ = true;
}

absl::Time PsService::CheckpointWaitDeadline(
    const grpc::ServerContext& context) const {
  const absl::Time now = absl::Now();
  absl::Time deadline = now + pull_timeout_;
  const auto theirs = context.deadline();
  if (theirs != std::chrono::system_clock::time_point::max()) {
    const absl::Time end = absl::FromChrono(theirs);
    const absl::Duration margin = std::min(
        absl::Seconds(1), std::max(absl::ZeroDuration(), end - now) / 10);
    deadline = std::min(deadline, end - margin);
  }
  return deadline;
}

grpc::Status PsService::JoinCheckpointWriterLocked(absl::Time deadline) {
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) {
    return checkpoint_done_ || closing_.load();
  };
  // A concurrent call may start another write while this one joins, hence
  // the loop; each thread is joined by the one call that moved it out.
  while (checkpoint_writer_.joinable() && !closing_.load()) {
    if (!checkpoint_mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("shard ", shard_->options().shard_index,
                       ": checkpoint of step ", checkpoint_step_,
                       " is still being written (a deferred cut waits at "
                       "most the pull timeout, ",
                       absl::FormatDuration(pull_timeout_),
                       ", for its chunks); ask again once it is done"));
    }
    if (closing_.load() || !checkpoint_writer_.joinable()) continue;
    std::thread finished = std::move(checkpoint_writer_);
    checkpoint_mu_.Unlock();
    finished.join();
    checkpoint_mu_.Lock();
  }
  if (closing_.load()) return ClosingStatus();
  return grpc::Status::OK;
}

grpc::Status PsService::ClosingStatus() const {
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("shard ", shard_->options().shard_index,
                   " is shutting down: it takes no more checkpoints"));
}

void PsService::Close() {
  absl::MutexLock lock(&checkpoint_mu_);
  closing_.store(true);
}

grpc::Status PsService::Authorize(const grpc::ServerContext& context,
                                  const char* method,
                                  const RequestHeader& header) const {
  // The shard's own job, not the request's: a worker of another job is
  // refused whatever it claims.
  RequestClaims claims;
  claims.job = shard_->options().job_id;
  claims.role = TlsRole::kWorker;
  claims.index = header.worker_id();
  return authorizer_.Check(
      context, absl::StrCat("/pstrain.ParameterServer/", method), claims);
}

grpc::Status PsService::AuthorizeCaller(const grpc::ServerContext& context,
                                        const char* method) const {
  return authorizer_.CheckCaller(
      context, absl::StrCat("/pstrain.ParameterServer/", method),
      shard_->options().job_id);
}

void PsService::Touch() {
  last_request_unix_ms_.store(absl::ToUnixMillis(absl::Now()));
}

void PsService::AnnounceCheckpointStep(int64_t step) {
  absl::MutexLock lock(&announce_mu_);
  announced_checkpoint_step_ = step;
  announced_generation_ = shard_->generation();
}

int64_t PsService::AnnouncedCheckpointStep() const {
  absl::MutexLock lock(&announce_mu_);
  return announced_generation_ == shard_->generation()
             ? announced_checkpoint_step_
             : -1;
}

absl::Status PsService::NotePushesSent(int worker, int64_t generation,
                                       int64_t step) {
  absl::MutexLock lock(&pushes_sent_mu_);
  // Steps of older generations will not be ended any more.
  const int64_t current = shard_->generation();
  for (auto it = pushes_sent_.begin(); it != pushes_sent_.end();) {
    it = std::get<0>(it->first) < current ? pushes_sent_.erase(it) : ++it;
  }
  const auto key = std::make_tuple(generation, worker, step);
  if (pushes_sent_.size() >= kMaxPushesSent && !pushes_sent_.count(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("worker ", worker, " said it sent the pushes of step ",
                     step, " on another stream while ", kMaxPushesSent,
                     " such steps wait for their step ends on shard ",
                     shard_->options().shard_index));
  }
  ++pushes_sent_[key];
  return absl::OkStatus();
}

int PsService::TakePushesSent(int worker, int64_t generation, int64_t step,
                              int needed, absl::Time deadline) {
  const auto key = std::make_tuple(generation, worker, step);
  auto arrived = [this, &key, needed]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = pushes_sent_.find(key);
    return it != pushes_sent_.end() && it->second >= needed;
  };
  absl::MutexLock lock(&pushes_sent_mu_);
  pushes_sent_mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline);
  auto it = pushes_sent_.find(key);
  const int count = it == pushes_sent_.end() ? 0 : it->second;
  if (count < needed) return count;
  // This step's and the worker's older ones (of streams that broke).
  it = pushes_sent_.lower_bound(std::make_tuple(generation, worker, INT64_MIN));
  while (it != pushes_sent_.end() && std::get<0>(it->first) == generation &&
         std::get<1>(it->first) == worker && std::get<2>(it->first) <= step) {
    it = pushes_sent_.erase(it);
  }
  return count;
}

absl::Time PsService::last_request_time() const {
  return absl::FromUnixMillis(last_request_unix_ms_.load());
}

PsService::Counters PsService::counters() const {
  Counters c;
  c.bytes_received = bytes_received_.load();
  c.bytes_sent = bytes_sent_.load();
  c.pulls_done = pulls_done_.load();
  c.pull_ns = pull_ns_.load();
  c.pushes_queued = pushes_queued_.load();
  c.pulls_waiting = pulls_waiting_.load();
  return c;
}

grpc::Status PsService::Init(grpc::ServerContext* context,
                             grpc::ServerReader<InitRequest>* reader,
                             InitResponse* response) {
  Touch();
  // Before the first message is read: a layout message can be large.
  if (grpc::Status denied = AuthorizeCaller(*context, "Init"); !denied.ok()) {
    return denied;
  }
  InitRequest request;
  if (!reader->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "init stream carried no message");
  }
  if (grpc::Status denied = Authorize(*context, "Init", request.header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request.header().job_id(),
                                            request.header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  if (request.header().worker_id() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("only worker 0 initialises the shards; "
                                     "got init from worker ",
                                     request.header().worker_id()));
  }
  if (!request.has_layout()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first init message must carry the model layout");
  }
  const std::vector<int64_t> sizes(
      request.layout().param_num_elements().begin(),
      request.layout().param_num_elements().end());
  const int64_t partition_bytes = request.layout().partition_bytes();
  const int num_buffers = request.layout().num_buffers();
  const absl::StatusOr<int> num_shards =
      LayoutShards(request.layout(), shard_->options());
  if (!num_shards.ok()) return ToGrpcStatus(num_shards.status());
  const std::vector<int64_t> row_elements(
      request.layout().param_row_elements().begin(),
      request.layout().param_row_elements().end());
  const int64_t generation = request.generation();
  // An elastic job's membership change rides a reopen or a restore.
  std::optional<WorkerMembership> membership;
  if (request.has_membership()) {
    absl::StatusOr<WorkerMembership> m = MembershipFromProto(
        request.membership(), shard_->options().num_workers);
    if (!m.ok()) return ToGrpcStatus(m.status());
    membership = *std::move(m);
  }
  // fp16's loss scaler at the chunks' version (checked by Initialize).
  std::optional<LossScaler::State> loss_scaler;
  if (request.has_loss_scaler()) {
    loss_scaler = LossScaler::State{request.loss_scaler().scale(),
                                    request.loss_scaler().growth_tracker()};
  }
  // A cosine schedule's horizon where the job left it to worker 0's count:
  // checked now, set only once the rest of the request is, just before
  // the shard's call that opens the new state to pushes (so that no update
  // of it runs with the old horizon), and put back if the shard refuses
  // that call: a refused Init changes nothing.
  const int64_t lr_total_steps = request.lr_total_steps();
  if (absl::Status horizon = shard_->CheckLrHorizon(lr_total_steps);
      !horizon.ok()) {
    return ToGrpcStatus(horizon);
  }
  const bool restore = shard_->initialized() && generation > 0;
  if (restore) restores_in_progress_.fetch_add(1);
  absl::Cleanup restored = [this, restore] {
    if (restore) restores_in_progress_.fetch_sub(1);
  };
  if (request.reopen()) {
    return InitReopen(reader, request, membership, response);
  }
  // Each chunk is checked against the layout's plan as it arrives, before
  // its bytes are decoded, so what Init holds is bounded by this shard's
  // part of the layout (the shard checks the whole set again).
  absl::StatusOr<PartitionPlan> plan = PartitionPlan::Create(
      sizes, partition_bytes, *num_shards, num_buffers, row_elements);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  std::vector<InitChunk> chunks;
  int64_t elements = 0;
  trace::Scope received("init receive", "elastic",
                        {{"generation", generation}});
  if (grpc::Status read = ReadInitChunks(
          reader, *plan, shard_->options().shard_index, &chunks, &elements);
      !read.ok()) {
    return read;
  }
  received.End();
  trace::Scope initialised("init apply", "elastic",
                           {{"generation", generation}});
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  // Another partition: no stream or checkpoint may use the chunks while the
  // shard makes them anew (every worker closes its streams first).
  const bool relayout =
      restore && (partition_bytes != shard_->plan().partition_bytes() ||
                  *num_shards != shard_->plan().num_shards());
  if (relayout) {
    absl::Time deadline = absl::Now() + pull_timeout_;
    if (context->deadline() != std::chrono::system_clock::time_point::max()) {
      deadline = std::min(deadline, absl::FromChrono(context->deadline()));
    }
    status = BeginRelayout(deadline);
    if (!status.ok()) return ToGrpcStatus(status);
  }
  shard_->SetRowSparseLayout(row_elements);
  status = OpenWithLrHorizon(lr_total_steps, [&] {
    return shard_->Initialize(
        sizes, partition_bytes, std::move(chunks), num_buffers, generation,
        membership.has_value() ? &*membership : nullptr, *num_shards,
        loss_scaler.has_value() ? &*loss_scaler : nullptr);
  });
  if (relayout) EndRelayout();
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_num_chunks(num_chunks);
  response->set_num_elements(elements);
  return grpc::Status::OK;
}

absl::Status PsService::OpenWithLrHorizon(
    int64_t lr_total_steps, const std::function<absl::Status()>& open) {
  const int64_t before = shard_->lr_horizon();
  if (absl::Status set = shard_->SetLrHorizon(lr_total_steps); !set.ok()) {
    return set;
  }
  absl::Status opened = open();
  if (!opened.ok()) shard_->RestoreLrHorizon(before);
  return opened;
}

grpc::Status PsService::InitReopen(
    grpc::ServerReader<InitRequest>* reader, const InitRequest& first,
    const std::optional<WorkerMembership>& membership, InitResponse* response) {
  const int64_t generation = first.generation();
  const int64_t reopen_version = first.reopen_version();
  const int64_t lr_total_steps = first.lr_total_steps();
  InitRequest more;
  if (reader->Read(&more)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a reopen carries no chunks (the shard keeps its "
                        "own state)");
  }
  if (first.reopen_at_decision()) {
    if (!membership.has_value()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a change planned at a decision must carry the "
                          "membership it changes to");
    }
    if (absl::Status planned =
            OpenWithLrHorizon(lr_total_steps,
                              [&] {
                                return shard_->PlanReopen(
                                    generation, reopen_version, *membership);
                              });
        !planned.ok()) {
      return ToGrpcStatus(planned);
    }
    response->set_version(reopen_version);
    return grpc::Status::OK;
  }
  absl::StatusOr<int64_t> version = absl::UnknownError("not reopened");
  const absl::Status status = OpenWithLrHorizon(lr_total_steps, [&] {
    version = shard_->Reopen(generation, reopen_version,
                             membership.has_value() ? &*membership : nullptr);
    return version.status();
  });
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_version(*version);
  return grpc::Status::OK;
}

grpc::Status PsService::WaitReady(grpc::ServerContext* context,
                                  const WaitReadyRequest* request,
                                  WaitReadyResponse* response) {
  Touch();
  if (grpc::Status denied = Authorize(*context, "WaitReady", request->header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  // Never wait past the caller's deadline, nor past the pull timeout.
  absl::Time deadline = absl::Now() + pull_timeout_;
  const auto client_deadline = context->deadline();
  if (client_deadline != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(client_deadline));
  }
  status = shard_->WaitReady(
      deadline, request->min_generation(),
      request->until_member() ? request->header().worker_id() : -1);
  if (!status.ok()) return ToGrpcStatus(status);
  EnterLayout();
  absl::Cleanup left = [this] { LeaveLayout(); };
  int64_t generation = 0;
  MembershipToProto(shard_->membership(&generation),
                    response->mutable_membership());
  response->set_generation(generation);
  if (const std::optional<LossScaler::State> scaler =
          shard_->loss_scaler_state()) {
    response->mutable_loss_scaler()->set_scale(scaler->scale);
    response->mutable_loss_scaler()->set_growth_tracker(scaler->growth_tracker);
  }
  for (int64_t n : shard_->plan().param_num_elements()) {
    response->mutable_layout()->add_param_num_elements(n);
  }
  response->mutable_layout()->set_partition_bytes(
      shard_->plan().partition_bytes());
  response->mutable_layout()->set_num_buffers(shard_->plan().num_buffers());
  for (int64_t d : shard_->plan().param_row_elements()) {
    response->mutable_layout()->add_param_row_elements(d);
  }
  response->mutable_layout()->set_num_shards(shard_->plan().num_shards());
  return grpc::Status::OK;
}

grpc::Status PsService::Export(grpc::ServerContext* context,
                               const ExportRequest* request,
                               grpc::ServerWriter<ExportResponse>* writer) {
  Touch();
  if (grpc::Status denied = Authorize(*context, "Export", request->header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  if (request->header().worker_id() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("only worker 0 moves the shards' state; "
                                     "got export from worker ",
                                     request->header().worker_id()));
  }
  // Closed at the new generation: no worker trains on this layout any more
  // (its streams end ABORTED), and the state stays as of the last decided
  // step until worker 0 restores the new layout.
  absl::StatusOr<int64_t> version =
      shard_->Reopen(request->generation(), /*expected_version=*/-1,
                     /*membership=*/nullptr, /*close=*/true);
  if (!version.ok()) return ToGrpcStatus(version.status());
  // Each chunk encoded straight from the shard's state (no snapshot copy:
  // the closed shard's chunks change no more).
  trace::Scope traced("export", "elastic", {{"version", *version}});
  ExportResponse response;
  status =
      shard_->VisitChunks(*version, [&](const ParameterShard::ChunkView& c) {
        response.Clear();
        EncodeFloatChunk(c.spec.param_id, c.spec.chunk_index, c.version,
                         c.weights, response.mutable_chunk());
        if (!c.is_buffer) {
          EncodeFloatChunk(c.spec.param_id, c.spec.chunk_index, c.version, c.m,
                           response.mutable_adam_m());
          EncodeFloatChunk(c.spec.param_id, c.spec.chunk_index, c.version, c.v,
                           response.mutable_adam_v());
        }
        return writer->Write(response);
      });
  if (absl::IsCancelled(status)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the export's caller went away");
  }
  if (!status.ok()) return ToGrpcStatus(status);
  return grpc::Status::OK;
}

// The per-stream work lives in PushPullSession (server/push_pull_session.h).
grpc::Status PsService::PushPullStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  // Before any message is read (a push can be large); each message's
  // header is checked as it arrives (PushPullSession::HandleFirst, Handle).
  if (grpc::Status denied = AuthorizeCaller(*context, "PushPull");
      !denied.ok()) {
    return denied;
  }
  EnterLayout();
  absl::Cleanup left = [this] { LeaveLayout(); };
  PushPullSession session(this, context, stream);
  return session.Run();
}

void PsService::EnterLayout() {
  absl::MutexLock lock(&layout_mu_);
  layout_mu_.Await(absl::Condition(
      +[](bool* relayout) { return !*relayout; }, &relayout_));
  ++layout_uses_;
}

void PsService::LeaveLayout() {
  absl::MutexLock lock(&layout_mu_);
  --layout_uses_;
}

absl::Status PsService::BeginRelayout(absl::Time deadline) {
  absl::MutexLock lock(&layout_mu_);
  layout_mu_.Await(absl::Condition(
      +[](bool* relayout) { return !*relayout; }, &relayout_));
  relayout_ = true;
  auto unused = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(layout_mu_) {
    return layout_uses_ == 0;
  };
  if (!layout_mu_.AwaitWithDeadline(absl::Condition(&unused), deadline)) {
    relayout_ = false;
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard_->options().shard_index,
        " cannot take another partition while ", layout_uses_,
        " worker streams or checkpoint calls are open (every worker closes "
        "its streams before a re-layout)"));
  }
  return absl::OkStatus();
}

void PsService::EndRelayout() {
  absl::MutexLock lock(&layout_mu_);
  relayout_ = false;
}

grpc::Status PsService::Stats(grpc::ServerContext* context,
                              const StatsRequest* request,
                              StatsResponse* response) {
  Touch();
  if (grpc::Status denied = Authorize(*context, "Stats", request->header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  const ShardStats stats = shard_->Stats();
  response->set_initialized(stats.initialized);
  response->set_generation(stats.generation);
  response->set_samples(stats.samples);
  response->set_min_version(stats.min_version);
  response->set_decided_step(stats.decided_step);
  response->set_pushes(stats.pushes);
  response->set_pulls(stats.pulls);
  response->set_skipped(stats.skipped);
  response->set_late_pushes(stats.late_pushes);
  response->set_late_steps(stats.late_steps);
  response->set_overflowed(stats.overflowed);
  response->set_last_overflow(stats.last_overflow);
  response->set_bytes_received(bytes_received_.load());
  response->set_bytes_sent(bytes_sent_.load());
  return grpc::Status::OK;
}

void PsService::SetRemovedWorkers(const std::vector<int>& workers) {
  absl::MutexLock lock(&done_mu_);
  for (int w : workers) {
    if (w >= 0 && w < static_cast<int>(removed_.size())) removed_[w] = true;
  }
}

grpc::Status PsService::WorkerDone(grpc::ServerContext* context,
                                   const WorkerDoneRequest* request,
                                   WorkerDoneResponse* response) {
  Touch();
  if (grpc::Status denied =
          Authorize(*context, "WorkerDone", request->header());
      !denied.ok()) {
    return denied;
  }
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  const int64_t generation = shard_->generation();
  if (request->steps_ended() && request->header().generation() != generation) {
    // Steps ended in another generation (a restore since): the worker
    // recovers, as from a pull of it.
    return grpc::Status(grpc::StatusCode::ABORTED,
                        absl::StrCat("shard ", shard_->options().shard_index,
                                     " is at generation ", generation,
                                     "; the steps ended in generation ",
                                     request->header().generation()));
  }
  absl::MutexLock lock(&done_mu_);
  const int worker = request->header().worker_id();
  if (request->steps_ended()) {
    steps_ended_[worker] = generation;
  } else {
    done_[worker] = true;
  }
  // An elastic job's removed workers are not waited for.
  int remaining = 0;
  for (int w : shard_->membership().workers) {
    remaining += done_[w] ? 0 : 1;
    if (!done_[w] && steps_ended_[w] != generation && !removed_[w]) {
      response->add_training_ids(w);
    }
  }
  response->set_workers_remaining(remaining);
  response->set_bytes_received(bytes_received_.load());
  if (remaining == 0 && !all_workers_done_.HasBeenNotified()) {
    all_workers_done_.Notify();
  }
  return grpc::Status::OK;
}

}  // namespace pstrain
