// Command-line helpers shared by every binary.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

// Start-up shared by every binary: the usage text, --help listing this project's flags,
// --version, both flag spellings. Parses the command line and returns the positional
// arguments (argv[0] first); --help, --version and flag errors exit as Abseil does.
inline std::vector<char*> StartProgram(int argc, char** argv, const char* program,
                                       const char* usage) {
  absl::SetProgramUsageMessage(usage);
  ShowProjectFlagsInHelp(ProgramVersion(program));
  AcceptDashedFlagNames(argc, argv);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace attn
