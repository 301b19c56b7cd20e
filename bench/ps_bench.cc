// ps_bench: push+pull of a model between --workers workers (1 by default)
// and --shards PS shards (1 and 2 by default) on loopback, against plain TCP
// sockets moving the same bytes in the same run.
//
// One "step" pushes every gradient of the model and pulls every weight back,
// as a sync training step does: with W workers each pushes the same
// gradients and pulls the same weights, and the shards average the W pushes
// and apply Adam in between, so a step moves W times the bytes and the
// shards' aggregation (and their reply to every worker) is timed with it.
// The TCP baseline sends the model's fp32 bytes to a socket server and
// reads them back over one connection per worker, all at once. Rows:
// plaintext and mutual TLS in fp32, and plaintext with each 16-bit
// --wire_dtypes (common/wire_dtype.h) and each --compressions (top-k pushes
// with error feedback, worker/topk_compression.h, in each
// --topk_wire_dtypes: fp32, or 16-bit as "bf16+topk:R", whose rounding is
// fed back too; the shards
// apply plain SGD there, as under Deep Gradient Compression's momentum
// correction, and each compression is timed with whole pulls and with delta
// pulls, "+delta": the changed entries only, PsClientOptions::delta_pulls),
// each for every
// --channels_per_shard (gRPC connections per shard, worker/ps_client.h).
//   ch         = channels (connections) per shard
//   wire (MB)  = bytes of the step's PushPull messages, both ways, as the
//                client counts them (payload, sparse indices and protobuf
//                envelope; gRPC's HTTP/2 framing and TLS not counted),
//                10^6 bytes per MB
//   W          = workers
//   GB/s       = useful payload: 2 * W * model fp32 bytes / time (10^9
//                bytes per GB), the same work whatever the wire format;
//                time is a step's, from the first worker's start to the
//                last one's end
//   ratio      = TCP time / PS time (1.0: as fast as raw TCP)
//   #wrong: elements of the pulled weights (every worker's) that differ
//           from a local Adam
//           (top-k rows: SGD) replica given the same gradients, rounded per
//           chunk as the wire rounds them (RoundThroughWire), or sparsified as
//           a top-k row's worker does (its own TopKCompressor, error feedback
//           carried over the steps), and pulled the same way (0 expected).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/malloc_tuning.h"
#include "common/partition.h"
#include "common/rpc_options.h"
#include "common/tls.h"
#include "common/trace.h"
#include "common/wire_dtype.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "server/local_shards.h"
#include "worker/ps_client.h"
#include "worker/topk_compression.h"

ABSL_FLAG(int64_t, model_bytes, 100'000'000, "Model size in bytes (fp32).");
ABSL_FLAG(int64_t, tensor_bytes, 4'000'000, "Size of each model tensor.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20, "Chunk bound, bytes.");
ABSL_FLAG(int, repeats, 5, "Timed steps per configuration (median shown).");
ABSL_FLAG(std::vector<std::string>, wire_dtypes,
          std::vector<std::string>({"bf16"}),
          "16-bit wire formats to time beside fp32 (plaintext): bf16, fp16; "
          "empty: none.");
ABSL_FLAG(bool, tls, true,
          "Also time each shard count over mutual TLS (common/tls.h), with "
          "its ratio to plaintext.");
ABSL_FLAG(std::vector<std::string>, shards,
          std::vector<std::string>({"1", "2"}),
          "Comma-separated PS shard counts to time, each in its own run.");
ABSL_FLAG(std::vector<std::string>, workers, std::vector<std::string>({"1"}),
          "Comma-separated worker counts to time (sync, each worker in a "
          "thread of its own with its own connections), 1 to 16.");
ABSL_FLAG(std::vector<std::string>, channels_per_shard,
          std::vector<std::string>({"1", "2", "4"}),
          "Comma-separated gRPC channels (TCP connections) per shard to time "
          "for each shard count, 1 to 16 (worker/ps_client.h).");
ABSL_FLAG(bool, malloc_defaults, false,
          "Keep glibc's malloc thresholds instead of pstrain's "
          "(common/malloc_tuning.h, as pstrain_ps and pstrain_worker set "
          "them), to measure what they change.");
ABSL_FLAG(int, sync_server_queues, 0,
          "The shards' gRPC completion queues, N to 2N pollers each run "
          "(common/grpc_server.h ServerLimits::sync_server_queues), 0 to 64; "
          "0: gRPC's defaults.");
ABSL_FLAG(std::string, trace_file, "",
          "Write the run's trace events (common/trace.h: the worker's "
          "pushes and pulls, the shards' pushes, updates and barrier "
          "waits, each with its step) to this Chrome trace JSON file; "
          "empty: no trace.");
ABSL_FLAG(std::vector<std::string>, topk_wire_dtypes,
          std::vector<std::string>({"fp32"}),
          "Wire dtypes of the top-k rows (--compressions): fp32, bf16, fp16; "
          "a 16-bit one's rows are named e.g. bf16+topk:0.01.");
ABSL_FLAG(std::vector<std::string>, compressions,
          std::vector<std::string>({"topk:0.01"}),
          "Top-k compressions (with error feedback) to time beside fp32 "
          "(plaintext), e.g. topk:0.01,topk:0.1; empty: none.");

namespace pstrain {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Reads exactly `bytes` bytes from `fd` into `data`; false if the
// connection ends or fails first.
bool ReadAll(int fd, char* data, int64_t bytes) {
  for (int64_t got = 0; got < bytes;) {
    const ssize_t n = read(fd, data + got, bytes - got);
    if (n <= 0) return false;
    got += n;
  }
  return true;
}

// Writes the `bytes` bytes at `data` to `fd`; false if it fails first.
bool WriteAll(int fd, const char* data, int64_t bytes) {
  for (int64_t sent = 0; sent < bytes;) {
    const ssize_t n = write(fd, data + sent, bytes - sent);
    if (n <= 0) return false;
    sent += n;
  }
  return true;
}

// Sends `bytes` to a loopback echo server and reads them back over each of
// `connections` connections at once; seconds per round (until the last
// connection has its bytes back).
std::vector<double> TimeTcp(int64_t bytes, int repeats, int connections) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, connections);
  // The echo side: one thread per connection.
  std::vector<std::thread> servers;
  for (int c = 0; c < connections; ++c) {
    servers.emplace_back([&, bytes] {
      const int fd = accept(listener, nullptr, nullptr);
      std::vector<char> buffer(bytes);
      for (int r = 0; r < repeats + 1; ++r) {
        if (!ReadAll(fd, buffer.data(), bytes) ||
            !WriteAll(fd, buffer.data(), bytes)) {
          return;
        }
      }
      close(fd);
    });
  }
  std::vector<int> fds(connections);
  for (int& fd : fds) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  std::vector<char> out(bytes, 1);
  std::vector<std::vector<char>> in(connections, std::vector<char>(bytes));
  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    const absl::Time start = absl::Now();
    std::vector<std::thread> clients;
    for (int c = 0; c < connections; ++c) {
      clients.emplace_back([&, c] {
        const int fd = fds[c];
        std::thread writer([&] { WriteAll(fd, out.data(), bytes); });
        ReadAll(fd, in[c].data(), bytes);
        writer.join();
      });
    }
    for (std::thread& t : clients) t.join();
    if (r > 0) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  for (int fd : fds) close(fd);
  for (std::thread& t : servers) t.join();
  close(listener);
  return times;
}

struct PsRun {
  std::vector<double> seconds;
  int64_t wrong = 0;
  // Bytes of the last timed step's messages, both ways.
  int64_t wire_bytes = 0;
};

// Exits 1 with `what` and `status` unless it is OK.
void CheckOk(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "ps_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

// `tls`: mutual TLS between the workers and the shards (common/tls.h), or
// plaintext (tls.insecure). `workers` workers, each a PsClient driven by a
// thread of its own, push the same gradients in sync mode.
PsRun TimePs(int num_shards, int workers, const std::vector<int64_t>& sizes,
             int64_t partition_bytes, int repeats, const TlsOptions& tls,
             DType wire_dtype, int channels,
             const CompressionOptions& compression = {},
             bool delta_pulls = false) {
  PsRun run;
  // Top-k: plain SGD, whose update changes only the pushed entries (what
  // delta pulls need; DGC's shards with momentum correction).
  OptimizerOptions optimizer = AdamOptions();
  if (compression.enabled()) {
    optimizer.kind = OptimizerKind::kSgd;
    optimizer.lr = 0.01f;
  }
  ShardOptions shard_options;
  shard_options.adam = optimizer;
  shard_options.num_workers = workers;
  ServerLimits limits;
  limits.sync_server_queues = absl::GetFlag(FLAGS_sync_server_queues);
  LocalShards shards(num_shards, shard_options, tls, limits);
  auto plan = PartitionPlan::Create(sizes, partition_bytes, num_shards);
  // Each worker's compressor, and the replica's (the same selection, by the
  // same code, on the same sums: every worker selects alike).
  std::vector<std::unique_ptr<TopKCompressor>> topk;
  std::unique_ptr<TopKCompressor> reference;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < workers; ++w) {
    PsClientOptions client_options;
    client_options.addresses = shards.addresses();
    client_options.worker_id = w;
    client_options.wire_dtype = wire_dtype;
    client_options.channels_per_shard = channels;
    client_options.delta_pulls = delta_pulls;
    if (compression.enabled()) {
      topk.push_back(std::make_unique<TopKCompressor>(compression, sizes, 3));
      client_options.compressor = topk.back().get();
    }
    if (!tls.insecure) {
      auto credentials = ChannelCredentials(
          tls, TlsIdentity{TlsRole::kWorker, w, shard_options.job_id});
      CheckOk(credentials.status(), "worker credentials");
      client_options.credentials = *credentials;
    }
    auto client = PsClient::Create(client_options, *plan);
    CheckOk(client.status(), "worker client");
    clients.push_back(*std::move(client));
  }
  if (compression.enabled()) {
    reference = std::make_unique<TopKCompressor>(compression, sizes, 3);
  }
  std::vector<std::vector<float>> grads, replica, m, v;
  // Per worker: its weights, as pulled.
  std::vector<std::vector<std::vector<float>>> weights(workers);
  // The average of the workers' gradients as the shards receive them
  // (rounded chunk by chunk) and sum them (in worker-id order, then scaled
  // by 1/W: ParameterShard::AverageInto).
  std::vector<std::vector<float>> wire_grads;
  std::vector<absl::Span<const float>> grad_spans;
  for (size_t p = 0; p < sizes.size(); ++p) {
    std::vector<float> initial(sizes[p]);
    grads.emplace_back(sizes[p]);
    for (int64_t i = 0; i < sizes[p]; ++i) {
      initial[i] = 0.001f * static_cast<float>((i * 31 + p) % 1000);
      grads[p][i] = 0.01f * static_cast<float>((i * 17 + p) % 200 - 100);
    }
    for (int w = 0; w < workers; ++w) weights[w].push_back(initial);
    replica.push_back(initial);
    wire_grads.push_back(grads[p]);
    m.emplace_back(sizes[p], 0.0f);
    v.emplace_back(sizes[p], 0.0f);
    grad_spans.push_back(absl::MakeConstSpan(grads[p]));
  }
  std::vector<std::vector<absl::Span<float>>> weight_spans(workers);
  for (int w = 0; w < workers; ++w) {
    for (std::vector<float>& p : weights[w]) {
      weight_spans[w].push_back(absl::MakeSpan(p));
    }
  }
  std::vector<absl::Span<const float>> init(weight_spans[0].begin(),
                                            weight_spans[0].end());
  CheckOk(clients[0]->Initialize(init), "init");
  for (const std::unique_ptr<PsClient>& client : clients) {
    CheckOk(client->WaitReady(absl::Seconds(10)), "init");
  }
  // The average of W equal gradients, as the shards compute it.
  auto average = [workers](absl::Span<float> g) {
    if (workers == 1) return;
    const float scale = 1.0f / static_cast<float>(workers);
    for (float& x : g) {
      float sum = x;
      for (int w = 1; w < workers; ++w) sum += x;
      x = sum * scale;
    }
  };
  for (const ChunkSpec& chunk : plan->chunks()) {
    const absl::Span<float> g = absl::MakeSpan(wire_grads[chunk.param_id])
                                    .subspan(chunk.offset, chunk.num_elements);
    RoundThroughWire(wire_dtype, g);
    average(g);
  }
  int64_t version = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    // Every worker's step at once: started together, timed from the first
    // start to the last end.
    std::vector<absl::Time> starts(workers), ends(workers);
    std::vector<absl::StatusOr<int64_t>> pulled(workers, int64_t{0});
    absl::Barrier* start_together = new absl::Barrier(workers);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        if (start_together->Block()) delete start_together;
        starts[w] = absl::Now();
        if (!topk.empty()) topk[w]->BeginStep(version);
        pulled[w] = clients[w]->PushPull(version, grad_spans, version + 1, 0,
                                         weight_spans[w]);
        ends[w] = absl::Now();
        if (!topk.empty()) topk[w]->CommitStep(version);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < workers; ++w) CheckOk(pulled[w].status(), "step");
    const double seconds =
        absl::ToDoubleSeconds(*std::max_element(ends.begin(), ends.end()) -
                              *std::min_element(starts.begin(), starts.end()));
    if (reference != nullptr) {
      // This step's sparse gradient, as the shards densify and average it.
      reference->BeginStep(version);
      std::vector<uint32_t> indices;
      std::vector<float> values;
      for (const ChunkSpec& chunk : plan->chunks()) {
        reference->Compress(chunk.param_id, chunk.offset,
                            absl::MakeConstSpan(grads[chunk.param_id])
                                .subspan(chunk.offset, chunk.num_elements),
                            &indices, &values, wire_dtype);
        RoundThroughWire(wire_dtype, absl::MakeSpan(values));
        float* out = wire_grads[chunk.param_id].data() + chunk.offset;
        std::fill(out, out + chunk.num_elements, 0.0f);
        for (size_t i = 0; i < indices.size(); ++i) {
          out[indices[i]] = values[i];
        }
        average(absl::MakeSpan(out, chunk.num_elements));
      }
      reference->CommitStep(version);
    }
    version = *pulled[0];
    if (r > 0) run.seconds.push_back(seconds);
    run.wire_bytes = 0;
    for (const std::unique_ptr<PsClient>& client : clients) {
      const PsStepTimes& times = client->last_step_times();
      run.wire_bytes += times.bytes_pushed + times.bytes_pulled;
    }
    for (size_t p = 0; p < sizes.size(); ++p) {
      OptimizerUpdate(optimizer, version, replica[p].data(),
                      wire_grads[p].data(), m[p].data(), v[p].data(), sizes[p]);
    }
  }
  for (const ChunkSpec& chunk : plan->chunks()) {
    RoundThroughWire(wire_dtype,
                     absl::MakeSpan(replica[chunk.param_id])
                         .subspan(chunk.offset, chunk.num_elements));
  }
  for (int w = 0; w < workers; ++w) {
    for (size_t p = 0; p < sizes.size(); ++p) {
      for (int64_t i = 0; i < sizes[p]; ++i) {
        if (replica[p][i] != weights[w][p][i]) ++run.wrong;
      }
    }
  }
  for (const std::unique_ptr<PsClient>& client : clients) (void)client->Done();
  return run;
}

// --compressions, parsed; exits 2 naming a bad entry.
std::vector<CompressionOptions> CompressionsFromFlag() {
  std::vector<CompressionOptions> compressions;
  for (const std::string& spelling : absl::GetFlag(FLAGS_compressions)) {
    absl::StatusOr<CompressionOptions> c = ParseCompression(spelling);
    if (!c.ok() || !c->enabled()) {
      std::fprintf(stderr,
                   "ps_bench: --compressions: '%s'; expected topk:R with 0 < "
                   "R <= 1 (uncompressed rows are always timed)\n",
                   spelling.c_str());
      std::exit(2);
    }
    compressions.push_back(*c);
  }
  return compressions;
}

// A list of counts from 1 to `max` (--shards, --channels_per_shard);
// exits 2 naming a bad entry.
std::vector<int> CountsFromFlag(const std::vector<std::string>& values,
                                const char* flag, const char* noun, int max) {
  std::vector<int> counts;
  for (const std::string& s : values) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1 || n > max) {
      std::fprintf(stderr,
                   "ps_bench: --%s: '%s' is not a %s count; expected whole "
                   "numbers from 1 to %d, e.g. --%s=1,2,4\n",
                   flag, s.c_str(), noun, max, flag);
      std::exit(2);
    }
    counts.push_back(n);
  }
  return counts;
}

// --topk_wire_dtypes, parsed; exits 2 naming a bad entry.
std::vector<DType> TopKWireDtypesFromFlag() {
  std::vector<DType> wire_dtypes;
  for (const std::string& spelling : absl::GetFlag(FLAGS_topk_wire_dtypes)) {
    absl::StatusOr<DType> dtype =
        ParseWireDtype(spelling, "--topk_wire_dtypes");
    if (!dtype.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n",
                   std::string(dtype.status().message()).c_str());
      std::exit(2);
    }
    wire_dtypes.push_back(*dtype);
  }
  return wire_dtypes;
}

// --wire_dtypes, parsed; exits 2 naming a bad entry.
std::vector<DType> WireDtypesFromFlag() {
  std::vector<DType> wire_dtypes;
  for (const std::string& spelling : absl::GetFlag(FLAGS_wire_dtypes)) {
    absl::StatusOr<DType> dtype = ParseWireDtype(spelling, "--wire_dtypes");
    if (!dtype.ok() || *dtype == DTYPE_FLOAT32) {
      std::fprintf(stderr,
                   "ps_bench: --wire_dtypes: '%s'; expected bf16 or fp16 (fp32 "
                   "rows are always timed)\n",
                   spelling.c_str());
      std::exit(2);
    }
    wire_dtypes.push_back(*dtype);
  }
  return wire_dtypes;
}

// Certificates for the TLS rows: a fresh CA in a private folder, which
// `tls` then names; exits 1 if they cannot be made.
std::unique_ptr<PrivateFolder> MakeTlsFolder(TlsOptions* tls, int workers) {
  auto made = PrivateFolder::Create("ps_bench-tls");
  std::vector<TlsIdentity> ids;
  for (int w = 0; w < workers; ++w) {
    ids.push_back(TlsIdentity{TlsRole::kWorker, w, "local"});
  }
  for (int s = 0; s < 64; ++s) {
    ids.push_back(TlsIdentity{TlsRole::kPs, s, "local"});
  }
  if (!made.ok() || !MakeCertificates((*made)->path(), ids).ok()) {
    std::fprintf(stderr, "ps_bench: cannot make the TLS certificates\n");
    std::exit(1);
  }
  tls->dir = (*made)->path();
  return *std::move(made);
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ps_bench [--flags]: push+pull of a model between --workers workers "
      "and --shards PS shards on loopback, against plain TCP sockets.");
  pstrain::ParseFlagsOrExit(argc, argv, "ps_bench", "ps_bench --help");
  // As pstrain_ps and pstrain_worker do, unless asked for glibc's defaults.
  if (!absl::GetFlag(FLAGS_malloc_defaults) &&
      !pstrain::KeepFreedMemoryForReuse()) {
    std::fprintf(stderr, "ps_bench: glibc refused the malloc thresholds\n");
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_trace_file); !path.empty()) {
    pstrain::trace::TraceOptions trace;
    trace.path = path;
    trace.process_name = "ps_bench";
    trace.flush_interval = absl::ZeroDuration();
    if (absl::Status started = pstrain::trace::Start(trace); !started.ok()) {
      std::fprintf(stderr, "ps_bench: --trace_file: %s\n",
                   started.ToString().c_str());
      return 2;
    }
  }
  const std::vector<int> shard_counts = pstrain::CountsFromFlag(
      absl::GetFlag(FLAGS_shards), "shards", "shard", 64);
  const std::vector<int> worker_counts = pstrain::CountsFromFlag(
      absl::GetFlag(FLAGS_workers), "workers", "worker", 16);
  const std::vector<int> channel_counts = pstrain::CountsFromFlag(
      absl::GetFlag(FLAGS_channels_per_shard), "channels_per_shard", "channel",
      pstrain::kMaxChannelsPerShard);
  if (const int q = absl::GetFlag(FLAGS_sync_server_queues); q < 0 || q > 64) {
    std::fprintf(stderr,
                 "ps_bench: --sync_server_queues=%d: expected 0 (gRPC's "
                 "defaults) to 64\n",
                 q);
    return 2;
  }
  if (absl::GetFlag(FLAGS_model_bytes) < 4 ||
      absl::GetFlag(FLAGS_tensor_bytes) < 4) {
    std::fprintf(stderr,
                 "ps_bench: --model_bytes and --tensor_bytes: expected at "
                 "least 4 bytes (one fp32)\n");
    return 2;
  }
  const std::vector<pstrain::DType> wire_dtypes = pstrain::WireDtypesFromFlag();
  const std::vector<pstrain::DType> topk_wires =
      pstrain::TopKWireDtypesFromFlag();
  const int64_t model_bytes = absl::GetFlag(FLAGS_model_bytes);
  const int64_t tensor_bytes = absl::GetFlag(FLAGS_tensor_bytes);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<int64_t> sizes;
  for (int64_t left = model_bytes / 4; left > 0; left -= tensor_bytes / 4) {
    sizes.push_back(std::min(left, tensor_bytes / 4));
  }
  std::printf(
      "# ps_bench: push+pull of a %lld-byte model (%zu tensors) by each "
      "worker, sync, loopback, median of %d steps\n",
      static_cast<long long>(model_bytes), sizes.size(), repeats);
  std::unique_ptr<pstrain::PrivateFolder> folder;
  pstrain::TlsOptions tls;
  if (absl::GetFlag(FLAGS_tls)) {
    folder = pstrain::MakeTlsFolder(
        &tls, *std::max_element(worker_counts.begin(), worker_counts.end()));
  }
  const std::vector<pstrain::CompressionOptions> compressions =
      pstrain::CompressionsFromFlag();
  if (const int q = absl::GetFlag(FLAGS_sync_server_queues); q > 0) {
    std::printf(
        "# shards' gRPC servers: %d completion queues, %d to %d "
        "pollers\n",
        q, q, 2 * q);
  }
  std::printf("# %12s %3s %7s %3s %-12s %-20s %10s %10s %8s %10s %11s %7s\n",
              "payload", "W", "shards", "ch", "transport", "wire", "time",
              "wire", "GB/s", "ratio", "TLS ratio", "#wrong");
  std::printf("# %12s %3s %7s %3s %-12s %-20s %10s %10s %8s %10s %11s %7s\n",
              "(B)", "", "", "", "", "", "(ms)", "(MB)", "", "(vs TCP)",
              "(vs plain)", "");
  const int64_t partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  for (int workers : worker_counts) {
    const double tcp_median =
        pstrain::Median(pstrain::TimeTcp(model_bytes, repeats, workers));
    const auto row = [&](const std::string& shards, const std::string& channels,
                         const char* transport, const std::string& wire,
                         double seconds, int64_t wire_bytes,
                         const std::string& tls_ratio,
                         const std::string& wrong) {
      std::printf(
          "  %12lld %3d %7s %3s %-12s %-20s %10.1f %10.1f %8.2f %10.2f %11s "
          "%7s\n",
          static_cast<long long>(model_bytes), workers, shards.c_str(),
          channels.c_str(), transport, wire.c_str(), seconds * 1e3,
          static_cast<double>(wire_bytes) / 1e6,
          2.0 * workers * model_bytes / seconds / 1e9, tcp_median / seconds,
          tls_ratio.c_str(), wrong.c_str());
      std::fflush(stdout);
    };
    row("-", "1", "raw TCP", "fp32", tcp_median, 2 * workers * model_bytes, "-",
        "-");
    for (int shards : shard_counts) {
      const std::string count = absl::StrCat(shards);
      for (int channels : channel_counts) {
        const std::string ch = absl::StrCat(channels);
        const pstrain::PsRun run = pstrain::TimePs(
            shards, workers, sizes, partition_bytes, repeats,
            pstrain::InsecureTlsOptions(), pstrain::DTYPE_FLOAT32, channels);
        const double median = pstrain::Median(run.seconds);
        row(count, ch, "pstrain", "fp32", median, run.wire_bytes, "-",
            absl::StrCat(run.wrong));
        if (folder != nullptr) {
          const pstrain::PsRun secure =
              pstrain::TimePs(shards, workers, sizes, partition_bytes, repeats,
                              tls, pstrain::DTYPE_FLOAT32, channels);
          const double secure_median = pstrain::Median(secure.seconds);
          row(count, ch, "pstrain+mTLS", "fp32", secure_median,
              secure.wire_bytes,
              absl::StrFormat("%.2f", median / secure_median),
              absl::StrCat(secure.wrong));
        }
        for (pstrain::DType dtype : wire_dtypes) {
          const pstrain::PsRun half =
              pstrain::TimePs(shards, workers, sizes, partition_bytes, repeats,
                              pstrain::InsecureTlsOptions(), dtype, channels);
          row(count, ch, "pstrain", pstrain::WireDtypeSpelling(dtype),
              pstrain::Median(half.seconds), half.wire_bytes, "-",
              absl::StrCat(half.wrong));
        }
        // Top-k in each --topk_wire_dtypes (a 16-bit one's values
        // rounded, the rounding fed back).
        for (const pstrain::CompressionOptions& c : compressions) {
          for (pstrain::DType dtype : topk_wires) {
            for (bool delta : {false, true}) {
              const pstrain::PsRun sparse = pstrain::TimePs(
                  shards, workers, sizes, partition_bytes, repeats,
                  pstrain::InsecureTlsOptions(), dtype, channels, c, delta);
              const std::string wire =
                  dtype == pstrain::DTYPE_FLOAT32
                      ? ""
                      : absl::StrCat(pstrain::WireDtypeSpelling(dtype), "+");
              row(count, ch, "pstrain",
                  wire + pstrain::CompressionSpelling(c) +
                      (delta ? "+delta" : ""),
                  pstrain::Median(sparse.seconds), sparse.wire_bytes, "-",
                  absl::StrCat(sparse.wrong));
            }
          }
        }
      }
    }
  }
  if (absl::Status stopped = pstrain::trace::Stop(); !stopped.ok()) {
    std::fprintf(stderr, "ps_bench: --trace_file: %s\n",
                 stopped.ToString().c_str());
    return 1;
  }
  return 0;
}
