#include "server/ps_service.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tensor_codec.h"

namespace pstrain {

PsService::PsService(ParameterShard* shard, absl::Duration pull_timeout)
    : shard_(shard),
      pull_timeout_(pull_timeout),
      last_request_unix_ms_(absl::ToUnixMillis(absl::Now())),
      done_(shard->options().num_workers, false) {}

void PsService::Touch() {
  last_request_unix_ms_.store(absl::ToUnixMillis(absl::Now()));
}

absl::Time PsService::last_request_time() const {
  return absl::FromUnixMillis(last_request_unix_ms_.load());
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
  std::vector<InitChunk> chunks;
  int64_t elements = 0;
  while (reader->Read(&request)) {
    InitChunk chunk;
    chunk.param_id = request.chunk().key().param_id();
    chunk.chunk_index = request.chunk().key().chunk_index();
    status = DecodeFloatChunk(request.chunk(), &chunk.values);
    if (!status.ok()) return ToGrpcStatus(status);
    elements += static_cast<int64_t>(chunk.values.size());
    chunks.push_back(std::move(chunk));
  }
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  status = shard_->Initialize(sizes, partition_bytes, std::move(chunks),
                              num_buffers);
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_num_chunks(num_chunks);
  response->set_num_elements(elements);
  return grpc::Status::OK;
}

grpc::Status PsService::WaitReady(grpc::ServerContext* context,
                                  const WaitReadyRequest* request,
                                  WaitReadyResponse* response) {
  Touch();
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  // Never wait past the caller's deadline, nor past the pull timeout.
  absl::Time deadline = absl::Now() + pull_timeout_;
  const auto client_deadline = context->deadline();
  if (client_deadline != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(client_deadline));
  }
  status = shard_->WaitReady(deadline);
  if (!status.ok()) return ToGrpcStatus(status);
  for (int64_t n : shard_->plan().param_num_elements()) {
    response->mutable_layout()->add_param_num_elements(n);
  }
  response->mutable_layout()->set_partition_bytes(
      shard_->plan().partition_bytes());
  response->mutable_layout()->set_num_buffers(shard_->plan().num_buffers());
  return grpc::Status::OK;
}

grpc::Status PsService::PushPull(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<PushPullResponse, PushPullRequest>* stream) {
  PushPullRequest request;
  std::vector<float> gradient;
  int worker_id = -1;
  while (stream->Read(&request)) {
    Touch();
    absl::Status status = shard_->CheckWorker(request.header().job_id(),
                                              request.header().worker_id());
    if (!status.ok()) return ToGrpcStatus(status);
    if (worker_id < 0) worker_id = request.header().worker_id();
    if (worker_id != request.header().worker_id()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("stream of worker ", worker_id,
                                       " carried a request of worker ",
                                       request.header().worker_id()));
    }
    if (request.has_push()) {
      const TensorChunk& chunk = request.push();
      bytes_received_.fetch_add(static_cast<int64_t>(chunk.data().size()),
                                std::memory_order_relaxed);
      status = DecodeFloatChunk(chunk, &gradient);
      if (!status.ok()) return ToGrpcStatus(status);
      status =
          shard_->Push(worker_id, chunk.key().param_id(),
                       chunk.key().chunk_index(), chunk.version(), gradient);
      if (!status.ok()) return ToGrpcStatus(status);
    } else if (request.has_pull()) {
      std::vector<PushPullResponse> replies;
      // Each chunk is serialised under its lock and written after it.
      grpc::Status write_status = grpc::Status::OK;
      status = shard_->Pull(
          request.pull().min_version(), request.pull().samples(),
          absl::Now() + pull_timeout_,
          [&](const ChunkSpec& spec, int64_t version,
              absl::Span<const float> weights) {
            PushPullResponse reply;
            EncodeFloatChunk(spec.param_id, spec.chunk_index, version, weights,
                             reply.mutable_chunk());
            replies.push_back(std::move(reply));
          });
      if (!status.ok()) return ToGrpcStatus(status);
      if (replies.empty()) {
        replies.emplace_back();
      }
      replies.back().set_last_of_pull(true);
      for (PushPullResponse& reply : replies) {
        bytes_sent_.fetch_add(static_cast<int64_t>(reply.chunk().data().size()),
                              std::memory_order_relaxed);
        if (!stream->Write(reply)) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "worker closed the stream during a pull");
        }
      }
    } else {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "push/pull message carries neither push nor pull");
    }
  }
  return grpc::Status::OK;
}

grpc::Status PsService::Stats(grpc::ServerContext* context,
                              const StatsRequest* request,
                              StatsResponse* response) {
  Touch();
  absl::Status status = shard_->CheckWorker(request->header().job_id(),
                                            request->header().worker_id());
  if (!status.ok()) return ToGrpcStatus(status);
  const ShardStats stats = shard_->Stats();
  response->set_samples(stats.samples);
  response->set_min_version(stats.min_version);
  response->set_pushes(stats.pushes);
  response->set_pulls(stats.pulls);
  response->set_bytes_received(bytes_received_.load());
  response->set_bytes_sent(bytes_sent_.load());
  return grpc::Status::OK;
}

grpc::Status PsService::WorkerDone(grpc::ServerContext* context,
                                   const WorkerDoneRequest* request,
                                   WorkerDoneResponse* response) {
  Touch();
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
