#include "server/push_pull_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/tensor_codec.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "google/protobuf/stubs/common.h"

namespace pstrain {

PsService::PushPullSession::PushPullSession(PsService* service,
                                            grpc::ServerContext* context,
                                            Stream* stream)
    : service_(service),
      shard_(service->shard_),
      context_(context),
      stream_(stream) {
  watch_.context = context;
  absl::MutexLock lock(&service_->watch_mu_);
  service_->watches_.insert(&watch_);
}

PsService::PushPullSession::~PushPullSession() {
  absl::MutexLock lock(&service_->watch_mu_);
  service_->watches_.erase(&watch_);
}

bool PsService::PushPullSession::Write(const grpc::ByteBuffer& message) {
  absl::MutexLock lock(&write_mu_);
  watch_.since_ms.store(absl::ToUnixMillis(absl::Now()));
  const bool written = stream_->Write(message);
  watch_.since_ms.store(0);
  return written;
}

grpc::Status PsService::PushPullSession::Run() {
  writer_ = std::thread([this] { ServePulls(); });
  grpc::ByteBuffer buffer;
  PushPullRequest request;  // the fields besides a push's chunk
  while (stream_->Read(&buffer)) {
    service_->Touch();
    absl::Status status = received_.Parse(&buffer, kPushChunkField, &request);
    if (!status.ok()) return Finish(ToGrpcStatus(status), true);
    if (std::optional<grpc::Status> end = Handle(request)) {
      return Finish(*end, true);
    }
  }
  // The worker half-closed (or the writer cancelled the call): serve what
  // was asked for, then end.
  return Finish(grpc::Status::OK, context_->IsCancelled());
}

std::optional<grpc::Status> PsService::PushPullSession::HandleFirst(
    const PushPullRequest& request) {
  if (grpc::Status denied =
          service_->Authorize(*context_, "PushPull", request.header());
      !denied.ok()) {
    return denied;
  }
  worker_id_ = request.header().worker_id();
  peer_ = context_->peer();  // "ipv4:10.0.0.5:41234"
  const size_t colon = peer_.find(':');
  if (colon != std::string::npos && peer_.rfind("ip", 0) == 0) {
    peer_ = peer_.substr(colon + 1);
  }
  return std::nullopt;
}

std::optional<grpc::Status> PsService::PushPullSession::Handle(
    const PushPullRequest& request) {
  absl::Status status = shard_->CheckWorker(request.header().job_id(),
                                            request.header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  if (worker_id_ < 0) {
    if (std::optional<grpc::Status> denied = HandleFirst(request)) {
      return denied;
    }
  }
  generation_ = request.header().generation();
  if (worker_id_ != request.header().worker_id()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("stream of worker ", worker_id_,
                                     " carried a request of worker ",
                                     request.header().worker_id()));
  }
  if (received_.has_chunk()) return HandlePush();
  if (request.has_skipped_push()) {
    const SkippedPush& skip = request.skipped_push();
    status =
        shard_->PushSkipped(worker_id_, skip.key().param_id(),
                            skip.key().chunk_index(), skip.step(), generation_);
  } else if (request.has_step_end()) {
    return HandleStepEnd(request.step_end());
  } else if (request.has_step_norm()) {
    status = shard_->ApplyStepNorm(worker_id_, request.step_norm().step(),
                                   request.step_norm().sum_sq(), generation_);
  } else if (request.has_pull()) {
    return QueuePull(request.pull());
  } else if (request.has_pushes_sent()) {
    return HandlePushesSent(request.pushes_sent());
  } else if (request.has_step_verdict()) {
    status = shard_->NoteFiniteVerdict(
        worker_id_, request.step_verdict().step(), generation_);
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "push/pull message carries no push, skipped push, "
                        "step end, step norm, pushes sent, step verdict or "
                        "pull");
  }
  if (!status.ok()) return ToGrpcStatus(status);
  return std::nullopt;
}

std::optional<grpc::Status> PsService::PushPullSession::HandlePush() {
  const TensorChunk& chunk = received_.chunk();
  service_->bytes_received_.fetch_add(received_.payload_bytes(),
                                      std::memory_order_relaxed);
  // Dtype and size are checked before the shard takes the push; the
  // payload is then copied once, into the worker's pending slot.
  absl::Status status = received_.CheckFloat(chunk.num_elements());
  if (!status.ok()) return ToGrpcStatus(status);
  service_->pushes_queued_.fetch_add(1, std::memory_order_relaxed);
  trace::Scope traced("push", "shard",
                      {{"worker", worker_id_},
                       {"param", chunk.key().param_id()},
                       {"chunk", chunk.key().chunk_index()},
                       {"step", chunk.version()}});
  if (chunk.sparse() && chunk.row_elements() > 1) {
    // An embedding table's rows, kept sparse for the lazy update.
    status = shard_->PushRows(
        worker_id_, chunk.key().param_id(), chunk.key().chunk_index(),
        chunk.version(),
        [this](int64_t n, int64_t d, RowValues* out) {
          return received_.CopyRowsPayload(n, d, &out->rows, &out->values);
        },
        generation_);
  } else {
    status = shard_->Push(
        worker_id_, chunk.key().param_id(), chunk.key().chunk_index(),
        chunk.version(), chunk.num_elements(),
        [this](absl::Span<float> out) {
          return received_.CopyFloatPayloadFindNonFinite(out);
        },
        generation_);
  }
  traced.End();
  service_->pushes_queued_.fetch_sub(1, std::memory_order_relaxed);
  if (!status.ok()) return ToGrpcStatus(status);
  return std::nullopt;
}

std::optional<grpc::Status> PsService::PushPullSession::HandleStepEnd(
    const StepEnd& end) {
  NonFiniteValue nonfinite;
  if (end.has_nonfinite()) {
    nonfinite.param_id = end.nonfinite().param_id();
    nonfinite.element = end.nonfinite().element();
    // Bounded: it is echoed to every worker, in a proto3 string, so cut
    // on a UTF-8 character boundary (a cut character would make every
    // worker's reply unparsable).
    const std::string head = end.nonfinite().value().substr(0, 16);
    nonfinite.value = head.substr(
        0, google::protobuf::internal::UTF8SpnStructurallyValid(head));
  }
  const NonFiniteValue* reported = end.has_nonfinite() ? &nonfinite : nullptr;
  if (end.channels() > 1) {
    if (std::optional<grpc::Status> failed =
            AwaitPushesSent(end.step(), end.channels())) {
      return failed;
    }
  }
  if (end.admission() == StepEnd::ADMISSION_NONE) {
    const absl::Status status =
        shard_->EndStep(worker_id_, end.step(), reported, generation_);
    if (!status.ok()) return ToGrpcStatus(status);
    return std::nullopt;
  }
  const AdmissionClaim claim =
      end.admission() == StepEnd::ADMISSION_DECIDE ? AdmissionClaim::kDecide
      : end.admission() == StepEnd::ADMITTED       ? AdmissionClaim::kAdmitted
                                                   : AdmissionClaim::kLate;
  absl::StatusOr<bool> admitted =
      shard_->EndStepWithBackups(worker_id_, end.step(), reported, generation_,
                                 claim, std::max<int64_t>(0, end.samples()));
  if (!admitted.ok()) return ToGrpcStatus(admitted.status());
  if (claim == AdmissionClaim::kDecide) {
    // Shard 0's answer, beside the writer's pull replies.
    PushPullResponse answer;
    answer.mutable_admission()->set_step(end.step());
    answer.mutable_admission()->set_admitted(*admitted);
    if (!Write(EncodeSmallMessage(answer))) return grpc::Status::OK;
  }
  return std::nullopt;
}

std::optional<grpc::Status> PsService::PushPullSession::HandlePushesSent(
    const PushesSent& sent) {
  const absl::Status status =
      service_->NotePushesSent(worker_id_, generation_, sent.step());
  if (!status.ok()) return ToGrpcStatus(status);
  return std::nullopt;
}

std::optional<grpc::Status> PsService::PushPullSession::AwaitPushesSent(
    int64_t step, int channels) {
  if (channels > kMaxChannels) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker ", worker_id_, " ended step ", step, " over ",
                     channels, " streams; at most ", kMaxChannels));
  }
  const absl::Time deadline = absl::Now() + service_->pull_timeout_;
  while (true) {
    // In slices, so that a cancelled call is noticed.
    const int arrived = service_->TakePushesSent(
        worker_id_, generation_, step, channels - 1,
        std::min(deadline, absl::Now() + absl::Milliseconds(100)));
    if (arrived >= channels - 1) return std::nullopt;
    // OK: the call ends as broken (the barrier too), as any cancelled one.
    if (context_->IsCancelled()) return grpc::Status::OK;
    // Another generation: the shard refuses the end itself (ABORTED).
    if (shard_->generation() != generation_) return std::nullopt;
    if (absl::Now() >= deadline) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("worker ", worker_id_, " ended step ", step,
                       " on shard ", shard_->options().shard_index, " over ",
                       channels, " streams, but only ", arrived, " of the ",
                       channels - 1,
                       " other streams said they pushed the step within ",
                       absl::FormatDuration(service_->pull_timeout_)));
    }
  }
}

std::optional<grpc::Status> PsService::PushPullSession::QueuePull(
    const PullRequest& pull) {
  const DType wire = pull.wire_dtype() == DTYPE_UNSPECIFIED ? DTYPE_FLOAT32
                                                            : pull.wire_dtype();
  if (WireBytesPerElement(wire) == 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker ", worker_id_, " asked for its pull in dtype ",
                     DTypeName(pull.wire_dtype()),
                     "; expected DTYPE_FLOAT32, DTYPE_BFLOAT16 or "
                     "DTYPE_FLOAT16"));
  }
  PullSubset subset;
  if (pull.channels() > 1) {
    subset.index = pull.channel();
    subset.count = pull.channels();
  }
  if (subset.count > kMaxChannels || subset.index < 0 ||
      subset.index >= subset.count) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker ", worker_id_, " asked for the pull of channel ",
                     pull.channel(), " of ", pull.channels(),
                     "; expected 0 <= channel < channels <= ", kMaxChannels));
  }
  std::shared_ptr<const PullRowSets> rows;
  if (!pull.rows().empty()) {
    if (!shard_->initialized()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a pull names table rows before the shard was "
                          "initialised");
    }
    absl::StatusOr<PullRowSets> parsed = ParsePullRows(pull, shard_->plan());
    if (!parsed.ok()) return ToGrpcStatus(parsed.status());
    rows = std::make_shared<const PullRowSets>(*std::move(parsed));
  }
  if (pull.has_have_version() && pull.have_version() < 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker ", worker_id_, " says it holds version ",
                     pull.have_version(), "; expected a version >= 0"));
  }
  // fp16's scale exponent is chosen per chunk from its largest value: the
  // unchanged entries of a delta would keep another scale's rounding.
  const int64_t have_version = pull.has_have_version() && wire != DTYPE_FLOAT16
                                   ? pull.have_version()
                                   : -1;
  absl::MutexLock lock(&mu_);
  if (jobs_.size() >= kMaxPendingPulls) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("worker ", worker_id_, " has ", kMaxPendingPulls,
                     " pulls waiting on one stream, the most a stream may "
                     "have"));
  }
  jobs_.push_back({pull.min_version(), pull.samples(), generation_, worker_id_,
                   wire, subset, pull.priority(), pull.announce_decision(),
                   std::move(rows), have_version});
  return std::nullopt;
}

void PsService::PushPullSession::ServePulls() {
  while (true) {
    PullJob job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !jobs_.empty() || closed_;
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    if (!ServePull(job)) return;
  }
}

bool PsService::PushPullSession::ServePull(const PullJob& job) {
  const PushPullResponse no_fields;
  grpc::ByteBuffer reply;
  int64_t reply_bytes = 0;
  bool write_failed = false;
  SkippedStepInfo skipped;
  service_->pulls_waiting_.fetch_add(1, std::memory_order_relaxed);
  trace::Scope traced(
      "pull", "shard",
      {{"worker", job.worker_id}, {"min_version", job.min_version}});
  const int64_t pull_start_us = trace::NowUs();
  PullOrder order;
  order.front_first = job.priority;
  if (job.have_version >= 0) {
    order.have_version = job.have_version;
    order.wire_bytes = WireBytesPerElement(job.wire_dtype);
    order.visit_delta = [&](const ChunkSpec& spec, int64_t version,
                            const ChunkDelta& delta) {
      // The changed entries only (TensorChunk.sparse, element offsets).
      reply = EncodeSparseChunkMessage(
          no_fields, kPullChunkField, spec.param_id, spec.chunk_index, version,
          spec.num_elements, delta.indices, delta.values, job.wire_dtype);
      reply_bytes =
          delta.index_bytes +
          static_cast<int64_t>(delta.values.size()) * order.wire_bytes;
    };
  }
  // The generation a planned change took at the step this pull waits for
  // (ParameterShard::PlanReopen), if any: -1 otherwise.
  auto switched_to = [&job, this]() -> int64_t {
    const ParameterShard::GenerationSwitch last = shard_->last_switch();
    return last.from == job.generation && last.version == job.min_version
               ? last.to
               : -1;
  };
  if (job.announce_decision) {
    order.decided = [&](int64_t step) {
      PushPullResponse decided;
      decided.set_decided_step(step);
      if (const int64_t to = switched_to(); to >= 0) decided.set_generation(to);
      write_failed = !Write(EncodeSmallMessage(decided));
      return !write_failed;
    };
  }
  // A chunk's whole weights as the reply. Buffers (BatchNorm's running
  // statistics) travel fp32 on every wire, as in allreduce: they are
  // statistics the model evaluates with, not weights the shard keeps in
  // fp32 behind a rounding. With the shard's storage (`shared`,
  // PullOrder::visit_shared) the reply holds the fp32 values, or their
  // 16-bit form converted once per update for every worker, until gRPC
  // has sent it, no copy; else the values are copied, or converted to 16
  // bits, into a slice of the reply's own. Under the chunk's lock; written
  // after it.
  auto encode_whole = [&](const ChunkSpec& spec, int64_t version,
                          absl::Span<const float> values,
                          SharedFloats* shared) {
    const DType dtype = shard_->plan().is_buffer(spec.param_id)
                            ? DTYPE_FLOAT32
                            : job.wire_dtype;
    if (shared == nullptr) {
      reply =
          EncodeChunkMessage(no_fields, kPullChunkField, spec.param_id,
                             spec.chunk_index, version, values, nullptr, dtype);
    } else if (dtype == DTYPE_FLOAT32) {
      reply = EncodeSharedChunkMessage(no_fields, kPullChunkField,
                                       spec.param_id, spec.chunk_index, version,
                                       values, shared->Share());
    } else {
      reply = EncodeSharedChunkMessage(no_fields, kPullChunkField,
                                       spec.param_id, spec.chunk_index, version,
                                       shared->ShareHalves(dtype));
    }
    reply_bytes =
        static_cast<int64_t>(values.size() * WireBytesPerElement(dtype));
  };
  order.visit_shared = [&](const ChunkSpec& spec, int64_t version,
                           SharedFloats& weights) {
    encode_whole(spec, version, weights.span(), &weights);
  };
  absl::Status status = shard_->Pull(
      job.min_version, job.samples, absl::Now() + service_->pull_timeout_,
      [&](const ChunkSpec& spec, int64_t version,
          absl::Span<const float> weights) {
        // Copied under the chunk's lock, written after it.
        if (job.rows != nullptr && spec.row_elements > 0 &&
            job.rows->asked[spec.param_id]) {
          reply = EncodeRowsReply(spec, version, weights,
                                  job.rows->rows[spec.param_id], job.wire_dtype,
                                  &reply_bytes);
          return;
        }
        encode_whole(spec, version, weights, nullptr);
      },
      [&] {
        service_->bytes_sent_.fetch_add(reply_bytes, std::memory_order_relaxed);
        write_failed = !Write(reply);
        return !write_failed;
      },
      &cancelled_, job.generation, &skipped,
      [&](int64_t step, double sum_sq) {
        PushPullResponse partial;
        partial.mutable_norm_partial()->set_step(step);
        partial.mutable_norm_partial()->set_sum_sq(sum_sq);
        write_failed = !Write(EncodeSmallMessage(partial));
        return !write_failed;
      },
      job.subset, order);
  traced.End();
  service_->pulls_waiting_.fetch_sub(1, std::memory_order_relaxed);
  service_->pulls_done_.fetch_add(1, std::memory_order_relaxed);
  service_->pull_ns_.fetch_add((trace::NowUs() - pull_start_us) * 1000,
                               std::memory_order_relaxed);
  if (status.ok()) {
    // The end of this pull: a message without a chunk.
    PushPullResponse last;
    last.set_last_of_pull(true);
    if (const int64_t to = switched_to(); to >= 0) last.set_generation(to);
    if (const int64_t announced = service_->AnnouncedCheckpointStep();
        announced >= 0) {
      last.set_checkpoint_step(announced);
    }
    if (skipped.step >= 0) {
      SkippedStep* out = last.mutable_skipped_step();
      out->set_step(skipped.step);
      out->set_worker_id(skipped.worker_id);
      out->mutable_nonfinite()->set_param_id(skipped.nonfinite.param_id);
      out->mutable_nonfinite()->set_element(skipped.nonfinite.element);
      out->mutable_nonfinite()->set_value(skipped.nonfinite.value);
    }
    write_failed = !Write(EncodeSmallMessage(last));
  }
  if (status.ok() && !write_failed) return true;
  EndAfterPullError(write_failed, status);
  return false;
}

void PsService::PushPullSession::EndAfterPullError(bool write_failed,
                                                   const absl::Status& status) {
  writer_status_ = write_failed
                       ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                      "worker closed the stream during a pull")
                       : ToGrpcStatus(status);
  if (!write_failed) {
    // Tell the worker in-band, so that it half-closes and reads this status
    // as the call's (a cancel would show it CANCELLED).
    PushPullResponse error;
    error.set_error_code(writer_status_.error_code());
    error.set_error_message(writer_status_.error_message());
    if (Write(EncodeSmallMessage(error)) &&
        reader_done_.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      return;
    }
  }
  context_->TryCancel();  // ends the reader's Read
}

grpc::Status PsService::PushPullSession::Finish(grpc::Status reader_status,
                                                bool cancel) {
  reader_done_.Notify();
  if (cancel) cancelled_.store(true);
  // Not for a message this shard refused (reader_status): a bad push
  // changes nothing, the barrier included.
  // Nor for a worker that is not a member (an elastic job's worker leaving
  // after a membership without it): no step waits for it.
  if (cancel && reader_status.ok() && worker_id_ >= 0 &&
      shard_->IsMember(worker_id_)) {
    shard_->BreakBarrier(
        generation_,
        absl::StrCat("worker ", worker_id_, " on ", peer_,
                     ": its push/pull stream to shard ",
                     shard_->options().shard_index,
                     " broke mid-step (the worker died or gave the step up)"));
  }
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  writer_.join();
  return reader_status.ok() ? writer_status_ : reader_status;
}

}  // namespace pstrain
