// Checkpoints of a parameter-server job, written under worker 0's direction
// and read back to resume.
//
// Layout of --checkpoint_dir=DIR:
//   DIR/step-<S>/shard-<i>.safetensors  shard i's chunks: weights, Adam m and
//                                       v, versions (server/shard_checkpoint.h)
//   DIR/step-<S>/model.safetensors      the whole model under PyTorch's
//                                       state_dict names (models/model_file.h)
//   DIR/step-<S>/manifest.json          written last: what makes the
//                                       checkpoint exist (below)
//   DIR/latest                          "step-<S>\n": the newest durable one
//   DIR/model.safetensors               the final model, at the job's end
//
// manifest.json: "format" ("pstrain-checkpoint/1"), "step" (global step S:
// in sync mode the version of every chunk), "mode", "model", "dataset",
// "num_shards", "partition_bytes", "optimizer" (name, lr, beta1, beta2,
// epsilon, weight_decay, step_count), "data_position" (epoch,
// step_in_epoch, steps_per_epoch, seed, batch_size, num_workers),
// "tensors" (every PS tensor's name, shape and whether it is a buffer: the
// BatchNorm running statistics the shards average), "shards" (file,
// size_bytes, crc32, min_version, max_version), "model_file" (file,
// size_bytes, crc32), "checkpoint_count" (the job's durable checkpoints,
// this one included, across restarts of worker 0; optional on reading:
// older manifests have none), "loss_scaler" (fp16 precision only: worker
// 0's dynamic loss scale and good steps since its last change, as
// GradScaler's state_dict "scale" and "_growth_tracker"; optional on
// reading: absent, a resumed fp16 job starts from GradScaler's 65536),
// and "crc32": zlib's crc32 of the manifest's own
// canonical JSON (nlohmann's dump(1)) without that field, so that no
// damaged manifest loads.
//
// Writing (CheckpointWriter): at step S, worker 0 (after its pull of version
// S, before its next push) asks every shard to copy its state in memory
// (the consistent cut, see ParameterShard::Snapshot; with staleness a
// deferred one, BeginDeferredSnapshot) and copies the pulled
// weights; then training goes on while a background thread waits for the
// shards' files to be durable, writes the model file and the manifest
// (each fsynced, renamed, folder fsynced), moves DIR/latest, and removes
// the checkpoints older than the newest `keep`. A checkpoint whose manifest
// is missing or does not verify does not exist. A writer killed at any
// moment (tests/checkpoint_crash_test) leaves DIR/latest naming a whole
// checkpoint; what it left besides (a folder without a manifest, one after
// `latest`, temporary files in them) is removed by the next writer's first
// Begin, so DIR never holds more than keep + 1 step folders. Async mode: each
// shard saves its chunks as they are at that moment; the manifest records each
// shard's smallest and largest chunk version (a resumed async job restarts
// each chunk at its saved version, Adam's step count included; chunks
// split differently on load take the smallest version they overlap).
//
// Reading (ReadLatestCheckpoint, LoadCheckpointState): files are hostile.
// `latest` (at most 64 bytes), the manifest (at most 16 MiB) and every
// shard and model file are opened with O_NOFOLLOW and O_NONBLOCK and must
// be regular files (common/regular_file.h: a link to /dev/zero or a FIFO is
// refused at once); every file is checked against the manifest's size and
// crc32 and every tensor against the model; the state is reassembled per
// tensor, so a checkpoint loads into a job with another number of shards
// or partition size. Every field of a manifest is checked against the
// others: the step against its folder's name, the optimizer's step_count
// and the data position (epoch x steps_per_epoch + step_in_epoch, with
// step_in_epoch < steps_per_epoch); counts, sizes and hyperparameters
// within the job spec's ranges (coordinator/job_spec.h; batch_size >= 1);
// tensor names unique, shapes positive and bounded, buffers last; shard i
// in file shard-<i>.safetensors and the model in model.safetensors. Text
// from a file is C-escaped in messages.
//
// Errors are one line naming the file and the problem: NOT_FOUND (no
// checkpoint), DATA_LOSS (a file that does not verify, a manifest field out
// of range), INVALID_ARGUMENT (a checkpoint of another model; a link, FIFO
// or device in place of a file). Thread-compatible; the writer's background
// thread is internal.
#ifndef PSTRAIN_WORKER_CHECKPOINT_H_
#define PSTRAIN_WORKER_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "catalog/job_config.h"
#include "optim/adam.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "server/shard_checkpoint.h"
#include "worker/gradient_exchange.h"

namespace pstrain {

inline constexpr char kCheckpointFormat[] = "pstrain-checkpoint/1";

// Where the next step's batch comes from.
struct DataPosition {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t steps_per_epoch = 0;
  uint64_t seed = 0;
  int64_t batch_size = 0;
  int64_t num_workers = 0;
  // The epoch's permutation positions trained before the step (its
  // offset, worker/data_position.h); -1: not recorded (a checkpoint from
  // before elastic jobs: step_in_epoch x num_workers x batch_size).
  int64_t offset = -1;
};

// What every checkpoint of a job records besides its state.
struct CheckpointJobInfo {
  // The manifest's "mode" is its spelling (catalog/job_config.h).
  Mode mode = MODE_SYNC;
  std::string model, dataset;
  int num_shards = 0;
  int64_t partition_bytes = 0;
  // The optimizer (its name round-trips: a resume with another one is
  // refused). Saved per chunk: Adam's m and v; SGD's momentum buffer in m,
  // v zeros (unused).
  OptimizerOptions adam;
  // PS tensors: names, shapes, and how many of the last are buffers.
  std::vector<std::string> tensor_names;
  std::vector<std::vector<int64_t>> tensor_shapes;
  int num_buffers = 0;
};

struct CheckpointManifest {
  std::string dir;  // DIR/step-<S>
  int64_t step = 0;
  CheckpointJobInfo job;
  DataPosition position;
  struct File {
    std::string name;  // Relative to `dir`.
    uint64_t size_bytes = 0;
    uint32_t crc32 = 0;
  };
  std::vector<File> shard_files;
  File model_file;
  // The job's durable checkpoints, this one included (0: not recorded).
  int64_t checkpoint_count = 0;
  // fp16 precision: worker 0's loss scaler when the cut was taken (scale
  // finite and positive, growth_tracker from 0 to 2^40).
  std::optional<LossScaler::State> loss_scaler;
};

// "DIR/step-<step>".
std::string CheckpointStepDir(const std::string& dir, int64_t step);

// The manifest DIR/latest names, validated (not yet the files it lists).
// NOT_FOUND when DIR has no checkpoint.
absl::StatusOr<CheckpointManifest> ReadLatestCheckpoint(const std::string& dir);
// The manifest of one checkpoint folder DIR/step-<S>.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& step_dir);

// OK if the manifest's tensors are a model's PS tensors `names`/`shapes`
// with the last `num_buffers` buffers; INVALID_ARGUMENT naming the first
// that differs otherwise.
absl::Status CheckManifestModel(const CheckpointManifest& manifest,
                                const std::vector<std::string>& names,
                                const std::vector<std::vector<int64_t>>& shapes,
                                int num_buffers);

// The model file `pstrain eval --checkpoint=PATH` means, and how to read it:
//   - a folder holding manifest.json (DIR/step-<N>): its model file, checked
//     against that manifest;
//   - a folder holding model.safetensors (a job's checkpoint_dir after its
//     end): that file;
//   - a folder holding only `latest` (a job killed before its end): the
//     model file of the checkpoint `latest` names, checked against its
//     manifest;
//   - DIR/step-<N>/model.safetensors: that file, checked against the
//     manifest beside it;
//   - any other file: itself (a link the user named is followed).
// `options` carry the manifest's size and crc32 (a model file that the
// manifest contradicts is refused when read) and refuse links inside a
// checkpoint. Errors: the manifest's (above); NOT_FOUND for a folder that
// holds none of these.
struct CheckpointModelFile {
  std::string path;
  safetensors::ReadOptions options;
  std::optional<CheckpointManifest> manifest;
};
absl::StatusOr<CheckpointModelFile> FindModelFile(const std::string& path);

// Reads every shard file of `manifest` (size and crc32 checked) and joins
// them into the state of a model whose PS tensors are `names`/`shapes` with
// the last `num_buffers` buffers: INVALID_ARGUMENT naming the first tensor
// that differs from the manifest's.
absl::StatusOr<ModelState> LoadCheckpointState(
    const CheckpointManifest& manifest, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes, int num_buffers);

class CheckpointWriter {
 public:
  // Writes the model file of a checkpoint (weights: PS tensors) to `path`
  // with `options` (the writer fsyncs the folder itself: sync_folder is
  // false); its size and crc32 for the manifest.
  using SaveModelFn = std::function<absl::StatusOr<safetensors::WriteResult>(
      const std::vector<absl::Span<float>>& weights, const std::string& path,
      int64_t step, const safetensors::WriteOptions& options)>;

  // `exchange` (not owned) must be a PS exchange and outlive the writer.
  CheckpointWriter(std::string dir, int keep, CheckpointJobInfo job,
                   GradientExchange* exchange, SaveModelFn save_model);
  // Waits for the checkpoint in flight (its error is lost: call Wait()).
  ~CheckpointWriter();

  // On the training thread, right after the pull of version `step`: waits
  // for the previous checkpoint, has the shards copy their state, copies
  // `weights`, and starts the rest in the background. An error of the
  // previous checkpoint or of the shards comes back here. Backup workers:
  // the checkpoint is of the later step shard 0 picks (the cut where the
  // admissions are; PsClient::Checkpoint), its position moved there, and
  // the model file comes from the shards (set_model_from_shards(true));
  // begun_step() says which; `position_of` (if set) gives that step's
  // position (else it is moved by `position`'s steps_per_epoch). Where
  // that cut would be at or past `end_step` (the job's number of steps:
  // worker 0 fell behind workers that have ended) no checkpoint is taken
  // (GradientExchange::Checkpoint) and Begin() returns OK with begun_step()
  // unchanged: the job's end is in its final model file. A Begin() at a
  // step before the cut of the checkpoint still in flight (begun_step())
  // takes none either: that checkpoint is of a later step, and waiting for
  // it would wait for this worker's own residual file (written on the
  // training thread once its step reaches the cut).
  absl::Status Begin(
      int64_t step, int64_t end_step, const DataPosition& position,
      const std::vector<absl::Span<float>>& weights,
      const std::function<DataPosition(int64_t)>& position_of = nullptr);
  // The step of the checkpoint the last Begin() started (-1: none).
  int64_t begun_step() const { return begun_step_; }
  // Waits for the checkpoint in flight; its error (reported once: a run
  // that recovers from a failure goes on writing checkpoints).
  absl::Status Wait();
  // Whether the checkpoint Begin() started last is still being written
  // (Wait() would block). Thread-safe.
  bool InFlight() const {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }

  // A restarted worker 0 of the same job: the checkpoints the job made
  // durable before this writer, so that each manifest's checkpoint_count
  // counts the job's (default 0).
  void ContinueCount(int64_t checkpoints_before);

  // fp16 precision: `scaler` (not owned; read by Begin() on the training
  // thread) goes into each manifest's "loss_scaler". Default none.
  void set_loss_scaler(const LossScaler* scaler) { loss_scaler_ = scaler; }

  // Bounded staleness: the weights worker 0 pulled before step S may be
  // older than S (the shards' cut of S comes later, ParameterShard::
  // BeginDeferredSnapshot), so the model file is written from the shard
  // files once they are durable (read back, checked, assembled) instead of
  // from the weights Begin() copied. Default false.
  void set_model_from_shards(bool from_shards) {
    model_from_shards_ = from_shards;
  }

  // Steps of the checkpoints made durable so far, and the newest's path.
  int64_t completed() const;
  std::string latest_path() const;

 private:
  absl::Status Finish(int64_t step, const DataPosition& position,
                      const std::optional<LossScaler::State>& loss_scaler,
                      const std::vector<std::vector<float>>& weights);

  const std::string dir_;
  const int keep_;
  const CheckpointJobInfo job_;
  GradientExchange* const exchange_;
  const SaveModelFn save_model_;
  bool model_from_shards_ = false;
  const LossScaler* loss_scaler_ = nullptr;
  int64_t begun_step_ = -1;  // training thread only
  // The weights Begin() copied, kept between checkpoints (read by the
  // background thread; written by Begin() only after it is joined).
  std::vector<std::vector<float>> weights_copy_;
  std::thread background_;
  mutable absl::Mutex mu_;
  absl::Status background_status_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checkpoints_before_ ABSL_GUARDED_BY(mu_) = 0;
  std::string latest_path_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CHECKPOINT_H_
