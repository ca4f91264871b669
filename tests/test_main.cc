// main() of the unit, golden and client test binaries: GoogleTest's, plus the skip policy of
// tests/test_policy.h (a skip without an ISA reason fails the binary).
#include <gtest/gtest.h>

#include "tests/test_policy.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  attn::testing::InstallTestPolicy();
  return attn::testing::FinishTestPolicy(RUN_ALL_TESTS());
}
