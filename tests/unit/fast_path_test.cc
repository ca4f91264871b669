// The inference fast path's kernels against naive double-precision loops: packed attention over
// variable-length sequences (AVX-512, AVX2 and portable code; the bf16 products on AMX tiles and
// AVX-512 BF16 pairs), LayerNorm with the residual fused, and the prepared fp32 (view, packed)
// linear layers. The int8 row kernels and attention products are in int8_kernels_test.cc, the
// int8 linear layers in precision_encoder_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/half.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/ops/fused_attention.h"
#include "engine/ops/prepared_linear.h"
#include "engine/ops/relative_position_bias.h"
#include "engine/tensor.h"
#include "tests/kernel_path_test.h"
#include "tests/test_policy.h"
#include "tests/test_util.h"

namespace attn {
namespace {

using testing::MaxAbsDiff;
using testing::RandomTensor;

using testing::KernelPath;
using testing::KernelPathTest;

TEST_P(KernelPathTest, PackedAttentionMatchesNaivePerSequence) {
  // Lengths straddle the kernels' 8-row and 16/32-column blocks; head_dim 24 and 40 exercise
  // the masked column tails.
  for (const int64_t d : {int64_t{32}, int64_t{24}, int64_t{40}}) {
    const int64_t heads = 3, H = heads * d;
    const std::vector<int64_t> lengths = {1, 7, 8, 17, 33, 70};
    std::vector<int64_t> offsets = {0};
    for (int64_t T : lengths) offsets.push_back(offsets.back() + T);
    const int64_t M = offsets.back();
    std::mt19937 rng(static_cast<uint32_t>(d));
    const Tensor qkv = RandomTensor({M, 3 * H}, rng, 2.0f);
    Tensor context({M, H});
    std::vector<Tensor> probs, scores;
    PackedAttentionOutputs outputs;
    for (int64_t T : lengths) {
      probs.emplace_back(std::vector<int64_t>{heads, T, T});
      scores.emplace_back(std::vector<int64_t>{heads, T, T});
    }
    for (size_t b = 0; b < lengths.size(); ++b) {
      outputs.probs.push_back(probs[b].data());
      // Scores for every other sequence only: null entries must be skipped.
      outputs.scores.push_back(b % 2 == 0 ? scores[b].data() : nullptr);
    }
    PackedAttentionForward({heads, d}, qkv.data(), offsets, context.data(), &outputs);

    std::vector<double> ref_context(M * H);
    for (size_t b = 0; b < lengths.size(); ++b) {
      const int64_t T = lengths[b];
      const float* seq = qkv.data() + offsets[b] * 3 * H;
      const testing::NaiveAttentionResult ref = testing::NaiveAttention(seq, T, heads, d, 3 * H);
      const std::vector<double>&ref_scores = ref.scores, &ref_probs = ref.probs;
      std::copy(ref.context.begin(), ref.context.end(), ref_context.begin() + offsets[b] * H);
      EXPECT_LT(MaxAbsDiff(probs[b].data(), ref_probs), 2e-6) << "d " << d << " T " << T;
      if (b % 2 == 0) {
        EXPECT_LT(MaxAbsDiff(scores[b].data(), ref_scores), 2e-5) << "d " << d << " T " << T;
      } else {
        for (int64_t i = 0; i < scores[b].numel(); ++i) ASSERT_EQ(scores[b].data()[i], 0.0f);
      }
    }
    EXPECT_LT(MaxAbsDiff(context.data(), ref_context), 2e-5) << "d " << d;

    // Without outputs the context is the same.
    Tensor context_only({M, H});
    PackedAttentionForward({heads, d}, qkv.data(), offsets, context_only.data(), nullptr);
    EXPECT_LT(MaxAbsDiff(context_only.data(), ref_context), 2e-5);
  }
}

// MPNet's relative position bias: every kernel adds bias[h][bucket(j - i)] to the scaled scores
// before the softmax (the returned scores include it), with the bias built for the longest
// sequence and read by the shorter ones. Lengths reach past the 128 max distance.
TEST_P(KernelPathTest, PackedAttentionAddsTheRelativePositionBias) {
  const int64_t heads = 3, d = 24, H = heads * d;
  const std::vector<int64_t> lengths = {1, 9, 33, 150};
  std::vector<int64_t> offsets = {0};
  for (int64_t T : lengths) offsets.push_back(offsets.back() + T);
  const int64_t M = offsets.back();
  std::mt19937 rng(7);
  const Tensor qkv = RandomTensor({M, 3 * H}, rng, 2.0f);
  const Tensor table = RandomTensor({32, heads}, rng, 3.0f);  // (buckets, heads)
  const RelativePositionBias bias = RelativePositionBiasForward(table, 150);
  PackedAttentionShape shape{heads, d};
  shape.relative_bias = &bias;
  std::vector<Tensor> probs, scores;
  PackedAttentionOutputs outputs;
  for (int64_t T : lengths) {
    probs.emplace_back(std::vector<int64_t>{heads, T, T});
    scores.emplace_back(std::vector<int64_t>{heads, T, T});
    outputs.probs.push_back(probs.back().data());
    outputs.scores.push_back(scores.back().data());
  }
  Tensor context({M, H});
  PackedAttentionForward(shape, qkv.data(), offsets, context.data(), &outputs);

  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t T = lengths[b];
    const float* seq = qkv.data() + offsets[b] * 3 * H;
    double worst_scores = 0, worst_probs = 0, worst_context = 0;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T);
        double max = -1e300;
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += double{seq[i * 3 * H + h * d + c]} * seq[j * 3 * H + H + h * d + c];
          }
          s[j] =
              dot / std::sqrt(double(d)) + table.data()[RelativePositionBucket(j - i) * heads + h];
          worst_scores =
              std::max(worst_scores, std::abs(s[j] - scores[b].data()[(h * T + i) * T + j]));
          max = std::max(max, s[j]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - max));
        for (int64_t c = 0; c < d; ++c) {
          double ctx = 0;
          for (int64_t j = 0; j < T; ++j) ctx += s[j] / sum * seq[j * 3 * H + 2 * H + h * d + c];
          worst_context = std::max(
              worst_context, std::abs(ctx - context.data()[(offsets[b] + i) * H + h * d + c]));
        }
        for (int64_t j = 0; j < T; ++j) {
          worst_probs =
              std::max(worst_probs, std::abs(s[j] / sum - probs[b].data()[(h * T + i) * T + j]));
        }
      }
    }
    EXPECT_LT(worst_scores, 2e-5) << "T " << T;
    EXPECT_LT(worst_probs, 2e-6) << "T " << T;
    EXPECT_LT(worst_context, 2e-5) << "T " << T;
  }
}

// bf16_products: P is rounded to bfloat16 before P V (the AVX-512 path rounds the unnormalised
// exponentials, the portable one the probabilities: one bf16 step apart at most). The context is
// checked against a double reference that multiplies V by bf16(P), with a bound of two bf16 steps
// of sum_j P_j |V_j|, and must differ from the fp32 context (the rounding happened); the returned
// probabilities stay the fp32 ones. Q, K and V are bfloat16 values, as the encoder rounds them
// (on CPUs with AVX-512 BF16 the Avx512 variant runs the native bf16 products,
// engine/ops/bf16_attention.cc).
TEST_P(KernelPathTest, PackedAttentionWithBf16ProductsRoundsTheProbabilities) {
  const int64_t heads = 2, d = 32, H = heads * d;
  const std::vector<int64_t> lengths = {5, 19, 40};
  std::vector<int64_t> offsets = {0};
  for (int64_t T : lengths) offsets.push_back(offsets.back() + T);
  const int64_t M = offsets.back();
  std::mt19937 rng(5);
  Tensor qkv = RandomTensor({M, 3 * H}, rng, 1.0f);
  RoundFloatsToBFloat16(qkv.data(), qkv.numel(), qkv.data());
  Tensor context({M, H}), fp32_context({M, H});
  std::vector<Tensor> probs;
  PackedAttentionOutputs outputs;
  for (int64_t T : lengths) {
    probs.emplace_back(std::vector<int64_t>{heads, T, T});
    outputs.probs.push_back(probs.back().data());
  }
  PackedAttentionShape shape{heads, d};
  PackedAttentionForward(shape, qkv.data(), offsets, fp32_context.data(), nullptr);
  shape.bf16_products = true;
  PackedAttentionForward(shape, qkv.data(), offsets, context.data(), &outputs);
  auto bf16 = [](double v) {
    return double{BFloat16BitsToFloat(FloatToBFloat16Bits(static_cast<float>(v)))};
  };
  double worst_excess = 0, rounding_effect = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t T = lengths[b];
    const float* seq = qkv.data() + offsets[b] * 3 * H;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(T);
        double max = -1e300, sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < d; ++k) {
            dot += double{seq[i * 3 * H + h * d + k]} * seq[j * 3 * H + H + h * d + k];
          }
          p[j] = dot / std::sqrt(double(d));
          max = std::max(max, p[j]);
        }
        for (int64_t j = 0; j < T; ++j) sum += (p[j] = std::exp(p[j] - max));
        for (int64_t j = 0; j < T; ++j) {
          p[j] /= sum;
          ASSERT_NEAR(probs[b].data()[(h * T + i) * T + j], p[j], 2e-6);
        }
        for (int64_t k = 0; k < d; ++k) {
          double expected = 0, magnitude = 0;
          for (int64_t j = 0; j < T; ++j) {
            const double v = seq[j * 3 * H + 2 * H + h * d + k];
            expected += bf16(p[j]) * v;
            magnitude += p[j] * std::fabs(v);
          }
          const int64_t at = (offsets[b] + i) * H + h * d + k;
          const double error = std::fabs(context.data()[at] - expected);
          worst_excess = std::max(worst_excess, error - (2e-5 + magnitude / 128.0));
          rounding_effect = std::max(
              rounding_effect, double{std::fabs(context.data()[at] - fp32_context.data()[at])});
        }
      }
    }
  }
  EXPECT_LE(worst_excess, 0.0);
  EXPECT_GT(rounding_effect, 1e-5) << "the probabilities were not rounded";
}

// The bf16 attention kernels (AMX tiles, AVX-512 BF16 pairs) against their formula in double:
// scores = Q K^T / sqrt(d) + bias with Q, K already bfloat16 values (the products exact, the
// sums fp32), e = exp(scores - max), context = sum_j bfloat16(e_j) V_j / sum_j e_j. Lengths
// straddle the 16-row and 32-key tiles, head_dim 32 and 64 (the AMX kernel's), one head
// relative-position-biased as MPNet's.
enum class Bf16AttentionKernel { kAmx, kAvx512Bf16 };

class Bf16AttentionKernelTest : public ::testing::TestWithParam<Bf16AttentionKernel> {
 protected:
  void SetUp() override {
    if (GetParam() == Bf16AttentionKernel::kAmx) {
      ATTN_SKIP_UNLESS_CPU_HAS("AmxBf16", UseAmxBf16Kernels());
    } else {
      ATTN_SKIP_UNLESS_CPU_HAS("Avx512Bf16", UseAvx512Bf16Kernels());
    }
    SetAmxKernelsEnabledForTesting(GetParam() == Bf16AttentionKernel::kAmx);
  }
  void TearDown() override { SetAmxKernelsEnabledForTesting(true); }
};

TEST_P(Bf16AttentionKernelTest, MatchesTheRoundedFormulaInDouble) {
  for (const int64_t d : {int64_t{32}, int64_t{64}}) {
    SCOPED_TRACE(d);
    const int64_t heads = 2, H = heads * d;
    const std::vector<int64_t> lengths = {1, 15, 16, 17, 31, 33, 100, 130};
    std::vector<int64_t> offsets = {0};
    for (int64_t T : lengths) offsets.push_back(offsets.back() + T);
    const int64_t M = offsets.back();
    std::mt19937 rng(static_cast<uint32_t>(d));
    Tensor qkv = RandomTensor({M, 3 * H}, rng, 1.5f);
    RoundFloatsToBFloat16(qkv.data(), qkv.numel(), qkv.data());
    const Tensor table = RandomTensor({32, heads}, rng, 2.0f);
    const RelativePositionBias bias = RelativePositionBiasForward(table, 130);
    for (const bool biased : {false, true}) {
      PackedAttentionShape shape{heads, d, /*bf16_products=*/true};
      if (biased) shape.relative_bias = &bias;
      std::vector<Tensor> probs, scores;
      PackedAttentionOutputs outputs;
      for (int64_t T : lengths) {
        probs.emplace_back(std::vector<int64_t>{heads, T, T});
        scores.emplace_back(std::vector<int64_t>{heads, T, T});
        outputs.probs.push_back(probs.back().data());
        outputs.scores.push_back(scores.back().data());
      }
      Tensor context({M, H});
      PackedAttentionForward(shape, qkv.data(), offsets, context.data(), &outputs);
      for (size_t b = 0; b < lengths.size(); ++b) {
        const int64_t T = lengths[b];
        const float* seq = qkv.data() + offsets[b] * 3 * H;
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < T; ++i) {
            std::vector<double> e(T);
            double max = -1e300, sum = 0;
            for (int64_t j = 0; j < T; ++j) {
              double dot = 0;
              for (int64_t c = 0; c < d; ++c) {
                dot += double{seq[i * 3 * H + h * d + c]} * seq[j * 3 * H + H + h * d + c];
              }
              e[j] = dot / std::sqrt(double(d)) +
                     (biased ? table.data()[RelativePositionBucket(j - i) * heads + h] : 0.0);
              ASSERT_NEAR(scores[b].data()[(h * T + i) * T + j], e[j], 1e-5 * (1 + std::abs(e[j])))
                  << "T " << T << " row " << i << " key " << j;
              max = std::max(max, e[j]);
            }
            for (int64_t j = 0; j < T; ++j) sum += (e[j] = std::exp(e[j] - max));
            for (int64_t j = 0; j < T; ++j) {
              ASSERT_NEAR(probs[b].data()[(h * T + i) * T + j], e[j] / sum, 2e-6);
            }
            // The kernel's e_j is fp32 (within a few ulp of this one), so its bfloat16 rounding
            // is that of e_j (1 - 1e-6) or of e_j (1 + 1e-6): equal except on a rounding edge,
            // where either may be the kernel's.
            auto bf16 = [](double v) {
              return double{BFloat16BitsToFloat(FloatToBFloat16Bits(static_cast<float>(v)))};
            };
            for (int64_t c = 0; c < d; ++c) {
              double expected = 0, edge = 0, magnitude = 0;
              for (int64_t j = 0; j < T; ++j) {
                const double v = seq[j * 3 * H + 2 * H + h * d + c];
                const double low = bf16(e[j] * (1 - 1e-6)), high = bf16(e[j] * (1 + 1e-6));
                expected += low * v;
                edge += (high - low) * std::abs(v);
                magnitude += high * std::abs(v);
              }
              ASSERT_NEAR(context.data()[(offsets[b] + i) * H + h * d + c], expected / sum,
                          (edge + 1e-5 * magnitude + 1e-7) / sum)
                  << "T " << T << " row " << i << " channel " << c;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16AttentionKernelTest,
                         ::testing::Values(Bf16AttentionKernel::kAmx,
                                           Bf16AttentionKernel::kAvx512Bf16),
                         [](const ::testing::TestParamInfo<Bf16AttentionKernel>& info) {
                           return info.param == Bf16AttentionKernel::kAmx ? "Amx" : "Avx512Bf16";
                         });

TEST_P(KernelPathTest, AddLayerNormMatchesNaive) {
  for (const int64_t cols : {int64_t{384}, int64_t{37}}) {
    const int64_t rows = 9;
    std::mt19937 rng(static_cast<uint32_t>(cols));
    const Tensor x = RandomTensor({rows, cols}, rng, 3.0f);
    const Tensor residual = RandomTensor({rows, cols}, rng);
    const Tensor gamma = RandomTensor({cols}, rng), beta = RandomTensor({cols}, rng);
    const float eps = 1e-12f;
    std::vector<double> expected(rows * cols), expected_plain(rows * cols);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<double>& out = pass == 0 ? expected : expected_plain;
      for (int64_t m = 0; m < rows; ++m) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < cols; ++j) {
          mean += x.data()[m * cols + j] + (pass == 0 ? residual.data()[m * cols + j] : 0.0);
        }
        mean /= cols;
        for (int64_t j = 0; j < cols; ++j) {
          const double v =
              x.data()[m * cols + j] + (pass == 0 ? residual.data()[m * cols + j] : 0.0);
          var += (v - mean) * (v - mean);
        }
        var /= cols;
        for (int64_t j = 0; j < cols; ++j) {
          const double v =
              x.data()[m * cols + j] + (pass == 0 ? residual.data()[m * cols + j] : 0.0);
          out[m * cols + j] = (v - mean) / std::sqrt(var + eps) * gamma.data()[j] + beta.data()[j];
        }
      }
    }
    Tensor y({rows, cols});
    AddLayerNormRows(x.data(), residual.data(), rows, cols, gamma.data(), beta.data(), eps,
                     y.data());
    EXPECT_LT(MaxAbsDiff(y.data(), expected), 2e-5);
    // In place over the residual, as the encoder's int8 path uses it.
    Tensor in_place = residual;
    AddLayerNormRows(x.data(), in_place.data(), rows, cols, gamma.data(), beta.data(), eps,
                     in_place.data());
    EXPECT_LT(MaxAbsDiff(in_place.data(), expected), 2e-5);
    AddLayerNormRows(x.data(), nullptr, rows, cols, gamma.data(), beta.data(), eps, y.data());
    EXPECT_LT(MaxAbsDiff(y.data(), expected_plain), 2e-5);
    // With the bfloat16 copy (a bf16 matmul's input): each element y rounded to nearest even.
    std::vector<uint16_t> y_bf16(rows * cols);
    Tensor y_too({rows, cols});
    AddLayerNormRows(x.data(), residual.data(), rows, cols, gamma.data(), beta.data(), eps,
                     y_too.data(), y_bf16.data());
    EXPECT_LT(MaxAbsDiff(y_too.data(), expected), 2e-5);
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_EQ(y_bf16[i], FloatToBFloat16Bits(y_too.data()[i])) << i;
      ASSERT_NEAR(BFloat16BitsToFloat(y_bf16[i]), expected[i], 2e-5 + std::abs(expected[i]) / 256)
          << i;
    }
  }
}

ATTN_INSTANTIATE_KERNEL_PATHS(KernelPathTest);

TEST(MatmulRowsTest, PadsAtMostAnEighthWithFewShapes) {
  std::set<int64_t> shapes;
  for (int64_t rows = 1; rows <= 16384; ++rows) {
    const int64_t padded = MatmulRows(rows);
    ASSERT_GE(padded, rows);
    if (rows > 64) {
      ASSERT_LE(padded - rows, rows / 8) << rows;
    }
    ASSERT_EQ(MatmulRows(padded), padded) << rows;  // idempotent: padded sizes are buckets
    shapes.insert(padded);
  }
  EXPECT_LE(shapes.size(), 100u);
  EXPECT_EQ(MatmulRows(16), 16);
  EXPECT_EQ(MatmulRows(4096), 4096);
}

// The prepared linear layers against a double-precision x · W^T + b on the rows that matter.
TEST(PreparedLinearTest, PackedFp32MatchesNaive) {
  const int64_t K = 96, N = 80;
  std::mt19937 rng(11);
  const Tensor weight = RandomTensor({N, K}, rng, 0.1f), bias = RandomTensor({N}, rng);
  ExecContext ctx;
  for (const int64_t rows : {int64_t{1}, int64_t{13}, int64_t{100}}) {
    const int64_t mrows = MatmulRows(rows);
    Tensor x = RandomTensor({mrows, K}, rng);
    std::fill(x.data() + rows * K, x.data() + mrows * K, 0.0f);
    std::vector<double> expected(rows * N);
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double acc = bias.data()[n];
        for (int64_t k = 0; k < K; ++k)
          acc += double{x.data()[m * K + k]} * weight.data()[n * K + k];
        expected[m * N + n] = acc;
      }
    }
    for (const bool packed : {false, true}) {
      const PreparedLinear linear = packed ? PreparedLinear::Fp32Packed(weight, bias)
                                           : PreparedLinear::Fp32View(weight, bias);
      Tensor y({mrows, N});
      linear.Forward(ctx, x.data(), rows, LinearEpilogue::kNone, y.data());
      EXPECT_LT(MaxAbsDiff(y.data(), expected), 1e-4) << "rows " << rows << " packed " << packed;
    }
  }
}

}  // namespace
}  // namespace attn
