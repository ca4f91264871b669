#include "engine/ops/attention.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/ops/softmax.h"

namespace attn {

using dnnl::memory;

namespace {

// Q_h (heads, T, d) viewed in the qkv block at column offset 0 (Q) or 2H (V).
memory::desc HeadsRowsDesc(const AttentionShape& s) {
  return StridedDesc({s.heads, s.tokens, s.head_dim}, {s.head_dim, s.qkv_stride, 1});
}

}  // namespace

void AttentionForward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                      float* scores, float* probs, float* context) {
  const int64_t T = shape.tokens, heads = shape.heads, d = shape.head_dim, H = shape.hidden();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // scores (heads, T, T) = Q (heads, T, d) · K^T (heads, d, T) * scale
  const memory::desc q_desc = HeadsRowsDesc(shape);
  const memory::desc kt_desc = StridedDesc({heads, d, T}, {d, 1, shape.qkv_stride});
  const memory::desc scores_desc = RowMajorDesc({heads, T, T});
  const std::string scores_key =
      absl::StrCat("attn_scores:", heads, "x", T, "x", d, ":", shape.qkv_stride);
  const CachedPrimitive scores_mm = ctx.runtime().GetOrCreate(scores_key, [&] {
    dnnl::primitive_attr attr;
    attr.set_output_scales(0, {scale});
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(q_desc, kt_desc, scores_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  // Without a separate scores buffer, compute straight into probs and softmax in place.
  float* scores_out = scores != nullptr ? scores : probs;
  ctx.Execute(scores_mm, {{DNNL_ARG_SRC, ctx.Wrap(q_desc, qkv)},
                          {DNNL_ARG_WEIGHTS, ctx.Wrap(kt_desc, qkv + H)},
                          {DNNL_ARG_DST, ctx.Wrap(scores_desc, scores_out)}});

  // probs = softmax(scores) over keys
  SoftmaxForward(ctx, scores_out, heads * T, T, probs);

  // context_h (T, d) = probs_h (T, T) · V_h (T, d), written at column h*d of the context rows
  const memory::desc probs_desc = RowMajorDesc({heads, T, T});
  const memory::desc v_desc = HeadsRowsDesc(shape);
  const memory::desc ctx_desc = StridedDesc({heads, T, d}, {d, shape.context_stride, 1});
  const std::string context_key = absl::StrCat("attn_context:", heads, "x", T, "x", d, ":",
                                               shape.qkv_stride, ":", shape.context_stride);
  const CachedPrimitive context_mm = ctx.runtime().GetOrCreate(context_key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(probs_desc, v_desc, ctx_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(context_mm, {{DNNL_ARG_SRC, ctx.Wrap(probs_desc, probs)},
                           {DNNL_ARG_WEIGHTS, ctx.Wrap(v_desc, qkv + 2 * H)},
                           {DNNL_ARG_DST, ctx.Wrap(ctx_desc, context)}});
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
