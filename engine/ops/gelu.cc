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

}  // namespace attn
