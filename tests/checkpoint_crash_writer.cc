// The child process of tests/checkpoint_crash_test: trains the checkpoint
// fixture (tests/checkpoint_fixture.h) on in-process shards and writes a
// checkpoint after every step, through the real writers, until it is killed
// or has done --steps steps. It resumes from --dir's latest checkpoint when
// there is one, so that a killed child's successor goes on from where the
// checkpoints say.
//
// Prints "ready <step>" once the shards are initialised (the step it resumed
// from), "early <step>" after each --early_latest move, and at the end (with
// --steps) "checkpoint_ms <mean>", the mean wall time of one checkpoint (Begin
// to the next Begin's return, which waits for it).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "tests/checkpoint_fixture.h"

ABSL_FLAG(std::string, dir, "", "Checkpoint folder.");
ABSL_FLAG(std::string, model, "synthetic",
          "A zoo model (inputs 1x28x28, 10 classes) or synthetic.");
ABSL_FLAG(std::string, sizes, "1000,100,10",
          "synthetic: element count of each tensor.");
ABSL_FLAG(int, buffers, 1, "synthetic: how many of the last are buffers.");
ABSL_FLAG(int, num_ps, 2, "Shards.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20, "Largest chunk, bytes.");
ABSL_FLAG(int, keep_checkpoints, 3, "Checkpoints kept.");
ABSL_FLAG(int64_t, steps, 0, "Steps to do, then exit 0; 0: until killed.");
ABSL_FLAG(bool, early_latest, false,
          "Negative control: right after each Begin, point DIR/latest at the "
          "checkpoint still being written (a writer that moves latest before "
          "the files are durable), which the test must catch.");

namespace pstrain::testing {
namespace {

absl::Status Run() {
  std::unique_ptr<FixtureModel> model;
  if (absl::GetFlag(FLAGS_model) == "synthetic") {
    std::vector<int64_t> sizes;
    for (absl::string_view s :
         absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(s, &n) || n <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--sizes: \"", s, "\" is not a positive count"));
      }
      sizes.push_back(n);
    }
    model = FixtureModel::Synthetic(sizes, absl::GetFlag(FLAGS_buffers));
  } else {
    ASSIGN_OR_RETURN(
        model, FixtureModel::Zoo(absl::GetFlag(FLAGS_model), {1, 28, 28}, 10));
  }
  RigOptions options;
  options.checkpoint_dir = absl::GetFlag(FLAGS_dir);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.num_shards = absl::GetFlag(FLAGS_num_ps);
  options.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  options.resume = true;
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRig> rig,
                   CheckpointRig::Create(model.get(), options));
  std::printf("ready %lld\n", static_cast<long long>(rig->step()));
  std::fflush(stdout);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const absl::Time start = absl::Now();
  for (int64_t i = 0; steps == 0 || i < steps; ++i) {
    RETURN_IF_ERROR(rig->Step());
    RETURN_IF_ERROR(rig->BeginCheckpoint());
    if (absl::GetFlag(FLAGS_early_latest)) {
      RETURN_IF_ERROR(
          WriteFileAtomically(absl::StrCat(options.checkpoint_dir, "/latest"),
                              absl::StrCat("step-", rig->step(), "\n")));
      std::printf("early %lld\n", static_cast<long long>(rig->step()));
      std::fflush(stdout);
    }
  }
  RETURN_IF_ERROR(rig->writer().Wait());
  if (steps > 0) {
    std::printf("checkpoint_ms %.3f\n",
                absl::ToDoubleMilliseconds(absl::Now() - start) / steps);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pstrain::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pstrain::testing::Run();
  if (!status.ok()) {
    pstrain::PrintError("checkpoint_crash_writer", status.ToString());
    return 1;
  }
  return 0;
}
