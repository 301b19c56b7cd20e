#include "catalog/catalog.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(CatalogTest, NamesAreSortedAndUnique) {
  for (auto names : {ModelNames(), DatasetNames()}) {
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  }
}

TEST(CatalogTest, KnownNamesAndTheirLists) {
  EXPECT_TRUE(IsKnownModel("lenet5"));
  EXPECT_TRUE(IsKnownModel("resnet50"));
  EXPECT_FALSE(IsKnownModel("resnet9000"));
  EXPECT_FALSE(IsKnownModel(""));
  EXPECT_TRUE(IsKnownDataset("mnist"));
  EXPECT_TRUE(IsKnownDataset("image_folder"));
  EXPECT_FALSE(IsKnownDataset("imagenet"));
  EXPECT_EQ(KnownModels(),
            "alexnet, bert_base, bert_base_untied, bert_tiny, "
            "bert_tiny_untied, lenet5, mlp, resnet101, resnet18, resnet34, "
            "resnet50, vgg16");
  EXPECT_EQ(KnownDatasets(),
            "cifar10, fashion_mnist, image_folder, mnist, records, "
            "synthetic, synthetic_tokens, tokens");
}

TEST(CatalogTest, SequenceModelsTakeTokenDatasets) {
  EXPECT_TRUE(IsSequenceModel("bert_tiny"));
  EXPECT_TRUE(IsSequenceModel("bert_base"));
  EXPECT_FALSE(IsSequenceModel("resnet18"));
  EXPECT_TRUE(IsSequenceModel("bert_tiny_untied"));
  EXPECT_TRUE(HasUntiedEmbedding("bert_tiny_untied"));
  EXPECT_TRUE(HasUntiedEmbedding("bert_base_untied"));
  EXPECT_FALSE(HasUntiedEmbedding("bert_tiny"));
  EXPECT_FALSE(HasUntiedEmbedding("resnet18"));
  EXPECT_TRUE(IsTokenDataset("tokens"));
  EXPECT_TRUE(IsTokenDataset("synthetic_tokens"));
  EXPECT_FALSE(IsTokenDataset("synthetic"));
  EXPECT_FALSE(IsTokenDataset("fashion_mnist"));
}

}  // namespace
}  // namespace pstrain
