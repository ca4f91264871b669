// Helpers the tests share: random inputs, the max-abs comparison and the naive
// double-precision attention every attention kernel is checked against (the engine's unit
// tests); the all-mpnet-base-v2 model's directory and reading and writing a file (any test).
// Header-only, so any test target can include it without linking anything more.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace attn::testing {

// The all-mpnet-base-v2 model's directory: $ATTN_TEST_MPNET_MODEL_DIR, else the configured one
// (a compile definition of the test targets, tests/CMakeLists.txt). The MiniLM model's is
// TestModelDir (tests/test_model.h, tests/integration/harness.h).
#ifdef ATTN_TEST_MPNET_MODEL_DIR
inline std::string MpnetModelDir() {
  const char* env = std::getenv("ATTN_TEST_MPNET_MODEL_DIR");
  return env != nullptr && *env != '\0' ? env : ATTN_TEST_MPNET_MODEL_DIR;
}
#endif

// The file's bytes; "" when it cannot be read.
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes `contents` to `path` (replacing it); the test fails when the write does not succeed.
inline void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

// Normal(0, scale) values.
inline std::vector<float> RandomVector(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
inline Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (float& v : t.values()) v = dist(rng);
  return t;
}

// max_i |a[i] - b[i]| over the n (or b.size()) elements.
inline double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, double{std::abs(a[i] - b[i])});
  return worst;
}
inline double MaxAbsDiff(const float* a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// Naive attention, in double, of one sequence of `tokens` rows whose Q, K and V of head h are
// columns [h*d, (h+1)*d), [H + h*d, ...) and [2H + h*d, ...) of row t at qkv + t * qkv_stride
// (H = heads * d): scores = Q K^T / sqrt(d), probs = softmax(scores) per row, context = probs V.
// With `keep_mask` (heads*T*T, 1 = kept) the probabilities are dropped and the kept ones scaled
// by 1/(1-p) before multiplying V, as in Hugging Face BERT; `probs` stays undropped.
struct NaiveAttentionResult {
  std::vector<double> scores;   // (heads, T, T)
  std::vector<double> probs;    // (heads, T, T)
  std::vector<double> context;  // (T, H)
};
template <typename Element>
NaiveAttentionResult NaiveAttention(const Element* qkv, int64_t tokens, int64_t heads,
                                    int64_t head_dim, int64_t qkv_stride,
                                    const std::vector<uint8_t>* keep_mask = nullptr,
                                    double dropout_p = 0.0) {
  const int64_t T = tokens, d = head_dim, H = heads * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto at = [&](int64_t t, int64_t col) { return static_cast<double>(qkv[t * qkv_stride + col]); };
  NaiveAttentionResult r;
  r.scores.resize(heads * T * T);
  r.probs.resize(heads * T * T);
  r.context.assign(T * H, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      double* scores = &r.scores[(h * T + i) * T];
      double* probs = &r.probs[(h * T + i) * T];
      double max = -1e300;
      for (int64_t j = 0; j < T; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < d; ++k) dot += at(i, h * d + k) * at(j, H + h * d + k);
        scores[j] = dot * scale;
        max = std::max(max, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) sum += std::exp(scores[j] - max);
      for (int64_t j = 0; j < T; ++j) probs[j] = std::exp(scores[j] - max) / sum;
      for (int64_t j = 0; j < T; ++j) {
        double weight = probs[j];
        if (keep_mask != nullptr) {
          weight = (*keep_mask)[(h * T + i) * T + j] != 0 ? weight / (1.0 - dropout_p) : 0.0;
        }
        for (int64_t k = 0; k < d; ++k) {
          r.context[i * H + h * d + k] += weight * at(j, 2 * H + h * d + k);
        }
      }
    }
  }
  return r;
}

}  // namespace attn::testing
