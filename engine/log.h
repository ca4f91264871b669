// The project's one small logger. Debian's Abseil (20220623) has no absl/log, so every
// binary and library logs through this: a level filter and one line per message on stderr.
#pragma once

#include <string_view>

#include "absl/strings/str_format.h"

namespace attn {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default: kInfo.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning", "error"; returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

void LogMessage(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& format, const Args&... args) {
  if (level < GetLogLevel()) return;
  LogMessage(level, absl::StrFormat(format, args...));
}

}  // namespace attn
