// Backward of linear, layernorm, gelu and dropout against central finite differences.
//
// Method: for a fixed random dy, the scalar loss L = sum(dy * forward(inputs)) has gradient
// dL/d(input) = backward(dy). The numerical gradient perturbs one input element at a time:
//   dL/dv_i ~ (L(v_i + h) - L(v_i - h)) / 2h.
// Primary check (the DESIGN.md bar): L is evaluated by a naive DOUBLE-precision reference at
// the same float-representable point the op sees, with h = 1e-4 in double, so the difference
// quotient is accurate to ~1e-8 and the comparison measures the fp32 oneDNN backward alone:
//   max_i |analytic_i - numeric_i| / max(|numeric_i|, 1e-2 * max_j |numeric_j|)  <=  1e-3.
// (The floor keeps entries whose true gradient is ~0 from dividing by ~0.)
// Secondary check: L evaluated through the real fp32 oneDNN forward with h = 1e-2, which ties
// the forward and backward primitives together (same eps, same formula) at a looser tolerance
// because fp32 rounding of L is amplified by 1/2h.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/half.h"
#include "engine/ops/dropout.h"
#include "engine/ops/gelu.h"
#include "engine/ops/layernorm.h"
#include "engine/ops/linear.h"

namespace attn {
namespace {

constexpr double kDoubleStep = 1e-4;
constexpr double kTolerance = 1e-3;  // against the double reference
constexpr float kFloatStep = 1e-2f;
constexpr double kFloatTolerance = 5e-3;  // against the fp32 oneDNN forward

Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f,
                    float shift = 0.0f) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> dist(shift, scale);
  for (float& v : t.values()) v = dist(rng);
  return t;
}

std::vector<double> ToDouble(const float* p, int64_t n) { return std::vector<double>(p, p + n); }
std::vector<double> ToDouble(const Tensor& t) { return ToDouble(t.data(), t.numel()); }

// Central difference of loss() w.r.t. every element of v (perturbed in place, then restored).
// The denominator is the perturbation actually applied, which matters for float v.
template <typename T>
std::vector<double> CentralDifference(T* v, int64_t n, T h, const std::function<double()>& loss) {
  std::vector<double> grad(n);
  for (int64_t i = 0; i < n; ++i) {
    const T saved = v[i];
    const T plus = saved + h;
    const T minus = saved - h;
    v[i] = plus;
    const double loss_plus = loss();
    v[i] = minus;
    const double loss_minus = loss();
    v[i] = saved;
    grad[i] = (loss_plus - loss_minus) / (double{plus} - double{minus});
  }
  return grad;
}

// max_i |a_i - n_i| / max(|n_i|, 1e-2 * max_j |n_j|)
double RelativeError(const float* analytic, const std::vector<double>& numeric) {
  double scale = 0.0;
  for (double v : numeric) scale = std::max(scale, std::abs(v));
  const double floor = std::max(1e-2 * scale, 1e-30);
  double worst = 0.0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    worst =
        std::max(worst, std::abs(analytic[i] - numeric[i]) / std::max(std::abs(numeric[i]), floor));
  }
  return worst;
}

double Dot(const std::vector<double>& a, const float* b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Linear: y (M, N) = x (M, K) · W^T + b

struct LinearShape {
  int64_t rows, in, out;
};

// L = sum_{m,n} dy[m,n] * (b[n] + sum_k x[m,k] W[n,k]) in double.
double LinearLossReference(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& b, const std::vector<double>& dy,
                           const LinearShape& s) {
  double loss = 0.0;
  for (int64_t m = 0; m < s.rows; ++m) {
    for (int64_t n = 0; n < s.out; ++n) {
      double y = b[n];
      for (int64_t k = 0; k < s.in; ++k) y += x[m * s.in + k] * w[n * s.in + k];
      loss += dy[m * s.out + n] * y;
    }
  }
  return loss;
}

class LinearBackwardTest : public ::testing::TestWithParam<LinearShape> {};

TEST_P(LinearBackwardTest, MatchesFiniteDifferences) {
  const LinearShape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.rows * 100 + s.in * 10 + s.out));
  const Tensor x = RandomTensor({s.rows, s.in}, rng);
  const Tensor w = RandomTensor({s.out, s.in}, rng, 0.5f);
  const Tensor b = RandomTensor({s.out}, rng);
  const Tensor dy = RandomTensor({s.rows, s.out}, rng);

  ExecContext ctx;
  Tensor dx({s.rows, s.in});
  Tensor dw({s.out, s.in});
  Tensor db({s.out});
  // Garbage in the outputs: accumulate = false must overwrite, not add.
  std::fill(dw.values().begin(), dw.values().end(), 1e3f);
  std::fill(db.values().begin(), db.values().end(), -1e3f);
  LinearBackward(ctx, x.data(), s.rows, w, dy.data(), dx.data(), &dw, &db, false);

  std::vector<double> xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b), dyd = ToDouble(dy);
  auto loss = [&] { return LinearLossReference(xd, wd, bd, dyd, s); };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xd.data(), x.numel(), kDoubleStep, loss)),
            kTolerance)
      << "dx";
  EXPECT_LT(RelativeError(dw.data(), CentralDifference(wd.data(), w.numel(), kDoubleStep, loss)),
            kTolerance)
      << "dW";
  EXPECT_LT(RelativeError(db.data(), CentralDifference(bd.data(), b.numel(), kDoubleStep, loss)),
            kTolerance)
      << "db";

  // Secondary: through the fp32 oneDNN forward.
  Tensor xf = x, wf = w, bf = b;
  Tensor y({s.rows, s.out});
  auto engine_loss = [&] {
    LinearForward(ctx, xf.data(), s.rows, wf, bf, LinearEpilogue::kNone, y.data());
    return Dot(dyd, y.data());
  };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xf.data(), xf.numel(), kFloatStep,
                                                       std::function<double()>(engine_loss))),
            kFloatTolerance);
  EXPECT_LT(RelativeError(dw.data(), CentralDifference(wf.data(), wf.numel(), kFloatStep,
                                                       std::function<double()>(engine_loss))),
            kFloatTolerance);
  EXPECT_LT(RelativeError(db.data(), CentralDifference(bf.data(), bf.numel(), kFloatStep,
                                                       std::function<double()>(engine_loss))),
            kFloatTolerance);
}

TEST_P(LinearBackwardTest, AccumulateAddsAndNullOutputsAreSkipped) {
  const LinearShape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.rows + s.in + s.out));
  const Tensor x = RandomTensor({s.rows, s.in}, rng);
  const Tensor w = RandomTensor({s.out, s.in}, rng, 0.5f);
  const Tensor dy = RandomTensor({s.rows, s.out}, rng);
  ExecContext ctx;
  Tensor dx({s.rows, s.in}), dw({s.out, s.in}), db({s.out});
  LinearBackward(ctx, x.data(), s.rows, w, dy.data(), dx.data(), &dw, &db, false);

  const Tensor dw_before = RandomTensor({s.out, s.in}, rng);
  const Tensor db_before = RandomTensor({s.out}, rng);
  Tensor dw_acc = dw_before, db_acc = db_before;
  LinearBackward(ctx, x.data(), s.rows, w, dy.data(), nullptr, &dw_acc, &db_acc, true);
  for (int64_t i = 0; i < dw.numel(); ++i) {
    EXPECT_NEAR(dw_acc.data()[i], dw_before.data()[i] + dw.data()[i], 1e-5) << i;
  }
  for (int64_t i = 0; i < db.numel(); ++i) {
    EXPECT_NEAR(db_acc.data()[i], db_before.data()[i] + db.data()[i], 1e-5) << i;
  }

  // Only dx: same values as the full call.
  Tensor dx_only({s.rows, s.in});
  LinearBackward(ctx, x.data(), s.rows, w, dy.data(), dx_only.data(), nullptr, nullptr, false);
  EXPECT_EQ(dx_only.values(), dx.values());
  // Only db.
  Tensor db_only({s.out});
  LinearBackward(ctx, x.data(), s.rows, w, dy.data(), nullptr, nullptr, &db_only, false);
  EXPECT_EQ(db_only.values(), db.values());
}

INSTANTIATE_TEST_SUITE_P(SmallShapes, LinearBackwardTest,
                         ::testing::Values(LinearShape{3, 4, 3}, LinearShape{4, 7, 6},
                                           LinearShape{5, 5, 5}, LinearShape{5, 6, 4},
                                           LinearShape{1, 4, 3}, LinearShape{1, 1, 1}));

// Model-sized shapes (oneDNN picks blocked/JIT kernels, db takes the OpenMP path) against the
// closed-form gradients in double. {300, 1536, 384} and {256, 96, 64} have fewer outputs than
// inputs and enough rows for the transposed dx/dW formulation.
TEST(LinearBackwardLargeTest, MatchesNaiveClosedForm) {
  for (const LinearShape s :
       {LinearShape{64, 384, 96}, LinearShape{37, 1536, 384}, LinearShape{256, 64, 384},
        LinearShape{300, 384, 1536}, LinearShape{300, 1536, 384}, LinearShape{256, 96, 64}}) {
    std::mt19937 rng(static_cast<unsigned>(s.rows));
    const Tensor x = RandomTensor({s.rows, s.in}, rng);
    const Tensor w = RandomTensor({s.out, s.in}, rng, 0.05f);
    const Tensor dy = RandomTensor({s.rows, s.out}, rng);
    ExecContext ctx;
    Tensor dx({s.rows, s.in}), dw({s.out, s.in}), db({s.out});
    LinearBackward(ctx, x.data(), s.rows, w, dy.data(), dx.data(), &dw, &db, false);

    std::vector<double> dx_ref(s.rows * s.in, 0.0), dw_ref(s.out * s.in, 0.0), db_ref(s.out, 0.0);
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t n = 0; n < s.out; ++n) {
        const double g = dy.data()[m * s.out + n];
        db_ref[n] += g;
        for (int64_t k = 0; k < s.in; ++k) {
          dx_ref[m * s.in + k] += g * w.data()[n * s.in + k];
          dw_ref[n * s.in + k] += g * x.data()[m * s.in + k];
        }
      }
    }
    EXPECT_LT(RelativeError(dx.data(), dx_ref), kTolerance) << s.rows << "x" << s.in;
    EXPECT_LT(RelativeError(dw.data(), dw_ref), kTolerance) << s.rows << "x" << s.in;
    EXPECT_LT(RelativeError(db.data(), db_ref), kTolerance) << s.rows << "x" << s.in;

    // accumulate adds to what dW and db held.
    Tensor dw_acc = RandomTensor({s.out, s.in}, rng), db_acc = RandomTensor({s.out}, rng);
    for (int64_t i = 0; i < dw_acc.numel(); ++i) dw_ref[i] += dw_acc.data()[i];
    for (int64_t i = 0; i < db_acc.numel(); ++i) db_ref[i] += db_acc.data()[i];
    LinearBackward(ctx, x.data(), s.rows, w, dy.data(), nullptr, &dw_acc, &db_acc, true);
    EXPECT_LT(RelativeError(dw_acc.data(), dw_ref), kTolerance) << s.rows << "x" << s.in;
    EXPECT_LT(RelativeError(db_acc.data(), db_ref), kTolerance) << s.rows << "x" << s.in;
  }
}

TEST(LinearBackwardLargeTest, ZeroRows) {
  std::mt19937 rng(3);
  const Tensor w = RandomTensor({4, 5}, rng);
  ExecContext ctx;
  Tensor dw = RandomTensor({4, 5}, rng), db = RandomTensor({4}, rng);
  const Tensor dw_before = dw, db_before = db;
  LinearBackward(ctx, nullptr, 0, w, nullptr, nullptr, &dw, &db, true);
  EXPECT_EQ(dw.values(), dw_before.values());
  EXPECT_EQ(db.values(), db_before.values());
  LinearBackward(ctx, nullptr, 0, w, nullptr, nullptr, &dw, &db, false);
  for (float v : dw.values()) EXPECT_EQ(v, 0.0f);
  for (float v : db.values()) EXPECT_EQ(v, 0.0f);
}

// Mixed precision (MatmulInputs::kBf16): y, dx and dW against double-precision sums of the
// bfloat16-rounded factors. A product of two bfloat16 values is exact in fp32, so only the order
// of the fp32 sums differs (bound: 1e-5 of the sum of |terms|); a factor left unrounded would
// be off by ~2^-9 of each term, ~10x the bound at these depths. Native bf16 kernels where the
// CPU has them, the emulation elsewhere: both must pass. {256, 512, 96} takes the transposed
// dx/dW route.
TEST(LinearBf16Test, ForwardAndBackwardEqualTheRoundedProductsSummedInDouble) {
  auto bf16 = [](float v) { return double{BFloat16BitsToFloat(FloatToBFloat16Bits(v))}; };
  for (const LinearShape s :
       {LinearShape{37, 384, 96}, LinearShape{256, 512, 96}, LinearShape{64, 96, 1152}}) {
    std::mt19937 rng(static_cast<unsigned>(s.rows + s.in));
    const Tensor x = RandomTensor({s.rows, s.in}, rng);
    const Tensor w = RandomTensor({s.out, s.in}, rng, 0.05f);
    const Tensor b = RandomTensor({s.out}, rng);
    const Tensor dy = RandomTensor({s.rows, s.out}, rng);
    ExecContext ctx;
    Tensor y({s.rows, s.out}), dx({s.rows, s.in}), dw({s.out, s.in}), db({s.out});
    LinearForward(ctx, x.data(), s.rows, w, b, LinearEpilogue::kNone, y.data(),
                  MatmulInputs::kBf16);
    LinearBackward(ctx, x.data(), s.rows, w, dy.data(), dx.data(), &dw, &db, false,
                   MatmulInputs::kBf16);
    // One output element against sum_i bf16(a[i * a_stride]) * bf16(b[i * b_stride]) (+ bias)
    // over `depth` terms, within 1e-5 of the sum of |terms|.
    auto check = [&](const char* what, float got, const float* a, int64_t a_stride, const float* b,
                     int64_t b_stride, int64_t depth, double bias) {
      double sum = bias, magnitude = std::abs(bias);
      for (int64_t i = 0; i < depth; ++i) {
        const double term = bf16(a[i * a_stride]) * bf16(b[i * b_stride]);
        sum += term;
        magnitude += std::abs(term);
      }
      const double bound = 1e-6 + 1e-5 * magnitude;
      return std::abs(got - sum) <= bound ? ::testing::AssertionSuccess()
                                          : ::testing::AssertionFailure()
                                                << what << " " << got << " vs " << sum << " (bound "
                                                << bound << ") at " << s.rows << "x" << s.in << "x"
                                                << s.out;
    };
    for (int64_t m = 0; m < s.rows; ++m) {
      for (int64_t n = 0; n < s.out; ++n) {  // y = x · W^T + b
        ASSERT_TRUE(check("y", y.data()[m * s.out + n], x.data() + m * s.in, 1, w.data() + n * s.in,
                          1, s.in, b.data()[n]));
      }
      for (int64_t k = 0; k < s.in; ++k) {  // dx = dy · W
        ASSERT_TRUE(check("dx", dx.data()[m * s.in + k], dy.data() + m * s.out, 1, w.data() + k,
                          s.in, s.out, 0.0));
      }
    }
    for (int64_t n = 0; n < s.out; ++n) {
      for (int64_t k = 0; k < s.in; ++k) {  // dW = dy^T · x
        ASSERT_TRUE(check("dW", dw.data()[n * s.in + k], dy.data() + n, s.out, x.data() + k, s.in,
                          s.rows, 0.0));
      }
      double db_sum = 0;  // the bias gradient is a plain fp32 sum of dy
      for (int64_t m = 0; m < s.rows; ++m) db_sum += dy.data()[m * s.out + n];
      ASSERT_NEAR(db.data()[n], db_sum, 1e-4);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm: y (M, H) = (x - mean) / sqrt(var + eps) * gamma + beta

struct LayerNormShape {
  int64_t rows, hidden;
  float eps;
};

void LayerNormReference(const std::vector<double>& x, const std::vector<double>& gamma,
                        const std::vector<double>& beta, int64_t rows, int64_t hidden, double eps,
                        std::vector<double>* y, std::vector<double>* mean,
                        std::vector<double>* variance) {
  y->resize(rows * hidden);
  mean->resize(rows);
  variance->resize(rows);
  for (int64_t m = 0; m < rows; ++m) {
    const double* row = x.data() + m * hidden;
    double mu = 0.0;
    for (int64_t h = 0; h < hidden; ++h) mu += row[h];
    mu /= hidden;
    double var = 0.0;
    for (int64_t h = 0; h < hidden; ++h) var += (row[h] - mu) * (row[h] - mu);
    var /= hidden;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t h = 0; h < hidden; ++h) {
      (*y)[m * hidden + h] = (row[h] - mu) * rstd * gamma[h] + beta[h];
    }
    (*mean)[m] = mu;
    (*variance)[m] = var;
  }
}

class LayerNormBackwardTest : public ::testing::TestWithParam<LayerNormShape> {};

TEST_P(LayerNormBackwardTest, TrainingForwardStatisticsMatchNaive) {
  const LayerNormShape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.rows * 10 + s.hidden));
  const Tensor x = RandomTensor({s.rows, s.hidden}, rng, 2.0f, 0.7f);
  const Tensor gamma = RandomTensor({s.hidden}, rng, 0.5f, 1.0f);
  const Tensor beta = RandomTensor({s.hidden}, rng);
  ExecContext ctx;
  Tensor y({s.rows, s.hidden}), y_inference({s.rows, s.hidden});
  std::vector<float> mean(s.rows), variance(s.rows);
  LayerNormForwardTraining(ctx, x.data(), s.rows, gamma, beta, s.eps, y.data(), mean.data(),
                           variance.data());
  LayerNormForward(ctx, x.data(), s.rows, gamma, beta, s.eps, y_inference.data());

  std::vector<double> y_ref, mean_ref, variance_ref;
  LayerNormReference(ToDouble(x), ToDouble(gamma), ToDouble(beta), s.rows, s.hidden, s.eps, &y_ref,
                     &mean_ref, &variance_ref);
  for (int64_t m = 0; m < s.rows; ++m) {
    EXPECT_NEAR(mean[m], mean_ref[m], 1e-6 * (1.0 + std::abs(mean_ref[m]))) << m;
    EXPECT_NEAR(variance[m], variance_ref[m], 1e-5 * variance_ref[m]) << m;
  }
  for (int64_t i = 0; i < y.numel(); ++i) {
    EXPECT_NEAR(y.data()[i], y_ref[i], 1e-5 * (1.0 + std::abs(y_ref[i]))) << i;
    EXPECT_NEAR(y.data()[i], y_inference.data()[i], 1e-5) << i;
  }
}

TEST_P(LayerNormBackwardTest, MatchesFiniteDifferences) {
  const LayerNormShape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.rows * 7 + s.hidden));
  const Tensor x = RandomTensor({s.rows, s.hidden}, rng, 2.0f, 0.7f);
  const Tensor gamma = RandomTensor({s.hidden}, rng, 0.5f, 1.0f);
  const Tensor beta = RandomTensor({s.hidden}, rng);
  const Tensor dy = RandomTensor({s.rows, s.hidden}, rng);
  ExecContext ctx;
  Tensor y({s.rows, s.hidden});
  std::vector<float> mean(s.rows), variance(s.rows);
  LayerNormForwardTraining(ctx, x.data(), s.rows, gamma, beta, s.eps, y.data(), mean.data(),
                           variance.data());
  Tensor dx({s.rows, s.hidden}), dgamma({s.hidden}), dbeta({s.hidden});
  std::fill(dgamma.values().begin(), dgamma.values().end(), 1e3f);  // must be overwritten
  std::fill(dbeta.values().begin(), dbeta.values().end(), 1e3f);
  LayerNormBackward(ctx, x.data(), s.rows, gamma, mean.data(), variance.data(), s.eps, dy.data(),
                    dx.data(), &dgamma, &dbeta, false);

  std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta),
                      dyd = ToDouble(dy);
  std::vector<double> y_ref, mean_ref, variance_ref;
  auto loss = [&] {
    LayerNormReference(xd, gd, bd, s.rows, s.hidden, s.eps, &y_ref, &mean_ref, &variance_ref);
    double sum = 0.0;
    for (size_t i = 0; i < y_ref.size(); ++i) sum += dyd[i] * y_ref[i];
    return sum;
  };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xd.data(), x.numel(), kDoubleStep, loss)),
            kTolerance)
      << "dx";
  EXPECT_LT(
      RelativeError(dgamma.data(), CentralDifference(gd.data(), gamma.numel(), kDoubleStep, loss)),
      kTolerance)
      << "dgamma";
  EXPECT_LT(
      RelativeError(dbeta.data(), CentralDifference(bd.data(), beta.numel(), kDoubleStep, loss)),
      kTolerance)
      << "dbeta";

  // Secondary: through the fp32 oneDNN training forward.
  Tensor xf = x, gf = gamma, bf = beta;
  std::function<double()> engine_loss = [&] {
    LayerNormForwardTraining(ctx, xf.data(), s.rows, gf, bf, s.eps, y.data(), mean.data(),
                             variance.data());
    return Dot(dyd, y.data());
  };
  EXPECT_LT(
      RelativeError(dx.data(), CentralDifference(xf.data(), xf.numel(), kFloatStep, engine_loss)),
      kFloatTolerance);
  EXPECT_LT(RelativeError(dgamma.data(),
                          CentralDifference(gf.data(), gf.numel(), kFloatStep, engine_loss)),
            kFloatTolerance);
  EXPECT_LT(RelativeError(dbeta.data(),
                          CentralDifference(bf.data(), bf.numel(), kFloatStep, engine_loss)),
            kFloatTolerance);
}

TEST_P(LayerNormBackwardTest, AccumulateAddsAndNullParamsAreSkipped) {
  const LayerNormShape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.rows + s.hidden));
  const Tensor x = RandomTensor({s.rows, s.hidden}, rng);
  const Tensor gamma = RandomTensor({s.hidden}, rng, 0.5f, 1.0f);
  const Tensor beta = RandomTensor({s.hidden}, rng);
  const Tensor dy = RandomTensor({s.rows, s.hidden}, rng);
  ExecContext ctx;
  Tensor y({s.rows, s.hidden});
  std::vector<float> mean(s.rows), variance(s.rows);
  LayerNormForwardTraining(ctx, x.data(), s.rows, gamma, beta, s.eps, y.data(), mean.data(),
                           variance.data());
  Tensor dx({s.rows, s.hidden}), dgamma({s.hidden}), dbeta({s.hidden});
  LayerNormBackward(ctx, x.data(), s.rows, gamma, mean.data(), variance.data(), s.eps, dy.data(),
                    dx.data(), &dgamma, &dbeta, false);

  const Tensor dgamma_before = RandomTensor({s.hidden}, rng);
  const Tensor dbeta_before = RandomTensor({s.hidden}, rng);
  Tensor dgamma_acc = dgamma_before, dbeta_acc = dbeta_before, dx_acc({s.rows, s.hidden});
  LayerNormBackward(ctx, x.data(), s.rows, gamma, mean.data(), variance.data(), s.eps, dy.data(),
                    dx_acc.data(), &dgamma_acc, &dbeta_acc, true);
  EXPECT_EQ(dx_acc.values(), dx.values());  // dx is overwritten either way
  for (int64_t h = 0; h < s.hidden; ++h) {
    EXPECT_NEAR(dgamma_acc.data()[h], dgamma_before.data()[h] + dgamma.data()[h], 1e-5) << h;
    EXPECT_NEAR(dbeta_acc.data()[h], dbeta_before.data()[h] + dbeta.data()[h], 1e-5) << h;
  }

  Tensor dx_only({s.rows, s.hidden});
  LayerNormBackward(ctx, x.data(), s.rows, gamma, mean.data(), variance.data(), s.eps, dy.data(),
                    dx_only.data(), nullptr, nullptr, true);
  EXPECT_EQ(dx_only.values(), dx.values());
}

INSTANTIATE_TEST_SUITE_P(SmallShapes, LayerNormBackwardTest,
                         ::testing::Values(LayerNormShape{3, 5, 1e-5f},
                                           LayerNormShape{4, 8, 1e-12f},
                                           LayerNormShape{5, 6, 1e-12f},
                                           LayerNormShape{5, 7, 1e-5f},
                                           LayerNormShape{1, 8, 1e-3f}));

// Model-sized rows against the closed-form backward in double:
//   dx = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat)),  g = dy * gamma
TEST(LayerNormBackwardLargeTest, MatchesNaiveClosedForm) {
  for (auto [rows, hidden] : std::vector<std::pair<int64_t, int64_t>>{{33, 384}, {130, 768}}) {
    const float eps = 1e-12f;
    std::mt19937 rng(static_cast<unsigned>(rows));
    const Tensor x = RandomTensor({rows, hidden}, rng, 3.0f, 0.5f);
    const Tensor gamma = RandomTensor({hidden}, rng, 0.3f, 1.0f);
    const Tensor beta = RandomTensor({hidden}, rng);
    const Tensor dy = RandomTensor({rows, hidden}, rng);
    ExecContext ctx;
    Tensor y({rows, hidden}), dx({rows, hidden}), dgamma({hidden}), dbeta({hidden});
    std::vector<float> mean(rows), variance(rows);
    LayerNormForwardTraining(ctx, x.data(), rows, gamma, beta, eps, y.data(), mean.data(),
                             variance.data());
    LayerNormBackward(ctx, x.data(), rows, gamma, mean.data(), variance.data(), eps, dy.data(),
                      dx.data(), &dgamma, &dbeta, false);

    std::vector<double> y_ref, mean_ref, var_ref;
    LayerNormReference(ToDouble(x), ToDouble(gamma), ToDouble(beta), rows, hidden, eps, &y_ref,
                       &mean_ref, &var_ref);
    std::vector<double> dx_ref(rows * hidden), dgamma_ref(hidden, 0.0), dbeta_ref(hidden, 0.0);
    for (int64_t m = 0; m < rows; ++m) {
      const double rstd = 1.0 / std::sqrt(var_ref[m] + eps);
      std::vector<double> xhat(hidden), g(hidden);
      double mean_g = 0.0, mean_gx = 0.0;
      for (int64_t h = 0; h < hidden; ++h) {
        xhat[h] = (x.data()[m * hidden + h] - mean_ref[m]) * rstd;
        g[h] = double{dy.data()[m * hidden + h]} * gamma.data()[h];
        mean_g += g[h] / hidden;
        mean_gx += g[h] * xhat[h] / hidden;
        dgamma_ref[h] += dy.data()[m * hidden + h] * xhat[h];
        dbeta_ref[h] += dy.data()[m * hidden + h];
      }
      for (int64_t h = 0; h < hidden; ++h) {
        dx_ref[m * hidden + h] = rstd * (g[h] - mean_g - xhat[h] * mean_gx);
      }
    }
    EXPECT_LT(RelativeError(dx.data(), dx_ref), kTolerance) << rows << "x" << hidden;
    EXPECT_LT(RelativeError(dgamma.data(), dgamma_ref), kTolerance) << rows << "x" << hidden;
    EXPECT_LT(RelativeError(dbeta.data(), dbeta_ref), kTolerance) << rows << "x" << hidden;
  }
}

// ---------------------------------------------------------------------------------------------
// GELU (erf): y = x * Phi(x)

double GeluReference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluDerivativeReference(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

TEST(GeluBackwardTest, MatchesFiniteDifferences) {
  const int64_t n = 61;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> jitter(-0.05f, 0.05f);
  Tensor x({n}), dy = RandomTensor({n}, rng);
  for (int64_t i = 0; i < n; ++i) x.data()[i] = -6.0f + 12.0f * i / (n - 1) + jitter(rng);
  x.data()[n / 2] = 0.0f;
  ExecContext ctx;
  Tensor dx({n});
  GeluBackward(ctx, x.data(), dy.data(), n, dx.data());

  std::vector<double> xd = ToDouble(x), dyd = ToDouble(dy);
  auto loss = [&] {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += dyd[i] * GeluReference(xd[i]);
    return sum;
  };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xd.data(), n, kDoubleStep, loss)),
            kTolerance);

  Tensor xf = x, y({n});
  std::function<double()> engine_loss = [&] {
    GeluForward(ctx, xf.data(), n, y.data());
    return Dot(dyd, y.data());
  };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xf.data(), n, kFloatStep, engine_loss)),
            kFloatTolerance);

  // dx may alias dy.
  Tensor in_place = dy;
  GeluBackward(ctx, x.data(), in_place.data(), n, in_place.data());
  EXPECT_EQ(in_place.values(), dx.values());
}

TEST(GeluBackwardTest, LargeMatchesClosedForm) {
  const int64_t n = 100003;  // odd: exercises the vector tail
  std::mt19937 rng(9);
  const Tensor x = RandomTensor({n}, rng, 3.0f);
  const Tensor dy = RandomTensor({n}, rng);
  ExecContext ctx;
  Tensor dx({n});
  GeluBackward(ctx, x.data(), dy.data(), n, dx.data());
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = dy.data()[i] * GeluDerivativeReference(x.data()[i]);
  EXPECT_LT(RelativeError(dx.data(), ref), kTolerance);
}

// ---------------------------------------------------------------------------------------------
// Dropout

std::vector<uint8_t> MaskOf(int64_t n, float p, uint64_t seed, uint64_t offset) {
  std::vector<float> x(n, 1.0f), y(n);
  std::vector<uint8_t> mask(n);
  DropoutForward(x.data(), n, p, seed, offset, y.data(), mask.data());
  return mask;
}

double ZeroFraction(const std::vector<uint8_t>& mask) {
  return static_cast<double>(std::count(mask.begin(), mask.end(), 0)) / mask.size();
}

double DifferingFraction(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  return static_cast<double>(differ) / a.size();
}

TEST(DropoutTest, ZeroProbabilityIsIdentity) {
  for (int64_t n : {int64_t{1000}, int64_t{100000}}) {  // serial and parallel paths
    std::mt19937 rng(1);
    const Tensor x = RandomTensor({n}, rng);
    Tensor y({n}), dx({n});
    std::vector<uint8_t> mask(n, 7);
    DropoutForward(x.data(), n, 0.0f, 42, 0, y.data(), mask.data());
    EXPECT_EQ(y.values(), x.values());
    EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](uint8_t m) { return m == 1; }));
    DropoutBackward(x.data(), mask.data(), n, 0.0f, dx.data());
    EXPECT_EQ(dx.values(), x.values());
  }
}

TEST(DropoutTest, ZeroFractionScalingAndMean) {
  const int64_t n = 1000000;
  std::vector<float> x(n), y(n);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);  // nonzero, so y == 0 <=> dropped
  for (float& v : x) v = dist(rng);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<uint8_t> mask(n);
    DropoutForward(x.data(), n, p, 1234, 0, y.data(), mask.data());
    // Binomial: sd of the fraction = sqrt(p(1-p)/n) <= 5e-4; 3e-3 is > 6 sd.
    EXPECT_NEAR(ZeroFraction(mask), p, 3e-3) << p;
    const float scale = 1.0f / (1.0f - p);
    double sum_x = 0.0, sum_y = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (mask[i]) {
        ASSERT_FLOAT_EQ(y[i], x[i] * scale) << i;
      } else {
        ASSERT_EQ(y[i], 0.0f) << i;
      }
      sum_x += x[i];
      sum_y += y[i];
    }
    // Inverted dropout preserves the expectation.
    EXPECT_NEAR(sum_y / sum_x, 1.0, 0.01) << p;
  }
}

TEST(DropoutTest, ProbabilityOneDropsEverythingWithoutNaN) {
  const int64_t n = 1000;
  std::vector<float> x(n, 3.0f), y(n, 1.0f), dx(n, 1.0f);
  std::vector<uint8_t> mask(n, 1);
  DropoutForward(x.data(), n, 1.0f, 7, 0, y.data(), mask.data());
  DropoutBackward(x.data(), mask.data(), n, 1.0f, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(mask[i], 0);
    EXPECT_EQ(y[i], 0.0f);
    EXPECT_EQ(dx[i], 0.0f);
  }
}

TEST(DropoutTest, MaskIsAFunctionOfSeedAndCounter) {
  const int64_t n = 200000;
  const float p = 0.3f;
  const std::vector<uint8_t> a = MaskOf(n, p, 99, 1000);
  EXPECT_EQ(MaskOf(n, p, 99, 1000), a);  // same seed + offset => same mask
  // Independent Bernoulli masks differ in a fraction 2p(1-p) of places.
  const double expected_differ = 2.0 * p * (1.0 - p);
  EXPECT_NEAR(DifferingFraction(MaskOf(n, p, 99, 1001), a), expected_differ, 0.01);
  EXPECT_NEAR(DifferingFraction(MaskOf(n, p, 99, 1000 + n), a), expected_differ, 0.01);
  EXPECT_NEAR(DifferingFraction(MaskOf(n, p, 100, 1000), a), expected_differ, 0.01);
  // Chunks with shifted offsets reproduce the whole: the draw depends on offset + i only.
  const int64_t split = 12345;
  std::vector<uint8_t> head = MaskOf(split, p, 99, 1000);
  const std::vector<uint8_t> tail = MaskOf(n - split, p, 99, 1000 + split);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, a);
  for (int64_t i : {int64_t{0}, int64_t{1}, split, n - 1}) {
    EXPECT_EQ(DropoutKeep(99, 1000 + i, p), a[i] != 0) << i;
  }
}

TEST(DropoutTest, MaskIndependentOfThreadCount) {
  const int64_t n = 1000003;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<uint8_t> one = MaskOf(n, 0.1f, 5, 77);
  omp_set_num_threads(2);
  ASSERT_EQ(omp_get_max_threads(), 2);
  const std::vector<uint8_t> two = MaskOf(n, 0.1f, 5, 77);
  omp_set_num_threads(3);
  const std::vector<uint8_t> three = MaskOf(n, 0.1f, 5, 77);
  omp_set_num_threads(saved_threads);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

TEST(DropoutTest, BackwardRoutesOnlyThroughKeptElements) {
  const int64_t n = 300;
  const float p = 0.4f;
  std::mt19937 rng(11);
  const Tensor x = RandomTensor({n}, rng);
  const Tensor dy = RandomTensor({n}, rng);
  Tensor y({n}), dx({n});
  std::vector<uint8_t> mask(n);
  DropoutForward(x.data(), n, p, 3, 0, y.data(), mask.data());
  DropoutBackward(dy.data(), mask.data(), n, p, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i]) {
      EXPECT_FLOAT_EQ(dx.data()[i], dy.data()[i] / (1.0f - p)) << i;
    } else {
      EXPECT_EQ(dx.data()[i], 0.0f) << i;
    }
  }
  // Finite differences through the forward (same seed and offset => same mask); the map is
  // linear, so the quotient is exact up to fp32 rounding.
  Tensor xf = x;
  std::vector<double> dyd = ToDouble(dy);
  std::function<double()> loss = [&] {
    DropoutForward(xf.data(), n, p, 3, 0, y.data(), nullptr);
    return Dot(dyd, y.data());
  };
  EXPECT_LT(RelativeError(dx.data(), CentralDifference(xf.data(), n, kFloatStep, loss)),
            kTolerance);
  // dx may alias dy.
  Tensor in_place = dy;
  DropoutBackward(in_place.data(), mask.data(), n, p, in_place.data());
  EXPECT_EQ(in_place.values(), dx.values());
}

}  // namespace
}  // namespace attn
