#include "cli/control_file.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::string TempFile(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app) << text;
}

TEST(ControlFileTest, ParsesScaleLines) {
  absl::StatusOr<ScaleLine> line =
      ParseControlLine("num_workers=4 at_step=200");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->num_workers, 4);
  EXPECT_EQ(line->at_step, 200);
  EXPECT_EQ(line->num_ps, 0);
  line = ParseControlLine("  num_workers=3");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->at_step, 0);
  // Shards (issue 40), alone or with the workers.
  line = ParseControlLine("num_ps=3 at_step=300");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->num_workers, 0);
  EXPECT_EQ(line->num_ps, 3);
  EXPECT_EQ(line->at_step, 300);
  line = ParseControlLine("num_ps=2\tnum_workers=4");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->num_workers, 4);
  EXPECT_EQ(line->num_ps, 2);
  const std::string expected =
      "expected [num_workers=N] [num_ps=M] [at_step=S], with num_workers, "
      "num_ps or both";
  const std::string each_once = " (N >= 1, M >= 1, S >= 0, each once)";
  const struct {
    std::string text;
    std::string error;
  } bad[] = {
      {"workers=3", "\"workers=3\": \"workers=3\"; " + expected + each_once},
      {"num_workers=0",
       "\"num_workers=0\": \"num_workers=0\"; " + expected + each_once},
      {"num_workers=2 at_step=-1",
       "\"num_workers=2 at_step=-1\": \"at_step=-1\"; " + expected + each_once},
      {"num_workers=2 num_workers=3",
       "\"num_workers=2 num_workers=3\": \"num_workers=3\"; " + expected +
           each_once},
      {"num_ps=0", "\"num_ps=0\": \"num_ps=0\"; " + expected + each_once},
      {"num_ps=2 num_ps=3",
       "\"num_ps=2 num_ps=3\": \"num_ps=3\"; " + expected + each_once},
      {"at_step=5", "\"at_step=5\": " + expected},
  };
  for (const auto& b : bad) {
    line = ParseControlLine(b.text);
    EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument)
        << b.text;
    EXPECT_EQ(line.status().message(), b.error);
  }
}

TEST(ControlFileTest, PollReadsEachCompleteLineOnce) {
  const std::string path = TempFile("control");
  ControlFile control(path);
  EXPECT_TRUE(control.Poll().empty());  // not there yet
  Append(path, "# grow\nnum_workers=4 at_step=200\nbogus\nnum_workers=3");
  std::vector<ScaleLine> lines = control.Poll();  // warns about line 3
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 4);
  EXPECT_TRUE(control.Poll().empty());  // line 4 has no newline yet
  Append(path, "\n\n");
  lines = control.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 3);
  EXPECT_TRUE(control.Poll().empty());
  // Written anew: read from its start.
  std::ofstream(path, std::ios::trunc) << "num_workers=2\n";
  lines = control.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 2);
  // A line too long to be one is refused without waiting for its newline.
  Append(path, std::string(ControlFile::kMaxLineBytes + 10, 'x'));
  EXPECT_TRUE(control.Poll().empty());
  Append(path, "\nnum_workers=5\n");
  lines = control.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 5);
  // A shard count (issue 40).
  Append(path, "num_ps=3 at_step=7\n");
  lines = control.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 0);
  EXPECT_EQ(lines[0].num_ps, 3);
  EXPECT_EQ(lines[0].at_step, 7);
}

// A FIFO in the file's place (a user's `mkfifo`) is refused at once with
// a warning, instead of blocking the run's supervisor until a writer
// comes; a regular file put there later is read.
TEST(ControlFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string path = TempFile("control_fifo");
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  ControlFile control(path);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(control.Poll().empty());
  EXPECT_TRUE(control.Poll().empty());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  std::remove(path.c_str());
  Append(path, "num_workers=2\n");
  const std::vector<ScaleLine> lines = control.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].num_workers, 2);
}

}  // namespace
}  // namespace pstrain
