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
// reads them back over one connection per worker, all at once (and again
// over as many connections per worker as each --channels_per_shard count
// above 1, the bytes split over them); with --tls,
// the TLS baseline does the same in mutual TLS 1.3 (OpenSSL's record layer
// straight on the sockets, the job's kind of certificates), what a
// transport adding only TLS to TCP reaches. Rows:
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
//   ch         = channels (connections) per shard; raw rows: connections
//                per worker
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
//   CPU        = core-ms a step: the process's user+system time (every
//                thread: the workers', the shards', gRPC's and the TCP
//                baseline's), median over the timed steps
//   cores      = CPU / time: how many cores the step kept busy
//   TLS ratio  = mTLS rows: plaintext time / mTLS time; raw TLS: raw TCP
//                time / raw TLS time
//   TLS floor  = mTLS rows (raw TLS: against raw TCP, the same way): the
//                best mTLS / plaintext ratio this machine
//                allows. mTLS does all of plaintext's work and encrypts
//                and decrypts every byte of the step's messages once
//                (2 * 2 * W * model bytes of AES-GCM); at best that
//                cipher work runs at the speed measured at the start
//                (OpenSSL's EVP AES-128-GCM and AES-256-GCM, TLS 1.3's
//                two AES suites, the faster one; one core, 16-KiB
//                records, the key set once), spread over every core this
//                process may use, so the mTLS step is at least
//                max(plain time, (plain CPU + cipher CPU) / cores)
//   #wrong: elements of the pulled weights (every worker's) that differ
//           from a local Adam
//           (top-k rows: SGD) replica given the same gradients, rounded per
//           chunk as the wire rounds them (RoundThroughWire), or sparsified as
//           a top-k row's worker does (its own TopKCompressor, error feedback
//           carried over the steps), and pulled the same way (0 expected);
//           raw rows: bytes of the last round that came back different
//           from those sent (0 expected)
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <openssl/evp.h>

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
#include "bench/transport_baselines.h"
#include "common/flags_util.h"
#include "common/malloc_tuning.h"
#include "common/partition.h"
#include "common/rpc_options.h"
#include "common/tls.h"
#include "common/trace.h"
#include "common/usable_cores.h"
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
          "Keep glibc's malloc settings instead of pstrain's "
          "(common/malloc_tuning.h, as pstrain_ps and pstrain_worker set "
          "them), to measure what they change.");
ABSL_FLAG(bool, malloc_one_arena, true,
          "With pstrain's malloc settings: false gives threads their own "
          "arenas again, as glibc's default (8 per core), keeping the two "
          "thresholds: to measure the one arena's lock against the faults "
          "it saves.");
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

struct PsRun {
  Timings timings;
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

// One timed configuration: the shards, the wire and the compression.
struct PsSetup {
  int num_shards = 1;
  int workers = 1;
  // `tls`: mutual TLS between the workers and the shards (common/tls.h),
  // or plaintext (tls.insecure).
  TlsOptions tls = InsecureTlsOptions();
  DType wire_dtype = DTYPE_FLOAT32;
  int channels = 1;
  CompressionOptions compression;
  bool delta_pulls = false;
};

// The model's tensors: their initial weights and the gradients every worker
// pushes at every step.
struct ModelTensors {
  explicit ModelTensors(const std::vector<int64_t>& sizes) {
    for (size_t p = 0; p < sizes.size(); ++p) {
      initial.emplace_back(sizes[p]);
      grads.emplace_back(sizes[p]);
      for (int64_t i = 0; i < sizes[p]; ++i) {
        initial[p][i] = 0.001f * static_cast<float>((i * 31 + p) % 1000);
        grads[p][i] = 0.01f * static_cast<float>((i * 17 + p) % 200 - 100);
      }
    }
  }
  std::vector<std::vector<float>> initial, grads;
};

// The workers: a PsClient each (with its own top-k compressor), holding
// its pulled weights. Exits 1 if a client cannot start.
class Workers {
 public:
  Workers(const PsSetup& setup, const LocalShards& shards,
          const std::string& job_id, const PartitionPlan& plan,
          const std::vector<int64_t>& sizes, const ModelTensors& model) {
    for (int w = 0; w < setup.workers; ++w) {
      PsClientOptions options;
      options.addresses = shards.addresses();
      options.worker_id = w;
      options.wire_dtype = setup.wire_dtype;
      options.channels_per_shard = setup.channels;
      options.delta_pulls = setup.delta_pulls;
      if (setup.compression.enabled()) {
        topk_.push_back(
            std::make_unique<TopKCompressor>(setup.compression, sizes, 3));
        options.compressor = topk_.back().get();
      }
      if (!setup.tls.insecure) {
        auto credentials = ChannelCredentials(
            setup.tls, TlsIdentity{TlsRole::kWorker, w, job_id});
        CheckOk(credentials.status(), "worker credentials");
        options.credentials = *credentials;
      }
      auto client = PsClient::Create(options, plan);
      CheckOk(client.status(), "worker client");
      clients_.push_back(*std::move(client));
      weights_.push_back(model.initial);
    }
    for (const std::vector<float>& g : model.grads) grads_.push_back(g);
    std::vector<absl::Span<const float>> init(model.initial.begin(),
                                              model.initial.end());
    CheckOk(clients_[0]->Initialize(init), "init");
    for (const std::unique_ptr<PsClient>& client : clients_) {
      CheckOk(client->WaitReady(absl::Seconds(10)), "init");
    }
  }

  // Every worker's push+pull of step `version` at once, started together;
  // adds its seconds from the first start to the last end, and the
  // process's CPU seconds over the step, to `timings`. Sets `version` to
  // the version pulled.
  void Step(int64_t* version, Timings* timings) {
    const double cpu_start = ProcessCpuSeconds();
    const int workers = static_cast<int>(clients_.size());
    std::vector<absl::Time> starts(workers), ends(workers);
    std::vector<absl::StatusOr<int64_t>> pulled(workers, int64_t{0});
    absl::Barrier* start_together = new absl::Barrier(workers);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        std::vector<absl::Span<float>> out(weights_[w].begin(),
                                           weights_[w].end());
        if (start_together->Block()) delete start_together;
        starts[w] = absl::Now();
        if (!topk_.empty()) topk_[w]->BeginStep(*version);
        pulled[w] =
            clients_[w]->PushPull(*version, grads_, *version + 1, 0, out);
        ends[w] = absl::Now();
        if (!topk_.empty()) topk_[w]->CommitStep(*version);
      });
    }
    for (std::thread& t : threads) t.join();
    const double cpu = ProcessCpuSeconds() - cpu_start;
    for (int w = 0; w < workers; ++w) CheckOk(pulled[w].status(), "step");
    *version = *pulled[0];
    if (timings != nullptr) {
      timings->Add(absl::ToDoubleSeconds(
                       *std::max_element(ends.begin(), ends.end()) -
                       *std::min_element(starts.begin(), starts.end())),
                   cpu);
    }
  }

  // Bytes of every worker's last step's messages, both ways.
  int64_t WireBytes() const {
    int64_t bytes = 0;
    for (const std::unique_ptr<PsClient>& client : clients_) {
      const PsStepTimes& times = client->last_step_times();
      bytes += times.bytes_pushed + times.bytes_pulled;
    }
    return bytes;
  }

  const std::vector<std::vector<std::vector<float>>>& weights() const {
    return weights_;
  }

  void Done() {
    for (const std::unique_ptr<PsClient>& client : clients_) {
      (void)client->Done();
    }
  }

 private:
  std::vector<std::unique_ptr<TopKCompressor>> topk_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::vector<std::vector<std::vector<float>>> weights_;
  std::vector<absl::Span<const float>> grads_;
};

// What the pulled weights must be: the shards' optimizer, run locally on
// the average of the workers' gradients as the shards receive them
// (rounded chunk by chunk, or sparsified as a top-k worker does with its
// own TopKCompressor, error feedback carried over the steps) and sum them
// (in worker-id order, then scaled by 1/W: ParameterShard::AverageInto).
class Replica {
 public:
  Replica(const PsSetup& setup, const OptimizerOptions& optimizer,
          const PartitionPlan& plan, const std::vector<int64_t>& sizes,
          const ModelTensors& model)
      : setup_(setup),
        optimizer_(optimizer),
        plan_(plan),
        sizes_(sizes),
        grads_(model.grads),
        weights_(model.initial),
        wire_grads_(model.grads) {
    for (int64_t n : sizes) {
      m_.emplace_back(n, 0.0f);
      v_.emplace_back(n, 0.0f);
    }
    if (setup.compression.enabled()) {
      // The same selection, by the same code, on the same sums: every
      // worker selects alike.
      topk_ = std::make_unique<TopKCompressor>(setup.compression, sizes, 3);
    }
    for (const ChunkSpec& chunk : plan.chunks()) {
      const absl::Span<float> g = Chunk(wire_grads_, chunk);
      RoundThroughWire(setup.wire_dtype, g);
      Average(g);
    }
  }

  // Step `step`'s update, after which the shards are at `version`.
  void Step(int64_t step, int64_t version) {
    if (topk_ != nullptr) SparseGradients(step);
    for (size_t p = 0; p < sizes_.size(); ++p) {
      OptimizerUpdate(optimizer_, version, weights_[p].data(),
                      wire_grads_[p].data(), m_[p].data(), v_[p].data(),
                      sizes_[p]);
    }
  }

  // Elements of `pulled` (every worker's weights) that differ from the
  // replica's, rounded per chunk as the wire rounds them.
  int64_t CountWrong(
      const std::vector<std::vector<std::vector<float>>>& pulled) const {
    std::vector<std::vector<float>> expected = weights_;
    for (const ChunkSpec& chunk : plan_.chunks()) {
      RoundThroughWire(setup_.wire_dtype, Chunk(expected, chunk));
    }
    int64_t wrong = 0;
    for (const std::vector<std::vector<float>>& worker : pulled) {
      for (size_t p = 0; p < sizes_.size(); ++p) {
        for (int64_t i = 0; i < sizes_[p]; ++i) {
          if (expected[p][i] != worker[p][i]) ++wrong;
        }
      }
    }
    return wrong;
  }

 private:
  static absl::Span<float> Chunk(std::vector<std::vector<float>>& tensors,
                                 const ChunkSpec& chunk) {
    return absl::MakeSpan(tensors[chunk.param_id])
        .subspan(chunk.offset, chunk.num_elements);
  }

  // The average of W equal gradients, as the shards compute it.
  void Average(absl::Span<float> g) const {
    if (setup_.workers == 1) return;
    const float scale = 1.0f / static_cast<float>(setup_.workers);
    for (float& x : g) {
      float sum = x;
      for (int w = 1; w < setup_.workers; ++w) sum += x;
      x = sum * scale;
    }
  }

  // Step `step`'s sparse gradient, as the shards densify and average it.
  void SparseGradients(int64_t step) {
    topk_->BeginStep(step);
    std::vector<uint32_t> indices;
    std::vector<float> values;
    for (const ChunkSpec& chunk : plan_.chunks()) {
      topk_->Compress(chunk.param_id, chunk.offset,
                      absl::MakeConstSpan(grads_[chunk.param_id])
                          .subspan(chunk.offset, chunk.num_elements),
                      &indices, &values, setup_.wire_dtype);
      RoundThroughWire(setup_.wire_dtype, absl::MakeSpan(values));
      const absl::Span<float> out = Chunk(wire_grads_, chunk);
      std::fill(out.begin(), out.end(), 0.0f);
      for (size_t i = 0; i < indices.size(); ++i) out[indices[i]] = values[i];
      Average(out);
    }
    topk_->CommitStep(step);
  }

  const PsSetup setup_;
  const OptimizerOptions optimizer_;
  const PartitionPlan& plan_;
  const std::vector<int64_t> sizes_;
  const std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> weights_, wire_grads_, m_, v_;
  std::unique_ptr<TopKCompressor> topk_;
};

// `repeats` timed steps (after one warm-up) of `setup` on fresh shards.
PsRun TimePs(const PsSetup& setup, const std::vector<int64_t>& sizes,
             int64_t partition_bytes, int repeats) {
  // Top-k: plain SGD, whose update changes only the pushed entries (what
  // delta pulls need; DGC's shards with momentum correction).
  OptimizerOptions optimizer = AdamOptions();
  if (setup.compression.enabled()) {
    optimizer.kind = OptimizerKind::kSgd;
    optimizer.lr = 0.01f;
  }
  ShardOptions shard_options;
  shard_options.adam = optimizer;
  shard_options.num_workers = setup.workers;
  ServerLimits limits;
  limits.sync_server_queues = absl::GetFlag(FLAGS_sync_server_queues);
  LocalShards shards(setup.num_shards, shard_options, setup.tls, limits);
  auto plan = PartitionPlan::Create(sizes, partition_bytes, setup.num_shards);
  const ModelTensors model(sizes);
  Workers workers(setup, shards, shard_options.job_id, *plan, sizes, model);
  Replica replica(setup, optimizer, *plan, sizes, model);
  PsRun run;
  int64_t version = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    const int64_t step = version;
    workers.Step(&version, r > 0 ? &run.timings : nullptr);
    run.wire_bytes = workers.WireBytes();
    replica.Step(step, version);
  }
  run.wrong = replica.CountWrong(workers.weights());
  workers.Done();
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

// A list of wire dtypes (--wire_dtypes, --topk_wire_dtypes), fp32 among
// them only where `fp32_allowed`; exits 2 naming a bad entry.
std::vector<DType> DtypesFromFlag(const std::vector<std::string>& values,
                                  const char* flag, bool fp32_allowed) {
  std::vector<DType> dtypes;
  for (const std::string& spelling : values) {
    absl::StatusOr<DType> dtype = ParseWireDtype(spelling, flag);
    if (!dtype.ok() || (!fp32_allowed && *dtype == DTYPE_FLOAT32)) {
      std::fprintf(stderr, "ps_bench: --%s: '%s'; expected %s\n", flag,
                   spelling.c_str(),
                   fp32_allowed ? "fp32, bf16 or fp16"
                                : "bf16 or fp16 (fp32 rows are always timed)");
      std::exit(2);
    }
    dtypes.push_back(*dtype);
  }
  return dtypes;
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

// The table's rows for a number of workers: raw TCP, then each shard and
// channel count in fp32, mTLS, each 16-bit wire and each top-k.
struct Rows {
  std::vector<int64_t> sizes;
  int64_t model_bytes = 0;
  int64_t partition_bytes = 0;
  int repeats = 1;
  std::vector<int> shard_counts, channel_counts;
  const TlsOptions* tls = nullptr;  // null: no mTLS rows
  std::vector<DType> wire_dtypes, topk_wires;
  std::vector<CompressionOptions> compressions;
  // One core's AES-GCM seconds per byte (CipherSecondsPerByte, the faster
  // suite) and the cores the process may use: the mTLS rows' floor.
  double cipher_seconds_per_byte = 0;
  int cores = 1;

  void Print(int workers) {
    workers_ = workers;
    // The baselines: one connection per worker (raw TCP's is every row's
    // `ratio`), then as many per worker as each channel count > 1 gives the
    // PS, the model's bytes split over them. With --tls, each in mutual
    // TLS too: its ratio to raw TCP at the same connections is what a
    // transport adding only OpenSSL's record layer would reach, beside its
    // floor (as the mTLS rows' below).
    std::vector<int> per_worker = {1};
    for (int channels : channel_counts) {
      if (channels > 1) per_worker.push_back(channels);
    }
    for (int c : per_worker) {
      const int connections = workers * c;
      const int64_t bytes = model_bytes / c;
      const Timings tcp = TimeEcho(bytes, repeats, connections, nullptr);
      if (c == 1) tcp_median_ = Median(tcp.seconds);
      Row("-", absl::StrCat(c), "raw TCP", "fp32", tcp, 2 * connections * bytes,
          "-", "-", absl::StrCat(tcp.wrong_bytes));
      if (tls == nullptr) continue;
      const EchoTls echo{tls->dir, workers};
      std::string suite;
      const Timings secure =
          TimeEcho(bytes, repeats, connections, &echo, &suite);
      if (c == 1) {
        std::printf("# raw TLS: OpenSSL %s over the sockets\n", suite.c_str());
      }
      Row("-", absl::StrCat(c), "raw TLS", "fp32", secure,
          2 * connections * bytes,
          absl::StrFormat("%.2f", Median(tcp.seconds) / Median(secure.seconds)),
          absl::StrFormat("%.2f", TlsFloor(tcp, workers)),
          absl::StrCat(secure.wrong_bytes));
    }
    for (int shards : shard_counts) {
      for (int channels : channel_counts) {
        PsSetup setup;
        setup.num_shards = shards;
        setup.workers = workers;
        setup.channels = channels;
        PrintSetup(setup);
      }
    }
  }

 private:
  // The best TLS / plaintext ratio the machine allows a transport whose
  // plaintext steps took `plain`: every byte of a step's messages (2 * 2 *
  // W * model bytes) sealed once and opened once at one core's measured
  // speed, spread over every usable core.
  double TlsFloor(const Timings& plain, int workers) const {
    const double plain_seconds = Median(plain.seconds);
    const double cipher_seconds =
        cipher_seconds_per_byte * 4.0 * workers * model_bytes;
    return plain_seconds /
           std::max(plain_seconds,
                    (Median(plain.cpu_seconds) + cipher_seconds) / cores);
  }

  // The rows of one shard and channel count.
  void PrintSetup(const PsSetup& plain) const {
    const PsRun run = Time(plain, "fp32");
    if (tls != nullptr) {
      PsSetup secure = plain;
      secure.tls = *tls;
      const PsRun mtls = TimePs(secure, sizes, partition_bytes, repeats);
      const double plain_seconds = Median(run.timings.seconds);
      Print(
          plain, "pstrain+mTLS", "fp32", mtls,
          absl::StrFormat("%.2f", plain_seconds / Median(mtls.timings.seconds)),
          absl::StrFormat("%.2f", TlsFloor(run.timings, plain.workers)));
    }
    for (DType dtype : wire_dtypes) {
      PsSetup half = plain;
      half.wire_dtype = dtype;
      Time(half, WireDtypeSpelling(dtype));
    }
    // Top-k in each --topk_wire_dtypes (a 16-bit one's values rounded, the
    // rounding fed back), with whole and delta pulls.
    for (const CompressionOptions& c : compressions) {
      for (DType dtype : topk_wires) {
        for (bool delta : {false, true}) {
          PsSetup sparse = plain;
          sparse.wire_dtype = dtype;
          sparse.compression = c;
          sparse.delta_pulls = delta;
          Time(sparse,
               absl::StrCat(dtype == DTYPE_FLOAT32
                                ? ""
                                : absl::StrCat(WireDtypeSpelling(dtype), "+"),
                            CompressionSpelling(c), delta ? "+delta" : ""));
        }
      }
    }
  }

  // Times `setup` in plaintext and prints its row as `wire`.
  PsRun Time(const PsSetup& setup, const std::string& wire) const {
    const PsRun run = TimePs(setup, sizes, partition_bytes, repeats);
    Print(setup, "pstrain", wire, run, "-", "-");
    return run;
  }

  void Print(const PsSetup& setup, const char* transport,
             const std::string& wire, const PsRun& run,
             const std::string& tls_ratio, const std::string& tls_floor) const {
    Row(absl::StrCat(setup.num_shards), absl::StrCat(setup.channels), transport,
        wire, run.timings, run.wire_bytes, tls_ratio, tls_floor,
        absl::StrCat(run.wrong));
  }

  void Row(const std::string& shards, const std::string& channels,
           const char* transport, const std::string& wire,
           const Timings& timings, int64_t wire_bytes,
           const std::string& tls_ratio, const std::string& tls_floor,
           const std::string& wrong) const {
    const double seconds = Median(timings.seconds);
    const double cpu = Median(timings.cpu_seconds);
    std::printf(
        "  %12lld %3d %7s %3s %-12s %-20s %10.1f %10.1f %8.2f %10.2f %9.1f "
        "%5.2f %11s %9s %7s\n",
        static_cast<long long>(model_bytes), workers_, shards.c_str(),
        channels.c_str(), transport, wire.c_str(), seconds * 1e3,
        static_cast<double>(wire_bytes) / 1e6,
        2.0 * workers_ * model_bytes / seconds / 1e9, tcp_median_ / seconds,
        cpu * 1e3, cpu / seconds, tls_ratio.c_str(), tls_floor.c_str(),
        wrong.c_str());
    std::fflush(stdout);
  }

  // The worker count being printed and its raw TCP time.
  int workers_ = 1;
  double tcp_median_ = 0;
};

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ps_bench [--flags]: push+pull of a model between --workers workers "
      "and --shards PS shards on loopback, against plain TCP sockets.");
  pstrain::ParseFlagsOrExit(argc, argv, "ps_bench", "ps_bench --help");
  // As pstrain_ps and pstrain_worker do, unless asked for glibc's defaults.
  if (!absl::GetFlag(FLAGS_malloc_defaults) &&
      (!pstrain::KeepFreedMemoryForReuse() ||
       (!absl::GetFlag(FLAGS_malloc_one_arena) &&
        mallopt(M_ARENA_MAX, 8 * pstrain::UsableCores()) != 1))) {
    std::fprintf(stderr, "ps_bench: glibc refused the malloc settings\n");
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
  // Sizes checked before any shard is built: a partition_bytes of 0
  // aborted the process.
  pstrain::ExitOnFlagError(
      "ps_bench",
      pstrain::FirstError(
          {pstrain::CheckFlagRange("model_bytes",
                                   absl::GetFlag(FLAGS_model_bytes), 4,
                                   int64_t{16} << 30, "bytes"),
           pstrain::CheckFlagRange("tensor_bytes",
                                   absl::GetFlag(FLAGS_tensor_bytes), 4,
                                   int64_t{16} << 30, "bytes"),
           pstrain::CheckFlagRange("partition_bytes",
                                   absl::GetFlag(FLAGS_partition_bytes), 4,
                                   int64_t{1} << 30, "bytes"),
           pstrain::CheckFlagRange("repeats", absl::GetFlag(FLAGS_repeats), 1,
                                   1000)}));
  const std::vector<pstrain::DType> wire_dtypes = pstrain::DtypesFromFlag(
      absl::GetFlag(FLAGS_wire_dtypes), "wire_dtypes", false);
  const std::vector<pstrain::DType> topk_wires = pstrain::DtypesFromFlag(
      absl::GetFlag(FLAGS_topk_wire_dtypes), "topk_wire_dtypes", true);
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
  const int cores = pstrain::UsableCores();
  // The floor takes the faster of TLS 1.3's two AES-GCM suites, whichever
  // the connection negotiated: a lower bound either way.
  double cipher = 0.0;
  if (folder != nullptr) {
    const double aes128 = pstrain::CipherSecondsPerByte(EVP_aes_128_gcm());
    const double aes256 = pstrain::CipherSecondsPerByte(EVP_aes_256_gcm());
    cipher = std::min(aes128, aes256);
    std::printf(
        "# one core, OpenSSL EVP, 16-KiB records: AES-128-GCM %.2f GB/s, "
        "AES-256-GCM %.2f GB/s; %d cores usable\n",
        1e-9 / aes128, 1e-9 / aes256, cores);
  }
  std::printf(
      "# %12s %3s %7s %3s %-12s %-20s %10s %10s %8s %10s %9s %5s %11s %9s "
      "%7s\n",
      "payload", "W", "shards", "ch", "transport", "wire", "time", "wire",
      "GB/s", "ratio", "CPU", "cores", "TLS ratio", "TLS floor", "#wrong");
  std::printf(
      "# %12s %3s %7s %3s %-12s %-20s %10s %10s %8s %10s %9s %5s %11s %9s "
      "%7s\n",
      "(B)", "", "", "", "", "", "(ms)", "(MB)", "", "(vs TCP)", "(core-ms)",
      "", "(vs plain)", "(best)", "");
  pstrain::Rows rows;
  rows.sizes = sizes;
  rows.model_bytes = model_bytes;
  rows.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  rows.repeats = repeats;
  rows.shard_counts = shard_counts;
  rows.channel_counts = channel_counts;
  rows.tls = folder != nullptr ? &tls : nullptr;
  rows.wire_dtypes = wire_dtypes;
  rows.topk_wires = topk_wires;
  rows.compressions = compressions;
  rows.cipher_seconds_per_byte = cipher;
  rows.cores = cores;
  for (int workers : worker_counts) rows.Print(workers);
  if (absl::Status stopped = pstrain::trace::Stop(); !stopped.ok()) {
    std::fprintf(stderr, "ps_bench: --trace_file: %s\n",
                 stopped.ToString().c_str());
    return 1;
  }
  return 0;
}
