// A test's own time limits (a deadline, a wait for something to happen, a drain window) times
// $ATTN_TEST_TIME_SCALE (default 1): sanitizer builds run several times slower and
// scripts/sanitize.sh sets 4; a loaded machine may need 2-3. A limit that is a contract of the
// test, not of the code under test, stretches with it.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace attn::testing {

inline double TimeScale() {
  double scale = 1;
  if (const char* env = std::getenv("ATTN_TEST_TIME_SCALE"); env != nullptr && *env != '\0') {
    scale = std::strtod(env, nullptr);
    if (!(scale >= 1 && scale <= 100)) scale = 1;  // a typo must not shorten or void a limit
  }
  return scale;
}

inline std::chrono::seconds ScaledSeconds(int seconds) {
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(seconds * TimeScale())));
}

inline std::chrono::milliseconds ScaledMilliseconds(int milliseconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(milliseconds * TimeScale())));
}

}  // namespace attn::testing
