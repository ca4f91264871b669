// attnctl's table of commands: each command's name, one-line summary, help text, the flags it
// takes and the function that runs it. The table drives `attnctl --help`, `attnctl <cmd>
// --help`, which flags a command accepts, and dispatch (command_line.cc, main.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace attn::client::attnctl {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // RPC or I/O failure (health: not SERVING)
constexpr int kExitUsage = 2;    // usage error (finetune: also a bad data file)

// One flag as a command takes it. The value lives in an Abseil flag (ABSL_FLAG, defined in the
// file of the commands that read it), whose default --help shows.
struct FlagUse {
  FlagUse(std::string name, std::string metavar, std::string help = "", std::string spelled = "")
      : name(std::move(name)),
        metavar(std::move(metavar)),
        help(std::move(help)),
        spelled(std::move(spelled)) {}

  std::string name;     // the Abseil flag, with underscores: "batch_size"
  std::string metavar;  // "N", "PATH"; empty for a boolean
  std::string help;     // empty: the flag's own help text
  std::string spelled;  // what the user types instead of `name` (rollback: "version")
  // A string flag that may be given several times: the values are joined with '\n'
  // (kRepeatedFlagSeparator) in the order given (neighbors --in).
  bool repeatable = false;
};

inline constexpr char kRepeatedFlagSeparator = '\n';

struct FlagGroup {
  std::string title;  // "Flags", "Inputs", "Common flags"
  std::vector<FlagUse> flags;
};

struct Command {
  std::string name;
  std::string summary;                 // one line, for `attnctl --help`
  std::string usage;                   // what follows "Usage: "
  std::string description;             // paragraphs between the usage line and the flags
  std::vector<FlagGroup> flag_groups;  // every flag the command takes, as --help lists them
  std::string examples;                // indented lines
  int (*run)(const Command& command) = nullptr;
  // Words after the command's name that are not flags ("job watch ID"): at most this many,
  // read with CommandArguments(); beyond it a stray word is a usage error.
  int max_arguments = 0;
};

// The command's words after its name (see Command::max_arguments), once the line is parsed.
const std::vector<std::string>& CommandArguments();

// The commands of one group, as `attnctl --help` lists them.
struct CommandGroup {
  std::string title;
  std::vector<Command> commands;
};

// The groups, one per file: encode, attention, tokenize, info, health (inspect_commands.cc);
// finetune, versions, promote, rollback, serve-version, eval, report (train_commands.cc).
CommandGroup InspectCommands();
CommandGroup TrainCommands();
// diff, neighbors (compare_commands.cc).
CommandGroup CompareCommands();
// jobs, job watch|cancel|show (job_commands.cc).
CommandGroup JobCommands();

// The flags every command takes (--server, --timeout-ms, --wait-for-ready, --json), with
// `overrides` replacing the help of the flags they name.
FlagGroup CommonFlags(const std::vector<FlagUse>& overrides = {});
// CommonFlags and --api-key-file: the flags every command of the Encoder service takes.
FlagGroup EncoderCommonFlags(const std::vector<FlagUse>& overrides = {});
// The input flags of encode, attention and tokenize (--text, --pair, --max-length,
// --truncation, --model-version).
FlagGroup InputFlags();

// The flag of `command` the user spelled `name` (underscores), or nullptr.
const FlagUse* FindFlag(const Command& command, const std::string& name);
// Whether `command` reads texts (--text or stdin).
bool TakesInputs(const Command& command);

// At most 64 bytes of what the user typed, for messages: a longer piece is cut at a character
// boundary and followed by "…(N bytes)"; control characters are shown as \xNN.
std::string Shortened(absl::string_view text);

// "attnctl: <message>" and where to find help, on stderr; returns kExitUsage.
int UsageError(const std::string& message, const Command* command = nullptr);

}  // namespace attn::client::attnctl
