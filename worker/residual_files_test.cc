#include "worker/residual_files.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  fs::remove_all(dir);
  return dir;
}

const std::vector<std::string> kNames = {"conv.weight", "fc.bias"};
const std::vector<int64_t> kSizes = {3, 2};

absl::Status Write(const std::string& dir, int worker, int64_t step,
                   int64_t generation) {
  const std::vector<float> a = {1.0f, -2.0f, 0.5f}, b = {0.0f, 3.0f};
  return WriteResidualFile(dir, worker, step, generation, kNames,
                           {absl::MakeConstSpan(a), absl::MakeConstSpan(b)});
}

TEST(ResidualFilesTest, RoundTripAndChecks) {
  const std::string dir = NewDir("round") + "/step-7";
  ASSERT_TRUE(Write(dir, 1, 7, 2).ok());
  EXPECT_TRUE(fs::exists(dir + "/residual-1.safetensors"));
  absl::StatusOr<std::vector<std::vector<float>>> read =
      ReadResidualFile(dir, 1, 7, kNames, kSizes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0], std::vector<float>({1.0f, -2.0f, 0.5f}));
  EXPECT_EQ((*read)[1], std::vector<float>({0.0f, 3.0f}));
  // Another worker's, another step's, another model's: refused.
  EXPECT_TRUE(
      absl::IsNotFound(ReadResidualFile(dir, 0, 7, kNames, kSizes).status()));
  EXPECT_THAT(ReadResidualFile(dir, 1, 8, kNames, kSizes).status().message(),
              HasSubstr("expected step 8, worker 1"));
  EXPECT_THAT(ReadResidualFile(dir, 1, 7, kNames, {3, 5}).status().message(),
              HasSubstr("fc.bias"));
  EXPECT_THAT(
      ReadResidualFile(dir, 1, 7, {"conv.weight"}, {3}).status().message(),
      HasSubstr("2 tensors; expected 1"));
}

TEST(ResidualFilesTest, AStepFolderThatIsALinkIsRefused) {
  const std::string root = NewDir("link");
  fs::create_directories(root + "/elsewhere");
  fs::create_directory_symlink(root + "/elsewhere", root + "/step-3");
  EXPECT_THAT(Write(root + "/step-3", 0, 3, 0).message(),
              HasSubstr("not a folder"));
  EXPECT_FALSE(fs::exists(root + "/elsewhere/residual-0.safetensors"));
}

TEST(ResidualFilesTest, WaitTakesOnlyThisGenerationsFiles) {
  const std::string dir = NewDir("wait") + "/step-5";
  ASSERT_TRUE(Write(dir, 0, 5, 1).ok());
  ASSERT_TRUE(Write(dir, 1, 5, 0).ok());  // an abandoned timeline's
  const std::vector<int> both = {0, 1};
  const absl::Status missing = WaitForResidualFiles(
      dir, both, 5, 1, absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing)) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("from worker(s) 1"));
  std::atomic<bool> abandoned{true};
  EXPECT_TRUE(absl::IsCancelled(WaitForResidualFiles(
      dir, both, 5, 1, absl::Now() + absl::Seconds(60), &abandoned)));
  ASSERT_TRUE(Write(dir, 1, 5, 1).ok());
  EXPECT_TRUE(WaitForResidualFiles(dir, both, 5, 1,
                                   absl::Now() + absl::Milliseconds(100))
                  .ok());
}

// An elastic job's cut waits for its members' files only: worker 1 left
// the job, worker 3 joined it.
TEST(ResidualFilesTest, WaitTakesTheMembersFilesOnly) {
  const std::string dir = NewDir("members") + "/step-7";
  ASSERT_TRUE(Write(dir, 0, 7, 2).ok());
  ASSERT_TRUE(Write(dir, 3, 7, 2).ok());
  const std::vector<int> members = {0, 3};
  EXPECT_TRUE(WaitForResidualFiles(dir, members, 7, 2,
                                   absl::Now() + absl::Milliseconds(100))
                  .ok());
  const std::vector<int> with_1 = {0, 1, 3};
  const absl::Status missing = WaitForResidualFiles(
      dir, with_1, 7, 2, absl::Now() + absl::Milliseconds(100));
  EXPECT_THAT(missing.message(), HasSubstr("from worker(s) 1"));
}

}  // namespace
}  // namespace pstrain
