#include "engine/ops/pooling.h"

#include <algorithm>
#include <cmath>

namespace attn {

void PoolForward(const float* hidden, int64_t hidden_size, const std::vector<int64_t>& seq_offsets,
                 PoolingMode mode, float* pooled) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = seq_offsets[b], end = seq_offsets[b + 1];
    float* dst = pooled + b * hidden_size;
    const float* first = hidden + begin * hidden_size;
    switch (mode) {
      case PoolingMode::kCls:
        std::copy(first, first + hidden_size, dst);
        break;
      case PoolingMode::kMean: {
        // Accumulate in double: sequences reach 512 tokens and the reference sums in fp32
        // with pairwise reduction, so a plain fp32 running sum would drift further.
        for (int64_t j = 0; j < hidden_size; ++j) {
          double sum = 0.0;
          for (int64_t t = begin; t < end; ++t) sum += hidden[t * hidden_size + j];
          dst[j] = static_cast<float>(sum / static_cast<double>(end - begin));
        }
        break;
      }
      case PoolingMode::kMax:
        std::copy(first, first + hidden_size, dst);
        for (int64_t t = begin + 1; t < end; ++t) {
          const float* row = hidden + t * hidden_size;
          for (int64_t j = 0; j < hidden_size; ++j) dst[j] = std::max(dst[j], row[j]);
        }
        break;
    }
  }
}

void L2NormalizeRows(float* data, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = data + r * cols;
    double squares = 0.0;
    for (int64_t j = 0; j < cols; ++j) squares += double{row[j]} * row[j];
    const double norm = std::max(std::sqrt(squares), 1e-12);
    for (int64_t j = 0; j < cols; ++j) row[j] = static_cast<float>(row[j] / norm);
  }
}

void PoolBackward(const float* hidden, int64_t hidden_size, const std::vector<int64_t>& seq_offsets,
                  PoolingMode mode, const float* dpooled, float* dhidden) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  if (batch < 0) return;
  std::fill(dhidden, dhidden + seq_offsets[batch] * hidden_size, 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = seq_offsets[b], end = seq_offsets[b + 1];
    if (end <= begin) continue;
    const float* dsrc = dpooled + b * hidden_size;
    switch (mode) {
      case PoolingMode::kCls:
        // forward: pooled[b] = hidden[begin]
        std::copy(dsrc, dsrc + hidden_size, dhidden + begin * hidden_size);
        break;
      case PoolingMode::kMean: {
        // forward: pooled[b] = sum_t hidden[t] / T
        const double inv_count = 1.0 / static_cast<double>(end - begin);
        for (int64_t t = begin; t < end; ++t) {
          float* drow = dhidden + t * hidden_size;
          for (int64_t j = 0; j < hidden_size; ++j) {
            drow[j] = static_cast<float>(dsrc[j] * inv_count);
          }
        }
        break;
      }
      case PoolingMode::kMax:
        // forward: pooled[b][j] = max_t hidden[t][j]; a later row wins only if strictly
        // greater (std::max keeps its first argument on ties), so track the same argmax.
        for (int64_t j = 0; j < hidden_size; ++j) {
          int64_t best = begin;
          for (int64_t t = begin + 1; t < end; ++t) {
            if (hidden[best * hidden_size + j] < hidden[t * hidden_size + j]) best = t;
          }
          dhidden[best * hidden_size + j] = dsrc[j];
        }
        break;
    }
  }
}

void L2NormalizeBackward(const float* x, const float* dy, int64_t rows, int64_t cols, float* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xrow = x + r * cols;
    const float* dyrow = dy + r * cols;
    float* dxrow = dx + r * cols;
    double squares = 0.0;
    for (int64_t j = 0; j < cols; ++j) squares += double{xrow[j]} * xrow[j];
    const double norm = std::sqrt(squares);
    constexpr double kEps = 1e-12;
    if (norm < kEps) {
      // forward: y = x / 1e-12 (clamped, constant denominator)
      for (int64_t j = 0; j < cols; ++j) dxrow[j] = static_cast<float>(dyrow[j] / kEps);
      continue;
    }
    // forward: y = x / ||x||
    // dx = (dy - y * (y·dy)) / ||x||, with y recomputed in double from x
    double y_dot_dy = 0.0;
    for (int64_t j = 0; j < cols; ++j) y_dot_dy += (xrow[j] / norm) * dyrow[j];
    for (int64_t j = 0; j < cols; ++j) {
      dxrow[j] = static_cast<float>((dyrow[j] - (xrow[j] / norm) * y_dot_dy) / norm);
    }
  }
}

}  // namespace attn
