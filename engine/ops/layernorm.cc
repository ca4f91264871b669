#include "engine/ops/layernorm.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"

namespace attn {

using dnnl::memory;

void LayerNormForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                      const Tensor& beta, float eps, float* y) {
  const int64_t hidden = gamma.dim(0);
  const memory::desc data_desc = RowMajorDesc({rows, hidden});
  const memory::desc param_desc = RowMajorDesc({hidden});
  const std::string key = absl::StrCat("layernorm_fwd:", rows, "x", hidden, ":", eps);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::layer_normalization_forward::primitive_desc pd(
        dnnl::layer_normalization_forward::desc(
            dnnl::prop_kind::forward_inference, data_desc, eps,
            dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift),
        attr, ctx.engine());
    return CachedPrimitive{dnnl::layer_normalization_forward(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(data_desc, x)},
                       {DNNL_ARG_SCALE, ctx.Wrap(param_desc, gamma.data())},
                       {DNNL_ARG_SHIFT, ctx.Wrap(param_desc, beta.data())},
                       {DNNL_ARG_DST, ctx.Wrap(data_desc, y)}});
}

namespace {

// Below this many elements the row loops run on the calling thread.
constexpr int64_t kParallelElements = 1 << 14;
// Rows per chunk of the backward's dgamma/dbeta partial sums. The chunking is fixed (not per
// thread), and the partials are added in chunk order, so the sums do not depend on the thread
// count.
constexpr int64_t kChunkRows = 32;

// Portable row kernels: the formulas as loops.

// y = (x - mean) * rstd * gamma + beta; returns mean and (biased) variance.
void ForwardRowPortable(const float* x, int64_t cols, const float* gamma, const float* beta,
                        float eps, float* y, float* mean_out, float* variance_out) {
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sum += x[j];
  const float mean = sum / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sq += (x[j] - mean) * (x[j] - mean);
  const float variance = sq / static_cast<float>(cols);
  const float rstd = 1.0f / std::sqrt(variance + eps);
  for (int64_t j = 0; j < cols; ++j) y[j] = (x[j] - mean) * rstd * gamma[j] + beta[j];
  *mean_out = mean;
  *variance_out = variance;
}

// dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = dy * gamma, xhat = (x - mean) * rstd;
// dgamma_acc += dy * xhat; dbeta_acc += dy.
void BackwardRowPortable(const float* x, const float* dy, int64_t cols, const float* gamma,
                         float mean, float rstd, float* dx, float* dgamma_acc, float* dbeta_acc) {
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    const float g = dy[j] * gamma[j];
    sum_g += g;
    sum_gx += g * xhat;
    dgamma_acc[j] += dy[j] * xhat;
    dbeta_acc[j] += dy[j];
  }
  const float mean_g = sum_g / static_cast<float>(cols);
  const float mean_gx = sum_gx / static_cast<float>(cols);
  for (int64_t j = 0; j < cols; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dy[j] * gamma[j] - mean_g - xhat * mean_gx);
  }
}

// AVX-512 row kernels: the same formulas, 16 lanes at a time, masked tails.

ATTN_AVX512 void ForwardRowAvx512(const float* x, int64_t cols, const float* gamma,
                                  const float* beta, float eps, float* y, float* mean_out,
                                  float* variance_out) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 16) {
    sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(avx512::TailMask(cols - j), x + j));
  }
  *variance_out = avx512::NormalizeRow(x, cols, sum, gamma, beta, eps, y, mean_out);
}

ATTN_AVX512 void BackwardRowAvx512(const float* x, const float* dy, int64_t cols,
                                   const float* gamma, float mean, float rstd, float* dx,
                                   float* dgamma_acc, float* dbeta_acc) {
  const __m512 mean_vec = _mm512_set1_ps(mean), rstd_vec = _mm512_set1_ps(rstd);
  __m512 sum_g = _mm512_setzero_ps(), sum_gx = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = avx512::TailMask(cols - j);
    const __m512 xhat =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mean_vec), rstd_vec);
    const __m512 d = _mm512_maskz_loadu_ps(k, dy + j);
    const __m512 g = _mm512_mul_ps(d, _mm512_maskz_loadu_ps(k, gamma + j));
    sum_g = _mm512_add_ps(sum_g, g);
    sum_gx = _mm512_fmadd_ps(g, xhat, sum_gx);
    _mm512_mask_storeu_ps(dgamma_acc + j, k,
                          _mm512_fmadd_ps(d, xhat, _mm512_maskz_loadu_ps(k, dgamma_acc + j)));
    _mm512_mask_storeu_ps(dbeta_acc + j, k,
                          _mm512_add_ps(d, _mm512_maskz_loadu_ps(k, dbeta_acc + j)));
  }
  const __m512 mean_g = _mm512_set1_ps(_mm512_reduce_add_ps(sum_g) / static_cast<float>(cols));
  const __m512 mean_gx = _mm512_set1_ps(_mm512_reduce_add_ps(sum_gx) / static_cast<float>(cols));
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = avx512::TailMask(cols - j);
    const __m512 xhat =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mean_vec), rstd_vec);
    const __m512 g =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(k, dy + j), _mm512_maskz_loadu_ps(k, gamma + j));
    // rstd * (g - mean_g - xhat * mean_gx)
    const __m512 inner = _mm512_fnmadd_ps(xhat, mean_gx, _mm512_sub_ps(g, mean_g));
    _mm512_mask_storeu_ps(dx + j, k, _mm512_mul_ps(rstd_vec, inner));
  }
}

}  // namespace

void LayerNormForwardTraining(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                              const Tensor& beta, float eps, float* y, float* mean,
                              float* variance) {
  const int64_t hidden = gamma.dim(0);
  const bool avx512 = UseAvx512Kernels();
  // mean (M) = sum_h x / H;  variance (M) = sum_h (x - mean)^2 / H  (biased, as the forward uses)
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelElements)
  for (int64_t m = 0; m < rows; ++m) {
    const float* xr = x + m * hidden;
    float* yr = y + m * hidden;
    if (avx512) {
      ForwardRowAvx512(xr, hidden, gamma.data(), beta.data(), eps, yr, mean + m, variance + m);
    } else {
      ForwardRowPortable(xr, hidden, gamma.data(), beta.data(), eps, yr, mean + m, variance + m);
    }
  }
}

void LayerNormBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                       const float* mean, const float* variance, float eps, const float* dy,
                       float* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  const int64_t hidden = gamma.dim(0);
  const bool avx512 = UseAvx512Kernels();
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  // partials (chunks, 2H): per chunk of rows, sum dy * xhat in [0, H) and sum dy in [H, 2H).
  FloatBuffer partials(static_cast<size_t>(chunks * 2 * hidden));
  // forward: y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(variance + eps)
  //   dbeta (H)  = sum_m dy;   dgamma (H) = sum_m dy * xhat
  //   dx (M, H)  = rstd * (dy*gamma - mean_h(dy*gamma) - xhat * mean_h(dy*gamma * xhat))
#pragma omp parallel if (rows * hidden >= kParallelElements)
  {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      float* dgamma_acc = partials.data() + c * 2 * hidden;
      float* dbeta_acc = dgamma_acc + hidden;
      for (int64_t m = c * kChunkRows; m < std::min(rows, (c + 1) * kChunkRows); ++m) {
        const float rstd = 1.0f / std::sqrt(variance[m] + eps);
        const int64_t at = m * hidden;
        if (avx512) {
          BackwardRowAvx512(x + at, dy + at, hidden, gamma.data(), mean[m], rstd, dx + at,
                            dgamma_acc, dbeta_acc);
        } else {
          BackwardRowPortable(x + at, dy + at, hidden, gamma.data(), mean[m], rstd, dx + at,
                              dgamma_acc, dbeta_acc);
        }
      }
    }
    // dgamma, dbeta (+)= the chunks' partials, in chunk order.
#pragma omp for schedule(static)
    for (int64_t j = 0; j < 2 * hidden; ++j) {
      Tensor* out = j < hidden ? dgamma : dbeta;
      if (out == nullptr) continue;
      float sum = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) sum += partials[c * 2 * hidden + j];
      float& target = out->data()[j < hidden ? j : j - hidden];
      target = accumulate ? target + sum : sum;
    }
  }
}

}  // namespace attn
