// Checkpoints read as hostile files (issue 35, item 7): a real checkpoint
// written by CheckpointWriter (tests/checkpoint_fixture.h), then damaged
// on disk as a user or an attacker could (links to /dev/zero, FIFOs,
// manifests whose fields contradict each other, control bytes), each
// refused at once in one line.
#include "worker/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint_fixture.h"
#include "zlib.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CheckpointRig;
using testing::FixtureModel;
using testing::RigOptions;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  fs::remove(path);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The error contract: one line, naming `path`, no raw control byte.
void ExpectOneLine(const absl::Status& status, const std::string& path,
                   const std::string& label) {
  ASSERT_FALSE(status.ok()) << label;
  const std::string message(status.message());
  for (const char c : message) {
    EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        << label << ": control byte in " << absl::CHexEscape(message);
  }
  EXPECT_TRUE(absl::StrContains(message, path)) << label << ": " << message;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // A synthetic model of 3 tensors (the last a buffer) on 2 shards, 10
  // steps (7 an epoch) with a checkpoint at step 10: DIR/latest names
  // DIR/step-10, and no final model file (a job killed before its end).
  void SetUp() override {
    const char* root = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(
        root != nullptr ? root : "/tmp", "/checkpoint_test_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    model_ = FixtureModel::Synthetic({6, 4, 2}, 1);
    RigOptions options;
    options.checkpoint_dir = dir_;
    options.num_shards = 2;
    absl::StatusOr<std::unique_ptr<CheckpointRig>> rig =
        CheckpointRig::Create(model_.get(), options);
    ASSERT_TRUE(rig.ok()) << rig.status();
    rig_ = *std::move(rig);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(rig_->Step().ok());
    ASSERT_TRUE(rig_->BeginCheckpoint().ok());
    ASSERT_TRUE(rig_->writer().Wait().ok());
    step_dir_ = CheckpointStepDir(dir_, 10);
    manifest_ = step_dir_ + "/manifest.json";
    ASSERT_TRUE(fs::exists(manifest_));
  }

  absl::Status Load() {
    absl::StatusOr<CheckpointManifest> m = ReadLatestCheckpoint(dir_);
    if (!m.ok()) return m.status();
    return LoadCheckpointState(*m, model_->names(), model_->shapes(),
                               model_->num_buffers())
        .status();
  }

  // Rewrites the manifest through `change`, with its crc32 set right, so
  // that what is tested is the field check, not the checksum.
  void ChangeManifest(const std::function<void(json&)>& change) {
    json j = json::parse(ReadBytes(manifest_));
    j.erase("crc32");
    change(j);
    const std::string canonical = j.dump(1);
    j["crc32"] = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(canonical.data()),
              static_cast<uInt>(canonical.size())));
    WriteBytes(manifest_, j.dump(1) + "\n");
  }

  std::string dir_, step_dir_, manifest_;
  std::unique_ptr<FixtureModel> model_;
  std::unique_ptr<CheckpointRig> rig_;
};

TEST_F(CheckpointTest, ReadsWhatItWrote) { EXPECT_TRUE(Load().ok()) << Load(); }

// A link left where the writer puts its temporary files is removed, not
// written through; the files follow the umask.
TEST_F(CheckpointTest, WriterNeverWritesThroughALink) {
  const std::string victim = dir_ + "/../victim";
  WriteBytes(victim, "keep me");
  fs::create_symlink(victim, dir_ + "/latest.tmp");
  fs::create_directories(dir_ + "/step-11");
  fs::create_symlink(victim, dir_ + "/step-11/manifest.json.tmp");
  const mode_t old = ::umask(077);
  ASSERT_TRUE(rig_->Step().ok());
  ASSERT_TRUE(rig_->BeginCheckpoint().ok());
  const absl::Status written = rig_->writer().Wait();
  ::umask(old);
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_EQ(ReadBytes(victim), "keep me");
  EXPECT_EQ(ReadBytes(dir_ + "/latest"), "step-11\n");
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/step-11/manifest.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir_ + "/step-11/model.safetensors").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(Load().ok()) << Load();
}

TEST_F(CheckpointTest, LinksToDevZeroAreRefusedNotRead) {
  const std::string original = ReadBytes(manifest_);
  fs::remove(manifest_);
  fs::create_symlink("/dev/zero", manifest_);
  absl::Status status = Load();  // Read 3 GB in 21 s before.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ExpectOneLine(status, manifest_, "manifest -> /dev/zero");
  WriteBytes(manifest_, original);

  const std::string latest = dir_ + "/latest";
  fs::remove(latest);
  fs::create_symlink("/dev/zero", latest);
  status = Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ExpectOneLine(status, latest, "latest -> /dev/zero");

  // A regular `latest` or manifest past its limit is refused unread.
  WriteBytes(latest, std::string(1 << 20, ' ') + "step-10");
  status = Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  ExpectOneLine(status, latest, "1 MB latest");
  WriteBytes(latest, "step-10\n");
  WriteBytes(manifest_, original + std::string(17 << 20, ' '));
  status = Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  ExpectOneLine(status, manifest_, "17 MB manifest");
}

TEST_F(CheckpointTest, FifoInPlaceOfAShardOrModelFileDoesNotHang) {
  const std::string shard = step_dir_ + "/shard-1.safetensors";
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  const absl::Status status = Load();  // Hung in open() before.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ExpectOneLine(status, shard, "shard FIFO");

  const std::string model = step_dir_ + "/model.safetensors";
  fs::remove(model);
  ASSERT_EQ(::mkfifo(model.c_str(), 0600), 0);
  absl::StatusOr<CheckpointModelFile> found = FindModelFile(dir_);
  ASSERT_TRUE(found.ok()) << found.status();
  const absl::Status read =
      safetensors::File::Read(found->path, found->options).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << read;
  ExpectOneLine(read, model, "model FIFO");
}

TEST_F(CheckpointTest, ManifestFieldsOutOfRangeOrContradictoryAreRefused) {
  const std::string original = ReadBytes(manifest_);
  struct Case {
    const char* label;
    std::function<void(json&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"step_in_epoch 10^9",
       [](json& j) { j["data_position"]["step_in_epoch"] = 1000000000; },
       "step_in_epoch 1000000000"},
      {"position not the step",
       [](json& j) { j["data_position"]["epoch"] = 5; },
       "is not the checkpoint's step"},
      {"batch_size 0", [](json& j) { j["data_position"]["batch_size"] = 0; },
       "batch_size 0"},
      {"num_workers 0", [](json& j) { j["data_position"]["num_workers"] = 0; },
       "num_workers 0"},
      {"steps_per_epoch 0",
       [](json& j) { j["data_position"]["steps_per_epoch"] = 0; },
       "steps_per_epoch 0"},
      {"step of another folder", [](json& j) { j["step"] = 11; },
       "in folder step-10"},
      {"step_count", [](json& j) { j["optimizer"]["step_count"] = 3; },
       "step_count 3"},
      {"lr 100", [](json& j) { j["optimizer"]["lr"] = 100; }, "lr 100"},
      {"lr null (NaN)", [](json& j) { j["optimizer"]["lr"] = nullptr; },
       "not a finite number"},
      {"beta2 1", [](json& j) { j["optimizer"]["beta2"] = 1.0; }, "beta2 1"},
      {"mode", [](json& j) { j["mode"] = "ring"; }, "mode \"ring\""},
      {"partition_bytes 0", [](json& j) { j["partition_bytes"] = 0; },
       "partition_bytes 0"},
      {"duplicate tensor",
       [](json& j) { j["tensors"][1]["name"] = j["tensors"][0]["name"]; },
       "listed twice"},
      {"parameter after a buffer",
       [](json& j) {
         j["tensors"][0]["buffer"] = true;
         j["tensors"][1]["buffer"] = false;
       },
       "parameter after a buffer"},
      {"huge shape",
       [](json& j) {
         j["tensors"][0]["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
       },
       "more than"},
      {"shards swapped",
       [](json& j) { std::swap(j["shards"][0], j["shards"][1]); },
       "shard 0 is file \"shard-1.safetensors\""},
      {"model_file names a shard",
       [](json& j) { j["model_file"]["file"] = "shard-0.safetensors"; },
       "expected \"model.safetensors\""},
      {"size_bytes 2^50",
       [](json& j) { j["shards"][0]["size_bytes"] = uint64_t{1} << 50; },
       "size_bytes 1125899906842624"},
      {"versions", [](json& j) { j["shards"][0]["min_version"] = 99; },
       "after max_version"},
      {"loss scale 0",
       [](json& j) {
         j["loss_scaler"] = {{"scale", 0.0}, {"growth_tracker", 0}};
       },
       "loss_scaler: scale 0; expected above 0"},
      {"loss scale null (NaN)",
       [](json& j) {
         j["loss_scaler"] = {{"scale", nullptr}, {"growth_tracker", 0}};
       },
       "\"scale\" is not a finite number"},
      {"loss scale 1e300 (inf as float)",
       [](json& j) {
         j["loss_scaler"] = {{"scale", 1e300}, {"growth_tracker", 0}};
       },
       "\"scale\" is not a finite number"},
      {"growth_tracker -1",
       [](json& j) {
         j["loss_scaler"] = {{"scale", 1024.0}, {"growth_tracker", -1}};
       },
       "\"growth_tracker\" is not a non-negative integer"},
      {"growth_tracker 2^41",
       [](json& j) {
         j["loss_scaler"] = {{"scale", 1024.0},
                             {"growth_tracker", int64_t{1} << 41}};
       },
       "growth_tracker 2199023255552; expected 0 to 1099511627776"},
      {"loss_scaler without growth_tracker",
       [](json& j) {
         j["loss_scaler"] = {{"scale", 1024.0}};
       },
       "no \"growth_tracker\""},
  };
  for (const Case& c : cases) {
    WriteBytes(manifest_, original);
    ChangeManifest(c.change);
    const absl::Status status = Load();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss)
        << c.label << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.message))
        << c.label << ": " << status;
    ExpectOneLine(status, manifest_, c.label);
  }
}

TEST_F(CheckpointTest, TextFromFilesIsEscapedInErrors) {
  ChangeManifest(
      [](json& j) { j["format"] = std::string("pstrain\n\0\x1b[2J", 13); });
  absl::Status status = Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  ExpectOneLine(status, manifest_, "format with control bytes");
  EXPECT_TRUE(absl::StrContains(status.message(), "pstrain\\n\\x00")) << status;

  const std::string latest = dir_ + "/latest";
  WriteBytes(latest, std::string("step-1\0\n\x1b[2J", 11));
  status = Load();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  ExpectOneLine(status, latest, "latest with control bytes");
}

TEST_F(CheckpointTest, EvalFindsTheModelFileAndItsManifest) {
  // A job killed before its end: DIR has `latest`, no model.safetensors.
  const std::string model = step_dir_ + "/model.safetensors";
  for (const std::string& path : {dir_, dir_ + "/", step_dir_, model}) {
    absl::StatusOr<CheckpointModelFile> found = FindModelFile(path);
    ASSERT_TRUE(found.ok()) << path << ": " << found.status();
    EXPECT_EQ(fs::path(found->path), fs::path(model)) << path;
    ASSERT_TRUE(found->manifest.has_value()) << path;
    EXPECT_EQ(found->manifest->step, 10);
    EXPECT_TRUE(found->options.crc32.has_value());
    EXPECT_FALSE(found->options.follow_symlinks);
    EXPECT_TRUE(safetensors::File::Read(found->path, found->options).ok());
  }
  // A model file the manifest contradicts (one bit of its data flipped).
  std::string bytes = ReadBytes(model);
  bytes[bytes.size() - 1] ^= 1;
  WriteBytes(model, bytes);
  absl::StatusOr<CheckpointModelFile> found = FindModelFile(step_dir_);
  ASSERT_TRUE(found.ok()) << found.status();
  const absl::Status status =
      safetensors::File::Read(found->path, found->options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "crc32")) << status;
  // A folder with nothing to evaluate.
  fs::remove(dir_ + "/latest");
  EXPECT_EQ(FindModelFile(dir_).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pstrain
