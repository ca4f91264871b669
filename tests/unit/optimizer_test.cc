// AdamW against a naive double-precision re-implementation of the torch.optim.AdamW formula,
// the linear warm-up schedule against transformers' definition, clip_grad_norm_ semantics, and
// TrainableSet selection over a tiny BertWeights.
#include "engine/training/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model_config.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "nlohmann/json.hpp"
#include "tests/test_model.h"
#include "tests/test_policy.h"
#include "tests/test_util.h"

namespace attn {
namespace {

using testing::RandomTensor;

// ------------------------------------------------------------------------------------------
// AdamW

// torch.optim.AdamW's documented algorithm, one scalar at a time, in double.
struct NaiveAdamW {
  double lr_wd, b1, b2, eps;
  double p, m = 0, v = 0;
  int t = 0;
  void Step(double g, double lr, double wd, bool decay) {
    ++t;
    if (decay) p -= lr * wd * p;  // theta_t = theta_{t-1} - gamma * lambda * theta_{t-1}
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, t));
    const double v_hat = v / (1 - std::pow(b2, t));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(AdamWTest, MatchesNaiveFormulaOverThreeStepsWithDecayGroups) {
  std::mt19937 rng(1);
  Tensor w = RandomTensor({3, 4}, rng), b = RandomTensor({4}, rng);
  Tensor dw({3, 4}), db({4});
  std::vector<ParamEntry> params = {{"layer.weight", &w, &dw, true},
                                    {"layer.bias", &b, &db, false}};
  AdamWOptions options;
  options.lr = 1e-2;  // large enough that decay and the update are both visible in fp32
  options.weight_decay = 0.1;
  absl::StatusOr<AdamW> opt = AdamW::Create(params, options);
  ASSERT_TRUE(opt.ok()) << opt.status();

  std::vector<NaiveAdamW> naive_w, naive_b;
  for (float x : w.values()) naive_w.push_back({0, 0.9, 0.999, 1e-6, x});
  for (float x : b.values()) naive_b.push_back({0, 0.9, 0.999, 1e-6, x});

  const double lrs[] = {1e-2, 5e-3, 2e-2};  // a schedule changes lr between steps
  for (int step = 0; step < 3; ++step) {
    for (float& g : dw.values()) g = std::normal_distribution<float>(0, 0.3f)(rng);
    for (float& g : db.values()) g = std::normal_distribution<float>(0, 0.3f)(rng);
    ASSERT_TRUE(opt->Step(lrs[step]).ok());
    for (int64_t i = 0; i < w.numel(); ++i) {
      naive_w[i].Step(dw.data()[i], lrs[step], options.weight_decay, true);
      EXPECT_NEAR(w.data()[i], naive_w[i].p, 2e-6) << "step " << step << " weight " << i;
    }
    for (int64_t i = 0; i < b.numel(); ++i) {
      naive_b[i].Step(db.data()[i], lrs[step], options.weight_decay, false);
      EXPECT_NEAR(b.data()[i], naive_b[i].p, 2e-6) << "step " << step << " bias " << i;
    }
  }
  EXPECT_EQ(opt->step_count(), 3);
  EXPECT_EQ(opt->state(0).step, 3);
  EXPECT_NEAR(opt->state(0).exp_avg.data()[0], naive_w[0].m, 1e-6);
  EXPECT_NEAR(opt->state(1).exp_avg_sq.data()[2], naive_b[2].v, 1e-7);
}

TEST(AdamWTest, DecayOnlyTouchesDecayedGroup) {
  // Zero gradient: the Adam update is 0, so only decoupled weight decay moves parameters.
  Tensor w({2}, {1.0f, -2.0f}), b({2}, {1.0f, -2.0f});
  Tensor dw({2}), db({2});
  AdamWOptions options;
  options.weight_decay = 0.5;
  AdamW opt = *AdamW::Create({{"w", &w, &dw, true}, {"b", &b, &db, false}}, options);
  ASSERT_TRUE(opt.Step(0.1).ok());
  EXPECT_FLOAT_EQ(w.data()[0], 1.0f * 0.95f);
  EXPECT_FLOAT_EQ(w.data()[1], -2.0f * 0.95f);
  EXPECT_EQ(b.data()[0], 1.0f);
  EXPECT_EQ(b.data()[1], -2.0f);
}

TEST(AdamWTest, FirstStepUpdateIsLrTimesSignOfGradient) {
  // t = 1: m_hat = g, v_hat = g^2, so p -= lr * g / (|g| + eps).
  Tensor p({3}, {0.0f, 0.0f, 0.0f}), g({3}, {0.5f, -2.0f, 1e-3f});
  AdamWOptions options;
  options.eps = 0.0;
  AdamW opt = *AdamW::Create({{"p", &p, &g, false}}, options);
  ASSERT_TRUE(opt.state(0).exp_avg.empty());  // lazily allocated
  ASSERT_TRUE(opt.Step(1e-3).ok());
  EXPECT_FLOAT_EQ(p.data()[0], -1e-3f);
  EXPECT_FLOAT_EQ(p.data()[1], 1e-3f);
  EXPECT_FLOAT_EQ(p.data()[2], -1e-3f);
  EXPECT_EQ(opt.state(0).exp_avg.shape(), p.shape());
}

TEST(AdamWTest, ZeroLrStepLeavesParamsButAdvancesMoments) {
  // The first scheduled step with warm-up runs at lr 0 (as LambdaLR): no change, moments move.
  Tensor p({2}, {1.0f, 2.0f}), g({2}, {0.1f, 0.2f});
  AdamW opt = *AdamW::Create({{"p", &p, &g, true}});
  ASSERT_TRUE(opt.Step(LinearScheduleLr(2e-5, 0, 10, 100)).ok());
  EXPECT_EQ(p.data()[0], 1.0f);
  EXPECT_EQ(p.data()[1], 2.0f);
  EXPECT_FLOAT_EQ(opt.state(0).exp_avg.data()[1], 0.1f * 0.2f);
  EXPECT_EQ(opt.state(0).step, 1);
}

TEST(AdamWTest, DefaultsAreSentenceTransformers) {
  const AdamWOptions o;
  EXPECT_DOUBLE_EQ(o.lr, 2e-5);
  EXPECT_DOUBLE_EQ(o.beta1, 0.9);
  EXPECT_DOUBLE_EQ(o.beta2, 0.999);
  EXPECT_DOUBLE_EQ(o.eps, 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
}

TEST(AdamWTest, CreateValidates) {
  Tensor p({2}), g({3}), g2({2});
  EXPECT_FALSE(AdamW::Create({{"p", &p, &g, true}}).ok());  // shape mismatch
  EXPECT_FALSE(AdamW::Create({{"p", &p, nullptr, true}}).ok());
  EXPECT_FALSE(AdamW::Create({{"p", &p, &g2, true}, {"p", &p, &g2, true}}).ok());  // duplicate
  AdamWOptions bad;
  bad.beta1 = 1.0;
  EXPECT_FALSE(AdamW::Create({{"p", &p, &g2, true}}, bad).ok());
  bad = AdamWOptions{};
  bad.lr = -1;
  EXPECT_FALSE(AdamW::Create({{"p", &p, &g2, true}}, bad).ok());
  AdamW opt = *AdamW::Create({{"p", &p, &g2, true}});
  EXPECT_FALSE(opt.Step(std::nan("")).ok());
  EXPECT_EQ(opt.step_count(), 0);
}

// ------------------------------------------------------------------------------------------
// Schedule

TEST(LinearScheduleTest, MatchesTransformersDefinition) {
  const double base = 2e-5;
  // warmup 10, total 100
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 0, 10, 100), 0.0);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 1, 10, 100), base * 0.1);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 5, 10, 100), base * 0.5);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 10, 10, 100), base);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 11, 10, 100), base * 89.0 / 90.0);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 55, 10, 100), base * 0.5);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 99, 10, 100), base / 90.0);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 100, 10, 100), 0.0);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 150, 10, 100), 0.0);  // clamped at 0
  // No warm-up: full lr at step 0, decaying over total.
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 0, 0, 4), base);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 3, 0, 4), base * 0.25);
  // Degenerate: warmup == total (denominator max(1, 0) = 1).
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 10, 10, 10), 0.0);
  EXPECT_DOUBLE_EQ(LinearScheduleLr(base, 9, 10, 10), base * 0.9);
}

// ------------------------------------------------------------------------------------------
// Clipping

TEST(ClipGradNormTest, BelowMaxLeavesGradients) {
  Tensor p1({2}), g1({2}, {0.3f, 0.0f}), p2({1}), g2({1}, {0.4f});
  const std::vector<ParamEntry> params = {{"a", &p1, &g1, true}, {"b", &p2, &g2, false}};
  absl::StatusOr<double> norm = ClipGradNorm(params, 1.0);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 0.5, 1e-7);
  EXPECT_EQ(g1.data()[0], 0.3f);
  EXPECT_EQ(g2.data()[0], 0.4f);
}

TEST(ClipGradNormTest, AboveMaxScalesToMaxNorm) {
  Tensor p1({2}), g1({2}, {3.0f, 0.0f}), p2({1}), g2({1}, {4.0f});
  const std::vector<ParamEntry> params = {{"a", &p1, &g1, true}, {"b", &p2, &g2, false}};
  absl::StatusOr<double> norm = ClipGradNorm(params, 1.0);
  ASSERT_TRUE(norm.ok());
  EXPECT_DOUBLE_EQ(*norm, 5.0);              // pre-clip
  const float coef = 1.0f / (5.0f + 1e-6f);  // fp32, as torch
  EXPECT_EQ(g1.data()[0], 3.0f * coef);
  EXPECT_EQ(g2.data()[0], 4.0f * coef);
  EXPECT_NEAR(GlobalGradNorm(params), 1.0, 1e-6);
}

TEST(ClipGradNormTest, NonFiniteNormIsAnErrorNamingTheTensor) {
  for (float bad : {std::nanf(""), INFINITY}) {
    Tensor p1({2}), g1({2}, {1.0f, 2.0f}), p2({3}), g2({3}, {0.0f, 0.0f, bad});
    const std::vector<ParamEntry> params = {{"ok", &p1, &g1, true}, {"broken", &p2, &g2, true}};
    absl::StatusOr<double> norm = ClipGradNorm(params, 1.0);
    EXPECT_EQ(norm.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(norm.status().message().find("broken[2]"), std::string::npos) << norm.status();
    EXPECT_EQ(g1.data()[0], 1.0f);  // untouched
  }
  Tensor p({1}), g({1}, {1.0f});
  EXPECT_EQ(ClipGradNorm({{"p", &p, &g, true}}, 0.0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClipGradNormTest, ComputeGradClipThenScaledStepEqualsClipThenStep) {
  // The trainer folds the clip into AdamW's read of the gradients: bit-identical weights.
  std::mt19937 rng(5);
  const Tensor w0 = RandomTensor({64, 8}, rng), g0 = RandomTensor({64, 8}, rng, 3.0f);
  Tensor w_clip = w0, g_clip = g0, w_fold = w0, g_fold = g0;
  const std::vector<ParamEntry> clipped = {{"w", &w_clip, &g_clip, true}};
  const std::vector<ParamEntry> folded = {{"w", &w_fold, &g_fold, true}};
  AdamW opt_clip = *AdamW::Create(clipped), opt_fold = *AdamW::Create(folded);

  absl::StatusOr<double> norm = ClipGradNorm(clipped, 1.0);
  absl::StatusOr<GradClip> clip = ComputeGradClip(folded, 1.0);
  ASSERT_TRUE(norm.ok() && clip.ok());
  EXPECT_EQ(*norm, clip->norm);
  ASSERT_LT(clip->coef, 1.0f);
  EXPECT_EQ(g_fold.values(), g0.values());  // ComputeGradClip leaves the gradients alone
  ASSERT_TRUE(opt_clip.Step(1e-3).ok());
  ASSERT_TRUE(opt_fold.Step(1e-3, clip->coef).ok());
  EXPECT_EQ(w_fold.values(), w_clip.values());
  EXPECT_EQ(opt_fold.state(0).exp_avg_sq.values(), opt_clip.state(0).exp_avg_sq.values());

  Tensor p({1}), g({1}, {1.0f});
  AdamW opt = *AdamW::Create({{"p", &p, &g, true}});
  EXPECT_EQ(opt.Step(1e-3, 1.5f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.Step(1e-3, std::nanf("")).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AdamWTest, Avx512KernelIsBitIdenticalToThePortableOne) {
  ATTN_SKIP_UNLESS_CPU_HAS("Avx512", UseAvx512Kernels());
  std::mt19937 rng(21);
  const Tensor w0 = RandomTensor({1000, 37}, rng), b0 = RandomTensor({37}, rng);  // odd tails
  Tensor w_vec = w0, w_ref = w0, b_vec = b0, b_ref = b0, dw({1000, 37}), db({37});
  AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.1;
  AdamW vec = *AdamW::Create({{"w", &w_vec, &dw, true}, {"b", &b_vec, &db, false}}, options);
  AdamW ref = *AdamW::Create({{"w", &w_ref, &dw, true}, {"b", &b_ref, &db, false}}, options);
  for (int step = 0; step < 4; ++step) {
    for (float& g : dw.values())
      g = std::normal_distribution<float>(0, step == 1 ? 1e-8f : 0.3f)(rng);
    for (float& g : db.values()) g = std::normal_distribution<float>(0, 0.3f)(rng);
    dw.data()[5] = 0.0f;
    const float scale = step == 2 ? 0.37f : 1.0f;
    ASSERT_TRUE(vec.Step(1e-2, scale).ok());
    SetAvx512KernelsEnabledForTesting(false);
    const absl::Status portable = ref.Step(1e-2, scale);
    SetAvx512KernelsEnabledForTesting(true);
    ASSERT_TRUE(portable.ok());
    ASSERT_EQ(w_vec.values(), w_ref.values()) << "step " << step;
    ASSERT_EQ(b_vec.values(), b_ref.values()) << "step " << step;
    ASSERT_EQ(vec.state(0).exp_avg_sq.values(), ref.state(0).exp_avg_sq.values());
  }
}

// ------------------------------------------------------------------------------------------
// Row-sparse gradients (ParamEntry::nonzero_rows): the same bits as the dense walk.

TEST(SparseRowsTest, NormClipAndAdamWAreBitIdenticalToDense) {
  // 3000 rows of 24: the norm's 16384-element chunks straddle rows, and rows come and go.
  constexpr int64_t kRows = 3000, kCols = 24;
  std::mt19937 rng(9);
  const Tensor w0 = RandomTensor({kRows, kCols}, rng);
  Tensor w_dense = w0, g_dense({kRows, kCols}), w_sparse = w0, g_sparse({kRows, kCols});
  Tensor b_dense = RandomTensor({5}, rng), b_sparse = b_dense, gb_dense({5}), gb_sparse({5});
  std::vector<int32_t> rows;
  const std::vector<ParamEntry> dense = {{"emb", &w_dense, &g_dense, true},
                                         {"bias", &b_dense, &gb_dense, false}};
  std::vector<ParamEntry> sparse = {{"emb", &w_sparse, &g_sparse, true},
                                    {"bias", &b_sparse, &gb_sparse, false}};
  sparse[0].nonzero_rows = &rows;
  AdamW opt_dense = *AdamW::Create(dense), opt_sparse = *AdamW::Create(sparse);

  std::uniform_int_distribution<int32_t> pick(0, kRows - 1);
  const double lrs[] = {0.0, 1e-2, 5e-3, 2e-2, 1e-2};  // lr 0 first, as with warm-up
  for (int step = 0; step < 5; ++step) {
    std::fill(g_dense.values().begin(), g_dense.values().end(), 0.0f);
    std::fill(g_sparse.values().begin(), g_sparse.values().end(), 0.0f);
    std::set<int32_t> used;
    for (int k = 0; k < 40; ++k) used.insert(pick(rng));
    used.insert(step == 0 ? 0 : kRows - 1);  // first and last rows too
    rows.assign(used.begin(), used.end());
    std::normal_distribution<float> normal(0.0f, step == 2 ? 50.0f : 0.5f);  // step 2 clips
    for (const int32_t row : rows) {
      for (int64_t c = 0; c < kCols; ++c) {
        g_dense.data()[row * kCols + c] = g_sparse.data()[row * kCols + c] = normal(rng);
      }
    }
    g_dense.data()[rows[0] * kCols] = g_sparse.data()[rows[0] * kCols] = 0.0f;  // zeros inside
    for (int64_t i = 0; i < 5; ++i) gb_dense.data()[i] = gb_sparse.data()[i] = normal(rng);

    ASSERT_EQ(GlobalGradNorm(sparse), GlobalGradNorm(dense)) << "step " << step;
    absl::StatusOr<double> norm_dense = ClipGradNorm(dense, 1.0);
    absl::StatusOr<GradClip> clip_sparse = ComputeGradClip(sparse, 1.0);
    ASSERT_TRUE(norm_dense.ok() && clip_sparse.ok());
    ASSERT_EQ(clip_sparse->norm, *norm_dense);
    ASSERT_TRUE(opt_dense.Step(lrs[step]).ok());
    ASSERT_TRUE(opt_sparse.Step(lrs[step], clip_sparse->coef).ok());
    ASSERT_EQ(w_sparse.values(), w_dense.values()) << "step " << step;
    ASSERT_EQ(b_sparse.values(), b_dense.values()) << "step " << step;
    ASSERT_EQ(opt_sparse.state(0).exp_avg.values(), opt_dense.state(0).exp_avg.values());
    ASSERT_EQ(opt_sparse.state(0).exp_avg_sq.values(), opt_dense.state(0).exp_avg_sq.values());
  }
  // A row never listed only decayed; the sparse clip scales only listed rows, like the dense.
  int32_t never = 0;
  while (opt_sparse.state(0).live_rows[never]) ++never;
  EXPECT_NE(w_sparse.data()[never * kCols], w0.data()[never * kCols]);
  const std::vector<int32_t> listed = rows;
  for (float& g : g_sparse.values()) g = 0.0f;
  for (const int32_t row : listed) g_sparse.data()[row * kCols] = 10.0f;
  g_dense = g_sparse;
  gb_dense = gb_sparse;
  ASSERT_TRUE(ClipGradNorm(sparse, 1.0).ok());
  ASSERT_TRUE(ClipGradNorm(dense, 1.0).ok());
  EXPECT_EQ(g_sparse.values(), g_dense.values());
}

// Training telemetry's sums (StepRowSums): the update is bit-identical to a Step without them
// (dense, sparse rows, undecayed, clipped), and each row's sums equal double loops over the
// gradient and the weights before and after the step.
TEST(StepRowSumsTest, UpdatesLikeAPlainStepAndSumsEachRowLikeANaiveLoop) {
  constexpr int64_t kRows = 2500, kCols = 24;  // 60,000 elements: the parallel path
  std::mt19937 rng(21);
  const Tensor w0 = RandomTensor({kRows, kCols}, rng), b0 = RandomTensor({7}, rng);
  const Tensor q0 = RandomTensor({9, 1500}, rng);  // rows longer than a block
  Tensor w_plain = w0, w_sums = w0, b_plain = b0, b_sums = b0, q_plain = q0, q_sums = q0;
  Tensor gw({kRows, kCols}), gb({7}), gq({9, 1500});
  std::vector<int32_t> rows;
  std::vector<ParamEntry> plain = {
      {"emb", &w_plain, &gw, true}, {"bias", &b_plain, &gb, false}, {"q", &q_plain, &gq, true}};
  std::vector<ParamEntry> summed = {
      {"emb", &w_sums, &gw, true}, {"bias", &b_sums, &gb, false}, {"q", &q_sums, &gq, true}};
  plain[0].nonzero_rows = summed[0].nonzero_rows = &rows;
  AdamW opt_plain = *AdamW::Create(plain), opt_sums = *AdamW::Create(summed);
  StepRowSums sums;
  sums.initial = {w0.data(), b0.data(), q0.data()};
  std::uniform_int_distribution<int32_t> pick(0, kRows - 1);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (int step = 0; step < 3; ++step) {
    std::fill(gw.values().begin(), gw.values().end(), 0.0f);
    std::set<int32_t> used = {0, static_cast<int32_t>(kRows - 1)};
    for (int k = 0; k < 30; ++k) used.insert(pick(rng));
    rows.assign(used.begin(), used.end());
    for (const int32_t row : rows) {
      for (int64_t c = 0; c < kCols; ++c) gw.data()[row * kCols + c] = normal(rng);
    }
    for (float& g : gb.values()) g = normal(rng);
    for (float& g : gq.values()) g = normal(rng);
    const std::vector<Tensor> before = {w_sums, b_sums, q_sums};
    const float coef = step == 1 ? 0.25f : 1.0f;  // a clipped step
    ASSERT_TRUE(opt_plain.Step(1e-2, coef).ok());
    ASSERT_TRUE(opt_sums.Step(1e-2, coef, &sums).ok());
    ASSERT_EQ(w_sums.values(), w_plain.values()) << "step " << step;
    ASSERT_EQ(b_sums.values(), b_plain.values()) << "step " << step;
    ASSERT_EQ(q_sums.values(), q_plain.values()) << "step " << step;
    for (size_t i = 0; i < summed.size(); ++i) {
      ASSERT_EQ(opt_sums.state(i).exp_avg.values(), opt_plain.state(i).exp_avg.values());
      ASSERT_EQ(opt_sums.state(i).exp_avg_sq.values(), opt_plain.state(i).exp_avg_sq.values());
      const Tensor& p = *summed[i].param;
      const int64_t n_rows = p.dim(0), row_len = p.numel() / n_rows;
      ASSERT_EQ(sums.grad_sq[i].size(), static_cast<size_t>(n_rows));
      for (int64_t r = 0; r < n_rows; ++r) {
        double grad = 0, update = 0, moved = 0;
        for (int64_t k = r * row_len; k < (r + 1) * row_len; ++k) {
          grad += double{summed[i].grad->data()[k]} * summed[i].grad->data()[k];
          update += std::pow(double{p.data()[k]} - before[i].data()[k], 2);
          moved += std::pow(double{p.data()[k]} - sums.initial[i][k], 2);
        }
        // Same terms, summed in another order: equal to a few ulps.
        ASSERT_NEAR(sums.grad_sq[i][r], grad, 1e-12 * (1 + grad)) << i << " row " << r;
        ASSERT_NEAR(sums.update_sq[i][r], update, 1e-12 * (1 + update)) << i << " row " << r;
        ASSERT_NEAR(sums.moved_sq[i][r], moved, 1e-12 * (1 + moved)) << i << " row " << r;
      }
    }
    // A row whose gradient was never listed only decayed: its update is non-zero, its
    // gradient sum zero.
    int32_t never = 1;
    while (opt_sums.state(0).live_rows[never]) ++never;
    EXPECT_EQ(sums.grad_sq[0][never], 0.0);
    EXPECT_GT(sums.update_sq[0][never], 0.0);
  }
  sums.initial.pop_back();
  EXPECT_EQ(opt_sums.Step(1e-2, 1.0f, &sums).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SparseRowsTest, MalformedRowListIsRejectedBeforeAnyUpdate) {
  Tensor w({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}), g({4, 2});
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{2, 1}, {1, 1}, {4}, {-1}}) {
    std::vector<int32_t> rows = bad;
    std::vector<ParamEntry> params = {{"emb", &w, &g, true}};
    params[0].nonzero_rows = &rows;
    AdamW opt = *AdamW::Create(params);
    const Tensor before = w;
    absl::Status status = opt.Step(1e-2);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("emb"), std::string::npos) << status;
    EXPECT_EQ(w.values(), before.values());
  }
}

// ------------------------------------------------------------------------------------------
// TrainableSet

class TrainableSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.vocab_size = 11;
    config_.hidden_size = 4;
    config_.num_hidden_layers = 2;
    config_.num_attention_heads = 2;
    config_.intermediate_size = 8;
    config_.max_position_embeddings = 7;
    table_ = BuildParameterTable(config_, &weights_);
    BuildParameterTable(config_, &grads_);
    head_ = MakeClassificationHead(3, 4, HeadInit::kNormal, 1);
    head_grads_ = ZerosLike(head_);
  }

  std::map<std::string, ParamEntry> Collect(TrainableSet set, bool with_head) {
    absl::StatusOr<std::vector<ParamEntry>> entries = CollectTrainableParameters(
        &weights_, &grads_, set, with_head ? &head_ : nullptr, with_head ? &head_grads_ : nullptr);
    EXPECT_TRUE(entries.ok()) << entries.status();
    std::map<std::string, ParamEntry> by_name;
    for (const ParamEntry& e : *entries) {
      EXPECT_TRUE(by_name.emplace(e.name, e).second) << "duplicate " << e.name;
      EXPECT_EQ(e.param->shape(), e.grad->shape()) << e.name;
    }
    return by_name;
  }

  BertConfig config_;
  BertWeights weights_, grads_;
  std::vector<ParameterSlot> table_;
  ClassificationHead head_, head_grads_;
};

TEST_F(TrainableSetTest, AllCoversEveryTableTensorOnceWithItsGradient) {
  const auto entries = Collect(TrainableSet::kAll, false);
  EXPECT_EQ(entries.size(), 5u + 12u * 2);
  std::set<const Tensor*> from_table, from_entries;
  for (const ParameterSlot& s : table_) from_table.insert(s.target);
  for (const auto& [name, e] : entries) from_entries.insert(e.param);
  EXPECT_EQ(from_table, from_entries);
  // Gradients are the same member of the gradient struct.
  const ParamEntry& qkv = entries.at("encoder.layer.1.attention.self.qkv.weight");
  EXPECT_EQ(qkv.param, &weights_.layers[1].qkv_weight);
  EXPECT_EQ(qkv.grad, &grads_.layers[1].qkv_weight);
  EXPECT_EQ(entries.at("embeddings.word_embeddings.weight").grad, &grads_.word_embeddings);
}

TEST_F(TrainableSetTest, DecayFollowsSentenceTransformersNoDecayRule) {
  for (bool with_head : {false, true}) {
    for (const auto& [name, e] : Collect(TrainableSet::kAll, with_head)) {
      // sentence-transformers: no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"].
      const bool no_decay =
          absl::StrContains(name, "bias") || absl::StrContains(name, "LayerNorm.weight");
      EXPECT_EQ(e.decay, !no_decay) << name;
    }
  }
  const auto entries = Collect(TrainableSet::kAll, true);
  EXPECT_FALSE(entries.at("encoder.layer.0.attention.self.qkv.bias").decay);  // fused bias
  EXPECT_TRUE(entries.at("encoder.layer.0.attention.self.qkv.weight").decay);
  EXPECT_FALSE(entries.at("embeddings.LayerNorm.weight").decay);
  EXPECT_TRUE(entries.at("embeddings.position_embeddings.weight").decay);
  EXPECT_TRUE(entries.at("classifier.weight").decay);
  EXPECT_FALSE(entries.at("classifier.bias").decay);
}

TEST_F(TrainableSetTest, AttentionOnlyPicksQkvAndOutputProjection) {
  const auto entries = Collect(TrainableSet::kAttentionOnly, false);
  std::set<const Tensor*> expected;
  for (LayerWeights& l : weights_.layers) {
    expected.insert({&l.qkv_weight, &l.qkv_bias, &l.attn_output_weight, &l.attn_output_bias});
  }
  std::set<const Tensor*> got;
  for (const auto& [name, e] : entries) got.insert(e.param);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(entries.size(), 8u);
  EXPECT_EQ(Collect(TrainableSet::kAttentionOnly, true).count("classifier.weight"), 1u);
}

TEST_F(TrainableSetTest, AllButEmbeddingsFreezesEmbeddingsAndTheirNorm) {
  const auto entries = Collect(TrainableSet::kAllButEmbeddings, false);
  EXPECT_EQ(entries.size(), 12u * 2);
  for (const auto& [name, e] : entries) {
    EXPECT_TRUE(absl::StartsWith(name, "encoder.layer.")) << name;
  }
  EXPECT_EQ(entries.count("encoder.layer.0.output.LayerNorm.bias"), 1u);
}

TEST_F(TrainableSetTest, HeadOnly) {
  const auto entries = Collect(TrainableSet::kHeadOnly, true);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries.at("classifier.weight").param, &head_.weight);
  EXPECT_EQ(entries.at("classifier.bias").grad, &head_grads_.bias);
  EXPECT_FALSE(CollectTrainableParameters(&weights_, &grads_, TrainableSet::kHeadOnly).ok());
}

TEST_F(TrainableSetTest, MismatchedGradientIsAnErrorNamingTheTensor) {
  grads_.layers[1].ffn_in_bias = Tensor({3});
  absl::StatusOr<std::vector<ParamEntry>> entries =
      CollectTrainableParameters(&weights_, &grads_, TrainableSet::kAll);
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(entries.status().message().find("encoder.layer.1.intermediate.dense.bias"),
            std::string::npos)
      << entries.status();
  // Not selected: not checked.
  EXPECT_TRUE(CollectTrainableParameters(&weights_, &grads_, TrainableSet::kAttentionOnly).ok());
}

TEST_F(TrainableSetTest, OptimizerOverSelectionOnlyMovesSelectedTensors) {
  for (const ParameterSlot& s : table_)
    std::fill(s.target->values().begin(), s.target->values().end(), 1.0f);
  absl::StatusOr<std::vector<ParamEntry>> all =
      CollectTrainableParameters(&weights_, &grads_, TrainableSet::kAll);
  for (const ParamEntry& e : *all)
    std::fill(e.grad->values().begin(), e.grad->values().end(), 1.0f);
  AdamW opt =
      *AdamW::Create(*CollectTrainableParameters(&weights_, &grads_, TrainableSet::kAttentionOnly));
  ASSERT_TRUE(opt.Step(1e-3).ok());
  EXPECT_NE(weights_.layers[0].qkv_bias.data()[0], 1.0f);
  EXPECT_NE(weights_.layers[1].attn_output_weight.data()[0], 1.0f);
  EXPECT_EQ(weights_.layers[0].ffn_in_weight.data()[0], 1.0f);
  EXPECT_EQ(weights_.word_embeddings.data()[0], 1.0f);
  ZeroGrads(*all);
  EXPECT_EQ(GlobalGradNorm(*all), 0.0);
}

// ------------------------------------------------------------------------------------------
// Parity with PyTorch: one clip_grad_norm_(1.0) + AdamW step on MiniLM's real gradients,
// recorded by tests/golden/make_grad_golden.py (format in its docstring / README_grad.md).
// The fixture stores gradients partially: small tensors in full, large ones at 512 sampled
// flat indices, the word/position embeddings also as complete used rows. Unrecorded elements
// get gradient 0 here and are not compared. Because the global norm needs *all* gradients, a
// one-element "filler" gradient carries the unrecorded part of the recorded pre-clip norm, so
// ClipGradNorm itself computes the norm and the coefficient.

std::vector<int64_t> ReadI64(const SafetensorsFile& file, const std::string& name) {
  const TensorInfo* info = file.Find(name);
  EXPECT_NE(info, nullptr) << name;
  if (info == nullptr) return {};
  EXPECT_EQ(info->dtype, DType::kI64) << name;
  const std::string_view raw = file.RawBytes(*info);
  std::vector<int64_t> out(raw.size() / sizeof(int64_t));
  std::memcpy(out.data(), raw.data(), out.size() * sizeof(int64_t));  // little-endian host
  return out;
}

Tensor ReadF32(const SafetensorsFile& file, const std::string& name) {
  absl::StatusOr<Tensor> t = file.ReadFloat32(name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : Tensor();
}

TEST(AdamWGoldenTest, OneClippedStepMatchesTorchOnMiniLmGradients) {
  const std::string golden_dir = ATTN_GOLDEN_DIR;
  const std::string model_dir = testing::TestModelDir();
  std::ifstream json_file(golden_dir + "/grad_cases.json");
  ASSERT_TRUE(json_file.good()) << "missing tests/golden/grad_cases.json";
  const nlohmann::json doc = nlohmann::json::parse(json_file, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "tests/golden/grad_cases.json is not valid JSON";
  const nlohmann::json& adam = doc.at("adamw");
  const std::string case_name = adam.at("case");
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> golden =
      SafetensorsFile::Open(golden_dir + "/grad_golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  absl::StatusOr<BertConfig> config = LoadBertConfig(model_dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> model_file =
      SafetensorsFile::Open(model_dir + "/model.safetensors");
  ASSERT_TRUE(model_file.ok()) << model_file.status();

  BertWeights weights, grads;
  const std::vector<ParameterSlot> table = BuildParameterTable(*config, &weights);
  const std::vector<ParameterSlot> grad_table = BuildParameterTable(*config, &grads);
  absl::StatusOr<BertWeights> loaded = LoadBertWeights(**model_file, *config);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // Copy-assign (not move): same shapes, so the layer vector keeps its elements in place and
  // `table` keeps pointing into `weights`; checked below.
  weights = *loaded;
  ASSERT_EQ(table.back().target, &weights.layers.back().ffn_norm_beta);
  std::map<std::string, size_t> slot_of;
  for (size_t i = 0; i < table.size(); ++i) slot_of[table[i].hf_name] = i;

  // Scatter the recorded gradients; remember where the recorded after-step values belong.
  struct Check {
    const Tensor* param;
    int64_t index;
    float before, expected;
    std::string name;
  };
  std::vector<Check> checks;
  std::map<const Tensor*, bool> golden_decay;
  for (const nlohmann::json& p : doc.at("params")) {
    const std::string name = p.at("name");
    if (p.at("storage") == "none") continue;  // pooler: not in the graph
    ASSERT_EQ(slot_of.count(name), 1u) << name;
    const ParameterSlot& slot = table[slot_of[name]];
    Tensor* param = slot.target;
    Tensor* grad = grad_table[slot_of[name]].target;
    const int64_t row_len = param->numel() / param->dim(0);
    const int64_t base = slot.row_offset * row_len;  // fused QKV row block
    golden_decay[param] = p.at("weight_decay").get<double>() > 0.0;
    auto record = [&](int64_t flat, float g, float after) {
      grad->data()[base + flat] = g;
      checks.push_back({param, base + flat, param->data()[base + flat], after, name});
    };
    const std::string g_ = case_name + ".grad.", a_ = case_name + ".after_step.";
    if (p.at("storage") == "full") {
      const Tensor g = ReadF32(**golden, g_ + name), a = ReadF32(**golden, a_ + name);
      ASSERT_EQ(g.numel(), p.at("numel").get<int64_t>()) << name;
      for (int64_t k = 0; k < g.numel(); ++k) record(k, g.data()[k], a.data()[k]);
    } else {
      const std::vector<int64_t> idx = ReadI64(**golden, case_name + ".grad_idx." + name);
      const Tensor g = ReadF32(**golden, case_name + ".grad_val." + name);
      const Tensor a = ReadF32(**golden, case_name + ".after_step_val." + name);
      ASSERT_EQ(static_cast<int64_t>(idx.size()), g.numel()) << name;
      for (size_t k = 0; k < idx.size(); ++k) record(idx[k], g.data()[k], a.data()[k]);
    }
    if (!p.at("rows").is_null()) {
      const std::vector<int64_t> rows = ReadI64(**golden, case_name + ".grad_rows." + name);
      const Tensor g = ReadF32(**golden, g_ + name), a = ReadF32(**golden, a_ + name);
      ASSERT_EQ(g.numel(), static_cast<int64_t>(rows.size()) * row_len) << name;
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t c = 0; c < row_len; ++c) {
          record(rows[r] * row_len + c, g.data()[r * row_len + c], a.data()[r * row_len + c]);
        }
      }
    }
  }

  absl::StatusOr<std::vector<ParamEntry>> entries =
      CollectTrainableParameters(&weights, &grads, TrainableSet::kAll);
  ASSERT_TRUE(entries.ok()) << entries.status();
  for (const ParamEntry& e : *entries) {
    ASSERT_EQ(golden_decay.count(e.param), 1u) << e.name;
    EXPECT_EQ(e.decay, golden_decay[e.param]) << e.name;  // torch's two param groups
  }

  // Clip: recorded gradients + filler carrying the rest of torch's pre-clip norm.
  const double pre_clip = adam.at("pre_clip_global_norm");
  const double known = GlobalGradNorm(*entries);
  ASSERT_LE(known, pre_clip * (1 + 1e-6));
  Tensor filler_param({1}),
      filler_grad(
          {1}, {static_cast<float>(std::sqrt(std::max(0.0, pre_clip * pre_clip - known * known)))});
  std::vector<ParamEntry> with_filler = *entries;
  with_filler.push_back({"filler", &filler_param, &filler_grad, false});
  absl::StatusOr<double> norm = ClipGradNorm(with_filler, adam.at("max_grad_norm"));
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(*norm, pre_clip, 1e-6 * pre_clip);
  EXPECT_EQ(*norm > adam.at("max_grad_norm").get<double>(), adam.at("clip_applied").get<bool>());
  EXPECT_NEAR(GlobalGradNorm(with_filler),
              std::min<double>(pre_clip, adam.at("max_grad_norm")) *
                  adam.at("clip_coef").get<double>() * (pre_clip + 1e-6) /
                  adam.at("max_grad_norm").get<double>(),
              1e-6);

  AdamWOptions options;
  options.lr = adam.at("lr");
  options.beta1 = adam.at("betas")[0];
  options.beta2 = adam.at("betas")[1];
  options.eps = adam.at("eps");
  options.weight_decay = adam.at("weight_decay");
  absl::StatusOr<AdamW> opt = AdamW::Create(*entries, options);
  ASSERT_TRUE(opt.ok()) << opt.status();
  ASSERT_TRUE(opt->Step().ok());

  // Torch and this code evaluate the same fp32 expressions (clip coefficient included), so the
  // result is expected bit-identical; the 2-ulp allowance only absorbs a global norm that
  // rounds to a neighbouring fp32 value. Ulps are those of the largest operand of the final
  // p - step, max(|p_before|, |p_after|, lr): near-zero parameters cancel against the update.
  const float lr_f = static_cast<float>(options.lr);
  double worst = 0.0, worst_ulps = 0.0, largest_change = 0.0;
  int64_t mismatches = 0, bit_identical = 0;
  for (const Check& c : checks) {
    const float got = c.param->data()[c.index];
    const double diff = std::abs(double{got} - c.expected);
    const float scale = std::max({std::abs(c.before), std::abs(c.expected), lr_f});
    const double ulp = std::nextafter(scale, INFINITY) - scale;
    bit_identical += diff == 0.0;
    worst = std::max(worst, diff);
    worst_ulps = std::max(worst_ulps, diff / ulp);
    largest_change = std::max(largest_change, std::abs(double{c.expected} - c.before));
    if (diff > 2 * ulp && ++mismatches <= 10) {
      ADD_FAILURE() << c.name << "[" << c.index << "]: before " << c.before << ", torch "
                    << c.expected << ", engine " << got;
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(largest_change, 1e-5);  // the step really moved parameters
  std::cout << "compared " << checks.size() << " recorded elements, " << bit_identical
            << " bit-identical; max |diff| " << worst << " (" << worst_ulps
            << " ulp); largest torch change " << largest_change << "\n";
}

}  // namespace
}  // namespace attn
