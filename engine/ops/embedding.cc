#include "engine/ops/embedding.h"

#include <algorithm>

namespace attn {

void AppendPositionIds(const BertConfig& config, const std::vector<int32_t>& token_ids,
                       std::vector<int32_t>* positions) {
  const int32_t length = static_cast<int32_t>(token_ids.size());
  if (!config.spec().positions_after_padding) {
    for (int32_t p = 0; p < length; ++p) positions->push_back(p);
    return;
  }
  const int32_t pad = config.pad_token_id;
  int32_t counted = 0;
  for (const int32_t id : token_ids) {
    if (id != pad) ++counted;
    positions->push_back(id == pad ? pad : pad + counted);
  }
}

void EmbeddingForward(const Tensor& word_embeddings, const Tensor& position_embeddings,
                      const Tensor& type_embeddings, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                      float* out) {
  const int64_t rows = static_cast<int64_t>(token_ids.size());
  const int64_t hidden = word_embeddings.dim(1);
  // A gather: memory-bound, so a plain parallel loop is as fast as any primitive. Not worth
  // waking a thread for a few rows (batch-1 latency).
#pragma omp parallel for schedule(static) if (rows * hidden >= (1 << 14))
  for (int64_t m = 0; m < rows; ++m) {
    const float* word = word_embeddings.data() + int64_t{token_ids[m]} * hidden;
    const float* position = position_embeddings.data() + int64_t{positions[m]} * hidden;
    float* dst = out + m * hidden;
    if (type_embeddings.numel() == 0) {  // MPNet: word + position
      for (int64_t j = 0; j < hidden; ++j) dst[j] = word[j] + position[j];
      continue;
    }
    const float* type = type_embeddings.data() + int64_t{type_ids[m]} * hidden;
    // Same summation order as Hugging Face: (word + type) + position.
    for (int64_t j = 0; j < hidden; ++j) dst[j] = (word[j] + type[j]) + position[j];
  }
}

void EmbeddingBackward(const float* dout, int64_t hidden, const std::vector<int32_t>& token_ids,
                       const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                       Tensor* dword, Tensor* dposition, Tensor* dtype) {
  const int64_t rows = static_cast<int64_t>(token_ids.size());
  float* dword_data = dword != nullptr ? dword->data() : nullptr;
  float* dposition_data = dposition != nullptr ? dposition->data() : nullptr;
  float* dtype_data = dtype != nullptr ? dtype->data() : nullptr;
  // Threads own disjoint column blocks (16 floats = one cache line), and each walks all rows
  // in order: repeated ids never race and the summation order is fixed, so the result is
  // bit-identical for any thread count, with no atomics or sorting.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * hidden > (1 << 14))
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kBlock, end = std::min(hidden, begin + kBlock);
    for (int64_t m = 0; m < rows; ++m) {
      const float* src = dout + m * hidden;
      // forward: out[m] = (word[token_ids[m]] + type[type_ids[m]]) + position[positions[m]]
      // dword[token_ids[m]] += dout[m]; dtype[type_ids[m]] += dout[m]; dposition[...] += dout[m]
      if (dword_data != nullptr) {
        float* dst = dword_data + int64_t{token_ids[m]} * hidden;
        for (int64_t j = begin; j < end; ++j) dst[j] += src[j];
      }
      if (dposition_data != nullptr) {
        float* dst = dposition_data + int64_t{positions[m]} * hidden;
        for (int64_t j = begin; j < end; ++j) dst[j] += src[j];
      }
      if (dtype_data != nullptr) {
        float* dst = dtype_data + int64_t{type_ids[m]} * hidden;
        for (int64_t j = begin; j < end; ++j) dst[j] += src[j];
      }
    }
  }
}

}  // namespace attn
