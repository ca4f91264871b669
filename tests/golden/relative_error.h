// Relative error for attribution parity: worst |ours - ref| / max(|ref|, 0.05 max|ref|) over the
// entries (small entries are judged against 5% of the largest, so near-zero values do not turn
// rounding into huge relative errors). Shared by the engine's and the RPC's parity tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace attn::testing {

inline double WorstRelative(const std::vector<float>& ours, const std::vector<float>& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double max_ref = 0;
  for (float v : ref) max_ref = std::max(max_ref, std::fabs(static_cast<double>(v)));
  double worst = 0;
  for (size_t i = 0; i < std::min(ours.size(), ref.size()); ++i) {
    const double scale = std::max(std::fabs(static_cast<double>(ref[i])), 0.05 * max_ref);
    worst = std::max(worst, std::fabs(static_cast<double>(ours[i]) - ref[i]) / scale);
  }
  return worst;
}

}  // namespace attn::testing
