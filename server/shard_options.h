// ShardOptions: one parameter-server shard's configuration (its job, its
// place among the shards, the mode its steps follow, its optimizer and
// checkpoint folder). A plain value; the shard (server/parameter_shard.h)
// keeps a copy, and its StepPolicy (server/step_policy.h) reads the mode's
// fields once.
#ifndef PSTRAIN_SERVER_SHARD_OPTIONS_H_
#define PSTRAIN_SERVER_SHARD_OPTIONS_H_

#include <string>

#include "optim/optimizer.h"

namespace pstrain {

enum class SyncMode { kSync, kAsync };

struct ShardOptions {
  std::string job_id = "local";
  int shard_index = 0;
  // The shards of the job's first layout; an elastic job's worker 0 may
  // name another count in a restore (ModelLayout.num_shards, issue 40),
  // which the shard's plan() then has.
  int num_shards = 1;
  // The job's worker capacity: worker ids are 0 to num_workers - 1 (an
  // elastic job's max_workers; otherwise its num_workers).
  int num_workers = 1;
  // An elastic job (issue 40): workers 0 to initial_workers - 1 are the
  // members until a reopen or restore names others (WorkerMembership in
  // server/parameter_shard.h). 0: every worker of num_workers.
  int initial_workers = 0;
  // An elastic job with the linear scaling rule (Goyal et al., "Accurate,
  // Large Minibatch SGD", 2017; JobSpec.linear_lr_scaling): each
  // generation's learning rate is adam.lr x members / the initial
  // members (initial_workers, or num_workers), so the lr follows the
  // effective batch. false: adam.lr whatever the members.
  bool linear_lr_scaling = false;
  SyncMode mode = SyncMode::kSync;
  // The optimizer (optim/optimizer.h): Adam unless adam.kind says SGD.
  // Named for the Adam-only days; an AdamOptions converts to it.
  OptimizerOptions adam;
  // Sync mode: bounded staleness s (see "Bounded staleness" in
  // server/parameter_shard.h), 0 to 1000; 0 is plain sync. Composes with
  // backup workers; ignored in async mode.
  int staleness = 0;
  // Sync mode without staleness: backup workers (see "Backup workers" in
  // server/parameter_shard.h) when 0 < replicas_to_aggregate <
  // num_workers; 0 (or num_workers): every worker's push goes into every
  // step.
  int replicas_to_aggregate = 0;
  // Sync mode: gradient clipping by global norm (see "Gradient clipping" in
  // server/step_policy.h), 0 to 1e6; 0: none.
  double clip_grad_norm = 0;
  // The job's checkpoint folder on this shard's host (the job spec's
  // checkpoint_dir as the coordinator validated it); the shard writes
  // checkpoint files only inside it (ShardCheckpointPath in
  // server/shard_checkpoint.h). Empty: the shard takes no checkpoints.
  std::string checkpoint_dir;
  // The job's keep_checkpoints: as it writes each file, the shard keeps
  // its files of the newest this many checkpoints before it and removes
  // the rest (RemoveOldShardCheckpoints in server/shard_checkpoint.h).
  // 0: it removes none.
  int keep_checkpoints = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SHARD_OPTIONS_H_
