#include "cli/command_help.h"

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catalog/catalog.h"
#include "common/flags_util.h"

namespace pstrain {
namespace {

using Flags = std::vector<CommandFlag>;

Flags Join(std::initializer_list<Flags> lists) {
  Flags all;
  for (const Flags& list : lists)
    all.insert(all.end(), list.begin(), list.end());
  return all;
}

// The dataset and backend flags, as a command that trains (`run`,
// `compare`) or evaluates (`eval`) reads them.
Flags DataFlags(bool trains) {
  const std::string reads = trains ? "trained on" : "evaluated on";
  return {
      {"dataset", "The dataset " + reads +
                      ": fashion_mnist, mnist, cifar10, image_folder, "
                      "records (packed record files, memory-mapped) or "
                      "synthetic; for the bert_* models tokens (token "
                      "files: train.tokens, test.tokens) or "
                      "synthetic_tokens."},
      {"data_dir",
       "Folder holding the dataset's files (IDX, gzipped or plain; CIFAR-10 "
       "binary batches; image_folder: class folders of JPEG and PNG files, "
       "or the tiny-ImageNet layout; records: train.records and "
       "test.records)."},
      {"image_size",
       "--dataset=synthetic: images are 3 x N x N (0: 224); image_folder: "
       "images are resized (bilinear) to N x N pixels (0: kept at the size "
       "they all share)."},
      {"max_dataset_memory",
       "--dataset=image_folder in memory: the most the decoded images may "
       "take per process, bytes or with K, M, G, T (8G); 0: half of the "
       "memory available. Over it: exit 2 before decoding."},
      {"stream_images",
       trains ? "--dataset=image_folder: decode each batch on input threads "
                "while training (memory does not grow with the dataset) "
                "instead of every image at start."
              : "--dataset=image_folder: decode each batch of the test set "
                "as it is evaluated instead of every image at start."},
      {"augment",
       trains ? "--dataset=image_folder with --stream_images: training-batch "
                "augmentation as torchvision's: none, random_resized_crop "
                "(the ImageNet recipe) or pad_crop (the CIFAR recipe); the "
                "test set is never augmented."
              : "Accepted for the flags of a `run`; evaluation is never "
                "augmented."},
      {"num_classes",
       "--dataset=synthetic: number of classes; synthetic_tokens: the "
       "vocabulary (unset: 30522)."},
      {"seq_len",
       "--dataset=tokens or synthetic_tokens: tokens per sequence (0: the "
       "token file's; synthetic_tokens: 128)."},
      {"synthetic_samples",
       "--dataset=synthetic: training samples per epoch (test: 1000)."},
      {"backend",
       trains ? "Where the workers compute: cpu (oneDNN) or cuda (cuDNN, "
                "cuBLAS; needs a --config=cuda build and a GPU)."
              : "Where the model is evaluated: cpu (oneDNN) or cuda (needs a "
                "--config=cuda build and a GPU)."},
      {"precision",
       trains ? "What convolutions and linear layers compute in, as "
                "torch.autocast: fp32, tf32 (cuda: TF32 tensor cores), bf16 "
                "or fp16 (cuda; dynamic loss scaling); empty: fp32 on cpu, "
                "tf32 on cuda. Weights, the optimizer, BatchNorm and the "
                "loss stay fp32 (README, Mixed precision)."
              : "What the evaluation's convolutions and linear layers "
                "compute in: fp32, tf32 (cuda), bf16 or fp16 (cuda); empty: "
                "the backend's default."},
      {"gpu", trains ? "--backend=cuda: the first GPU; with allreduce over "
                       "NCCL worker w uses GPU gpu + w."
                     : "--backend=cuda: index of the GPU to evaluate on."},
  };
}

// The wire compression flags (top-k pairs and what goes with them; every
// mode but --delta_pulls), part of JobFlags.
Flags CompressionFlags() {
  return {
      {"compression",
       "none, or topk:R (0 < R <= 1): each worker sends the largest R "
       "fraction of each chunk's gradient entries as index/value pairs and "
       "keeps the rest as a residual added to its next step (error "
       "feedback, as Deep Gradient Compression); residuals are saved with "
       "checkpoints. PS modes push the pairs to the shards; allreduce "
       "gathers every worker's pairs (a sparse allgather, chunks of "
       "--partition_bytes) and sums them on each worker."},
      {"error_feedback",
       "With --compression=topk:R: keep the unsent entries as residuals "
       "(default); false drops them (for contrast)."},
      {"compression_warmup_steps",
       "With --compression=topk:R: the fraction pushed falls exponentially "
       "from --compression_warmup_start to R over this many steps (Deep "
       "Gradient Compression's warm-up); 0: R from the first step."},
      {"compression_warmup_start",
       "With --compression_warmup_steps: the fraction pushed at the "
       "warm-up's first step, in [R, 1]; 0: 1 (dense). Deep Gradient "
       "Compression's first warm-up sparsity is 75%: 0.25."},
      {"momentum_correction",
       "With --compression=topk:R and --optimizer=sgd --momentum=M: Deep "
       "Gradient Compression's momentum correction and masking (the workers "
       "keep the velocity, added to the residual before the selection and "
       "zeroed where pushed; the shards apply SGD without momentum). With "
       "--optimizer=adam: the workers keep Adam's moments and add Adam's "
       "update to the residual; the shards apply plain SGD at the lr."},
      {"compression_dense_steps",
       "With --compression=topk:R: the first N steps push every entry "
       "(dense), then the warm-up, then R."},
      {"compression_freeze_adam_variance",
       "With --compression=topk:R, --optimizer=adam and "
       "--compression_dense_steps=N: the shards' Adam stops updating its "
       "second moment after step N (1-bit Adam's compression stage), so "
       "its update is linear in the pushes and error feedback delivers "
       "delayed entries at full size."},
      {"delta_pulls",
       "Sync mode with --compression=topk:R (default true): a worker that "
       "holds the weights' last version pulls only the entries the shards' "
       "update changed, where that takes fewer bytes than the whole chunk "
       "(a top-k push under SGD, e.g. with --momentum_correction, changes "
       "at most the pushed entries); never for fp16 wires, buffers or "
       "row-sparse tables. false: whole chunks, for contrast. The same "
       "weights bit for bit either way."},
  };
}

// The flags that `run` and `compare` both turn into a job spec; `what` is
// "the job" or "each run".
Flags JobFlags(const std::string& what) {
  return Join(
      {{
           {"model",
            "Model: alexnet, lenet5, mlp, resnet18/34/50/101 or vgg16."},
           {"batch_size", "Samples per step per worker."},
           {"epochs", "Epochs over the training set."},
           {"bucket_bytes", "Mode allreduce: largest gradient bucket, bytes."},
           {"lr", "Learning rate (the schedule's peak)."},
           {"beta1", "Adam beta1."},
           {"beta2", "Adam beta2."},
           {"epsilon", "Adam epsilon."},
           {"weight_decay",
            "Weight decay: decoupled for adam (AdamW), L2 for sgd (as torch)."},
           {"optimizer",
            "adam (AdamW with --weight_decay), adamw (the same) or "
            "sgd (torch.optim.SGD)."},
           {"momentum", "--optimizer=sgd: momentum, 0 <= m < 1."},
           {"dampening", "--optimizer=sgd: dampening of the momentum, 0 to 1."},
           {"nesterov",
            "--optimizer=sgd: Nesterov momentum (needs --momentum > "
            "0, dampening 0)."},
           {"lr_schedule",
            "lr by global step: constant, step (StepLR) or cosine "
            "(CosineAnnealingLR to --lr_min)."},
           {"warmup_steps",
            "Linear warmup from 0 to --lr over this many steps, "
            "then the schedule (0: none)."},
           {"lr_step_size",
            "--lr_schedule=step: multiply the lr by --lr_gamma "
            "every this many steps."},
           {"lr_gamma", "--lr_schedule=step: the factor."},
           {"lr_min", "--lr_schedule=cosine: the final lr."},
           {"lr_total_steps",
            "--lr_schedule=cosine: its horizon, steps (0: the job's steps: "
            "epochs x steps per epoch, at most --max_steps_per_epoch)."},
           {"seed", "Seed of the initial weights and the shuffles."},
           {"dropout",
            "bert_* models: dropout probability of the embeddings, attention "
            "and encoder blocks (0: deterministic steps)."},
           {"log_every_steps", "Steps between throughput lines."},
           {"partition_bytes",
            "Largest chunk of a tensor on the wire, bytes (allreduce with "
            "--compression: of each top-k selection); auto: chosen by "
            "timing a few sizes before the first step (PS modes). Default "
            "4 MiB, or 256 KiB with --priority_pulls."},
           {"wire_dtype",
            "fp32, bf16 or fp16 (scaled by a power of two): PS pushes and "
            "pulls "
            "(fp32 on the shards), or allreduce's gradient average summed in "
            "16 "
            "bits as DDP's bf16_compress_hook; a list gives rows named "
            "mode+bf16."},
       },
       CompressionFlags(),
       {
           {"channels_per_shard",
            "PS modes: gRPC connections each worker opens to each shard, 1 to "
            "16; "
            "0: one per 8 MiB of the shard's chunks, at most 4 (a small model "
            "keeps one). Chunk i of a shard travels on connection i mod N, so "
            "TLS encryption runs on N cores."},
           {"priority_pulls",
            "PS modes (default false): shards send the ready chunks front "
            "layers first, and in sync mode (cpu and cuda; not with "
            "staleness or backup workers) the next forward starts "
            "on the first layers' weights while the last ones still arrive. "
            "The same weights either way. --partition_bytes defaults to 256 "
            "KiB with it (P3's slices)."},
           {"sparse_embeddings",
            "Default false (issue 41): a model's untied embedding table "
            "(bert_tiny_untied, bert_base_untied) is pushed as the rows each "
            "batch touches and pulled as the rows the next batch reads, and "
            "the shards update only those rows with lazy Adam "
            "(torch.optim.SparseAdam's: untouched rows keep their moments; "
            "no weight decay), or SGD (with momentum or weight decay every "
            "row is updated, as the dense job's, while the rows alone "
            "travel); in allreduce every worker gathers the others' rows "
            "and updates them the same way. With a top-k compression the "
            "other parameters go as their top-k and the table by rows (not "
            "with momentum_correction)."},
           {"max_steps_per_epoch",
            "If > 0, at most this many steps per epoch (short runs)."},
           {"ps_binary",
            "pstrain_ps to run; default: the one built beside this program."},
           {"worker_binary",
            "pstrain_worker to run; default: the one built beside this "
            "program."},
           {"compute",
            "model: forward and backward of --model on --dataset; synthetic: a "
            "stand-in for a GPU that sleeps --compute_ms per step and "
            "exchanges --model_bytes of gradients in tensors of at most 1 "
            "MiB, each taking time by its size, or with --model that model's "
            "tensors (on Fashion-MNIST's input; bert_*: 128 tokens), each "
            "taking time by its layer's multiply-accumulates (no dataset)."},
           {"compute_ms", "--compute=synthetic: milliseconds per step."},
           {"backward_fraction",
            "--compute=synthetic: the share (0 to 1) of --compute_ms that is a "
            "backward pass announcing gradients last tensor first (0: all at "
            "the "
            "end of the step)."},
           {"model_bytes",
            "--compute=synthetic: bytes of fp32 gradients per "
            "worker per step."},
           {"ps_netns", "NETNS:IP,...: run PS shard i of " + what +
                            " in network namespace NETNS, bound to IP. With "
                            "--worker_netns."},
           {"worker_netns", "NETNS:IP,...: run worker i of " + what +
                                " in its network namespace, as --ps_netns."},
           {"coordinator_host",
            "Address the in-process coordinator listens on (with namespaces: "
            "one "
            "every namespace can reach)."},
           {"heartbeat_timeout_s",
            "Seconds of silence after which a task is lost "
            "and " +
                what + " fails."},
           {"registration_timeout_s",
            "Seconds every task has to register before " + what + " fails."},
           {"max_nonfinite_steps",
            "A step whose loss or gradients hold a NaN or an infinity is "
            "skipped "
            "everywhere; after this many consecutive skipped steps " +
                what + " fails (0: at the first)."},
           {"straggler",
            "A test aid: WORKER:DELAY_MS makes that worker sleep "
            "DELAY_MS at the start of every step; empty: none."},
           {"staleness",
            "Mode sync: a worker may run at most this many steps "
            "ahead of the slowest (0: plain sync; 0 to 1000)."},
           {"backup_workers",
            "Mode sync: each step averages the first num_workers - b workers "
            "(0: "
            "every worker)."},
           {"clip_grad_norm",
            "Modes allreduce and sync: clip gradients by global "
            "norm before each step (0: none)."},
           {"insecure",
            "Plaintext gRPC among " + what +
                "'s processes (no encryption, no authentication); prints a "
                "warning."},
           {"insecure_allow_remote",
            "With --insecure: let " + what +
                "'s processes listen on an address other than loopback."},
       }});
}

// The flags of the commands that call a pstrain_coordinator; `retries`:
// the command rides out a restart (status, logs, wait).
Flags ClientFlags(bool retries) {
  Flags flags = {
      {"coordinator", "host:port of the pstrain_coordinator."},
      {"rpc_timeout_s", "Deadline of each call to the coordinator, seconds."},
      {"tls_dir",
       "Folder of the cluster's TLS files (`pstrain certs "
       "--out=DIR`) holding admin.pem; unset: "
       "PSTRAIN_ADMIN_TLS_DIR, else PSTRAIN_TLS_DIR."},
      {"insecure",
       "Call the coordinator over plaintext gRPC (one started "
       "with --insecure)."},
      {"insecure_allow_remote",
       "With --insecure: allow a coordinator that is not on loopback."},
  };
  if (retries) {
    flags.push_back(
        {"coordinator_timeout_s",
         "While the coordinator cannot be reached (a restart), retry every "
         "second, as the tasks do, for up to this many seconds; then exit 1 "
         "(0: no retries)."});
  }
  return flags;
}

// `pstrain run`: one job on this machine.
CommandInfo RunInfo() {
  return {
      "run", "pstrain run [--flags]",
      "Trains one job on this machine: --num_ps parameter-server shards and "
      "--num_workers workers as local processes (or one network namespace "
      "per task with --ps_netns/--worker_netns) under an in-process "
      "coordinator; streams their lines and prints a table of results. "
      "Mode sync or async: PS flags (--num_ps, --channels_per_shard, "
      "--max_restarts); mode "
      "allreduce: --bucket_bytes; both: --wire_dtype, --compression, "
      "--partition_bytes, checkpoints. --compute=synthetic: "
      "--compute_ms, "
      "--model_bytes or --model, --backward_fraction and no dataset flags. "
      "A flag "
      "the run would ignore is an error. Exit 0 done, 1 a task failed, 2 "
      "bad flags (nothing started), 128+signal interrupted.",
      Join({{{"num_ps",
              "Parameter-server shard processes (modes sync and "
              "async)."},
             {"num_workers", "Worker processes."},
             {"mode",
              "sync (PS, barrier per step), async (PS) or allreduce "
              "(ring allreduce among the workers, no PS)."}},
            JobFlags("the job"),
            DataFlags(/*trains=*/true),
            {{"results_json", "If set, write the results here as JSON."},
             {"metrics_dir",
              "If set, each worker j writes DIR/workerJ.csv, "
              "DIR/workerJ.jsonl and TensorBoard events under "
              "DIR/tb/workerJ/; empty: none."},
             {"trace",
              "Every task writes a Chrome trace of its work to "
              "METRICS_DIR/trace/ (needs --metrics_dir); merge "
              "them with `pstrain trace METRICS_DIR`."},
             {"init_from",
              "Start from this model file's weights "
              "(safetensors, PyTorch's state_dict names) "
              "instead of --seed's."},
             {"checkpoint_dir",
              "An empty or new folder (or, with --resume, one holding "
              "checkpoints); the trained model.safetensors and the "
              "step-<N>/ checkpoints go there."},
             {"checkpoint_every_steps",
              "A checkpoint into --checkpoint_dir every this many steps; 0: "
              "none."},
             {"checkpoint_every_secs",
              "A checkpoint also once this many seconds have passed since "
              "the last; 0: by --checkpoint_every_steps only."},
             {"keep_checkpoints",
              "How many of the newest checkpoints to "
              "keep (>= 1)."},
             {"max_restarts",
              "Restart a task that dies, up to this many times in all; the "
              "workers roll back to the newest checkpoint. -1: 3 with "
              "--checkpoint_dir, else 0."},
             {"resume",
              "Continue from --checkpoint_dir's newest checkpoint "
              "(weights, optimizer state, step, data position)."},
             {"max_workers",
              "Every mode: an elastic job of at most this many workers "
              "(num_workers to 4096; 0: not elastic), scaled with "
              "--control_file."},
             {"min_workers",
              "Every mode: a worker whose restart budget is spent is removed "
              "instead of failing the job while this many remain (0: "
              "never)."},
             {"linear_lr_scaling",
              "Elastic workers: each membership's lr is --lr x members / "
              "num_workers (Goyal et al. 2017's linear scaling rule)."},
             {"standby_workers",
              "Elastic workers: the workers past num_workers (up to "
              "--max_workers) start with the job as warm standbys (model "
              "and data loaded, waiting); a grow adds them first, with no "
              "process start."},
             {"max_ps",
              "Modes sync and async: at most this many shards (num_ps "
              "to 64; 0: the shards fixed); --control_file's num_ps=M moves "
              "the state onto M shards while the job runs."},
             {"control_file",
              "An elastic job's control file, read every 200 ms: each line "
              "appended, [num_workers=N] [num_ps=M] [at_step=S] (a count or "
              "both), scales the job (a bad line is a warning); a signal "
              "carries no number."}}})};
}

// `pstrain compare`: `run` once per configuration, then the tables.
CommandInfo CompareInfo() {
  return {"compare",
          "pstrain compare --out_dir=DIR [--workers=1,2,4 "
          "--modes=ps_sync,ps_async,allreduce --num_ps=2 --batch_sizes=32,64 "
          "--steps=N --repeats=N]",
          "Runs `run` --repeats times per configuration (each of --modes at "
          "each of --workers and --batch_sizes, and each --num_ps for the PS "
          "modes), then prints "
          "and "
          "writes the scaling and communication tables as Markdown, CSV, JSON "
          "and a gnuplot PNG into --out_dir. Every configuration is checked "
          "before the first run starts. --preset=mnist_resnet|dlperf|"
          "tiny_imagenet|bert runs a published report's experiment scaled to "
          "this machine (any of its flags can be overridden) and prints that "
          "report's own table first.",
          Join({{{"num_ps",
                  "Shard counts, a list (e.g. 2,4): one run per entry "
                  "for the PS modes."}},
                JobFlags("each run"),
                DataFlags(/*trains=*/true),
                {{"preset",
                  "A published table in one command (mnist_resnet, "
                  "dlperf, tiny_imagenet, bert): its flag values where the "
                  "command line gives none, its table first."},
                 {"workers", "Worker counts, e.g. 1,2,4 (one run each)."},
                 {"batch_sizes",
                  "Batch sizes per worker, e.g. 32,64,128 (a run each, and a "
                  "plot against batch size); empty: --batch_size."},
                 {"modes", "ps_sync, ps_async and/or allreduce."},
                 {"steps",
                  "If > 0, each run is one epoch of this many steps "
                  "per worker (instead of --epochs)."},
                 {"scaling",
                  "weak (each worker runs --steps steps) or strong "
                  "(--steps of one worker, split across the "
                  "workers)."},
                 {"repeats",
                  "Runs of each configuration (1..100); the tables "
                  "give the median and the coefficient of "
                  "variation."},
                 {"out_dir",
                  "Where results.md, results.csv, results.json, "
                  "throughput.gp and throughput.png go."},
                 {"link_mbit",
                  "The link rate of each host, Mbit/s, for the "
                  "bandwidth bounds of the communication table (0: "
                  "no bounds)."},
                 {"plot",
                  "Draw throughput.png with gnuplot (--noplot writes "
                  "only throughput.gp)."}}})};
}

// `pstrain eval`: a saved model on a test set.
CommandInfo EvalInfo() {
  return {"eval",
          "pstrain eval --checkpoint=FILE_OR_DIR [--dataset=... --data_dir=... "
          "--backend=...]",
          "Test loss and accuracy of a saved model (model.safetensors) on the "
          "test set of --dataset, its images standardised with the model's "
          "training set statistics (kept in the file). A flag the dataset or "
          "backend would ignore "
          "(--num_classes without --dataset=synthetic, --gpu with "
          "--backend=cpu, ...) is an error. It evaluates in batches of "
          "--batch_size when given, else 100 (the activations of a batch are "
          "held at once: 500 images of a ResNet-50 take over 20 GB).",
          Join({DataFlags(/*trains=*/false),
                {{"checkpoint",
                  "A model file; a job's checkpoint folder (its final "
                  "model.safetensors, else the checkpoint its `latest` names); "
                  "or one step-<N> folder of it."},
                 {"bad_images",
                  "--dataset=image_folder: fail (stop at the first unreadable "
                  "image) or skip (leave unreadable images out)."},
                 {"batch_size", "Test images evaluated at once.", "100"}}})};
}

// The commands that call a coordinator about its jobs: submit, status, logs,
// trace, cancel, scale, wait.
std::vector<CommandInfo> JobInfos() {
  return {
      {"submit", "pstrain submit JOB.pbtxt [--coordinator=HOST:PORT]",
       "Submits a job spec (protobuf text format, proto/job.proto) to a "
       "pstrain_coordinator and prints its id. A spec out of range is a "
       "one-line error naming the field, the value and the range (exit 2).",
       ClientFlags(/*retries=*/false)},
      {"status", "pstrain status [JOB_ID] [--coordinator=HOST:PORT]",
       "One line per job (or the named job's tasks). Rides out a "
       "coordinator restart within --coordinator_timeout_s.",
       ClientFlags(/*retries=*/true)},
      {"logs", "pstrain logs JOB_ID [--coordinator=HOST:PORT]",
       "The job's lines so far, prefixed by task. Rides out a coordinator "
       "restart within --coordinator_timeout_s.",
       ClientFlags(/*retries=*/true)},
      {"trace", "pstrain trace JOB_ID_OR_METRICS_DIR [--out=FILE]",
       "Merges a traced job's per-task timelines (run --trace: "
       "METRICS_DIR/trace/*.json) into one Chrome trace on the "
       "coordinator's clock (default METRICS_DIR/trace.json) for "
       "https://ui.perfetto.dev or chrome://tracing. A job id is looked up "
       "on the coordinator.",
       Join({ClientFlags(/*retries=*/false),
             {{"out", "The merged trace file (default: DIR/trace.json)."}}})},
      {"cancel", "pstrain cancel JOB_ID [--coordinator=HOST:PORT]",
       "Cancels a job; its tasks stop at their next heartbeat.",
       ClientFlags(/*retries=*/false)},
      {"scale",
       "pstrain scale JOB_ID [--num_workers=N] [--num_ps=M] [--at_step=S] "
       "[--coordinator=HOST:PORT]",
       "Changes the number of workers (its spec's max_workers) or of "
       "parameter-server shards (max_ps) of a running elastic job, mode "
       "sync or async, and prints the new membership: worker 0 applies it at a "
       "step "
       "boundary once every new worker and shard has registered (new shards "
       "receive the state, removed ones exit). N from max(1, min_workers) "
       "to max_workers, M from 1 to max_ps; at least one of the two; the "
       "administrator only. `pstrain run` is scaled with its "
       "--control_file.",
       Join({ClientFlags(/*retries=*/false),
             {{"num_workers", "The number of workers wanted (0: unchanged).",
               "0"},
              {"num_ps", "The number of shards wanted (0: unchanged).", "0"},
              {"at_step",
               "Apply it at the first step boundary at or after this step "
               "(0: the next)."}}})},
      {"wait", "pstrain wait JOB_ID [--coordinator=HOST:PORT]",
       "Follows a job's lines until it ends; exit 0 if it succeeded, 1 "
       "otherwise. A coordinator restart is ridden out: while it cannot be "
       "reached, wait retries (saying so once) for up to "
       "--coordinator_timeout_s.",
       Join({ClientFlags(/*retries=*/true),
             {{"wait_poll_ms", "Milliseconds between polls."}}})},
  };
}

// `pstrain launch-lines`: a job's launch script or manifests.
CommandInfo LaunchLinesInfo() {
  return {
      "launch-lines",
      "pstrain launch-lines JOB.pbtxt --launcher=slurm|mpirun|ssh|kubernetes "
      "[--coordinator=HOST:PORT] [--job=ID] [--bin_dir=DIR] [--sbatch]",
      "Prints a script that starts the job's tasks with a cluster launcher "
      "and waits for them, or (kubernetes) manifests for kubectl apply. A "
      "flag the script would ignore (--nodes or "
      "--gpus_per_node without --agent, --cpus_per_task without slurm, "
      "...) is an error.",
      {{"launcher", "slurm, mpirun, ssh or kubernetes."},
       {"coordinator",
        "host:port of the coordinator, as the tasks reach "
        "it."},
       {"job",
        "The job id the script passes to the tasks (default: the "
        "script's environment variable JOB, e.g. JOB=$(pstrain "
        "submit JOB.pbtxt))."},
       {"bin_dir",
        "The folder holding pstrain_ps and pstrain_worker on "
        "every node (default: this pstrain's folder when it is "
        "an installed one)."},
       {"sbatch",
        "--launcher=slurm: add an #SBATCH header asking for the "
        "job's tasks, for `sbatch --wait`."},
       {"cpus_per_task",
        "--launcher=slurm: CPUs of each task (srun "
        "--cpus-per-task); kubernetes: each pod's CPU request."},
       {"image",
        "--launcher=kubernetes: the container image holding the "
        "binaries in --bin_dir (default /opt/pstrain/bin)."},
       {"k8s_objects",
        "--launcher=kubernetes: coordinator (Deployment and Service) "
        "or tasks (default; per role a headless Service and an Indexed "
        "Job, needs --job=ID)."},
       {"memory_per_task",
        "--launcher=kubernetes: each task's memory request and limit "
        "(4Gi)."},
       {"gpus_per_worker",
        "--launcher=kubernetes: each worker pod's nvidia.com/gpu "
        "limit."},
       {"agent",
        "Start one `pstrain node` agent per node, which starts "
        "that node's tasks."},
       {"nodes",
        "--agent, spec without hosts: how many nodes get an "
        "agent."},
       {"gpus_per_node",
        "--agent: passed to the agents, which give worker "
        "k of a node GPU k % this."},
       {"ps_binary",
        "The pstrain_ps the script starts, on every node "
        "(instead of --bin_dir's)."},
       {"worker_binary",
        "The pstrain_worker the script starts, on every "
        "node (instead of --bin_dir's)."}}};
}

// `pstrain install`: the binaries into PREFIX/bin.
CommandInfo InstallInfo() {
  return {"install",
          "pstrain install --prefix=DIR",
          "Copies pstrain, pstrain_ps, pstrain_worker and pstrain_coordinator "
          "to DIR/bin.",
          {{"prefix", "Copy the binaries to PREFIX/bin (created if missing)."},
           {"ps_binary",
            "The pstrain_ps to copy; default: the one beside this program."},
           {"worker_binary",
            "The pstrain_worker to copy; default: the one beside this "
            "program."}}};
}

// `pstrain certs`: a cluster's CA and certificates.
CommandInfo CertsInfo() {
  return {"certs",
          "pstrain certs --out=DIR [--nodes_out=NODES --num_ps=N "
          "--num_workers=M --job=ID --hosts=H,...]",
          "Makes a CA and the mutual-TLS certificates of a cluster.",
          {{"out",
            "The folder to write the CA and certificates to (created "
            "0700)."},
           {"nodes_out",
            "Also a folder for the nodes: ca.pem and the shards' "
            "and workers' certificates and keys, without the keys "
            "that stay on the head node. A new folder (one per job): "
            "certs never replaces a key or certificate in it."},
           {"hosts",
            "Host names or IP addresses, comma-separated, added to "
            "every certificate."},
           {"num_ps", "Shard certificates to make (ps 0 to N-1)."},
           {"num_workers", "Worker certificates to make (worker 0 to M-1)."},
           {"job",
            "The job the task certificates are for; unset: any job of this CA "
            "(with a warning).",
            "none"}}};
}

// `pstrain node`: one node's tasks of a job.
CommandInfo NodeInfo() {
  return {"node",
          "pstrain node --coordinator=HOST:PORT --job=ID",
          "Starts this node's tasks of a job, restarts the ones that die "
          "(within the job's max_restarts) and waits for them. A flag the job "
          "would ignore (--node_rank or --num_nodes when its spec lists hosts, "
          "--gpus_per_node with a cpu backend, ...) is an error.",
          {{"coordinator", "host:port of the coordinator the tasks report to."},
           {"job",
            "The job whose tasks this node runs; $JOB: the "
            "environment variable JOB."},
           {"bin_dir",
            "The folder holding pstrain_ps and pstrain_worker on "
            "this node."},
           {"gpus_per_node",
            "GPUs of this node: worker k of the node gets GPU "
            "k % this."},
           {"node_rank",
            "This node's rank, for specs without hosts; unset: "
            "SLURM_NODEID, else OMPI_COMM_WORLD_RANK, else 0."},
           {"num_nodes",
            "How many nodes the job's tasks are spread over, for "
            "specs without hosts; unset: SLURM_NNODES, else "
            "OMPI_COMM_WORLD_SIZE, else 1."},
           {"node_grace_s",
            "After a task failed, seconds the others get to "
            "end before SIGTERM."},
           {"ps_binary", "The pstrain_ps to start (instead of --bin_dir's)."},
           {"worker_binary",
            "The pstrain_worker to start (instead of --bin_dir's)."},
           {"tls_dir",
            "Folder of this node's TLS files (`pstrain certs "
            "--nodes_out`); unset: PSTRAIN_TLS_DIR."},
           {"insecure",
            "Plaintext gRPC for the tasks and the agent (no "
            "encryption, no authentication)."},
           {"insecure_allow_remote",
            "With --insecure: let the tasks listen on an address other than "
            "loopback."}}};
}

// `pstrain help`.
CommandInfo HelpInfo() {
  return {"help",
          "pstrain help [COMMAND]",
          "Lists the commands, or one command's synopsis and flags with their "
          "defaults.",
          {}};
}

}  // namespace

const std::vector<CommandInfo>& Commands() {
  static const auto* commands = [] {
    auto* all =
        new std::vector<CommandInfo>{RunInfo(), CompareInfo(), EvalInfo()};
    const std::vector<CommandInfo> jobs = JobInfos();
    all->insert(all->end(), jobs.begin(), jobs.end());
    all->insert(all->end(), {LaunchLinesInfo(), InstallInfo(), CertsInfo(),
                             NodeInfo(), HelpInfo()});
    return all;
  }();
  return *commands;
}

const CommandInfo* FindCommand(absl::string_view name) {
  for (const CommandInfo& command : Commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

std::string CommandsOverview() {
  std::string out =
      "pstrain: data-parallel training on a sharded parameter server.\n\n"
      "Commands:\n";
  for (const CommandInfo& command : Commands()) {
    absl::StrAppend(&out, "  ", command.synopsis, "\n");
  }
  absl::StrAppend(&out,
                  "\n`pstrain help COMMAND` (or `pstrain COMMAND --help`) "
                  "lists a command's flags with their defaults; `pstrain "
                  "--help` lists every flag.\n");
  return out;
}

namespace {

// `text` as lines of at most kWidth characters (but for a longer word),
// the first after `first_indent`, the others after `indent`.
std::string Wrap(const std::string& text, const std::string& first_indent,
                 const std::string& indent) {
  constexpr size_t kWidth = 80;
  std::string out = first_indent;
  size_t column = first_indent.size();
  bool line_empty = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line_empty && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", indent);
      column = indent.size();
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    line_empty = false;
  }
  return out;
}

// "; default: VALUE;" (strings quoted, as absl's help writes them), or
// empty when this binary does not link the flag.
std::string DefaultOf(const CommandFlag& command_flag) {
  if (!command_flag.default_value.empty()) {
    return absl::StrCat("; default: ", command_flag.default_value, ";");
  }
  const absl::CommandLineFlag* flag =
      absl::FindCommandLineFlag(command_flag.name);
  if (flag == nullptr) return "";
  const std::string value = flag->DefaultValue();
  return absl::StrCat(
      "; default: ",
      flag->IsOfType<std::string>() ? absl::StrCat("\"", value, "\"") : value,
      ";");
}

}  // namespace

std::string CommandHelp(const CommandInfo& command) {
  std::string out =
      absl::StrCat("usage: ", command.synopsis, "\n\n", command.summary, "\n");
  if (!command.flags.empty()) absl::StrAppend(&out, "\nFlags:\n");
  for (const CommandFlag& flag : command.flags) {
    absl::StrAppend(&out,
                    Wrap(absl::StrCat("--", flag.name, " (", flag.help, ")",
                                      DefaultOf(flag)),
                         "    ", "      "),
                    "\n\n");
  }
  return out;
}

absl::Status CheckFlagsOf(const CommandInfo& command) {
  for (const std::string& flag : SpecifiedFlags()) {
    bool known = false;
    for (const CommandFlag& f : command.flags) {
      known = known || f.name == flag;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " is not a flag of pstrain ", command.name,
          " (it would be ignored); see pstrain help ", command.name));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIgnoredDataFlags(const std::string& dataset,
                                   const std::string& command) {
  auto ignored = [&](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " would be ignored: ", why,
                     "; see pstrain help ", command));
  };
  if (!IsTokenDataset(dataset) && FlagSpecified("seq_len")) {
    return ignored("seq_len", absl::StrCat("it is for --dataset=tokens or "
                                           "synthetic_tokens, not ",
                                           dataset));
  }
  if (dataset == "synthetic" || dataset == "synthetic_tokens") {
    for (const char* flag : {"data_dir", "bad_images", "stream_images",
                             "max_dataset_memory", "augment"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag,
                       absl::StrCat("--dataset=", dataset, " reads no files"));
      }
    }
    return absl::OkStatus();
  }
  for (const char* flag : {"num_classes", "synthetic_samples"}) {
    if (FlagSpecified(flag)) {
      return ignored(
          flag, absl::StrCat("it is for --dataset=synthetic, not ", dataset));
    }
  }
  if (dataset != "image_folder") {
    if (FlagSpecified("image_size")) {
      return ignored("image_size",
                     absl::StrCat("it is for --dataset=synthetic or "
                                  "image_folder, not ",
                                  dataset));
    }
    for (const char* flag :
         {"bad_images", "stream_images", "max_dataset_memory", "augment"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, absl::StrCat("it is for --dataset=image_folder, "
                                          "not ",
                                          dataset));
      }
    }
    return absl::OkStatus();
  }
  // The limit is on decoding the whole folder into memory, which a streamed
  // one never does.
  const absl::CommandLineFlag* stream =
      absl::FindCommandLineFlag("stream_images");
  if (stream != nullptr && stream->CurrentValue() == "true" &&
      FlagSpecified("max_dataset_memory")) {
    return ignored("max_dataset_memory",
                   "--stream_images decodes each batch as it trains and never "
                   "holds the folder in memory");
  }
  return absl::OkStatus();
}

absl::Status CheckIgnoredBackendFlags(BackendKind backend,
                                      const std::string& command) {
  if (backend == BACKEND_CPU && FlagSpecified("gpu")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu would be ignored: it is for --backend=cuda; see "
                     "pstrain help ",
                     command));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
