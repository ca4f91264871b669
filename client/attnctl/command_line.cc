#include "client/attnctl/command_line.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/cli_util.h"

namespace attn::client::attnctl {
namespace {

// Help layout: flag names in a column of this width after two blanks, text wrapped at kWidth.
constexpr int kNameColumn = 22;
constexpr int kWidth = 96;

std::string Underscored(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }
std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

// Abseil's own flags: handled by absl::ParseCommandLine, never by a command.
bool IsAbseilBuiltinFlag(absl::string_view name) {
  static const std::set<absl::string_view> kBuiltins = {
      "flagfile",  "fromenv",     "tryfromenv", "undefok",   "help",    "helpfull",
      "helpshort", "helppackage", "helpon",     "helpmatch", "version", "only_check_args"};
  return kBuiltins.count(name) > 0;
}

// Builtins that take no separate value argument.
bool IsAbseilSwitch(absl::string_view name) {
  return name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
         name == "version" || name == "only_check_args";
}

// "  --batch-size N        examples per step (default: 16)"; the help and default come from the
// Abseil flag unless the command overrides the help.
std::string FlagHelp(const FlagUse& use) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(use.name);
  std::string left = absl::StrCat("  --", Dashed(use.spelled.empty() ? use.name : use.spelled));
  if (!use.metavar.empty()) absl::StrAppend(&left, " ", use.metavar);
  std::string text = use.help;
  if (flag != nullptr) {
    if (text.empty()) text = flag->Help();
    // An empty string or false default means "not given", which the help text explains; so
    // does a help text that describes a computed default itself.
    const std::string default_value = flag->DefaultValue();
    if (!default_value.empty() && default_value != "false" &&
        !absl::StrContains(text, "(default")) {
      absl::StrAppend(&text, " (default: ", default_value, ")");
    }
  }
  // The name stands in the first line's indent, or on a line of its own when it is too long.
  const std::string wrapped = WrapText(text, kNameColumn, kWidth);
  if (wrapped.empty()) return left + "\n";
  if (static_cast<int>(left.size()) + 2 <= kNameColumn) return left + wrapped.substr(left.size());
  return absl::StrCat(left, "\n", wrapped);
}

std::string FlagGroupHelp(const FlagGroup& group) {
  std::string out = absl::StrCat(group.title, ":\n");
  for (const FlagUse& use : group.flags) absl::StrAppend(&out, FlagHelp(use));
  return out;
}

// The flag any command of the table takes under `name`, or nullptr.
const FlagUse* FindFlagInTable(const std::vector<CommandGroup>& table, const std::string& name) {
  for (const CommandGroup& group : table) {
    for (const Command& command : group.commands) {
      if (const FlagUse* use = FindFlag(command, name)) return use;
    }
  }
  return nullptr;
}

}  // namespace

std::string Shortened(absl::string_view text) {
  constexpr size_t kMaxBytes = 64;
  absl::string_view shown = text;
  if (text.size() > kMaxBytes) {
    size_t end = kMaxBytes;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    shown = text.substr(0, end);
  }
  std::string out;
  for (char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02X", byte);
    } else {
      out.push_back(c);
    }
  }
  if (shown.size() < text.size()) absl::StrAppend(&out, "\u2026(", text.size(), " bytes)");
  return out;
}

const FlagUse* FindFlag(const Command& command, const std::string& name) {
  for (const FlagGroup& group : command.flag_groups) {
    for (const FlagUse& use : group.flags) {
      if (use.name == name || use.spelled == name) return &use;
    }
  }
  return nullptr;
}

bool TakesInputs(const Command& command) { return FindFlag(command, "text") != nullptr; }

int UsageError(const std::string& message, const Command* command) {
  std::fprintf(stderr, "attnctl: %s\n", message.c_str());
  if (command != nullptr) {
    std::fprintf(stderr, "Run 'attnctl %s --help' for usage.\n", command->name.c_str());
  } else {
    std::fprintf(stderr, "Run 'attnctl --help' for usage.\n");
  }
  return kExitUsage;
}

const Command* FindCommand(const std::vector<CommandGroup>& table, const std::string& name) {
  for (const CommandGroup& group : table) {
    for (const Command& command : group.commands) {
      if (command.name == name) return &command;
    }
  }
  return nullptr;
}

std::string CommandHelp(const Command& command) {
  std::string out = absl::StrCat("attnctl ", command.name, ": ", command.summary,
                                 "\n\nUsage: ", command.usage, "\n\n", command.description);
  for (const FlagGroup& group : command.flag_groups) {
    absl::StrAppend(&out, "\n", FlagGroupHelp(group));
  }
  if (!command.examples.empty()) absl::StrAppend(&out, "\nExamples:\n", command.examples);
  return out;
}

std::string CommandListHelp(const std::vector<CommandGroup>& table,
                            const std::vector<FlagGroup>& common) {
  std::string out;
  for (const CommandGroup& group : table) {
    size_t width = 0;
    for (const Command& command : group.commands) width = std::max(width, command.name.size());
    absl::StrAppend(&out, group.title, ":\n");
    for (const Command& command : group.commands) {
      absl::StrAppend(&out, "  ", command.name, std::string(width + 2 - command.name.size(), ' '),
                      command.summary, "\n");
    }
    out.push_back('\n');
  }
  for (const FlagGroup& group : common) absl::StrAppend(&out, FlagGroupHelp(group), "\n");
  return out;
}

namespace {

std::vector<std::string>& Arguments() {
  static std::vector<std::string>* arguments = new std::vector<std::string>();
  return *arguments;
}

// The flags the command line set (underscored names), for FlagGiven.
std::set<std::string>& GivenFlags() {
  static std::set<std::string>* given = new std::set<std::string>();
  return *given;
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbours ("txet") each cost 1.
int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate `typed` is most likely a typo of ("txt" -> "text"), or "" when none is close:
// at most a third of the name's letters wrong (at least one), and the closest by a margin.
std::string Closest(const std::string& typed, const std::vector<std::string>& candidates) {
  if (typed.size() > 64) return "";  // no name is that long: not a typo, and slow to compare
  std::string best;
  int best_distance = 0, ties = 0;
  for (const std::string& candidate : candidates) {
    const int distance = EditDistance(typed, candidate);
    const int allowed = std::max<int>(1, static_cast<int>(candidate.size()) / 3);
    if (distance > allowed || distance >= static_cast<int>(candidate.size())) continue;
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
      ties = 0;
    } else if (distance == best_distance && candidate != best) {
      ++ties;
    }
  }
  return ties == 0 ? best : "";
}

// The flags `command` takes (every command's when null), as typed: underscored.
std::vector<std::string> FlagNames(const std::vector<CommandGroup>& table, const Command* command) {
  std::vector<std::string> names;
  for (const CommandGroup& group : table) {
    for (const Command& c : group.commands) {
      if (command != nullptr && &c != command) continue;
      for (const FlagGroup& flags : c.flag_groups) {
        for (const FlagUse& use : flags.flags) {
          names.push_back(use.spelled.empty() ? use.name : use.spelled);
        }
      }
    }
  }
  return names;
}

// "unknown flag --txt; did you mean --text?"
std::string UnknownFlag(const std::vector<CommandGroup>& table, const Command* command,
                        const std::string& name) {
  std::string guess = Closest(name, FlagNames(table, command));
  if (guess.empty() && command != nullptr) guess = Closest(name, FlagNames(table, nullptr));
  return absl::StrCat("unknown flag --", Shortened(name),
                      guess.empty() ? "" : absl::StrCat("; did you mean --", Dashed(guess), "?"));
}

// "unknown command 'encod'; did you mean 'encode'?"
std::string UnknownCommand(const std::vector<CommandGroup>& table, absl::string_view name) {
  std::vector<std::string> names;
  for (const CommandGroup& group : table) {
    for (const Command& c : group.commands) names.push_back(c.name);
  }
  const std::string guess = Closest(std::string(name), names);
  return absl::StrCat("unknown command '", Shortened(name), "'",
                      guess.empty() ? "" : absl::StrCat("; did you mean '", guess, "'?"));
}

// "missing command (encode, attention, ... or report)"
std::string MissingCommand(const std::vector<CommandGroup>& table) {
  std::vector<std::string> names;
  for (const CommandGroup& group : table) {
    for (const Command& c : group.commands) names.push_back(c.name);
  }
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat("missing command (", absl::StrJoin(names, ", "), " or ", last, ")");
}

// Reads the command line, word by word; each step either succeeds or leaves the message of the
// usage error in error_.
class LineParser {
 public:
  LineParser(const std::vector<CommandGroup>& table, int argc, char** argv, CommandLine* line)
      : table_(table), argc_(argc), argv_(argv), line_(line) {
    // The command's own spelling of a builtin's name (rollback: --version V) wins over the
    // builtin, wherever the command stands on the line.
    for (int i = 1; i < argc && named_ == nullptr; ++i) {
      if (absl::string_view(argv[i]) == "--") break;
      if (argv[i][0] != '-') named_ = FindCommand(table, argv[i]);
    }
  }

  bool Parse() {
    for (int i = 1; i < argc_; ++i) {
      const absl::string_view arg = argv_[i];
      if (arg == "--") {
        if (i + 1 < argc_) {
          return Fail(absl::StrCat("unexpected argument '", Shortened(argv_[i + 1]),
                                   "'; give texts with --text or on stdin"));
        }
        break;
      }
      const bool ok = arg.empty() || arg[0] != '-' || arg == "-" ? Word(arg) : Flag(arg, &i);
      if (!ok) return false;
    }
    if (command_ == nullptr) return Fail(MissingCommand(table_));
    for (const FlagUse* use : seen_) {
      if (FindFlag(*command_, use->name) == nullptr) {
        return Fail(
            absl::StrCat("flag --", use->name, " does not apply to '", command_->name, "'"));
      }
    }
    line_->command = command_;
    return true;
  }

  const std::string& error() const { return error_; }
  const Command* command() const { return command_; }

 private:
  bool Fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  // The command's name, or one of its arguments.
  bool Word(absl::string_view arg) {
    if (command_ == nullptr) {
      command_ = FindCommand(table_, std::string(arg));
      return command_ != nullptr || Fail(UnknownCommand(table_, arg));
    }
    if (static_cast<int>(Arguments().size()) < command_->max_arguments) {
      Arguments().emplace_back(arg);
      return true;
    }
    if (command_->max_arguments > 0) {
      return Fail(
          absl::StrCat("unexpected argument '", Shortened(arg), "'; usage: ", command_->usage));
    }
    return Fail(TakesInputs(*command_)
                    ? absl::StrCat("unexpected argument '", Shortened(arg),
                                   "'; give texts with --text or on stdin")
                    : absl::StrCat("unexpected argument '", Shortened(arg), "'; '", command_->name,
                                   "' takes flags only"));
  }

  // A flag (with its value: the next word, *i advanced, unless "--name=value" or a boolean).
  bool Flag(absl::string_view arg, int* i) {
    const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = Underscored(body.substr(0, eq));
    const bool has_value = eq != absl::string_view::npos;
    const bool claimed = named_ != nullptr && FindFlag(*named_, name) != nullptr;
    if (!claimed && IsAbseilBuiltinFlag(name)) {
      line_->abseil_args.push_back(absl::StrCat("--", name, has_value ? body.substr(eq) : ""));
      if (!has_value && !IsAbseilSwitch(name) && *i + 1 < argc_) {
        line_->abseil_args.push_back(argv_[++*i]);  // "--flagfile PATH"
      }
      return true;
    }
    // The command's own use of the flag (whether it repeats, say), else any command's: a flag
    // another command takes is reported as not applying once the command is known.
    const FlagUse* use = claimed ? FindFlag(*named_, name) : FindFlagInTable(table_, name);
    bool negated = false;
    if (use == nullptr && absl::StartsWith(name, "no") && !has_value) {
      // "--nojson" negates a boolean flag.
      const FlagUse* positive = FindFlagInTable(table_, name.substr(2));
      if (positive != nullptr && absl::FindCommandLineFlag(positive->name)->IsOfType<bool>()) {
        use = positive;
        negated = true;
      }
    }
    absl::CommandLineFlag* flag = use != nullptr ? absl::FindCommandLineFlag(use->name) : nullptr;
    if (flag == nullptr) return Fail(UnknownFlag(table_, command_ ? command_ : named_, name));
    seen_.push_back(use);
    const std::string shown = negated ? name.substr(2) : name;
    std::string value;
    if (has_value) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (*i + 1 < argc_) {
      value = argv_[++*i];
    } else {
      return Fail(absl::StrCat("flag --", shown, " needs a value"));
    }
    return Set(use, flag, shown, value);
  }

  bool Set(const FlagUse* use, absl::CommandLineFlag* flag, const std::string& shown,
           std::string value) {
    if (use->repeatable &&
        std::count(seen_.begin(), seen_.end() - 1, use) > 0) {  // an earlier occurrence
      value = absl::StrCat(flag->CurrentValue(), std::string(1, kRepeatedFlagSeparator), value);
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return Fail(absl::StrCat("invalid value '", Shortened(value), "' for --", shown, ": ",
                               Shortened(error)));
    }
    GivenFlags().insert(use->name);
    return true;
  }

  const std::vector<CommandGroup>& table_;
  const int argc_;
  char** const argv_;
  CommandLine* const line_;
  const Command* named_ = nullptr;
  const Command* command_ = nullptr;
  std::vector<const FlagUse*> seen_;  // checked against the command once it is known
  std::string error_;
};

}  // namespace

const std::vector<std::string>& CommandArguments() { return Arguments(); }

bool FlagGiven(const std::string& name) { return GivenFlags().count(name) > 0; }

bool ParseCommandLine(const std::vector<CommandGroup>& table, int argc, char** argv,
                      CommandLine* line, int* exit_code) {
  LineParser parser(table, argc, argv, line);
  if (parser.Parse()) return true;
  *exit_code = UsageError(parser.error(), parser.command());
  return false;
}

}  // namespace attn::client::attnctl
