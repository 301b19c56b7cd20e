// bert_tiny on the real English corpus, end to end: text:train_tokenizer
// trains a 2,000-piece tokenizer on Debian's fortunes (scripts/setup.sh
// installs the package) and writes the corpus as a token file of 128-token
// sequences; this test reads it, masks a batch as BERT and runs bert_tiny
// training steps with SGD on it. This binary links the model (and so
// protobuf), never SentencePiece (third_party/BUILD).
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/model.h"
#include "text/mlm_data.h"

namespace pstrain {
namespace {

TEST(BertFortunes, TokenizesTheCorpusAndBertTinyLearnsABatch) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string tokens = dir + "/fortunes.tokens";
  const std::string command = absl::StrCat(
      "text/train_tokenizer --vocab_size=2000 --seq_len=128 --output=", dir,
      "/fortunes.model --tokens_output=", tokens, " > ", dir, "/tool.log");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  absl::StatusOr<TokenFile> file = ReadTokenFile(tokens);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->vocab_size, 2000);
  EXPECT_EQ(file->sequences.seq_len, 128);
  EXPECT_GT(file->sequences.size(), 5000);  // About 7,000 with 2,000 pieces.

  absl::StatusOr<MlmMasker> masker = MlmMasker::Create(2000, {});
  ASSERT_TRUE(masker.ok());
  const std::vector<int64_t> indices = {0, 1, 2, file->sequences.size() - 1};
  const MlmBatch batch = MakeMlmBatch(file->sequences, indices, *masker, 1, 0);
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  ModelOptions options;
  options.transformer_dropout = 0.0f;
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("bert_tiny", {128}, 2000, options, cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> losses;
  for (int step = 0; step < 5; ++step) {
    absl::StatusOr<float> loss =
        (*model)->ForwardBackward(batch.ids, batch.padding_mask, batch.labels);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    for (Param* p : (*model)->params()) {  // SGD, learning rate 1.
      for (int64_t i = 0; i < p->value.size(); ++i) {
        p->value.data()[i] -= p->grad.data()[i];
      }
    }
  }
  // Near uniform over the vocabulary at BERT's initialisation, then
  // fitting the batch.
  EXPECT_NEAR(losses[0], std::log(2000.0), 0.5);
  EXPECT_LT(losses.back(), losses[0] - 0.5)
      << losses[0] << " -> " << losses.back();
}

}  // namespace
}  // namespace pstrain
