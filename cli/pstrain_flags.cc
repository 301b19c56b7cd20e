// The pstrain binary's flags (pstrain_flags.h).
#include "cli/pstrain_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "catalog/job_config.h"
#include "coordinator/job_spec.h"

ABSL_FLAG(std::string, model, "lenet5",
          "Model: alexnet, lenet5, mlp, resnet18/34/50/101 or vgg16.");
ABSL_FLAG(std::string, num_ps, "2",
          "Number of parameter-server shard processes (compare: a list, "
          "e.g. 2,4, one run per entry for the PS modes).");
ABSL_FLAG(int, num_workers, 2, "Number of worker processes.");
ABSL_FLAG(int, batch_size, 64, "Samples per step per worker.");
ABSL_FLAG(int, epochs, 2, "Epochs over the training set.");
ABSL_FLAG(pstrain::Mode, mode, pstrain::MODE_SYNC,
          "sync (PS, barrier per step), async (PS) or allreduce (Gloo ring "
          "allreduce among the workers, no PS; --num_ps is ignored).");
ABSL_FLAG(int64_t, bucket_bytes, 25 << 20,
          "allreduce: largest gradient bucket, bytes.");
ABSL_FLAG(double, lr, 1e-3, "Learning rate (the schedule's peak).");
ABSL_FLAG(double, beta1, pstrain::kDefaultBeta1, "Adam beta1.");
ABSL_FLAG(double, beta2, pstrain::kDefaultBeta2, "Adam beta2.");
ABSL_FLAG(double, epsilon, pstrain::kDefaultEpsilon, "Adam epsilon.");
ABSL_FLAG(double, weight_decay, 0.0,
          "Weight decay: decoupled for adam (AdamW), L2 for sgd (as torch).");
ABSL_FLAG(pstrain::OptimizerAlgorithm, optimizer, pstrain::OPTIMIZER_ADAM,
          "adam (AdamW with --weight_decay), adamw (the same) or sgd "
          "(torch.optim.SGD).");
ABSL_FLAG(double, momentum, 0.0, "sgd: momentum, 0 <= m < 1.");
ABSL_FLAG(double, dampening, 0.0, "sgd: dampening of the momentum, 0 to 1.");
ABSL_FLAG(bool, nesterov, false,
          "sgd: Nesterov momentum (needs --momentum > 0, dampening 0).");
ABSL_FLAG(pstrain::LrScheduleKind, lr_schedule, pstrain::LR_SCHEDULE_CONSTANT,
          "lr by global step: constant, step (StepLR) or cosine "
          "(CosineAnnealingLR to --lr_min over the job's steps).");
ABSL_FLAG(int64_t, warmup_steps, 0,
          "Linear warmup from 0 to --lr over this many steps, then the "
          "schedule (0: none).");
ABSL_FLAG(int64_t, lr_step_size, 0,
          "--lr_schedule=step: multiply the lr by --lr_gamma every this many "
          "steps.");
ABSL_FLAG(double, lr_gamma, pstrain::kDefaultLrGamma,
          "--lr_schedule=step: the factor.");
ABSL_FLAG(double, lr_min, 0.0, "--lr_schedule=cosine: the final lr.");
ABSL_FLAG(int64_t, lr_total_steps, 0,
          "--lr_schedule=cosine: its horizon, steps (0: the job's steps: "
          "epochs x steps per epoch, at most --max_steps_per_epoch).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and the shuffles.");
ABSL_FLAG(double, dropout, 0.1,
          "bert_* models: dropout probability of the embeddings, attention "
          "and encoder blocks (0: deterministic steps).");
ABSL_FLAG(std::string, results_json, "",
          "If set, write the results here as JSON.");
ABSL_FLAG(int, log_every_steps, 200, "Steps between throughput lines.");
ABSL_FLAG(std::string, metrics_dir, "",
          "run: if set, each worker j writes DIR/workerJ.csv and "
          "DIR/workerJ.jsonl (a row every --log_every_steps steps and per "
          "evaluation) and TensorBoard events under DIR/tb/workerJ/ "
          "(tensorboard --logdir DIR/tb); empty: none.");
ABSL_FLAG(bool, trace, false,
          "run: every task writes a Chrome trace of its work to "
          "METRICS_DIR/trace/ (needs --metrics_dir); merge them with "
          "`pstrain trace METRICS_DIR`.");
namespace pstrain {

bool AbslParseFlag(absl::string_view text, PartitionBytesFlag* value,
                   std::string* error) {
  if (text == "auto") {
    *value = PartitionBytesFlag{true, 4 << 20};
    return true;
  }
  value->automatic = false;
  if (!absl::SimpleAtoi(text, &value->bytes)) {
    *error = "expected a number of bytes or auto";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(const PartitionBytesFlag& value) {
  return value.automatic ? "auto" : absl::StrCat(value.bytes);
}

}  // namespace pstrain

ABSL_FLAG(pstrain::PartitionBytesFlag, partition_bytes,
          pstrain::PartitionBytesFlag{},
          "Largest chunk of a tensor on the wire, bytes (allreduce: of "
          "each --compression top-k selection); auto (PS modes): worker 0 "
          "times a few sizes before the first step and keeps the fastest. "
          "Default 4 MiB, or 256 KiB with --priority_pulls (PS modes).");
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "How gradients (and in PS modes weights) travel: fp32, bf16 or "
          "fp16 (the shards keep fp32; allreduce averages the gradients in "
          "the 16-bit type).");
ABSL_FLAG(std::string, compression, "none",
          "none, or topk:R: each worker sends the largest R fraction (0 < "
          "R <= 1) of each chunk's gradient entries (PS: pushes; allreduce: "
          "a sparse allgather) and keeps the rest as a residual for its "
          "next step (error feedback).");
ABSL_FLAG(bool, error_feedback, true,
          "With --compression=topk:R: keep what was not sent as a residual "
          "(false: drop it, for contrast).");
ABSL_FLAG(int64_t, compression_warmup_steps, 0,
          "With --compression=topk:R: the fraction pushed falls from "
          "--compression_warmup_start to R exponentially over this many "
          "steps (Deep Gradient Compression's warm-up); 0: R from the start.");
ABSL_FLAG(double, compression_warmup_start, 0,
          "With --compression_warmup_steps: the fraction pushed at the "
          "warm-up's first step, in [R, 1]; 0: 1 (dense). Deep Gradient "
          "Compression's first warm-up sparsity is 75%: 0.25.");
ABSL_FLAG(bool, momentum_correction, false,
          "With --compression=topk:R and --optimizer=sgd --momentum=M or "
          "adam: Deep Gradient Compression's momentum correction (the "
          "workers keep the momentum, or Adam's moments, before the "
          "selection; the shards apply plain SGD).");
ABSL_FLAG(int64_t, compression_dense_steps, 0,
          "With --compression=topk:R: the first N steps push dense (then "
          "the warm-up, then R).");
ABSL_FLAG(bool, compression_freeze_adam_variance, false,
          "With --compression=topk:R, --optimizer=adam and "
          "--compression_dense_steps=N: the shards' Adam keeps its second "
          "moment from step N on (1-bit Adam's compression stage).");
ABSL_FLAG(bool, delta_pulls, true,
          "Sync mode with --compression=topk:R: a worker that holds the "
          "last version pulls only the entries the update changed where "
          "that is fewer bytes (a top-k push under SGD); false: whole "
          "chunks (for contrast). The same weights either way.");
ABSL_FLAG(int, channels_per_shard, 0,
          "PS modes: gRPC connections each worker opens to each shard, 1 to "
          "16; 0: one per 8 MiB of the shard's chunks, at most 4. Chunk i "
          "of a shard travels on connection i mod N, so TLS encryption runs "
          "on N cores.");
ABSL_FLAG(bool, priority_pulls, false,
          "PS modes: shards send the ready chunks front layers first, and "
          "(sync without staleness or backup workers) the next forward "
          "starts on the first layers' weights "
          "while the last ones still arrive (the same weights); false: plan "
          "order and the whole pull before the next step.");
ABSL_FLAG(bool, sparse_embeddings, false,
          "An untied embedding table (bert_*_untied) is pushed as the rows "
          "each batch touches and pulled as the rows the next batch reads, "
          "and the shards update only those rows (lazy Adam, "
          "torch.optim.SparseAdam's); allreduce gathers the rows and every "
          "worker updates their union so.");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0,
          "If > 0, at most this many steps per epoch (short runs).");
ABSL_FLAG(std::string, ps_binary, "",
          "pstrain_ps to run; default: the one built beside this program.");
ABSL_FLAG(std::string, worker_binary, "",
          "pstrain_worker to run; default: the one built beside this program.");
ABSL_FLAG(pstrain::ComputeKind, compute, pstrain::COMPUTE_MODEL,
          "model: forward and backward of --model on --dataset; synthetic: "
          "a stand-in for a GPU that sleeps --compute_ms per step and "
          "exchanges --model_bytes of gradients, or with --model that "
          "model's tensors, the time split by its layers' multiply-"
          "accumulates (no dataset; set --max_steps_per_epoch or, for "
          "compare, --steps).");
ABSL_FLAG(double, compute_ms, 100, "synthetic compute: ms per step.");
ABSL_FLAG(double, backward_fraction, 0,
          "synthetic compute: the share (0 to 1) of --compute_ms that is a "
          "backward pass announcing gradients last tensor first, for "
          "allreduce buckets to overlap; 0: all at the end of the step.");
ABSL_FLAG(int64_t, model_bytes, 102228128,
          "synthetic compute: bytes of fp32 gradients per worker per step "
          "(default: ResNet-50's 25557032 parameters).");
ABSL_FLAG(std::string, ps_netns, "",
          "NETNS:IP,...: run PS shard i in network namespace NETNS (ip netns "
          "exec), bound to IP. With --worker_netns.");
ABSL_FLAG(std::string, worker_netns, "",
          "NETNS:IP,...: run worker i in its network namespace, as "
          "--ps_netns.");
ABSL_FLAG(std::string, coordinator_host, "127.0.0.1",
          "Address the in-process coordinator listens on (with namespaces: "
          "one every namespace can reach).");
ABSL_FLAG(std::string, workers, "1,2,4",
          "compare: worker counts, e.g. 1,2,4 (one run each).");
ABSL_FLAG(std::string, batch_sizes, "",
          "compare: batch sizes per worker, e.g. 32,64,128 (a run each, with "
          "each worker count and mode; a second plot of samples/sec against "
          "batch size); empty: --batch_size.");
ABSL_FLAG(std::string, modes, "ps_sync,ps_async,allreduce",
          "compare: ps_sync, ps_async and/or allreduce.");
ABSL_FLAG(int, steps, 0,
          "compare: if > 0, each run is one epoch of this many steps per "
          "worker (instead of --epochs).");
ABSL_FLAG(std::string, preset, "",
          "compare: a published table in one command (mnist_resnet, dlperf, "
          "tiny_imagenet, bert): the preset's flag values where the command "
          "line gives none, and its report's own table first in results.md; "
          "see pstrain help compare.");
ABSL_FLAG(std::string, scaling, "weak",
          "compare: weak (each worker runs --steps steps) or strong (--steps "
          "of one worker, split across the workers: the same work, as a "
          "fixed number of epochs is).");
ABSL_FLAG(int, repeats, 1,
          "compare: runs of each configuration (1..100); with more than one "
          "the tables give the median run and the coefficient of variation "
          "of samples/sec, and the plot error bars.");
ABSL_FLAG(std::string, out_dir, "",
          "compare: where results.md, results.csv, results.json, "
          "throughput.gp and throughput.png go.");
ABSL_FLAG(double, link_mbit, 0,
          "compare: the link rate of each host, Mbit/s, for the bandwidth "
          "bounds of the communication table (0: no bounds).");
ABSL_FLAG(bool, plot, true,
          "compare: draw throughput.png with gnuplot (--noplot writes only "
          "throughput.gp, for hosts without gnuplot).");
ABSL_FLAG(int, heartbeat_timeout_s, 60,
          "Seconds of silence after which a task is lost and the job fails.");
ABSL_FLAG(int, registration_timeout_s, 60,
          "run: seconds every task has to register before the job fails "
          "(submitted job specs default to 600).");
ABSL_FLAG(std::string, init_from, "",
          "run: start from this model file's weights (safetensors with "
          "PyTorch's state_dict names, as model.safetensors) instead of "
          "--seed's.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "run: an empty or new folder (or, with --resume, one holding "
          "checkpoints); worker 0 writes the trained model there as "
          "model.safetensors when the job ends, and the checkpoints of "
          "--checkpoint_every_steps in step-<N>/ folders.");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "run: a checkpoint (weights, optimizer state, data position; one "
          "file per shard, or one file in mode allreduce) every this many "
          "steps into --checkpoint_dir; 0: none.");
ABSL_FLAG(double, checkpoint_every_secs, 0,
          "run: a checkpoint also once this many seconds have passed since "
          "the last (after a step); 0: by --checkpoint_every_steps only.");
ABSL_FLAG(int, max_nonfinite_steps, 10,
          "run: a step whose loss or gradients hold a NaN or an infinity on "
          "any worker is skipped on every shard (allreduce: a step whose "
          "averaged gradients hold one, on every worker); after this many "
          "consecutive skipped steps the job fails (0: at the first).");
ABSL_FLAG(std::string, straggler, "",
          "run: a test and benchmark aid: WORKER:DELAY_MS makes that worker "
          "sleep DELAY_MS milliseconds at the start of every step (a "
          "straggler of known slowness); empty: none.");
ABSL_FLAG(int, staleness, 0,
          "run, mode sync: bounded staleness; a worker may run at most this "
          "many steps ahead of the slowest (0: plain sync; 0 to 1000).");
ABSL_FLAG(int, backup_workers, 0,
          "run, mode sync: backup workers b; each step averages the first "
          "num_workers - b workers to end it (TensorFlow's "
          "replicas_to_aggregate), the late ones' gradients are dropped "
          "(0: every worker; 0 to num_workers - 1).");
ABSL_FLAG(int, max_workers, 0,
          "run, every mode: an elastic job of at most this many workers, "
          "scaled with --control_file (0: not elastic).");
ABSL_FLAG(int, min_workers, 0,
          "run, every mode: remove a worker whose restart budget is spent "
          "while this many remain (0: fail the job).");
ABSL_FLAG(bool, linear_lr_scaling, false,
          "run, elastic workers: each membership's lr is --lr x members / "
          "num_workers (Goyal et al. 2017's linear scaling rule).");
ABSL_FLAG(bool, standby_workers, false,
          "run, elastic workers: the workers past --num_workers (up to "
          "--max_workers) start with the job and wait prepared, so a grow "
          "waits for no process start.");
ABSL_FLAG(int, max_ps, 0,
          "run, modes sync and async: at most this many shards "
          "(num_ps to 64), scaled with --control_file's num_ps=M (0: the "
          "shards fixed).");
ABSL_FLAG(std::string, control_file, "",
          "run: an elastic job's control file; each line appended, "
          "[num_workers=N] [num_ps=M] [at_step=S], scales the job.");
ABSL_FLAG(double, clip_grad_norm, 0,
          "run, modes allreduce and sync: gradient clipping by global norm, "
          "as torch.nn.utils.clip_grad_norm_ before each step (0: none).");
ABSL_FLAG(int, keep_checkpoints, 3,
          "run: how many of the newest checkpoints to keep (>= 1).");
ABSL_FLAG(int, max_restarts, -1,
          "run: restart a task that dies, up to this many times in all; the "
          "workers roll back to the newest checkpoint and go on (PS modes). "
          "-1: 3 with --checkpoint_dir, else 0 (the first death fails the "
          "job).");
ABSL_FLAG(bool, resume, false,
          "run: continue from --checkpoint_dir's newest checkpoint "
          "(weights, Adam state, step and data position).");
ABSL_FLAG(std::string, checkpoint, "",
          "eval: a model file; a job's --checkpoint_dir (its final "
          "model.safetensors, else the checkpoint its `latest` names); or "
          "one step-<N> folder of it (its model file is checked against the "
          "manifest beside it).");
