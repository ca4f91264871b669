// Backward ops (softmax, attention with and without probability dropout, embedding, pooling,
// L2 normalisation) against central finite differences.
//
// Method: for fixed random upstream gradients dy, L(inputs) = sum(dy * forward(inputs)) is
// evaluated by a naive DOUBLE-precision forward written here, and dL/dinput is estimated by
// central differences (L(x + h) - L(x - h)) / 2h with h = 1e-6 for every input element; in
// double the estimate is accurate to ~1e-9, so the comparison measures the fp32 backward
// alone. Where the engine has a forward, the naive forward is first checked against it, so
// the finite differences differentiate the function the engine actually computes.
// Error metric: max_i |grad_i - fd_i| / max_i |fd_i| (relative to the gradient's scale, so
// near-zero entries do not divide by ~0); the bar is 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/ops/attention.h"
#include "engine/ops/embedding.h"
#include "engine/ops/pooling.h"
#include "engine/ops/segment_product.h"
#include "engine/ops/softmax.h"
#include "tests/test_util.h"

namespace attn {
namespace {

constexpr double kFdStep = 1e-6;
constexpr double kMaxRelError = 1e-3;

using testing::RandomVector;

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central differences of `loss` w.r.t. every element of x.
std::vector<double> NumericalGradient(const std::function<double(const std::vector<double>&)>& loss,
                                      std::vector<double> x) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kFdStep;
    const double plus = loss(x);
    x[i] = saved - kFdStep;
    const double minus = loss(x);
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * kFdStep);
  }
  return grad;
}

// max |got - want| / max |want|; `got` and `want` have the same length.
double RelError(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / std::max(scale, 1e-12);
}

double Dot(const std::vector<double>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Softmax

std::vector<double> NaiveSoftmax(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * cols;
    const double max = *std::max_element(row, row + cols);
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - max);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = std::exp(row[j] - max) / sum;
  }
  return y;
}

TEST(SoftmaxBackwardTest, MatchesFiniteDifferences) {
  std::mt19937 rng(11);
  for (int64_t rows : {1, 2, 5}) {
    for (int64_t cols : {1, 2, 3, 8}) {
      const std::vector<float> x = RandomVector(rows * cols, rng, 2.0f);
      const std::vector<float> dy = RandomVector(rows * cols, rng);
      ExecContext ctx;
      std::vector<float> y(x.size()), dx(x.size());
      SoftmaxForward(ctx, x.data(), rows, cols, y.data());
      SoftmaxBackward(ctx, y.data(), dy.data(), rows, cols, dx.data());
      const std::vector<double> fd = NumericalGradient(
          [&](const std::vector<double>& xs) { return Dot(NaiveSoftmax(xs, rows, cols), dy); },
          ToDouble(x));
      EXPECT_LE(RelError(dx, fd), kMaxRelError) << rows << "x" << cols;
    }
  }
}

TEST(SoftmaxBackwardTest, LargeRowsMatchClosedFormAndAllowInPlace) {
  // Attention-sized rows exercise the vectorised oneDNN kernel; the closed form is exact in
  // double, so compare against it rather than run ~10^4 finite differences.
  std::mt19937 rng(12);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{96, 128}, {3, 1000}}) {
    const std::vector<float> x = RandomVector(rows * cols, rng, 3.0f);
    const std::vector<float> dy = RandomVector(rows * cols, rng);
    ExecContext ctx;
    std::vector<float> y(x.size()), dx(x.size());
    SoftmaxForward(ctx, x.data(), rows, cols, y.data());
    SoftmaxBackward(ctx, y.data(), dy.data(), rows, cols, dx.data());
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0.0;
      for (int64_t j = 0; j < cols; ++j) dot += double{dy[r * cols + j]} * y[r * cols + j];
      for (int64_t j = 0; j < cols; ++j) {
        want[r * cols + j] = double{y[r * cols + j]} * (dy[r * cols + j] - dot);
      }
    }
    EXPECT_LE(RelError(dx, want), kMaxRelError) << rows << "x" << cols;
    std::vector<float> in_place = dy;
    SoftmaxBackward(ctx, y.data(), in_place.data(), rows, cols, in_place.data());
    EXPECT_EQ(in_place, dx) << "in-place result differs";
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttentionCase {
  int64_t tokens, heads, head_dim, qkv_pad, context_pad;
};

AttentionShape MakeShape(const AttentionCase& c) {
  AttentionShape s;
  s.tokens = c.tokens;
  s.heads = c.heads;
  s.head_dim = c.head_dim;
  s.qkv_stride = 3 * s.hidden() + c.qkv_pad;
  s.context_stride = s.hidden() + c.context_pad;
  return s;
}

// Naive double attention on a (T, qkv_stride) block. With `mask` (heads*T*T, keep = 1) the
// probabilities are dropped and rescaled by 1/(1-p) before multiplying V, as in HF BERT.
// Returns context (T, H) packed; optionally the undropped probs (heads, T, T).
std::vector<double> NaiveAttention(const AttentionShape& s, const std::vector<double>& qkv,
                                   const std::vector<uint8_t>* mask, double p,
                                   std::vector<double>* probs_out = nullptr) {
  testing::NaiveAttentionResult r =
      testing::NaiveAttention(qkv.data(), s.tokens, s.heads, s.head_dim, s.qkv_stride, mask, p);
  if (probs_out != nullptr) *probs_out = std::move(r.probs);
  return std::move(r.context);
}

// Gathers the T x 3H used columns of a (T, qkv_stride) block.
std::vector<float> UsedColumns(const AttentionShape& s, const std::vector<float>& block) {
  std::vector<float> out;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t c = 0; c < 3 * s.hidden(); ++c) out.push_back(block[t * s.qkv_stride + c]);
  }
  return out;
}
std::vector<double> UsedColumns(const AttentionShape& s, const std::vector<double>& block) {
  std::vector<double> out;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t c = 0; c < 3 * s.hidden(); ++c) out.push_back(block[t * s.qkv_stride + c]);
  }
  return out;
}
// Column range [begin, end) of each of the T rows of a packed (T, 3H) matrix.
template <typename V>
V Columns(const AttentionShape& s, const V& packed, int64_t begin, int64_t end) {
  V out;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t c = begin; c < end; ++c) out.push_back(packed[t * 3 * s.hidden() + c]);
  }
  return out;
}

class AttentionBackwardTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  void SetUp() override {
    const AttentionCase c = GetParam();
    shape_ = MakeShape(c);
    std::mt19937 rng(c.tokens * 1000 + c.heads * 100 + c.head_dim * 10 + c.qkv_pad);
    qkv_ = RandomVector(c.tokens * shape_.qkv_stride, rng);
    // dcontext rows with stride context_stride; only the first H columns are read.
    dcontext_ = RandomVector(c.tokens * shape_.context_stride, rng);
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t j = 0; j < shape_.hidden(); ++j) {
        dcontext_packed_.push_back(dcontext_[t * shape_.context_stride + j]);
      }
    }
    std::bernoulli_distribution keep(1.0 - kDropP);
    mask_.resize(c.heads * c.tokens * c.tokens);
    for (uint8_t& m : mask_) m = keep(rng) ? 1 : 0;
  }

  // Checks dQ, dK, dV of `dqkv` against finite differences of the naive forward (with
  // `mask` when non-null), and that the padding columns of dqkv were not written.
  void ExpectMatchesFiniteDifferences(const std::vector<float>& dqkv,
                                      const std::vector<uint8_t>* mask) {
    const int64_t H = shape_.hidden();
    const std::vector<double> fd_block = NumericalGradient(
        [&](const std::vector<double>& q) {
          const std::vector<double> context = NaiveAttention(shape_, q, mask, kDropP);
          return Dot(context, dcontext_packed_);
        },
        ToDouble(qkv_));
    const std::vector<double> fd = UsedColumns(shape_, fd_block);
    const std::vector<float> got = UsedColumns(shape_, dqkv);
    const char* names[] = {"dQ", "dK", "dV"};
    for (int part = 0; part < 3; ++part) {
      EXPECT_LE(RelError(Columns(shape_, got, part * H, (part + 1) * H),
                         Columns(shape_, fd, part * H, (part + 1) * H)),
                kMaxRelError)
          << names[part];
    }
    for (int64_t t = 0; t < shape_.tokens; ++t) {
      for (int64_t c = 3 * H; c < shape_.qkv_stride; ++c) {
        EXPECT_EQ(dqkv[t * shape_.qkv_stride + c], kSentinel) << "padding written";
      }
    }
  }

  static constexpr float kDropP = 0.1f;
  static constexpr float kSentinel = 12345.0f;
  AttentionShape shape_;
  std::vector<float> qkv_, dcontext_, dcontext_packed_;
  std::vector<uint8_t> mask_;
};

TEST_P(AttentionBackwardTest, NoDropoutMatchesFiniteDifferences) {
  const int64_t T = shape_.tokens, n = shape_.heads * T * T;
  ExecContext ctx;
  std::vector<float> probs(n), context(T * shape_.context_stride);
  AttentionForward(ctx, shape_, qkv_.data(), nullptr, probs.data(), context.data());
  // The naive forward is the function the engine computes.
  const std::vector<double> naive = NaiveAttention(shape_, ToDouble(qkv_), nullptr, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < shape_.hidden(); ++j) {
      EXPECT_NEAR(context[t * shape_.context_stride + j], naive[t * shape_.hidden() + j], 1e-5);
    }
  }
  std::vector<float> dqkv(qkv_.size(), kSentinel), scratch(2 * n);
  AttentionBackward(ctx, shape_, qkv_.data(), probs.data(), dcontext_.data(), dqkv.data(),
                    scratch.data());
  ExpectMatchesFiniteDifferences(dqkv, nullptr);
}

TEST_P(AttentionBackwardTest, FixedMaskDropoutMatchesFiniteDifferences) {
  const int64_t T = shape_.tokens, n = shape_.heads * T * T;
  ExecContext ctx;
  std::vector<float> probs(n), context(T * shape_.context_stride);
  AttentionForward(ctx, shape_, qkv_.data(), nullptr, probs.data(), context.data());
  std::vector<float> probs_dropped(n);
  for (int64_t i = 0; i < n; ++i) probs_dropped[i] = mask_[i] ? probs[i] / (1.0f - kDropP) : 0.0f;
  std::vector<float> dqkv(qkv_.size(), kSentinel), scratch(2 * n);
  AttentionBackward(ctx, shape_, qkv_.data(), probs.data(), probs_dropped.data(), mask_.data(),
                    kDropP, dcontext_.data(), dqkv.data(), scratch.data());
  ExpectMatchesFiniteDifferences(dqkv, &mask_);
}

TEST_P(AttentionBackwardTest, TrainingForwardDropsProbsAndBackwardMatches) {
  const int64_t T = shape_.tokens, H = shape_.hidden(), n = shape_.heads * T * T;
  ExecContext ctx;
  std::vector<float> probs(n), probs_dropped(n), context(T * shape_.context_stride);
  std::vector<uint8_t> mask(n, 7);
  AttentionForwardTraining(ctx, shape_, qkv_.data(), probs.data(), probs_dropped.data(),
                           mask.data(), kDropP, /*seed=*/42, /*offset=*/1000, context.data());
  std::vector<double> naive_probs;
  const std::vector<double> naive =
      NaiveAttention(shape_, ToDouble(qkv_), &mask, kDropP, &naive_probs);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(mask[i] == 0 || mask[i] == 1);
    EXPECT_NEAR(probs[i], naive_probs[i], 1e-6);
    // probs_dropped = probs * mask / (1 - p)
    EXPECT_NEAR(probs_dropped[i], mask[i] * probs[i] / (1.0 - kDropP), 1e-6);
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      EXPECT_NEAR(context[t * shape_.context_stride + j], naive[t * H + j], 1e-5);
    }
  }
  std::vector<float> dqkv(qkv_.size(), kSentinel), scratch(2 * n);
  AttentionBackward(ctx, shape_, qkv_.data(), probs.data(), probs_dropped.data(), mask.data(),
                    kDropP, dcontext_.data(), dqkv.data(), scratch.data());
  ExpectMatchesFiniteDifferences(dqkv, &mask);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionBackwardTest,
    ::testing::Values(AttentionCase{1, 1, 2, 0, 0}, AttentionCase{2, 1, 3, 0, 0},
                      AttentionCase{3, 2, 2, 0, 0}, AttentionCase{4, 3, 4, 0, 0},
                      AttentionCase{5, 2, 3, 2, 1}, AttentionCase{6, 3, 2, 5, 3},
                      AttentionCase{6, 1, 4, 1, 0}));

TEST(AttentionForwardTrainingTest, MaskIsReproducibleAndKeepsAboutOneMinusP) {
  AttentionShape s;
  s.tokens = 64;
  s.heads = 4;
  s.head_dim = 8;
  s.qkv_stride = 3 * s.hidden();
  s.context_stride = s.hidden();
  const int64_t n = s.heads * s.tokens * s.tokens;
  std::mt19937 rng(5);
  const std::vector<float> qkv = RandomVector(s.tokens * s.qkv_stride, rng);
  ExecContext ctx;
  auto run = [&](float p, uint64_t seed, uint64_t offset) {
    std::vector<float> probs(n), dropped(n), context(s.tokens * s.hidden());
    std::vector<uint8_t> mask(n);
    AttentionForwardTraining(ctx, s, qkv.data(), probs.data(), dropped.data(), mask.data(), p, seed,
                             offset, context.data());
    return std::make_pair(mask, context);
  };
  const auto [mask, context] = run(0.1f, 7, 0);
  const double kept = std::accumulate(mask.begin(), mask.end(), 0.0) / n;
  EXPECT_NEAR(kept, 0.9, 0.015);  // 16384 draws: sd ~0.0023
  EXPECT_EQ(run(0.1f, 7, 0).first, mask) << "same (seed, offset) must give the same mask";
  EXPECT_NE(run(0.1f, 8, 0).first, mask);
  EXPECT_NE(run(0.1f, 7, n).first, mask);
  // Offsets address one counter stream: offset k reproduces the tail of offset 0's mask.
  const std::vector<uint8_t> shifted = run(0.1f, 7, 100).first;
  EXPECT_TRUE(std::equal(shifted.begin(), shifted.end() - 100, mask.begin() + 100));

  // p == 0: no dropout, the inference forward's context, all-ones mask.
  const auto [mask0, context0] = run(0.0f, 7, 0);
  std::vector<float> probs(n), reference(s.tokens * s.hidden());
  AttentionForward(ctx, s, qkv.data(), nullptr, probs.data(), reference.data());
  EXPECT_EQ(context0, reference);
  EXPECT_TRUE(std::all_of(mask0.begin(), mask0.end(), [](uint8_t m) { return m == 1; }));
  // p == 0 also accepts null probs_dropped / mask.
  std::vector<float> context_null(s.tokens * s.hidden());
  AttentionForwardTraining(ctx, s, qkv.data(), probs.data(), nullptr, nullptr, 0.0f, 7, 0,
                           context_null.data());
  EXPECT_EQ(context_null, reference);
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingBackwardTest, RepeatedIdsMatchFiniteDifferences) {
  std::mt19937 rng(21);
  for (int64_t hidden : {3, 5, 8}) {
    const int64_t vocab = 5, max_pos = 6, types = 2;
    // Two packed sequences; ids 1 and 3 repeat, positions restart, both segment types appear.
    const std::vector<int32_t> token_ids = {1, 3, 1, 4, 1, 3, 0, 3, 2};
    const std::vector<int32_t> type_ids = {0, 0, 0, 1, 1, 0, 0, 1, 1};
    const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 0, 1, 2, 3};
    const int64_t rows = static_cast<int64_t>(token_ids.size());
    const std::vector<float> word = RandomVector(vocab * hidden, rng);
    const std::vector<float> position = RandomVector(max_pos * hidden, rng);
    const std::vector<float> type = RandomVector(types * hidden, rng);
    const std::vector<float> dout = RandomVector(rows * hidden, rng);

    // The engine forward agrees with the naive one used for the finite differences.
    auto naive = [&](const std::vector<double>& w, const std::vector<double>& p,
                     const std::vector<double>& ty) {
      std::vector<double> out(rows * hidden);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t j = 0; j < hidden; ++j) {
          out[m * hidden + j] = w[token_ids[m] * hidden + j] + ty[type_ids[m] * hidden + j] +
                                p[positions[m] * hidden + j];
        }
      }
      return out;
    };
    const Tensor word_t({vocab, hidden}, FloatBuffer(word.begin(), word.end()));
    const Tensor position_t({max_pos, hidden}, FloatBuffer(position.begin(), position.end()));
    const Tensor type_t({types, hidden}, FloatBuffer(type.begin(), type.end()));
    std::vector<float> out(rows * hidden);
    EmbeddingForward(word_t, position_t, type_t, token_ids, type_ids, positions, out.data());
    const std::vector<double> want = naive(ToDouble(word), ToDouble(position), ToDouble(type));
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5);

    Tensor dword({vocab, hidden}), dposition({max_pos, hidden}), dtype({types, hidden});
    EmbeddingBackward(dout.data(), hidden, token_ids, type_ids, positions, &dword, &dposition,
                      &dtype);
    const std::vector<double> fd_word = NumericalGradient(
        [&](const std::vector<double>& w) {
          return Dot(naive(w, ToDouble(position), ToDouble(type)), dout);
        },
        ToDouble(word));
    const std::vector<double> fd_position = NumericalGradient(
        [&](const std::vector<double>& p) {
          return Dot(naive(ToDouble(word), p, ToDouble(type)), dout);
        },
        ToDouble(position));
    const std::vector<double> fd_type = NumericalGradient(
        [&](const std::vector<double>& ty) {
          return Dot(naive(ToDouble(word), ToDouble(position), ty), dout);
        },
        ToDouble(type));
    auto values = [](const Tensor& t) {
      return std::vector<float>(t.data(), t.data() + t.numel());
    };
    EXPECT_LE(RelError(values(dword), fd_word), kMaxRelError) << "hidden " << hidden;
    EXPECT_LE(RelError(values(dposition), fd_position), kMaxRelError) << "hidden " << hidden;
    EXPECT_LE(RelError(values(dtype), fd_type), kMaxRelError) << "hidden " << hidden;
    // Rows never referenced (position 5) get no gradient.
    for (int64_t j = 0; j < hidden; ++j) EXPECT_EQ(dposition.data()[5 * hidden + j], 0.0f);

    // Gradients accumulate (+=), and null gradients are skipped.
    Tensor dword2 = dword;
    EmbeddingBackward(dout.data(), hidden, token_ids, type_ids, positions, &dword2, nullptr,
                      nullptr);
    for (int64_t i = 0; i < dword.numel(); ++i) {
      // Not bitwise: the second pass adds rows one by one onto the first pass's sums.
      EXPECT_NEAR(dword2.data()[i], 2.0f * dword.data()[i], 1e-5);
    }
  }
}

TEST(EmbeddingBackwardTest, LargeBatchIsBitIdenticalToSerialOrder) {
  // Big enough for the OpenMP path; heavy id repetition. Any thread count must give exactly
  // the serial ascending-row float sum.
  std::mt19937 rng(22);
  const int64_t rows = 4000, hidden = 72, vocab = 37, max_pos = 512, types = 2;
  std::vector<int32_t> token_ids(rows), type_ids(rows), positions(rows);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1), ty(0, types - 1), pos(0, max_pos - 1);
  for (int64_t m = 0; m < rows; ++m) {
    token_ids[m] = id(rng);
    type_ids[m] = ty(rng);
    positions[m] = pos(rng);
  }
  const std::vector<float> dout = RandomVector(rows * hidden, rng);
  Tensor dword({vocab, hidden}), dposition({max_pos, hidden}), dtype({types, hidden});
  EmbeddingBackward(dout.data(), hidden, token_ids, type_ids, positions, &dword, &dposition,
                    &dtype);
  std::vector<float> word(vocab * hidden, 0.0f), position(max_pos * hidden, 0.0f),
      type(types * hidden, 0.0f);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < hidden; ++j) {
      word[token_ids[m] * hidden + j] += dout[m * hidden + j];
      position[positions[m] * hidden + j] += dout[m * hidden + j];
      type[type_ids[m] * hidden + j] += dout[m * hidden + j];
    }
  }
  EXPECT_EQ(std::vector<float>(dword.data(), dword.data() + dword.numel()), word);
  EXPECT_EQ(std::vector<float>(dposition.data(), dposition.data() + dposition.numel()), position);
  EXPECT_EQ(std::vector<float>(dtype.data(), dtype.data() + dtype.numel()), type);
}

// ---------------------------------------------------------------------------------------------
// Pooling and L2 normalisation

std::vector<double> NaivePool(const std::vector<double>& hidden, int64_t h,
                              const std::vector<int64_t>& offsets, PoolingMode mode) {
  const int64_t batch = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> pooled(batch * h);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < h; ++j) {
      double acc = mode == PoolingMode::kMax ? -INFINITY : 0.0;
      for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t) {
        const double v = hidden[t * h + j];
        if (mode == PoolingMode::kMax) acc = std::max(acc, v);
        if (mode == PoolingMode::kMean) acc += v / (offsets[b + 1] - offsets[b]);
        if (mode == PoolingMode::kCls && t == offsets[b]) acc = v;
      }
      pooled[b * h + j] = acc;
    }
  }
  return pooled;
}

TEST(PoolBackwardTest, EveryModeMatchesFiniteDifferences) {
  std::mt19937 rng(31);
  const std::vector<std::vector<int64_t>> layouts = {{0, 1}, {0, 4}, {0, 3, 4}, {0, 2, 7, 12}};
  for (const std::vector<int64_t>& offsets : layouts) {
    for (int64_t h : {3, 5, 8}) {
      const int64_t rows = offsets.back(), batch = static_cast<int64_t>(offsets.size()) - 1;
      // Distinct values 0.05 apart (shuffled) so max pooling has no ties within the FD step.
      std::vector<float> hidden(rows * h);
      for (int64_t i = 0; i < rows * h; ++i) hidden[i] = 0.05f * static_cast<float>(i) - 1.0f;
      std::shuffle(hidden.begin(), hidden.end(), rng);
      const std::vector<float> dpooled = RandomVector(batch * h, rng);
      for (PoolingMode mode : {PoolingMode::kCls, PoolingMode::kMean, PoolingMode::kMax}) {
        std::vector<float> pooled(batch * h);
        PoolForward(hidden.data(), h, offsets, mode, pooled.data());
        const std::vector<double> want = NaivePool(ToDouble(hidden), h, offsets, mode);
        for (size_t i = 0; i < pooled.size(); ++i) EXPECT_NEAR(pooled[i], want[i], 1e-6);

        std::vector<float> dhidden(rows * h, 99.0f);  // overwritten, garbage must not survive
        PoolBackward(hidden.data(), h, offsets, mode, dpooled.data(), dhidden.data());
        const std::vector<double> fd = NumericalGradient(
            [&](const std::vector<double>& x) {
              return Dot(NaivePool(x, h, offsets, mode), dpooled);
            },
            ToDouble(hidden));
        EXPECT_LE(RelError(dhidden, fd), kMaxRelError)
            << PoolingModeName(mode) << " rows " << rows << " h " << h;
      }
    }
  }
}

TEST(PoolBackwardTest, MaxTiesGoToTheFirstRowLikeTheForward) {
  const std::vector<float> hidden = {1.0f, 5.0f,   // row 0
                                     3.0f, 5.0f,   // row 1: ties row 0 in feature 1
                                     3.0f, 2.0f};  // row 2: ties row 1 in feature 0
  const std::vector<float> dpooled = {0.5f, -2.0f};
  std::vector<float> dhidden(6, 99.0f);
  PoolBackward(hidden.data(), 2, {0, 3}, PoolingMode::kMax, dpooled.data(), dhidden.data());
  EXPECT_EQ(dhidden, (std::vector<float>{0.0f, -2.0f, 0.5f, 0.0f, 0.0f, 0.0f}));
}

std::vector<double> NaiveL2Normalize(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0.0;
    for (int64_t j = 0; j < cols; ++j) squares += x[r * cols + j] * x[r * cols + j];
    const double norm = std::max(std::sqrt(squares), 1e-12);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] / norm;
  }
  return y;
}

TEST(L2NormalizeBackwardTest, MatchesFiniteDifferences) {
  std::mt19937 rng(41);
  for (int64_t rows : {1, 2, 3}) {
    for (int64_t cols : {1, 3, 8}) {
      const std::vector<float> x = RandomVector(rows * cols, rng, 2.0f);
      const std::vector<float> dy = RandomVector(rows * cols, rng);
      std::vector<float> y = x;
      L2NormalizeRows(y.data(), rows, cols);
      const std::vector<double> want = NaiveL2Normalize(ToDouble(x), rows, cols);
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-6);

      std::vector<float> dx(x.size());
      L2NormalizeBackward(x.data(), dy.data(), rows, cols, dx.data());
      const std::vector<double> fd = NumericalGradient(
          [&](const std::vector<double>& xs) { return Dot(NaiveL2Normalize(xs, rows, cols), dy); },
          ToDouble(x));
      EXPECT_LE(RelError(dx, fd), kMaxRelError) << rows << "x" << cols;
      std::vector<float> in_place = dy;
      L2NormalizeBackward(x.data(), in_place.data(), rows, cols, in_place.data());
      EXPECT_EQ(in_place, dx);
    }
  }
}

TEST(L2NormalizeBackwardTest, ZeroRowUsesTheClampedConstantNorm) {
  // Below the 1e-12 clamp the denominator is constant: dx = dy / 1e-12 (torch's clamp_min).
  const std::vector<float> x = {0.0f, 0.0f, 0.0f};
  const std::vector<float> dy = {1e-13f, -2e-13f, 0.0f};
  std::vector<float> dx(3);
  L2NormalizeBackward(x.data(), dy.data(), 1, 3, dx.data());
  EXPECT_NEAR(dx[0], 0.1f, 1e-6);
  EXPECT_NEAR(dx[1], -0.2f, 1e-6);
  EXPECT_EQ(dx[2], 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Segment product (the pair head's input)

// feature[b] = normalise(mean of segment 0 rows) * normalise(mean of segment 1 rows), in double.
std::vector<double> NaiveSegmentProduct(const std::vector<double>& hidden, int64_t h,
                                        const std::vector<int64_t>& offsets,
                                        const std::vector<int32_t>& types) {
  const int64_t batch = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> feature(batch * h, 1.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int32_t segment : {0, 1}) {
      std::vector<double> mean(h, 0.0);
      double count = 0;
      for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t) {
        if (types[t] != segment) continue;
        count += 1;
        for (int64_t j = 0; j < h; ++j) mean[j] += hidden[t * h + j];
      }
      double norm = 0;
      for (double& v : mean) {
        v /= count;
        norm += v * v;
      }
      for (int64_t j = 0; j < h; ++j) feature[b * h + j] *= mean[j] / std::sqrt(norm);
    }
  }
  return feature;
}

TEST(SegmentProductTest, ForwardAndBackwardMatchANaiveReferenceAndFiniteDifferences) {
  std::mt19937 rng(43);
  // Pairs of different lengths, segments of 1 to 4 rows.
  const std::vector<int64_t> offsets = {0, 2, 7, 12};
  const std::vector<int32_t> types = {0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1};
  for (int64_t h : {1, 3, 8}) {
    const int64_t rows = offsets.back(), batch = 3;
    const std::vector<float> hidden = RandomVector(rows * h, rng, 1.0f);
    const std::vector<float> dfeature = RandomVector(batch * h, rng);
    std::vector<float> feature(batch * h);
    SegmentProductContext context;
    ASSERT_TRUE(
        SegmentProductForward(hidden.data(), h, offsets, types.data(), feature.data(), &context)
            .ok());
    const std::vector<double> want = NaiveSegmentProduct(ToDouble(hidden), h, offsets, types);
    for (size_t i = 0; i < feature.size(); ++i) EXPECT_NEAR(feature[i], want[i], 1e-6);

    std::vector<float> dhidden(rows * h, 99.0f);  // overwritten
    SegmentProductBackward(context, h, offsets, types.data(), dfeature.data(), dhidden.data());
    const std::vector<double> fd = NumericalGradient(
        [&](const std::vector<double>& x) {
          return Dot(NaiveSegmentProduct(x, h, offsets, types), dfeature);
        },
        ToDouble(hidden));
    EXPECT_LE(RelError(dhidden, fd), kMaxRelError) << "h " << h;
  }
}

TEST(SegmentProductTest, ASequenceThatIsNotAPairIsRefused) {
  const std::vector<float> hidden(6, 1.0f);
  std::vector<float> feature(2);
  const std::vector<int32_t> single = {0, 0, 0};
  absl::Status status =
      SegmentProductForward(hidden.data(), 2, {0, 3}, single.data(), feature.data(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "sequence 0 is not a text pair (no token of its second text); a pair head reads both "
            "texts");
  const std::vector<int32_t> third = {0, 2, 1};
  EXPECT_EQ(SegmentProductForward(hidden.data(), 2, {0, 3}, third.data(), feature.data(), nullptr)
                .message(),
            "sequence 0 has token type 2; a pair head reads types 0 and 1");
}

}  // namespace
}  // namespace attn
