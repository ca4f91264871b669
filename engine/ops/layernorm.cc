#include "engine/ops/layernorm.h"

#include <algorithm>

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

namespace {

const dnnl::normalization_flags kScaleShift =
    dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

// The training forward's primitive descriptor: built by the training forward and, as the hint
// oneDNN asks for, by the backward.
dnnl::layer_normalization_forward::primitive_desc TrainingForwardPd(const dnnl::engine& engine,
                                                                    const memory::desc& data_desc,
                                                                    float eps) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::layer_normalization_forward::primitive_desc(
      dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, data_desc, eps,
                                              kScaleShift),
      attr, engine);
}

}  // namespace

void LayerNormForwardTraining(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                              const Tensor& beta, float eps, float* y, float* mean,
                              float* variance) {
  const int64_t hidden = gamma.dim(0);
  const memory::desc data_desc = RowMajorDesc({rows, hidden});  // (M, H)
  const memory::desc param_desc = RowMajorDesc({hidden});       // (H)
  const memory::desc stat_desc = RowMajorDesc({rows});          // (M)
  const std::string key = absl::StrCat("layernorm_fwd_train:", rows, "x", hidden, ":", eps);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    const auto pd = TrainingForwardPd(ctx.engine(), data_desc, eps);
    return CachedPrimitive{dnnl::layer_normalization_forward(pd), pd.scratchpad_desc()};
  });
  // mean (M) = sum_h x / H;  variance (M) = sum_h (x - mean)^2 / H  (biased, as the forward uses)
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(data_desc, x)},
                       {DNNL_ARG_SCALE, ctx.Wrap(param_desc, gamma.data())},
                       {DNNL_ARG_SHIFT, ctx.Wrap(param_desc, beta.data())},
                       {DNNL_ARG_DST, ctx.Wrap(data_desc, y)},
                       {DNNL_ARG_MEAN, ctx.Wrap(stat_desc, mean)},
                       {DNNL_ARG_VARIANCE, ctx.Wrap(stat_desc, variance)}});
}

void LayerNormBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                       const float* mean, const float* variance, float eps, const float* dy,
                       float* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  const int64_t hidden = gamma.dim(0);
  if (rows == 0) {
    if (!accumulate && dgamma != nullptr) std::fill_n(dgamma->data(), hidden, 0.0f);
    if (!accumulate && dbeta != nullptr) std::fill_n(dbeta->data(), hidden, 0.0f);
    return;
  }
  const memory::desc data_desc = RowMajorDesc({rows, hidden});  // (M, H)
  const memory::desc param_desc = RowMajorDesc({hidden});       // (H)
  const memory::desc stat_desc = RowMajorDesc({rows});          // (M)
  const std::string key = absl::StrCat("layernorm_bwd:", rows, "x", hidden, ":", eps);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    const auto hint = TrainingForwardPd(ctx.engine(), data_desc, eps);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::layer_normalization_backward::primitive_desc pd(
        dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, data_desc, data_desc,
                                                 stat_desc, eps, kScaleShift),
        attr, ctx.engine(), hint);
    return CachedPrimitive{dnnl::layer_normalization_backward(pd), pd.scratchpad_desc()};
  });
  // oneDNN overwrites diff_scale/diff_shift, so accumulation (or a skipped output) goes through
  // a small local buffer: (2H) floats, negligible next to the (M, H) pass.
  const bool direct_gamma = dgamma != nullptr && !accumulate;
  const bool direct_beta = dbeta != nullptr && !accumulate;
  FloatBuffer local;
  if (!direct_gamma || !direct_beta) local.resize(2 * hidden);
  float* dgamma_out = direct_gamma ? dgamma->data() : local.data();
  float* dbeta_out = direct_beta ? dbeta->data() : local.data() + hidden;
  // forward: y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(variance + eps)
  //   dbeta (H)  = sum_m dy;   dgamma (H) = sum_m dy * xhat
  //   dx (M, H)  = rstd * (dy*gamma - mean_h(dy*gamma) - xhat * mean_h(dy*gamma * xhat))
  // oneDNN 2.6 counts SHIFT as a backward input under use_shift (execute fails without it),
  // although no gradient depends on beta; gamma's buffer (same desc) stands in and is not read.
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(data_desc, x)},
                       {DNNL_ARG_MEAN, ctx.Wrap(stat_desc, mean)},
                       {DNNL_ARG_VARIANCE, ctx.Wrap(stat_desc, variance)},
                       {DNNL_ARG_DIFF_DST, ctx.Wrap(data_desc, dy)},
                       {DNNL_ARG_SCALE, ctx.Wrap(param_desc, gamma.data())},
                       {DNNL_ARG_SHIFT, ctx.Wrap(param_desc, gamma.data())},
                       {DNNL_ARG_DIFF_SRC, ctx.Wrap(data_desc, dx)},
                       {DNNL_ARG_DIFF_SCALE, ctx.Wrap(param_desc, dgamma_out)},
                       {DNNL_ARG_DIFF_SHIFT, ctx.Wrap(param_desc, dbeta_out)}});
  if (accumulate) {
    if (dgamma != nullptr) {
      float* out = dgamma->data();
      for (int64_t h = 0; h < hidden; ++h) out[h] += dgamma_out[h];
    }
    if (dbeta != nullptr) {
      float* out = dbeta->data();
      for (int64_t h = 0; h < hidden; ++h) out[h] += dbeta_out[h];
    }
  }
}

}  // namespace attn
