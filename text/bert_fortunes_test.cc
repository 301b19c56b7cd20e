// bert_tiny on the real English corpus, end to end: text:train_tokenizer
// trains a 2,000-piece tokenizer on Debian's fortunes (scripts/setup.sh
// installs the package) and writes the corpus as token files of 128-token
// sequences (the //text:fortunes_tokens genrule, at build time); this test
// reads the training file, masks a batch as BERT and runs bert_tiny
// training steps with SGD on it. This binary links the model (and so
// protobuf), never SentencePiece (third_party/BUILD).
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/model.h"
#include "text/mlm_data.h"

namespace pstrain {
namespace {

TEST(BertFortunes, TokenizesTheCorpusAndBertTinyLearnsABatch) {
  // ReadTokenFile refuses links; the runfile is one.
  absl::StatusOr<TokenFile> file = ReadTokenFile(
      std::filesystem::canonical("text/fortunes/train.tokens").string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->vocab_size, 2000);
  EXPECT_EQ(file->sequences.seq_len, 128);
  // About 6,500 with 2,000 pieces (every 20th document held out).
  EXPECT_GT(file->sequences.size(), 5000);

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
