// The gRPC face of one ParameterShard (proto/ps.proto): converts messages
// and statuses into the shard's calls, and owns what the protocol needs
// beside the shard's state:
//   - per PushPull stream, a session (server/push_pull_session.h) whose
//     writer thread serves the pulls while the handler's thread reads;
//   - a watchdog thread that cancels a stream whose write has been blocked
//     longer than `write_timeout`;
//   - the background writer of this shard's checkpoint file (one at a time,
//     under the job's checkpoint_dir; server/shard_checkpoint.h), which
//     with bounded staleness or backup workers first waits for the
//     shard's deferred cut (StepPolicy::deferred_snapshot()), at most the
//     pull timeout;
//   - the authorization of every call (common/authz.h) and the counters its
//     metrics read.
//
// Thread-safety: gRPC calls the handlers from its own threads concurrently;
// the service's own state is guarded by its mutexes and the shard is
// thread-safe.
#ifndef PSTRAIN_SERVER_PS_SERVICE_H_
#define PSTRAIN_SERVER_PS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/authz.h"
#include "common/rpc_options.h"
#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"

namespace pstrain {

class PsService final : public ParameterServer::Service {
 public:
  // `pull_timeout`: how long a pull may wait for a version (sync mode: for
  // the slowest worker) before it fails with DEADLINE_EXCEEDED.
  // `authorize`: check every call's certificate against common/authz.h (a
  // TLS server); false: a plaintext server, every call allowed.
  // `write_timeout`: how long one write of a pull's chunk may stay blocked
  // on a worker that does not read (its HTTP/2 window full): past it the
  // stream is cancelled (the worker's step fails, naming it via the
  // barrier), so that a client that opens streams and never reads holds
  // no thread for longer than that.
  PsService(ParameterShard* shard, absl::Duration pull_timeout,
            bool authorize = false,
            absl::Duration write_timeout = absl::Seconds(60));
  // Close(), then waits for a checkpoint write in flight; stops the write
  // watchdog.
  ~PsService() override;

  // Ends the checkpoint waits, for the server's shutdown: a Checkpoint call
  // waiting for the write in flight answers UNAVAILABLE, the writer
  // waiting for a deferred cut gives it up (the checkpoint fails with
  // CANCELLED), and every later Checkpoint call is UNAVAILABLE. The gRPC
  // server's Shutdown waits for every handler, so the shard's process
  // calls this before it (server/ps_main.cc). Idempotent; any thread.
  void Close();

  grpc::Status Init(grpc::ServerContext* context,
                    grpc::ServerReader<InitRequest>* reader,
                    InitResponse* response) override;
  grpc::Status WaitReady(grpc::ServerContext* context,
                         const WaitReadyRequest* request,
                         WaitReadyResponse* response) override;
  // PushPull, with its messages as grpc::ByteBuffer (PushPullRequest in,
  // PushPullResponse out; common/chunk_message.h).
  grpc::Status PushPullStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  grpc::Status Stats(grpc::ServerContext* context, const StatsRequest* request,
                     StatsResponse* response) override;
  // Worker 0's checkpoint of a step (proto/ps.proto CheckpointRequest).
  // Checked before anything is made on the shard's host (the step folder
  // is made only for a cut the shard will write): the folder
  // (ShardCheckpointPath), a step not behind the last begun in the
  // shard's generation (FAILED_PRECONDITION), the step the shard's chunks
  // are at (sync) or near (a deferred cut; ParameterShard::SnapshotInto,
  // BeginDeferredSnapshot). A write still in flight is waited for until
  // just before the caller's deadline and at most the pull timeout, then
  // UNAVAILABLE naming its step (`wait`: DEADLINE_EXCEEDED); UNAVAILABLE
  // once Close() was called.
  grpc::Status Checkpoint(grpc::ServerContext* context,
                          const CheckpointRequest* request,
                          CheckpointResponse* response) override;
  // A worker's end (proto/ps.proto WorkerDoneRequest): done, or, with
  // steps_ended, its last step ended; answers how many members have not
  // (a worker removed after its death is not waited for by the latter).
  // ABORTED for steps_ended of another generation than the shard's.
  grpc::Status WorkerDone(grpc::ServerContext* context,
                          const WorkerDoneRequest* request,
                          WorkerDoneResponse* response) override;
  // Elastic jobs: the workers the coordinator removed after their death
  // (HeartbeatResponse.removed_workers), which will never end their steps:
  // WorkerDone's training_ids leave them out. Ids outside the job's
  // capacity are ignored. Any thread.
  void SetRemovedWorkers(const std::vector<int>& workers);
  // Worker 0 of an elastic job moving its state onto another number of
  // shards (proto/ps.proto ExportRequest): reopens the shard closed at the
  // request's generation (ParameterShard::Reopen) and streams every chunk
  // of its state. FAILED_PRECONDITION as Reopen; INVALID_ARGUMENT from
  // another worker than 0.
  grpc::Status Export(grpc::ServerContext* context,
                      const ExportRequest* request,
                      grpc::ServerWriter<ExportResponse>* writer) override;

  // Notified when every worker of the job has called WorkerDone.
  absl::Notification& all_workers_done() { return all_workers_done_; }
  // Time of the last request, for the idle timeout.
  absl::Time last_request_time() const;
  // Whether an Init that restores the initialised shard (a higher
  // generation: a checkpoint, or a reopen) is in progress.
  bool restoring() const { return restores_in_progress_.load() > 0; }

  // What the shard's metrics rows (server/shard_metrics.h) read. Totals
  // since the service started: payload bytes (tensor values) received in
  // pushes and sent in pulls; pulls completed and the time they spent in
  // ParameterShard::Pull (waiting for their version, i.e. in sync mode
  // for the barrier, and sending). Gauges, at the call: pushes read from
  // the streams and not yet taken by the shard (waiting for a chunk's
  // lock or applying it: the shard's push queue), and pulls inside Pull.
  struct Counters {
    int64_t bytes_received = 0;
    int64_t bytes_sent = 0;
    int64_t pulls_done = 0;
    int64_t pull_ns = 0;
    int64_t pushes_queued = 0;
    int64_t pulls_waiting = 0;
  };
  Counters counters() const;

 private:
  // One PushPull stream's reader, writer thread and pull queue
  // (server/push_pull_session.h).
  class PushPullSession;

  void Touch();

  // How long a Checkpoint call may wait for the write in flight: a tenth
  // of its time left (at most 1 s) before the caller's deadline, so that
  // the caller reads the answer, and at most the pull timeout from now.
  absl::Time CheckpointWaitDeadline(const grpc::ServerContext& context) const;
  // Sets a cosine schedule's horizon to `lr_total_steps` (see Init), runs
  // `open` (the shard's call that opens its new state to pushes), and puts
  // the horizon back if `open` fails: a refused Init changes nothing.
  absl::Status OpenWithLrHorizon(int64_t lr_total_steps,
                                 const std::function<absl::Status()>& open);
  // Init's reopen (`first.reopen()`): the shard keeps its own state, closed
  // at `first`'s generation, and opens it again at its reopen_version, now
  // or, with reopen_at_decision, at the decision of the step being
  // collected (ParameterShard::Reopen, PlanReopen). INVALID_ARGUMENT for a
  // stream with more than one message.
  grpc::Status InitReopen(grpc::ServerReader<InitRequest>* reader,
                          const InitRequest& first,
                          const std::optional<WorkerMembership>& membership,
                          InitResponse* response);
  // A `wait` call's part of Checkpoint(): waits until `deadline` for the
  // write of `step` (the last begun) and answers its result.
  grpc::Status AwaitCheckpointLocked(int64_t step, absl::Time deadline,
                                     CheckpointResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  // The checkpoint writer's thread: waits for a deferred cut until
  // `cut_deadline`, writes `chunks` to `path`, records the result for the
  // `wait` call, and removes the shard's old files (`latest_step`:
  // CheckpointRequest's; RemoveOldShardCheckpoints).
  void WriteCheckpoint(int64_t step, int64_t latest_step, int num_shards,
                       absl::Time cut_deadline, const std::string& path,
                       const std::vector<ChunkSnapshot>& chunks)
      ABSL_LOCKS_EXCLUDED(checkpoint_mu_);
  // Joins the checkpoint writer in flight, waiting for it until `deadline`
  // (checkpoint_mu_ is released while it joins): UNAVAILABLE naming the
  // write's step past `deadline`, or once Close() was called.
  grpc::Status JoinCheckpointWriterLocked(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  // UNAVAILABLE: the service is closing (Close()).
  grpc::Status ClosingStatus() const;

  // Records `step` as the newest checkpoint cut begun, in the shard's
  // current generation; and reads it back (-1: none begun in the current
  // generation; see announced_checkpoint_step_).
  void AnnounceCheckpointStep(int64_t step);
  int64_t AnnouncedCheckpointStep() const;

  // Re-layouts (ParameterShard::Initialize with another partition_bytes,
  // --partition_bytes=auto): every PushPull stream, Checkpoint call and
  // WaitReady's read of the layout holds a use of the shard's chunks
  // (EnterLayout/LeaveLayout; it waits while a re-layout runs), and a
  // re-layout begins once no use is held (BeginRelayout: UNAVAILABLE,
  // naming the open uses, if some still are at `deadline`).
  void EnterLayout();
  void LeaveLayout();
  absl::Status BeginRelayout(absl::Time deadline);
  void EndRelayout();

  // Several streams per worker (server/push_pull_session.h): stream c > 0
  // of `worker` sent every push of `step` (PushesSent). RESOURCE_EXHAUSTED
  // past kMaxPushesSent steps noted and not taken.
  absl::Status NotePushesSent(int worker, int64_t generation, int64_t step);
  // How many of `worker`'s other streams have sent their pushes of `step`,
  // waiting until `needed` have or `deadline` passes; once `needed` have,
  // forgets them (and the worker's older steps).
  int TakePushesSent(int worker, int64_t generation, int64_t step, int needed,
                     absl::Time deadline);
  static constexpr size_t kMaxPushesSent = 4096;

  // The caller may make this call (common/authz.h) for `header`'s job and
  // worker.
  grpc::Status Authorize(const grpc::ServerContext& context, const char* method,
                         const RequestHeader& header) const;
  // The caller may call `method` of the shard's job at all (as itself),
  // checked before a stream's first message is read.
  grpc::Status AuthorizeCaller(const grpc::ServerContext& context,
                               const char* method) const;

  // A PushPull stream's write in progress, for the watchdog.
  struct WriteWatch {
    grpc::ServerContext* context;
    // Unix ms when the pending write began; 0: none pending.
    std::atomic<int64_t> since_ms{0};
  };
  // Every second: cancels the streams whose write has been pending longer
  // than write_timeout_.
  void WatchWrites();

  ParameterShard* const shard_;
  const absl::Duration pull_timeout_;
  const absl::Duration write_timeout_;
  absl::Mutex watch_mu_;
  std::set<WriteWatch*> watches_ ABSL_GUARDED_BY(watch_mu_);
  bool stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  absl::CondVar watch_cv_;  // signalled when stopping_ is set
  std::thread watchdog_;
  const Authorizer authorizer_;
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> pulls_done_{0};
  std::atomic<int64_t> pull_ns_{0};
  std::atomic<int64_t> pushes_queued_{0};
  std::atomic<int64_t> pulls_waiting_{0};
  std::atomic<int64_t> last_request_unix_ms_;
  absl::Mutex done_mu_;
  std::vector<bool> done_ ABSL_GUARDED_BY(done_mu_);
  // Per worker, the generation in which it said its steps ended
  // (WorkerDoneRequest.steps_ended); -1: never.
  std::vector<int64_t> steps_ended_ ABSL_GUARDED_BY(done_mu_);
  // Workers removed from the job after their death (SetRemovedWorkers).
  std::vector<bool> removed_ ABSL_GUARDED_BY(done_mu_);
  absl::Notification all_workers_done_;
  std::atomic<int> restores_in_progress_{0};
  absl::Mutex layout_mu_;
  int layout_uses_ ABSL_GUARDED_BY(layout_mu_) = 0;
  bool relayout_ ABSL_GUARDED_BY(layout_mu_) = false;
  // NotePushesSent(): per (generation, worker, step), the streams noted.
  absl::Mutex pushes_sent_mu_;
  std::map<std::tuple<int64_t, int, int64_t>, int> pushes_sent_
      ABSL_GUARDED_BY(pushes_sent_mu_);

  // The checkpoint file being written in the background (one at a time).
  absl::Mutex checkpoint_mu_;
  std::thread checkpoint_writer_ ABSL_GUARDED_BY(checkpoint_mu_);
  // The snapshot the writer writes, kept for the next checkpoint (one write
  // at a time, so it is free again once the writer is joined).
  std::shared_ptr<std::vector<ChunkSnapshot>> snapshot_
      ABSL_GUARDED_BY(checkpoint_mu_);
  int64_t checkpoint_step_ ABSL_GUARDED_BY(checkpoint_mu_) = -1;
  bool checkpoint_done_ ABSL_GUARDED_BY(checkpoint_mu_) = true;
  absl::Status checkpoint_status_ ABSL_GUARDED_BY(checkpoint_mu_);
  CheckpointResponse checkpoint_result_ ABSL_GUARDED_BY(checkpoint_mu_);
  // Set by Close() under checkpoint_mu_ (so that the waits on it see it):
  // the waits for the writer end and a writer waiting for a deferred cut
  // gives up.
  std::atomic<bool> closing_{false};
  // The step of the newest checkpoint begun (-1: none) and the generation
  // it was begun in, announced on every pull's last message of that
  // generation (PushPullResponse.checkpoint_step; AnnouncedCheckpointStep).
  // A restore or a reopen starts a generation in which no checkpoint is
  // begun yet: a cut of an older one (abandoned when a worker or a shard
  // died) is not announced, or the workers would write residual files for
  // it before worker 0 begins the new generation's checkpoint of that step
  // (whose RemoveOldCheckpoints takes them) and never again.
  mutable absl::Mutex announce_mu_;
  int64_t announced_checkpoint_step_ ABSL_GUARDED_BY(announce_mu_) = -1;
  int64_t announced_generation_ ABSL_GUARDED_BY(announce_mu_) = -1;
  // Bounded staleness or backup workers (StepPolicy::deferred_snapshot()):
  // checkpoints take the shard's deferred snapshot
  // (ParameterShard::BeginDeferredSnapshot), which the writer thread waits
  // for before it writes.
  bool deferred_snapshot() const {
    return shard_->policy().deferred_snapshot();
  }
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_SERVICE_H_
