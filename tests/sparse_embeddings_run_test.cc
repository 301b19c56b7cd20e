// Row-sparse embedding tables in training jobs (issue 41), end to end
// through `pstrain run`: bert_tiny_untied on the fortune(6) token files
// (//text:fortunes_tokens) with --sparse_embeddings, 2 shards (the token
// table cut into 128-row chunks over both) and 2 workers.
//
// The invariants:
//  - SGD with momentum and weight decay updates every row, as the dense
//    update of the densified average: the same byte-for-byte equality,
//    in sync and in allreduce.
//  - SGD without momentum updates a row by -lr * g whether the row's
//    gradient came dense or by rows (a row no worker touched has g = 0 and
//    stays bit for bit), and the shards average the union of the workers'
//    rows in worker order as a dense push would (server/row_sparse.h). So a
//    sync SGD job with row pushes, and pulls of the next batch's rows only,
//    ends with the model file of the same job with dense pushes and pulls,
//    byte for byte, over two epochs (an epoch's last step pulls whole:
//    worker 0 evaluates with every row, and the same test accuracy). Any
//    row a batch read without having pulled it, or any touched row not
//    pushed, would change the bytes; and the row job pushes fewer bytes.
//  - With Adam, the row job is a different optimizer (lazy Adam,
//    torch.optim.SparseAdam's: untouched rows keep their moments; checked
//    against PyTorch by tools/torch/bert_compare.py --sparse_embeddings and
//    bit for bit by //optim:sparse_adam_test), so its model differs from
//    the dense job's; a run resumed from its step-6 checkpoint (the shards'
//    rows' w, m, v in the shard files; model.safetensors assembled from
//    them) ends with the uninterrupted run's model file byte for byte.
//  - The same holds over a bf16 wire with the global norm clipped: the
//    shards round a row push as they round the dense chunk, and the
//    union's norm is the dense average's (its untouched rows add +0.0).
//  - Composed with every step policy at once (1 backup worker of 3,
//    staleness 2, clipping, bf16, checkpoints), a shard killed after the
//    first checkpoint is restarted, every shard restores it (the tables'
//    rows' w, m, v come back from the shard files) and the job trains on
//    to its end.
//  - Top-k compresses the other parameters while the table goes by rows:
//    at a ratio of 1 the SGD job equals the uncompressed row job byte for
//    byte, and a top-k job resumes exactly from its checkpoint.
//  - Mode allreduce gathers the rows: the sync row job's model, byte for
//    byte with two workers.
//  - Async trains; refusals are one line and exit 2.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::KillChild;
using pstrain::testing::Process;
using pstrain::testing::ReadLatest;
using pstrain::testing::ReadTextFile;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using pstrain::testing::WaitFor;
using Result = pstrain::testing::CommandResult;

constexpr char kTokens[] = "text/fortunes";

std::string Job(const std::string& args) {
  return std::string(
             "cli/pstrain run --model=bert_tiny_untied --dataset=tokens "
             "--data_dir=") +
         kTokens +
         " --num_ps=2 --num_workers=2 --batch_size=4 --dropout=0 "
         "--partition_bytes=65536 --log_every_steps=5 " +
         args;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Column `name` of a worker's metrics CSV (worker/metrics.h), summed.
double SumColumn(const std::string& csv, const std::string& name) {
  std::ifstream in(csv);
  std::string line;
  std::vector<std::string> header;
  double sum = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    size_t start = 0;
    for (size_t i = 0; i <= line.size(); ++i) {
      if (i == line.size() || line[i] == ',') {
        cells.push_back(line.substr(start, i - start));
        start = i + 1;
      }
    }
    if (header.empty()) {
      header = cells;
      continue;
    }
    for (size_t c = 0; c < cells.size() && c < header.size(); ++c) {
      if (header[c] == name && !cells[c].empty()) sum += std::stod(cells[c]);
    }
  }
  return sum;
}

std::vector<std::string> Accuracies(const std::string& output) {
  const std::regex epoch(R"(Epoch \d+ in [0-9.]+ sec, test time [0-9.]+ )"
                         R"(sec, test accuracy: ([0-9.]+))");
  std::vector<std::string> found;
  for (std::sregex_iterator it(output.begin(), output.end(), epoch), end;
       it != end; ++it) {
    found.push_back((*it)[1].str());
  }
  return found;
}

// The sync SGD job with rows and without, `extra` flags on both, in
// TempDir()/`name`_0 and _1: the same model file byte for byte, the same
// accuracies, fewer bytes pushed and pulled by rows.
void ExpectRowJobEqualsDenseJob(const std::string& name,
                                const std::string& extra) {
  const std::string args =
      "--epochs=2 --max_steps_per_epoch=5 --optimizer=sgd --lr=0.5 " + extra +
      " ";
  Result runs[2];
  std::string files[2];
  double pushed[2], pulled[2];
  for (int sparse = 0; sparse < 2; ++sparse) {
    const std::string dir =
        TempDir() + "/" + name + "_" + std::to_string(sparse);
    runs[sparse] = RunCommand(
        Job(args + "--sparse_embeddings=" + (sparse ? "true" : "false") +
            " --checkpoint_dir=" + dir + " --metrics_dir=" + dir + "/m"));
    ASSERT_EQ(runs[sparse].exit_code, 0) << runs[sparse].output;
    files[sparse] = ReadBytes(dir + "/model.safetensors");
    pushed[sparse] = SumColumn(dir + "/m/worker0.csv", "bytes_pushed");
    pulled[sparse] = SumColumn(dir + "/m/worker0.csv", "bytes_pulled");
  }
  EXPECT_NE(runs[1].output.find("model bert_tiny_untied on cpu: 993104 "
                                "parameters"),
            std::string::npos)
      << runs[1].output;
  ASSERT_GT(files[0].size(), 3000000u);
  EXPECT_TRUE(files[0] == files[1])
      << "the row job's model.safetensors differs from the dense job's";
  const std::vector<std::string> dense = Accuracies(runs[0].output);
  ASSERT_EQ(dense.size(), 2u) << runs[0].output;
  EXPECT_EQ(Accuracies(runs[1].output), dense) << runs[1].output;
  // The table (2000 x 128 fp32, 1 MB) is a quarter of the model; a batch
  // of 4 x 128 tokens touches a few hundred of its rows. Pulls: each
  // epoch's last step pulls whole (a fifth of the steps here).
  ASSERT_GT(pushed[0], 0);
  EXPECT_LT(pushed[1], 0.8 * pushed[0])
      << "bytes pushed: rows " << pushed[1] << ", dense " << pushed[0];
  EXPECT_LT(pulled[1], 0.9 * pulled[0])
      << "bytes pulled: rows " << pulled[1] << ", dense " << pulled[0];
}

TEST(SparseEmbeddingsRunTest, SgdRowJobEqualsTheDenseJobByteForByte) {
  ExpectRowJobEqualsDenseJob("sgd", "");
}

TEST(SparseEmbeddingsRunTest, OverABf16WireWithClippingToo) {
  ExpectRowJobEqualsDenseJob("sgd_bf16_clip",
                             "--wire_dtype=bf16 --clip_grad_norm=0.1");
}

// With momentum and weight decay SGD moves every row of the table (an
// untouched one by its momentum and decay), as the dense update of the
// densified average (server/row_sparse.h): the row job still equals the
// dense job byte for byte, and still pushes and pulls fewer bytes.
TEST(SparseEmbeddingsRunTest,
     SgdMomentumAndWeightDecayRowJobEqualsTheDenseJob) {
  ExpectRowJobEqualsDenseJob(
      "sgd_momentum_wd", "--momentum=0.9 --nesterov=true --weight_decay=0.001");
}

// Worker 0's "StepN: ..., loss L" figures, in order.
std::vector<double> Losses(const std::string& output) {
  const std::regex step(R"(\[worker0\] Step[0-9]+: [0-9.]+ data/sec, loss )"
                        R"(([0-9.]+))");
  std::vector<double> found;
  for (std::sregex_iterator it(output.begin(), output.end(), step), end;
       it != end; ++it) {
    found.push_back(std::stod((*it)[1].str()));
  }
  return found;
}

TEST(SparseEmbeddingsRunTest, EveryStepPolicyAtOnceSurvivesAKilledShard) {
  const std::string dir = TempDir() + "/composed";
  const std::string log = dir + ".log";
  std::vector<std::string> argv = absl::StrSplit(
      Job("--sparse_embeddings --num_workers=3 --backup_workers=1 "
          "--staleness=2 --clip_grad_norm=1 --wire_dtype=bf16 "
          "--epochs=1 --max_steps_per_epoch=100 --checkpoint_every_steps=10 "
          "--max_restarts=2 --log_every_steps=10 --heartbeat_timeout_s=30 "
          "--checkpoint_dir=" +
          dir),
      ' ', absl::SkipEmpty());
  // Job() names 2 workers; the last --num_workers wins, as for any flag.
  const unsigned seed = std::random_device()();
  const int delay_ms = static_cast<int>(std::mt19937(seed)() % 1000);
  std::printf("seed %u: killing shard 0 %d ms after the first checkpoint\n",
              seed, delay_ms);
  Process run(argv, log);
  ASSERT_TRUE(
      WaitFor([&] { return !ReadLatest(dir).empty(); }, absl::Minutes(1)))
      << ReadTextFile(log);
  absl::SleepFor(absl::Milliseconds(delay_ms));
  ASSERT_TRUE(KillChild(run.pid(), "pstrain_ps .*--task_index=0"))
      << ReadTextFile(log);
  const int exit_code = run.Wait(240);
  const std::string output = ReadTextFile(log);
  ASSERT_EQ(exit_code, 0) << output;
  EXPECT_NE(output.find("ps 0 died (signal 9); restarting it"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("[worker0] Restored the shards to " + dir + "/step-"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("[worker0] Saved the trained model (100 steps)"),
            std::string::npos)
      << output;
  EXPECT_EQ(Accuracies(output).size(), 1u) << output;
  // It trains through the restore: the last logged loss is below the first
  // (7.46 at step 10, 6.28 at step 100 in a run on 2026-11-30).
  const std::vector<double> losses = Losses(output);
  ASSERT_GE(losses.size(), 2u) << output;
  EXPECT_LT(losses.back(), losses.front() - 0.5) << output;
}

TEST(SparseEmbeddingsRunTest, AdamRowJobResumesExactly) {
  const std::string args =
      "--epochs=1 --max_steps_per_epoch=12 --checkpoint_every_steps=6 "
      "--sparse_embeddings --checkpoint_dir=";
  const std::string whole = TempDir() + "/adam_whole";
  const Result a = RunCommand(Job(args + whole));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string resumed = TempDir() + "/adam_resumed";
  std::filesystem::create_directories(resumed);
  std::filesystem::copy(whole + "/step-6", resumed + "/step-6",
                        std::filesystem::copy_options::recursive);
  pstrain::testing::WriteTextFile(resumed + "/latest", "step-6\n");
  const Result b = RunCommand(Job(args + resumed + " --resume"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Resuming from " + resumed + "/step-6 (step 6"),
            std::string::npos)
      << b.output;
  const std::string expected = ReadBytes(whole + "/model.safetensors");
  ASSERT_GT(expected.size(), 3000000u);
  EXPECT_TRUE(ReadBytes(resumed + "/model.safetensors") == expected)
      << "the resumed run's model.safetensors differs";
  EXPECT_EQ(Accuracies(b.output), Accuracies(a.output)) << b.output;
  // The checkpoint's model file (assembled from the shard files: worker 0
  // holds fresh rows only where it pulled them) is the step-6 state, which
  // the dense Adam job does not reach (lazy Adam is another optimizer).
  const std::string dense = TempDir() + "/adam_dense";
  const Result c = RunCommand(
      Job("--epochs=1 --max_steps_per_epoch=12 --checkpoint_dir=" + dense));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_FALSE(ReadBytes(dense + "/model.safetensors") == expected);
  EXPECT_TRUE(ReadBytes(whole + "/step-6/model.safetensors") ==
              ReadBytes(resumed + "/step-6/model.safetensors"));
}

// Top-k compression of the other parameters beside a table's rows (which
// go whole, never a top-k of them). At a ratio of 1 every entry of every
// parameter is pushed and the residual stays zero, so the SGD job with
// rows and topk:1 (pulls of the changed entries and of the next batch's
// rows) ends with the uncompressed row job's model file byte for byte; a
// table routed through the compressor (whose residual it does not have)
// would not. At topk:0.05 with Adam the job resumed from its step-6
// checkpoint (the workers' residuals, the table's empty, beside the
// shards' rows) ends with the uninterrupted run's model file.
TEST(SparseEmbeddingsRunTest, TopKCompressesTheOtherParameters) {
  const std::string sgd =
      "--epochs=2 --max_steps_per_epoch=5 --optimizer=sgd --lr=0.5 "
      "--sparse_embeddings ";
  std::string files[2];
  for (int topk = 0; topk < 2; ++topk) {
    const std::string dir = TempDir() + "/topk_sgd_" + std::to_string(topk);
    const Result r =
        RunCommand(Job(sgd + (topk ? "--compression=topk:1 " : "") +
                       "--checkpoint_dir=" + dir));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    files[topk] = ReadBytes(dir + "/model.safetensors");
  }
  ASSERT_GT(files[0].size(), 3000000u);
  EXPECT_TRUE(files[0] == files[1])
      << "the topk:1 row job's model.safetensors differs from the row job's";

  const std::string args =
      "--epochs=1 --max_steps_per_epoch=12 --checkpoint_every_steps=6 "
      "--sparse_embeddings --compression=topk:0.05 --checkpoint_dir=";
  const std::string whole = TempDir() + "/topk_whole";
  const Result a = RunCommand(Job(args + whole));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_TRUE(std::filesystem::exists(whole + "/step-6/residual-0.safetensors"))
      << a.output;
  const std::string resumed = TempDir() + "/topk_resumed";
  std::filesystem::create_directories(resumed);
  std::filesystem::copy(whole + "/step-6", resumed + "/step-6",
                        std::filesystem::copy_options::recursive);
  pstrain::testing::WriteTextFile(resumed + "/latest", "step-6\n");
  const Result b = RunCommand(Job(args + resumed + " --resume"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string expected = ReadBytes(whole + "/model.safetensors");
  ASSERT_GT(expected.size(), 3000000u);
  EXPECT_TRUE(ReadBytes(resumed + "/model.safetensors") == expected)
      << "the resumed top-k row job's model.safetensors differs";
  EXPECT_EQ(Accuracies(b.output), Accuracies(a.output)) << b.output;
}

// Mode allreduce gathers each worker's rows (worker/gradient_exchange.h
// AllreduceRows) and every worker updates their union lazily, as the
// shards do: with two workers the sums are the shards', so the Adam row job
// (lazy Adam) ends with the sync row job's model file byte for byte, also
// with top-k compressing the other parameters (the same chunks of
// --partition_bytes); and it sends fewer bytes than the dense allreduce
// job, whose model (dense Adam) differs.
// Job(args) as an allreduce job.
std::string AllreduceJob(const std::string& args) {
  std::string command = Job(args);
  const std::string ps = " --num_ps=2 ";
  command.replace(command.find(ps), ps.size(), " --mode=allreduce ");
  // A dense allreduce job has no chunks.
  const std::string partition = "--partition_bytes=65536 ";
  if (args.find("--sparse_embeddings") == std::string::npos) {
    command.erase(command.find(partition), partition.size());
  }
  return command;
}

TEST(SparseEmbeddingsRunTest, AllreduceRowJobEqualsTheSyncRowJob) {
  auto allreduce_job = AllreduceJob;
  const std::string args = "--epochs=1 --max_steps_per_epoch=8 ";
  double pushed[2] = {0, 0};
  for (const std::string extra : {"", "--compression=topk:0.05 "}) {
    std::string files[2];
    Result runs[2];
    for (int allreduce = 0; allreduce < 2; ++allreduce) {
      const std::string dir = TempDir() + "/allreduce_rows_" +
                              std::to_string(extra.size()) + "_" +
                              std::to_string(allreduce);
      const std::string flags = args + "--sparse_embeddings " + extra +
                                "--checkpoint_dir=" + dir +
                                " --metrics_dir=" + dir + "/m";
      runs[allreduce] =
          RunCommand(allreduce ? allreduce_job(flags) : Job(flags));
      ASSERT_EQ(runs[allreduce].exit_code, 0) << runs[allreduce].output;
      files[allreduce] = ReadBytes(dir + "/model.safetensors");
      if (allreduce && extra.empty()) {
        pushed[1] = SumColumn(dir + "/m/worker0.csv", "bytes_pushed");
      }
    }
    ASSERT_GT(files[0].size(), 3000000u);
    EXPECT_TRUE(files[0] == files[1])
        << extra << ": the allreduce row job's model differs from the sync's";
    EXPECT_EQ(Accuracies(runs[1].output), Accuracies(runs[0].output));
  }
  const std::string dense = TempDir() + "/allreduce_dense";
  const Result r = RunCommand(allreduce_job(args + "--checkpoint_dir=" + dense +
                                            " --metrics_dir=" + dense + "/m"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  pushed[0] = SumColumn(dense + "/m/worker0.csv", "bytes_pushed");
  std::printf("allreduce bytes sent by worker 0: dense %.0f, rows %.0f\n",
              pushed[0], pushed[1]);
  EXPECT_LT(pushed[1], pushed[0]);
  EXPECT_GT(pushed[1], 0);
  EXPECT_FALSE(ReadBytes(dense + "/model.safetensors") ==
               ReadBytes(TempDir() + "/allreduce_rows_0_1/model.safetensors"));
}

// In allreduce too, SGD with momentum and weight decay updates every row
// of the table: with two workers (exact sums either way) the row job ends
// with the dense allreduce job's model file byte for byte.
TEST(SparseEmbeddingsRunTest, AllreduceSgdMomentumRowJobEqualsTheDenseJob) {
  const std::string args =
      "--epochs=1 --max_steps_per_epoch=6 --optimizer=sgd --lr=0.5 "
      "--momentum=0.9 --weight_decay=0.001 ";
  std::string files[2];
  for (int sparse = 0; sparse < 2; ++sparse) {
    const std::string dir =
        TempDir() + "/allreduce_sgd_momentum_" + std::to_string(sparse);
    const Result r = RunCommand(AllreduceJob(
        args + (sparse ? "--sparse_embeddings " : "") +
        "--checkpoint_dir=" + dir + " --metrics_dir=" + dir + "/m"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    files[sparse] = ReadBytes(dir + "/model.safetensors");
  }
  ASSERT_GT(files[0].size(), 3000000u);
  EXPECT_TRUE(files[0] == files[1])
      << "the allreduce row job's model differs from the dense job's";
}

TEST(SparseEmbeddingsRunTest, AsyncTrains) {
  const Result r = RunCommand(Job(
      "--mode=async --epochs=1 --max_steps_per_epoch=10 --sparse_embeddings"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[worker0\] Step10: [0-9.]+ data/sec, loss )")))
      << r.output;
  EXPECT_EQ(Accuracies(r.output).size(), 1u) << r.output;
}

TEST(SparseEmbeddingsRunTest, RefusalsAreOneLineAndExit2) {
  Result r = RunCommand(std::string("cli/pstrain run --model=bert_tiny "
                                    "--dataset=tokens --sparse_embeddings "
                                    "--data_dir=") +
                        kTokens);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: --sparse_embeddings: true with model bert_tiny; "
            "expected a model with an untied embedding table "
            "(bert_tiny_untied, bert_base_untied: bert_tiny and bert_base tie "
            "theirs to the MLM head, whose gradient is dense)\n");
  r = RunCommand(Job("--sparse_embeddings --weight_decay=0.01"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--sparse_embeddings: true with optimizer adam and "
                          "weight_decay 0.01; expected 0"),
            std::string::npos)
      << r.output;
  r = RunCommand(
      Job("--sparse_embeddings --compression=topk:0.01 --momentum_correction"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--sparse_embeddings: true with momentum_correction; "
                          "expected false"),
            std::string::npos)
      << r.output;
}

}  // namespace
