#include "client/attnctl/command_line.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
}  // namespace

const std::vector<std::string>& CommandArguments() { return Arguments(); }

bool ParseCommandLine(const std::vector<CommandGroup>& table, int argc, char** argv,
                      CommandLine* line, int* exit_code) {
  const Command* command = nullptr;
  // The command's own spelling of a builtin's name (rollback: --version V) wins over the
  // builtin, wherever the command stands on the line.
  const Command* named = nullptr;
  for (int i = 1; i < argc && named == nullptr; ++i) {
    if (absl::string_view(argv[i]) == "--") break;
    if (argv[i][0] != '-') named = FindCommand(table, argv[i]);
  }
  auto fail = [&](const std::string& message, const Command* for_command) {
    *exit_code = UsageError(message, for_command);
    return false;
  };
  std::vector<const FlagUse*> seen;  // checked against the command once it is known
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return fail(absl::StrCat("unexpected argument '", argv[i + 1],
                                 "'; give texts with --text or on stdin"),
                    nullptr);
      }
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") {
      if (command == nullptr) {
        command = FindCommand(table, std::string(arg));
        if (command == nullptr) return fail(absl::StrCat("unknown command '", arg, "'"), nullptr);
        continue;
      }
      if (static_cast<int>(Arguments().size()) < command->max_arguments) {
        Arguments().emplace_back(arg);
        continue;
      }
      if (command->max_arguments > 0) {
        return fail(absl::StrCat("unexpected argument '", arg, "'; usage: ", command->usage),
                    command);
      }
      return fail(TakesInputs(*command) ? absl::StrCat("unexpected argument '", arg,
                                                       "'; give texts with --text or on stdin")
                                        : absl::StrCat("unexpected argument '", arg, "'; '",
                                                       command->name, "' takes flags only"),
                  command);
    }
    const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = Underscored(body.substr(0, eq));
    const bool has_value = eq != absl::string_view::npos;
    const bool claimed = named != nullptr && FindFlag(*named, name) != nullptr;
    if (!claimed && IsAbseilBuiltinFlag(name)) {
      line->abseil_args.push_back(absl::StrCat("--", name, has_value ? body.substr(eq) : ""));
      if (!has_value && !IsAbseilSwitch(name) && i + 1 < argc) {
        line->abseil_args.push_back(argv[++i]);  // "--flagfile PATH"
      }
      continue;
    }
    // The command's own use of the flag (whether it repeats, say), else any command's: a flag
    // another command takes is reported as not applying once the command is known.
    const FlagUse* use = claimed ? FindFlag(*named, name) : FindFlagInTable(table, name);
    bool negated = false;
    if (use == nullptr && absl::StartsWith(name, "no") && !has_value) {
      // "--nojson" negates a boolean flag.
      const FlagUse* positive = FindFlagInTable(table, name.substr(2));
      if (positive != nullptr && absl::FindCommandLineFlag(positive->name)->IsOfType<bool>()) {
        use = positive;
        negated = true;
      }
    }
    absl::CommandLineFlag* flag = use != nullptr ? absl::FindCommandLineFlag(use->name) : nullptr;
    if (flag == nullptr) return fail(absl::StrCat("unknown flag --", name), command);
    seen.push_back(use);
    const std::string shown = negated ? name.substr(2) : name;
    std::string value;
    if (has_value) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return fail(absl::StrCat("flag --", shown, " needs a value"), command);
    }
    if (use->repeatable &&
        std::count(seen.begin(), seen.end() - 1, use) > 0) {  // an earlier occurrence
      value = absl::StrCat(flag->CurrentValue(), std::string(1, kRepeatedFlagSeparator), value);
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return fail(absl::StrCat("invalid value '", value, "' for --", shown, ": ", error), command);
    }
  }
  if (command == nullptr) {
    std::vector<std::string> names;
    for (const CommandGroup& group : table) {
      for (const Command& c : group.commands) names.push_back(c.name);
    }
    const std::string last = names.back();
    names.pop_back();
    return fail(absl::StrCat("missing command (", absl::StrJoin(names, ", "), " or ", last, ")"),
                nullptr);
  }
  for (const FlagUse* use : seen) {
    if (FindFlag(*command, use->name) == nullptr) {
      return fail(absl::StrCat("flag --", use->name, " does not apply to '", command->name, "'"),
                  command);
    }
  }
  line->command = command;
  return true;
}

}  // namespace attn::client::attnctl
