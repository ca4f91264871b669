#include "engine/ops/embedding.h"

namespace attn {

void EmbeddingForward(const Tensor& word_embeddings, const Tensor& position_embeddings,
                      const Tensor& type_embeddings, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                      float* out) {
  const int64_t rows = static_cast<int64_t>(token_ids.size());
  const int64_t hidden = word_embeddings.dim(1);
  // A gather: memory-bound, so a plain parallel loop is as fast as any primitive.
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < rows; ++m) {
    const float* word = word_embeddings.data() + int64_t{token_ids[m]} * hidden;
    const float* position = position_embeddings.data() + int64_t{positions[m]} * hidden;
    const float* type = type_embeddings.data() + int64_t{type_ids[m]} * hidden;
    float* dst = out + m * hidden;
    // Same summation order as Hugging Face: (word + type) + position.
    for (int64_t j = 0; j < hidden; ++j) dst[j] = (word[j] + type[j]) + position[j];
  }
}

}  // namespace attn
