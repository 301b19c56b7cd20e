// Starts the real binaries through `pstrain run` and checks what a user sees:
// the step and epoch lines, the table, the JSON, the exact errors for bad
// input (exit code 2, nothing started), and that a failing process stops the
// job with exit code 1 and leaves no process behind.
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/flags_util.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/results.pb.h"
#include "tests/cli_test_util.h"
#include "worker/image_write.h"

namespace {

using pstrain::testing::CountProcesses;
using pstrain::testing::HaveFashionMnist;
using pstrain::testing::TempDir;
using Result = pstrain::testing::CommandResult;

Result RunPstrain(const std::string& args) {
  return pstrain::testing::RunCommand("cli/pstrain run " + args);
}

// `path` (a --results_json file) into `result`; false if it does not parse.
bool ReadRunResult(const std::string& path, pstrain::RunResult* result) {
  return google::protobuf::util::JsonStringToMessage(
             pstrain::testing::ReadTextFile(path), result)
      .ok();
}

TEST(RunCliTest, SmallJobPrintsStepEpochLinesTableAndJson) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string json_path = TempDir() + "/results.json";
  const std::string metrics_dir = TempDir() + "/metrics";
  const Result r = RunPstrain(
      "--epochs=2 --max_steps_per_epoch=30 --log_every_steps=10 "
      "--metrics_dir=" +
      metrics_dir + " --results_json=" + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The seeds' line, then loss, lr, the step of the run's total and the
  // time left.
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\[worker0\] Step10: [0-9]+\.[0-9]{2} data/sec, loss )"
                 R"([0-9]+\.[0-9]{4}, lr 0\.001, step 10/60, ETA [0-9]+:)"
                 R"([0-9]{2}\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[worker0\] Step60: [0-9.]+ data/sec)")));
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\[worker0\] Epoch 1 in [0-9]+\.[0-9]{2} sec, test )"
                 R"(time [0-9]+\.[0-9]{2} sec, test accuracy: 0\.[0-9]{4})")))
      << r.output;
  EXPECT_NE(r.output.find("[ps0] all workers done"), std::string::npos);
  EXPECT_NE(r.output.find("[ps1] all workers done"), std::string::npos);
  EXPECT_NE(
      r.output.find("| #PS | #Workers | Mode | Model | Batchsize | Epochs "
                    "| Steps | Runtime | Throughput (data/sec) | Test "
                    "accuracy |"),
      std::string::npos);
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\| 2 \| 2 \| sync \| lenet5 \| 64 \| 2 \| 60 \| )")));

  pstrain::RunResult result;
  ASSERT_TRUE(ReadRunResult(json_path, &result))
      << pstrain::testing::ReadTextFile(json_path);
  EXPECT_EQ(result.num_ps(), 2);
  EXPECT_EQ(result.num_workers(), 2);
  EXPECT_EQ(result.steps(), 60);
  EXPECT_EQ(result.num_parameters(), 61706);
  EXPECT_EQ(result.epoch_results_size(), 2);
  // 60 steps of global batch 128 already learn most of Fashion-MNIST.
  EXPECT_GT(result.test_accuracy(), 0.55);
  EXPECT_GT(result.throughput_samples_per_sec(), 0);
  // Throughput counts every worker's samples: 2 * 64 * 60 over the runtime.
  EXPECT_NEAR(result.throughput_samples_per_sec() * result.runtime_seconds(),
              2 * 64 * 60, 1e-6 * 7680);
  EXPECT_EQ(CountProcesses("pstrain_ps"), 0);
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);

  // The metrics files agree with the run's totals: each worker's interval
  // rows cover its 60 steps (64 samples each), worker 0's evaluation rows
  // hold the epochs' test results.
  for (int w = 0; w < 2; ++w) {
    const std::string base = metrics_dir + "/worker" + std::to_string(w);
    std::istringstream csv(pstrain::testing::ReadTextFile(base + ".csv"));
    std::string header;
    std::getline(csv, header);
    EXPECT_EQ(header,
              "step,epoch,wall_time_s,elapsed_s,interval_steps,loss,lr,"
              "samples_per_sec,job_samples_per_sec,compute_ms,exchange_ms,"
              "test_loss,test_accuracy,forward_ms,backward_ms,push_ms,"
              "barrier_wait_ms,pull_ms,allreduce_ms,bytes_pushed,"
              "bytes_pulled,old_workers,workers,old_shards,shards,"
              "membership_change_ms");
    std::istringstream jsonl(pstrain::testing::ReadTextFile(base + ".jsonl"));
    int64_t steps = 0;
    int rows = 0;
    std::vector<double> accuracies;
    for (std::string line; std::getline(jsonl, line); ++rows) {
      const nlohmann::json row = nlohmann::json::parse(line);
      if (row["interval_steps"].is_number()) {
        steps += row["interval_steps"].get<int64_t>();
        EXPECT_EQ(row["step"].get<int64_t>() % 10, 0) << line;
        EXPECT_EQ(row["lr"].get<double>(), 0.001) << line;
        EXPECT_GT(row["loss"].get<double>(), 0) << line;
        EXPECT_GT(row["samples_per_sec"].get<double>(), 0) << line;
        EXPECT_EQ(row["job_samples_per_sec"].is_number(), w == 0) << line;
        // Sync PS phases: forward and backward, push, barrier wait, pull;
        // every step pushes and pulls all 61706 parameters (4 bytes each,
        // and the messages' envelopes); no allreduce.
        for (const char* phase : {"forward_ms", "backward_ms", "push_ms",
                                  "barrier_wait_ms", "pull_ms"}) {
          EXPECT_GE(row[phase].get<double>(), 0) << phase << " " << line;
        }
        EXPECT_GT(row["forward_ms"].get<double>(), 0) << line;
        EXPECT_GT(row["backward_ms"].get<double>(), 0) << line;
        EXPECT_TRUE(row["allreduce_ms"].is_null()) << line;
        for (const char* bytes : {"bytes_pushed", "bytes_pulled"}) {
          EXPECT_GE(row[bytes].get<double>(), 61706 * 4) << bytes << line;
          EXPECT_LT(row[bytes].get<double>(), 61706 * 4 * 1.05)
              << bytes << line;
        }
      } else {
        accuracies.push_back(row["test_accuracy"].get<double>());
      }
    }
    EXPECT_EQ(steps, 60) << base;
    EXPECT_EQ(rows, w == 0 ? 8 : 6) << base;
    ASSERT_EQ(accuracies.size(), w == 0 ? 2u : 0u) << base;
    for (size_t e = 0; e < accuracies.size(); ++e) {
      EXPECT_NEAR(accuracies[e], result.epoch_results(e).test_accuracy(),
                  1e-12);
    }
    int event_files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(
             metrics_dir + "/tb/worker" + std::to_string(w))) {
      event_files += entry.path().filename().string().rfind(
                         "events.out.tfevents.", 0) == 0;
    }
    EXPECT_EQ(event_files, 1) << w;
  }
}

// Allreduce mode: no PS processes; workers rendezvous through the
// coordinator's key-value store and train the same model as sync PS mode
// (the weights are compared in //tests:sync_equivalence_test).
TEST(RunCliTest, AllreduceModeRunsWithoutParameterServers) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Result r = RunPstrain(
      "--mode=allreduce --epochs=1 --max_steps_per_epoch=30 "
      "--log_every_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("[ps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ring allreduce over 2 workers"), std::string::npos)
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\| 0 \| 2 \| allreduce \| lenet5 \| 64 \| 1 \| 30 \| )")))
      << r.output;
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);
}

// A cosine schedule with neither --lr_total_steps nor
// --max_steps_per_epoch decays over the job's steps as the workers count
// them from the data: 60,000 images in batches of 1,000 on 2 workers, 30
// steps, which worker 0 gives the shards at their Init. The model equals
// the one of --lr_total_steps=30 byte for byte, with the shards' optimizer
// (sync) and with the workers' (allreduce).
TEST(RunCliTest, CosineScheduleTakesItsHorizonFromTheData) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  for (const std::string mode : {"sync", "allreduce"}) {
    std::string models[2];
    for (int explicit_total = 0; explicit_total < 2; ++explicit_total) {
      const std::string dir =
          TempDir() + "/cosine_" + mode + std::to_string(explicit_total);
      const Result r = RunPstrain(
          "--mode=" + mode +
          " --epochs=1 --batch_size=1000 --lr_schedule=cosine --lr=0.01 "
          "--log_every_steps=10 --checkpoint_dir=" +
          dir + (explicit_total ? " --lr_total_steps=30" : ""));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("step 30/30"), std::string::npos) << r.output;
      std::ifstream in(dir + "/model.safetensors", std::ios::binary);
      models[explicit_total] = std::string(std::istreambuf_iterator<char>(in),
                                           std::istreambuf_iterator<char>());
    }
    ASSERT_GT(models[0].size(), 100000u) << mode;
    EXPECT_TRUE(models[0] == models[1])
        << mode << ": the model of the horizon from the data differs";
  }
  // Past the warmup or refused, by the worker that counted.
  const Result r = RunPstrain(
      "--epochs=1 --batch_size=1000 --lr_schedule=cosine --warmup_steps=30");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("lr_total_steps: the job's 30 steps with a cosine "
                          "schedule; expected more than warmup_steps (30)"),
            std::string::npos)
      << r.output;
}

// --priority_pulls takes 256-KiB partitions unless --partition_bytes says
// otherwise (P3's slices), and trains the same model bit for bit as plain
// pulls at the 4-MiB default and as priority pulls at 64 KiB, which cuts
// fc1 (192,000 bytes) in three: a sync step sums each element in worker
// order whatever the chunk it travels in.
TEST(RunCliTest, PriorityPullsTakeSmallPartitionsAndTheSameModel) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string flags[3] = {
      "", " --priority_pulls=true",
      " --priority_pulls=true --partition_bytes=65536"};
  const int64_t partition_bytes[3] = {4 << 20, 256 << 10, 64 << 10};
  std::string models[3];
  for (int run = 0; run < 3; ++run) {
    const std::string dir = TempDir() + "/priority" + std::to_string(run);
    const std::string json_path = dir + ".json";
    const Result r = RunPstrain(
        "--epochs=1 --max_steps_per_epoch=20 "
        "--checkpoint_dir=" +
        dir + " --results_json=" + json_path + flags[run]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    pstrain::RunResult result;
    ASSERT_TRUE(ReadRunResult(json_path, &result))
        << pstrain::testing::ReadTextFile(json_path);
    EXPECT_EQ(result.partition_bytes(), partition_bytes[run]) << flags[run];
    models[run] = pstrain::testing::ReadTextFile(dir + "/model.safetensors");
  }
  ASSERT_GT(models[0].size(), 100000u);
  EXPECT_TRUE(models[0] == models[1]) << "priority pulls changed the model";
  EXPECT_TRUE(models[0] == models[2]) << "64-KiB chunks changed the model";
  // A size given is kept; it is checked as any other.
  const Result r =
      RunPstrain("--priority_pulls=true --partition_bytes=6 --epochs=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--partition_bytes"), std::string::npos) << r.output;
}

// Backup workers (issue 25): 3 workers, each step aggregating the first 2,
// worker 2 slowed by 40 ms a step (a LeNet-5 step takes a few ms here):
// the job finishes its 60 steps, worker 2's late steps are dropped and
// counted, and it skips ahead to the shards' version (its step count
// jumps) rather than holding the others back.
TEST(RunCliTest, BackupWorkersLeaveTheStragglerBehind) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Result r = RunPstrain(
      "--num_workers=3 --backup_workers=1 --straggler=2:40 --epochs=1 "
      "--max_steps_per_epoch=60 --log_every_steps=20");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch late;
  ASSERT_TRUE(std::regex_search(
      r.output, late,
      std::regex(R"(\[worker2\] worker 2: ([0-9]+) steps ended late \()"
                 R"(their gradients dropped: 2 of 3 workers per step\))")))
      << r.output;
  // Late again and again: 40 ms against the others' few. How many of its
  // steps it gets to run before the fast workers finish their 60 depends on
  // their speed (it skips ahead to the shards' version each time: its
  // late steps were 10 or more alone on 2 cores, 8 and 9 with the suite
  // running two tests at once), so the count is held against theirs below,
  // not a fixed number.
  EXPECT_GE(std::stoi(late[1].str()), 3) << r.output;
  // The fast workers are seldom late: each step has 2 admitted workers (a
  // loaded machine, or a sanitized build, makes one of them miss a step
  // now and then: 8 of 60 once with four tests on 2 cores, when the
  // straggler was late 31 times). So each is late in at most a quarter of
  // the job's 60 steps, and less often than the straggler.
  for (const char* fast : {"0", "1"}) {
    std::smatch fast_late;
    if (std::regex_search(
            r.output, fast_late,
            std::regex(std::string(R"(\[worker)") + fast + R"(\] worker )" +
                       fast + R"(: ([0-9]+) steps ended late)"))) {
      EXPECT_LE(4 * std::stoi(fast_late[1].str()), 60) << r.output;
      EXPECT_LT(std::stoi(fast_late[1].str()), std::stoi(late[1].str()))
          << r.output;
    }
  }
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\| 2 \| 3 \| sync \| lenet5 \| 64 \| 1 \| 60 \| )")))
      << r.output;
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);
}

// Fashion-MNIST written out as JPEG class folders by export_image_folder,
// then trained on with --stream_images: the workers list the files and
// decode each batch on an input thread as they train.
TEST(RunCliTest, StreamedImageFolderTrains) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string tree = TempDir() + "/fmnist_jpeg";
  const Result exported = pstrain::testing::RunCommand(
      "tools/export_image_folder --output_dir=" + tree + " --quality=90");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("wrote 60000 training and 10000 test images"),
            std::string::npos)
      << exported.output;
  const Result r = RunPstrain(
      "--dataset=image_folder --data_dir=" + tree +
      " --image_size=28 --stream_images --epochs=1 --max_steps_per_epoch=60 "
      "--log_every_steps=30");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("streaming 60000 image files, decoded on 1 input "
                          "threads"),
            std::string::npos)
      << r.output;
  // 60 steps of 2 workers at batch 64: far from trained, far from chance.
  std::smatch accuracy;
  ASSERT_TRUE(std::regex_search(
      r.output, accuracy,
      std::regex(R"(\| lenet5 \| 64 \| 1 \| 60 \| [0-9.]+ s \| [0-9.]+ \| )"
                 R"((0\.[0-9]{4}) \|)")))
      << r.output;
  EXPECT_GT(std::stod(accuracy[1].str()), 0.5) << r.output;
  // The CIFAR recipe's padded crop and flip on the same files.
  const Result augmented = RunPstrain(
      "--dataset=image_folder --data_dir=" + tree +
      " --image_size=28 --stream_images --augment=pad_crop --epochs=1 "
      "--max_steps_per_epoch=40 --log_every_steps=20");
  ASSERT_EQ(augmented.exit_code, 0) << augmented.output;
  EXPECT_NE(augmented.output.find("decoded on 1 input threads, augmented by "
                                  "pad_crop"),
            std::string::npos)
      << augmented.output;
}

// An image folder of class folders only has no test split: the run trains
// and says so, its table and results carry no test accuracy (it printed
// 0.0000, an evaluation of no samples), and `pstrain eval` refuses it.
TEST(RunCliTest, AFolderWithoutATestSplitReportsNoAccuracy) {
  const std::string tree = TempDir() + "/no_test_split";
  std::filesystem::remove_all(tree);
  for (int i = 0; i < 8; ++i) {
    const std::string dir = tree + "/c" + std::to_string(i % 2);
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(pstrain::WritePngFile(dir + "/" + std::to_string(i) + ".png",
                                      28, 28, 1,
                                      std::vector<uint8_t>(28 * 28, 30 * i))
                    .ok());
  }
  const std::string ckpt = TempDir() + "/no_test_split_ckpt";
  const std::string json_path = TempDir() + "/no_test_split.json";
  const Result r = RunPstrain(
      "--dataset=image_folder --data_dir=" + tree +
      " --num_workers=1 --batch_size=2 --epochs=1 --checkpoint_dir=" + ckpt +
      " --results_json=" + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("has no test split: epochs end without an "
                          "evaluation (no test accuracy)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("accuracy 0.0000"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\| lenet5 \| 2 \| 1 \| 4 \| .* \| - \|)")))
      << r.output;
  pstrain::RunResult result;
  ASSERT_TRUE(ReadRunResult(json_path, &result));
  EXPECT_FALSE(result.has_test_accuracy());
  const Result eval = pstrain::testing::RunCommand(
      "cli/pstrain eval --checkpoint=" + ckpt +
      " --dataset=image_folder --data_dir=" + tree);
  EXPECT_EQ(eval.exit_code, 2) << eval.output;
  EXPECT_NE(eval.output.find("--dataset=image_folder: no test split to "
                             "evaluate on; expected a dataset with one"),
            std::string::npos)
      << eval.output;
}

// An image folder too large to decode into each worker's memory stops the
// run at once, from the headers alone, with exit 2 and one line giving the
// figure and the ways out (issue 37: 70,000 files at 224x224 were
// OOM-killed); so do mixed sizes without --image_size.
TEST(RunCliTest, ImageFolderOverMemoryLimitFailsFastWithExit2) {
  const std::string tree = TempDir() + "/small_tree";
  std::filesystem::remove_all(tree);
  for (int i = 0; i < 4; ++i) {
    const std::string dir = tree + "/train/c" + std::to_string(i % 2);
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(pstrain::WritePngFile(dir + "/" + std::to_string(i) + ".png",
                                      28, 28, 1,
                                      std::vector<uint8_t>(28 * 28, 100 + i))
                    .ok());
  }
  const auto start = std::chrono::steady_clock::now();
  const Result r = RunPstrain("--dataset=image_folder --data_dir=" + tree +
                              " --image_size=224 --max_dataset_memory=500K");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: --dataset=image_folder --data_dir=" + tree + ": " +
                tree +
                ": decoding 4 images of 1x224x224 floats needs 802.82 kB, "
                "over the limit of 512.00 kB per worker "
                "(--max_dataset_memory); pass --stream_images to decode "
                "batches while training, or a smaller --image_size\n");
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);

  ASSERT_TRUE(pstrain::WritePngFile(tree + "/train/c1/big.png", 32, 30, 1,
                                    std::vector<uint8_t>(32 * 30, 7))
                  .ok());
  const Result mixed = RunPstrain("--dataset=image_folder --data_dir=" + tree);
  EXPECT_EQ(mixed.exit_code, 2) << mixed.output;
  EXPECT_EQ(mixed.output,
            "pstrain: error: --dataset=image_folder --data_dir=" + tree + ": " +
                tree + ": images differ in size: 28x28 (" + tree +
                "/train/c0/0.png) and 30x32 (" + tree +
                "/train/c1/big.png); set --image_size to resize "
                "them all to one size\n");
}

TEST(RunCliTest, BadInputGetsOneLineErrorAndExitCode2) {
  struct Case {
    std::string args;
    std::string error;
  };
  const Case cases[] = {
      {"--model=resnet9000",
       "pstrain: error: --model: \"resnet9000\" is not a known model; "
       "expected one of: alexnet, bert_base, bert_base_untied, bert_tiny, "
       "bert_tiny_untied, lenet5, mlp, resnet101, resnet18, resnet34, "
       "resnet50, vgg16\n"},
      {"--batch_size=0",
       "pstrain: error: --batch_size: 0; expected 1 to 65536\n"},
      {"--stream_images",
       "pstrain: error: --stream_images: true with dataset fashion_mnist; "
       "expected false (streaming is for image_folder: IDX and record files "
       "are memory-mapped already)\n"},
      {"--augment=pad_crop",
       "pstrain: error: --augment: pad_crop without stream_images; expected "
       "none (augmentation runs in the input pipeline of a streamed "
       "image_folder)\n"},
      {"--dataset=image_folder --data_dir=/d --augment=flip",
       "pstrain: error: --augment: \"flip\"; expected none, "
       "random_resized_crop or pad_crop; see pstrain help run\n"},
      {"--batch_size=-4",
       "pstrain: error: --batch_size: -4; expected 1 to 65536\n"},
      {"--data_dir=/nonexistent",
       "pstrain: error: --dataset=fashion_mnist --data_dir=/nonexistent: "
       "/nonexistent/train-images-idx3-ubyte: no such file (expected an IDX "
       "file, gzipped or plain)\n"},
      {"--dataset=cifar100",
       "pstrain: error: --dataset: \"cifar100\" is not a known dataset; "
       "expected one of: cifar10, fashion_mnist, image_folder, mnist, "
       "records, synthetic, synthetic_tokens, tokens\n"},
      {"--backend=cuda",
       "pstrain: error: --backend=cuda --gpu=0: this build has no CUDA "
       "backend; rebuild with bazel build --config=cuda\n"},
      {"--backend=tpu",
       "pstrain: error: --backend: \"tpu\"; expected cpu or cuda; see "
       "pstrain help run\n"},
      {"--dataset=cifar10 --data_dir=/nonexistent",
       "pstrain: error: --dataset=cifar10 --data_dir=/nonexistent: "
       "/nonexistent/data_batch_1.bin: no such file (expected a CIFAR-10 "
       "binary batch)\n"},
      {"--mode=semi",
       "pstrain: error: --mode: \"semi\"; expected sync, async or "
       "allreduce; see pstrain help run\n"},
      // What the job writes is checked before it trains.
      {"--results_json=no_such_folder/r.json",
       "pstrain: error: --results_json=no_such_folder/r.json: its folder "
       "no_such_folder does not exist\n"},
      {"--results_json=/tmp",
       "pstrain: error: --results_json=/tmp: a folder; expected a file "
       "name\n"},
      {"--metrics_dir=/dev/null/m",
       "pstrain: error: --metrics_dir=/dev/null/m: /dev/null is not a "
       "folder\n"},
  };
  for (const Case& c : cases) {
    const Result r = RunPstrain(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_EQ(r.output, c.error) << c.args;
  }
}

// pstrain compare: two modes at 1 and 2 workers, each run real, then the
// tables and the files (the plot needs gnuplot, as setup.sh installs).
// --wire_dtype=bf16 goes to every row: the PS pushes and pulls in bf16,
// allreduce averages in bf16; the rows are named mode+bf16 and the title
// says so.
TEST(CompareCliTest, RunsEveryConfigurationAndWritesTablesAndPlot) {
  const std::string out = TempDir() + "/compare";
  const Result r = pstrain::testing::RunCommand(
      "cli/pstrain compare --model=lenet5 --workers=1,2 "
      "--modes=ps_sync,allreduce --num_ps=1 --steps=20 "
      "--log_every_steps=10 --wire_dtype=bf16 --out_dir=" +
      out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ring allreduce over 2 workers, buckets of "
                          "26214400 bytes, gradients in bf16"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("one machine, gradients in bf16 on the wire in "
                          "every row"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(
                "=== run 4/4: allreduce+bf16, 0 PS, 2 workers, batch 64 ==="),
            std::string::npos)
      << r.output;
  // Two workers of 20 steps each: the same data as one worker of 40, so the
  // 2-worker rows report 20 steps per worker and a speedup column; the CV
  // column is "-" with one repeat.
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(
          R"(\| 1 \| 2 \| ps_sync\+bf16 \| 1 \| 64 \| 20 \| [0-9.]+ s \| [0-9.]+ \| - \| [0-9.]+x \| [0-9.]+x \| 0\.[0-9]{4} \|)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(
          R"(\| 1 \| 1 \| allreduce\+bf16 \| 0 \| 64 \| 20 \| [0-9.]+ s \| [0-9.]+ \| - \| 1\.00x \| - \| 0\.[0-9]{4} \|)")))
      << r.output;
  for (const char* file : {"results.md", "results.csv", "results.json",
                           "throughput.gp", "throughput.png"}) {
    std::string contents;
    ASSERT_TRUE(pstrain::ReadFile(out + "/" + file, &contents).ok()) << file;
    EXPECT_GT(contents.size(), 100u) << file;
  }
  std::string png;
  ASSERT_TRUE(pstrain::ReadFile(out + "/throughput.png", &png).ok());
  EXPECT_EQ(png.substr(1, 3), "PNG");
  std::string csv;
  ASSERT_TRUE(pstrain::ReadFile(out + "/results.csv", &csv).ok());
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);
}

// A preset's flags apply where the command line gives none (here the model
// and modes are overridden to keep the test short), its strong scaling
// splits the steps, and its report's table comes first.
TEST(CompareCliTest, PresetPrintsItsReportsTable) {
  const std::string out = TempDir() + "/compare_preset";
  const Result r = pstrain::testing::RunCommand(
      "cli/pstrain compare --preset=mnist_resnet --model=lenet5 "
      "--modes=ps_sync --steps=20 --noplot --out_dir=" +
      out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("=== run 2/2: ps_sync, 1 PS, 2 workers, batch 64 ==="),
      std::string::npos)
      << r.output;
  std::string md;
  ASSERT_TRUE(pstrain::ReadFile(out + "/results.md", &md).ok());
  EXPECT_NE(md.find("Preset mnist_resnet: ResNets on MNIST"), std::string::npos)
      << md;
  // 20 steps of batch 64 at 1 worker, 10 each at 2: 1280 of Fashion-MNIST's
  // 60000 samples, 0.02 of an epoch, in both rows.
  EXPECT_TRUE(std::regex_search(
      md,
      std::regex(
          R"(\*\*ps_sync, 1 PS\*\*\n\n\| #Nodes \| #CPU workers \| )"
          R"(Epoch \| Batchsize \| Steps \| Runtime \| Speedup \|\n)"
          R"(\|---:\|---:\|---:\|---:\|---:\|---:\|---:\|\n)"
          R"(\| 1 \| 1 \| 0\.02 \| 64 \| 20 \| [0-9.]+ s \| 1\.00x \|\n)"
          R"(\| 1 \| 2 \| 0\.02 \| 64 \| 10 \| [0-9.]+ s \| [0-9.]+x \|\n)")))
      << md;
  // The scaling table follows, with the model the command line chose.
  EXPECT_NE(md.find("lenet5 on fashion_mnist"), std::string::npos) << md;
  EXPECT_NE(md.find("| #Nodes | #Workers | Mode |"), std::string::npos);
}

TEST(CompareCliTest, BadInputGetsOneLineErrorBeforeAnythingStarts) {
  const std::string out = TempDir() + "/compare_bad";
  struct Case {
    std::string args;
    std::string error;
  };
  const Case cases[] = {
      {"--workers=1,4096",
       "--workers=4096: this machine has .* cores; at most .* local workers "
       "can run \\(use a cluster, or --worker_netns\\)"},
      {"--modes=ps_sync,allreduce_nccl",
       "--modes=allreduce_nccl: this build has no NCCL collective"},
      {"--modes=ps_sync,gossip", "--modes: \"gossip\" is not a mode"},
      {"--workers=1,x", "--workers=1,x: \"x\" is not a positive integer"},
      {"--num_ps=0", "--num_ps=0: \"0\" is not a positive integer"},
      {"--steps=-1", "--steps=-1: expected >= 1, or 0 for whole --epochs"},
      {"--workers=4 --batch_size=20000",
       "--batch_size=20000: larger than each of 4 workers' 15000 training "
       "samples"},
      {"--compute=synthetic --model_bytes=6 --steps=2",
       "--model_bytes: 6; expected a multiple of 4 from 4 to 17179869184 "
       "bytes"},
      {"--compute=synthetic --backward_fraction=1.5 --steps=2",
       "backward_fraction: 1.5; expected 0 to 1"},
      {"--ps_netns=a:10.0.0.1", "--ps_netns and --worker_netns: give both"},
      {"--preset=imagenet",
       "--preset=imagenet: no such preset; expected one of mnist_resnet"},
      {"--scaling=linear", "--scaling=linear: expected weak"},
      {"--steps=0 --scaling=strong", "--scaling would be ignored"},
      {"--ps_netns=a:10.0.0.1 --worker_netns=b",
       "--worker_netns=b: \"b\"; expected NETNS:IP entries"},
      // A compressed row's flag with no compressed row to take it.
      {"--momentum_correction --optimizer=sgd --momentum=0.9",
       "momentum_correction: true without a compression with error "
       "feedback"},
      {"--out_dir=/dev/null/o",
       "--out_dir=/dev/null/o: /dev/null is not a "
       "folder"},
  };
  for (const Case& c : cases) {
    const Result r = pstrain::testing::RunCommand(
        "cli/pstrain compare --steps=5 --out_dir=" + out + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_TRUE(std::regex_search(
        r.output, std::regex("^pstrain: error: .*" + c.error + ".*\n$")))
        << c.args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1)
        << r.output;
    // Nothing ran: no results were written.
    std::string unused;
    EXPECT_FALSE(pstrain::ReadFile(out + "/results.md", &unused).ok());
  }
}

// --compression=none,topk:R with DGC's flags: they are the top-k rows'
// (momentum correction, warm-up); the uncompressed PS row runs plain, and
// every row trains (synthetic compute, a few steps).
TEST(CompareCliTest, CompressionFlagsGoToTheCompressedRowsOnly) {
  const std::string out = TempDir() + "/compare_dgc";
  const Result r = pstrain::testing::RunCommand(
      "cli/pstrain compare --compute=synthetic --compute_ms=5 "
      "--model_bytes=400000 --modes=ps_sync,allreduce --workers=2 "
      "--num_ps=1 --steps=6 --compression=none,topk:0.01 "
      "--momentum_correction --compression_warmup_steps=3 --optimizer=sgd "
      "--momentum=0.9 --nesterov --out_dir=" +
      out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string md;
  ASSERT_TRUE(pstrain::ReadFile(out + "/results.md", &md).ok());
  EXPECT_NE(md.find("| ps_sync | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| ps_sync+topk:0.01 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| allreduce | 0 |"), std::string::npos) << md;
}

// --compute=synthetic --model=NAME: the synthetic step exchanges that
// model's tensors (LeNet-5's 61,706 parameters on Fashion-MNIST's input:
// 246,824 bytes, the default run's), not --model_bytes.
TEST(CompareCliTest, SyntheticComputeTakesTheModelsTensors) {
  const std::string out = TempDir() + "/compare_synthetic_layers";
  const Result r = pstrain::testing::RunCommand(
      "cli/pstrain compare --compute=synthetic --model=lenet5 --compute_ms=5 "
      "--backward_fraction=0.5 --modes=ps_sync,allreduce --workers=2 "
      "--num_ps=1 --steps=3 --out_dir=" +
      out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("246824 bytes of gradients in 10 tensors shaped "
                          "like lenet5's"),
            std::string::npos)
      << r.output;
  std::string md;
  ASSERT_TRUE(pstrain::ReadFile(out + "/results.md", &md).ok());
  EXPECT_NE(md.find("| ps_sync | 1 | 246824 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| allreduce | 0 | 246824 |"), std::string::npos) << md;
}

TEST(RunCliTest, CorruptDatasetGetsOneLineErrorAndExitCode2) {
  const std::string dir = TempDir() + "/corrupt";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  // A gzip stream cut short: an IDX header declaring 60000 images of 28x28,
  // then only 100 bytes.
  gzFile f = gzopen((dir + "/train-images-idx3-ubyte.gz").c_str(), "wb");
  const unsigned char header[] = {0, 0, 8, 3,  0, 0, 0xea, 0x60,
                                  0, 0, 0, 28, 0, 0, 0,    28};
  gzwrite(f, header, sizeof(header));
  const std::string some(100, 'x');
  gzwrite(f, some.data(), some.size());
  gzclose(f);
  const Result r = RunPstrain("--data_dir=" + dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: --dataset=fashion_mnist --data_dir=" +
                          dir + ": " + dir +
                          "/train-images-idx3-ubyte.gz: truncated or corrupt; "
                          "expected 47040000 bytes of data after the header\n");
}

TEST(RunCliTest, FailingWorkerStopsTheJobAndLeavesNoProcess) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  // Workers that exit with code 1 at once; the shards must be stopped.
  const Result r = RunPstrain("--worker_binary=/bin/false");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(pstrain: error: job-1 FAILED: worker [01] \(not )"
                 R"(registered\) failed: exited with exit code 1\n$)")))
      << r.output;
  EXPECT_EQ(CountProcesses("pstrain_ps"), 0);
}

TEST(RunCliTest, MissingBinaryIsNamedBeforeAnythingStarts) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Result r = RunPstrain("--ps_binary=/nonexistent/pstrain_ps");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(
      r.output,
      "pstrain: error: /nonexistent/pstrain_ps: not an executable; build "
      "it with bazel build //server:pstrain_ps //worker:pstrain_worker\n");
}

// The trained model is kept: worker 0 writes model.safetensors at the end,
// `pstrain eval` gives the accuracy the run reported from it, the folder is
// never overwritten, and --init_from refuses a file of another model before
// anything starts.
TEST(RunCliTest, CheckpointDirKeepsTheModelThatEvalScores) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = TempDir() + "/ckpt";
  const std::string json_path = TempDir() + "/ckpt_results.json";
  const Result r =
      RunPstrain("--epochs=1 --max_steps_per_epoch=40 --checkpoint_dir=" + dir +
                 " --results_json=" + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Saved the trained model (40 steps) to " + dir +
                          "/model.safetensors"),
            std::string::npos)
      << r.output;
  pstrain::RunResult result;
  ASSERT_TRUE(ReadRunResult(json_path, &result));

  const Result eval =
      pstrain::testing::RunCommand("cli/pstrain eval --checkpoint=" + dir);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  char accuracy[32];
  std::snprintf(accuracy, sizeof(accuracy), "test accuracy: %.4f",
                result.test_accuracy());
  EXPECT_NE(eval.output.find(accuracy), std::string::npos)
      << eval.output << " expected " << accuracy;
  EXPECT_NE(eval.output.find("lenet5 after 40 steps"), std::string::npos)
      << eval.output;
  // The evaluation batch changes nothing but memory and time.
  const Result small_batches = pstrain::testing::RunCommand(
      "cli/pstrain eval --batch_size=7 --checkpoint=" + dir);
  ASSERT_EQ(small_batches.exit_code, 0) << small_batches.output;
  EXPECT_NE(small_batches.output.find(accuracy), std::string::npos)
      << small_batches.output;
  // Another dataset holding the same test split, whose training images are
  // darker: eval standardises with the model file's statistics (the run's
  // training set's), so the score is the run's, not that of inputs shifted
  // by the other set's mean.
  const std::string dark = TempDir() + "/dark_fashion";
  std::filesystem::create_directories(dark);
  for (const char* name :
       {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    std::filesystem::copy_file(
        std::string(pstrain::testing::kFashionMnistDir) + "/" + name,
        dark + "/" + name, std::filesystem::copy_options::overwrite_existing);
  }
  {
    gzFile in = gzopen((std::string(pstrain::testing::kFashionMnistDir) +
                        "/train-images-idx3-ubyte.gz")
                           .c_str(),
                       "rb");
    ASSERT_NE(in, nullptr);
    std::vector<unsigned char> images(16 + 200 * 784);
    ASSERT_EQ(gzread(in, images.data(), images.size()),
              static_cast<int>(images.size()));
    gzclose(in);
    images[6] = 0;  // 200 images.
    images[7] = 200;
    for (size_t i = 16; i < images.size(); ++i) images[i] /= 4;
    std::ofstream(dark + "/train-images-idx3-ubyte", std::ios::binary)
        .write(reinterpret_cast<const char*>(images.data()), images.size());
    std::vector<unsigned char> labels = {0, 0, 8, 1, 0, 0, 0, 200};
    labels.resize(8 + 200, 3);
    std::ofstream(dark + "/train-labels-idx1-ubyte", std::ios::binary)
        .write(reinterpret_cast<const char*>(labels.data()), labels.size());
  }
  const Result other = pstrain::testing::RunCommand(
      "cli/pstrain eval --dataset=mnist --data_dir=" + dark +
      " --checkpoint=" + dir);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find(accuracy), std::string::npos)
      << other.output << " expected " << accuracy;
  const Result no_batch = pstrain::testing::RunCommand(
      "cli/pstrain eval --batch_size=0 --checkpoint=" + dir);
  EXPECT_EQ(no_batch.exit_code, 2) << no_batch.output;
  EXPECT_EQ(no_batch.output,
            "pstrain: error: --batch_size: 0; expected 1 to 65536\n");

  const Result again = RunPstrain("--epochs=1 --checkpoint_dir=" + dir);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("not empty (holds model.safetensors)"),
            std::string::npos)
      << again.output;

  const Result wrong =
      RunPstrain("--model=mlp --init_from=" + dir + "/model.safetensors");
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("--init_from: " + dir +
                              "/model.safetensors: tensor 'fc1.weight'"),
            std::string::npos)
      << wrong.output;

  const Result missing = pstrain::testing::RunCommand(
      "cli/pstrain eval --checkpoint=" + TempDir() +
      "/nothing_here.safetensors");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
}

// `pstrain run`'s flags go through ValidateJobSpec: each range edge, just
// inside and just outside. Nothing starts: a value just inside is shown to
// pass by the next check's error (the ignored --bucket_bytes of a sync
// run, checked after the ranges).
TEST(RunCliTest, FlagRangesAtTheirEdges) {
  const std::string next_check =
      "pstrain: error: --bucket_bytes would be ignored: only allreduce has "
      "gradient buckets, not --mode=sync; see pstrain help run\n";
  const struct {
    std::string inside;
    std::string outside;
    std::string error;
  } cases[] = {
      {"--num_workers=1", "--num_workers=2147483647",
       "--num_workers: 2147483647; expected 1 to 4096"},
      {"--num_workers=4096", "--num_workers=4097",
       "--num_workers: 4097; expected 1 to 4096"},
      {"--num_workers=1", "--num_workers=0",
       "--num_workers: 0; expected 1 to 4096"},
      {"--batch_size=65536", "--batch_size=65537",
       "--batch_size: 65537; expected 1 to 65536"},
      {"--epochs=1", "--epochs=0", "--epochs: 0; expected 1 to 1000000"},
      {"--partition_bytes=4", "--partition_bytes=0",
       "--partition_bytes: 0; expected a multiple of 4 from 4 to 134217728 "
       "bytes"},
      {"--log_every_steps=1", "--log_every_steps=0",
       "--log_every_steps: 0; expected 1 to 1000000000"},
      {"--registration_timeout_s=1", "--registration_timeout_s=0",
       "--registration_timeout_s: 0; expected 1 to 604800 seconds"},
      {"--keep_checkpoints=1", "--keep_checkpoints=0",
       "--keep_checkpoints: 0; expected 1 to 1000"},
      {"--seed=1", "--seed=0", "--seed: 0; expected 1 to 18446744073709551615"},
      {"--max_nonfinite_steps=1000000", "--max_nonfinite_steps=1000001",
       "--max_nonfinite_steps: 1000001; expected 0 to 1000000"},
      {"--lr=10", "--lr=inf", "--lr: inf; expected 1e-30 to 10"},
      {"--lr=0.5", "--lr=nan", "--lr: nan; expected 1e-30 to 10"},
      {"--lr=1e-30", "--lr=0", "--lr: 0; expected 1e-30 to 10"},
      {"--epsilon=1", "--epsilon=inf", "--epsilon: inf; expected 1e-30 to 1"},
      {"--weight_decay=1", "--weight_decay=1.01",
       "--weight_decay: 1.01; expected 0 to 1"},
      {"--beta1=0", "--beta1=1",
       "--beta1: 1; expected 0 <= beta < 1, and below 1 in fp32 (at most "
       "0.99999994)"},
      {"--beta2=0.99999994", "--beta2=0.99999999",
       "--beta2: 0.99999999; expected 0 <= beta < 1, and below 1 in fp32 (at "
       "most 0.99999994)"},
      {"--max_restarts=1000", "--max_restarts=1001",
       "--max_restarts: 1001; expected 0 to 1000"},
      {"--staleness=1000", "--staleness=1001",
       "--staleness: 1001; expected 0 to 1000 steps"},
      {"--backup_workers=1", "--backup_workers=2",
       "--backup_workers: 2; expected 0 to 1 (num_workers - 1)"},
      {"--straggler=1:600000", "--straggler=2:5",
       "--straggler: \"2:5\"; expected WORKER:DELAY_MS with WORKER 0 to 1 "
       "and DELAY_MS 0 to 600000"},
  };
  for (const auto& c : cases) {
    Result r = RunPstrain(c.inside + " --bucket_bytes=8");
    EXPECT_EQ(r.exit_code, 2) << c.inside << ": " << r.output;
    EXPECT_EQ(r.output, next_check) << c.inside;
    r = RunPstrain(c.outside);
    EXPECT_EQ(r.exit_code, 2) << c.outside << ": " << r.output;
    EXPECT_EQ(r.output, "pstrain: error: " + c.error + "\n") << c.outside;
  }
  Result r = RunPstrain("--heartbeat_timeout_s=0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: --heartbeat_timeout_s=0: expected 1 to 86400 "
            "seconds\n");
  r = RunPstrain("--max_restarts=-2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// A flag that the command or its mode would ignore is an error naming it.
TEST(RunCliTest, IgnoredFlagsAreErrors) {
  const struct {
    std::string command;
    std::string error;
  } cases[] = {
      {"run --bucket_bytes=1024",
       "--bucket_bytes would be ignored: only allreduce has gradient "
       "buckets, not --mode=sync"},
      {"run --compute_ms=5",
       "--compute_ms would be ignored: it is for --compute=synthetic"},
      {"run --mode=allreduce --num_ps=2",
       "--num_ps would be ignored: it is for the parameter-server modes "
       "(sync, async), not --mode=allreduce"},
      {"run --mode=allreduce --partition_bytes=4096",
       "--partition_bytes would be ignored: allreduce partitions only the "
       "top-k selection of a --compression and a table's rows "
       "(--sparse_embeddings), and --mode=allreduce has neither"},
      {"run --mode=allreduce --compression=topk:0.01 --delta_pulls=false",
       "--delta_pulls would be ignored: it is for the parameter-server "
       "modes (sync, async), not --mode=allreduce"},
      {"run --compute=synthetic --max_steps_per_epoch=3 --dataset=mnist",
       "--dataset would be ignored: --compute=synthetic reads no dataset"},
      {"run --compute=synthetic --max_steps_per_epoch=3 --model=resnet18 "
       "--model_bytes=400",
       "--model_bytes would be ignored: --compute=synthetic --model=resnet18 "
       "exchanges that model's tensors"},
      {"run --num_classes=10",
       "--num_classes would be ignored: it is for --dataset=synthetic, not "
       "fashion_mnist"},
      {"run --gpu=1", "--gpu would be ignored: it is for --backend=cuda"},
      {"run --steps=5",
       "--steps is not a flag of pstrain run (it would be ignored)"},
      {"run --coordinator=h:1",
       "--coordinator is not a flag of pstrain run (it would be ignored)"},
      {"compare --out_dir=/tmp/x --modes=ps_sync --bucket_bytes=8",
       "--bucket_bytes would be ignored: only allreduce has gradient "
       "buckets, not --modes=ps_sync"},
      {"compare --out_dir=/tmp/x --modes=allreduce --sparse_embeddings "
       "--model=bert_tiny_untied --dataset=synthetic_tokens",
       "--sparse_embeddings would be ignored: compare's allreduce rows stay "
       "dense (the seeds' tables set the row-sparse PS against them), and "
       "--modes=allreduce has no PS mode"},
      {"compare --out_dir=/tmp/x --steps=5 --epochs=3",
       "--epochs would be ignored: --steps sets one epoch of that many steps"},
      {"compare --out_dir=/tmp/x --num_workers=3",
       "--num_workers is not a flag of pstrain compare (it would be "
       "ignored)"},
      {"status --model=mlp",
       "--model is not a flag of pstrain status (it would be ignored)"},
  };
  for (const auto& c : cases) {
    const Result r = pstrain::testing::RunCommand("cli/pstrain " + c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    const std::string command = c.command.substr(0, c.command.find(' '));
    EXPECT_EQ(r.output, "pstrain: error: " + c.error + "; see pstrain help " +
                            command + "\n")
        << c.command;
  }
}

}  // namespace
