// attnctl: command-line client for attnserve.
//
//   attnctl encode|attention|tokenize|info|health [flags]
//   attnctl finetune|versions|promote|rollback|serve-version [flags]
//   attnctl jobs, attnctl job watch|cancel|show ID [flags]
//
// Human-readable output by default, --json for machine output. Exit status: 0 ok, 1 RPC or I/O
// failure (health: also "not SERVING"), 2 usage error (finetune: also a bad data file), 128+N
// when finetune was stopped by signal N (Ctrl-C: 130) and aborted the job.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "client/attnctl/command.h"
#include "client/attnctl/command_line.h"
#include "engine/cli_util.h"

namespace attn::client::attnctl {
namespace {

std::string TopHelp(const std::vector<CommandGroup>& table) {
  FlagGroup inputs = InputFlags();
  inputs.title = "Inputs (encode, attention, tokenize)";
  const FlagGroup encoder = {"The Encoder's commands (encode ... health)",
                             {{"api_key_file", "PATH"}}};
  return absl::StrCat(
      R"(attnctl: command-line client for attnserve (a BERT encoder served over gRPC).

Usage: attnctl <command> [flags]

)",
      CommandListHelp(table, {CommonFlags(), encoder, inputs}),
      R"(Examples:
  attnctl info --server localhost:50051
  attnctl encode --text "The cat sat on the mat."
  printf 'first text\nsecond text\n' | attnctl encode --json
  attnctl tokenize --text "Don't panic!" --pair "Why not?"
  attnctl attention --text "The cat sat on the mat." --layer 2 --head 5
  attnctl attention --text "The cat sat on the mat." --html attention.html
  attnctl health --server localhost:50051 --timeout-ms 2000 || echo unhealthy
  attnctl finetune --data pairs.jsonl --objective contrastive --epochs 2 --commit
  attnctl versions
  attnctl promote --version ft-000001-20261122T040000Z
  attnctl finetune --data pairs.jsonl --objective contrastive --detach
  attnctl jobs
  attnctl job watch job-20261127T225000Z-1a2b3c4d

Run 'attnctl <command> --help' for the flags of a command. Flag names may be written with
dashes or underscores (--timeout-ms = --timeout_ms).
Exit status: 0 ok, 1 RPC or I/O error (health: not SERVING), 2 usage error (finetune: also a
bad data file), 130 finetune interrupted by Ctrl-C (the job was aborted).
)");
}

// Abseil's flags that print something and exit: they need no command.
bool IsInformationalFlag(absl::string_view name) {
  return name == "version" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
         name == "helpon" || name == "helpmatch";
}

int Main(int argc, char** argv) {
  const std::vector<CommandGroup> table = {InspectCommands(), TrainCommands(), JobCommands(),
                                           CompareCommands()};
  // Help first, before any validation: "attnctl", "attnctl --help", "attnctl help [cmd]",
  // "attnctl <cmd> --help".
  const Command* named = nullptr;
  bool help = argc < 2;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || (i == 1 && arg == "help")) help = true;
    if (named == nullptr && !arg.empty() && arg[0] != '-') named = FindCommand(table, argv[i]);
  }
  if (argc < 2) {
    std::fputs(TopHelp(table).c_str(), stderr);
    return kExitUsage;
  }
  if (help) {
    std::fputs((named != nullptr ? CommandHelp(*named) : TopHelp(table)).c_str(), stdout);
    return kExitOk;
  }
  // --version, --helpfull, ...: Abseil prints and exits, unless the command has a flag of that
  // name (rollback --version V).
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const std::string name = absl::StrReplaceAll(arg.substr(0, arg.find('=')), {{"-", "_"}});
    if (IsInformationalFlag(name) && (named == nullptr || FindFlag(*named, name) == nullptr)) {
      std::vector<char*> args = {argv[0], argv[i]};
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
    }
  }

  CommandLine line;
  int exit_code = kExitOk;
  if (!ParseCommandLine(table, argc, argv, &line, &exit_code)) return exit_code;
  if (!line.abseil_args.empty()) {  // --flagfile, --fromenv, ...
    std::vector<char*> args = {argv[0]};
    for (std::string& arg : line.abseil_args) args.push_back(arg.data());
    absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  }
  return line.command->run(*line.command);
}

}  // namespace
}  // namespace attn::client::attnctl

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("command-line client for attnserve; see 'attnctl --help'");
  absl::FlagsUsageConfig config;
  config.version_string = [] { return attn::ProgramVersion("attnctl") + "\n"; };
  absl::SetFlagsUsageConfig(config);
  return attn::client::attnctl::Main(argc, argv);
}
