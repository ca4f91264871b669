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

}  // namespace attn
