// The synthetic compute (CreateSyntheticWorkload): a GPU's step as sleeps,
// with the gradients announced through backward and, with priority pulls,
// a forward that waits for each tensor's weights.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/model.h"
#include "worker/trainer.h"
#include "worker/workload.h"

namespace pstrain {
namespace {

// Two tensors of 1 MiB (the synthetic tensors' size), 100 ms a step, half
// of it backward.
TrainerOptions TwoTensors() {
  TrainerOptions options;
  options.model_bytes = 2 << 20;
  options.compute_ms = 100;
  options.backward_fraction = 0.5;
  options.max_steps_per_epoch = 10;
  return options;
}

// Releases tensor t at `ready[t]` after its start; records the calls.
class TimedGate : public WeightsGate {
 public:
  TimedGate(absl::Time start, std::vector<absl::Duration> ready)
      : start_(start), ready_(std::move(ready)) {}
  absl::Status AwaitTensor(int t) override {
    calls_.push_back(t);
    absl::SleepFor(start_ + ready_[t] - absl::Now());
    return error_;
  }
  absl::Status AwaitAll() override {
    calls_.push_back(-1);
    for (absl::Duration d : ready_) absl::SleepFor(start_ + d - absl::Now());
    return absl::OkStatus();
  }
  std::vector<int> calls_;
  absl::Status error_;

 private:
  absl::Time start_;
  std::vector<absl::Duration> ready_;
};

struct Announced {
  int tensor;
  absl::Duration at;
};

// A step's on_ready that records each tensor announced and when, from
// `start`.
GradientsReadyFn Recorder(absl::Time start, std::vector<Announced>* out) {
  return
      [start, out](absl::Span<const int> tensors, std::shared_ptr<CopyFence>) {
        for (int t : tensors) out->push_back({t, absl::Now() - start});
      };
}

TEST(SyntheticWorkloadTest, BackwardAnnouncesLastTensorFirstAfterTheForward) {
  const TrainerOptions options = TwoTensors();
  absl::StatusOr<std::unique_ptr<Workload>> w =
      CreateSyntheticWorkload(options);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->can_gate_weights());
  std::vector<Announced> announced;
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*w)->Step(Recorder(start, &announced)).ok());
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(announced.size(), 2u);
  EXPECT_EQ(announced[0].tensor, 1);
  EXPECT_EQ(announced[1].tensor, 0);
  // Forward 50 ms, then each tensor's half of the 50 ms backward.
  EXPECT_GE(announced[0].at, absl::Milliseconds(75));
  EXPECT_GE(announced[1].at, absl::Milliseconds(100));
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(1));
}

// Priority pulls: tensor 0's weights are in at once, tensor 1's at 60 ms.
// The forward runs tensor 0's 25 ms share at once and tensor 1's from
// 60 ms, so the step ends at 60 + 25 + 50 = 135 ms, where waiting for the
// whole pull first ends it at 60 + 100 = 160 ms.
TEST(SyntheticWorkloadTest, AGatedForwardStartsBeforeThePullEnds) {
  const TrainerOptions options = TwoTensors();
  absl::StatusOr<std::unique_ptr<Workload>> w =
      CreateSyntheticWorkload(options);
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Time start = absl::Now();
  TimedGate gate(start, {absl::ZeroDuration(), absl::Milliseconds(60)});
  (*w)->SetWeightsGate(&gate);
  std::vector<Announced> announced;
  ASSERT_TRUE((*w)->Step(Recorder(start, &announced)).ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(gate.calls_, (std::vector<int>{0, 1, -1}));
  ASSERT_EQ(announced.size(), 2u);
  EXPECT_GE(announced[0].at, absl::Milliseconds(110));  // 85 + 25
  EXPECT_GE(took, absl::Milliseconds(135));
  EXPECT_LT(took, absl::Milliseconds(160) + absl::Milliseconds(400))
      << "a loaded machine's slack only";
}

// Shaped like ResNet-18 (JobSpec.synthetic_layers): the model's PS tensors,
// and each layer's time by its multiply-accumulates. layer4 holds 75% of
// the bytes but about a fifth of the multiply-accumulates, so a backward
// timed by size would announce its last tensor (the first layer4 one,
// backward going last first) at about 1 + 0.75 = 1.75 s of a 2-s step with
// 1 s of backward; by multiply-accumulates it is about 1.2 s.
TEST(SyntheticWorkloadTest, ShapedLikeAModelItTakesItsTensorsAndLayerTimes) {
  TrainerOptions options;
  options.synthetic_layers = true;
  options.model = "resnet18";
  options.model_bytes = 0;  // unused: the model's
  options.compute_ms = 2000;
  options.backward_fraction = 0.5;
  options.max_steps_per_epoch = 10;
  absl::StatusOr<std::unique_ptr<Workload>> w =
      CreateSyntheticWorkload(options);
  ASSERT_TRUE(w.ok()) << w.status();
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("resnet18", {1, 28, 28}, 10, ModelOptions(), cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*w)->TensorNumElements(), (*model)->PsTensorNumElements());
  const std::vector<std::string> names = (*w)->TensorNames();
  EXPECT_EQ(names, (*model)->PsTensorNames());
  int first_layer4 = -1;
  for (size_t t = 0; t < names.size() && first_layer4 < 0; ++t) {
    if (names[t].rfind("layer4.", 0) == 0) first_layer4 = static_cast<int>(t);
  }
  ASSERT_GT(first_layer4, 0);

  std::vector<Announced> announced;
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*w)->Step(Recorder(start, &announced)).ok());
  ASSERT_EQ(announced.size(), names.size());
  EXPECT_EQ(announced.back().tensor, 0);  // conv1's weight, last
  for (const Announced& a : announced) {
    if (a.tensor != first_layer4) continue;
    EXPECT_GE(a.at, absl::Milliseconds(1000));
    EXPECT_LT(a.at, absl::Milliseconds(1500))
        << "layer4 took its share of the bytes, not of the "
           "multiply-accumulates";
  }

  options.model = "no_such_model";
  EXPECT_EQ(CreateSyntheticWorkload(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticWorkloadTest, TheGatesErrorEndsTheStep) {
  const TrainerOptions options = TwoTensors();
  absl::StatusOr<std::unique_ptr<Workload>> w =
      CreateSyntheticWorkload(options);
  ASSERT_TRUE(w.ok()) << w.status();
  TimedGate gate(absl::Now(), {absl::ZeroDuration(), absl::ZeroDuration()});
  gate.error_ = absl::AbortedError("the pull failed");
  (*w)->SetWeightsGate(&gate);
  int announced = 0;
  const absl::StatusOr<float> loss = (*w)->Step(
      [&](absl::Span<const int>, std::shared_ptr<CopyFence>) { ++announced; });
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(announced, 0);
}

}  // namespace
}  // namespace pstrain
