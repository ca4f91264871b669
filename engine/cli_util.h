// Command-line helpers shared by every binary.
#pragma once

#include <cstring>

namespace attn {

// Abseil flags are named with underscores; users type dashes (--model-dir). Rewrites the name
// part of every "--some-flag[=value]" argument in place so both spellings work. Stops at "--".
inline void AcceptDashedFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) return;
    if (arg[0] != '-') continue;
    char* name = arg + (arg[1] == '-' ? 2 : 1);
    for (char* c = name; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

}  // namespace attn
