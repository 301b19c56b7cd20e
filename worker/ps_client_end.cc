// PsClient's end of a job (worker/ps_client.h): the wait for every member's
// last step (AwaitStepsEnded) and WorkerDone (Done).
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/ps_client.h"

namespace pstrain {

grpc::Status PsClient::WorkerDone(int shard, bool steps_ended,
                                  WorkerDoneResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  WorkerDoneRequest request;
  SetHeader(request.mutable_header());
  request.set_steps_ended(steps_ended);
  return stubs_[shard]->WorkerDone(&context, request, response);
}

absl::StatusOr<std::vector<int>> PsClient::AwaitStepsEnded(
    absl::Duration stall_timeout) {
  absl::Duration pause = absl::Milliseconds(5);
  int64_t last_bytes = -1;
  absl::Time progress = absl::Now();
  for (;;) {
    std::set<int> training;
    int64_t bytes = 0;
    for (int s = 0; s < num_shards(); ++s) {
      WorkerDoneResponse response;
      const grpc::Status status =
          WorkerDone(s, /*steps_ended=*/true, &response);
      if (!status.ok()) return ShardError(s, status);
      training.insert(response.training_ids().begin(),
                      response.training_ids().end());
      bytes += response.bytes_received();
    }
    if (training.empty()) return std::vector<int>();
    const absl::Time now = absl::Now();
    if (bytes != last_bytes) {
      last_bytes = bytes;
      progress = now;
    } else if (now - progress >= stall_timeout) {
      return std::vector<int>(training.begin(), training.end());
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(100));
  }
}

absl::Status PsClient::Done() {
  absl::Status first_error = CloseStreams();
  for (int s = 0; s < num_shards(); ++s) {
    WorkerDoneResponse response;
    const grpc::Status status = WorkerDone(s, /*steps_ended=*/false, &response);
    if (!status.ok() && first_error.ok()) first_error = ShardError(s, status);
  }
  return first_error;
}

}  // namespace pstrain
