#include "server/ps_service.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_message.h"
#include "common/partition.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "common/trace.h"
#include "server/shard_checkpoint.h"

namespace pstrain {
namespace {

// Pulls one PushPull stream may have waiting to be served. A worker has at
// most staleness + 1 in flight (one per step it may run ahead); past this
// the stream is refused with RESOURCE_EXHAUSTED, so a caller that sends
// pulls and never reads cannot grow the queue without bound.
constexpr size_t kMaxPendingPullsPerStream = 1024;

}  // namespace

PsService::PsService(ParameterShard* shard, absl::Duration pull_timeout,
                     bool authorize, absl::Duration write_timeout)
    : shard_(shard),
      pull_timeout_(pull_timeout),
      write_timeout_(write_timeout),
      authorizer_(authorize),
      last_request_unix_ms_(absl::ToUnixMillis(absl::Now())),
      done_(shard->options().num_workers, false) {
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
  std::thread writer;
  {
    absl::MutexLock lock(&checkpoint_mu_);
    writer = std::move(checkpoint_writer_);
  }
  if (writer.joinable()) writer.join();
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
  if (request->header().worker_id() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "only worker 0 asks for checkpoints");
  }
  const int64_t step = request->step();
  absl::MutexLock lock(&checkpoint_mu_);
  if (request->wait()) {
    if (step != checkpoint_step_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("shard ", shard_->options().shard_index,
                       " began no checkpoint of step ", step,
                       " (the last begun: ", checkpoint_step_, ")"));
    }
    const absl::Time deadline = absl::FromChrono(context->deadline());
    if (!checkpoint_mu_.AwaitWithDeadline(absl::Condition(&checkpoint_done_),
                                          deadline)) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("shard ", shard_->options().shard_index,
                       ": checkpoint of step ", step, " still being written"));
    }
    if (!checkpoint_status_.ok()) return ToGrpcStatus(checkpoint_status_);
    *response = checkpoint_result_;
    return grpc::Status::OK;
  }
  // The file's path comes from the shard's own configuration; the request
  // names only the step (server/shard_checkpoint.h).
  const ShardOptions& o = shard_->options();
  absl::StatusOr<std::string> path =
      ShardCheckpointPath(o.checkpoint_dir, step, o.shard_index);
  if (!path.ok()) return ToGrpcStatus(path.status());
  // One write at a time: the one in flight finishes first. A concurrent
  // call may start another while this one joins, hence the loop; each
  // thread is joined by the one call that moved it out.
  while (checkpoint_writer_.joinable()) {
    checkpoint_mu_.Await(absl::Condition(&checkpoint_done_));
    if (!checkpoint_writer_.joinable()) continue;  // another call took it
    std::thread finished = std::move(checkpoint_writer_);
    checkpoint_mu_.Unlock();
    finished.join();
    checkpoint_mu_.Lock();
  }
  if (snapshot_ == nullptr) {
    snapshot_ = std::make_shared<std::vector<ChunkSnapshot>>();
  }
  absl::Status snapshot = shard_->SnapshotInto(step, snapshot_.get());
  if (!snapshot.ok()) return ToGrpcStatus(snapshot);
  checkpoint_step_ = step;
  checkpoint_done_ = false;
  checkpoint_status_ = absl::OkStatus();
  checkpoint_result_.Clear();
  checkpoint_writer_ =
      std::thread([this, step, path = *std::move(path), chunks = snapshot_]() {
        const ShardOptions& o = shard_->options();
        // The file's contents are fsynced; its folder is the caller's to
        // fsync, once for every file of the checkpoint (proto/ps.proto).
        safetensors::WriteOptions in_folder;
        in_folder.sync_folder = false;
        absl::StatusOr<safetensors::WriteResult> written = WriteShardCheckpoint(
            path, *chunks, o.shard_index, o.num_shards, step, in_folder);
        CheckpointResponse result;
        int64_t min_version = INT64_MAX, max_version = 0;
        for (const ChunkSnapshot& c : *chunks) {
          min_version = std::min(min_version, c.version);
          max_version = std::max(max_version, c.version);
        }
        result.set_num_chunks(static_cast<int64_t>(chunks->size()));
        result.set_min_version(chunks->empty() ? 0 : min_version);
        result.set_max_version(max_version);
        if (written.ok()) {
          result.set_size_bytes(static_cast<int64_t>(written->size_bytes));
          result.set_crc32(written->crc32);
        }
        absl::MutexLock lock(&checkpoint_mu_);
        checkpoint_status_ = written.status();
        checkpoint_result_ = result;
        checkpoint_done_ = true;
      });
  return grpc::Status::OK;
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

void PsService::Touch() {
  last_request_unix_ms_.store(absl::ToUnixMillis(absl::Now()));
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
  const int64_t generation = request.generation();
  if (request.reopen()) {
    const int64_t reopen_version = request.reopen_version();
    if (reader->Read(&request)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a reopen carries no chunks (the shard keeps its "
                          "own state)");
    }
    absl::StatusOr<int64_t> version =
        shard_->Reopen(generation, reopen_version);
    if (!version.ok()) return ToGrpcStatus(version.status());
    response->set_version(*version);
    return grpc::Status::OK;
  }
  // Each chunk is checked against the layout's plan as it arrives, before
  // its bytes are decoded, so what Init holds is bounded by this shard's
  // part of the layout (the shard checks the whole set again).
  absl::StatusOr<PartitionPlan> plan = PartitionPlan::Create(
      sizes, partition_bytes, shard_->options().num_shards, num_buffers);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  std::vector<bool> seen(plan->chunks().size(), false);
  std::vector<InitChunk> chunks;
  int64_t elements = 0;
  while (reader->Read(&request)) {
    InitChunk chunk;
    chunk.param_id = request.chunk().key().param_id();
    chunk.chunk_index = request.chunk().key().chunk_index();
    const int global = plan->FindChunk(chunk.param_id, chunk.chunk_index);
    if (global < 0 ||
        plan->chunks()[global].shard != shard_->options().shard_index) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("init chunk (", chunk.param_id, ", ", chunk.chunk_index,
                       ") is not owned by shard ",
                       shard_->options().shard_index, " in the layout sent"));
    }
    if (seen[global]) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("init chunk (", chunk.param_id, ", ",
                                       chunk.chunk_index, ") sent twice"));
    }
    seen[global] = true;
    const int64_t expected = plan->chunks()[global].num_elements;
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
    status = DecodeFloatChunk(request.chunk(), &chunk.values);
    if (!status.ok()) return ToGrpcStatus(status);
    chunk.version = request.chunk().version();
    if (request.has_adam_m())
      status = DecodeFloatChunk(request.adam_m(), &chunk.m);
    if (status.ok() && request.has_adam_v()) {
      status = DecodeFloatChunk(request.adam_v(), &chunk.v);
    }
    if (!status.ok()) return ToGrpcStatus(status);
    elements += static_cast<int64_t>(chunk.values.size());
    chunks.push_back(std::move(chunk));
  }
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  status = shard_->Initialize(sizes, partition_bytes, std::move(chunks),
                              num_buffers, generation);
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_num_chunks(num_chunks);
  response->set_num_elements(elements);
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
  status = shard_->WaitReady(deadline, request->min_generation());
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_generation(shard_->generation());
  for (int64_t n : shard_->plan().param_num_elements()) {
    response->mutable_layout()->add_param_num_elements(n);
  }
  response->mutable_layout()->set_partition_bytes(
      shard_->plan().partition_bytes());
  response->mutable_layout()->set_num_buffers(shard_->plan().num_buffers());
  return grpc::Status::OK;
}

// One worker's PushPull stream. This thread reads (pushes are applied as
// they arrive); a second thread serves the pulls, chunk by chunk, as each
// chunk reaches the version asked for. A sync worker sends its pull before
// its pushes, so the first updated chunks flow back down while the last
// gradients still flow up: each direction of the link is busy at once, as
// in BytePS's per-partition push/pull.
grpc::Status PsService::PushPullStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  struct PullJob {
    int64_t min_version;
    int64_t samples;
    int64_t generation;
    int64_t worker_id;
  };
  absl::Mutex mu;
  std::deque<PullJob> jobs;  // guarded by mu
  bool closed = false;       // guarded by mu
  std::atomic<bool> cancelled{false};
  grpc::Status writer_status = grpc::Status::OK;  // written by the writer
  absl::Notification reader_done;                 // the reader's loop ended
  // The writer's pending write, watched (WatchWrites) until the stream ends.
  WriteWatch watch;
  watch.context = context;
  {
    absl::MutexLock lock(&watch_mu_);
    watches_.insert(&watch);
  }
  struct Unwatch {
    PsService* service;
    WriteWatch* watch;
    ~Unwatch() {
      absl::MutexLock lock(&service->watch_mu_);
      service->watches_.erase(watch);
    }
  } unwatch{this, &watch};
  // A write, timed by the watchdog.
  // The writer's pull replies and (backup workers, shard 0) the reader's
  // admissions share the stream: one write at a time.
  absl::Mutex write_mu;
  auto write = [&](const grpc::ByteBuffer& message) {
    absl::MutexLock lock(&write_mu);
    watch.since_ms.store(absl::ToUnixMillis(absl::Now()));
    const bool written = stream->Write(message);
    watch.since_ms.store(0);
    return written;
  };

  std::thread writer([&] {
    grpc::ByteBuffer reply;
    int64_t reply_bytes = 0;
    const PushPullResponse no_fields;
    while (true) {
      PullJob job;
      {
        absl::MutexLock lock(&mu);
        auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !jobs.empty() || closed;
        };
        mu.Await(absl::Condition(&ready));
        if (jobs.empty()) return;
        job = jobs.front();
        jobs.pop_front();
      }
      bool write_failed = false;
      SkippedStepInfo skipped;
      pulls_waiting_.fetch_add(1, std::memory_order_relaxed);
      trace::Scope traced(
          "pull", "shard",
          {{"worker", job.worker_id}, {"min_version", job.min_version}});
      const int64_t pull_start_us = trace::NowUs();
      absl::Status status = shard_->Pull(
          job.min_version, job.samples, absl::Now() + pull_timeout_,
          [&](const ChunkSpec& spec, int64_t version,
              absl::Span<const float> weights) {
            // Copied under the chunk's lock, written after it.
            reply =
                EncodeChunkMessage(no_fields, kPullChunkField, spec.param_id,
                                   spec.chunk_index, version, weights);
            reply_bytes = static_cast<int64_t>(weights.size() * sizeof(float));
          },
          [&] {
            bytes_sent_.fetch_add(reply_bytes, std::memory_order_relaxed);
            write_failed = !write(reply);
            return !write_failed;
          },
          &cancelled, job.generation, &skipped,
          [&](int64_t step, double sum_sq) {
            PushPullResponse partial;
            partial.mutable_norm_partial()->set_step(step);
            partial.mutable_norm_partial()->set_sum_sq(sum_sq);
            write_failed = !write(EncodeSmallMessage(partial));
            return !write_failed;
          });
      traced.End();
      pulls_waiting_.fetch_sub(1, std::memory_order_relaxed);
      pulls_done_.fetch_add(1, std::memory_order_relaxed);
      pull_ns_.fetch_add((trace::NowUs() - pull_start_us) * 1000,
                         std::memory_order_relaxed);
      if (status.ok()) {
        // The end of this pull: a message without a chunk.
        PushPullResponse last;
        last.set_last_of_pull(true);
        if (skipped.step >= 0) {
          SkippedStep* out = last.mutable_skipped_step();
          out->set_step(skipped.step);
          out->set_worker_id(skipped.worker_id);
          out->mutable_nonfinite()->set_param_id(skipped.nonfinite.param_id);
          out->mutable_nonfinite()->set_element(skipped.nonfinite.element);
          out->mutable_nonfinite()->set_value(skipped.nonfinite.value);
        }
        write_failed = !write(EncodeSmallMessage(last));
      }
      if (!status.ok() || write_failed) {
        writer_status = write_failed
                            ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "worker closed the stream during a "
                                           "pull")
                            : ToGrpcStatus(status);
        if (!write_failed) {
          // Tell the worker in-band, so that it half-closes and reads this
          // status as the call's (a cancel would show it CANCELLED).
          PushPullResponse error;
          error.set_error_code(writer_status.error_code());
          error.set_error_message(writer_status.error_message());
          if (write(EncodeSmallMessage(error)) &&
              reader_done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
            return;
          }
        }
        context->TryCancel();  // ends the reader's Read
        return;
      }
    }
  });
  grpc::ByteBuffer buffer;
  ReceivedChunkMessage received;
  PushPullRequest request;  // the fields besides a push's chunk
  int worker_id = -1;
  // The worker's address, read with its first message (after a cancel gRPC
  // may only say "unknown").
  std::string peer;
  int64_t generation = 0;
  // Stops the writer after its queued pulls (or at once when `cancel`) and
  // returns the first error of either side. A stream that ends any other
  // way than by the worker's half-close leaves a sync step that cannot
  // complete: the barrier breaks (ParameterShard::BreakBarrier).
  auto finish = [&](grpc::Status reader_status, bool cancel) {
    reader_done.Notify();
    if (cancel) cancelled.store(true);
    // Not for a message this shard refused (reader_status): a bad push
    // changes nothing, the barrier included.
    if (cancel && reader_status.ok() && worker_id >= 0) {
      shard_->BreakBarrier(
          generation,
          absl::StrCat("worker ", worker_id, " on ", peer,
                       ": its push/pull stream to shard ",
                       shard_->options().shard_index,
                       " broke mid-step (the worker died or gave the step "
                       "up)"));
    }
    {
      absl::MutexLock lock(&mu);
      closed = true;
    }
    writer.join();
    return reader_status.ok() ? writer_status : reader_status;
  };

  while (stream->Read(&buffer)) {
    Touch();
    absl::Status status = received.Parse(&buffer, kPushChunkField, &request);
    if (!status.ok()) return finish(ToGrpcStatus(status), true);
    status = shard_->CheckWorker(request.header().job_id(),
                                 request.header().worker_id());
    if (!status.ok()) return finish(ToGrpcStatus(status), true);
    if (worker_id < 0) {
      if (grpc::Status denied =
              Authorize(*context, "PushPull", request.header());
          !denied.ok()) {
        return finish(denied, true);
      }
      worker_id = request.header().worker_id();
      peer = context->peer();  // "ipv4:10.0.0.5:41234"
      const size_t colon = peer.find(':');
      if (colon != std::string::npos && peer.rfind("ip", 0) == 0) {
        peer = peer.substr(colon + 1);
      }
    }
    generation = request.header().generation();
    if (worker_id != request.header().worker_id()) {
      return finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("stream of worker ", worker_id,
                                              " carried a request of worker ",
                                              request.header().worker_id())),
                    true);
    }
    if (received.has_chunk()) {
      const TensorChunk& chunk = received.chunk();
      bytes_received_.fetch_add(received.payload_bytes(),
                                std::memory_order_relaxed);
      // Dtype and size are checked before the shard takes the push; the
      // payload is then copied once, into the worker's pending slot.
      status = received.CheckFloat(chunk.num_elements());
      if (!status.ok()) return finish(ToGrpcStatus(status), true);
      pushes_queued_.fetch_add(1, std::memory_order_relaxed);
      trace::Scope traced("push", "shard",
                          {{"worker", worker_id},
                           {"param", chunk.key().param_id()},
                           {"chunk", chunk.key().chunk_index()},
                           {"step", chunk.version()}});
      status = shard_->Push(
          worker_id, chunk.key().param_id(), chunk.key().chunk_index(),
          chunk.version(), chunk.num_elements(),
          [&received](absl::Span<float> out) {
            return received.CopyFloatPayload(out);
          },
          generation);
      traced.End();
      pushes_queued_.fetch_sub(1, std::memory_order_relaxed);
      if (!status.ok()) return finish(ToGrpcStatus(status), true);
    } else if (request.has_skipped_push()) {
      const SkippedPush& skip = request.skipped_push();
      status = shard_->PushSkipped(worker_id, skip.key().param_id(),
                                   skip.key().chunk_index(), skip.step(),
                                   generation);
      if (!status.ok()) return finish(ToGrpcStatus(status), true);
    } else if (request.has_step_end()) {
      const StepEnd& end = request.step_end();
      NonFiniteValue nonfinite;
      if (end.has_nonfinite()) {
        nonfinite.param_id = end.nonfinite().param_id();
        nonfinite.element = end.nonfinite().element();
        // Bounded: it is echoed to every worker.
        nonfinite.value = end.nonfinite().value().substr(0, 16);
      }
      if (end.admission() == StepEnd::ADMISSION_NONE) {
        status = shard_->EndStep(worker_id, end.step(),
                                 end.has_nonfinite() ? &nonfinite : nullptr,
                                 generation);
        if (!status.ok()) return finish(ToGrpcStatus(status), true);
      } else {
        const AdmissionClaim claim =
            end.admission() == StepEnd::ADMISSION_DECIDE
                ? AdmissionClaim::kDecide
            : end.admission() == StepEnd::ADMITTED ? AdmissionClaim::kAdmitted
                                                   : AdmissionClaim::kLate;
        absl::StatusOr<bool> admitted = shard_->EndStepWithBackups(
            worker_id, end.step(), end.has_nonfinite() ? &nonfinite : nullptr,
            generation, claim, std::max<int64_t>(0, end.samples()));
        if (!admitted.ok()) {
          return finish(ToGrpcStatus(admitted.status()), true);
        }
        if (claim == AdmissionClaim::kDecide) {
          // Shard 0's answer, beside the writer's pull replies.
          PushPullResponse answer;
          answer.mutable_admission()->set_step(end.step());
          answer.mutable_admission()->set_admitted(*admitted);
          if (!write(EncodeSmallMessage(answer))) {
            return finish(grpc::Status::OK, true);
          }
        }
      }
    } else if (request.has_step_norm()) {
      status = shard_->ApplyStepNorm(worker_id, request.step_norm().step(),
                                     request.step_norm().sum_sq(), generation);
      if (!status.ok()) return finish(ToGrpcStatus(status), true);
    } else if (request.has_pull()) {
      bool full;
      {
        absl::MutexLock lock(&mu);
        full = jobs.size() >= kMaxPendingPullsPerStream;
        if (!full) {
          jobs.push_back({request.pull().min_version(),
                          request.pull().samples(), generation, worker_id});
        }
      }
      if (full) {
        return finish(
            grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                         absl::StrCat("worker ", worker_id, " has ",
                                      kMaxPendingPullsPerStream,
                                      " pulls waiting on one stream, the "
                                      "most a stream may have")),
            true);
      }
    } else {
      return finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "push/pull message carries no push, skipped "
                                 "push, step end, step norm or pull"),
                    true);
    }
  }
  // The worker half-closed (or the writer cancelled the call): serve what
  // was asked for, then end.
  return finish(grpc::Status::OK, context->IsCancelled());
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
  absl::MutexLock lock(&done_mu_);
  done_[request->header().worker_id()] = true;
  int remaining = 0;
  for (bool d : done_) remaining += d ? 0 : 1;
  response->set_workers_remaining(remaining);
  if (remaining == 0 && !all_workers_done_.HasBeenNotified()) {
    all_workers_done_.Notify();
  }
  return grpc::Status::OK;
}

}  // namespace pstrain
