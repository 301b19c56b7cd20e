#include "common/flags_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// absl's usage flags: not registered flags, handled by absl itself.
bool IsUsageFlag(absl::string_view name) {
  for (absl::string_view usage :
       {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch",
        "version", "only_check_args"}) {
    if (name == usage) return true;
  }
  return false;
}

// Every flag of this project, whichever file defines it; absl's own
// (--flagfile, --fromenv, ...) only with --helpfull.
bool IsProjectFlagFile(absl::string_view file) {
  return !absl::StrContains(file, "absl/");
}

bool g_help_requested = false;
std::vector<std::string>& Specified() {
  static auto* specified = new std::vector<std::string>;
  return *specified;
}

[[noreturn]] void ExitWithUsageError(absl::string_view program,
                                     absl::string_view message,
                                     absl::string_view hint) {
  PrintError(program, absl::StrCat(message, "; see ", hint));
  std::exit(2);
}

// Where the arguments being checked come from: the command line, or a
// --flagfile / --fromenv that absl expands in their place.
struct ArgSource {
  absl::string_view program;
  absl::string_view hint;
  std::string where;  // "" (the command line) or " in FILE"
  int depth = 0;      // --flagfile nesting
};

// absl reads a nested --flagfile as often as asked; a file naming itself
// would never end.
constexpr int kMaxFlagfileDepth = 10;

void CheckArgs(const std::vector<std::string>& args, const ArgSource& source);

// --flagfile=F1,F2: each file's lines as absl reads them (leading blanks
// dropped; empty and '#' lines skipped; every other line one argument that
// starts with '-'), checked like the command line's.
void CheckFlagfiles(absl::string_view files, const ArgSource& source) {
  for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
    const std::string path(file);
    const std::string flag = absl::StrCat("--flagfile=", path, source.where);
    if (source.depth >= kMaxFlagfileDepth) {
      ExitWithUsageError(source.program,
                         absl::StrCat(flag, ": flag files nested more than ",
                                      kMaxFlagfileDepth, " deep"),
                         source.hint);
    }
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      ExitWithUsageError(source.program,
                         absl::StrCat(flag, ": a folder, expected a file"),
                         source.hint);
    }
    std::string contents;
    if (absl::Status s = ReadFile(path, &contents); !s.ok()) {
      ExitWithUsageError(
          source.program,
          absl::StrCat("--flagfile", source.where, ": ", s.message()),
          source.hint);
    }
    std::vector<std::string> args;
    for (absl::string_view line : absl::StrSplit(contents, '\n')) {
      absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
      if (stripped.empty() || stripped[0] == '#') continue;
      if (stripped[0] != '-' || stripped == "--") {
        ExitWithUsageError(
            source.program,
            absl::StrCat(flag, ": unexpected line \"",
                         absl::CHexEscape(stripped.substr(0, 100)),
                         "\"; expected --flag=value, a comment (#) or an "
                         "empty line"),
            source.hint);
      }
      args.push_back(std::string(stripped));
    }
    CheckArgs(args, ArgSource{source.program, source.hint,
                              absl::StrCat(" in ", path), source.depth + 1});
  }
}

// --fromenv=a,b (--tryfromenv): FLAGS_a and FLAGS_b from the environment,
// as absl reads them ("--a=$FLAGS_a"); --fromenv needs each to be set.
void CheckFromEnv(absl::string_view generator, absl::string_view names,
                  const ArgSource& source) {
  std::vector<std::string> args;
  for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipEmpty())) {
    if (name == "fromenv" || name == "tryfromenv") {
      ExitWithUsageError(
          source.program,
          absl::StrCat("--", generator, "=", names, source.where, ": --", name,
                       " cannot come from the "
                       "environment"),
          source.hint);
    }
    const std::string variable = absl::StrCat("FLAGS_", name);
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) {
      if (generator == "tryfromenv") continue;
      ExitWithUsageError(source.program,
                         absl::StrCat("--", generator, "=", names, source.where,
                                      ": ", variable, " is not set"),
                         source.hint);
    }
    args.push_back(absl::StrCat("--", name, "=", value));
  }
  CheckArgs(args, ArgSource{source.program, source.hint,
                            absl::StrCat(source.where, " (--", generator, ")"),
                            source.depth});
}

// Each argument checked as absl will read it (--name=value, --name value,
// --bool, --nobool; "--" ends the flags), so that absl's parse, which exits
// 1 on an unknown flag or a bad value, finds neither.
void CheckArgs(const std::vector<std::string>& args, const ArgSource& source) {
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    absl::string_view value =
        has_value ? arg.substr(eq + 1) : absl::string_view();
    if (IsUsageFlag(name)) {
      g_help_requested = true;
      continue;
    }
    absl::CommandLineFlag* flag =
        name.empty() ? nullptr : absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      ExitWithUsageError(source.program,
                         absl::StrCat("unknown flag --", name, source.where),
                         source.hint);
    }
    if (flag->IsRetired()) continue;
    if (negated) {
      if (has_value) {
        ExitWithUsageError(
            source.program,
            absl::StrCat("--", name, "=", value, source.where, ": --no",
                         flag->Name(), " takes no value"),
            source.hint);
      }
      value = "false";
    } else if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        ExitWithUsageError(
            source.program,
            absl::StrCat("--", name, source.where, ": missing its value"),
            source.hint);
      }
    }
    // absl's generator flags: their files and variables are checked here,
    // and absl sets them itself below (setting --flagfile here too would
    // have absl read its files twice).
    if (flag->Name() == "flagfile") {
      CheckFlagfiles(value, source);
      continue;
    }
    if (flag->Name() == "fromenv" || flag->Name() == "tryfromenv") {
      CheckFromEnv(flag->Name(), value, source);
      continue;
    }
    // The value absl will set again below; setting it here first is the
    // only public way to learn whether it parses.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      // A typed flag's own reason ("Illegal value 'semi' specified for flag
      // 'mode'; expected sync, async or allreduce") reads as the job spec's
      // errors do: --mode: "semi"; expected sync, async or allreduce.
      const std::string absl_prefix =
          absl::StrCat("Illegal value '", value, "' specified for flag '",
                       flag->Name(), "'; ");
      std::string message;
      if (absl::StartsWith(error, absl_prefix)) {
        message = absl::StrCat("--", flag->Name(), source.where, ": \"",
                               absl::CHexEscape(value), "\"; ",
                               error.substr(absl_prefix.size()));
      } else {
        message = absl::StrCat("--", flag->Name(), "=", value, source.where,
                               ": ", error);
      }
      ExitWithUsageError(source.program, message, source.hint);
    }
    std::vector<std::string>& specified = Specified();
    if (std::find(specified.begin(), specified.end(), flag->Name()) ==
        specified.end()) {
      specified.push_back(std::string(flag->Name()));
    }
  }
}

}  // namespace

std::vector<std::string> ParseFlagsOrExit(int argc, char** argv,
                                          absl::string_view program,
                                          absl::string_view hint,
                                          bool handle_help) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsProjectFlagFile;
  config.contains_helpshort_flags = IsProjectFlagFile;
  absl::SetFlagsUsageConfig(config);
  CheckArgs(std::vector<std::string>(argv + std::min(argc, 1), argv + argc),
            ArgSource{program, hint, "", 0});
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (handle_help && g_help_requested) PrintUsageAndExit();
  return std::vector<std::string>(
      positional.empty() ? positional.end() : positional.begin() + 1,
      positional.end());
}

bool HelpRequested() { return g_help_requested; }

void PrintUsageAndExit() {
  // 1 after --help, 0 after --version: both answered as asked.
  absl::flags_internal::HandleUsageFlags(std::cout,
                                         absl::ProgramUsageMessage());
  std::cout.flush();
  std::exit(0);
}

bool FlagSpecified(absl::string_view name) {
  for (const std::string& specified : Specified()) {
    if (specified == name) return true;
  }
  return false;
}

std::vector<std::string> SpecifiedFlags() { return Specified(); }

std::string FlagHelpText(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return "";
  std::ostringstream out;
  absl::flags_internal::FlagHelp(out, *flag);
  return out.str();
}

absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t lo,
                            int64_t hi, absl::string_view unit) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": expected ", lo, " to ", hi,
                   unit.empty() ? "" : " ", unit));
}

absl::Status FirstError(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void ExitOnFlagError(absl::string_view program, const absl::Status& status) {
  if (status.ok()) return;
  PrintError(program, status.message());
  std::exit(2);
}

namespace {

// OK when `folder` is a folder this process may create files in.
absl::Status CheckWritableFolder(absl::string_view flag,
                                 const std::string& path,
                                 const std::filesystem::path& folder) {
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": ", folder.string(), " is not a folder"));
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot write in ",
                     folder.string(), " (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOutputFile(absl::string_view flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": a folder; expected a file name"));
  }
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  if (!std::filesystem::exists(folder, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": its folder ", folder.string(),
                     " does not exist"));
  }
  return CheckWritableFolder(flag, path, folder);
}

absl::Status CheckOutputFolder(absl::string_view flag,
                               const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::filesystem::path folder = std::filesystem::absolute(path);
  std::error_code error;
  // The nearest component that exists; what must be made below it is.
  while (!std::filesystem::exists(
             std::filesystem::symlink_status(folder, error)) &&
         folder.has_parent_path() && folder.parent_path() != folder) {
    folder = folder.parent_path();
  }
  return CheckWritableFolder(flag, path, folder);
}

namespace {

// Why `address` is not HOST:PORT (HOST a name, an IPv4 address or a
// bracketed IPv6 one; PORT 1 to 65535), or "" when it is.
std::string HostPortError(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return "no port";
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 1 ||
      port_number > 65535 || !absl::c_all_of(port, absl::ascii_isdigit)) {
    return absl::StrCat("port \"", EscapeForMessage(port), "\"");
  }
  if (host.empty()) return "no host";
  const bool bracketed = host.front() == '[' && host.back() == ']';
  if (!bracketed && host.find(':') != absl::string_view::npos) {
    return "an IPv6 address goes in brackets";
  }
  return "";
}

}  // namespace

absl::Status CheckGrpcTarget(absl::string_view flag, absl::string_view target) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", EscapeForMessage(target), ": ", why,
                     "; expected HOST:PORT (PORT 1 to 65535), or unix:PATH"));
  };
  if (target.empty()) return bad("empty");
  for (const char c : target) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return bad("a space or control character");
    }
  }
  // gRPC's naming (doc/naming.md): unix:PATH, unix://ABSOLUTE_PATH,
  // unix-abstract:NAME; dns:[//AUTHORITY/]HOST:PORT; ipv4: and ipv6: with
  // a comma-separated list of addresses.
  for (absl::string_view scheme : {"unix:", "unix-abstract:"}) {
    absl::string_view path = target;
    if (absl::ConsumePrefix(&path, scheme)) {
      if (path.empty() || path == "//") return bad("no path");
      return absl::OkStatus();
    }
  }
  absl::string_view rest = target;
  if (absl::ConsumePrefix(&rest, "dns:") && absl::ConsumePrefix(&rest, "//")) {
    // The DNS server to ask ("" for the system's), then the name.
    const size_t slash = rest.find('/');
    if (slash == absl::string_view::npos) {
      return bad("no \"/\" after dns://AUTHORITY");
    }
    rest.remove_prefix(slash + 1);
  }
  std::vector<absl::string_view> addresses = {rest};
  if (absl::ConsumePrefix(&rest, "ipv4:") ||
      absl::ConsumePrefix(&rest, "ipv6:")) {
    addresses = absl::StrSplit(rest, ',');
  }
  for (absl::string_view address : addresses) {
    if (const std::string why = HostPortError(address); !why.empty()) {
      return bad(why);
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoToStatus(errno, tmp);
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), f);
  const bool flushed = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const int close_result = std::fclose(f);
  if (written != contents.size() || !flushed || close_result != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return ErrnoToStatus(error, path);
  }
  // The rename itself is durable once the folder is synced.
  const size_t slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos
                                 ? "."
                                 : (slash == 0 ? "/" : path.substr(0, slash));
  const int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) return ErrnoToStatus(errno, folder);
  const int synced = fsync(dir);
  const int error = errno;
  close(dir);
  if (synced != 0) return ErrnoToStatus(error, folder);
  return absl::OkStatus();
}

absl::Status ReadFile(const std::string& path, std::string* contents) {
  // Never blocks: a FIFO or a device in the file's place is refused.
  ASSIGN_OR_RETURN(RegularFile file,
                   OpenRegularFile(path, /*follow_symlinks=*/true));
  std::string bytes(file.size_bytes(), '\0');
  RETURN_IF_ERROR(file.ReadAt(path, 0, bytes.data(), bytes.size()));
  *contents = std::move(bytes);
  return absl::OkStatus();
}

void PrintError(absl::string_view program, absl::string_view message) {
  std::fprintf(stderr, "%s: error: %s\n", std::string(program).c_str(),
               std::string(message).c_str());
  std::fflush(stderr);
}

}  // namespace pstrain
