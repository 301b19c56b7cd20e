// One worker's PushPull stream on a shard: the per-stream session that
// PsService::PushPullStream is a shell over (internal to server:ps_service).
//
// The gRPC thread that runs the handler reads: each message (a push, a
// skipped push, a step end, a step norm or a pull) goes to the shard as it
// arrives. A second thread serves the pulls, chunk by chunk, as each chunk
// reaches the version asked for. A sync worker sends its pull before its
// pushes, so the first updated chunks flow back down while the last
// gradients still flow up: each direction of the link is busy at once, as
// in BytePS's per-partition push/pull.
//
// Bounds: at most kMaxPendingPulls pulls wait in the queue
// (RESOURCE_EXHAUSTED past them); every write is watched by the service's
// watchdog, which cancels the call when one stays blocked longer than the
// service's write timeout. A stream that ends any other way than by the
// worker's half-close breaks the sync barrier of the step in flight
// (ParameterShard::BreakBarrier), naming the worker.
//
// Several streams per worker (the job's channels_per_shard N > 1, so that
// TLS runs on N connections): each stream is a session of its own, pushing
// and pulling its part of the shard's chunks (PullRequest.channel). The
// shard takes a worker's StepEnd only after its push of every chunk, but
// streams are not ordered with each other: streams 1..N-1 each send a
// PushesSent after their last push of the step, which the service counts
// (PsService::NotePushesSent), and stream 0's StepEnd (channels = N) waits
// for N - 1 of them before the shard takes it, at most the pull timeout.
//
// Thread-safety: Run() is called once, by the handler's thread; the class
// owns the writer thread and joins it before Run() returns.
#ifndef PSTRAIN_SERVER_PUSH_PULL_SESSION_H_
#define PSTRAIN_SERVER_PUSH_PULL_SESSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/chunk_message.h"
#include "server/ps_service.h"
#include "server/pull_rows.h"

namespace pstrain {

class PsService::PushPullSession {
 public:
  using Stream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

  // Pulls one stream may have waiting to be served. A worker has at most
  // staleness + 1 in flight (one per step it may run ahead); past this the
  // stream is refused, so a caller that sends pulls and never reads cannot
  // grow the queue without bound.
  static constexpr size_t kMaxPendingPulls = 1024;
  // Streams one worker may spread its chunks over (PullRequest.channels).
  static constexpr int kMaxChannels = 64;

  // Registers the stream's write with the service's watchdog.
  PushPullSession(PsService* service, grpc::ServerContext* context,
                  Stream* stream);
  // Unregisters it.
  ~PushPullSession();

  // Serves the stream until the worker half-closes (then the pulls already
  // asked for are served) or a message is refused; the call's status: the
  // first error of the reader or the writer.
  grpc::Status Run();

 private:
  struct PullJob {
    int64_t min_version;
    int64_t samples;
    int64_t generation;
    int64_t worker_id;
    // How the weights travel (PullRequest.wire_dtype; fp32 if unset).
    DType wire_dtype;
    // The chunks asked for (PullRequest.channel and channels).
    PullSubset subset;
    // PullRequest.priority and announce_decision.
    bool priority;
    bool announce_decision;
    // PullRequest.rows (server/pull_rows.h); null: every chunk whole.
    std::shared_ptr<const PullRowSets> rows;
    // PullRequest.have_version (delta pulls); -1: none, or an fp16 wire
    // (whose per-chunk scale a delta would not keep).
    int64_t have_version;
  };

  // One message read; nullopt to go on, else the status to finish with
  // (the stream is cancelled).
  std::optional<grpc::Status> Handle(const PushPullRequest& request);
  std::optional<grpc::Status> HandleFirst(const PushPullRequest& request);
  std::optional<grpc::Status> HandlePush();
  std::optional<grpc::Status> HandleStepEnd(const StepEnd& end);
  // A worker with several streams to this shard: this stream's pushes of
  // `step` are in (PushesSent), or, on its first stream with the step's
  // end over `channels` streams, waits for the others' (an error status
  // to finish with, OK when the call was cancelled meanwhile).
  std::optional<grpc::Status> HandlePushesSent(const PushesSent& sent);
  std::optional<grpc::Status> AwaitPushesSent(int64_t step, int channels);
  std::optional<grpc::Status> QueuePull(const PullRequest& pull);
  // The writer thread: serves the queued pulls until closed.
  void ServePulls();
  // Serves one pull; false when the stream must end (writer_status_ set).
  bool ServePull(const PullJob& job);
  // After a failed pull: the error in-band, then the call ends.
  void EndAfterPullError(bool write_failed, const absl::Status& status);
  // One write at a time (pull replies and shard 0's admissions share the
  // stream), timed by the watchdog; false if the worker is gone.
  bool Write(const grpc::ByteBuffer& message);
  // Stops the writer after its queued pulls (at once when `cancel`) and
  // returns the first error of either side.
  grpc::Status Finish(grpc::Status reader_status, bool cancel);

  PsService* const service_;
  ParameterShard* const shard_;
  grpc::ServerContext* const context_;
  Stream* const stream_;
  WriteWatch watch_;

  absl::Mutex mu_;
  std::deque<PullJob> jobs_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancelled_{false};
  absl::Mutex write_mu_;
  // Written by the writer thread, read after it is joined.
  grpc::Status writer_status_ = grpc::Status::OK;
  absl::Notification reader_done_;  // the reader's loop ended
  std::thread writer_;

  // The reader's state (the handler's thread only).
  ReceivedChunkMessage received_;
  int worker_id_ = -1;
  // The worker's address, read with its first message (after a cancel gRPC
  // may only say "unknown").
  std::string peer_;
  int64_t generation_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PUSH_PULL_SESSION_H_
