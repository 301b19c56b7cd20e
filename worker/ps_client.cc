#include "worker/ps_client.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunk_message.h"
#include "common/rpc_options.h"
#include "common/status.h"
#include "common/tensor_codec.h"

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
    : options_(options), plan_(plan) {}

PsClient::~PsClient() {
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
  std::unique_ptr<PsClient> client(new PsClient(options, plan));
  for (int s = 0; s < plan.num_shards(); ++s) {
    client->shard_chunks_.push_back(plan.ChunksOfShard(s));
    client->channels_.push_back(grpc::CreateCustomChannel(
        options.addresses[s], grpc::InsecureChannelCredentials(),
        PsChannelArguments()));
    client->stubs_.push_back(
        ParameterServer::NewStub(client->channels_.back()));
    client->push_pull_methods_.emplace_back(
        kPushPullMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
        client->channels_.back());
  }
  client->streams_.resize(plan.num_shards());
  for (int s = 0; s < plan.num_shards(); ++s) {
    client->leases_.push_back(std::make_unique<PayloadLease>());
  }
  return client;
}

void PsClient::SetHeader(RequestHeader* header) const {
  header->set_job_id(options_.job_id);
  header->set_worker_id(options_.worker_id);
}

absl::Status PsClient::ShardError(int shard, const grpc::Status& status) const {
  absl::Status s = FromGrpcStatus(status);
  return absl::Status(
      s.code(), absl::StrCat("shard ", shard, " (", options_.addresses[shard],
                             "): ", s.message()));
}

absl::Status PsClient::Initialize(
    const std::vector<absl::Span<const float>>& params) {
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    InitResponse response;
    auto writer = stubs_[s]->Init(&context, &response);
    InitRequest first;
    SetHeader(first.mutable_header());
    for (int64_t n : plan_.param_num_elements()) {
      first.mutable_layout()->add_param_num_elements(n);
    }
    first.mutable_layout()->set_partition_bytes(plan_.partition_bytes());
    first.mutable_layout()->set_num_buffers(plan_.num_buffers());
    bool ok = writer->Write(first);
    for (const ChunkSpec& c : shard_chunks_[s]) {
      if (!ok) break;
      InitRequest request;
      SetHeader(request.mutable_header());
      EncodeFloatChunk(c.param_id, c.chunk_index, 0,
                       params[c.param_id].subspan(c.offset, c.num_elements),
                       request.mutable_chunk());
      ok = writer->Write(request);
    }
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (!status.ok()) return ShardError(s, status);
  }
  return absl::OkStatus();
}

absl::Status PsClient::WaitReady(absl::Duration timeout) {
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    context.set_wait_for_ready(true);  // the shard may still be starting
    WaitReadyRequest request;
    SetHeader(request.mutable_header());
    WaitReadyResponse response;
    const grpc::Status status =
        stubs_[s]->WaitReady(&context, request, &response);
    if (!status.ok()) return ShardError(s, status);
    const std::vector<int64_t> sizes(
        response.layout().param_num_elements().begin(),
        response.layout().param_num_elements().end());
    if (sizes != plan_.param_num_elements() ||
        response.layout().partition_bytes() != plan_.partition_bytes() ||
        response.layout().num_buffers() != plan_.num_buffers()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", s, " (", options_.addresses[s],
                       ") was initialised with a different model layout (",
                       sizes.size(), " tensors) than this worker's (",
                       plan_.param_num_elements().size(), " tensors)"));
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::FinishStream(int shard) {
  Stream& s = streams_[shard];
  s.stream->WritesDone();
  const grpc::Status status = s.stream->Finish();
  s.stream.reset();
  s.context.reset();
  if (status.ok()) {
    return absl::UnavailableError(absl::StrCat("shard ", shard, " (",
                                               options_.addresses[shard],
                                               "): stream ended early"));
  }
  return ShardError(shard, status);
}

absl::Status PsClient::PushPullShard(
    int shard, int64_t step, const std::vector<absl::Span<const float>>& grads,
    int64_t min_version, int64_t samples,
    const std::vector<absl::Span<float>>& weights, int64_t* version) {
  Stream& s = streams_[shard];
  if (s.stream == nullptr) {
    s.context = std::make_unique<grpc::ClientContext>();
    SetDeadline(s.context.get(), options_.stream_timeout);
    // The stream moves grpc::ByteBuffers (common/chunk_message.h), created
    // the way gRPC's generated stubs create theirs.
    s.stream.reset(grpc::internal::ClientReaderWriterFactory<
                   grpc::ByteBuffer,
                   grpc::ByteBuffer>::Create(channels_[shard].get(),
                                             push_pull_methods_[shard],
                                             s.context.get()));
  }
  auto write_pushes = [&]() {
    PushPullRequest envelope;
    SetHeader(envelope.mutable_header());
    for (const ChunkSpec& c : shard_chunks_[shard]) {
      if (!s.stream->Write(EncodeChunkMessage(
              envelope, kPushChunkField, c.param_id, c.chunk_index, step,
              grads[c.param_id].subspan(c.offset, c.num_elements),
              leases_[shard].get()))) {
        return false;
      }
    }
    return true;
  };
  PushPullRequest pull;
  SetHeader(pull.mutable_header());
  pull.mutable_pull()->set_min_version(min_version);
  pull.mutable_pull()->set_samples(samples);
  // Sync: the pull goes first and the pushes from a second thread, so that
  // the shard sends each updated chunk back while later gradients are still
  // on their way up (both directions of the link busy). Async: pushes, then
  // the pull, so that the pulled weights include this worker's update.
  std::thread pusher;
  std::atomic<bool> pushed{true};
  if (!grads.empty() && min_version > 0) {
    if (!s.stream->Write(EncodeSmallMessage(pull))) return FinishStream(shard);
    pusher = std::thread([&] { pushed.store(write_pushes()); });
  } else {
    if (!grads.empty() && !write_pushes()) return FinishStream(shard);
    if (!s.stream->Write(EncodeSmallMessage(pull))) return FinishStream(shard);
  }
  // Ends the call (so a blocked push returns), then the pusher.
  auto fail = [&](absl::Status status) {
    if (pusher.joinable()) {
      s.context->TryCancel();
      pusher.join();
    }
    absl::Status finished = FinishStream(shard);
    return status.ok() ? finished : status;
  };
  grpc::ByteBuffer buffer;
  ReceivedChunkMessage received;
  PushPullResponse envelope;  // the fields besides the chunk
  int64_t smallest = -1;
  size_t received_chunks = 0;
  while (true) {
    if (!s.stream->Read(&buffer)) return fail(absl::OkStatus());
    absl::Status status = received.Parse(&buffer, kPullChunkField, &envelope);
    if (!status.ok()) {
      return fail(absl::DataLossError(
          absl::StrCat("shard ", shard, ": ", status.message())));
    }
    if (received.has_chunk()) {
      const TensorChunk& chunk = received.chunk();
      const int index =
          plan_.FindChunk(chunk.key().param_id(), chunk.key().chunk_index());
      if (index < 0 || plan_.chunks()[index].shard != shard) {
        return fail(absl::DataLossError(absl::StrCat(
            "shard ", shard, " sent chunk (", chunk.key().param_id(), ", ",
            chunk.key().chunk_index(), ") it does not own")));
      }
      const ChunkSpec& c = plan_.chunks()[index];
      // One copy, from the received slices into the weights.
      status = received.CopyFloatPayload(
          weights[c.param_id].subspan(c.offset, c.num_elements));
      if (!status.ok()) return fail(status);
      smallest =
          smallest < 0 ? chunk.version() : std::min(smallest, chunk.version());
      ++received_chunks;
    }
    if (envelope.last_of_pull()) break;
  }
  if (pusher.joinable()) pusher.join();
  if (!pushed.load()) return FinishStream(shard);
  if (received_chunks != shard_chunks_[shard].size()) {
    return absl::DataLossError(
        absl::StrCat("shard ", shard, " answered a pull with ", received_chunks,
                     " chunks; expected ", shard_chunks_[shard].size()));
  }
  *version = smallest;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PsClient::PushPull(
    int64_t step, const std::vector<absl::Span<const float>>& gradients,
    int64_t min_version, int64_t samples,
    const std::vector<absl::Span<float>>& weights) {
  const int n = num_shards();
  std::vector<absl::Status> statuses(n);
  std::vector<int64_t> versions(n, 0);
  std::vector<std::thread> threads;
  for (int s = 1; s < n; ++s) {
    threads.emplace_back([&, s] {
      statuses[s] = PushPullShard(s, step, gradients, min_version, samples,
                                  weights, &versions[s]);
    });
  }
  statuses[0] = PushPullShard(0, step, gradients, min_version, samples, weights,
                              &versions[0]);
  for (std::thread& t : threads) t.join();
  // The pushes lent `gradients` to gRPC without a copy, and the caller may
  // change them once this returns: wait until gRPC has let go of every
  // slice. After a successful pull this is only gRPC dropping references,
  // since each shard answered the pull after it had read the pushes.
  for (int s = 0; s < n; ++s) {
    if (!leases_[s]->WaitReleased(absl::Now() + options_.rpc_timeout) &&
        statuses[s].ok()) {
      statuses[s] = absl::InternalError(
          absl::StrCat("shard ", s, " (", options_.addresses[s],
                       "): gRPC still holds the pushed gradients after ",
                       absl::FormatDuration(options_.rpc_timeout)));
    }
  }
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return *std::min_element(versions.begin(), versions.end());
}

absl::StatusOr<StatsResponse> PsClient::Stats(int shard) {
  grpc::ClientContext context;
  SetDeadline(&context, options_.rpc_timeout);
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
  for (int s = 0; s < num_shards(); ++s) {
    if (streams_[s].stream == nullptr) continue;
    streams_[s].stream->WritesDone();
    const grpc::Status status = streams_[s].stream->Finish();
    streams_[s].stream.reset();
    streams_[s].context.reset();
    if (!status.ok() && first_error.ok()) first_error = ShardError(s, status);
  }
  return first_error;
}

absl::Status PsClient::Done() {
  absl::Status first_error = CloseStreams();
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    WorkerDoneRequest request;
    SetHeader(request.mutable_header());
    WorkerDoneResponse response;
    const grpc::Status status =
        stubs_[s]->WorkerDone(&context, request, &response);
    if (!status.ok() && first_error.ok()) first_error = ShardError(s, status);
  }
  return first_error;
}

}  // namespace pstrain
