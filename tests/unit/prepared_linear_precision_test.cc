// The int8 and bf16 linear layers alone (PreparedLinear) against double-precision references:
// int8's exact accumulators and split-off outliers on every kernel path, and every bf16 entry
// point (fp32 or bfloat16 in, fp32 or bfloat16 out, the LayerNorm epilogue's bfloat16 copy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/half.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/ops/prepared_linear.h"
#include "engine/precision.h"
#include "engine/tensor.h"
#include "tests/kernel_path_test.h"
#include "tests/test_policy.h"

namespace attn {
namespace {

// PreparedLinear::Int8Outliers against double precision, on both kernel paths, for inputs
// shaped like LayerNorm outputs (signed) and GELU outputs (>= -0.17): the accumulators are the
// exact integer dot products of (q - zero point) and Wq (no 16-bit saturation with u8 inputs and
// 8-bit weights) plus the outliers' products, and a few elements per row 30x the others are
// split off instead of coarsening the row's scale.
class Int8OutliersTest : public testing::KernelPathTest {};

TEST_P(Int8OutliersTest, AccumulatorsAreExactAndOutliersAreSplitOff) {
  const int64_t K = 201, N = 69;  // tails past whole 8- and 16-lane vectors
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  Tensor weight({N, K}), bias({N});
  for (int64_t i = 0; i < weight.numel(); ++i) weight.data()[i] = 0.1f * normal(rng);
  for (int64_t i = 0; i < N; ++i) bias.data()[i] = normal(rng);
  const PreparedLinear linear = PreparedLinear::Int8Outliers(weight, bias);
  // With AMX, oneDNN's u8 x s8 kernel reads its weights blocked in fours along K: prepared once
  // (the accumulators below come from that layout), not repacked by every call.
  if (CpuHasAmxInt8()) {
    EXPECT_TRUE(linear.packed());
  }
  ExecContext ctx;
  for (const bool gelu_like : {false, true}) {
    for (const int64_t rows : {int64_t{1}, int64_t{13}, int64_t{100}}) {
      const int64_t mrows = MatmulRows(rows);
      std::vector<float> x(rows * K);
      for (float& v : x) v = gelu_like ? std::max(normal(rng), -0.17f) : normal(rng);
      for (int64_t m = 0; m < rows; m += 3) {  // two outliers in every third row
        x[m * K + (m * 7) % K] = 30.0f;
        x[m * K + (m * 13 + 5) % K] = gelu_like ? 28.0f : -25.0f;
      }
      Int8Input input;
      linear.QuantizeInput(x.data(), rows, &input);
      std::vector<int32_t> acc(mrows * N);
      linear.ForwardInt8(ctx, input, rows, acc.data());
      for (int64_t m = 0; m < rows; ++m) {
        const int count = input.outlier_counts[m];
        EXPECT_EQ(count, m % 3 == 0 ? 2 : 0) << "row " << m;
        const float xs = input.scales[m];
        const int zero = input.zero_points[m];
        for (int64_t n = 0; n < N; ++n) {
          const float ws = linear.weight_scales()[n];
          int64_t exact = 0;
          double split = 0.0, reference = bias.data()[n];
          for (int64_t k = 0; k < K; ++k) {
            const int q = input.q[m * K + k];
            ASSERT_LE(q, 255);
            exact += int64_t{q - zero} * linear.quantized_weights()[n * K + k];
            reference += double{x[m * K + k]} * weight.data()[n * K + k];
          }
          for (int i = 0; i < count; ++i) {
            const int32_t col = input.outlier_cols[m * Int8Input::kMaxOutliers + i];
            EXPECT_EQ(input.q[m * K + col], zero);
            split += double{input.outlier_values[m * Int8Input::kMaxOutliers + i]} *
                     weight.data()[n * K + col];
          }
          const double split_units = split / (double{xs} * ws);
          ASSERT_LE(std::abs(acc[m * N + n] - (exact + split_units)),
                    1.0 + 1e-5 * std::abs(split_units))
              << "gelu_like " << gelu_like << " row " << m << " col " << n;
          // Dequantised: each quantised element is off by at most half a step.
          const double y = static_cast<double>(acc[m * N + n]) * xs * ws + linear.bias()[n];
          double bound = 1e-3 + xs * ws;
          for (int64_t k = 0; k < K; ++k) {
            bound += std::fabs(x[m * K + k]) * ws / 2 +
                     std::fabs(weight.data()[n * K + k]) * xs / 2 + xs * ws / 4;
          }
          ASSERT_LE(std::abs(y - reference), bound) << "gelu_like " << gelu_like << " row " << m;
        }
      }
    }
  }
}

ATTN_INSTANTIATE_KERNEL_PATHS(Int8OutliersTest);

// PreparedLinear::Bf16 (native or emulated, whichever this CPU gets) against a double-precision
// sum of the bf16-rounded products: a product of two bfloat16 values is exact in fp32, so the
// only difference left is the order of the fp32 sums (well under K ulp of the sum of |terms|; a
// missing rounding would be off by ~2^-9 of each term).
TEST(Bf16LinearTest, EqualsTheRoundedProductsSummedInDouble) {
  const int64_t K = 384, N = 96;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  Tensor weight({N, K}), bias({N});
  for (int64_t i = 0; i < weight.numel(); ++i) weight.data()[i] = 0.05f * normal(rng);
  for (int64_t i = 0; i < N; ++i) bias.data()[i] = normal(rng);
  const PreparedLinear linear = PreparedLinear::Bf16(weight, bias);
  EXPECT_EQ(linear.precision(), Precision::kBf16);
  std::printf("bf16 linear: %s\n", linear.native_bf16() ? "native oneDNN bf16 matmul"
                                                        : "emulated (bf16-rounded fp32 matmul)");
  ExecContext ctx;
  auto bf16 = [](float v) { return BFloat16BitsToFloat(FloatToBFloat16Bits(v)); };
  for (const bool gelu : {false, true}) {
    for (const int64_t rows : {int64_t{1}, int64_t{13}, int64_t{100}}) {
      const int64_t mrows = MatmulRows(rows);
      std::vector<float> x(mrows * K, 0.0f), residual(mrows * N), gamma(N), beta(N);
      for (int64_t i = 0; i < rows * K; ++i) x[i] = normal(rng);
      std::vector<float> y(mrows * N);
      linear.Apply(ctx, x.data(), rows, gelu ? LinearOutput::Gelu() : LinearOutput::Plain(),
                   y.data());
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double sum = bias.data()[n], magnitude = std::fabs(bias.data()[n]);
          for (int64_t k = 0; k < K; ++k) {
            const double term = double{bf16(x[m * K + k])} * bf16(weight.data()[n * K + k]);
            sum += term;
            magnitude += std::fabs(term);
          }
          const double expected = gelu ? 0.5 * sum * (1.0 + std::erf(sum / std::sqrt(2.0))) : sum;
          ASSERT_NEAR(y[m * N + n], expected, 1e-6 + 1e-5 * magnitude)
              << "gelu " << gelu << " row " << m << " col " << n;
        }
      }
    }
  }
}

// The bf16 layer's entry points that skip an fp32 activation (the encoder's FFN and the
// LayerNorm epilogues feeding the next layer, issue 34): ApplyBf16Out (fp32 in, bfloat16 out),
// ApplyBf16In (bfloat16 in, fp32 out, plain or with residual + LayerNorm and its bfloat16 copy)
// and ApplyBf16InOut, against the bf16-rounded products summed in double. A bfloat16 output is
// the exact result rounded once more (within half a bfloat16 step, 2^-9 relative); the copy is
// bit for bit the fp32 output rounded to nearest even, its padding rows zero.
TEST(Bf16LinearTest, Avx512Bf16InputsAndOutputsEqualTheRoundedFormula) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  auto bf16 = [](float v) { return BFloat16BitsToFloat(FloatToBFloat16Bits(v)); };
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{384, 96}, {200, 69}}) {
    SCOPED_TRACE(::testing::Message() << K << " x " << N);
    Tensor weight({N, K}), bias({N}), gamma({N}), beta({N});
    for (int64_t i = 0; i < weight.numel(); ++i) weight.data()[i] = 0.05f * normal(rng);
    for (int64_t i = 0; i < N; ++i) {
      bias.data()[i] = normal(rng);
      gamma.data()[i] = 1.0f + 0.2f * normal(rng);
      beta.data()[i] = 0.1f * normal(rng);
    }
    const PreparedLinear linear = PreparedLinear::Bf16(weight, bias);
    ATTN_SKIP_UNLESS_CPU_HAS("Avx512Bf16", linear.native_bf16());
    ExecContext ctx;
    for (const int64_t rows : {int64_t{1}, int64_t{13}, int64_t{100}}) {
      SCOPED_TRACE(rows);
      const int64_t mrows = MatmulRows(rows);
      std::vector<float> x(mrows * K, 0.0f), residual(mrows * N, 0.0f);
      for (int64_t i = 0; i < rows * K; ++i) x[i] = normal(rng);
      for (int64_t i = 0; i < rows * N; ++i) residual[i] = normal(rng);
      std::vector<uint16_t> x_bits(mrows * K);
      for (int64_t i = 0; i < mrows * K; ++i) x_bits[i] = FloatToBFloat16Bits(x[i]);
      // The product in double and the bound on its fp32 sums' error, per element.
      std::vector<double> product(rows * N), error(rows * N);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double sum = bias.data()[n], magnitude = std::fabs(bias.data()[n]);
          for (int64_t k = 0; k < K; ++k) {
            const double term = double{bf16(x[m * K + k])} * bf16(weight.data()[n * K + k]);
            sum += term;
            magnitude += std::fabs(term);
          }
          product[m * N + n] = sum;
          error[m * N + n] = 1e-6 + 1e-5 * magnitude;
        }
      }
      for (const LinearEpilogue epilogue : {LinearEpilogue::kNone, LinearEpilogue::kGelu}) {
        const bool gelu = epilogue == LinearEpilogue::kGelu;
        SCOPED_TRACE(gelu ? "gelu" : "plain");
        auto expected = [&](int64_t i) {
          const double s = product[i];
          return gelu ? 0.5 * s * (1.0 + std::erf(s / std::sqrt(2.0))) : s;
        };
        std::vector<uint16_t> out_bits(mrows * N), in_out_bits(mrows * N);
        std::vector<float> y(mrows * N);
        linear.ApplyBf16Out(ctx, x.data(), rows, epilogue, out_bits.data());
        linear.ApplyBf16InOut(ctx, x_bits.data(), rows, epilogue, in_out_bits.data());
        linear.ApplyBf16In(ctx, x_bits.data(), rows,
                           gelu ? LinearOutput::Gelu() : LinearOutput::Plain(), y.data());
        for (int64_t i = 0; i < rows * N; ++i) {
          const double e = expected(i), half_step = std::fabs(e) / 256;
          ASSERT_NEAR(y[i], e, error[i]) << "ApplyBf16In, element " << i;
          ASSERT_NEAR(BFloat16BitsToFloat(out_bits[i]), e, error[i] + half_step)
              << "ApplyBf16Out, element " << i;
          ASSERT_NEAR(BFloat16BitsToFloat(in_out_bits[i]), e, error[i] + half_step)
              << "ApplyBf16InOut, element " << i;
        }
      }
      // Residual + LayerNorm with the bfloat16 copy: the LayerNorm of (product + residual) in
      // double; an error e in the product moves an output by at most |gamma| 2 max(e) / sigma.
      const float eps = 1e-12f;
      std::vector<float> y(mrows * N);
      std::vector<uint16_t> copy(mrows * N, 0xFFFF);
      LinearOutput output =
          LinearOutput::AddLayerNorm(residual.data(), gamma.data(), beta.data(), eps);
      output.bf16_copy = copy.data();
      linear.ApplyBf16In(ctx, x_bits.data(), rows, output, y.data());
      for (int64_t m = 0; m < rows; ++m) {
        double mean = 0, var = 0, worst = 0;
        for (int64_t n = 0; n < N; ++n) {
          mean += product[m * N + n] + residual[m * N + n];
          worst = std::max(worst, error[m * N + n]);
        }
        mean /= N;
        for (int64_t n = 0; n < N; ++n) {
          const double v = product[m * N + n] + residual[m * N + n] - mean;
          var += v * v;
        }
        const double sigma = std::sqrt(var / N + eps);
        for (int64_t n = 0; n < N; ++n) {
          const int64_t i = m * N + n;
          const double e =
              (product[i] + residual[i] - mean) / sigma * gamma.data()[n] + beta.data()[n];
          ASSERT_NEAR(y[i], e, 1e-5 + std::fabs(gamma.data()[n]) * 2 * worst / sigma)
              << "row " << m << " col " << n;
          ASSERT_EQ(copy[i], FloatToBFloat16Bits(y[i])) << "row " << m << " col " << n;
        }
      }
      for (int64_t i = rows * N; i < mrows * N; ++i) ASSERT_EQ(copy[i], 0) << "padding " << i;
    }
  }
}

}  // namespace
}  // namespace attn
