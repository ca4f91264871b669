#include "engine/ops/prepared_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attn {

using dnnl::memory;

namespace {

// The largest |Wq| the CPU's int8 matmul handles without 16-bit saturation (see the header).
int Int8WeightLevel() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") ? 127 : 63;
}

memory::desc Int8RowMajorDesc(int64_t rows, int64_t cols, memory::data_type type) {
  return memory::desc({rows, cols}, type, memory::dims{cols, 1});
}

}  // namespace

int64_t MatmulRows(int64_t rows) {
  if (rows <= 8) return rows;
  if (rows <= 64) return (rows + 7) / 8 * 8;
  int64_t step = 1;  // 2^(floor(log2(rows)) - 3)
  while (step * 16 <= rows) step *= 2;
  return (rows + step - 1) / step * step;
}

PreparedLinear PreparedLinear::Fp32View(const Tensor& weight, const Tensor& bias) {
  PreparedLinear linear;
  linear.precision_ = Precision::kFp32;
  linear.out_features_ = weight.dim(0);
  linear.in_features_ = weight.dim(1);
  linear.bias_ = bias.data();
  linear.view_ = weight.data();
  // weight is (N, K) row-major; matmul wants (K, N): the same bytes read with strides (1, K).
  linear.weights_desc_ =
      StridedDesc({linear.in_features_, linear.out_features_}, {1, linear.in_features_});
  return linear;
}

PreparedLinear PreparedLinear::Fp32Packed(const Tensor& weight, const Tensor& bias) {
  PreparedLinear linear = Fp32View(weight, bias);
  const int64_t K = linear.in_features_, N = linear.out_features_;
  const dnnl::engine& engine = DnnlRuntime::Get().engine();
  try {
    auto make_pd = [&](int64_t rows, const memory::desc& weights_desc) {
      return dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(RowMajorDesc({rows, K}), weights_desc, RowMajorDesc({1, N}),
                             RowMajorDesc({rows, N})),
          engine);
    };
    const memory::desc any({K, N}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc packed_desc = make_pd(128, any).weights_desc();
    if (packed_desc == linear.weights_desc_) return linear;
    // The layout chosen for 128 rows must serve every row count with a real implementation.
    for (int64_t rows : {int64_t{1}, int64_t{4096}}) {
      if (absl::StartsWith(make_pd(rows, packed_desc).impl_info_str(), "ref")) return linear;
    }
    FloatBuffer packed((packed_desc.get_size() + sizeof(float) - 1) / sizeof(float));
    memory src(linear.weights_desc_, engine, const_cast<float*>(weight.data()));
    memory dst(packed_desc, engine, packed.data());
    dnnl::stream stream(engine);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
    linear.packed_ = std::move(packed);
    linear.weights_desc_ = packed_desc;
    linear.view_ = nullptr;
  } catch (const dnnl::error&) {
    return Fp32View(weight, bias);  // no better layout available: read the tensor as it is
  }
  return linear;
}

PreparedLinear PreparedLinear::Int8(const Tensor& weight, const Tensor& bias) {
  PreparedLinear linear;
  linear.precision_ = Precision::kInt8;
  const int64_t N = weight.dim(0), K = weight.dim(1);
  linear.out_features_ = N;
  linear.in_features_ = K;
  linear.bias_ = bias.data();
  const float level = static_cast<float>(Int8WeightLevel());
  linear.qweights_.resize(N * K);
  linear.scales_.resize(N);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = weight.data() + n * K;
    float max_abs = 0.0f;
    for (int64_t k = 0; k < K; ++k) max_abs = std::max(max_abs, std::fabs(row[k]));
    linear.scales_[n] = max_abs / level;
    const float inv = max_abs > 0.0f ? level / max_abs : 0.0f;
    int8_t* out = linear.qweights_.data() + n * K;
    for (int64_t k = 0; k < K; ++k) {
      out[k] = static_cast<int8_t>(std::clamp(std::nearbyint(row[k] * inv), -level, level));
    }
  }
  // (N, K) row-major read as (K, N) with strides (1, K).
  linear.weights_desc_ = memory::desc({K, N}, memory::data_type::s8, memory::dims{1, K});
  return linear;
}

const void* PreparedLinear::weights_data() const {
  if (precision_ == Precision::kInt8) return qweights_.data();
  return packed_.empty() ? static_cast<const void*>(view_) : packed_.data();
}

void PreparedLinear::Forward(ExecContext& ctx, const float* x, int64_t rows,
                             LinearEpilogue epilogue, float* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  const memory::desc x_desc = RowMajorDesc({mrows, K});
  const memory::desc b_desc = RowMajorDesc({1, N});
  const memory::desc y_desc = RowMajorDesc({mrows, N});
  const std::string key = absl::StrCat("prepared_linear_fwd:", mrows, "x", K, "x", N, ":",
                                       static_cast<int>(epilogue), packed() ? ":packed" : ":plain");
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
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_desc, weights_desc_, b_desc, y_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(x_desc, x)},
                       {DNNL_ARG_WEIGHTS, dnnl::memory(weights_desc_, ctx.engine(),
                                                       const_cast<void*>(weights_data()))},
                       {DNNL_ARG_BIAS, ctx.Wrap(b_desc, bias_)},
                       {DNNL_ARG_DST, ctx.Wrap(y_desc, y)}});
}

void PreparedLinear::ForwardInt8(ExecContext& ctx, const int8_t* xq, int64_t rows,
                                 int32_t* acc) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  const memory::desc x_desc = Int8RowMajorDesc(mrows, K, memory::data_type::s8);
  const memory::desc acc_desc = Int8RowMajorDesc(mrows, N, memory::data_type::s32);
  const std::string key = absl::StrCat("int8_linear_fwd:", mrows, "x", K, "x", N);
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_desc, weights_desc_, acc_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(cached, {{DNNL_ARG_SRC, dnnl::memory(x_desc, ctx.engine(), const_cast<int8_t*>(xq))},
                       {DNNL_ARG_WEIGHTS, dnnl::memory(weights_desc_, ctx.engine(),
                                                       const_cast<void*>(weights_data()))},
                       {DNNL_ARG_DST, dnnl::memory(acc_desc, ctx.engine(), acc)}});
}

}  // namespace attn
