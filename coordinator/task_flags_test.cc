// Where a task's index (ResolveTaskIndex) and thread count
// (ResolveTaskThreads) come from, and the flags' ranges checked at the
// task's start (CheckTaskFlags).
#include "coordinator/task_flags.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// An environment of `values` only.
std::function<const char*(const char*)> Env(
    const std::map<std::string, std::string>& values) {
  return [values](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

TEST(TaskIndexTest, FlagFirstThenTheLaunchersVariablesInOrder) {
  EXPECT_EQ(*ResolveTaskIndex(3, Env({{"SLURM_PROCID", "1"}})), 3);
  EXPECT_EQ(*ResolveTaskIndex(-1, Env({{"SLURM_PROCID", "1"},
                                       {"JOB_COMPLETION_INDEX", "2"}})),
            1);
  EXPECT_EQ(*ResolveTaskIndex(-1, Env({{"OMPI_COMM_WORLD_RANK", "4"}})), 4);
  EXPECT_EQ(*ResolveTaskIndex(-1, Env({{"PMI_RANK", "5"}})), 5);
}

TEST(TaskIndexTest, KubernetesIndexedJobsCompletionIndex) {
  EXPECT_EQ(*ResolveTaskIndex(-1, Env({{"JOB_COMPLETION_INDEX", "0"}})), 0);
  EXPECT_EQ(*ResolveTaskIndex(-1, Env({{"JOB_COMPLETION_INDEX", "7"}})), 7);
}

TEST(TaskIndexTest, BadOrMissingIndexIsNamed) {
  absl::StatusOr<int> bad =
      ResolveTaskIndex(-1, Env({{"JOB_COMPLETION_INDEX", "x"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("JOB_COMPLETION_INDEX=x"),
            std::string::npos);
  absl::StatusOr<int> none = ResolveTaskIndex(-1, Env({}));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("JOB_COMPLETION_INDEX"),
            std::string::npos);
}

TEST(TaskThreadsTest, FlagFirst) {
  absl::StatusOr<TaskThreads> t =
      ResolveTaskThreads(3, 16, Env({{"SLURM_CPUS_PER_TASK", "8"}}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->threads, 3);
  EXPECT_EQ(t->source, "--threads");
  EXPECT_FALSE(t->warning);
}

TEST(TaskThreadsTest, PstrainRunsOmpNumThreadsThenSlurmThenOpenMpi) {
  EXPECT_EQ(
      ResolveTaskThreads(
          0, 16, Env({{"OMP_NUM_THREADS", "2"}, {"SLURM_CPUS_PER_TASK", "8"}}))
          ->threads,
      2);
  absl::StatusOr<TaskThreads> slurm = ResolveTaskThreads(
      0, 16,
      Env({{"SLURM_CPUS_PER_TASK", "8"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(slurm->threads, 8);
  EXPECT_EQ(slurm->source, "SLURM_CPUS_PER_TASK");
  // mpirun: the node's cores divided among its tasks there.
  absl::StatusOr<TaskThreads> mpi =
      ResolveTaskThreads(0, 16, Env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
  EXPECT_EQ(mpi->threads, 5);
  EXPECT_EQ(mpi->source, "OMPI_COMM_WORLD_LOCAL_SIZE=3 of 16 cores");
  EXPECT_FALSE(mpi->warning);
  EXPECT_EQ(ResolveTaskThreads(0, 2, Env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}))
                ->threads,
            1);
}

TEST(TaskThreadsTest, NothingSetMeansEveryCoreWithAWarning) {
  absl::StatusOr<TaskThreads> t = ResolveTaskThreads(0, 16, Env({}));
  EXPECT_EQ(t->threads, 16);
  EXPECT_EQ(t->source, "all 16 cores");
  EXPECT_TRUE(t->warning);
}

TEST(TaskThreadsTest, BadValuesAreNamed) {
  EXPECT_EQ(ResolveTaskThreads(-1, 16, Env({})).status().message(),
            "--threads=-1: expected 1 to 1024 (0: automatic)");
  EXPECT_EQ(ResolveTaskThreads(1025, 16, Env({})).status().message(),
            "--threads=1025: expected 1 to 1024 (0: automatic)");
  EXPECT_TRUE(ResolveTaskThreads(1024, 16, Env({})).ok());
  EXPECT_EQ(ResolveTaskThreads(0, 16, Env({{"SLURM_CPUS_PER_TASK", "x"}}))
                .status()
                .message(),
            "SLURM_CPUS_PER_TASK=x: expected a positive integer (or pass "
            "--threads)");
}

// A typo in a task's flags is named before anything is contacted, the
// flag and its range in one line (it failed the whole job once the task
// had joined it).
TEST(CheckTaskFlagsTest, OutOfRangeFlagsAreNamedWithTheirRange) {
  absl::FlagSaver saver;
  EXPECT_TRUE(CheckTaskFlags(ROLE_PS).ok());
  struct Case {
    std::function<void()> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[] { absl::SetFlag(&FLAGS_port, 70000); },
       "--port=70000: expected 0 to 65535 (0: any free port; -1: the job "
       "spec's)"},
      {[] { absl::SetFlag(&FLAGS_port, -2); },
       "--port=-2: expected 0 to 65535 (0: any free port; -1: the job "
       "spec's)"},
      {[] { absl::SetFlag(&FLAGS_threads, -3); },
       "--threads=-3: expected 1 to 1024 (0: automatic)"},
      {[] { absl::SetFlag(&FLAGS_threads, 5000); },
       "--threads=5000: expected 1 to 1024 (0: automatic)"},
      {[] { absl::SetFlag(&FLAGS_task_index, -5); },
       "--task_index=-5: expected 0 to 1023 (-1: from the launcher's "
       "environment)"},
      {[] { absl::SetFlag(&FLAGS_task_index, 1024); },
       "--task_index=1024: expected 0 to 1023 (-1: from the launcher's "
       "environment)"},
      {[] { absl::SetFlag(&FLAGS_advertise, "h:99999"); },
       "--advertise=h:99999: expected host or host:PORT, PORT 0 to 65535"},
      {[] { absl::SetFlag(&FLAGS_advertise, "h:x"); },
       "--advertise=h:x: expected host or host:PORT, PORT 0 to 65535"},
      {[] {
         absl::SetFlag(&FLAGS_port, 7000);
         absl::SetFlag(&FLAGS_advertise, "h:7001");
       },
       "--advertise=h:7001: expected host or host:7000 (the port this task "
       "listens on, --port)"},
      {[] { absl::SetFlag(&FLAGS_coordinator, "head:99999"); },
       "--coordinator=head:99999: port \"99999\"; expected HOST:PORT (PORT "
       "1 to 65535), or unix:PATH"},
  };
  for (const Case& c : cases) {
    absl::FlagSaver each;
    c.set();
    const absl::Status s = CheckTaskFlags(ROLE_PS);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(CheckTaskFlagsTest, InRangeFlagsPass) {
  absl::FlagSaver saver;
  // A worker's index goes higher than a shard's.
  absl::SetFlag(&FLAGS_task_index, 4095);
  EXPECT_TRUE(CheckTaskFlags(ROLE_WORKER).ok());
  EXPECT_FALSE(CheckTaskFlags(ROLE_PS).ok());
  absl::SetFlag(&FLAGS_task_index, -1);
  absl::SetFlag(&FLAGS_port, 0);
  absl::SetFlag(&FLAGS_advertise, "h:7001");
  absl::SetFlag(&FLAGS_threads, 1024);
  EXPECT_TRUE(CheckTaskFlags(ROLE_PS).ok());
  absl::SetFlag(&FLAGS_port, 65535);
  absl::SetFlag(&FLAGS_advertise, "h:65535");
  EXPECT_TRUE(CheckTaskFlags(ROLE_PS).ok());
  absl::SetFlag(&FLAGS_advertise, "h");
  EXPECT_TRUE(CheckTaskFlags(ROLE_PS).ok());
}

TEST(TaskThreadsTest, UsableCoresIsAtLeastOne) { EXPECT_GE(UsableCores(), 1); }

}  // namespace
}  // namespace pstrain
