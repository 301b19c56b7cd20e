#include "worker/data_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "worker/job_inputs.h"

ABSL_FLAG(std::string, dataset, "fashion_mnist",
          "Dataset: fashion_mnist, mnist, cifar10, image_folder, records "
          "(packed record files, memory-mapped) or synthetic; for the "
          "bert_* models tokens (token files) or synthetic_tokens.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder holding the dataset's files (IDX, gzipped or plain; "
          "CIFAR-10 binary batches; image_folder: class folders of JPEG and "
          "PNG files, or the tiny-ImageNet layout; records: train.records "
          "and test.records). Plain IDX and record files are memory-mapped, "
          "not loaded.");
ABSL_FLAG(int, image_size, 0,
          "Synthetic data: images are 3 x image_size x image_size (0: 224); "
          "image_folder: images are resized (bilinear) to image_size x "
          "image_size pixels (0: kept at the size they all share, an error "
          "naming two sizes if they differ).");
ABSL_FLAG(std::string, bad_images, "fail",
          "image_folder: fail (stop, naming the first unreadable image) or "
          "skip (leave unreadable images out; one warning line counts them).");
ABSL_FLAG(bool, stream_images, false,
          "image_folder: list the files and decode each batch on input "
          "threads while training (memory does not grow with the dataset), "
          "instead of decoding every image into memory at start.");
ABSL_FLAG(pstrain::ByteSize, max_dataset_memory, pstrain::ByteSize{},
          "image_folder in memory: the most each worker's decoded images "
          "(floats) may take, in bytes or with a suffix K, M, G, T (powers "
          "of 1024): 8G; 0: half of the memory available (/proc/meminfo "
          "MemAvailable). Estimated from the headers before decoding; over "
          "it the run stops with exit 2 and the figure.");
ABSL_FLAG(pstrain::AugmentKind, augment, pstrain::AUGMENT_NONE,
          "image_folder with --stream_images: training-batch augmentation, "
          "as torchvision's transforms: none (the whole image resized), "
          "random_resized_crop (RandomResizedCrop(image_size) and a "
          "horizontal flip: the ImageNet recipe) or pad_crop "
          "(RandomCrop(image_size, padding=4) and a horizontal flip: the "
          "CIFAR recipe). Evaluation is never augmented.");
ABSL_FLAG(int, num_classes, 1000,
          "Synthetic data: number of classes; synthetic_tokens: the "
          "vocabulary (unset: 30522).");
ABSL_FLAG(int, seq_len, 0,
          "Token datasets: tokens per sequence (0: the token file's; "
          "synthetic_tokens: 128).");
ABSL_FLAG(int64_t, synthetic_samples, 12800,
          "Synthetic data: training samples per epoch (test: 1000).");
ABSL_FLAG(pstrain::BackendKind, backend, pstrain::BACKEND_CPU,
          "Where workers compute: cpu (oneDNN) or cuda (cuDNN, cuBLAS; "
          "needs a --config=cuda build and a GPU).");
ABSL_FLAG(pstrain::PrecisionKind, precision, pstrain::PRECISION_UNSPECIFIED,
          "What convolutions and linear layers compute in, as "
          "torch.autocast: fp32, tf32 (cuda only: TF32 tensor cores), bf16 "
          "or fp16 (cuda only; dynamic loss scaling); empty: the backend's "
          "default (fp32 on cpu, tf32 on cuda). Weights, the optimizer, "
          "BatchNorm and the loss stay fp32.");
ABSL_FLAG(int, gpu, 0,
          "CUDA backend: index of the GPU to use (pstrain run/compare with "
          "allreduce over NCCL: worker w uses GPU gpu + w).");

namespace pstrain {

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  const std::string upper =
      absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  absl::string_view rest = upper;
  if (rest.empty()) {
    size->bytes = 0;
    return true;
  }
  if (!absl::ConsumeSuffix(&rest, "IB")) absl::ConsumeSuffix(&rest, "B");
  double scale = 1;
  static constexpr absl::string_view kUnits = "KMGT";
  if (const size_t unit = rest.empty() ? kUnits.npos : kUnits.find(rest.back());
      unit != kUnits.npos) {
    scale = static_cast<double>(int64_t{1} << (10 * (unit + 1)));
    rest.remove_suffix(1);
  }
  double value = 0;
  if (!absl::SimpleAtod(rest, &value) || !(value >= 0) ||
      value * scale > 9.0e18) {
    *error = absl::StrCat("\"", text,
                          "\": expected a size in bytes, optionally with K, M, "
                          "G or T (powers of 1024), such as 8G");
    return false;
  }
  size->bytes = static_cast<int64_t>(value * scale);
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return absl::StrCat(size.bytes); }

namespace {

absl::StatusOr<Dataset> LoadFromFlags(bool headers_only) {
  DatasetOptions options;
  options.headers_only = headers_only;
  options.max_dataset_memory_bytes =
      absl::GetFlag(FLAGS_max_dataset_memory).bytes;
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
  options.num_classes = NumClassesFromFlags();
  options.train_samples = absl::GetFlag(FLAGS_synthetic_samples);
  options.seq_len = absl::GetFlag(FLAGS_seq_len);
  return LoadDatasetNamed(absl::GetFlag(FLAGS_dataset),
                          absl::GetFlag(FLAGS_data_dir), options, "--");
}

}  // namespace

int NumClassesFromFlags() {
  return absl::GetFlag(FLAGS_dataset) == "synthetic_tokens" &&
                 !FlagSpecified("num_classes")
             ? 30522
             : absl::GetFlag(FLAGS_num_classes);
}

absl::StatusOr<Dataset> LoadDatasetFromFlags() {
  return LoadFromFlags(/*headers_only=*/false);
}

absl::StatusOr<Dataset> ListDatasetFromFlags() {
  return LoadFromFlags(/*headers_only=*/true);
}

absl::Status CheckBackendFlags() {
  RETURN_IF_ERROR(CheckBackend(absl::GetFlag(FLAGS_backend),
                               absl::GetFlag(FLAGS_gpu), "--"));
  return CheckPrecision(absl::GetFlag(FLAGS_backend),
                        absl::GetFlag(FLAGS_precision), "--");
}

std::vector<std::string> DataAndBackendFlagArgs() {
  return {
      absl::StrCat("--dataset=", absl::GetFlag(FLAGS_dataset)),
      absl::StrCat("--data_dir=", absl::GetFlag(FLAGS_data_dir)),
      absl::StrCat("--image_size=", absl::GetFlag(FLAGS_image_size)),
      absl::StrCat("--bad_images=", absl::GetFlag(FLAGS_bad_images)),
      absl::StrCat("--stream_images=",
                   absl::GetFlag(FLAGS_stream_images) ? "true" : "false"),
      absl::StrCat("--max_dataset_memory=",
                   AbslUnparseFlag(absl::GetFlag(FLAGS_max_dataset_memory))),
      absl::StrCat("--augment=", Spelling(absl::GetFlag(FLAGS_augment))),
      absl::StrCat("--num_classes=", NumClassesFromFlags()),
      absl::StrCat("--seq_len=", absl::GetFlag(FLAGS_seq_len)),
      absl::StrCat("--synthetic_samples=",
                   absl::GetFlag(FLAGS_synthetic_samples)),
      absl::StrCat("--backend=", Spelling(absl::GetFlag(FLAGS_backend))),
      absl::StrCat("--precision=", Spelling(absl::GetFlag(FLAGS_precision))),
      absl::StrCat("--gpu=", absl::GetFlag(FLAGS_gpu)),
  };
}

}  // namespace pstrain
