// bert_tiny trained end to end through `pstrain run` (issue 41): the
// fortune(6) corpus as the "tokens" dataset (//text:fortunes_tokens), a
// sync job of one shard and two workers; the loss falls, the held-out
// split is evaluated (MLM loss and masked-token accuracy), and the saved
// model.safetensors loads back (`pstrain eval` scores it as the run did).
// Async and allreduce train too, and a resumed run keeps its data
// position.
// A model/dataset mismatch and a corrupt token file stop before anything
// starts, with one line and exit 2.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using Result = pstrain::testing::CommandResult;

constexpr char kTokens[] = "text/fortunes";

// The loss column of worker `j`'s metrics rows, in order.
std::vector<double> Losses(const std::string& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // The header: loss is the sixth column.
  std::vector<double> losses;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    size_t start = 0;
    for (size_t i = 0; i <= line.size(); ++i) {
      if (i == line.size() || line[i] == ',') {
        cells.push_back(line.substr(start, i - start));
        start = i + 1;
      }
    }
    if (cells.size() > 5 && !cells[5].empty()) {
      losses.push_back(std::stod(cells[5]));
    }
  }
  return losses;
}

TEST(BertRunTest, TrainsOnFortunesTokensAndSavesAModelThatLoads) {
  const std::string dir = TempDir() + "/bert_ckpt";
  const std::string metrics = TempDir() + "/bert_metrics";
  const Result r = RunCommand(
      std::string("cli/pstrain run --model=bert_tiny --dataset=tokens "
                  "--data_dir=") +
      kTokens +
      " --num_ps=1 --num_workers=2 --batch_size=8 --epochs=1 "
      "--max_steps_per_epoch=30 --log_every_steps=10 --metrics_dir=" +
      metrics + " --checkpoint_dir=" + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model bert_tiny on cpu: 737104 parameters"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("sequences of 128 tokens, vocabulary 2000"),
            std::string::npos)
      << r.output;
  // Near ln(2000) = 7.6 at BERT's initialisation, then lower on both
  // workers (each trains its own share of the sequences).
  for (const char* worker : {"/worker0.csv", "/worker1.csv"}) {
    const std::vector<double> losses = Losses(metrics + worker);
    ASSERT_EQ(losses.size(), 3u) << worker;
    EXPECT_NEAR(losses[0], 7.5, 0.3) << worker;
    EXPECT_LT(losses[2], losses[0] - 0.5) << worker;
  }
  std::smatch accuracy;
  ASSERT_TRUE(std::regex_search(
      r.output, accuracy,
      std::regex(R"(Epoch 0 in [0-9.]+ sec, test time [0-9.]+ sec, test )"
                 R"(accuracy: ([0-9.]+))")))
      << r.output;
  EXPECT_NE(r.output.find("Saved the trained model (30 steps) to " + dir +
                          "/model.safetensors"),
            std::string::npos)
      << r.output;
  // The file loads into bert_tiny and scores the held-out split as the run
  // did: the masked-token accuracy, and an MLM loss below the initial one.
  const Result eval = RunCommand(
      "cli/pstrain eval --dataset=tokens --data_dir=" + std::string(kTokens) +
      " --checkpoint=" + dir);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("bert_tiny after 30 steps, tokens test set"),
            std::string::npos)
      << eval.output;
  EXPECT_NE(eval.output.find("test accuracy: " + accuracy[1].str()),
            std::string::npos)
      << eval.output << " expected " << accuracy[1];
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(eval.output, loss,
                                std::regex(R"(test loss ([0-9.]+))")))
      << eval.output;
  EXPECT_LT(std::stod(loss[1]), 7.2) << eval.output;
}

std::string BertJob(const std::string& args) {
  return std::string(
             "cli/pstrain run --model=bert_tiny --dataset=tokens "
             "--data_dir=") +
         kTokens + " --num_workers=2 --batch_size=4 --epochs=1 " + args;
}

// The other modes train the same job.
TEST(BertRunTest, AsyncAndAllreduceTrain) {
  for (const char* mode : {"--mode=async --num_ps=1", "--mode=allreduce"}) {
    const Result r = RunCommand(BertJob(
        std::string(mode) + " --max_steps_per_epoch=6 --log_every_steps=6"));
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.output;
    EXPECT_TRUE(std::regex_search(
        r.output, std::regex(R"(\[worker0\] Step6: [0-9.]+ data/sec, loss )")))
        << r.output;
    EXPECT_NE(r.output.find("Epoch 0 in "), std::string::npos) << r.output;
  }
}

// A run resumed from a checkpoint in the middle of an epoch trains the
// batches the uninterrupted run trained (dropout 0: the same losses).
TEST(BertRunTest, ResumeKeepsTheDataPosition) {
  const std::string whole = TempDir() + "/bert_whole";
  const std::string args =
      " --num_ps=1 --max_steps_per_epoch=12 --log_every_steps=6 --dropout=0 "
      "--checkpoint_every_steps=6 --checkpoint_dir=";
  const Result a = RunCommand(BertJob(args + whole));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::regex step12(R"(Step12: [0-9.]+ data/sec, (loss [0-9.]+))");
  std::smatch expected;
  ASSERT_TRUE(std::regex_search(a.output, expected, step12)) << a.output;
  // Only the checkpoint of step 6 to resume from.
  const std::string resumed = TempDir() + "/bert_resumed";
  std::filesystem::create_directories(resumed);
  std::filesystem::copy(whole + "/step-6", resumed + "/step-6",
                        std::filesystem::copy_options::recursive);
  pstrain::testing::WriteTextFile(resumed + "/latest", "step-6\n");
  const Result b = RunCommand(BertJob(args + resumed + " --resume"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Resuming from " + resumed + "/step-6 (step 6"),
            std::string::npos)
      << b.output;
  std::smatch got;
  ASSERT_TRUE(std::regex_search(b.output, got, step12)) << b.output;
  EXPECT_EQ(got[1].str(), expected[1].str());
}

TEST(BertRunTest, MismatchBadFlagsAndCorruptTokensGetOneLineAndExit2) {
  Result r = RunCommand("cli/pstrain run --model=bert_tiny");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: --dataset: fashion_mnist with model bert_tiny; "
            "expected tokens or synthetic_tokens (the model takes token "
            "sequences)\n");
  r = RunCommand(std::string("cli/pstrain run --model=lenet5 --dataset=tokens "
                             "--data_dir=") +
                 kTokens);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: --dataset: tokens with model lenet5; expected an "
            "image dataset (the model takes images, not tokens)\n");
  // Flags the job would ignore, and a length the token file does not have.
  const struct {
    std::string args;
    std::string error;
  } cases[] = {
      {"--seq_len=64",
       "--seq_len would be ignored: it is for --dataset=tokens or "
       "synthetic_tokens, not fashion_mnist; see pstrain help run"},
      {"--dropout=0",
       "--dropout would be ignored: it is for the bert_* models, not lenet5; "
       "see pstrain help run"},
      {std::string("--model=bert_tiny --dataset=tokens --data_dir=") + kTokens +
           " --seq_len=64",
       std::string("--dataset=tokens --data_dir=") + kTokens +
           ": seq_len 64, but " + kTokens +
           "/train.tokens holds sequences of 128 tokens; expected 0 or 128"},
  };
  for (const auto& c : cases) {
    r = RunCommand("cli/pstrain run " + c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, "pstrain: error: " + c.error + "\n");
  }
  const std::string bad = TempDir() + "/bad_tokens";
  std::filesystem::create_directories(bad);
  pstrain::testing::WriteTextFile(bad + "/train.tokens", "PSTOKEN1 cut");
  r = RunCommand(
      "cli/pstrain run --model=bert_tiny --dataset=tokens "
      "--data_dir=" +
      bad);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "pstrain: error: --dataset=tokens --data_dir=" + bad +
                          ": " + bad +
                          "/train.tokens: not a pstrain token file: no "
                          "PSTOKEN1 header\n");
}

}  // namespace
