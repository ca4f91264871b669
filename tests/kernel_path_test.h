// A fixture that runs each test body on every kernel family an op has: the AVX-512 kernels, the
// AVX2 ones (each when the CPU has them; ops without an AVX2 kernel run their portable loops
// there) and the portable loops. Instantiate with ATTN_INSTANTIATE_KERNEL_PATHS(Fixture).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "engine/ops/cpu_kernels.h"
#include "tests/test_policy.h"

namespace attn::testing {

enum class KernelPath { kAvx512, kAvx2, kPortable };

class KernelPathTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    // CPU detection first, with every family on: a variant would silently run another path on a
    // CPU without its ISA.
    SetAvx512KernelsEnabledForTesting(true);
    SetAvx2KernelsEnabledForTesting(true);
    if (GetParam() == KernelPath::kAvx512) ATTN_SKIP_UNLESS_CPU_HAS("Avx512", UseAvx512Kernels());
    if (GetParam() == KernelPath::kAvx2) ATTN_SKIP_UNLESS_CPU_HAS("Avx2", UseAvx2Kernels());
    SetAvx512KernelsEnabledForTesting(GetParam() == KernelPath::kAvx512);
    SetAvx2KernelsEnabledForTesting(GetParam() == KernelPath::kAvx2);
  }
  void TearDown() override {
    SetAvx512KernelsEnabledForTesting(true);
    SetAvx2KernelsEnabledForTesting(true);
  }
};

// The test name suffix: the ISA gate reads "Avx512" and "Avx2" in it.
inline std::string KernelPathName(const ::testing::TestParamInfo<KernelPath>& info) {
  return info.param == KernelPath::kAvx512 ? "Avx512"
         : info.param == KernelPath::kAvx2 ? "Avx2"
                                           : "Portable";
}

}  // namespace attn::testing

#define ATTN_INSTANTIATE_KERNEL_PATHS(fixture)                                                    \
  INSTANTIATE_TEST_SUITE_P(                                                                       \
      Paths, fixture,                                                                             \
      ::testing::Values(::attn::testing::KernelPath::kAvx512, ::attn::testing::KernelPath::kAvx2, \
                        ::attn::testing::KernelPath::kPortable),                                  \
      ::attn::testing::KernelPathName)
