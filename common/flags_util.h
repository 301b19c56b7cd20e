// Small helpers for the binaries' command lines.
#ifndef PSTRAIN_COMMON_FLAGS_UTIL_H_
#define PSTRAIN_COMMON_FLAGS_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// Parses argv's flags for `program` and returns the positional arguments
// (argv[0] left out). Every binary's main() calls it in place of
// absl::ParseCommandLine, so that all of them answer the same way:
// - `--help` (and absl's --helpfull, --helpshort, --helpon=, --helpmatch=,
//   --version) prints the usage message and every flag the program links
//   (whatever file defines it) with its default, and exits 0; with
//   `handle_help` false it is left to the caller (HelpRequested()).
// - an unknown flag prints one line, "PROGRAM: error: unknown flag --x; see
//   HINT", and exits 2 (absl itself exits 1);
// - a value that does not parse (--num_workers=two) prints one line naming
//   the flag and its value and exits 2.
// - the same for the flags in absl's --flagfile=F1,F2 (the line names the
//   file: "unknown flag --x in F1"; nested flag files up to 10 deep) and
//   --fromenv/--tryfromenv=a,b (FLAGS_a, ...); a flag file that cannot be
//   read, or holds a line that is not a flag, a comment (#) or empty, exits
//   2 with one line too. Their flags count as given (FlagSpecified,
//   SpecifiedFlags); --flagfile and --fromenv themselves do not.
// Call once, from main(), before any flag is read.
std::vector<std::string> ParseFlagsOrExit(int argc, char** argv,
                                          absl::string_view program,
                                          absl::string_view hint,
                                          bool handle_help = true);

// Whether a usage flag (--help and absl's others) was on the command line.
bool HelpRequested();

// absl's answer to the usage flags on stdout (the usage message and the
// flags); then exits 0.
[[noreturn]] void PrintUsageAndExit();

// Whether flag `name` (no dashes) was given on the command line.
bool FlagSpecified(absl::string_view name);

// The names of the flags given on the command line, in order, each once.
std::vector<std::string> SpecifiedFlags();

// absl's help of flag `name` ("--name (help); default: value;"), for the
// help of a subcommand; empty if there is no such flag.
std::string FlagHelpText(absl::string_view name);

// INVALID_ARGUMENT "--flag=value: expected LO to HI UNIT" unless
// lo <= value <= hi; for the daemons' own flags (ports, timeouts, threads).
absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t lo,
                            int64_t hi, absl::string_view unit = "");

// The first error of `checks` (flag checks such as CheckFlagRange, all
// evaluated first, reported in order), or OK when there is none.
absl::Status FirstError(std::initializer_list<absl::Status> checks);

// A command's refusal of its flags: when `status` is an error, prints
// "program: message" (PrintError) and exits with status 2; returns
// otherwise.
void ExitOnFlagError(absl::string_view program, const absl::Status& status);

// Checks, before a long job, that the file `path` (flag --`flag`) can be
// written at its end (WriteFileAtomically): its folder exists and this
// process may create files in it, and `path` is not a folder. OK for an
// empty path (the flag unset). INVALID_ARGUMENT "--flag=path: ..." naming
// what is wrong. Nothing is created.
absl::Status CheckOutputFile(absl::string_view flag, const std::string& path);

// The same for a folder the job will make and write in: `path` is a folder
// this process may create files in, or its nearest existing ancestor is
// (every component on the way is missing, none a file). OK for an empty
// path. Nothing is created.
absl::Status CheckOutputFolder(absl::string_view flag, const std::string& path);

// Checks the gRPC target `target` of flag --`flag` (a coordinator's or a
// shard's address) before anything dials it, so that a typo is an error at
// once rather than a connection retried until a timeout: HOST:PORT (HOST a
// name, an IPv4 address or a bracketed IPv6 one; PORT 1 to 65535),
// optionally after gRPC's "dns:", "dns:///" or "dns://AUTHORITY/" scheme;
// "ipv4:" or "ipv6:" and a comma-separated list of them; "unix:PATH",
// "unix://ABSOLUTE_PATH" or "unix-abstract:NAME" (gRPC's doc/naming.md).
// INVALID_ARGUMENT "--flag=target: ..." otherwise (an empty one included).
absl::Status CheckGrpcTarget(absl::string_view flag, absl::string_view target);

// Writes `contents` to `path` atomically and durably (a temporary file in
// the same folder, fsynced, renamed over `path`, then the folder fsynced), so
// a reader never sees a partial file and an OK return survives a crash.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// Reads a whole regular file (symbolic links followed), without blocking:
// NOT_FOUND / PERMISSION_DENIED / INTERNAL naming it, INVALID_ARGUMENT for
// a FIFO, a device or a folder (common/regular_file.h).
absl::Status ReadFile(const std::string& path, std::string* contents);

// Prints "<program>: error: <message>" on one line to stderr.
void PrintError(absl::string_view program, absl::string_view message);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FLAGS_UTIL_H_
