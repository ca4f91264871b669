#include "engine/ops/linear.h"

#include "absl/strings/str_cat.h"

namespace attn {

using dnnl::memory;

void LinearForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                   const Tensor& bias, LinearEpilogue epilogue, float* y) {
  const int64_t out_features = weight.dim(0);  // N
  const int64_t in_features = weight.dim(1);   // K
  // weight is (N, K) row-major; matmul wants (K, N): the same bytes read with strides (1, K).
  const memory::desc x_desc = RowMajorDesc({rows, in_features});
  const memory::desc w_desc = StridedDesc({in_features, out_features}, {1, in_features});
  const memory::desc b_desc = RowMajorDesc({1, out_features});
  const memory::desc y_desc = RowMajorDesc({rows, out_features});

  const std::string key = absl::StrCat("linear_fwd:", rows, "x", in_features, "x", out_features,
                                       ":", static_cast<int>(epilogue));
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::post_ops post_ops;
    if (epilogue == LinearEpilogue::kGelu) {
      post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
    } else if (epilogue == LinearEpilogue::kAccumulate) {
      post_ops.append_sum(1.0f);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(post_ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_desc, w_desc, b_desc, y_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(x_desc, x)},
                       {DNNL_ARG_WEIGHTS, ctx.Wrap(w_desc, weight.data())},
                       {DNNL_ARG_BIAS, ctx.Wrap(b_desc, bias.data())},
                       {DNNL_ARG_DST, ctx.Wrap(y_desc, y)}});
}

}  // namespace attn
