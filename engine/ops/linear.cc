#include "engine/ops/linear.h"

#include <omp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/half.h"
#include "engine/precision.h"

namespace attn {

using dnnl::memory;

namespace {

// A matmul input as oneDNN reads it: the caller's fp32 values or a bfloat16 copy.
struct Operand {
  const void* data;
  memory::data_type type;

  memory::desc Desc(const memory::dims& dims, const memory::dims& strides) const {
    return memory::desc(dims, type, strides);
  }
  void* handle() const { return const_cast<void*>(data); }  // oneDNN only reads inputs
};

// Part of a primitive key: the input type.
const char* TypeTag(const Operand& operand) {
  return operand.type == memory::data_type::bf16 ? ":bf16" : "";
}

// The bf16 copies of a matmul's inputs, per thread: slot 0 and slot 1 hold different operands.
struct Bf16Copies {
  std::vector<uint16_t, AlignedAllocator<uint16_t>> bits[2];  // native: bfloat16 bits
  FloatBuffer rounded[2];                                     // else: bfloat16 values in fp32
};

// `values` (n floats) as a matmul input under `inputs`, copied into `slot` when rounded.
Operand AsInput(MatmulInputs inputs, int slot, const float* values, int64_t n) {
  if (inputs == MatmulInputs::kFp32) return {values, memory::data_type::f32};
  static const bool native = CpuHasNativeBf16();
  thread_local Bf16Copies copies;
  if (native) {
    auto& bits = copies.bits[slot];
    if (static_cast<int64_t>(bits.size()) < n) bits.resize(n);
    FloatsToBFloat16Bits(values, n, bits.data());
    return {bits.data(), memory::data_type::bf16};
  }
  FloatBuffer& rounded = copies.rounded[slot];
  if (static_cast<int64_t>(rounded.size()) < n) rounded.resize(n);
  RoundFloatsToBFloat16(values, n, rounded.data());
  return {rounded.data(), memory::data_type::f32};
}

}  // namespace

void LinearForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                   const Tensor& bias, LinearEpilogue epilogue, float* y, MatmulInputs inputs) {
  const int64_t out_features = weight.dim(0);  // N
  const int64_t in_features = weight.dim(1);   // K
  const Operand xs = AsInput(inputs, 0, x, rows * in_features);
  const Operand ws = AsInput(inputs, 1, weight.data(), weight.numel());
  // weight is (N, K) row-major; matmul wants (K, N): the same bytes read with strides (1, K).
  const memory::desc x_desc = xs.Desc({rows, in_features}, {in_features, 1});
  const memory::desc w_desc = ws.Desc({in_features, out_features}, {1, in_features});
  const memory::desc b_desc = RowMajorDesc({1, out_features});
  const memory::desc y_desc = RowMajorDesc({rows, out_features});

  const std::string key = absl::StrCat("linear_fwd:", rows, "x", in_features, "x", out_features,
                                       ":", static_cast<int>(epilogue), TypeTag(xs));
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
  ctx.Execute(cached, {{DNNL_ARG_SRC, memory(x_desc, ctx.engine(), xs.handle())},
                       {DNNL_ARG_WEIGHTS, memory(w_desc, ctx.engine(), ws.handle())},
                       {DNNL_ARG_BIAS, ctx.Wrap(b_desc, bias.data())},
                       {DNNL_ARG_DST, ctx.Wrap(y_desc, y)}});
}

namespace {

// db (N) (+)= sum over rows of dy (M, N). Each thread owns a contiguous range of columns and
// walks the rows in order, reading each row's slice contiguously: every column is summed in
// row order, so the result is bitwise independent of the thread count.
void SumRows(const float* dy, int64_t rows, int64_t cols, bool accumulate, float* db) {
  constexpr int64_t kWidth = 512;  // partial sums per pass: 2 KiB, stays in L1
#pragma omp parallel if (rows * cols >= (1 << 16))
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    // Range boundaries on 16-float (cache line) multiples.
    const int64_t lines = (cols + 15) / 16;
    const int64_t range_begin = std::min(cols, lines * thread / threads * 16);
    const int64_t range_end = std::min(cols, lines * (thread + 1) / threads * 16);
    for (int64_t begin = range_begin; begin < range_end; begin += kWidth) {
      const int64_t width = std::min(kWidth, range_end - begin);
      float acc[kWidth] = {};
      for (int64_t m = 0; m < rows; ++m) {
        const float* row = dy + m * cols + begin;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
      }
      float* out = db + begin;
      for (int64_t j = 0; j < width; ++j) out[j] = accumulate ? out[j] + acc[j] : acc[j];
    }
  }
}

}  // namespace

namespace {

// out (cols, rows) (+)= in (rows, cols)^T, in 32 x 32 tiles so both sides stay in cache.
void Transpose(const float* in, int64_t rows, int64_t cols, bool accumulate, float* out) {
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t tile = 0; tile < row_tiles; ++tile) {
    const int64_t r_end = std::min(rows, (tile + 1) * kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c_end = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c_end; ++c) {
        float* dst = out + c * rows;
        for (int64_t r = tile * kTile; r < r_end; ++r) {
          dst[r] = accumulate ? dst[r] + in[r * cols + c] : in[r * cols + c];
        }
      }
    }
  }
}

// oneDNN 2.6's brgemm matmul is slow when B is a plain row-major matrix with fewer rows than
// columns: at 2,048 tokens, dx = dy · W and dW = dy^T · x of MiniLM's FFN output layer
// (N = 384 < K = 1536) ran 12-25% slower than the same products with B transposed. For such
// layers (and enough rows to pay for the transposes) dx uses a transposed copy of W and dW is
// computed transposed, dW^T = x^T · dy, then transposed into place.
bool TransposedBackward(int64_t rows, int64_t out_features, int64_t in_features) {
  return rows >= 256 && out_features < in_features;
}

// dst (+)= src · weights, (rows, depth) · (depth, cols) read with the given strides; the
// primitive is cached under `key` (plus the input type and accumulate).
void RunMatmul(ExecContext& ctx, const std::string& key, const Operand& src,
               const memory::dims& src_strides, const Operand& weights,
               const memory::dims& weights_strides, int64_t rows, int64_t depth, int64_t cols,
               float* dst, bool accumulate) {
  const memory::desc src_desc = src.Desc({rows, depth}, src_strides);
  const memory::desc weights_desc = weights.Desc({depth, cols}, weights_strides);
  const memory::desc dst_desc = RowMajorDesc({rows, cols});
  const CachedPrimitive cached =
      ctx.runtime().GetOrCreate(absl::StrCat(key, TypeTag(src), accumulate ? ":acc" : ":set"), [&] {
        dnnl::post_ops post_ops;
        if (accumulate) post_ops.append_sum(1.0f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(post_ops);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, weights_desc, dst_desc), attr,
                                        ctx.engine());
        return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
      });
  ctx.Execute(cached, {{DNNL_ARG_SRC, memory(src_desc, ctx.engine(), src.handle())},
                       {DNNL_ARG_WEIGHTS, memory(weights_desc, ctx.engine(), weights.handle())},
                       {DNNL_ARG_DST, ctx.Wrap(dst_desc, dst)}});
}

}  // namespace

void LinearBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                    const float* dy, float* dx, Tensor* dweight, Tensor* dbias, bool accumulate,
                    MatmulInputs inputs) {
  const int64_t N = weight.dim(0);  // out_features
  const int64_t K = weight.dim(1);  // in_features
  if (rows == 0) {
    // No tokens: the gradients are sums over nothing. Handled here because a matmul with an
    // empty reduction axis would leave dW untouched instead of zeroing it.
    if (!accumulate && dweight != nullptr) std::fill_n(dweight->data(), dweight->numel(), 0.0f);
    if (!accumulate && dbias != nullptr) std::fill_n(dbias->data(), dbias->numel(), 0.0f);
    return;
  }
  const bool transposed = TransposedBackward(rows, N, K);
  // dy (M, N) enters both products: converted once, into slot 0.
  const Operand dys = AsInput(inputs, 0, dy, rows * N);

  if (dx != nullptr) {
    // forward: y = x · W^T   =>   dx (M, K) = dy (M, N) · W (N, K): W as stored, or W^T (K, N)
    // row-major read with strides (1, N).
    const float* w = weight.data();
    memory::dims w_strides = {K, 1};
    if (transposed) {
      float* w_transposed = ctx.OperandBuffer(N * K);
      Transpose(weight.data(), N, K, /*accumulate=*/false, w_transposed);
      w = w_transposed;
      w_strides = {1, N};
    }
    RunMatmul(ctx, absl::StrCat("linear_bwd_data:", rows, "x", K, "x", N, transposed ? ":wt" : ""),
              dys, {N, 1}, AsInput(inputs, 1, w, N * K), w_strides, rows, N, K, dx,
              /*accumulate=*/false);
  }

  if (dweight != nullptr) {
    const Operand xs = AsInput(inputs, 1, x, rows * K);  // slot 1: W's copy is no longer read
    if (transposed) {
      // dW^T (K, N) = x^T (K, M) · dy (M, N), x^T read with strides (1, K); then dW (+)= its
      // transpose.
      float* dw_transposed = ctx.OperandBuffer(N * K);
      RunMatmul(ctx, absl::StrCat("linear_bwd_weights_t:", rows, "x", K, "x", N), xs, {1, K}, dys,
                {N, 1}, K, rows, N, dw_transposed, /*accumulate=*/false);
      Transpose(dw_transposed, K, N, accumulate, dweight->data());
    } else {
      // forward: y[m, n] = sum_k x[m, k] W[n, k]   =>   dW (N, K) (+)= dy^T (N, M) · x (M, K).
      // dy^T is dy's bytes read with strides (1, N); accumulation is a sum post-op on dW.
      RunMatmul(ctx, absl::StrCat("linear_bwd_weights:", rows, "x", K, "x", N), dys, {1, N}, xs,
                {K, 1}, N, rows, K, dweight->data(), accumulate);
    }
  }

  if (dbias != nullptr) {
    // forward: y[m, :] += b   =>   db (N) (+)= sum_m dy[m, :]
    SumRows(dy, rows, N, accumulate, dbias->data());
  }
}

}  // namespace attn
