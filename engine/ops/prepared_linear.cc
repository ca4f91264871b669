#include "engine/ops/prepared_linear.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/half.h"
#include "engine/ops/avx2_math.h"
#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"

namespace attn {

using dnnl::memory;

namespace {

// Per-output-channel quantisation of W (N, K) to [-level, level] (see the header).
void QuantizeWeightRows(const Tensor& weight, float level, Int8Buffer* qweights,
                        std::vector<float>* scales) {
  const int64_t N = weight.dim(0), K = weight.dim(1);
  qweights->resize(N * K);
  scales->resize(N);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = weight.data() + n * K;
    float max_abs = 0.0f;
    for (int64_t k = 0; k < K; ++k) max_abs = std::max(max_abs, std::fabs(row[k]));
    (*scales)[n] = max_abs / level;
    const float inv = max_abs > 0.0f ? level / max_abs : 0.0f;
    int8_t* out = qweights->data() + n * K;
    for (int64_t k = 0; k < K; ++k) {
      out[k] = static_cast<int8_t>(std::clamp(std::nearbyint(row[k] * inv), -level, level));
    }
  }
}

memory::desc Int8RowMajorDesc(int64_t rows, int64_t cols, memory::data_type type) {
  return memory::desc({rows, cols}, type, memory::dims{cols, 1});
}

// Packed fp32 weights are carved, one after another, out of 2 MB-aligned slabs advised for
// transparent huge pages (the system default is often `madvise`), so consecutive layers share
// huge pages instead of each starting on 4 KB ones. A slab lives while any slice of it does.
class PackedWeightSlab {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kSlabBytes = size_t{32} << 20;

  // An uninitialised buffer of `bytes`, 64-byte aligned, owned by its slab.
  static std::shared_ptr<float> Allocate(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    static absl::Mutex mutex(absl::kConstInit);
    static std::shared_ptr<PackedWeightSlab>* current = new std::shared_ptr<PackedWeightSlab>();
    absl::MutexLock lock(&mutex);
    std::shared_ptr<PackedWeightSlab>& slab = *current;
    if (slab == nullptr || slab->used_ + bytes > slab->size_) {
      slab = std::make_shared<PackedWeightSlab>(std::max(kSlabBytes, bytes));
    }
    float* data = reinterpret_cast<float*>(slab->base_ + slab->used_);
    slab->used_ += bytes;
    return std::shared_ptr<float>(slab, data);  // aliasing: keeps the slab alive
  }

  explicit PackedWeightSlab(size_t bytes) : size_((bytes + kHugePage - 1) / kHugePage * kHugePage) {
    base_ = static_cast<char*>(std::aligned_alloc(kHugePage, size_));
    if (base_ == nullptr) throw std::bad_alloc();
    madvise(base_, size_, MADV_HUGEPAGE);  // a hint: 4 KB pages still work if refused
  }
  ~PackedWeightSlab() { std::free(base_); }
  PackedWeightSlab(const PackedWeightSlab&) = delete;
  PackedWeightSlab& operator=(const PackedWeightSlab&) = delete;

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;
};

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
    std::shared_ptr<float> packed = PackedWeightSlab::Allocate(packed_desc.get_size());
    memory src(linear.weights_desc_, engine, const_cast<float*>(weight.data()));
    memory dst(packed_desc, engine, packed.get());
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

PreparedLinear PreparedLinear::Bf16(const Tensor& weight, const Tensor& bias) {
  const int64_t N = weight.dim(0), K = weight.dim(1);
  const dnnl::engine& engine = DnnlRuntime::Get().engine();
  try {
    const memory::desc any({K, N}, memory::data_type::bf16, memory::format_tag::any);
    auto make_pd = [&](int64_t rows, const memory::desc& weights_desc) {
      return dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(memory::desc({rows, K}, memory::data_type::bf16, memory::dims{K, 1}),
                             weights_desc, RowMajorDesc({1, N}), RowMajorDesc({rows, N})),
          engine);
    };
    const memory::desc packed_desc = make_pd(128, any).weights_desc();
    // A reference kernel is a loop nest, slower than the emulation below.
    bool usable = !absl::StartsWith(make_pd(128, packed_desc).impl_info_str(), "ref");
    for (int64_t rows : {int64_t{1}, int64_t{4096}}) {
      usable = usable && !absl::StartsWith(make_pd(rows, packed_desc).impl_info_str(), "ref");
    }
    if (usable) {
      PreparedLinear linear;
      linear.precision_ = Precision::kBf16;
      linear.native_bf16_ = true;
      linear.out_features_ = N;
      linear.in_features_ = K;
      linear.bias_ = bias.data();
      std::shared_ptr<float> packed = PackedWeightSlab::Allocate(packed_desc.get_size());
      memory src(StridedDesc({K, N}, {1, K}), engine, const_cast<float*>(weight.data()));
      memory dst(packed_desc, engine, packed.get());
      dnnl::stream stream(engine);
      dnnl::reorder(src, dst).execute(stream, src, dst);  // f32 -> bf16, round to nearest even
      stream.wait();
      linear.packed_ = std::move(packed);
      linear.weights_desc_ = packed_desc;
      return linear;
    }
  } catch (const dnnl::error&) {
    // unimplemented: no bf16 matmul on this CPU (oneDNN 2.6 needs AVX-512); emulate below
  }
  Tensor rounded(weight.shape());
  RoundFloatsToBFloat16(weight.data(), weight.numel(), rounded.data());
  PreparedLinear linear = Fp32Packed(rounded, bias);
  linear.precision_ = Precision::kBf16;
  if (linear.view_ != nullptr) linear.rounded_weights_ = std::move(rounded);  // the view's data
  return linear;
}

namespace {

// One accumulator row: acc[n] -= zero_point * sum_k Wq[n, k] (the matmul saw q, not q - zero),
// plus round(sum_i values[i] * W[n, cols[i]] / (row_scale * col_scale[n])), the outliers.
struct AccumulatorFix {
  const float* transposed_weights;  // (K, N)
  const int32_t* weight_sums;       // (N)
  const float* inverse_col_scales;  // (N)
  int64_t N;
};

void FixAccumulatorRowPortable(const AccumulatorFix& fix, int32_t zero_point, int count,
                               const int32_t* cols, const float* values, float inv_row_scale,
                               int32_t* acc) {
  for (int64_t n = 0; n < fix.N; ++n) {
    float sum = 0.0f;
    for (int i = 0; i < count; ++i) sum += values[i] * fix.transposed_weights[cols[i] * fix.N + n];
    const float units = std::clamp(sum * inv_row_scale * fix.inverse_col_scales[n], -1e9f, 1e9f);
    acc[n] += static_cast<int32_t>(std::nearbyint(units)) - zero_point * fix.weight_sums[n];
  }
}

}  // namespace

PreparedLinear PreparedLinear::Int8Outliers(const Tensor& weight, const Tensor& bias) {
  PreparedLinear linear;
  linear.precision_ = Precision::kInt8;
  const int64_t N = weight.dim(0), K = weight.dim(1);
  linear.out_features_ = N;
  linear.in_features_ = K;
  linear.bias_ = bias.data();
  // u8 inputs: 8-bit weights, and 8-bit inputs only where VNNI sums without saturation.
  linear.input_level_ = CpuHasInt8Vnni() ? 255.0f : 127.0f;
  QuantizeWeightRows(weight, 127.0f, &linear.qweights_, &linear.scales_);
  // (N, K) row-major read as (K, N) with strides (1, K), then packed once if oneDNN's kernel
  // wants another layout.
  linear.weights_desc_ = memory::desc({K, N}, memory::data_type::s8, memory::dims{1, K});
  linear.PackInt8Weights();
  linear.weight_sums_.assign(N, 0);
  linear.inverse_scales_.resize(N);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) linear.weight_sums_[n] += linear.qweights_[n * K + k];
    linear.inverse_scales_[n] = linear.scales_[n] > 0.0f ? 1.0f / linear.scales_[n] : 0.0f;
  }
  linear.transposed_weights_.resize(K * N);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k)
      linear.transposed_weights_[k * N + n] = weight.data()[n * K + k];
  }
  return linear;
}

void PreparedLinear::PackInt8Weights() {
  const int64_t K = in_features_, N = out_features_;
  const dnnl::engine& engine = DnnlRuntime::Get().engine();
  auto make_pd = [&](int64_t rows, const memory::desc& weights_desc) {
    return dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(Int8RowMajorDesc(rows, K, memory::data_type::u8), weights_desc,
                           Int8RowMajorDesc(rows, N, memory::data_type::s32)),
        engine);
  };
  try {
    const memory::desc any({K, N}, memory::data_type::s8, memory::format_tag::any);
    const memory::desc packed_desc = make_pd(128, any).weights_desc();
    if (packed_desc == weights_desc_) return;
    // The layout chosen for 128 rows must serve every row count with a real implementation.
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{4096}}) {
      if (absl::StartsWith(make_pd(rows, packed_desc).impl_info_str(), "ref")) return;
    }
    Int8Buffer packed(packed_desc.get_size());
    memory src(weights_desc_, engine, qweights_.data());
    memory dst(packed_desc, engine, packed.data());
    dnnl::stream stream(engine);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
    packed_int8_ = std::move(packed);
    weights_desc_ = packed_desc;
  } catch (const dnnl::error&) {
    // keep the plain layout: every kernel reads it (repacking per call)
  }
}

QuantizedRows PreparedLinear::PrepareInput(int64_t rows, Int8Input* input) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_;
  constexpr int kMax = kInt8MaxOutliers;
  if (static_cast<int64_t>(input->q.size()) < mrows * K) input->q.resize(mrows * K);
  if (static_cast<int64_t>(input->scales.size()) < mrows) input->scales.resize(mrows);
  if (static_cast<int64_t>(input->zero_points.size()) < rows) {
    input->zero_points.resize(rows);
    input->outlier_counts.resize(rows);
    input->outlier_cols.resize(rows * kMax);
    input->outlier_values.resize(rows * kMax);
  }
  std::fill(input->q.begin() + rows * K, input->q.begin() + mrows * K, uint8_t{0});
  std::fill(input->scales.begin() + rows, input->scales.begin() + mrows, 0.0f);
  return {input->q.data(),
          input->scales.data(),
          input->zero_points.data(),
          input->outlier_counts.data(),
          input->outlier_cols.data(),
          input->outlier_values.data(),
          input_level_};
}

void PreparedLinear::QuantizeInput(const float* x, int64_t rows, Int8Input* input) const {
  QuantizeRows(x, rows, in_features_, PrepareInput(rows, input));
}

void PreparedLinear::MatmulInt8(ExecContext& ctx, const Int8Input& input, int64_t rows,
                                int32_t* acc) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  const memory::desc x_desc = Int8RowMajorDesc(mrows, K, memory::data_type::u8);
  const memory::desc acc_desc = Int8RowMajorDesc(mrows, N, memory::data_type::s32);
  const std::string key = absl::StrCat("int8_linear_fwd:", mrows, "x", K, "x", N, ":u8",
                                       packed_int8_.empty() ? ":plain" : ":packed");
  const CachedPrimitive cached = ctx.runtime().GetOrCreate(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_desc, weights_desc_, acc_desc), attr,
                                    ctx.engine());
    return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
  });
  ctx.Execute(
      cached,
      {{DNNL_ARG_SRC, dnnl::memory(x_desc, ctx.engine(), const_cast<uint8_t*>(input.q.data()))},
       {DNNL_ARG_WEIGHTS,
        dnnl::memory(weights_desc_, ctx.engine(), const_cast<void*>(weights_data()))},
       {DNNL_ARG_DST, dnnl::memory(acc_desc, ctx.engine(), acc)}});
}

void PreparedLinear::ForwardInt8(ExecContext& ctx, const Int8Input& input, int64_t rows,
                                 int32_t* acc) const {
  MatmulInt8(ctx, input, rows, acc);
  const int64_t N = out_features_;
  const AccumulatorFix fix{transposed_weights_.data(), weight_sums_.data(), inverse_scales_.data(),
                           N};
  constexpr int kMax = kInt8MaxOutliers;
  for (int64_t m = 0; m < rows; ++m) {
    if (input.scales[m] == 0.0f) continue;  // an all-zero row: q = 0, no outliers
    FixAccumulatorRowPortable(
        fix, input.zero_points[m], input.outlier_counts[m], input.outlier_cols.data() + m * kMax,
        input.outlier_values.data() + m * kMax, 1.0f / input.scales[m], acc + m * N);
  }
}

Int8Accumulators PreparedLinear::Accumulators(const Int8Input& input, const int32_t* acc) const {
  Int8Accumulators in;
  in.acc = acc;
  in.row_scales = input.scales.data();
  in.col_scales = scales_.data();
  in.bias = bias_;
  in.zero_points = input.zero_points.data();
  in.weight_sums = weight_sums_.data();
  in.outlier_counts = input.outlier_counts.data();
  in.outlier_cols = input.outlier_cols.data();
  in.outlier_values = input.outlier_values.data();
  in.transposed_weights = transposed_weights_.data();
  return in;
}

namespace {

template <typename Buffer>
auto* Grow(Buffer& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
  return buffer.data();
}

using Bf16Buffer = std::vector<uint16_t, AlignedAllocator<uint16_t>>;

// Apply()'s per-thread buffers: the converted input and the matmul output before its epilogue.
struct LinearScratch {
  FloatBuffer rounded_input;  // emulated bf16: x rounded to bfloat16
  Bf16Buffer bf16_input;      // native bf16: x as bfloat16
  Int8Input int8_input;       // int8: x quantised
  Int32Buffer accumulators;   // int8: (rows, N)
  FloatBuffer product;        // x · W^T + b before the residual + LayerNorm
};

LinearScratch& ThreadLinearScratch() {
  thread_local LinearScratch scratch;
  return scratch;
}

}  // namespace

void PreparedLinear::Apply(ExecContext& ctx, const float* x, int64_t rows,
                           const LinearOutput& output, float* y) const {
  LinearScratch& scratch = ThreadLinearScratch();
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  if (precision_ == Precision::kInt8) {
    QuantizeInput(x, rows, &scratch.int8_input);
    ApplyInt8(ctx, scratch.int8_input, rows, output, y);
    return;
  }
  float* product = output.residual != nullptr ? Grow(scratch.product, mrows * N) : y;
  if (precision_ == Precision::kBf16 && native_bf16_) {
    ForwardBf16(ctx, x, rows, output.epilogue, product);
  } else if (precision_ == Precision::kBf16) {
    float* rounded = Grow(scratch.rounded_input, mrows * K);
    RoundFloatsToBFloat16(x, mrows * K, rounded);
    Forward(ctx, rounded, rows, output.epilogue, product);
  } else {
    Forward(ctx, x, rows, output.epilogue, product);
  }
  if (output.residual != nullptr) LayerNormInto(output, product, rows, y);
}

void PreparedLinear::LayerNormInto(const LinearOutput& output, const float* product, int64_t rows,
                                   float* y) const {
  const int64_t N = out_features_;
  AddLayerNormRows(product, output.residual, rows, N, output.gamma, output.beta, output.eps, y,
                   output.bf16_copy);
  if (output.bf16_copy != nullptr) {
    std::fill(output.bf16_copy + rows * N, output.bf16_copy + MatmulRows(rows) * N, uint16_t{0});
  }
}

void PreparedLinear::ApplyInt8(ExecContext& ctx, const Int8Input& x, int64_t rows,
                               const LinearOutput& output, float* y) const {
  const int64_t N = out_features_;
  int32_t* acc = Grow(ThreadLinearScratch().accumulators, MatmulRows(rows) * N);
  MatmulInt8(ctx, x, rows, acc);
  const Int8Accumulators in = Accumulators(x, acc);
  QuantizedRows next_rows;
  const QuantizedRows* next = nullptr;
  if (output.next_layer != nullptr) {
    next_rows = output.next_layer->PrepareInput(rows, output.next_input);
    next = &next_rows;
  }
  if (output.residual != nullptr) {
    DequantizeAddLayerNormRows(in, output.residual, rows, N, output.gamma, output.beta, output.eps,
                               y, next);
  } else if (output.epilogue == LinearEpilogue::kGelu) {
    DequantizeGeluRows(in, rows, N, y, next);
  } else {
    DequantizeRows(in, rows, N, y);
  }
}

void PreparedLinear::ApplyBf16Out(ExecContext& ctx, const float* x, int64_t rows,
                                  LinearEpilogue epilogue, uint16_t* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  uint16_t* x_bf16 = Grow(ThreadLinearScratch().bf16_input, mrows * K);
  FloatsToBFloat16Bits(x, mrows * K, x_bf16);
  RunMatmul(ctx,
            absl::StrCat("bf16_linear_fwd:", mrows, "x", K, "x", N, ":", static_cast<int>(epilogue),
                         ":bf16_out"),
            memory::desc({mrows, K}, memory::data_type::bf16, memory::dims{K, 1}), x_bf16, epilogue,
            y, memory::data_type::bf16);
}

void PreparedLinear::ApplyBf16In(ExecContext& ctx, const uint16_t* x, int64_t rows,
                                 const LinearOutput& output, float* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  float* product = output.residual != nullptr ? Grow(ThreadLinearScratch().product, mrows * N) : y;
  RunMatmul(ctx,
            absl::StrCat("bf16_linear_fwd:", mrows, "x", K, "x", N, ":",
                         static_cast<int>(output.epilogue)),
            memory::desc({mrows, K}, memory::data_type::bf16, memory::dims{K, 1}), x,
            output.epilogue, product);
  if (output.residual != nullptr) LayerNormInto(output, product, rows, y);
}

void PreparedLinear::ApplyBf16InOut(ExecContext& ctx, const uint16_t* x, int64_t rows,
                                    LinearEpilogue epilogue, uint16_t* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  RunMatmul(ctx,
            absl::StrCat("bf16_linear_fwd:", mrows, "x", K, "x", N, ":", static_cast<int>(epilogue),
                         ":bf16_out"),
            memory::desc({mrows, K}, memory::data_type::bf16, memory::dims{K, 1}), x, epilogue, y,
            memory::data_type::bf16);
}

void PreparedLinear::ForwardBf16(ExecContext& ctx, const float* x, int64_t rows,
                                 LinearEpilogue epilogue, float* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  uint16_t* x_bf16 = Grow(ThreadLinearScratch().bf16_input, mrows * K);
  FloatsToBFloat16Bits(x, mrows * K, x_bf16);
  RunMatmul(
      ctx, absl::StrCat("bf16_linear_fwd:", mrows, "x", K, "x", N, ":", static_cast<int>(epilogue)),
      memory::desc({mrows, K}, memory::data_type::bf16, memory::dims{K, 1}), x_bf16, epilogue, y);
}

const void* PreparedLinear::weights_data() const {
  if (precision_ == Precision::kInt8) {
    return packed_int8_.empty() ? static_cast<const void*>(qweights_.data()) : packed_int8_.data();
  }
  return packed_ == nullptr ? static_cast<const void*>(view_) : packed_.get();
}

void PreparedLinear::Forward(ExecContext& ctx, const float* x, int64_t rows,
                             LinearEpilogue epilogue, float* y) const {
  const int64_t mrows = MatmulRows(rows), K = in_features_, N = out_features_;
  RunMatmul(ctx,
            absl::StrCat("prepared_linear_fwd:", mrows, "x", K, "x", N, ":",
                         static_cast<int>(epilogue), packed() ? ":packed" : ":plain"),
            RowMajorDesc({mrows, K}), x, epilogue, y);
}

void PreparedLinear::RunMatmul(ExecContext& ctx, const std::string& key, const memory::desc& x_desc,
                               const void* x, LinearEpilogue epilogue, void* y,
                               memory::data_type y_type) const {
  const memory::desc b_desc = RowMajorDesc({1, out_features_});
  const memory::desc y_desc({x_desc.dims()[0], out_features_}, y_type,
                            memory::dims{out_features_, 1});
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
  ctx.Execute(cached, {{DNNL_ARG_SRC, dnnl::memory(x_desc, ctx.engine(), const_cast<void*>(x))},
                       {DNNL_ARG_WEIGHTS, dnnl::memory(weights_desc_, ctx.engine(),
                                                       const_cast<void*>(weights_data()))},
                       {DNNL_ARG_BIAS, ctx.Wrap(b_desc, bias_)},
                       {DNNL_ARG_DST, dnnl::memory(y_desc, ctx.engine(), y)}});
}

}  // namespace attn
