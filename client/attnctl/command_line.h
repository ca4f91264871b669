// Reading attnctl's command line against the table of commands (command.h), and the --help
// texts the table makes.
#pragma once

#include <string>
#include <vector>

#include "client/attnctl/command.h"

namespace attn::client::attnctl {

const Command* FindCommand(const std::vector<CommandGroup>& table, const std::string& name);

// `attnctl <command> --help`: summary, usage, description, every flag the command takes with
// its default, examples.
std::string CommandHelp(const Command& command);
// The commands of every group with their summaries, then `common` (flag groups shown once).
std::string CommandListHelp(const std::vector<CommandGroup>& table,
                            const std::vector<FlagGroup>& common);

struct CommandLine {
  const Command* command = nullptr;
  // Abseil's own flags (--flagfile, --fromenv, ...) with their values, for absl::ParseCommandLine.
  std::vector<std::string> abseil_args;
};

// Finds the command and sets the flags it was given. Flag names may use dashes or underscores;
// "--noFLAG" negates a boolean. A missing or unknown command, an unknown flag, a flag the
// command does not take, a missing or unparsable value and a stray argument are usage errors:
// printed, with where to find help, and false with *exit_code = kExitUsage.
// A flag or command name that is not known but close to one (an edit or two) is answered
// with it: "unknown flag --txt; did you mean --text?".
bool ParseCommandLine(const std::vector<CommandGroup>& table, int argc, char** argv,
                      CommandLine* line, int* exit_code);

// Whether the command line set the flag `name` (underscored), even to its default or "": how
// `--text ""` is told apart from no --text.
bool FlagGiven(const std::string& name);

}  // namespace attn::client::attnctl
