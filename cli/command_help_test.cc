// `pstrain help COMMAND` for every command (issue 37): only that command's
// flags, each with its own text for it, and nothing written for another
// command; `pstrain COMMAND --help` says the same; a flag the command does
// not take is refused with exit 2, naming the command and the flag.
#include "cli/command_help.h"

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace pstrain {
namespace {

using ::pstrain::testing::CommandResult;
using ::pstrain::testing::RunCommand;

// `text` with every run of spaces and newlines as one space (the help
// wraps lines).
std::string OneLine(const std::string& text) {
  return absl::StrJoin(
      absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty()), " ");
}

// The flags a help lists: its lines "    --name (...".
std::vector<std::string> ListedFlags(const std::string& help) {
  std::vector<std::string> flags;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    if (!absl::ConsumePrefix(&line, "    --")) continue;
    flags.push_back(std::string(line.substr(0, line.find(' '))));
  }
  return flags;
}

TEST(CommandHelpTest, EachCommandListsOnlyItsFlagsWithItsOwnText) {
  for (const CommandInfo& command : Commands()) {
    SCOPED_TRACE(command.name);
    const CommandResult help = RunCommand("cli/pstrain help " + command.name);
    ASSERT_EQ(help.exit_code, 0) << help.output;
    // (`pstrain help --help` lists the commands, as `pstrain help` does.)
    if (command.name != "help") {
      const CommandResult dash_help =
          RunCommand("cli/pstrain " + command.name + " --help");
      EXPECT_EQ(dash_help.exit_code, 0) << dash_help.output;
      EXPECT_EQ(dash_help.output, help.output);
    }

    // Exactly its flags, in its order, each once.
    std::vector<std::string> expected;
    std::set<std::string> own_texts;
    for (const CommandFlag& flag : command.flags) {
      expected.push_back(flag.name);
      own_texts.insert(OneLine(flag.help));
      EXPECT_FALSE(flag.help.empty()) << flag.name;
    }
    EXPECT_EQ(ListedFlags(help.output), expected) << help.output;
    const std::string text = OneLine(help.output);
    for (const CommandFlag& flag : command.flags) {
      EXPECT_NE(text.find(absl::StrCat("--", flag.name, " (",
                                       OneLine(flag.help), ")")),
                std::string::npos)
          << flag.name << ":\n"
          << help.output;
    }
    // No other command's text for a flag, and no "other-command:" labels
    // (what one help text for every command used to hold: "--out (certs:
    // ... trace: ...)").
    for (const CommandInfo& other : Commands()) {
      if (other.name == command.name) continue;
      for (const CommandFlag& flag : other.flags) {
        const std::string other_text = OneLine(flag.help);
        if (own_texts.count(other_text) > 0) continue;  // shared, and its own
        EXPECT_EQ(text.find(other_text), std::string::npos)
            << other.name << "'s text for --" << flag.name << " in:\n"
            << help.output;
      }
      for (const std::string& label : {absl::StrCat("(", other.name, ":"),
                                       absl::StrCat(" ", other.name, ": "),
                                       absl::StrCat("(", other.name, ", ")}) {
        EXPECT_EQ(text.find(label), std::string::npos)
            << "\"" << label << "\" in:\n"
            << help.output;
      }
    }
  }
}

// A flag that another command takes but this one does not: exit 2, one
// line naming both.
TEST(CommandHelpTest, AnotherCommandsFlagIsRefusedWithExit2) {
  std::set<std::string> all;
  for (const CommandInfo& command : Commands()) {
    for (const CommandFlag& flag : command.flags) all.insert(flag.name);
  }
  for (const CommandInfo& command : Commands()) {
    if (command.name == "help") continue;  // it takes no flags, reads none
    std::set<std::string> own;
    for (const CommandFlag& flag : command.flags) own.insert(flag.name);
    int refused = 0;
    for (const std::string& flag : all) {
      if (own.count(flag) > 0 || refused == 3) continue;
      ++refused;
      // A value the flag's type parses (a typed choice refuses "1" before
      // the command's check sees the flag).
      static const std::map<std::string, std::string> kValues = {
          {"mode", "sync"},         {"optimizer", "adam"},
          {"lr_schedule", "cosine"}, {"compute", "model"},
          {"augment", "none"},      {"backend", "cpu"}};
      const auto typed = kValues.find(flag);
      const std::string line = absl::StrCat(
          "cli/pstrain ", command.name, " --", flag, "=",
          typed == kValues.end() ? "1" : typed->second);
      const CommandResult r = RunCommand(line);
      EXPECT_EQ(r.exit_code, 2) << line << ": " << r.output;
      EXPECT_EQ(r.output,
                absl::StrCat("pstrain: error: --", flag,
                             " is not a flag of pstrain ", command.name,
                             " (it would be ignored); see pstrain help ",
                             command.name, "\n"))
          << line;
    }
    EXPECT_GT(refused, 0) << command.name;
  }
}

}  // namespace
}  // namespace pstrain
