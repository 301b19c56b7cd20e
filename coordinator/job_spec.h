// Job specs (proto/job.proto): parsing the protobuf text format users
// submit, filling the defaults, and refusing bad specs with the field named.
//
// Defaults (as `pstrain run`): model "lenet5", dataset "fashion_mnist",
// data_dir "/usr/share/datasets/fashion-mnist", backend "cpu", mode "sync",
// seed 1, partition_bytes 4 MiB, log_every_steps 200, image_size 224,
// num_classes 1000, synthetic_samples 12800, bucket_bytes 25 MiB, the
// optimizer's defaults (proto/job.proto); and, unlike `pstrain run` (60),
// registration_timeout_s 600, since a submitted job's tasks may wait in a
// scheduler's queue.
// num_ps (except in mode allreduce, where it is 0), num_workers, batch_size
// and epochs have no default: they must be set, and >= 1. They are the
// job's size, which the launcher must start as many tasks for, and proto3
// cannot tell a field left out from one set to 0.
//
// Thread-safety: pure functions.
#ifndef PSTRAIN_COORDINATOR_JOB_SPEC_H_
#define PSTRAIN_COORDINATOR_JOB_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"
#include "server/adam.h"

namespace pstrain {

// Parses `text` (protobuf text format) read from `source` (a file name, for
// messages), fills the defaults and validates. INVALID_ARGUMENT with a
// one-line message: "job.pbtxt:3:1: Message type \"pstrain.JobSpec\" has no
// field named \"modle\"." for a syntax error or unknown field, or the
// ValidateJobSpec message prefixed with `source`.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const std::string& source);

// Fills the unset fields listed above.
void ApplyJobDefaults(JobSpec* spec);

// INVALID_ARGUMENT naming the first bad field and what was expected: an
// unknown model, dataset, backend or mode; a count below 1 (num_ps: 0 in
// mode allreduce, >= 1 otherwise); a
// partition_bytes that is not a positive multiple of 4; optimizer values
// out of range (lr > 0, 0 <= beta < 1, epsilon > 0, weight_decay >= 0);
// a host list whose length is neither 0 nor the task count; a port outside
// 0..65535; an empty host; the same host:port (port > 0) listed twice.
absl::Status ValidateJobSpec(const JobSpec& spec);

// The Adam hyperparameters of `optimizer` (doubles in the spec, fp32 in the
// update), for the shards and for allreduce workers alike.
AdamOptions AdamOptionsOf(const OptimizerSpec& optimizer);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_SPEC_H_
