#include "worker/data_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "worker/job_inputs.h"

ABSL_FLAG(std::string, dataset, "fashion_mnist",
          "Dataset: fashion_mnist, mnist, cifar10, image_folder, records "
          "(packed record files, memory-mapped) or synthetic.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder holding the dataset's files (IDX, gzipped or plain; "
          "CIFAR-10 binary batches; image_folder: class folders of JPEG and "
          "PNG files, or the tiny-ImageNet layout; records: train.records "
          "and test.records). Plain IDX and record files are memory-mapped, "
          "not loaded.");
ABSL_FLAG(int, image_size, 224,
          "Synthetic data: images are 3 x image_size x image_size; "
          "image_folder: images are resized (bilinear) to image_size x "
          "image_size pixels.");
ABSL_FLAG(std::string, bad_images, "fail",
          "image_folder: fail (stop, naming the first unreadable image) or "
          "skip (leave unreadable images out; one warning line counts them).");
ABSL_FLAG(bool, stream_images, false,
          "image_folder: list the files and decode each batch on input "
          "threads while training (memory does not grow with the dataset), "
          "instead of decoding every image into memory at start.");
ABSL_FLAG(std::string, augment, "none",
          "image_folder with --stream_images: training-batch augmentation, "
          "as torchvision's transforms: none (the whole image resized), "
          "random_resized_crop (RandomResizedCrop(image_size) and a "
          "horizontal flip: the ImageNet recipe) or pad_crop "
          "(RandomCrop(image_size, padding=4) and a horizontal flip: the "
          "CIFAR recipe). Evaluation is never augmented.");
ABSL_FLAG(int, num_classes, 1000, "Synthetic data: number of classes.");
ABSL_FLAG(int64_t, synthetic_samples, 12800,
          "Synthetic data: training samples per epoch (test: 1000).");
ABSL_FLAG(std::string, backend, "cpu",
          "Where workers compute: cpu (oneDNN) or cuda (cuDNN, cuBLAS; "
          "needs a --config=cuda build and a GPU).");
ABSL_FLAG(int, gpu, 0,
          "CUDA backend: index of the GPU to use (pstrain run/compare with "
          "allreduce over NCCL: worker w uses GPU gpu + w).");

namespace pstrain {

absl::StatusOr<Dataset> LoadDatasetFromFlags() {
  DatasetOptions options;
  options.image_size = absl::GetFlag(FLAGS_image_size);
  const std::string bad_images = absl::GetFlag(FLAGS_bad_images);
  if (bad_images == "fail") {
    options.bad_images = BadImages::kFail;
  } else if (bad_images == "skip") {
    options.bad_images = BadImages::kSkip;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--bad_images=", bad_images, ": expected fail or skip"));
  }
  options.stream_images = absl::GetFlag(FLAGS_stream_images);
  options.num_classes = absl::GetFlag(FLAGS_num_classes);
  options.train_samples = absl::GetFlag(FLAGS_synthetic_samples);
  return LoadDatasetNamed(absl::GetFlag(FLAGS_dataset),
                          absl::GetFlag(FLAGS_data_dir), options, "--");
}

absl::Status CheckBackendFlags() {
  return CheckBackend(absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_gpu),
                      "--");
}

std::vector<std::string> DataAndBackendFlagArgs() {
  return {
      absl::StrCat("--dataset=", absl::GetFlag(FLAGS_dataset)),
      absl::StrCat("--data_dir=", absl::GetFlag(FLAGS_data_dir)),
      absl::StrCat("--image_size=", absl::GetFlag(FLAGS_image_size)),
      absl::StrCat("--bad_images=", absl::GetFlag(FLAGS_bad_images)),
      absl::StrCat("--stream_images=",
                   absl::GetFlag(FLAGS_stream_images) ? "true" : "false"),
      absl::StrCat("--augment=", absl::GetFlag(FLAGS_augment)),
      absl::StrCat("--num_classes=", absl::GetFlag(FLAGS_num_classes)),
      absl::StrCat("--synthetic_samples=",
                   absl::GetFlag(FLAGS_synthetic_samples)),
      absl::StrCat("--backend=", absl::GetFlag(FLAGS_backend)),
      absl::StrCat("--gpu=", absl::GetFlag(FLAGS_gpu)),
  };
}

}  // namespace pstrain
