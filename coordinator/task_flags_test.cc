// Where a task's index (ResolveTaskIndex) and thread count
// (ResolveTaskThreads) come from.
#include "coordinator/task_flags.h"

#include <map>
#include <string>

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

TEST(TaskThreadsTest, UsableCoresIsAtLeastOne) { EXPECT_GE(UsableCores(), 1); }

}  // namespace
}  // namespace pstrain
