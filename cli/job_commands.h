// `pstrain submit | status | logs | cancel | wait`: clients
// of the coordinator (coordinator/pstrain_coordinator at
// --coordinator=HOST:PORT).
//
//   pstrain submit JOB.pbtxt   parses and checks the spec (the bad field is
//                              named, exit 2), submits it, prints the job id.
//   pstrain status [ID]        one line per job (or the job, with its tasks,
//                              their steps and samples/sec).
//   pstrain logs ID            the lines the job's tasks printed ("[worker0]
//                              Step200: 9003.12 data/sec"), as the
//                              coordinator keeps them (the last 10000).
//   pstrain cancel ID          ends a pending or running job.
//   pstrain scale ID [--num_workers=N] [--num_ps=M] [--at_step=S]
//                              an elastic job's new membership (issue 40;
//                              the admin only); prints it.
//   pstrain wait ID            follows the job to its end: its tasks' lines
//                              as they arrive, its final state, and the
//                              results table of `pstrain run`; exit 0 only
//                              if it SUCCEEDED. While tasks have not all
//                              registered, once a minute the ones missing.
//   pstrain trace ID|DIR       merges the job's per-task timelines onto
//                              the coordinator's clock (cli/trace_merge.h).
// (`pstrain launch-lines` and `pstrain install`: cli/launch_lines.h.)
//
// Exit codes: 0 success; 1 the job failed or was cancelled (wait), or the
// coordinator refused or could not be reached; 2 bad input (usage, spec).
// Every RPC has a deadline (--rpc_timeout_s). status, logs and wait ride out
// a coordinator restart: while it cannot be reached they retry as the tasks
// do (coordinator/task_agent.h CallCoordinatorWithRetry), saying so once on
// stderr, for up to --coordinator_timeout_s (then exit 1 with one line
// naming that deadline). submit, cancel and scale do not retry.
#ifndef PSTRAIN_CLI_JOB_COMMANDS_H_
#define PSTRAIN_CLI_JOB_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"
#include "proto/results.pb.h"

namespace pstrain {

// The one-row markdown table `pstrain run` and `pstrain wait` print:
// | #PS | #Workers | Mode | Model | Batchsize | Epochs | Steps | Runtime |
// Throughput (data/sec) | Test accuracy |.
std::string FormatResultTable(const RunResult& result);
// The test accuracy column of the tables: "0.8596", or "-" where no
// evaluation ran (synthetic compute, a dataset without a test split).
std::string FormatTestAccuracy(const RunResult& result);
// `result` as JSON (protobuf's printer, field names as in the .proto),
// with its 64-bit integers (steps, model_bytes, ...) as JSON numbers.
std::string ResultJson(const RunResult& result);
// `json`, protobuf's JSON of a `type` message, with the 64-bit integer
// fields' values (written as strings, "steps": "120") as numbers
// ("steps": 120).
std::string Int64sAsNumbers(const google::protobuf::Descriptor* type,
                            const std::string& json);

// `args`: the positional arguments after the command name.
int SubmitCommand(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
int LogsCommand(const std::vector<std::string>& args);
int CancelCommand(const std::vector<std::string>& args);
// --num_workers and --num_ps as `pstrain scale` reads them (pstrain.cc
// defines both; --num_ps is text there, a list for compare), and whether
// each was on the command line.
struct ScaleFlags {
  int num_workers = 0;
  bool num_workers_given = false;
  std::string num_ps;
  bool num_ps_given = false;
};
// Exit 2 without either count, or one out of range.
int ScaleCommand(const std::vector<std::string>& args, const ScaleFlags& flags);
int WaitCommand(const std::vector<std::string>& args);
// `pstrain trace JOB_ID_OR_DIR [--out=FILE]`: merges a job's task traces
// (DIR/trace/*.json, cli/trace_merge.h; a job id: its spec's metrics_dir
// from the coordinator) into --out (default DIR/trace.json). Exit 2: no
// trace there, or a file that is not one.
int TraceCommand(const std::vector<std::string>& args);

// Ends the process with `code` once stdout and stderr are flushed, without
// static destructors or gRPC's teardown (std::_Exit): the commands above
// share one coordinator channel that may still be reconnecting on gRPC's
// threads when they end (a coordinator that went away), and a teardown
// racing those threads crashed `pstrain wait` after its last line (exit
// 139, once in CI). LeakSanitizer does not check these commands' exits.
[[noreturn]] void ExitAfterCommand(int code);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_JOB_COMMANDS_H_
