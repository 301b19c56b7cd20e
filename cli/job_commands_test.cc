// The job commands against an in-process coordinator: a job at its caps (a
// full log, a full key-value store, a result of nearly 1 MiB) is read whole
// by `pstrain logs`, `pstrain status` (the job, and every job) and
// `pstrain wait`; with gRPC's default receive limit of 4 MiB each failed
// with RESOURCE_EXHAUSTED, for good.
#include "cli/job_commands.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/job_at_caps_test_util.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(bool, insecure);
ABSL_DECLARE_FLAG(int, coordinator_timeout_s);

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// The command's exit code; its stdout in *output.
int RunCommand(int (*command)(const std::vector<std::string>&),
               const std::vector<std::string>& args, std::string* output) {
  ::testing::internal::CaptureStdout();
  const int code = command(args);
  *output = ::testing::internal::GetCapturedStdout();
  return code;
}

// One test: the commands share one channel for the process (made on the
// first command), so one coordinator.
TEST(JobCommandsTest, AJobAtItsCapsIsReadWhole) {
  CoordinatorServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  JobTable& table = (*server)->table();
  absl::SetFlag(&FLAGS_coordinator,
                absl::StrCat("127.0.0.1:", (*server)->port()));
  absl::SetFlag(&FLAGS_insecure, true);
  absl::SetFlag(&FLAGS_coordinator_timeout_s, 5);

  JobSpec spec;
  spec.set_num_ps(1);
  spec.set_num_workers(kWorkersToFillTheStore);
  ApplyJobDefaults(&spec);
  absl::StatusOr<std::string> id = table.Submit(spec, absl::Now());
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::string> last = FillJobToItsCaps(table, *id);
  ASSERT_TRUE(last.ok()) << last.status();
  // Each answer below is over gRPC's default limit.
  constexpr size_t kGrpcDefault = 4 << 20;
  absl::StatusOr<JobInfo> whole = table.Get(*id);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_GT(whole->ByteSizeLong(), 2 * kGrpcDefault);
  absl::StatusOr<JobInfo> without_log = table.Get(*id, JobTable::kNoLog);
  ASSERT_TRUE(without_log.ok()) << without_log.status();
  EXPECT_GT(without_log->ByteSizeLong(), kGrpcDefault);

  std::string output;
  ASSERT_EQ(RunCommand(LogsCommand, {*id}, &output), 0);
  const std::vector<std::string> lines =
      absl::StrSplit(output, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), kLogLinesAtTheCap);
  EXPECT_THAT(output, HasSubstr(absl::StrCat("[worker1] ", *last, "xxx")));

  ASSERT_EQ(RunCommand(StatusCommand, {*id}, &output), 0);
  EXPECT_THAT(output, HasSubstr(absl::StrCat(*id, " PENDING ")));
  EXPECT_THAT(output, HasSubstr("  worker 15 "));

  ASSERT_EQ(RunCommand(StatusCommand, {}, &output), 0);
  EXPECT_THAT(output, HasSubstr(absl::StrCat(*id, " PENDING ")));

  // wait's first answer carries the whole log.
  ASSERT_TRUE(table.Cancel(*id, absl::Now()).ok());
  EXPECT_EQ(RunCommand(WaitCommand, {*id}, &output), 1);
  EXPECT_THAT(output, HasSubstr(absl::StrCat("[worker1] ", *last, "xxx")));
  EXPECT_THAT(output, HasSubstr(absl::StrCat(*id, " CANCELLED ")));
}

}  // namespace
}  // namespace pstrain
