// Shared by the fuzz targets: an invariant check that crashes loudly (the fuzzer then saves the
// input).
#pragma once

#include <cstdio>
#include <cstdlib>

// A broken invariant is a bug even when no sanitizer notices it: report it and abort so
// libFuzzer records the input as a crash.
#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fputc('\n', stderr);                                                          \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
