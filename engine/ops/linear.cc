#include "engine/ops/linear.h"

#include <omp.h>

#include <algorithm>

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

// dst (+)= src · weights, descs in any strides; the primitive is cached under `key`.
void RunMatmul(ExecContext& ctx, const std::string& key, const memory::desc& src_desc,
               const float* src, const memory::desc& weights_desc, const float* weights,
               const memory::desc& dst_desc, float* dst, bool accumulate) {
  const CachedPrimitive cached =
      ctx.runtime().GetOrCreate(absl::StrCat(key, accumulate ? ":acc" : ":set"), [&] {
        dnnl::post_ops post_ops;
        if (accumulate) post_ops.append_sum(1.0f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(post_ops);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, weights_desc, dst_desc), attr,
                                        ctx.engine());
        return CachedPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()};
      });
  ctx.Execute(cached, {{DNNL_ARG_SRC, ctx.Wrap(src_desc, src)},
                       {DNNL_ARG_WEIGHTS, ctx.Wrap(weights_desc, weights)},
                       {DNNL_ARG_DST, ctx.Wrap(dst_desc, dst)}});
}

}  // namespace

void LinearBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                    const float* dy, float* dx, Tensor* dweight, Tensor* dbias, bool accumulate) {
  const int64_t out_features = weight.dim(0);  // N
  const int64_t in_features = weight.dim(1);   // K
  if (rows == 0) {
    // No tokens: the gradients are sums over nothing. Handled here because a matmul with an
    // empty reduction axis would leave dW untouched instead of zeroing it.
    if (!accumulate && dweight != nullptr) std::fill_n(dweight->data(), dweight->numel(), 0.0f);
    if (!accumulate && dbias != nullptr) std::fill_n(dbias->data(), dbias->numel(), 0.0f);
    return;
  }
  const memory::desc x_desc = RowMajorDesc({rows, in_features});    // (M, K)
  const memory::desc dy_desc = RowMajorDesc({rows, out_features});  // (M, N)
  const bool transposed = TransposedBackward(rows, out_features, in_features);

  if (dx != nullptr) {
    // forward: y = x · W^T   =>   dx (M, K) = dy (M, N) · W (N, K): W as stored, or W^T (K, N)
    // row-major read with strides (1, N).
    const float* w = weight.data();
    memory::desc w_desc = RowMajorDesc({out_features, in_features});
    if (transposed) {
      float* w_transposed = ctx.OperandBuffer(out_features * in_features);
      Transpose(weight.data(), out_features, in_features, /*accumulate=*/false, w_transposed);
      w = w_transposed;
      w_desc = StridedDesc({out_features, in_features}, {1, out_features});
    }
    RunMatmul(ctx,
              absl::StrCat("linear_bwd_data:", rows, "x", in_features, "x", out_features,
                           transposed ? ":wt" : ""),
              dy_desc, dy, w_desc, w, x_desc, dx, /*accumulate=*/false);
  }

  if (dweight != nullptr && transposed) {
    // dW^T (K, N) = x^T (K, M) · dy (M, N), x^T read with strides (1, K); then dW (+)= its
    // transpose.
    const memory::desc xt_desc = StridedDesc({in_features, rows}, {1, in_features});
    const memory::desc dwt_desc = RowMajorDesc({in_features, out_features});
    float* dw_transposed = ctx.OperandBuffer(out_features * in_features);
    RunMatmul(ctx, absl::StrCat("linear_bwd_weights_t:", rows, "x", in_features, "x", out_features),
              xt_desc, x, dy_desc, dy, dwt_desc, dw_transposed, /*accumulate=*/false);
    Transpose(dw_transposed, in_features, out_features, accumulate, dweight->data());
  } else if (dweight != nullptr) {
    // forward: y[m, n] = sum_k x[m, k] W[n, k]   =>   dW (N, K) (+)= dy^T (N, M) · x (M, K).
    // dy^T is dy's bytes read with strides (1, N); accumulation is a sum post-op on dW.
    const memory::desc dyt_desc = StridedDesc({out_features, rows}, {1, out_features});
    const memory::desc dw_desc = RowMajorDesc({out_features, in_features});
    RunMatmul(ctx, absl::StrCat("linear_bwd_weights:", rows, "x", in_features, "x", out_features),
              dyt_desc, dy, x_desc, x, dw_desc, dweight->data(), accumulate);
  }

  if (dbias != nullptr) {
    // forward: y[m, :] += b   =>   db (N) (+)= sum_m dy[m, :]
    SumRows(dy, rows, out_features, accumulate, dbias->data());
  }
}

}  // namespace attn
