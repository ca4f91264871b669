#include <immintrin.h>

#include <cstring>

#include "engine/half.h"
#include "engine/ops/attention_head.h"

#define ATTN_AVX2 __attribute__((target("avx2,fma")))

namespace attn {

ATTN_AVX2 void AttentionHeadAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                 FloatBuffer* keys_t, FloatBuffer* row) {
  const int64_t T = t.tokens, d = g.head_dim, ld = g.ld_qkv;
  const int64_t tp = (T + 7) / 8 * 8;  // score columns, padded to whole vectors
  if (static_cast<int64_t>(keys_t->size()) < d * tp) keys_t->resize(d * tp);
  if (static_cast<int64_t>(row->size()) < tp) row->resize(tp);
  float* kt = keys_t->data();  // (d, tp) = K^T, columns [T, tp) zero
  float* s = row->data();      // (tp) one row of scores, then probabilities
  for (int64_t j = 0; j < tp; ++j) {
    for (int64_t c = 0; c < d; ++c) kt[c * tp + j] = j < T ? t.k[j * ld + c] : 0.0f;
  }
  const __m256 scale = _mm256_set1_ps(g.scale);
  for (int64_t i = 0; i < T; ++i) {
    // s (tp) = q_i · K^T * scale: four 8-column blocks at once (independent FMA chains)
    const float* qi = t.q + i * ld;
    int64_t j = 0;
    for (; j + 32 <= tp; j += 32) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t c = 0; c < d; ++c) {
        const __m256 q = _mm256_set1_ps(qi[c]);
        const float* kc = kt + c * tp + j;
        a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(kc), a0);
        a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(kc + 8), a1);
        a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(kc + 16), a2);
        a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(kc + 24), a3);
      }
      _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, scale));
      _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(a1, scale));
      _mm256_storeu_ps(s + j + 16, _mm256_mul_ps(a2, scale));
      _mm256_storeu_ps(s + j + 24, _mm256_mul_ps(a3, scale));
    }
    for (; j < tp; j += 8) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; ++c) {
        a = _mm256_fmadd_ps(_mm256_set1_ps(qi[c]), _mm256_loadu_ps(kt + c * tp + j), a);
      }
      _mm256_storeu_ps(s + j, _mm256_mul_ps(a, scale));
    }
    AddScoreBias(t, i, s);
    if (t.scores != nullptr) std::memcpy(t.scores + i * T, s, sizeof(float) * T);
    SoftmaxRowInPlace(s, T);
    if (t.probs != nullptr) std::memcpy(t.probs + i * T, s, sizeof(float) * T);
    if (g.bf16_products) RoundFloatsToBFloat16(s, T, s);
    // context_i (d) = s (T) · V (T, d): 32 columns at once, then 8, then single ones
    float* ci = t.context + i * g.ld_context;
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t k = 0; k < T; ++k) {
        const __m256 p = _mm256_set1_ps(s[k]);
        const float* vk = t.v + k * ld + c;
        a0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vk), a0);
        a1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vk + 8), a1);
        a2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vk + 16), a2);
        a3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vk + 24), a3);
      }
      _mm256_storeu_ps(ci + c, a0);
      _mm256_storeu_ps(ci + c + 8, a1);
      _mm256_storeu_ps(ci + c + 16, a2);
      _mm256_storeu_ps(ci + c + 24, a3);
    }
    for (; c + 8 <= d; c += 8) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t k = 0; k < T; ++k) {
        a = _mm256_fmadd_ps(_mm256_set1_ps(s[k]), _mm256_loadu_ps(t.v + k * ld + c), a);
      }
      _mm256_storeu_ps(ci + c, a);
    }
    for (; c < d; ++c) {
      float a = 0.0f;
      for (int64_t k = 0; k < T; ++k) a += s[k] * t.v[k * ld + c];
      ci[c] = a;
    }
  }
}

}  // namespace attn
