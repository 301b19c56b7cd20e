// The subcommands of `pstrain`: what each does, its synopsis and the flags
// it reads, for `pstrain help [COMMAND]`, `pstrain COMMAND --help` and the
// check that refuses a flag the command would ignore.
//
// Thread-safety: call from main() only (reads the flag registry).
#ifndef PSTRAIN_CLI_COMMAND_HELP_H_
#define PSTRAIN_CLI_COMMAND_HELP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "catalog/job_config.h"

namespace pstrain {

// One flag as one command reads it: the same flag (--out, --num_ps, --job)
// means different things to different commands, so each command describes
// its own.
struct CommandFlag {
  std::string name;  // no dashes: "num_ps"
  std::string help;  // what it does for this command
  // The default as this command reads it, where that is not the flag's
  // registered one (certs' --job: any job, not launch-lines' "$JOB");
  // empty: the registered default.
  std::string default_value = "";
};

struct CommandInfo {
  std::string name;      // "run"
  std::string synopsis;  // "pstrain run [--flags]"
  std::string summary;   // a paragraph
  // Every flag the command reads, with its text for this command; any other
  // flag given with it is an error.
  std::vector<CommandFlag> flags;
};

// Every subcommand, in the order `pstrain help` lists them.
const std::vector<CommandInfo>& Commands();

// The command called `name`, or null.
const CommandInfo* FindCommand(absl::string_view name);

// `pstrain help`: the synopsis of every command.
std::string CommandsOverview();

// `pstrain help COMMAND` and `pstrain COMMAND --help`: its synopsis and
// summary, then only its flags, each with the command's text for it and the
// flag's default (from absl's registry; left out for a flag this binary does
// not link).
std::string CommandHelp(const CommandInfo& command);

// INVALID_ARGUMENT "--x is not a flag of pstrain COMMAND (it would be
// ignored); see pstrain help COMMAND" for the first flag on the command line
// that `command` does not read.
absl::Status CheckFlagsOf(const CommandInfo& command);

// The dataset flags that `dataset` would ignore, given on the command line
// of `command` ("run", "compare", "eval"): INVALID_ARGUMENT "--FLAG would
// be ignored: WHY; see pstrain help COMMAND" for the first (--data_dir
// with synthetic data, --num_classes with a real dataset, --stream_images
// without an image folder, ...).
absl::Status CheckIgnoredDataFlags(const std::string& dataset,
                                   const std::string& command);

// --gpu given with `backend` BACKEND_CPU: INVALID_ARGUMENT as above.
absl::Status CheckIgnoredBackendFlags(BackendKind backend,
                                      const std::string& command);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_COMMAND_HELP_H_
