#include "engine/ops/layernorm.h"

#include "absl/strings/str_cat.h"

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

}  // namespace attn
