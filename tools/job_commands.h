// `pstrain submit | status | cancel | wait`: clients of the coordinator
// (tools/pstrain_coordinator at --coordinator=HOST:PORT).
//
//   pstrain submit JOB.pbtxt   parses and checks the spec (the bad field is
//                              named, exit 2), submits it, prints the job id.
//   pstrain status [ID]        one line per job (or the job, with its tasks).
//   pstrain cancel ID          ends a pending or running job.
//   pstrain wait ID            polls until the job ends; prints its final
//                              state; exit 0 only if it SUCCEEDED.
//
// Exit codes: 0 success; 1 the job failed or was cancelled (wait), or the
// coordinator refused or could not be reached; 2 bad input (usage, spec).
// Every RPC has a deadline (--rpc_timeout_s).
#ifndef PSTRAIN_TOOLS_JOB_COMMANDS_H_
#define PSTRAIN_TOOLS_JOB_COMMANDS_H_

#include <string>
#include <vector>

namespace pstrain {

// `args`: the positional arguments after the command name.
int SubmitCommand(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
int CancelCommand(const std::vector<std::string>& args);
int WaitCommand(const std::vector<std::string>& args);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_JOB_COMMANDS_H_
