// Command-line helpers shared by every binary.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace attn {

// Abseil flags are named with underscores; users type dashes (--model-dir). Rewrites the name
// part of every "--some-flag[=value]" argument in place so both spellings work. Stops at "--".
inline void AcceptDashedFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) return;
    // Only "--name" arguments: a separate value such as "-a-b" must stay as typed.
    if (arg[0] != '-' || arg[1] != '-') continue;
    char* name = arg + 2;
    for (char* c = name; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

// Abseil's --help lists only flags defined in a file named like the binary; ours live in
// main.cc and friends. Show every flag of this project (not Abseil's own) instead.
inline void ShowProjectFlagsInHelp(const std::string& version) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view path) {
    return !absl::StrContains(path, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [version] { return version + "\n"; };
  absl::SetFlagsUsageConfig(config);
}

// "<program> <version>", the version being CMake's project(VERSION): the attn_version target
// defines ATTN_VERSION for the binaries that link it.
inline std::string ProgramVersion(const char* program) {
#ifndef ATTN_VERSION
#error "link the attn_version target (it defines ATTN_VERSION)"
#endif
  return absl::StrCat(program, " ", ATTN_VERSION);
}

// `text` wrapped at `width` columns, every line indented by `indent` spaces.
inline std::string WrapText(const std::string& text, int indent, int width = 80) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > static_cast<size_t>(width)) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

// The --help text: `usage`, then every flag of this project (not Abseil's own) sorted by name,
// spelled with dashes, with its default and help. Abseil's own listing groups flags by the
// source file that defines them (a build path) and spells them with underscores.
inline std::string ProjectFlagsHelp(const char* program, const char* usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "absl/")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string text = absl::StrCat(program, ": ", usage,
                                  "\n\nFlags (--name=value or --name value; dashes or "
                                  "underscores):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string name = absl::StrReplaceAll(flag->Name(), {{"_", "-"}});
    std::string default_value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) default_value = absl::StrCat("\"", default_value, "\"");
    absl::StrAppend(&text, "  --", name, "  (default: ", default_value, ")\n",
                    WrapText(flag->Help(), 6));
  }
  absl::StrAppend(&text, "\n  --help     this text\n  --version  the program's version\n");
  return text;
}

// Start-up shared by every binary: the usage text, --help listing this project's flags,
// --version, both flag spellings. Parses the command line and returns the positional
// arguments (argv[0] first); --help, --version and flag errors exit as Abseil does.
inline std::vector<char*> StartProgram(int argc, char** argv, const char* program,
                                       const char* usage) {
  absl::SetProgramUsageMessage(usage);
  ShowProjectFlagsInHelp(ProgramVersion(program));
  // --help is an answer, not an error: print the listing on stdout and exit 0.
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull" ||
        arg == "--helpshort") {
      std::fputs(ProjectFlagsHelp(program, usage).c_str(), stdout);
      std::exit(0);
    }
  }
  AcceptDashedFlagNames(argc, argv);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace attn
