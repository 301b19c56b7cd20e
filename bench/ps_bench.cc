// ps_bench: push+pull of a model between one worker and --shards PS shards
// (1 and 2 by default) on loopback, against plain TCP sockets moving the same
// bytes in the same run.
//
// One "step" pushes every gradient of the model and pulls every weight back,
// as a training step does; the shards apply Adam in between. The TCP
// baseline sends the model's fp32 bytes to a socket server and reads them
// back over one connection. Rows: plaintext and mutual TLS in fp32, and
// plaintext with each 16-bit --wire_dtypes (common/wire_dtype.h) and each
// --compressions (top-k pushes with error feedback,
// worker/topk_compression.h; the shards apply plain SGD there, as under
// Deep Gradient Compression's momentum correction, and each compression
// is timed with whole pulls and with delta pulls, "+delta": the changed
// entries only, PsClientOptions::delta_pulls), each for every
// --channels_per_shard (gRPC connections per shard, worker/ps_client.h).
//   ch         = channels (connections) per shard
//   wire (MB)  = bytes of the step's PushPull messages, both ways, as the
//                client counts them (payload, sparse indices and protobuf
//                envelope; gRPC's HTTP/2 framing and TLS not counted),
//                10^6 bytes per MB
//   GB/s       = useful payload: 2 * model fp32 bytes / time (10^9 bytes
//                per GB), the same work whatever the wire format
//   ratio      = TCP time / PS time (1.0: as fast as raw TCP)
//   #wrong: elements of the pulled weights that differ from a local Adam
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

// Sends `bytes` to a loopback echo server and reads them back; seconds.
std::vector<double> TimeTcp(int64_t bytes, int repeats) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  std::vector<char> server_buffer(bytes);
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    for (int r = 0; r < repeats + 1; ++r) {
      int64_t got = 0;
      while (got < bytes) {
        const ssize_t n = read(fd, server_buffer.data() + got, bytes - got);
        if (n <= 0) return;
        got += n;
      }
      int64_t sent = 0;
      while (sent < bytes) {
        const ssize_t n = write(fd, server_buffer.data() + sent, bytes - sent);
        if (n <= 0) return;
        sent += n;
      }
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  std::vector<char> buffer(bytes, 1);
  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    const absl::Time start = absl::Now();
    std::thread writer([&] {
      int64_t sent = 0;
      while (sent < bytes) {
        const ssize_t n = write(fd, buffer.data() + sent, bytes - sent);
        if (n <= 0) return;
        sent += n;
      }
    });
    std::vector<char> in(bytes);
    int64_t got = 0;
    while (got < bytes) {
      const ssize_t n = read(fd, in.data() + got, bytes - got);
      if (n <= 0) break;
      got += n;
    }
    writer.join();
    if (r > 0) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  close(fd);
  server.join();
  close(listener);
  return times;
}

struct PsRun {
  std::vector<double> seconds;
  int64_t wrong = 0;
  // Bytes of the last timed step's messages, both ways.
  int64_t wire_bytes = 0;
};

// `tls`: mutual TLS between the worker and the shards (common/tls.h), or
// plaintext (tls.insecure).
PsRun TimePs(int num_shards, const std::vector<int64_t>& sizes,
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
  ServerLimits limits;
  limits.sync_server_queues = absl::GetFlag(FLAGS_sync_server_queues);
  LocalShards shards(num_shards, shard_options, tls, limits);
  auto plan = PartitionPlan::Create(sizes, partition_bytes, num_shards);
  PsClientOptions client_options;
  client_options.addresses = shards.addresses();
  client_options.wire_dtype = wire_dtype;
  client_options.channels_per_shard = channels;
  client_options.delta_pulls = delta_pulls;
  // The worker's compressor, and the replica's (the same selection, by the
  // same code, on the same sums).
  std::unique_ptr<TopKCompressor> topk, reference;
  if (compression.enabled()) {
    topk = std::make_unique<TopKCompressor>(compression, sizes, 3);
    reference = std::make_unique<TopKCompressor>(compression, sizes, 3);
    client_options.compressor = topk.get();
  }
  if (!tls.insecure) {
    auto credentials = ChannelCredentials(
        tls, TlsIdentity{TlsRole::kWorker, 0, shard_options.job_id});
    if (!credentials.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n",
                   credentials.status().ToString().c_str());
      std::exit(1);
    }
    client_options.credentials = *credentials;
  }
  auto client = PsClient::Create(client_options, *plan);
  if (!client.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<std::vector<float>> weights, grads, replica, m, v;
  // The gradients as the shards receive them: rounded chunk by chunk.
  std::vector<std::vector<float>> wire_grads;
  std::vector<absl::Span<float>> weight_spans;
  std::vector<absl::Span<const float>> grad_spans;
  for (size_t p = 0; p < sizes.size(); ++p) {
    weights.emplace_back(sizes[p]);
    grads.emplace_back(sizes[p]);
    for (int64_t i = 0; i < sizes[p]; ++i) {
      weights[p][i] = 0.001f * static_cast<float>((i * 31 + p) % 1000);
      grads[p][i] = 0.01f * static_cast<float>((i * 17 + p) % 200 - 100);
    }
    replica.push_back(weights[p]);
    wire_grads.push_back(grads[p]);
    m.emplace_back(sizes[p], 0.0f);
    v.emplace_back(sizes[p], 0.0f);
    weight_spans.push_back(absl::MakeSpan(weights[p]));
    grad_spans.push_back(absl::MakeConstSpan(grads[p]));
  }
  std::vector<absl::Span<const float>> init(weight_spans.begin(),
                                            weight_spans.end());
  if (!(*client)->Initialize(init).ok() ||
      !(*client)->WaitReady(absl::Seconds(10)).ok()) {
    std::fprintf(stderr, "ps_bench: init failed\n");
    std::exit(1);
  }
  for (const ChunkSpec& chunk : plan->chunks()) {
    RoundThroughWire(wire_dtype,
                     absl::MakeSpan(wire_grads[chunk.param_id])
                         .subspan(chunk.offset, chunk.num_elements));
  }
  int64_t version = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    const absl::Time start = absl::Now();
    if (topk != nullptr) topk->BeginStep(version);
    auto pulled =
        (*client)->PushPull(version, grad_spans, version + 1, 0, weight_spans);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (topk != nullptr) topk->CommitStep(version);
    if (!pulled.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n",
                   pulled.status().ToString().c_str());
      std::exit(1);
    }
    if (reference != nullptr) {
      // This step's sparse gradient, as the shards densify it.
      reference->BeginStep(version);
      std::vector<uint32_t> indices;
      std::vector<float> values;
      for (const ChunkSpec& chunk : plan->chunks()) {
        reference->Compress(chunk.param_id, chunk.offset,
                            absl::MakeConstSpan(grads[chunk.param_id])
                                .subspan(chunk.offset, chunk.num_elements),
                            &indices, &values);
        float* out = wire_grads[chunk.param_id].data() + chunk.offset;
        std::fill(out, out + chunk.num_elements, 0.0f);
        for (size_t i = 0; i < indices.size(); ++i) {
          out[indices[i]] = values[i];
        }
      }
      reference->CommitStep(version);
    }
    version = *pulled;
    if (r > 0) run.seconds.push_back(seconds);
    const PsStepTimes& times = (*client)->last_step_times();
    run.wire_bytes = times.bytes_pushed + times.bytes_pulled;
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
  for (size_t p = 0; p < sizes.size(); ++p) {
    for (int64_t i = 0; i < sizes[p]; ++i) {
      if (replica[p][i] != weights[p][i]) ++run.wrong;
    }
  }
  (void)(*client)->Done();
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
std::unique_ptr<PrivateFolder> MakeTlsFolder(TlsOptions* tls) {
  auto made = PrivateFolder::Create("ps_bench-tls");
  std::vector<TlsIdentity> ids = {TlsIdentity{TlsRole::kWorker, 0, "local"}};
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
      "ps_bench [--flags]: push+pull of a model between one worker and "
      "--shards PS shards on loopback, against plain TCP sockets.");
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
  const int64_t model_bytes = absl::GetFlag(FLAGS_model_bytes);
  const int64_t tensor_bytes = absl::GetFlag(FLAGS_tensor_bytes);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<int64_t> sizes;
  for (int64_t left = model_bytes / 4; left > 0; left -= tensor_bytes / 4) {
    sizes.push_back(std::min(left, tensor_bytes / 4));
  }
  const std::vector<double> tcp = pstrain::TimeTcp(model_bytes, repeats);
  const double tcp_median = pstrain::Median(tcp);
  std::printf(
      "# ps_bench: push+pull of a %lld-byte model (%zu tensors), 1 "
      "worker, loopback, median of %d steps\n",
      static_cast<long long>(model_bytes), sizes.size(), repeats);
  std::unique_ptr<pstrain::PrivateFolder> folder;
  pstrain::TlsOptions tls;
  if (absl::GetFlag(FLAGS_tls)) folder = pstrain::MakeTlsFolder(&tls);
  const std::vector<pstrain::CompressionOptions> compressions =
      pstrain::CompressionsFromFlag();
  if (const int q = absl::GetFlag(FLAGS_sync_server_queues); q > 0) {
    std::printf(
        "# shards' gRPC servers: %d completion queues, %d to %d "
        "pollers\n",
        q, q, 2 * q);
  }
  std::printf("# %12s %7s %3s %-12s %-15s %10s %10s %8s %10s %11s %7s\n",
              "payload", "shards", "ch", "transport", "wire", "time", "wire",
              "GB/s", "ratio", "TLS ratio", "#wrong");
  std::printf("# %12s %7s %3s %-12s %-15s %10s %10s %8s %10s %11s %7s\n", "(B)",
              "", "", "", "", "(ms)", "(MB)", "", "(vs TCP)", "(vs plain)", "");
  const auto row = [&](const std::string& shards, const std::string& channels,
                       const char* transport, const std::string& wire,
                       double seconds, int64_t wire_bytes,
                       const std::string& tls_ratio, const std::string& wrong) {
    std::printf(
        "  %12lld %7s %3s %-12s %-15s %10.1f %10.1f %8.2f %10.2f %11s %7s\n",
        static_cast<long long>(model_bytes), shards.c_str(), channels.c_str(),
        transport, wire.c_str(), seconds * 1e3,
        static_cast<double>(wire_bytes) / 1e6,
        2.0 * model_bytes / seconds / 1e9, tcp_median / seconds,
        tls_ratio.c_str(), wrong.c_str());
    std::fflush(stdout);
  };
  row("-", "1", "raw TCP", "fp32", tcp_median, 2 * model_bytes, "-", "-");
  const int64_t partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  for (int shards : shard_counts) {
    const std::string count = absl::StrCat(shards);
    for (int channels : channel_counts) {
      const std::string ch = absl::StrCat(channels);
      const pstrain::PsRun run = pstrain::TimePs(
          shards, sizes, partition_bytes, repeats,
          pstrain::InsecureTlsOptions(), pstrain::DTYPE_FLOAT32, channels);
      const double median = pstrain::Median(run.seconds);
      row(count, ch, "pstrain", "fp32", median, run.wire_bytes, "-",
          absl::StrCat(run.wrong));
      if (folder != nullptr) {
        const pstrain::PsRun secure =
            pstrain::TimePs(shards, sizes, partition_bytes, repeats, tls,
                            pstrain::DTYPE_FLOAT32, channels);
        const double secure_median = pstrain::Median(secure.seconds);
        row(count, ch, "pstrain+mTLS", "fp32", secure_median, secure.wire_bytes,
            absl::StrFormat("%.2f", median / secure_median),
            absl::StrCat(secure.wrong));
      }
      for (pstrain::DType dtype : wire_dtypes) {
        const pstrain::PsRun half =
            pstrain::TimePs(shards, sizes, partition_bytes, repeats,
                            pstrain::InsecureTlsOptions(), dtype, channels);
        row(count, ch, "pstrain", pstrain::WireDtypeSpelling(dtype),
            pstrain::Median(half.seconds), half.wire_bytes, "-",
            absl::StrCat(half.wrong));
      }
      for (const pstrain::CompressionOptions& c : compressions) {
        for (bool delta : {false, true}) {
          const pstrain::PsRun sparse =
              pstrain::TimePs(shards, sizes, partition_bytes, repeats,
                              pstrain::InsecureTlsOptions(),
                              pstrain::DTYPE_FLOAT32, channels, c, delta);
          row(count, ch, "pstrain",
              pstrain::CompressionSpelling(c) + (delta ? "+delta" : ""),
              pstrain::Median(sparse.seconds), sparse.wire_bytes, "-",
              absl::StrCat(sparse.wrong));
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
