// embedding_bench: an embedding table trained by W workers, sparse on the
// parameter server against dense allreduce (issue 41).
//
// The model is the embedding part of a recommendation or language model:
// each sample is a bag of --bag token ids drawn from a Zipf(1) law over
// --rows rows (frequent ids first, as in text or click logs), its feature
// the mean of the bag's rows of the table E [rows, dim], its prediction
// a . feature + b (a dense head of dim + 1 parameters), and its loss
// 0.5 (prediction - y)^2 with y a fixed pseudo-random function of the ids
// (in [-1, 1]). Forward and backward are computed on the worker's CPU; the
// table's gradient touches only the bag's rows. Adam (lr --lr) everywhere.
//
// Modes (--modes):
//   sparse_ps  the table is row-sparse on --shards PS shards (sync mode):
//              each worker pushes the rows its batch touched and pulls the
//              rows its next batch reads (PsClient::SetStepRows); the shards
//              apply lazy Adam (torch.optim.SparseAdam's) to those rows.
//   dense_ps   the same shards, the table pushed and pulled whole; dense Adam.
//   allreduce  Gloo's ring allreduce of the whole dense gradient, dense
//              Adam on every worker (pstrain's --mode=allreduce path).
// A worker's batch at step s is a function of (s, rank) alone, so every
// mode trains on the same data in the same order.
//
// --role=local runs the shards (in-process gRPC servers) and the workers
// (threads) in this process, on loopback. --role=ps serves one shard and
// --role=worker runs one worker, for bench/embedding_bench.sh, which puts
// each in its own network namespace behind emulated links.
//
// Columns (worker 0's; medians over the timed steps):
//   step ms    wall time of a step (forward, backward, exchange, update)
//   samples/s  workers x batch / step time
//   MB/step    bytes worker 0 sent and received for the exchange in a step
//              (PS: the PushPull messages; allreduce: a ring allreduce's
//              2 (W - 1) / W of the gradient's fp32 bytes), 10^6 per MB
//   loss       mean loss of worker 0's batch at steps 0, n/2 and n - 1
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/grpc_server.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "optim/optimizer.h"
#include "server/local_shards.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "worker/collective.h"
#include "worker/ps_client.h"

ABSL_FLAG(std::string, role, "local", "local, ps or worker (see the header).");
ABSL_FLAG(std::vector<std::string>, modes,
          std::vector<std::string>({"sparse_ps", "allreduce"}),
          "Modes to run: sparse_ps, dense_ps, allreduce.");
ABSL_FLAG(int64_t, rows, 30522, "Rows of the table (its vocabulary).");
ABSL_FLAG(int64_t, dim, 64, "Elements per row.");
ABSL_FLAG(int, workers, 2, "Workers.");
ABSL_FLAG(int, shards, 2, "PS shards.");
ABSL_FLAG(int, batch, 96, "Samples per worker per step.");
ABSL_FLAG(int, bag, 128, "Token ids per sample.");
ABSL_FLAG(int, steps, 12, "Steps per mode (the first --warmup untimed).");
ABSL_FLAG(int, warmup, 2, "Untimed steps.");
ABSL_FLAG(double, lr, 0.01, "Adam's learning rate.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20, "Chunk bound, bytes.");
// Multi-process roles (bench/embedding_bench.sh).
ABSL_FLAG(std::string, mode, "sparse_ps", "--role=ps/worker: the mode.");
ABSL_FLAG(std::string, listen, "0.0.0.0:0", "--role=ps: address to serve.");
ABSL_FLAG(int, shard_index, 0, "--role=ps: this shard.");
ABSL_FLAG(int, rank, 0, "--role=worker: this worker.");
ABSL_FLAG(std::vector<std::string>, ps, {}, "--role=worker: shard addresses.");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "--role=worker, allreduce: this host's address for Gloo.");
ABSL_FLAG(std::string, store_dir, "",
          "--role=worker, allreduce: a folder every worker shares, Gloo's "
          "rendezvous.");

namespace pstrain {
namespace {

// The job's dimensions.
struct BenchShape {
  int64_t rows, dim;
  int workers, batch, bag, steps, warmup;
  float lr;
  int64_t partition_bytes;
};

BenchShape ShapeFromFlags() {
  return {absl::GetFlag(FLAGS_rows),
          absl::GetFlag(FLAGS_dim),
          absl::GetFlag(FLAGS_workers),
          absl::GetFlag(FLAGS_batch),
          absl::GetFlag(FLAGS_bag),
          absl::GetFlag(FLAGS_steps),
          absl::GetFlag(FLAGS_warmup),
          float(absl::GetFlag(FLAGS_lr)),
          absl::GetFlag(FLAGS_partition_bytes)};
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The batch of worker `rank` at step `step`: batch x bag ids, Zipf(1)
// (inverse transform of the log-uniform law: rows^u - 1).
std::vector<uint32_t> BatchIds(const BenchShape& s, int64_t step, int rank) {
  std::vector<uint32_t> ids(static_cast<size_t>(s.batch) * s.bag);
  uint64_t state = Mix(step * 1000003ULL + rank * 7919ULL + 1);
  const double log_rows = std::log(static_cast<double>(s.rows) + 1.0);
  for (uint32_t& id : ids) {
    state = Mix(state + 0x9e3779b97f4a7c15ULL);
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
    const int64_t r = static_cast<int64_t>(std::exp(u * log_rows)) - 1;
    id = static_cast<uint32_t>(
        std::min<int64_t>(std::max<int64_t>(r, 0), s.rows - 1));
  }
  return ids;
}

std::vector<uint32_t> UniqueRows(std::vector<uint32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Forward and backward of one batch: the loss, and the gradients of the
// table (dense buffer, only the batch's rows written: they must be zero on
// entry) and of the head (dim + 1).
double ForwardBackward(const BenchShape& s, const std::vector<uint32_t>& ids,
                       const std::vector<float>& table,
                       const std::vector<float>& head, float* table_grad,
                       std::vector<float>* head_grad) {
  const int64_t d = s.dim;
  std::vector<float> feature(d);
  head_grad->assign(d + 1, 0.0f);
  double loss = 0;
  for (int i = 0; i < s.batch; ++i) {
    const uint32_t* bag = ids.data() + static_cast<int64_t>(i) * s.bag;
    std::fill(feature.begin(), feature.end(), 0.0f);
    uint64_t h = 0;
    for (int t = 0; t < s.bag; ++t) {
      const float* row = table.data() + int64_t{bag[t]} * d;
      for (int64_t j = 0; j < d; ++j) feature[j] += row[j];
      h += Mix(bag[t] + 17);
    }
    const float inv = 1.0f / s.bag;
    float pred = head[d];
    for (int64_t j = 0; j < d; ++j) {
      feature[j] *= inv;
      pred += head[j] * feature[j];
    }
    const float y = static_cast<float>(Mix(h) % 2001) / 1000.0f - 1.0f;
    const float err = pred - y;
    loss += 0.5 * err * err;
    const float dpred = err / s.batch;
    for (int64_t j = 0; j < d; ++j) (*head_grad)[j] += dpred * feature[j];
    (*head_grad)[d] += dpred;
    for (int t = 0; t < s.bag; ++t) {
      float* g = table_grad + int64_t{bag[t]} * d;
      for (int64_t j = 0; j < d; ++j) g[j] += dpred * head[j] * inv;
    }
  }
  return loss / s.batch;
}

std::vector<float> InitialTable(const BenchShape& s) {
  std::vector<float> table(s.rows * s.dim);
  for (int64_t i = 0; i < s.rows * s.dim; ++i) {
    table[i] = (static_cast<float>(Mix(i) % 20001) / 10000.0f - 1.0f) * 0.1f;
  }
  return table;
}
std::vector<float> InitialHead(const BenchShape& s) {
  std::vector<float> head(s.dim + 1, 0.0f);
  for (int64_t j = 0; j < s.dim; ++j) head[j] = (j % 2 ? 0.5f : -0.5f);
  return head;
}

struct WorkerResult {
  std::vector<double> step_ms;
  std::vector<double> losses;
  int64_t bytes_per_step = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

OptimizerOptions Adam(const BenchShape& s) {
  OptimizerOptions o;
  o.lr = s.lr;
  return o;
}

// A rendezvous store in a shared folder (processes in different network
// namespaces share the file system): a key is a file, written atomically.
class FileStore : public RendezvousStore {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    {
      std::ofstream out(path + ".tmp", std::ios::binary);
      out << value;
      if (!out) return absl::InternalError("cannot write " + path);
    }
    std::filesystem::rename(path + ".tmp", path);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Wait(const std::string& key,
                                   absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::ifstream in(Path(key), std::ios::binary);
      if (in) {
        std::stringstream all;
        all << in.rdbuf();
        return all.str();
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("no key " + key);
  }

 private:
  std::string Path(const std::string& key) const {
    std::string name = key;
    std::replace(name.begin(), name.end(), '/', '_');
    return dir_ + "/" + name;
  }
  std::string dir_;
};

// One allreduce worker: Gloo's ring allreduce of the dense gradients, then
// dense Adam on its own replica.
absl::StatusOr<WorkerResult> RunAllreduceWorker(const BenchShape& s, int rank,
                                                Collective* collective) {
  std::vector<float> table = InitialTable(s), head = InitialHead(s);
  std::vector<float> tm(table.size(), 0.0f), tv(table.size(), 0.0f);
  std::vector<float> hm(head.size(), 0.0f), hv(head.size(), 0.0f);
  // The table's gradient is the front of the reduced buffer (no copy).
  std::vector<float> grad(table.size() + head.size(), 0.0f), head_grad;
  const OptimizerOptions adam = Adam(s);
  WorkerResult result;
  const int64_t n = static_cast<int64_t>(table.size());
  result.bytes_per_step = static_cast<int64_t>(
      2.0 * (s.workers - 1) / s.workers * grad.size() * sizeof(float));
  for (int step = 0; step < s.steps; ++step) {
    const absl::Time start = absl::Now();
    const std::vector<uint32_t> ids = BatchIds(s, step, rank);
    std::fill(grad.begin(), grad.begin() + n, 0.0f);
    result.losses.push_back(
        ForwardBackward(s, ids, table, head, grad.data(), &head_grad));
    std::copy(head_grad.begin(), head_grad.end(), grad.begin() + n);
    absl::Status reduced = collective->AllreduceSum(grad.data(), grad.size());
    if (!reduced.ok()) return reduced;
    const float scale = 1.0f / s.workers;
    for (float& g : grad) g *= scale;
    OptimizerUpdate(adam, step + 1, table.data(), grad.data(), tm.data(),
                    tv.data(), n);
    OptimizerUpdate(adam, step + 1, head.data(), grad.data() + n, hm.data(),
                    hv.data(), static_cast<int64_t>(head.size()));
    if (step >= s.warmup) {
      result.step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
  }
  return result;
}

absl::StatusOr<PartitionPlan> PlanOf(const BenchShape& s, int shards,
                                     bool rows) {
  return PartitionPlan::Create(
      {s.rows * s.dim, s.dim + 1}, s.partition_bytes, shards, 0,
      rows ? std::vector<int64_t>{s.dim, 0} : std::vector<int64_t>{});
}

// One PS worker (sparse: by rows; dense: whole tensors).
absl::StatusOr<WorkerResult> RunPsWorker(const BenchShape& s, int rank,
                                         const std::vector<std::string>& ps,
                                         bool sparse) {
  ASSIGN_OR_RETURN(PartitionPlan plan,
                   PlanOf(s, static_cast<int>(ps.size()), sparse));
  PsClientOptions options;
  options.addresses = ps;
  options.job_id = "embedding_bench";
  options.worker_id = rank;
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Create(options, plan));
  std::vector<float> table = InitialTable(s), head = InitialHead(s);
  if (rank == 0) RETURN_IF_ERROR(client->Initialize({table, head}));
  RETURN_IF_ERROR(client->WaitReady(absl::Seconds(60)));
  std::vector<absl::Span<float>> weights = {absl::MakeSpan(table),
                                            absl::MakeSpan(head)};
  std::vector<uint32_t> next_ids = BatchIds(s, 0, rank);
  if (sparse) client->SetStepRows({}, {UniqueRows(next_ids), {}});
  RETURN_IF_ERROR(client->PushPull(0, {}, 0, 0, weights).status());
  std::vector<float> table_grad(table.size(), 0.0f), head_grad;
  WorkerResult result;
  std::vector<int64_t> bytes;
  for (int step = 0; step < s.steps; ++step) {
    const absl::Time start = absl::Now();
    const std::vector<uint32_t> ids = next_ids;
    const std::vector<uint32_t> touched = UniqueRows(ids);
    result.losses.push_back(
        ForwardBackward(s, ids, table, head, table_grad.data(), &head_grad));
    next_ids = BatchIds(s, step + 1, rank);
    if (sparse) client->SetStepRows({touched, {}}, {UniqueRows(next_ids), {}});
    RETURN_IF_ERROR(client
                        ->PushPull(step, {table_grad, head_grad}, step + 1,
                                   s.batch, weights)
                        .status());
    // Zero what this step wrote (the next batch's rows are written anew).
    if (sparse) {
      for (uint32_t r : touched) {
        std::fill_n(table_grad.begin() + int64_t{r} * s.dim, s.dim, 0.0f);
      }
    } else {
      std::fill(table_grad.begin(), table_grad.end(), 0.0f);
    }
    if (step >= s.warmup) {
      result.step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      bytes.push_back(client->last_step_times().bytes_pushed +
                      client->last_step_times().bytes_pulled);
    }
  }
  std::sort(bytes.begin(), bytes.end());
  if (!bytes.empty()) result.bytes_per_step = bytes[bytes.size() / 2];
  return result;
}

ShardOptions ShardOptionsOf(const BenchShape& s) {
  ShardOptions options;
  options.job_id = "embedding_bench";
  options.num_workers = s.workers;
  options.mode = SyncMode::kSync;
  options.adam = Adam(s);
  return options;
}

void PrintHeader() {
  std::printf("# %10s %8s %8s %6s %9s %10s %9s %9s %9s %9s\n", "mode", "rows",
              "workers", "shards", "step ms", "samples/s", "MB/step", "loss@0",
              "loss@mid", "loss@end");
}

void PrintRow(const BenchShape& s, const std::string& mode, int shards,
              const WorkerResult& r) {
  const double ms = Median(r.step_ms);
  const size_t n = r.losses.size();
  std::printf("  %10s %8lld %8d %6d %9.1f %10.1f %9.3f %9.5f %9.5f %9.5f\n",
              mode.c_str(), static_cast<long long>(s.rows), s.workers,
              mode == "allreduce" ? 0 : shards, ms,
              ms > 0 ? s.workers * s.batch * 1000.0 / ms : 0.0,
              r.bytes_per_step / 1e6, r.losses[0], r.losses[n / 2],
              r.losses[n - 1]);
  std::fflush(stdout);
}

// --role=local: every mode in this process.
int RunLocal(const BenchShape& s) {
  const int shards = absl::GetFlag(FLAGS_shards);
  PrintHeader();
  for (const std::string& mode : absl::GetFlag(FLAGS_modes)) {
    std::vector<absl::StatusOr<WorkerResult>> results(
        s.workers, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    if (mode == "allreduce") {
      InProcessStore store;
      for (int r = 0; r < s.workers; ++r) {
        threads.emplace_back([&, r] {
          absl::StatusOr<std::unique_ptr<Collective>> c =
              Collective::CreateGloo(r, s.workers, "127.0.0.1", &store, "bench",
                                     absl::Seconds(120));
          results[r] = c.ok() ? RunAllreduceWorker(s, r, c->get())
                              : absl::StatusOr<WorkerResult>(c.status());
        });
      }
      for (std::thread& t : threads) t.join();
    } else {
      LocalShards local(shards, ShardOptionsOf(s));
      for (int r = 0; r < s.workers; ++r) {
        threads.emplace_back([&, r] {
          results[r] =
              RunPsWorker(s, r, local.addresses(), mode == "sparse_ps");
        });
      }
      for (std::thread& t : threads) t.join();
    }
    if (!results[0].ok()) {
      std::fprintf(stderr, "%s: %s\n", mode.c_str(),
                   results[0].status().ToString().c_str());
      return 1;
    }
    PrintRow(s, mode, shards, *results[0]);
  }
  return 0;
}

// --role=ps: one shard until killed.
int RunPs(const BenchShape& s) {
  ShardOptions options = ShardOptionsOf(s);
  options.num_shards = absl::GetFlag(FLAGS_shards);
  options.shard_index = absl::GetFlag(FLAGS_shard_index);
  ParameterShard shard(options);
  PsService service(&shard, absl::Seconds(600));
  absl::StatusOr<ListeningServer> server =
      StartGrpcServer(absl::GetFlag(FLAGS_listen), &service, "");
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("listening %d\n", server->port);
  std::fflush(stdout);
  server->server->Wait();
  return 0;
}

// --role=worker: one worker; worker 0 prints the row.
int RunWorker(const BenchShape& s) {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int rank = absl::GetFlag(FLAGS_rank);
  absl::StatusOr<WorkerResult> result;
  if (mode == "allreduce") {
    FileStore store(absl::GetFlag(FLAGS_store_dir));
    absl::StatusOr<std::unique_ptr<Collective>> c =
        Collective::CreateGloo(rank, s.workers, absl::GetFlag(FLAGS_host),
                               &store, "bench", absl::Seconds(120));
    result = c.ok() ? RunAllreduceWorker(s, rank, c->get())
                    : absl::StatusOr<WorkerResult>(c.status());
  } else {
    result = RunPsWorker(s, rank, absl::GetFlag(FLAGS_ps), mode == "sparse_ps");
  }
  if (!result.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", rank,
                 result.status().ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    PrintHeader();
    PrintRow(s, mode, static_cast<int>(absl::GetFlag(FLAGS_ps).size()),
             *result);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  pstrain::ParseFlagsOrExit(argc, argv, "embedding_bench",
                            "see bench/embedding_bench.cc");
  const pstrain::BenchShape s = pstrain::ShapeFromFlags();
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "ps") return pstrain::RunPs(s);
  if (role == "worker") return pstrain::RunWorker(s);
  return pstrain::RunLocal(s);
}
