// The coordinator's stored state (issue 22), as a user meets it with the
// real pstrain_coordinator binary: a job file that is empty, corrupt,
// inconsistent, a folder, unreadable or unwritable is one line naming it
// and exit 2 (never a protobuf CHECK failure, never a start with 0 jobs);
// --keep_finished_jobs prunes the oldest ended jobs and keeps running ones.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "tests/cli_test_util.h"

namespace pstrain {
namespace {

using ::pstrain::testing::CommandResult;
using ::pstrain::testing::FreePort;
using ::pstrain::testing::Process;
using ::pstrain::testing::ReadTextFile;
using ::pstrain::testing::RunCommand;
using ::pstrain::testing::TempDir;
using ::pstrain::testing::WriteTextFile;
using ::testing::HasSubstr;
using ::testing::Not;

// pstrain_coordinator with `job_file` over mutual TLS (the test's
// certificates), at most 5 s (a coordinator that starts is stopped by
// `timeout`: exit 124).
CommandResult StartWith(const std::string& job_file) {
  ::pstrain::testing::UseTestCertificates();
  return RunCommand(absl::StrCat(
      "timeout 5 coordinator/pstrain_coordinator --port=0 --job_file=",
      job_file, " 2>&1"));
}

// One line naming `job_file`, exit 2, no protobuf log.
void ExpectOneLineNaming(const CommandResult& r, const std::string& job_file,
                         const std::string& why) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, absl::StrCat("pstrain_coordinator: error: job file ",
                                   job_file, ": ", why, "\n"));
  EXPECT_THAT(r.output, Not(HasSubstr("CHECK")));
  EXPECT_THAT(r.output, Not(HasSubstr("libprotobuf")));
}

TEST(CoordinatorStateTest, BrokenJobFilesAreOneLineAndExitTwo) {
  const std::string dir = TempDir();
  std::string path = dir + "/empty.pb";
  WriteTextFile(path, "");
  ExpectOneLineNaming(StartWith(path), path,
                      "is empty (a job table always holds its next job id)");

  path = dir + "/corrupt.pb";
  WriteTextFile(path, "model: \"lenet5\"\n");  // a spec, not a table
  ExpectOneLineNaming(StartWith(path), path,
                      "not a pstrain job table (16 bytes that do not parse)");

  // Parses, but job-1 has 1 task where its spec says 2 ps and 2 workers.
  JobTableFile table;
  table.set_next_id(2);
  JobInfo* job = table.add_jobs();
  job->set_id("job-1");
  job->set_state(JOB_RUNNING);
  job->mutable_spec()->set_num_ps(2);
  job->mutable_spec()->set_num_workers(2);
  job->add_tasks()->set_state(TASK_REGISTERED);
  job->mutable_tasks(0)->set_role(ROLE_PS);
  path = dir + "/inconsistent.pb";
  WriteTextFile(path, table.SerializeAsString());
  ExpectOneLineNaming(
      StartWith(path), path,
      "not a consistent job table: job-1: 1 tasks for 2 ps and 2 workers");

  path = dir + "/folder.pb";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectOneLineNaming(StartWith(path), path, "is a folder, not a job file");

  // A read that fails (as root, mode 000 does not stop reading; the kernel
  // refuses to read address 0 of a process's memory with EIO).
  ExpectOneLineNaming(StartWith("/proc/self/mem"), "/proc/self/mem",
                      "Input/output error");
  path = dir + "/unreadable.pb";
  WriteTextFile(path, "x");
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  if (geteuid() != 0) {
    ExpectOneLineNaming(StartWith(path), path, "Permission denied");
  }

  // A new job file whose folder does not exist (a fresh node's
  // /var/lib/pstrain): the folder is made, 0700, and the coordinator runs.
  path = dir + "/no/such/folder/jobs.pb";
  const CommandResult fresh = StartWith(path);
  EXPECT_EQ(fresh.exit_code, 124) << fresh.output;
  EXPECT_THAT(fresh.output, HasSubstr("(job file " + path + ", 0 jobs)"));
  struct stat st;
  ASSERT_EQ(stat((dir + "/no/such/folder").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // One that cannot be made: found at start, not at the first submit.
  WriteTextFile(dir + "/a-file", "x");
  path = dir + "/a-file/sub/jobs.pb";
  const CommandResult r = StartWith(path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, absl::StrCat("pstrain_coordinator: error: job file ",
                                   path, ": Not a directory\n"));

  // A good one starts (and is stopped by `timeout`).
  path = dir + "/good.pb";
  table.mutable_jobs()->Clear();
  WriteTextFile(path, table.SerializeAsString());
  const CommandResult good = StartWith(path);
  EXPECT_EQ(good.exit_code, 124) << good.output;
  EXPECT_THAT(good.output, HasSubstr("(job file " + path + ", 0 jobs)"));
}

TEST(CoordinatorStateTest, BadLimitFlagsExitTwo) {
  ::pstrain::testing::UseTestCertificates();
  for (const auto& [flag, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"--keep_finished_jobs=-1",
            "--keep_finished_jobs=-1: expected 0 to 1000000 jobs"},
           {"--max_kv_key_bytes=0",
            "--max_kv_key_bytes=0: expected 1 to 65536 bytes"},
           {"--max_kv_value_bytes=2000000",
            "--max_kv_value_bytes=2000000: expected 0 to 1048576 bytes"},
           {"--max_kv_keys_per_job=0",
            "--max_kv_keys_per_job=0: expected 1 to 1000000 keys"}}) {
    const CommandResult r = RunCommand(absl::StrCat(
        "timeout 5 coordinator/pstrain_coordinator --port=0 ", flag, " 2>&1"));
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.output;
    EXPECT_EQ(r.output, "pstrain_coordinator: error: " + message + "\n");
  }
}

TEST(CoordinatorStateTest, KeepFinishedJobsPrunesTheOldestEnded) {
  ::pstrain::testing::UseTestCertificates();
  const std::string job_file = TempDir() + "/pruned.pb";
  const std::string port = std::to_string(FreePort());
  Process coordinator({"coordinator/pstrain_coordinator", "--port=" + port,
                       "--job_file=" + job_file, "--keep_finished_jobs=2"},
                      TempDir() + "/coordinator.log");
  const std::string flags = " --coordinator=127.0.0.1:" + port + " 2>&1";
  const std::string spec = TempDir() + "/job.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 1\n"
                "batch_size: 64\nepochs: 1\n");
  CommandResult r;
  for (int i = 0; i < 50; ++i) {  // until it listens
    r = RunCommand("cli/pstrain status" + flags);
    if (r.exit_code == 0) break;
    usleep(100000);
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int i = 1; i <= 5; ++i) {
    r = RunCommand("cli/pstrain submit " + spec + flags);
    ASSERT_EQ(r.output, absl::StrCat("job-", i, "\n"));
  }
  // job-2 stays pending; the others end in the order 4, 1, 5, 3: the two
  // that ended last are kept, in the table's order.
  for (const char* id : {"job-4", "job-1", "job-5", "job-3"}) {
    r = RunCommand(absl::StrCat("cli/pstrain cancel ", id, flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  r = RunCommand("cli/pstrain status" + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> ids;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (!line.empty()) ids.push_back(std::string(line.substr(0, 5)));
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"job-2", "job-3", "job-5"}))
      << r.output;
  r = RunCommand("cli/pstrain status job-4" + flags);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("unknown job job-4"));
  // The job file holds the same three.
  JobTableFile stored;
  ASSERT_TRUE(stored.ParseFromString(ReadTextFile(job_file)));
  EXPECT_EQ(stored.jobs_size(), 3);
  EXPECT_EQ(stored.next_id(), 6);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

using ::pstrain::testing::CommandResult;
using ::pstrain::testing::FreePort;
using ::pstrain::testing::Process;
using ::pstrain::testing::RunCommand;
using ::pstrain::testing::TempDir;
using ::pstrain::testing::WriteTextFile;

// Without a job file the table starts again at job-1 after a restart: the
// ids carry a random suffix per coordinator process, so a restarted
// coordinator never hands out an id that an earlier run's certificates
// (pstrain certs --job=<id>) name.
TEST(CoordinatorStateTest, JobIdsDoNotRepeatAcrossRestartsWithoutAJobFile) {
  ::pstrain::testing::UseTestCertificates();
  const std::string spec = TempDir() + "/ids.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 1\n"
                "batch_size: 64\nepochs: 1\n");
  std::vector<std::string> ids;
  for (int run = 0; run < 2; ++run) {
    const std::string port = std::to_string(FreePort());
    Process coordinator({"coordinator/pstrain_coordinator", "--port=" + port},
                        TempDir() + "/coordinator-ids.log");
    const std::string flags = " --coordinator=127.0.0.1:" + port + " 2>&1";
    CommandResult r;
    for (int i = 0; i < 50; ++i) {  // until it listens
      r = RunCommand("cli/pstrain submit " + spec + flags);
      if (r.exit_code == 0) break;
      usleep(100000);
    }
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, ::testing::MatchesRegex("job-1-[0-9a-f]{8}\n"));
    ids.push_back(r.output);
  }
  EXPECT_NE(ids[0], ids[1]);
}

}  // namespace
}  // namespace pstrain
