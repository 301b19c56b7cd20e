#include "common/regular_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                       absl::StrCat("regular_file_test_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(RegularFileTest, ReadsASmallFile) {
  const std::string path = TempDir("small") + "/latest";
  WriteBytes(path, "step-7\n");
  const absl::StatusOr<std::string> text = ReadSmallFile(path, 64);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "step-7\n");
  EXPECT_EQ(ReadSmallFile(path, 7).value(), "step-7\n");
  const absl::Status too_big = ReadSmallFile(path, 6).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kDataLoss) << too_big;
  EXPECT_EQ(ReadSmallFile(path + "x", 6).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RegularFileTest, RefusesLinkToDevZeroWithoutReadingIt) {
  const std::string dir = TempDir("zero");
  const std::string link = dir + "/manifest.json";
  fs::create_symlink("/dev/zero", link);
  absl::Status status = ReadSmallFile(link, 1 << 20).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("symbolic link"), std::string::npos);
  // Followed, it is a device: refused too, not read.
  status = ReadSmallFile(link, 1 << 20, /*follow_symlinks=*/true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("character device"), std::string::npos)
      << status;
}

TEST(RegularFileTest, FifoDoesNotHang) {
  const std::string path = TempDir("fifo") + "/latest";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const absl::Status status = ReadSmallFile(path, 64).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("FIFO"), std::string::npos) << status;
  EXPECT_EQ(OpenRegularFile(TempDir("dir")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// flags_util's ReadFile (flag files, job specs, launch bundles) is built on
// OpenRegularFile: a FIFO is refused at once, a symbolic link followed.
TEST(RegularFileTest, ReadFileRefusesAFifoAndFollowsALink) {
  const std::string dir = TempDir("read_file");
  WriteBytes(dir + "/spec", "model: \"lenet5\"\n");
  ASSERT_EQ(::symlink((dir + "/spec").c_str(), (dir + "/link").c_str()), 0);
  std::string text;
  ASSERT_TRUE(ReadFile(dir + "/link", &text).ok());
  EXPECT_EQ(text, "model: \"lenet5\"\n");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  const absl::Status status = ReadFile(dir + "/fifo", &text);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(ReadFile(dir + "/none", &text).code(), absl::StatusCode::kNotFound);
}

// Output flags are checked before a job starts, so that hours of training
// do not end in a result that cannot be written.
TEST(RegularFileTest, OutputFlagsAreCheckedBeforeAnythingIsWritten) {
  const std::string dir = TempDir("outputs");
  EXPECT_TRUE(CheckOutputFile("results_json", "").ok());
  EXPECT_TRUE(CheckOutputFile("results_json", dir + "/r.json").ok());
  const absl::Status folder = CheckOutputFile("results_json", dir);
  EXPECT_EQ(folder.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(folder.message(), absl::StrCat("--results_json=", dir,
                                           ": a folder; expected a file name"));
  EXPECT_EQ(CheckOutputFile("results_json", dir + "/none/r.json").message(),
            absl::StrCat("--results_json=", dir, "/none/r.json: its folder ",
                         dir, "/none does not exist"));
  WriteBytes(dir + "/file", "x");
  EXPECT_EQ(CheckOutputFile("results_json", dir + "/file/r.json").message(),
            absl::StrCat("--results_json=", dir, "/file/r.json: ", dir,
                         "/file is not a folder"));

  EXPECT_TRUE(CheckOutputFolder("metrics_dir", dir).ok());
  EXPECT_TRUE(CheckOutputFolder("metrics_dir", dir + "/a/b/c").ok());
  EXPECT_EQ(CheckOutputFolder("metrics_dir", dir + "/file/m").message(),
            absl::StrCat("--metrics_dir=", dir, "/file/m: ", dir,
                         "/file is not a folder"));
  EXPECT_FALSE(fs::exists(dir + "/a"));  // nothing made
  if (::geteuid() != 0) {                // root may write anywhere
    fs::create_directories(dir + "/ro");
    fs::permissions(dir + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_EQ(CheckOutputFolder("metrics_dir", dir + "/ro/m").code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CheckOutputFile("results_json", dir + "/ro/r.json").code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// An address typo is an error before anything dials it.
TEST(RegularFileTest, GrpcTargetsAreCheckedBeforeTheyAreDialled) {
  for (const char* good :
       {"localhost:7070", "10.0.0.1:1", "[::1]:65535", "dns:///head:7070",
        "dns:head:7070", "ipv4:127.0.0.1:80", "ipv6:[::1]:80",
        "unix:/run/pstrain.sock", "coordinator.default.svc:443",
        "dns://10.0.0.53/head:7070", "dns://10.0.0.53:53/head:7070",
        "ipv4:10.0.0.1:7070,10.0.0.2:7070", "ipv6:[::1]:80,[fe80::1]:81",
        "unix:///run/pstrain.sock", "unix-abstract:pstrain-coordinator"}) {
    EXPECT_TRUE(CheckGrpcTarget("coordinator", good).ok()) << good;
  }
  const struct {
    const char* target;
    const char* why;
  } bad[] = {
      {"", "empty"},
      {"localhost", "no port"},
      {"localhost:70000", "port \"70000\""},
      {"localhost:0", "port \"0\""},
      {"localhost:+80", "port \"+80\""},
      {"localhost:http", "port \"http\""},
      {":7070", "no host"},
      {"::1:7070", "an IPv6 address goes in brackets"},
      {"head :7070", "a space or control character"},
      {"unix:", "no path"},
      {"unix-abstract:", "no path"},
      {"dns://10.0.0.53", "no \"/\" after dns://AUTHORITY"},
      {"dns://10.0.0.53/head", "no port"},
      {"ipv4:10.0.0.1:7070,", "no port"},
      {"ipv4:10.0.0.1:7070,10.0.0.2:0", "port \"0\""},
  };
  for (const auto& c : bad) {
    const absl::Status status = CheckGrpcTarget("coordinator", c.target);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.target;
    EXPECT_EQ(status.message(),
              absl::StrCat("--coordinator=", c.target, ": ", c.why,
                           "; expected HOST:PORT (PORT 1 to 65535), or "
                           "unix:PATH"));
  }
}

TEST(RegularFileTest, FlagChecksReportTheFirstErrorInOrder) {
  EXPECT_TRUE(FirstError({}).ok());
  EXPECT_TRUE(FirstError({CheckFlagRange("port", 80, 0, 65535)}).ok());
  const absl::Status first =
      FirstError({CheckFlagRange("port", 80, 0, 65535),
                  CheckFlagRange("threads", 0, 1, 64),
                  CheckFlagRange("repeats", 2000, 1, 1000, "runs")});
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(first.message(), "--threads=0: expected 1 to 64");
  ExitOnFlagError("prog", absl::OkStatus());  // returns
  EXPECT_EXIT(ExitOnFlagError("prog", first), testing::ExitedWithCode(2),
              "prog: error: --threads=0: expected 1 to 64");
}

TEST(RegularFileTest, EscapesAndCutsTextForMessages) {
  EXPECT_EQ(EscapeForMessage(std::string("a\nb\0z", 5)), "a\\nb\\x00z");
  EXPECT_EQ(EscapeForMessage("\"q\"\x1b"), "\\\"q\\\"\\x1b");
  EXPECT_EQ(EscapeForMessage(std::string(100, 'x'), 4), "xxxx...");
}

}  // namespace
}  // namespace pstrain
