// The packed training attention (engine/ops/fused_attention.h: one parallel region over
// (sequence, head) items, hand-written kernels) against the per-sequence training attention
// (engine/ops/attention.h: oneDNN matmul and softmax primitives, an independent implementation)
// on ragged batches, with and without probability dropout, on every kernel path (AVX-512 and AVX2
// when the CPU has them, and the portable loops).
//
// The dropout masks must be bit-identical (same counters per sequence); probabilities, context
// and the gradients dQ, dK, dV must agree to max |got - want| / max |want| <= 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/ops/attention.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/ops/fused_attention.h"
#include "tests/test_policy.h"
#include "tests/test_util.h"

namespace attn {
namespace {

constexpr double kMaxRelError = 1e-5;

using testing::RandomVector;

// max |got - want| / max |want|; infinity if got has a non-finite element (e.g. left unwritten).
double RelError(const float* got, const float* want, int64_t n) {
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0.0 ? worst / scale : worst;
}

enum class KernelPath { kAvx512, kAvx2, kPortable };

struct PackedCase {
  std::vector<int64_t> lengths;
  int64_t heads;
  int64_t head_dim;
  float dropout_p;
  KernelPath path;
};

std::string CaseName(const ::testing::TestParamInfo<PackedCase>& info) {
  const PackedCase& c = info.param;
  std::string name;
  for (int64_t t : c.lengths) name += "T" + std::to_string(t);
  name += "_h" + std::to_string(c.heads) + "d" + std::to_string(c.head_dim);
  name += "_p" + std::to_string(static_cast<int>(c.dropout_p * 100));
  name += c.path == KernelPath::kAvx512 ? "_avx512"
          : c.path == KernelPath::kAvx2 ? "_avx2"
                                        : "_portable";
  return name;
}

class PackedAttentionTrainingTest : public ::testing::TestWithParam<PackedCase> {
 protected:
  void SetUp() override {
    const PackedCase& c = GetParam();
    SetAvx512KernelsEnabledForTesting(true);  // CPU detection
    SetAvx2KernelsEnabledForTesting(true);
    if (c.path == KernelPath::kAvx512) ATTN_SKIP_UNLESS_CPU_HAS("Avx512", UseAvx512Kernels());
    if (c.path == KernelPath::kAvx2) ATTN_SKIP_UNLESS_CPU_HAS("Avx2", UseAvx2Kernels());
    SetAvx512KernelsEnabledForTesting(c.path == KernelPath::kAvx512);
    SetAvx2KernelsEnabledForTesting(c.path == KernelPath::kAvx2);
  }
  void TearDown() override {
    SetAvx512KernelsEnabledForTesting(true);
    SetAvx2KernelsEnabledForTesting(true);
  }
};

TEST_P(PackedAttentionTrainingTest, MatchesPerSequenceAttention) {
  const PackedCase& c = GetParam();
  const int64_t heads = c.heads, d = c.head_dim, H = heads * d;
  const int64_t B = static_cast<int64_t>(c.lengths.size());
  std::vector<int64_t> offsets(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) offsets[b + 1] = offsets[b] + c.lengths[b];
  const int64_t M = offsets[B];
  const bool dropout = c.dropout_p > 0.0f;
  const uint64_t seed = 1234, base_offset = uint64_t{5} << 40;

  std::mt19937 rng(42 + static_cast<unsigned>(M));
  const std::vector<float> qkv = RandomVector(M * 3 * H, rng);
  const std::vector<float> dcontext = RandomVector(M * H, rng);

  // Reference: one AttentionForwardTraining / AttentionBackward per sequence, the counters of
  // sequence b starting after the earlier sequences' heads*T*T (as the encoder gave them).
  ExecContext ctx;
  std::vector<std::vector<float>> ref_probs(B), ref_dropped(B);
  std::vector<std::vector<uint8_t>> ref_masks(B);
  std::vector<float> ref_context(M * H), ref_dqkv(M * 3 * H);
  uint64_t offset = base_offset;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = c.lengths[b], n = heads * T * T;
    AttentionShape shape;
    shape.tokens = T;
    shape.heads = heads;
    shape.head_dim = d;
    shape.qkv_stride = 3 * H;
    shape.context_stride = H;
    ref_probs[b].resize(n);
    ref_dropped[b].resize(n);
    ref_masks[b].resize(n);
    const float* seq_qkv = qkv.data() + offsets[b] * 3 * H;
    AttentionForwardTraining(ctx, shape, seq_qkv, ref_probs[b].data(), ref_dropped[b].data(),
                             ref_masks[b].data(), c.dropout_p, seed, offset,
                             ref_context.data() + offsets[b] * H);
    std::vector<float> scratch(2 * n);
    AttentionBackward(
        ctx, shape, seq_qkv, ref_probs[b].data(), dropout ? ref_dropped[b].data() : nullptr,
        dropout ? ref_masks[b].data() : nullptr, c.dropout_p, dcontext.data() + offsets[b] * H,
        ref_dqkv.data() + offsets[b] * 3 * H, scratch.data());
    offset += n;
  }

  // Packed: outputs pre-filled with NaN so any element left unwritten fails the comparison.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> probs(B), dropped(B);
  std::vector<std::vector<uint8_t>> masks(B);
  PackedAttentionSaved saved;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = heads * c.lengths[b] * c.lengths[b];
    probs[b].assign(n, nan);
    saved.probs.push_back(probs[b].data());
    if (dropout) {
      dropped[b].assign(n, nan);
      masks[b].assign(n, 7);
      saved.probs_dropped.push_back(dropped[b].data());
      saved.masks.push_back(masks[b].data());
    }
  }
  PackedAttentionShape shape;
  shape.heads = heads;
  shape.head_dim = d;
  std::vector<float> context(M * H, nan), dqkv(M * 3 * H, nan);
  PackedAttentionForwardTraining(shape, qkv.data(), offsets, c.dropout_p, seed, base_offset, saved,
                                 context.data());
  PackedAttentionBackward(shape, qkv.data(), offsets, saved, c.dropout_p, dcontext.data(),
                          dqkv.data());

  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = heads * c.lengths[b] * c.lengths[b];
    EXPECT_LE(RelError(probs[b].data(), ref_probs[b].data(), n), kMaxRelError) << "probs " << b;
    if (dropout) {
      EXPECT_EQ(masks[b], ref_masks[b]) << "mask of sequence " << b;
      EXPECT_LE(RelError(dropped[b].data(), ref_dropped[b].data(), n), kMaxRelError)
          << "probs_dropped " << b;
    }
  }
  EXPECT_LE(RelError(context.data(), ref_context.data(), M * H), kMaxRelError) << "context";
  // dQ, dK and dV separately: each has its own scale.
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (int64_t m = 0; m < M; ++m) {
      const int64_t row = m * 3 * H + part * H;
      got.insert(got.end(), dqkv.begin() + row, dqkv.begin() + row + H);
      want.insert(want.end(), ref_dqkv.begin() + row, ref_dqkv.begin() + row + H);
    }
    EXPECT_LE(RelError(got.data(), want.data(), M * H), kMaxRelError) << "dqkv part " << part;
  }
}

std::vector<PackedCase> Cases() {
  const std::vector<std::vector<int64_t>> batches = {
      {64, 64, 64},          // the fine-tune benchmark's shape
      {1, 5, 17, 33, 2},     // short and ragged, tails of every kind
      {130, 7, 64, 16, 81},  // longer than a 64-row pass
  };
  std::vector<PackedCase> cases;
  for (KernelPath path : {KernelPath::kAvx512, KernelPath::kAvx2, KernelPath::kPortable}) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      for (const auto& lengths : batches) cases.push_back({lengths, 12, 32, p, path});
      cases.push_back({{9, 40, 3}, 3, 20, p, path});  // d not a multiple of 16 (or 8)
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(RaggedBatches, PackedAttentionTrainingTest, ::testing::ValuesIn(Cases()),
                         CaseName);

}  // namespace
}  // namespace attn
