// Issue 22: a battery of malformed PushPull messages sent to a real PS (a
// PsService over a ParameterShard behind StartGrpcServer on 127.0.0.1),
// each on its own stream over one channel, as ByteBuffers built with
// EncodeChunkMessage / EncodeSmallMessage or by hand. Every message must end
// its stream with the exact status documented in server/parameter_shard.h
// and proto/ps.proto (INVALID_ARGUMENT, FAILED_PRECONDITION, ABORTED) and a
// message naming what is wrong; afterwards the weights are byte-identical
// and no push was applied, and a correct step from every worker still
// works. The variations come from a std::mt19937 of a fixed seed: a failure
// prints the seed, the message's index and what it was.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chunk_message.h"
#include "common/grpc_server.h"
#include "common/nonfinite.h"
#include "common/partition.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"

namespace pstrain {
namespace {

constexpr char kJob[] = "job";
constexpr int kWorkers = 2;
// PSTRAIN_MALFORMED_SEED=<n> in the environment runs another seed.
const uint32_t kSeed = [] {
  const char* seed = std::getenv("PSTRAIN_MALFORMED_SEED");
  return seed != nullptr
             ? static_cast<uint32_t>(std::strtoul(seed, nullptr, 10))
             : 220022u;
}();
// 3 tensors of 10, 7 and 5 elements in chunks of at most 4 elements: 3 + 2
// + 2 chunks, all on the one shard.
constexpr int64_t kPartitionBytes = 16;
const std::vector<int64_t> kSizes = {10, 7, 5};

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::ByteBuffer Raw(const std::string& bytes) {
  const grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

PushPullRequest Header(int worker, const std::string& job = kJob,
                       int64_t generation = 0) {
  PushPullRequest request;
  request.mutable_header()->set_job_id(job);
  request.mutable_header()->set_worker_id(worker);
  request.mutable_header()->set_generation(generation);
  return request;
}

std::string ChunkText(int32_t param_id, int32_t chunk_index) {
  return absl::StrCat("chunk (", param_id, ", ", chunk_index, ")");
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    default:
      return "other";
  }
}

// One malformed message (or a valid one, then a malformed one) and the end
// it must give its stream.
struct Case {
  explicit Case(std::string kind) : kind(std::move(kind)) {}
  std::string kind;
  std::string detail;
  std::vector<grpc::ByteBuffer> messages;
  grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  // Each must appear in the status message (which is never empty).
  std::vector<std::string> contains;
};

// Every chunk's version and weight bytes, as a pull returned them.
struct Model {
  std::map<std::pair<int32_t, int32_t>, std::string> bytes;
  std::map<std::pair<int32_t, int32_t>, int64_t> versions;

  std::string All() const {
    std::string all;
    for (const auto& [key, b] : bytes) all += b;
    return all;
  }
  uint64_t Hash() const {  // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : All()) h = (h ^ c) * 1099511628211ull;
    return h;
  }
};

// A real shard server of the layout above in `mode`, and a client channel.
class Ps {
 public:
  explicit Ps(SyncMode mode, std::mt19937* rng) {
    ShardOptions options;
    options.job_id = kJob;
    options.num_workers = kWorkers;
    options.mode = mode;
    options.adam.lr = 0.01f;
    shard_ = std::make_unique<ParameterShard>(options);
    absl::StatusOr<PartitionPlan> plan =
        PartitionPlan::Create(kSizes, kPartitionBytes, 1, 0);
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<InitChunk> init;
    for (const ChunkSpec& spec : plan->chunks()) {
      InitChunk c;
      c.param_id = spec.param_id;
      c.chunk_index = spec.chunk_index;
      for (int64_t i = 0; i < spec.num_elements; ++i) {
        c.values.push_back(normal(*rng));
      }
      init.push_back(std::move(c));
    }
    const absl::Status status =
        shard_->Initialize(kSizes, kPartitionBytes, std::move(init));
    EXPECT_TRUE(status.ok()) << status;
    chunks_ = shard_->plan().chunks();
    service_ = std::make_unique<PsService>(shard_.get(), absl::Seconds(5));
    absl::StatusOr<ListeningServer> listening =
        StartGrpcServer("127.0.0.1:0", service_.get(), "");
    EXPECT_TRUE(listening.ok()) << listening.status();
    server_ = std::move(listening->server);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(listening->port),
                            grpc::InsecureChannelCredentials());
  }
  ~Ps() {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }

  const std::vector<ChunkSpec>& chunks() const { return chunks_; }
  ParameterShard& shard() { return *shard_; }

  // Sends `messages` on a fresh PushPull stream, half-closes, reads every
  // reply (into `replies` if given) and returns the stream's status.
  grpc::Status Exchange(const std::vector<grpc::ByteBuffer>& messages,
                        std::vector<PushPullResponse>* replies = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    const grpc::internal::RpcMethod method(
        kPushPullMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           method, &context));
    for (const grpc::ByteBuffer& m : messages) {
      if (!stream->Write(m)) break;  // the shard ended the stream
    }
    stream->WritesDone();
    grpc::ByteBuffer reply;
    while (stream->Read(&reply)) {
      if (replies == nullptr) continue;
      PushPullResponse r;
      EXPECT_TRUE(r.ParseFromString(Flatten(reply)));
      replies->push_back(std::move(r));
    }
    return stream->Finish();
  }

  // Every chunk, by a well-formed pull of `min_version` from `worker`'s
  // fresh stream.
  Model PullAll(int worker, int64_t min_version) {
    PushPullRequest pull = Header(worker);
    pull.mutable_pull()->set_min_version(min_version);
    std::vector<PushPullResponse> replies;
    const grpc::Status status = Exchange({EncodeSmallMessage(pull)}, &replies);
    EXPECT_TRUE(status.ok()) << status.error_message();
    Model model;
    for (const PushPullResponse& r : replies) {
      if (!r.has_chunk()) continue;
      const auto key = std::make_pair(r.chunk().key().param_id(),
                                      r.chunk().key().chunk_index());
      model.bytes[key] = r.chunk().data();
      model.versions[key] = r.chunk().version();
    }
    EXPECT_FALSE(replies.empty());
    if (!replies.empty()) {
      EXPECT_TRUE(replies.back().last_of_pull());
    }
    EXPECT_EQ(model.bytes.size(), chunks_.size());
    for (const ChunkSpec& spec : chunks_) {
      const auto key = std::make_pair(spec.param_id, spec.chunk_index);
      EXPECT_EQ(model.bytes[key].size(),
                static_cast<size_t>(spec.num_elements * 4));
    }
    return model;
  }

  // Runs `cases`; EXPECTs each stream's status. Returns the failures.
  int Run(const std::vector<Case>& cases, const char* phase,
          std::map<std::string, int>* counts) {
    int failures = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      ++(*counts)[c.kind];
      const grpc::Status status = Exchange(c.messages);
      bool ok =
          status.error_code() == c.code && !status.error_message().empty();
      for (const std::string& s : c.contains) {
        ok = ok && status.error_message().find(s) != std::string::npos;
      }
      if (ok) continue;
      ++failures;
      ADD_FAILURE() << "seed " << kSeed << ", " << phase << " message #" << i
                    << " (" << c.kind << ": " << c.detail << "): got "
                    << CodeName(status.error_code()) << " \""
                    << status.error_message() << "\"; expected "
                    << CodeName(c.code) << " containing \""
                    << absl::StrJoin(c.contains, "\", \"") << "\"";
      if (failures >= 20) {
        ADD_FAILURE() << "stopping " << phase << " after 20 failures";
        break;
      }
    }
    return failures;
  }

 private:
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<ChunkSpec> chunks_;
};

// Draws the malformed messages.
class Battery {
 public:
  Battery(const std::vector<ChunkSpec>& chunks, SyncMode mode,
          std::mt19937* rng)
      : chunks_(chunks), mode_(mode), rng_(*rng) {}

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  template <typename T>
  T Pick(std::initializer_list<T> values) {
    return *(values.begin() + Uniform(0, values.size() - 1));
  }
  const ChunkSpec& AnyChunk() {
    return chunks_[Uniform(0, chunks_.size() - 1)];
  }
  int AnyWorker() { return static_cast<int>(Uniform(0, kWorkers - 1)); }
  int32_t NumChunks(int32_t param_id) const {
    int32_t n = 0;
    for (const ChunkSpec& c : chunks_) n += c.param_id == param_id ? 1 : 0;
    return n;
  }
  std::vector<float> Finite(int64_t n) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng_);
    return v;
  }
  // Sync: the step the chunks are at (every push of it is taken).
  void set_version(int64_t version) { version_ = version; }
  // A push's step that the shard takes (async: any).
  int64_t GoodStep() {
    return mode_ == SyncMode::kSync ? version_ : Uniform(-5, 5);
  }

  grpc::ByteBuffer Push(const PushPullRequest& header, int32_t param_id,
                        int32_t chunk_index, int64_t step,
                        const std::vector<float>& values) {
    return EncodeChunkMessage(header, kPushChunkField, param_id, chunk_index,
                              step, values);
  }
  // A push encoded by protobuf itself, any field as given.
  grpc::ByteBuffer RawPush(const PushPullRequest& header, int32_t param_id,
                           int32_t chunk_index, int dtype, int64_t num_elements,
                           const std::string& data, int64_t step) {
    PushPullRequest request = header;
    TensorChunk* chunk = request.mutable_push();
    chunk->mutable_key()->set_param_id(param_id);
    chunk->mutable_key()->set_chunk_index(chunk_index);
    chunk->set_dtype(static_cast<DType>(dtype));
    chunk->set_num_elements(num_elements);
    chunk->set_data(data);
    chunk->set_version(step);
    return Raw(request.SerializeAsString());
  }
  // A well-formed push of `spec` by `worker` (accepted on its own, unless
  // the chunk was pushed already).
  grpc::ByteBuffer GoodPush(int worker, const ChunkSpec& spec) {
    return Push(Header(worker), spec.param_id, spec.chunk_index, GoodStep(),
                Finite(spec.num_elements));
  }
  std::string Bytes(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }

  Case ChunkKey() {
    Case c("chunk key");
    const int32_t owned = static_cast<int32_t>(Uniform(0, kSizes.size() - 1));
    int32_t p = owned, i = 0;
    switch (Uniform(0, 5)) {
      case 0:  // past the tensor's last chunk
        i = NumChunks(owned) + static_cast<int32_t>(Uniform(0, 1000));
        break;
      case 1:  // no such tensor
        p = static_cast<int32_t>(Uniform(kSizes.size(), 100000));
        i = static_cast<int32_t>(Uniform(0, 2));
        break;
      case 2:  // negative tensor
        p = Pick<int32_t>(
            {-1, -2, kI32Min, static_cast<int32_t>(Uniform(-100000, -1))});
        i = static_cast<int32_t>(Uniform(0, 2));
        break;
      case 3:  // negative chunk
        i = Pick<int32_t>(
            {-1, kI32Min, static_cast<int32_t>(Uniform(-100000, -1))});
        break;
      case 4:  // huge chunk index of an owned tensor
        i = Pick<int32_t>({kI32Max, kI32Max - 1,
                           static_cast<int32_t>(Uniform(1 << 20, kI32Max))});
        break;
      default:  // huge both
        p = kI32Max;
        i = Pick<int32_t>({kI32Max, 0});
        break;
    }
    const int w = AnyWorker();
    c.detail = absl::StrCat("worker ", w, " ", ChunkText(p, i));
    if (Uniform(0, 3) == 0) {
      // The same key on a skipped push.
      PushPullRequest r = Header(w);
      r.mutable_skipped_push()->mutable_key()->set_param_id(p);
      r.mutable_skipped_push()->mutable_key()->set_chunk_index(i);
      r.mutable_skipped_push()->set_step(GoodStep());
      c.messages.push_back(EncodeSmallMessage(r));
      c.detail += " skipped";
    } else {
      c.messages.push_back(
          Push(Header(w), p, i, GoodStep(), Finite(Uniform(1, 8))));
    }
    c.contains = {ChunkText(p, i) + " is not owned by shard 0"};
    return c;
  }

  Case ElementCount() {
    Case c("element count");
    const ChunkSpec& s = AnyChunk();
    int64_t n = 0;
    switch (Uniform(0, 2)) {
      case 0:
        n = 0;
        break;
      case 1:
        n = s.num_elements > 1 ? Uniform(1, s.num_elements - 1) : 0;
        break;
      default:
        n = s.num_elements + Uniform(1, 100);
        break;
    }
    c.detail = absl::StrCat(ChunkText(s.param_id, s.chunk_index), " with ", n,
                            " elements");
    c.messages.push_back(Push(Header(AnyWorker()), s.param_id, s.chunk_index,
                              GoodStep(), Finite(n)));
    c.contains = {absl::StrCat(ChunkText(s.param_id, s.chunk_index),
                               " push has ", n, " elements; expected ",
                               s.num_elements)};
    return c;
  }

  Case PayloadSize() {
    Case c("payload size");
    const ChunkSpec& s = AnyChunk();
    int64_t n = s.num_elements;
    int64_t bytes = 4 * n;
    switch (Uniform(0, 5)) {
      case 0:
        bytes = 0;
        break;
      case 1:
        bytes = 4 * n + Pick<int64_t>({-3, -2, -1, 1, 2, 3});
        break;
      case 2:
        bytes = 4 * n + 4 * Pick<int64_t>({-1, 1, 2});
        break;
      case 3:  // negative count
        n = Pick<int64_t>({-1, -s.num_elements, kI64Min, Uniform(kI64Min, -1)});
        bytes = 4 * Uniform(0, 4);
        break;
      case 4:  // a count whose byte size overflows int64
        n = Pick<int64_t>({kI64Max, int64_t{1} << 62, (int64_t{1} << 62) + 1,
                           Uniform(int64_t{1} << 61, kI64Max)});
        bytes = 4 * Uniform(0, 2);
        break;
      default:
        bytes = Uniform(1, 200);
        if (bytes == 4 * n) ++bytes;
        break;
    }
    const std::string data = Bytes(Finite((bytes + 3) / 4)).substr(0, bytes);
    c.detail = absl::StrCat(ChunkText(s.param_id, s.chunk_index), " of ", n,
                            " elements with ", bytes, " bytes");
    c.messages.push_back(RawPush(Header(AnyWorker()), s.param_id, s.chunk_index,
                                 DTYPE_FLOAT32, n, data, GoodStep()));
    c.contains = {absl::StrCat(ChunkText(s.param_id, s.chunk_index),
                               " carries ", bytes, " bytes for ", n,
                               " fp32 elements")};
    return c;
  }

  Case Dtype() {
    Case c("dtype");
    const ChunkSpec& s = AnyChunk();
    // Not DTYPE_FLOAT32, DTYPE_BFLOAT16 (2) or DTYPE_FLOAT16 (3): the wire
    // formats a chunk may carry (common/wire_dtype.h).
    const int dtype = Pick<int>({DTYPE_UNSPECIFIED, 7, 4, -1, kI32Max,
                                 static_cast<int>(Uniform(4, 100000))});
    c.detail =
        absl::StrCat(ChunkText(s.param_id, s.chunk_index), " of dtype ", dtype);
    c.messages.push_back(RawPush(Header(AnyWorker()), s.param_id, s.chunk_index,
                                 dtype, s.num_elements,
                                 Bytes(Finite(s.num_elements)), GoodStep()));
    c.contains = {ChunkText(s.param_id, s.chunk_index) + " has dtype ",
                  dtype == DTYPE_UNSPECIFIED ? std::string("DTYPE_UNSPECIFIED")
                                             : absl::StrCat(dtype),
                  "expected DTYPE_FLOAT32"};
    return c;
  }

  // Sync only: a step other than the chunks' `version`.
  Case Step(int64_t version) {
    Case c("step");
    const ChunkSpec& s = AnyChunk();
    int64_t step = 0;
    switch (Uniform(0, 3)) {
      case 0:  // future
        step = version + Uniform(1, 100);
        break;
      case 1:  // past or negative
        step = Uniform(-1000, version - 1);
        break;
      case 2:
        step = Pick<int64_t>({kI64Max, kI64Min, int64_t{1} << 40, -1});
        break;
      default:
        step = version + 1;
        break;
    }
    const int w = AnyWorker();
    c.code = grpc::StatusCode::FAILED_PRECONDITION;
    c.detail =
        absl::StrCat("worker ", w, " ", ChunkText(s.param_id, s.chunk_index),
                     " step ", step, " at version ", version);
    std::string what = "push of ";
    if (Uniform(0, 3) == 0) {
      PushPullRequest r = Header(w);
      r.mutable_skipped_push()->mutable_key()->set_param_id(s.param_id);
      r.mutable_skipped_push()->mutable_key()->set_chunk_index(s.chunk_index);
      r.mutable_skipped_push()->set_step(step);
      c.messages.push_back(EncodeSmallMessage(r));
      c.detail += " skipped";
      what = "skipped push of ";
    } else {
      c.messages.push_back(Push(Header(w), s.param_id, s.chunk_index, step,
                                Finite(s.num_elements)));
    }
    c.contains = {absl::StrCat(what, ChunkText(s.param_id, s.chunk_index),
                               " for step ", step,
                               " but the chunk is at version ", version)};
    return c;
  }

  // A message of every kind but with `header`: a push, a skipped push
  // (sync), a step end (sync), a pull.
  grpc::ByteBuffer AnyMessage(const PushPullRequest& header,
                              std::string* what) {
    const ChunkSpec& s = AnyChunk();
    const int64_t kind = Uniform(0, mode_ == SyncMode::kSync ? 3 : 1);
    if (kind == 0) {
      *what = "push";
      return Push(header, s.param_id, s.chunk_index, GoodStep(),
                  Finite(s.num_elements));
    }
    PushPullRequest r = header;
    if (kind == 1) {
      *what = "pull";
      r.mutable_pull()->set_min_version(0);
    } else if (kind == 2) {
      *what = "skipped push";
      r.mutable_skipped_push()->mutable_key()->set_param_id(s.param_id);
      r.mutable_skipped_push()->mutable_key()->set_chunk_index(s.chunk_index);
      r.mutable_skipped_push()->set_step(GoodStep());
    } else {
      *what = "step end";
      r.mutable_step_end()->set_step(0);
    }
    return EncodeSmallMessage(r);
  }

  Case WorkerId() {
    Case c("worker id");
    const int w = Pick<int>({-1, kI32Min, kWorkers, kWorkers + 1, kI32Max,
                             static_cast<int>(Uniform(kI32Min, -1)),
                             static_cast<int>(Uniform(kWorkers, kI32Max))});
    std::string what;
    c.messages.push_back(AnyMessage(Header(w), &what));
    c.detail = absl::StrCat(what, " of worker ", w);
    c.contains = {absl::StrCat("worker id ", w, " is outside the job's [0, ",
                               kWorkers, ")")};
    return c;
  }

  // A pull of worker a (served), then a message of worker b on that stream.
  Case WorkerMidStream() {
    Case c("worker id mid-stream");
    const int a = AnyWorker();
    const int b = (a + 1) % kWorkers;
    PushPullRequest pull = Header(a);
    pull.mutable_pull()->set_min_version(0);
    c.messages.push_back(EncodeSmallMessage(pull));
    std::string what;
    c.messages.push_back(AnyMessage(Header(b), &what));
    c.detail =
        absl::StrCat("pull of worker ", a, ", then ", what, " of worker ", b);
    c.contains = {absl::StrCat("stream of worker ", a,
                               " carried a request of worker ", b)};
    return c;
  }

  Case JobId() {
    Case c("job id");
    std::string job = Pick<std::string>(
        {"", "jo", "job2", "JOB", " job", std::string("job\0", 4), "other"});
    if (Uniform(0, 2) == 0) {
      job.clear();
      for (int64_t n = Uniform(1, 40); n > 0; --n) {
        job += static_cast<char>(Uniform('a', 'z'));
      }
    }
    std::string what;
    c.messages.push_back(AnyMessage(Header(AnyWorker(), job), &what));
    c.detail = absl::StrCat(what, " of job \"", job, "\"");
    c.contains = {"job id", "does not match this shard's job \"job\""};
    return c;
  }

  Case Generation() {
    Case c("generation");
    const int64_t g = Pick<int64_t>(
        {1, -1, 2, kI64Max, kI64Min, Uniform(3, 1000000), Uniform(-1000, -2)});
    std::string what;
    c.messages.push_back(AnyMessage(Header(AnyWorker(), kJob, g), &what));
    c.code = grpc::StatusCode::ABORTED;
    c.detail = absl::StrCat(what, " of generation ", g);
    c.contains = {"is at generation 0",
                  absl::StrCat("the request is of generation ", g)};
    return c;
  }

  Case NonFinite() {
    Case c("non-finite");
    const ChunkSpec& s = AnyChunk();
    std::vector<float> v = Finite(s.num_elements);
    const float kinds[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::signaling_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
    int64_t first = s.num_elements;
    for (int64_t k = Uniform(1, s.num_elements); k > 0; --k) {
      const int64_t at = Uniform(0, s.num_elements - 1);
      v[at] = kinds[Uniform(0, 4)];
      first = std::min(first, at);
    }
    const int w = AnyWorker();
    c.detail =
        absl::StrCat("worker ", w, " ", ChunkText(s.param_id, s.chunk_index),
                     " with ", NonFiniteText(v[first]), " first at ", first);
    c.messages.push_back(
        Push(Header(w), s.param_id, s.chunk_index, GoodStep(), v));
    c.contains = {
        absl::StrCat("push of parameter ", s.param_id, ", chunk ",
                     s.chunk_index),
        absl::StrCat("holds a non-finite value (", NonFiniteText(v[first]),
                     " at element ", s.offset + first, " of the parameter)"),
        "not marked as a skipped push"};
    return c;
  }

  // A well-formed push cut short, or with bytes that are not protobuf.
  Case Truncated() {
    Case c("truncated");
    const ChunkSpec& s = AnyChunk();
    const int w = AnyWorker();
    const PushPullRequest header = Header(w);
    const std::string full = Flatten(GoodPush(w, s));
    const int64_t envelope = header.ByteSizeLong();
    int64_t cut = Uniform(1, full.size() - 1);
    if (cut == envelope) --cut;  // a whole header and nothing else
    c.detail = absl::StrCat(ChunkText(s.param_id, s.chunk_index), " cut to ",
                            cut, " of ", full.size(), " bytes");
    c.messages.push_back(Raw(full.substr(0, cut)));
    c.contains = {"malformed push/pull message"};
    return c;
  }

  Case Garbage() {
    Case c("garbage");
    const ChunkSpec& s = AnyChunk();
    const int w = AnyWorker();
    const std::string push = Flatten(GoodPush(w, s));
    const std::string header = Header(w).SerializeAsString();
    std::string bytes;
    switch (Uniform(0, 8)) {
      case 0: {  // random bytes: any INVALID_ARGUMENT
        for (int64_t n = Uniform(1, 64); n > 0; --n) {
          bytes += static_cast<char>(Uniform(0, 255));
        }
        c.detail = "random bytes";
        break;
      }
      case 1:  // an empty message: no header
        c.detail = "empty message";
        c.contains = {"job id \"\" does not match"};
        break;
      case 2:  // a header and no operation
        bytes = header;
        c.detail = "header only";
        c.contains = {
            "carries no push, skipped push, step end, step norm, pushes sent, "
            "step verdict or pull"};
        break;
      case 3:  // a push then a field of a bad wire type (6, 7) or a group
        bytes = push;
        bytes += static_cast<char>((Uniform(6, 15) << 3) |
                                   Pick<int64_t>({3, 4, 6, 7}));
        bytes += std::string(Uniform(0, 4), '\x01');
        c.detail = "push + bad wire type";
        c.contains = {"malformed push/pull message: bad field"};
        break;
      case 4:  // the chunk twice
        bytes = push + push.substr(header.size());
        c.detail = "two chunks";
        c.contains = {"malformed push/pull message: two chunks"};
        break;
      case 5: {  // a chunk whose length runs past the message
        bytes = header;
        bytes += '\x12';  // field 2, length-delimited
        const uint32_t length =
            Pick<uint32_t>({0xffffffffu, 0x7fffffffu, 0x80000000u, 1000,
                            static_cast<uint32_t>(Uniform(20, 100000))});
        for (uint32_t l = length; true; l >>= 7) {
          if (l < 0x80) {
            bytes += static_cast<char>(l);
            break;
          }
          bytes += static_cast<char>((l & 0x7f) | 0x80);
        }
        bytes += std::string("\x08\x00", 2);  // a varint field 1
        c.detail = absl::StrCat("chunk length ", length);
        c.contains = {"malformed push/pull message"};
        break;
      }
      case 6: {  // a data field longer than what follows
        TensorChunk chunk;
        chunk.mutable_key()->set_param_id(s.param_id);
        chunk.mutable_key()->set_chunk_index(s.chunk_index);
        chunk.set_dtype(DTYPE_FLOAT32);
        chunk.set_num_elements(s.num_elements);
        std::string meta = chunk.SerializeAsString();
        const std::string data = Bytes(Finite(s.num_elements));
        meta += '\x22';  // field 4, length-delimited
        meta += static_cast<char>(data.size() + Uniform(1, 40));
        meta += data;
        bytes = header + '\x12' + static_cast<char>(meta.size()) + meta;
        c.detail = "data length past the chunk";
        c.contains = {"malformed push/pull message: truncated data"};
        break;
      }
      case 7: {  // a header that is not a message
        bytes = "\x0a\x05\xff\xff\xff\xff\xff" + push.substr(header.size());
        c.detail = "header of bad varints";
        c.contains = {"malformed push/pull message: bad pstrain."};
        break;
      }
      default: {  // a chunk field with a truncated varint
        bytes = header + "\x12\x02\x08\xff";
        c.detail = "truncated varint in the chunk";
        c.contains = {"malformed push/pull message: bad chunk field"};
        break;
      }
    }
    c.messages.push_back(Raw(bytes));
    return c;
  }

  // Sync: a skipped push that cannot be taken (never a good one: that
  // would change the state).
  Case SkippedPush() {
    Case c("skipped push");
    const ChunkSpec& s = AnyChunk();
    PushPullRequest r = Header(AnyWorker());
    ::pstrain::SkippedPush* skip = r.mutable_skipped_push();
    skip->mutable_key()->set_param_id(s.param_id);
    skip->mutable_key()->set_chunk_index(s.chunk_index);
    skip->set_step(0);
    switch (Uniform(0, 3)) {
      case 0: {
        const int32_t i = NumChunks(s.param_id) +
                          static_cast<int32_t>(Uniform(0, kI32Max / 2));
        skip->mutable_key()->set_chunk_index(i);
        c.detail = "past the last chunk";
        c.contains = {ChunkText(s.param_id, i) + " is not owned"};
        break;
      }
      case 1: {
        skip->clear_key();  // (0, 0), step wrong
        skip->set_step(Pick<int64_t>({1, -1, kI64Max}));
        c.code = grpc::StatusCode::FAILED_PRECONDITION;
        c.detail = absl::StrCat("no key, step ", skip->step());
        c.contains = {absl::StrCat("skipped push of chunk (0, 0) for step ",
                                   skip->step())};
        break;
      }
      case 2: {
        r.mutable_header()->set_worker_id(-1 - AnyWorker());
        c.detail = "bad worker";
        c.contains = {absl::StrCat("worker id ", r.header().worker_id())};
        break;
      }
      default: {
        r.mutable_header()->set_generation(Uniform(1, 5));
        c.code = grpc::StatusCode::ABORTED;
        c.detail = "generation";
        c.contains = {"generation"};
        break;
      }
    }
    c.messages.push_back(EncodeSmallMessage(r));
    return c;
  }

  // Sync, while the shard collects the ends of `step` and `worker` has
  // pushed none of it: an end before pushing, or of another step.
  Case StepEnd(int64_t step, int worker) {
    Case c("step end");
    PushPullRequest r = Header(worker);
    ::pstrain::StepEnd* end = r.mutable_step_end();
    end->set_step(step);
    if (Uniform(0, 1) == 0) {
      end->mutable_nonfinite()->set_param_id(
          static_cast<int32_t>(Uniform(-5, 5)));
      end->mutable_nonfinite()->set_element(Uniform(kI64Min, kI64Max));
      end->mutable_nonfinite()->set_value(std::string(Uniform(0, 2000), 'x'));
    }
    if (Uniform(0, 1) == 0) {
      c.detail = absl::StrCat("worker ", worker, " ends step ", step,
                              " before pushing");
      c.contains = {absl::StrCat("worker ", worker, " ended step ", step,
                                 " on shard 0 before pushing chunk (")};
    } else {
      const int64_t bad = Pick<int64_t>(
          {step + 1, step - 1, step + 2, kI64Max, kI64Min, Uniform(-100, 100)});
      end->set_step(bad == step ? step + 3 : bad);
      c.code = grpc::StatusCode::FAILED_PRECONDITION;
      c.detail = absl::StrCat("worker ", worker, " ends step ", end->step());
      c.contains = {absl::StrCat("worker ", worker, " ended step ", end->step(),
                                 " but shard 0 is collecting the ends of step ",
                                 step)};
    }
    c.messages.push_back(EncodeSmallMessage(r));
    return c;
  }

  // A step verdict (proto/ps.proto StepVerdict) that cannot be taken
  // (never one of the step collected: that would change the state): a
  // later step's, a bad worker's, another generation's; async: any.
  Case StepVerdict(int64_t collecting) {
    Case c("step verdict");
    PushPullRequest r = Header(AnyWorker());
    const int64_t later = collecting + Uniform(1, 1000);
    r.mutable_step_verdict()->set_step(
        Pick<int64_t>({later, kI64Max, int64_t{1} << 40}));
    if (mode_ == SyncMode::kAsync) {
      c.code = grpc::StatusCode::FAILED_PRECONDITION;
      c.detail = "verdict in async mode";
      c.contains = {"verdicts are for sync mode"};
    } else if (Uniform(0, 3) == 0) {
      r.mutable_header()->set_worker_id(-1 - AnyWorker());
      c.detail = "bad worker";
      c.contains = {absl::StrCat("worker id ", r.header().worker_id())};
    } else if (Uniform(0, 2) == 0) {
      r.mutable_header()->set_generation(Uniform(1, 5));
      c.code = grpc::StatusCode::ABORTED;
      c.detail = "generation";
      c.contains = {"generation"};
    } else {
      c.code = grpc::StatusCode::FAILED_PRECONDITION;
      c.detail = absl::StrCat("step ", r.step_verdict().step());
      c.contains = {absl::StrCat("verdict of step ", r.step_verdict().step(),
                                 " on shard 0, which is collecting the ends "
                                 "of step ",
                                 collecting)};
    }
    c.messages.push_back(EncodeSmallMessage(r));
    return c;
  }

  Case AsyncStepEnd() {
    Case c("step end");
    PushPullRequest r = Header(AnyWorker());
    r.mutable_step_end()->set_step(Uniform(-3, 3));
    c.code = grpc::StatusCode::FAILED_PRECONDITION;
    c.detail = "step end in async mode";
    c.contains = {"runs in async mode"};
    c.messages.push_back(EncodeSmallMessage(r));
    return c;
  }

 private:
  const std::vector<ChunkSpec>& chunks_;
  const SyncMode mode_;
  std::mt19937& rng_;
  int64_t version_ = 0;
};

// Worker `worker`'s messages of a correct sync step `step`: a pull of
// step + 1 (first, as a worker sends it), every chunk, the step's end.
std::vector<grpc::ByteBuffer> CorrectStep(Battery& b,
                                          const std::vector<ChunkSpec>& chunks,
                                          int worker, int64_t step) {
  std::vector<grpc::ByteBuffer> messages;
  PushPullRequest pull = Header(worker);
  pull.mutable_pull()->set_min_version(step + 1);
  messages.push_back(EncodeSmallMessage(pull));
  for (const ChunkSpec& s : chunks) {
    messages.push_back(b.Push(Header(worker), s.param_id, s.chunk_index, step,
                              b.Finite(s.num_elements)));
  }
  PushPullRequest end = Header(worker);
  end.mutable_step_end()->set_step(step);
  messages.push_back(EncodeSmallMessage(end));
  return messages;
}

void ExpectVersions(const Model& model, int64_t version) {
  for (const auto& [key, v] : model.versions) {
    EXPECT_EQ(v, version) << ChunkText(key.first, key.second);
  }
}

void PrintCounts(const char* phase, const std::map<std::string, int>& counts) {
  int total = 0;
  std::string line;
  for (const auto& [kind, n] : counts) {
    total += n;
    absl::StrAppend(&line, " ", kind, "=", n);
  }
  std::printf("seed %u, %s: %d malformed messages:%s\n", kSeed, phase, total,
              line.c_str());
}

TEST(MalformedPushTest, SyncBatteryLeavesTheModelUnchangedAndServing) {
  std::mt19937 rng(kSeed);
  Ps ps(SyncMode::kSync, &rng);
  Battery b(ps.chunks(), SyncMode::kSync, &rng);
  ASSERT_EQ(ps.chunks().size(), 7u);
  const Model before = ps.PullAll(0, 0);
  ExpectVersions(before, 0);
  const ShardStats stats0 = ps.shard().Stats();
  EXPECT_EQ(stats0.pushes, 0);

  // Phase A: step 0, nothing pushed yet.
  std::vector<Case> cases;
  constexpr int kRounds = 85;  // 14 kinds each round
  for (int round = 0; round < kRounds; ++round) {
    cases.push_back(b.ChunkKey());
    cases.push_back(b.ElementCount());
    cases.push_back(b.PayloadSize());
    cases.push_back(b.Dtype());
    cases.push_back(b.Step(0));
    cases.push_back(b.WorkerId());
    cases.push_back(b.WorkerMidStream());
    cases.push_back(b.JobId());
    cases.push_back(b.Generation());
    cases.push_back(b.NonFinite());
    cases.push_back(round % 2 == 0 ? b.Truncated() : b.Garbage());
    cases.push_back(b.SkippedPush());
    cases.push_back(b.StepEnd(0, b.AnyWorker()));
    cases.push_back(b.StepVerdict(0));
    cases.push_back(b.Garbage());
  }
  std::map<std::string, int> counts;
  const absl::Time start = absl::Now();
  EXPECT_EQ(ps.Run(cases, "sync phase A", &counts), 0);
  PrintCounts("sync phase A", counts);
  const Model after_a = ps.PullAll(1, 0);
  EXPECT_EQ(after_a.All(), before.All())
      << "hash before " << before.Hash() << ", after " << after_a.Hash();
  ExpectVersions(after_a, 0);
  ShardStats stats = ps.shard().Stats();
  EXPECT_EQ(stats.pushes, 0);
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_EQ(stats.min_version, 0);

  // Phase B: worker 0 pushes every chunk of step 0 (pending: worker 1 has
  // not), then pushes twice; ends the step, then ends it twice.
  std::vector<grpc::ByteBuffer> w0 = CorrectStep(b, ps.chunks(), 0, 0);
  const std::vector<grpc::ByteBuffer> w0_pushes(w0.begin() + 1, w0.end() - 1);
  ASSERT_TRUE(ps.Exchange(w0_pushes).ok());
  cases.clear();
  counts.clear();
  for (int i = 0; i < 60; ++i) {
    const ChunkSpec& s = b.AnyChunk();
    Case c("push twice");
    c.detail = absl::StrCat("worker 0 ", ChunkText(s.param_id, s.chunk_index));
    c.contains = {absl::StrCat("worker 0 pushed ",
                               ChunkText(s.param_id, s.chunk_index),
                               " of step 0 twice")};
    if (i % 3 == 2) {
      PushPullRequest r = Header(0);
      r.mutable_skipped_push()->mutable_key()->set_param_id(s.param_id);
      r.mutable_skipped_push()->mutable_key()->set_chunk_index(s.chunk_index);
      c.messages.push_back(EncodeSmallMessage(r));
      c.detail += " (skipped)";
    } else {
      c.messages.push_back(b.GoodPush(0, s));
    }
    cases.push_back(std::move(c));
    cases.push_back(b.StepEnd(0, 1));  // worker 1 has pushed nothing
  }
  EXPECT_EQ(ps.Run(cases, "sync phase B (pushes twice)", &counts), 0);
  ASSERT_TRUE(ps.Exchange({w0.back()}).ok());  // worker 0's end of step 0
  cases.clear();
  for (int i = 0; i < 30; ++i) {
    Case c("step end twice");
    PushPullRequest r = Header(0);
    r.mutable_step_end()->set_step(0);
    c.detail = "worker 0 ends step 0 again";
    c.contains = {"worker 0 ended step 0 twice on shard 0"};
    c.messages.push_back(EncodeSmallMessage(r));
    cases.push_back(std::move(c));
    cases.push_back(b.Step(0));
  }
  EXPECT_EQ(ps.Run(cases, "sync phase B (step ends twice)", &counts), 0);
  PrintCounts("sync phase B", counts);
  const Model after_b = ps.PullAll(0, 0);
  EXPECT_EQ(after_b.All(), before.All())
      << "hash before " << before.Hash() << ", after " << after_b.Hash();
  ExpectVersions(after_b, 0);
  stats = ps.shard().Stats();
  EXPECT_EQ(stats.pushes, static_cast<int64_t>(ps.chunks().size()))
      << "only worker 0's well-formed pushes";
  EXPECT_EQ(stats.skipped, 0);
  std::printf("model hash %016llx unchanged after the battery\n",
              static_cast<unsigned long long>(before.Hash()));

  // Worker 1's correct step completes step 0 for both.
  std::vector<PushPullResponse> replies;
  const grpc::Status step =
      ps.Exchange(CorrectStep(b, ps.chunks(), 1, 0), &replies);
  ASSERT_TRUE(step.ok()) << step.error_message();
  int pulled = 0;
  for (const PushPullResponse& r : replies) {
    if (!r.has_chunk()) continue;
    ++pulled;
    EXPECT_EQ(r.chunk().version(), 1);
  }
  EXPECT_EQ(pulled, static_cast<int>(ps.chunks().size()));
  ASSERT_FALSE(replies.empty());
  EXPECT_TRUE(replies.back().last_of_pull());
  EXPECT_FALSE(replies.back().has_skipped_step());
  const Model stepped = ps.PullAll(0, 1);
  ExpectVersions(stepped, 1);
  for (const auto& [key, bytes] : stepped.bytes) {
    EXPECT_NE(bytes, before.bytes.at(key)) << ChunkText(key.first, key.second);
  }
  stats = ps.shard().Stats();
  EXPECT_EQ(stats.pushes, 2 * static_cast<int64_t>(ps.chunks().size()));
  EXPECT_EQ(stats.min_version, 1);
  EXPECT_EQ(stats.skipped, 0);

  // Phase C, at version 1: past and future steps, stale ends, and the rest.
  b.set_version(1);
  cases.clear();
  counts.clear();
  for (int i = 0; i < 12; ++i) {
    cases.push_back(b.Step(1));
    cases.push_back(b.StepEnd(1, b.AnyWorker()));
    cases.push_back(b.StepVerdict(1));
    cases.push_back(b.NonFinite());
    cases.push_back(b.Generation());
    cases.push_back(b.Truncated());
  }
  EXPECT_EQ(ps.Run(cases, "sync phase C", &counts), 0);
  PrintCounts("sync phase C", counts);
  const Model after_c = ps.PullAll(1, 1);
  EXPECT_EQ(after_c.All(), stepped.All());
  ExpectVersions(after_c, 1);
  EXPECT_EQ(ps.shard().Stats().pushes,
            2 * static_cast<int64_t>(ps.chunks().size()));
  std::printf("sync: %.1f s\n", absl::ToDoubleSeconds(absl::Now() - start));
}

TEST(MalformedPushTest, AsyncBatteryLeavesTheModelUnchangedAndServing) {
  std::mt19937 rng(kSeed + 1);
  Ps ps(SyncMode::kAsync, &rng);
  Battery b(ps.chunks(), SyncMode::kAsync, &rng);
  const Model before = ps.PullAll(0, 0);
  std::vector<Case> cases;
  for (int round = 0; round < 25; ++round) {
    cases.push_back(b.ChunkKey());
    cases.push_back(b.ElementCount());
    cases.push_back(b.PayloadSize());
    cases.push_back(b.Dtype());
    cases.push_back(b.WorkerId());
    cases.push_back(b.WorkerMidStream());
    cases.push_back(b.JobId());
    cases.push_back(b.Generation());
    cases.push_back(b.NonFinite());
    cases.push_back(b.Truncated());
    cases.push_back(b.Garbage());
    cases.push_back(b.AsyncStepEnd());
    cases.push_back(b.StepVerdict(0));
  }
  std::map<std::string, int> counts;
  EXPECT_EQ(ps.Run(cases, "async", &counts), 0);
  PrintCounts("async", counts);
  const Model after = ps.PullAll(1, 0);
  EXPECT_EQ(after.All(), before.All())
      << "hash before " << before.Hash() << ", after " << after.Hash();
  ExpectVersions(after, 0);
  ShardStats stats = ps.shard().Stats();
  EXPECT_EQ(stats.pushes, 0);
  EXPECT_EQ(stats.skipped, 0);

  // Every worker pushes every chunk once: applied at once.
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<grpc::ByteBuffer> pushes;
    for (const ChunkSpec& s : ps.chunks()) pushes.push_back(b.GoodPush(w, s));
    ASSERT_TRUE(ps.Exchange(pushes).ok());
  }
  const Model stepped = ps.PullAll(0, 0);
  ExpectVersions(stepped, kWorkers);
  for (const auto& [key, bytes] : stepped.bytes) {
    EXPECT_NE(bytes, before.bytes.at(key)) << ChunkText(key.first, key.second);
  }
  EXPECT_EQ(ps.shard().Stats().pushes,
            kWorkers * static_cast<int64_t>(ps.chunks().size()));
}

}  // namespace
}  // namespace pstrain
