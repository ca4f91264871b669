#include "engine/ops/gelu.h"

#include "absl/strings/str_cat.h"

namespace attn {

void GeluForward(ExecContext& ctx, const float* x, int64_t n, float* y) {
  const dnnl::memory::desc desc = RowMajorDesc({n});
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(absl::StrCat("gelu_fwd:", n), [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference,
                                    dnnl::algorithm::eltwise_gelu_erf, desc, 0.0f, 0.0f),
        attr, ctx.engine());
    return CachedPrimitive{dnnl::eltwise_forward(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(desc, x)}, {DNNL_ARG_DST, ctx.Wrap(desc, y)}});
}

void GeluBackward(ExecContext& ctx, const float* x, const float* dy, int64_t n, float* dx) {
  if (n == 0) return;
  const dnnl::memory::desc desc = RowMajorDesc({n});
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(absl::StrCat("gelu_bwd:", n), [&] {
    // The backward pd takes the training forward's pd as its hint (oneDNN's training pattern).
    const dnnl::eltwise_forward::primitive_desc hint(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::eltwise_gelu_erf, desc, 0.0f, 0.0f),
        ctx.engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::eltwise_backward::primitive_desc pd(
        dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_gelu_erf, desc, desc, 0.0f, 0.0f),
        attr, ctx.engine(), hint);
    return CachedPrimitive{dnnl::eltwise_backward(pd), pd.scratchpad_desc()};
  });
  // forward: y = gelu(x)   =>   dx = dy * gelu'(x)
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(desc, x)},
                       {DNNL_ARG_DIFF_DST, ctx.Wrap(desc, dy)},
                       {DNNL_ARG_DIFF_SRC, ctx.Wrap(desc, dx)}});
}

}  // namespace attn
