// What a green test run promises: every test that was compiled ran, except those whose name
// says which instruction set they need, on a CPU without it.
//
// A test may skip only through ATTN_SKIP_UNLESS_CPU_HAS: any other skip (GTEST_SKIP, a failed
// SetUpTestSuite, which GoogleTest reports as "skipped") is turned into a failure of that test,
// and the binary exits 1 (tests/test_main.cc). The ISA-gated tests that ran or were skipped are
// printed at the end and, when $ATTN_TEST_ISA_REPORT names a file, appended to it: scripts/test.sh
// lists them with the host's CPU flags.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace attn::testing {

// Marker printed for an ISA-gated skip (GoogleTest's "[  SKIPPED ]" follows, which ctest's rule
// for discovered tests counts as a skip).
inline constexpr char kIsaSkipMarker[] = "[ ISA-GATED SKIP ]";
// Every ISA-gated skip message starts with this.
inline constexpr char kIsaSkipPrefix[] = "needs CPU feature ";

// Whether the running test's full name (suite, test and parameter names) contains `isa_tag`,
// ignoring case.
bool CurrentTestNameHas(const std::string& isa_tag);

// Installs the listener that enforces the policy; call after InitGoogleTest.
void InstallTestPolicy();
// RUN_ALL_TESTS()'s result, or 1 if a test skipped without an ISA reason.
int FinishTestPolicy(int run_all_tests_result);

}  // namespace attn::testing

// Skips the current test when `host_has` is false. The test's name must contain `isa_tag`
// (e.g. "Avx512", "F16c"), so a reader of the test list knows what a skip here means.
#define ATTN_SKIP_UNLESS_CPU_HAS(isa_tag, host_has)                                           \
  do {                                                                                        \
    if (!(host_has)) {                                                                        \
      if (!::attn::testing::CurrentTestNameHas(isa_tag)) {                                    \
        FAIL() << "this test skips on CPUs without " << (isa_tag)                             \
               << ": its name must say so (contain \"" << (isa_tag) << "\")";                 \
      }                                                                                       \
      GTEST_SKIP() << ::attn::testing::kIsaSkipPrefix << (isa_tag) << ", absent on this CPU"; \
    }                                                                                         \
  } while (false)
