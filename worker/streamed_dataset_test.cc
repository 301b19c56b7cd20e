// --stream_images: an image_folder listed, not decoded, at load; batches
// from an InputPipeline with StreamAugmentOptions are the in-memory
// reader's batches, and evaluation over the streamed test split gives the
// in-memory split's loss and accuracy.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/model.h"
#include "worker/dataset.h"
#include "worker/image_write.h"
#include "worker/input_pipeline.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

// root/train/<c>/<i>.png and root/test/<c>/<i>.png, RGB, of varied sizes
// (so that both readers resize), with distinct smooth content.
std::string MakeTree(const std::string& name, int train, int test) {
  const std::string root =
      std::string(std::getenv("TEST_TMPDIR")) + "/streamed/" + name;
  fs::remove_all(root);
  for (const auto& [split, n] :
       {std::pair<std::string, int>{"train", train}, {"test", test}}) {
    for (int i = 0; i < n; ++i) {
      const int h = 10 + i % 7, w = 12 + i % 5;
      std::vector<uint8_t> pixels(static_cast<size_t>(h) * w * 3);
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          for (int c = 0; c < 3; ++c) {
            pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
                static_cast<uint8_t>((17 * i + 11 * x + 5 * y + 60 * c) % 256);
          }
        }
      }
      const std::string dir = absl::StrCat(root, "/", split, "/c", i % 3);
      fs::create_directories(dir);
      EXPECT_TRUE(
          WritePngFile(absl::StrCat(dir, "/", i, ".png"), h, w, 3, pixels)
              .ok());
    }
  }
  return root;
}

TEST(StreamedDatasetTest, SameSamplesStatisticsAndBatchesAsInMemory) {
  const std::string root = MakeTree("same", 40, 11);
  DatasetOptions options;
  options.image_size = 8;
  options.bad_images = BadImages::kFail;
  absl::StatusOr<Dataset> memory = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(memory.ok()) << memory.status();
  options.stream_images = true;
  absl::StatusOr<Dataset> streamed = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_NE(streamed->train.files, nullptr);
  EXPECT_TRUE(streamed->train.images.empty());
  EXPECT_EQ(streamed->train.count, memory->train.count);
  EXPECT_EQ(streamed->test.count, memory->test.count);
  EXPECT_EQ(streamed->train.chw, memory->train.chw);
  EXPECT_EQ(streamed->train.labels, memory->train.labels);
  EXPECT_EQ(streamed->test.labels, memory->test.labels);
  EXPECT_EQ(streamed->num_classes, 3);
  // Fewer than kStreamStatsSamples images: the sample is the whole set.
  ASSERT_EQ(streamed->channel_mean.size(), 3u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(streamed->channel_mean[c], memory->channel_mean[c], 1e-9);
    EXPECT_NEAR(streamed->channel_stddev[c], memory->channel_stddev[c], 1e-9);
  }
  // A shuffled order, batches of 8.
  const std::vector<SampleIndex> order =
      ShardedSampler(40, 0, 1, 7).EpochIndices(0).ToVector();
  InputPipelineOptions input;
  input.batch_size = 8;
  input.threads = 3;
  input.augment = *StreamAugmentOptions(*streamed);
  absl::StatusOr<std::unique_ptr<InputPipeline>> pipeline =
      InputPipeline::Create(*streamed->train.files, order, 5, input);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  for (int b = 0; b < 5; ++b) {
    InputPipeline::Batch batch;
    ASSERT_TRUE(*(*pipeline)->Next(&batch));
    Tensor images;
    std::vector<int32_t> labels;
    GatherBatch(memory->train, order, b * 8, 8, &images, &labels);
    EXPECT_EQ(batch.labels, labels);
    ASSERT_EQ(batch.images.shape, images.shape);
    double max_diff = 0;
    for (size_t i = 0; i < images.data.size(); ++i) {
      max_diff = std::max<double>(
          max_diff, std::fabs(batch.images.data[i] - images.data[i]));
    }
    EXPECT_LT(max_diff, 1e-5) << "batch " << b;
  }
}

TEST(StreamedDatasetTest, EvaluationMatchesInMemory) {
  // 11 test images in batches of 4: two whole batches and a rest of 3.
  const std::string root = MakeTree("eval", 12, 11);
  DatasetOptions options;
  options.image_size = 8;
  absl::StatusOr<Dataset> memory = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(memory.ok()) << memory.status();
  options.stream_images = true;
  absl::StatusOr<Dataset> streamed = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create("cpu", 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ModelOptions model_options;
  model_options.seed = 3;
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("mlp", memory->train.chw, memory->num_classes,
                    model_options, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Evaluation> a = EvaluateModel(**model, *memory, 4);
  absl::StatusOr<Evaluation> b = EvaluateModel(**model, *streamed, 4, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(a->accuracy, b->accuracy);
  EXPECT_NEAR(a->loss, b->loss, 1e-5);
}

// JobSpec.augment names torchvision's recipes; each keeps the split's size
// and statistics, and none is the in-memory reader's resize.
TEST(StreamedDatasetTest, AugmentNamesTheTorchvisionRecipes) {
  const std::string root = MakeTree("augment", 12, 3);
  DatasetOptions options;
  options.image_size = 8;
  options.stream_images = true;
  absl::StatusOr<Dataset> streamed = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  using Crop = AugmentOptions::Crop;
  struct Case {
    AugmentKind augment;
    Crop crop;
    bool hflip;
  };
  for (const Case& c :
       {Case{AUGMENT_NONE, Crop::kResize, false},
        Case{AUGMENT_RANDOM_RESIZED_CROP, Crop::kRandomResizedCrop, true},
        Case{AUGMENT_PAD_CROP, Crop::kPadCrop, true}}) {
    absl::StatusOr<AugmentOptions> a =
        StreamAugmentOptions(*streamed, c.augment);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->crop, c.crop) << Spelling(c.augment);
    EXPECT_EQ(a->hflip, c.hflip) << Spelling(c.augment);
    EXPECT_EQ(a->out_size, 8);
    EXPECT_EQ(a->channels, 3);
    EXPECT_EQ(a->pad, 4);
    EXPECT_DOUBLE_EQ(a->min_area, 0.08);
    EXPECT_DOUBLE_EQ(a->max_ratio, 4.0 / 3.0);
    ASSERT_EQ(a->mean.size(), 3u);
    EXPECT_FLOAT_EQ(a->mean[1], static_cast<float>(streamed->channel_mean[1]));
    EXPECT_FLOAT_EQ(a->stddev[2],
                    static_cast<float>(streamed->channel_stddev[2]));
  }
  absl::StatusOr<AugmentOptions> bad =
      StreamAugmentOptions(*streamed, static_cast<AugmentKind>(7));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "augment 7 (not an AugmentKind); expected none, "
            "random_resized_crop or pad_crop");
}

TEST(StreamedDatasetTest, UnreadableFilesAreSkippedAtListingOrFailIt) {
  const std::string root = MakeTree("bad", 9, 3);
  // A truncated PNG: its header is gone, so listing finds it.
  std::FILE* f = std::fopen((root + "/train/c0/broken.png").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("\x89PN", f);
  std::fclose(f);
  DatasetOptions options;
  options.image_size = 8;
  options.stream_images = true;
  options.bad_images = BadImages::kFail;
  absl::StatusOr<Dataset> failed = LoadDataset("image_folder", root, options);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("broken.png"),
            absl::string_view::npos)
      << failed.status();
  options.bad_images = BadImages::kSkip;
  absl::StatusOr<Dataset> skipped = LoadDataset("image_folder", root, options);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->train.count, 9);
}

}  // namespace
}  // namespace pstrain
