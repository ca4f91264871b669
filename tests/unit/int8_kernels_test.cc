// The int8 kernels of the inference fast path against naive double-precision loops: the
// epilogues that dequantise a u8 x s8 matmul's accumulators (with the input's zero points and
// outliers corrected, and the next layer's input quantised on the spot) on the AVX-512, AVX2 and
// portable paths, and the int8 attention products (AVX-512 VNNI) against the quantisation
// formulas done naively.
#include "engine/ops/int8_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "engine/ops/cpu_kernels.h"
#include "engine/ops/fused_attention.h"
#include "engine/tensor.h"
#include "tests/kernel_path_test.h"
#include "tests/test_policy.h"
#include "tests/test_util.h"

namespace attn {
namespace {

using testing::MaxAbsDiff;
using testing::RandomTensor;

// Its own fixture class: this file shares a test binary with fast_path_test.cc, and gtest
// allows one instantiation of a suite per binary.
class Int8KernelPathTest : public testing::KernelPathTest {};

// The int8 epilogues of the current kernel path on `cols` columns against double precision.
void CheckInt8EpiloguesAgainstNaive(int64_t cols) {
  const int64_t rows = 5;
  std::mt19937 rng(9);
  std::vector<int32_t> acc(rows * cols);
  std::uniform_int_distribution<int32_t> acc_dist(-200000, 200000);
  for (int32_t& a : acc) a = acc_dist(rng);
  const Tensor row_scales = RandomTensor({rows}, rng, 1e-3f),
               col_scales = RandomTensor({cols}, rng, 1e-2f);
  const Tensor bias = RandomTensor({cols}, rng), residual = RandomTensor({rows, cols}, rng);
  const Tensor gamma = RandomTensor({cols}, rng), beta = RandomTensor({cols}, rng);
  const Int8Accumulators in{acc.data(), row_scales.data(), col_scales.data(), bias.data()};
  auto value = [&](int64_t m, int64_t j) {
    return static_cast<double>(acc[m * cols + j]) * row_scales.data()[m] * col_scales.data()[j] +
           bias.data()[j];
  };

  // Dequantise + bias.
  std::vector<double> expected(rows * cols);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < cols; ++j) expected[m * cols + j] = value(m, j);
  }
  Tensor y({rows, cols});
  DequantizeRows(in, rows, cols, y.data());
  EXPECT_LT(MaxAbsDiff(y.data(), expected), 1e-3);

  // + GELU.
  Tensor gelu_out({rows, cols});
  DequantizeGeluRows(in, rows, cols, gelu_out.data());
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = value(m, j);
      const double gelu = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
      ASSERT_NEAR(gelu_out.data()[m * cols + j], gelu, 1e-5 * (1 + std::abs(gelu)))
          << m << "," << j;
    }
  }

  // + residual + LayerNorm (in place over the residual, as the encoder uses it).
  Tensor out = residual;
  DequantizeAddLayerNormRows(in, out.data(), rows, cols, gamma.data(), beta.data(), 1e-12f,
                             out.data());
  for (int64_t m = 0; m < rows; ++m) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += value(m, j) + residual.data()[m * cols + j];
    mean /= cols;
    for (int64_t j = 0; j < cols; ++j) {
      const double v = value(m, j) + residual.data()[m * cols + j];
      var += (v - mean) * (v - mean);
    }
    var /= cols;
    for (int64_t j = 0; j < cols; ++j) {
      const double v = value(m, j) + residual.data()[m * cols + j];
      const double ln = (v - mean) / std::sqrt(var + 1e-12) * gamma.data()[j] + beta.data()[j];
      ASSERT_NEAR(out.data()[m * cols + j], ln, 1e-4 * (1 + std::abs(ln)));
    }
  }
}

// What an int8 epilogue must give for accumulators of quantised inputs with zero points and
// outliers (Int8Accumulators' corrections), in double: K inputs per row, `cols` outputs.
struct CorrectedInt8Case {
  int64_t rows, cols, K;
  std::vector<int32_t> acc, zero_points, weight_sums, counts, outlier_cols;
  std::vector<float> outlier_values;
  Tensor row_scales, col_scales, bias, transposed_weights;

  CorrectedInt8Case(int64_t rows_, int64_t cols_, int64_t K_, std::mt19937& rng)
      : rows(rows_), cols(cols_), K(K_) {
    std::uniform_int_distribution<int32_t> acc_dist(-200000, 200000), zp(0, 255), ws(-3000, 3000);
    std::uniform_int_distribution<int32_t> count(0, 3), col(0, static_cast<int32_t>(K - 1));
    std::uniform_real_distribution<float> outlier(-40.0f, 40.0f);
    acc.resize(rows * cols);
    for (int32_t& a : acc) a = acc_dist(rng);
    for (int64_t m = 0; m < rows; ++m) {
      zero_points.push_back(zp(rng));
      counts.push_back(m == 0 ? kInt8MaxOutliers : count(rng));  // row 0: every slot used
      for (int i = 0; i < kInt8MaxOutliers; ++i) {
        outlier_cols.push_back(col(rng));
        outlier_values.push_back(outlier(rng));
      }
    }
    for (int64_t n = 0; n < cols; ++n) weight_sums.push_back(ws(rng));
    row_scales = RandomTensor({rows}, rng, 1e-3f);
    col_scales = RandomTensor({cols}, rng, 1e-2f);
    bias = RandomTensor({cols}, rng);
    transposed_weights = RandomTensor({K, cols}, rng, 0.1f);
  }

  Int8Accumulators Accumulators() const {
    Int8Accumulators in;
    in.acc = acc.data();
    in.row_scales = row_scales.data();
    in.col_scales = col_scales.data();
    in.bias = bias.data();
    in.zero_points = zero_points.data();
    in.weight_sums = weight_sums.data();
    in.outlier_counts = counts.data();
    in.outlier_cols = outlier_cols.data();
    in.outlier_values = outlier_values.data();
    in.transposed_weights = transposed_weights.data();
    return in;
  }

  double Value(int64_t m, int64_t n) const {
    double v = (static_cast<double>(acc[m * cols + n]) -
                static_cast<double>(zero_points[m]) * weight_sums[n]) *
                   row_scales.data()[m] * col_scales.data()[n] +
               bias.data()[n];
    for (int i = 0; i < counts[m]; ++i) {
      const int64_t slot = m * kInt8MaxOutliers + i;
      v += double{outlier_values[slot]} * transposed_weights.data()[outlier_cols[slot] * cols + n];
    }
    return v;
  }
};

// Owns the buffers of `rows` quantised rows of K.
struct QuantizedBuffers {
  std::vector<uint8_t> q;
  std::vector<float> scales, values;
  std::vector<int32_t> zero_points, counts, cols;
  QuantizedBuffers(int64_t rows, int64_t K)
      : q(rows * K),
        scales(rows),
        values(rows * kInt8MaxOutliers),
        zero_points(rows),
        counts(rows),
        cols(rows * kInt8MaxOutliers) {}
  QuantizedRows View(float level) {
    return {q.data(),      scales.data(), zero_points.data(), counts.data(), cols.data(),
            values.data(), level};
  }
};

// Every element of `x` (rows, K) is within half a step of its quantised value, or is one of its
// row's outliers, kept exactly; and the outliers are the elements above 6 x the row's RMS.
void ExpectQuantizes(const float* x, int64_t rows, int64_t K, const QuantizedBuffers& out) {
  for (int64_t m = 0; m < rows; ++m) {
    double sq = 0.0;
    for (int64_t k = 0; k < K; ++k) sq += double{x[m * K + k]} * x[m * K + k];
    const double threshold = kInt8OutlierRatio * std::sqrt(sq / K);
    std::set<int32_t> outliers;
    for (int i = 0; i < out.counts[m]; ++i) {
      const int64_t slot = m * kInt8MaxOutliers + i;
      outliers.insert(out.cols[slot]);
      EXPECT_EQ(out.values[slot], x[m * K + out.cols[slot]]);
      EXPECT_GT(std::abs(out.values[slot]), threshold * (1 - 1e-5));
    }
    for (int64_t k = 0; k < K; ++k) {
      if (outliers.count(static_cast<int32_t>(k))) continue;
      const double back =
          (static_cast<double>(out.q[m * K + k]) - out.zero_points[m]) * out.scales[m];
      ASSERT_LE(std::abs(back - x[m * K + k]), out.scales[m] * 0.5001 + 1e-7)
          << "row " << m << " col " << k;
    }
  }
}

TEST_P(Int8KernelPathTest, CorrectedInt8EpiloguesMatchNaiveAndQuantiseTheNextInput) {
  for (const int64_t cols : {int64_t{64}, int64_t{37}}) {  // 37: tails of 8 and 16 lanes
    SCOPED_TRACE(cols);
    std::mt19937 rng(static_cast<uint32_t>(cols));
    const CorrectedInt8Case c(6, cols, 29, rng);
    const Int8Accumulators in = c.Accumulators();
    const Tensor residual = RandomTensor({c.rows, cols}, rng);
    const Tensor gamma = RandomTensor({cols}, rng), beta = RandomTensor({cols}, rng);

    Tensor y({c.rows, cols});
    DequantizeRows(in, c.rows, cols, y.data());
    for (int64_t m = 0; m < c.rows; ++m) {
      for (int64_t n = 0; n < cols; ++n) {
        const double v = c.Value(m, n);
        ASSERT_NEAR(y.data()[m * cols + n], v, 1e-4 * (1 + std::abs(v))) << m << "," << n;
      }
    }

    // GELU, written in fp32 and quantised as the next layer's input; then quantised only.
    Tensor gelu_out({c.rows, cols});
    QuantizedBuffers with_y(c.rows, cols), without_y(c.rows, cols), separate(c.rows, cols);
    QuantizedRows next = with_y.View(255.0f);
    DequantizeGeluRows(in, c.rows, cols, gelu_out.data(), &next);
    for (int64_t m = 0; m < c.rows; ++m) {
      for (int64_t n = 0; n < cols; ++n) {
        const double v = c.Value(m, n);
        const double gelu = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        ASSERT_NEAR(gelu_out.data()[m * cols + n], gelu, 1e-4 * (1 + std::abs(gelu)))
            << m << "," << n;
      }
    }
    ExpectQuantizes(gelu_out.data(), c.rows, cols, with_y);
    next = without_y.View(255.0f);
    DequantizeGeluRows(in, c.rows, cols, nullptr, &next);
    QuantizeRows(gelu_out.data(), c.rows, cols, separate.View(255.0f));
    for (const QuantizedBuffers* fused : {&with_y, &without_y}) {
      EXPECT_EQ(fused->q, separate.q);
      EXPECT_EQ(fused->scales, separate.scales);
      EXPECT_EQ(fused->zero_points, separate.zero_points);
      EXPECT_EQ(fused->counts, separate.counts);
    }

    // Residual + LayerNorm in place over the residual, quantised at 127 levels (no VNNI).
    Tensor out = residual;
    QuantizedBuffers ln_next(c.rows, cols);
    next = ln_next.View(127.0f);
    DequantizeAddLayerNormRows(in, out.data(), c.rows, cols, gamma.data(), beta.data(), 1e-12f,
                               out.data(), &next);
    for (int64_t m = 0; m < c.rows; ++m) {
      double mean = 0, var = 0;
      for (int64_t n = 0; n < cols; ++n) mean += c.Value(m, n) + residual.data()[m * cols + n];
      mean /= cols;
      for (int64_t n = 0; n < cols; ++n) {
        const double v = c.Value(m, n) + residual.data()[m * cols + n];
        var += (v - mean) * (v - mean);
      }
      var /= cols;
      for (int64_t n = 0; n < cols; ++n) {
        const double v = c.Value(m, n) + residual.data()[m * cols + n];
        const double ln = (v - mean) / std::sqrt(var + 1e-12) * gamma.data()[n] + beta.data()[n];
        ASSERT_NEAR(out.data()[m * cols + n], ln, 1e-4 * (1 + std::abs(ln))) << m << "," << n;
      }
      EXPECT_LE(*std::max_element(ln_next.q.begin() + m * cols, ln_next.q.begin() + (m + 1) * cols),
                127);
    }
    ExpectQuantizes(out.data(), c.rows, cols, ln_next);
  }
}

TEST_P(Int8KernelPathTest, Int8EpiloguesMatchNaive) {
  for (const int64_t cols : {int64_t{40}, int64_t{37}}) {  // 37: tails of 8 and 16 lanes
    SCOPED_TRACE(cols);
    CheckInt8EpiloguesAgainstNaive(cols);
  }
}

ATTN_INSTANTIATE_KERNEL_PATHS(Int8KernelPathTest);

// int8_products on AVX-512 VNNI (engine/ops/vnni_attention.cc) against the documented
// quantisation done naively in double: K per head and V per channel to s8 (127 levels), Q per row
// to u8 around 128, the integer products exact, P = round(255 exp(s - max)) normalised by its own
// sum. The scores must equal the reference to float rounding; the context may differ where
// exp() in fp32 and in double round P to different levels (bound: 2 levels of max |V| per row).
// It must also stay near the fp32 attention (the quantisation is fine enough) and differ from it
// (the int8 kernel ran). d = 32 and 64 (MiniLM, MPNet), lengths past and below whole blocks.
TEST(Int8AttentionTest, Avx512VnniProductsEqualTheQuantisedFormulas) {
  ATTN_SKIP_UNLESS_CPU_HAS("Avx512Vnni", UseAvx512VnniKernels());
  for (const int64_t d : {int64_t{32}, int64_t{64}}) {
    const int64_t heads = 2, H = heads * d;
    const std::vector<int64_t> lengths = {3, 21, 70};
    std::vector<int64_t> offsets = {0};
    for (int64_t T : lengths) offsets.push_back(offsets.back() + T);
    const int64_t M = offsets.back();
    std::mt19937 rng(static_cast<unsigned>(d));
    const Tensor qkv = RandomTensor({M, 3 * H}, rng, 1.5f);
    Tensor context({M, H}), fp32_context({M, H});
    std::vector<Tensor> scores;
    PackedAttentionOutputs outputs;
    for (int64_t T : lengths) {
      scores.emplace_back(std::vector<int64_t>{heads, T, T});
      outputs.scores.push_back(scores.back().data());
    }
    PackedAttentionShape shape{heads, d};
    PackedAttentionForward(shape, qkv.data(), offsets, fp32_context.data(), nullptr);
    shape.int8_products = true;
    PackedAttentionForward(shape, qkv.data(), offsets, context.data(), &outputs);
    double worst_excess = 0, worst_to_fp32 = 0, quantisation_effect = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      const int64_t T = lengths[b];
      const float* seq = qkv.data() + offsets[b] * 3 * H;
      auto at = [&](int64_t j, int part, int64_t h, int64_t c) {
        return double{seq[j * 3 * H + part * H + h * d + c]};
      };
      for (int64_t h = 0; h < heads; ++h) {
        double k_max = 0;
        std::vector<double> v_max(d, 0.0);
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            k_max = std::max(k_max, std::fabs(at(j, 1, h, c)));
            v_max[c] = std::max(v_max[c], std::fabs(at(j, 2, h, c)));
          }
        }
        auto kq = [&](int64_t j, int64_t c) {
          return std::nearbyint(at(j, 1, h, c) * 127 / k_max);
        };
        auto vq = [&](int64_t j, int64_t c) {
          return std::nearbyint(at(j, 2, h, c) * 127 / v_max[c]);
        };
        for (int64_t i = 0; i < T; ++i) {
          double q_max = 0;
          for (int64_t c = 0; c < d; ++c) q_max = std::max(q_max, std::fabs(at(i, 0, h, c)));
          std::vector<double> s(T), level(T);
          double max = -1e300, level_sum = 0;
          for (int64_t j = 0; j < T; ++j) {
            double dot = 0;  // an integer: (Qu - 128) · Kq
            for (int64_t c = 0; c < d; ++c) {
              dot += std::nearbyint(at(i, 0, h, c) * 127 / q_max) * kq(j, c);
            }
            s[j] = dot * (q_max / 127) * (k_max / 127) / std::sqrt(double(d));
            ASSERT_NEAR(scores[b].data()[(h * T + i) * T + j], s[j], 1e-5 * (1 + std::fabs(s[j])));
            max = std::max(max, s[j]);
          }
          for (int64_t j = 0; j < T; ++j)
            level_sum += (level[j] = std::nearbyint(255 * std::exp(s[j] - max)));
          for (int64_t c = 0; c < d; ++c) {
            double expected = 0;
            for (int64_t j = 0; j < T; ++j) expected += level[j] * vq(j, c);
            expected *= (v_max[c] / 127) / level_sum;
            const int64_t out = (offsets[b] + i) * H + h * d + c;
            const double got = context.data()[out];
            worst_excess = std::max(worst_excess,
                                    std::fabs(got - expected) - (1e-5 + 2 * v_max[c] / level_sum));
            worst_to_fp32 =
                std::max(worst_to_fp32, std::fabs(got - fp32_context.data()[out]) / v_max[c]);
            quantisation_effect =
                std::max(quantisation_effect, std::fabs(got - fp32_context.data()[out]));
          }
        }
      }
    }
    EXPECT_LE(worst_excess, 0.0) << "d " << d;
    EXPECT_LT(worst_to_fp32, 0.05) << "d " << d << ": int8 context far from fp32 (per max |V|)";
    EXPECT_GT(quantisation_effect, 1e-4) << "d " << d << ": the int8 products did not run";
  }
}

}  // namespace
}  // namespace attn
