#include "engine/attention_analysis.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace attn {

Tensor MeanOverHeads(const Tensor& probs) {
  if (probs.rank() != 3 || probs.dim(0) < 1) {
    throw std::invalid_argument("MeanOverHeads: expected (heads >= 1, T, S), got " +
                                probs.ShapeString());
  }
  const int64_t heads = probs.dim(0), rows = probs.dim(1), cols = probs.dim(2);
  const int64_t plane = rows * cols;
  Tensor mean({rows, cols});  // (T, S)
  std::vector<double> acc(static_cast<size_t>(cols));
  const double inv_heads = 1.0 / static_cast<double>(heads);
  // Row by row, so each head contributes one contiguous stream and the accumulator stays in
  // L1, rather than striding through memory by T*S per head.
  for (int64_t i = 0; i < rows; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = probs.data() + h * plane + i * cols;  // P[h, i, :]
      for (int64_t j = 0; j < cols; ++j) acc[j] += src[j];
    }
    float* dst = mean.data() + i * cols;  // M[i, :]
    for (int64_t j = 0; j < cols; ++j) dst[j] = static_cast<float>(acc[j] * inv_heads);
  }
  return mean;
}

namespace {

// A' = rownorm(0.5 * A + 0.5 * I), in double. a: (T, T) fp32; out: (T, T) double.
void ResidualNormalize(const float* a, int64_t t, double* out) {
  for (int64_t i = 0; i < t; ++i) {
    const float* src = a + i * t;
    double* dst = out + i * t;
    double sum = 0.0;
    for (int64_t j = 0; j < t; ++j) {
      dst[j] = 0.5 * src[j];
      sum += dst[j];
    }
    dst[i] += 0.5;
    sum += 0.5;
    // The head-mean rows sum to 1 only up to fp32 rounding; renormalising keeps R exactly
    // row-stochastic however many layers are multiplied. sum >= 0.5 for non-negative A.
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < t; ++j) dst[j] *= inv;
  }
}

// One integer per entry whose descending order is the top-k order: value descending, then
// column ascending. Integer compares are several times faster than a float comparator that
// must also handle NaN and ties. High 32 bits: the float mapped to an order-preserving
// unsigned (negatives flipped, positives offset), -0 folded into +0 (they compare equal), NaN
// mapped to 0, below -inf. Low 32 bits: ~column, so the lower column wins a tie.
inline uint64_t RankKey(float value, int64_t col) {
  uint32_t u;
  value += 0.0f;  // -0 -> +0
  std::memcpy(&u, &value, sizeof(u));
  uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  key = std::isnan(value) ? 0u : key;
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(col));
}

}  // namespace

Tensor AttentionRollout(absl::Span<const Tensor> layer_means) {
  if (layer_means.empty()) {
    throw std::invalid_argument("AttentionRollout: no layers");
  }
  const int64_t t = layer_means[0].rank() == 2 ? layer_means[0].dim(0) : -1;
  for (size_t l = 0; l < layer_means.size(); ++l) {
    const Tensor& a = layer_means[l];
    if (a.rank() != 2 || a.dim(0) != t || a.dim(1) != t) {
      throw std::invalid_argument("AttentionRollout: layer " + std::to_string(l) + " is " +
                                  a.ShapeString() + ", expected square (T, T) like layer 0");
    }
  }
  const size_t tt = static_cast<size_t>(t * t);
  std::vector<double> rollout(tt);  // R (T, T), starts as A'_0
  std::vector<double> layer(tt);    // A'_l (T, T)
  std::vector<double> next(tt);     // A'_l · R (T, T)
  ResidualNormalize(layer_means[0].data(), t, rollout.data());
  for (size_t l = 1; l < layer_means.size(); ++l) {
    ResidualNormalize(layer_means[l].data(), t, layer.data());
    const double* a = layer.data();
    const double* r = rollout.data();
    double* out = next.data();
    // next[i, :] = sum_k A'_l[i, k] * R[k, :]. The i-k-j order streams rows of R through a
    // vectorised inner loop; blocks of kRowBlock output rows share each row of R, cutting the
    // traffic over R (2 MB at T = 512, beyond L2) by that factor. Blocks split across threads.
    constexpr int64_t kRowBlock = 4;
#pragma omp parallel for schedule(static) if (t >= 64)
    for (int64_t i0 = 0; i0 < t; i0 += kRowBlock) {
      const int64_t block = std::min(kRowBlock, t - i0);
      double* dst = out + i0 * t;  // next[i0 : i0 + block, :]
      std::fill(dst, dst + block * t, 0.0);
      for (int64_t k = 0; k < t; ++k) {
        const double* src = r + k * t;  // R[k, :]
        if (block == kRowBlock) {
          const double w0 = a[i0 * t + k], w1 = a[(i0 + 1) * t + k];
          const double w2 = a[(i0 + 2) * t + k], w3 = a[(i0 + 3) * t + k];
          double *d0 = dst, *d1 = dst + t, *d2 = dst + 2 * t, *d3 = dst + 3 * t;
#pragma omp simd
          for (int64_t j = 0; j < t; ++j) {
            const double v = src[j];
            d0[j] += w0 * v;
            d1[j] += w1 * v;
            d2[j] += w2 * v;
            d3[j] += w3 * v;
          }
        } else {
          for (int64_t b = 0; b < block; ++b) {
            const double w = a[(i0 + b) * t + k];
            double* d = dst + b * t;
#pragma omp simd
            for (int64_t j = 0; j < t; ++j) d[j] += w * src[j];
          }
        }
      }
    }
    rollout.swap(next);
  }
  Tensor result({t, t});
  for (size_t i = 0; i < tt; ++i) result.data()[i] = static_cast<float>(rollout[i]);
  return result;
}

TopKRowsResult TopKRows(const Tensor& matrix, int64_t k) {
  if (matrix.rank() < 1) {
    throw std::invalid_argument("TopKRows: expected rank >= 1, got " + matrix.ShapeString());
  }
  const int64_t cols = matrix.dim(-1);
  if (cols > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("TopKRows: " + std::to_string(cols) + " columns exceed int32");
  }
  const int64_t rows = cols == 0 ? 0 : matrix.numel() / cols;
  TopKRowsResult result;
  result.k = std::clamp<int64_t>(k, 0, cols);
  const int64_t kk = result.k;
  std::vector<int64_t> out_shape = matrix.shape();
  out_shape.back() = kk;
  result.values = Tensor(out_shape);
  result.indices.resize(static_cast<size_t>(Tensor::NumElements(out_shape)));
  if (kk == 0) return result;

  float* out_values = result.values.data();
  int32_t* out_indices = result.indices.data();
#pragma omp parallel if (rows * cols >= (int64_t{1} << 16))
  {
    std::vector<uint64_t> keys(static_cast<size_t>(cols));  // per-thread scratch
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = matrix.data() + r * cols;
      for (int64_t j = 0; j < cols; ++j) keys[j] = RankKey(row[j], j);
      // Keys are distinct, so "largest kk keys" is unique: nth_element, then sort only those.
      if (kk < cols) {
        std::nth_element(keys.begin(), keys.begin() + kk, keys.end(), std::greater<uint64_t>());
      }
      std::sort(keys.begin(), keys.begin() + kk, std::greater<uint64_t>());
      for (int64_t i = 0; i < kk; ++i) {
        const int32_t col = static_cast<int32_t>(~static_cast<uint32_t>(keys[i]));
        out_indices[r * kk + i] = col;
        out_values[r * kk + i] = row[col];
      }
    }
  }
  return result;
}

}  // namespace attn
