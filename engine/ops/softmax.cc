#include "engine/ops/softmax.h"

#include "absl/strings/str_cat.h"

namespace attn {

void SoftmaxForward(ExecContext& ctx, const float* x, int64_t rows, int64_t cols, float* y) {
  const dnnl::memory::desc desc = RowMajorDesc({rows, cols});
  const std::string key = absl::StrCat("softmax_fwd:", rows, "x", cols);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::softmax_forward::primitive_desc pd(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, desc, 1), attr,
        ctx.engine());
    return CachedPrimitive{dnnl::softmax_forward(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(desc, x)}, {DNNL_ARG_DST, ctx.Wrap(desc, y)}});
}

void SoftmaxBackward(ExecContext& ctx, const float* y, const float* dy, int64_t rows, int64_t cols,
                     float* dx) {
  const dnnl::memory::desc desc = RowMajorDesc({rows, cols});
  const std::string key = absl::StrCat("softmax_bwd:", rows, "x", cols);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // The backward pd takes a training forward pd as its hint (as in cnn_training_f32).
    dnnl::softmax_forward::primitive_desc fwd_pd(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, desc, 1), attr,
        ctx.engine());
    dnnl::softmax_backward::primitive_desc pd(dnnl::softmax_backward::desc(desc, desc, 1), attr,
                                              ctx.engine(), fwd_pd);
    return CachedPrimitive{dnnl::softmax_backward(pd), pd.scratchpad_desc()};
  });
  // dx = y * (dy - sum(dy * y))   (undoes: y = exp(x - max) / sum(exp(x - max)))
  ctx.Execute(cached, {{DNNL_ARG_DST, ctx.Wrap(desc, y)},
                       {DNNL_ARG_DIFF_DST, ctx.Wrap(desc, dy)},
                       {DNNL_ARG_DIFF_SRC, ctx.Wrap(desc, dx)}});
}

}  // namespace attn
