#include "engine/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/ops/dropout.h"
#include "engine/ops/softmax.h"

namespace attn {

using dnnl::memory;

namespace {

// Q_h (heads, T, d) viewed in the qkv block at column offset 0 (Q) or 2H (V).
memory::desc HeadsRowsDesc(const AttentionShape& s) {
  return StridedDesc({s.heads, s.tokens, s.head_dim}, {s.head_dim, s.qkv_stride, 1});
}

// K_h^T or V_h^T (heads, d, T): the same qkv columns read transposed.
memory::desc HeadsColsDesc(const AttentionShape& s) {
  return StridedDesc({s.heads, s.head_dim, s.tokens}, {s.head_dim, 1, s.qkv_stride});
}

// context_h / dcontext_h (heads, T, d) inside the (T, context_stride) rows.
memory::desc ContextDesc(const AttentionShape& s) {
  return StridedDesc({s.heads, s.tokens, s.head_dim}, {s.head_dim, s.context_stride, 1});
}

// (heads, T, T) row-major, and the same buffer read as its per-head transpose.
memory::desc SquareDesc(const AttentionShape& s) {
  return RowMajorDesc({s.heads, s.tokens, s.tokens});
}
memory::desc SquareTransposedDesc(const AttentionShape& s) {
  const int64_t T = s.tokens;
  return StridedDesc({s.heads, T, T}, {T * T, 1, T});
}

std::string ShapeKey(const char* op, const AttentionShape& s) {
  return absl::StrCat(op, ":", s.heads, "x", s.tokens, "x", s.head_dim, ":", s.qkv_stride, ":",
                      s.context_stride);
}

// dst = src · weights (* scale), batched over heads; the cached primitive is keyed by `key`,
// which must identify all three descs and the scale.
void BatchedMatmul(ExecContext& ctx, const std::string& key, const memory::desc& src_desc,
                   const memory::desc& weights_desc, const memory::desc& dst_desc, float scale,
                   const float* src, const float* weights, float* dst) {
  const CachedPrimitive mm = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    if (scale != 1.0f) attr.set_output_scales(0, {scale});
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, weights_desc, dst_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(mm, {{DNNL_ARG_SRC, ctx.Wrap(src_desc, src)},
                   {DNNL_ARG_WEIGHTS, ctx.Wrap(weights_desc, weights)},
                   {DNNL_ARG_DST, ctx.Wrap(dst_desc, dst)}});
}

// scores (heads, T, T) = Q · K^T * scale into `scores_out`, then probs = softmax(scores).
void ComputeProbs(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                  float* scores_out, float* probs) {
  const int64_t T = shape.tokens, heads = shape.heads, d = shape.head_dim, H = shape.hidden();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // scores (heads, T, T) = Q (heads, T, d) · K^T (heads, d, T) * scale
  const memory::desc q_desc = HeadsRowsDesc(shape);
  const memory::desc kt_desc = HeadsColsDesc(shape);
  const memory::desc scores_desc = SquareDesc(shape);
  const std::string scores_key =
      absl::StrCat("attn_scores:", heads, "x", T, "x", d, ":", shape.qkv_stride);
  BatchedMatmul(ctx, scores_key, q_desc, kt_desc, scores_desc, scale, qkv, qkv + H, scores_out);
  // probs = softmax(scores) over keys
  SoftmaxForward(ctx, scores_out, heads * T, T, probs);
}

// context_h (T, d) = probs_h (T, T) · V_h (T, d), written at column h*d of the context rows.
void ComputeContext(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                    const float* probs, float* context) {
  const std::string context_key =
      absl::StrCat("attn_context:", shape.heads, "x", shape.tokens, "x", shape.head_dim, ":",
                   shape.qkv_stride, ":", shape.context_stride);
  BatchedMatmul(ctx, context_key, SquareDesc(shape), HeadsRowsDesc(shape), ContextDesc(shape), 1.0f,
                probs, qkv + 2 * shape.hidden(), context);
}

}  // namespace

void AttentionForward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                      float* scores, float* probs, float* context) {
  // Without a separate scores buffer, compute straight into probs and softmax in place.
  ComputeProbs(ctx, shape, qkv, scores != nullptr ? scores : probs, probs);
  ComputeContext(ctx, shape, qkv, probs, context);
}

void AttentionForwardTraining(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                              float* probs, float* probs_dropped, uint8_t* dropout_mask,
                              float dropout_p, uint64_t seed, uint64_t offset, float* context) {
  const int64_t n = shape.heads * shape.tokens * shape.tokens;
  // probs (heads, T, T) = softmax(Q K^T * scale), saved undropped for the softmax backward
  ComputeProbs(ctx, shape, qkv, probs, probs);
  if (dropout_p <= 0.0f) {
    if (probs_dropped != nullptr) std::copy(probs, probs + n, probs_dropped);
    if (dropout_mask != nullptr) std::fill(dropout_mask, dropout_mask + n, uint8_t{1});
    ComputeContext(ctx, shape, qkv, probs, context);
    return;
  }
  // probs_dropped (heads, T, T) = probs * mask / (1 - p); draw i uses counter offset + i
  DropoutForward(probs, n, dropout_p, seed, offset, probs_dropped, dropout_mask);
  // context_h (T, d) = probs_dropped_h (T, T) · V_h (T, d)
  ComputeContext(ctx, shape, qkv, probs_dropped, context);
}

void AttentionBackward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                       const float* probs, const float* dcontext, float* dqkv, float* scratch) {
  AttentionBackward(ctx, shape, qkv, probs, /*probs_dropped=*/nullptr, /*dropout_mask=*/nullptr,
                    0.0f, dcontext, dqkv, scratch);
}

void AttentionBackward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                       const float* probs, const float* probs_dropped, const uint8_t* dropout_mask,
                       float dropout_p, const float* dcontext, float* dqkv, float* scratch) {
  const int64_t T = shape.tokens, heads = shape.heads, d = shape.head_dim, H = shape.hidden();
  const int64_t n = heads * T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The probs that actually multiplied V in the forward.
  const float* probs_used = probs_dropped != nullptr ? probs_dropped : probs;
  float* dprobs = scratch;       // (heads, T, T)
  float* dscores = scratch + n;  // (heads, T, T)

  // forward: context_h (T, d) = probs_h (T, T) · V_h (T, d)
  // dV_h (T, d) = probs_h^T (T, T) · dcontext_h (T, d)
  BatchedMatmul(ctx, ShapeKey("attn_bwd_dv", shape), SquareTransposedDesc(shape),
                ContextDesc(shape), HeadsRowsDesc(shape), 1.0f, probs_used, dcontext, dqkv + 2 * H);
  // dprobs_h (T, T) = dcontext_h (T, d) · V_h^T (d, T)
  BatchedMatmul(ctx, ShapeKey("attn_bwd_dp", shape), ContextDesc(shape), HeadsColsDesc(shape),
                SquareDesc(shape), 1.0f, dcontext, qkv + 2 * H, dprobs);

  // forward: probs_dropped = probs * mask / (1 - p)
  // dprobs = dprobs_dropped * mask / (1 - p)
  if (probs_dropped != nullptr) DropoutBackward(dprobs, dropout_mask, n, dropout_p, dprobs);

  // forward: probs = softmax(scores)
  // dscores = probs * (dprobs - sum_j(dprobs * probs)) per row
  SoftmaxBackward(ctx, probs, dprobs, heads * T, T, dscores);

  // forward: scores_h (T, T) = Q_h (T, d) · K_h^T (d, T) * scale
  // dQ_h (T, d) = dscores_h (T, T) · K_h (T, d) * scale
  BatchedMatmul(ctx, ShapeKey("attn_bwd_dq", shape), SquareDesc(shape), HeadsRowsDesc(shape),
                HeadsRowsDesc(shape), scale, dscores, qkv + H, dqkv);
  // dK_h (T, d) = dscores_h^T (T, T) · Q_h (T, d) * scale
  BatchedMatmul(ctx, ShapeKey("attn_bwd_dk", shape), SquareTransposedDesc(shape),
                HeadsRowsDesc(shape), HeadsRowsDesc(shape), scale, dscores, qkv, dqkv + H);
}

void ExtractHeads(const AttentionShape& shape, const float* qkv, int which, float* out) {
  const int64_t T = shape.tokens, d = shape.head_dim, H = shape.hidden();
  for (int64_t h = 0; h < shape.heads; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      const float* src = qkv + t * shape.qkv_stride + which * H + h * d;
      std::memcpy(out + (h * T + t) * d, src, sizeof(float) * d);
    }
  }
}

}  // namespace attn
