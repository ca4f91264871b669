// Linear layers prepared once at load for the inference forward:
//   y (M, N) = x (M, K) · W^T + b,   W (N, K) as stored by Hugging Face.
//
// fp32: W copied into the blocked layout oneDNN's matmul asks for (format_tag::any), so no call
//       repacks it; bias and GELU run as post-ops.
// int8: W quantised per output channel, symmetric: scale[n] = max_k |W[n, k]| / L,
//       Wq[n, k] = round(W[n, k] / scale[n]) in [-L, L], with L = 63 on CPUs without AVX-512
//       VNNI (their u8 x s8 multiply-add sums pairs into saturating 16 bits; 7-bit weights keep
//       2 * 255 * 63 below 2^15) and L = 127 with VNNI. The matmul gives s32 accumulators; the
//       row kernels (engine/ops/cpu_kernels.h) apply the activation and weight scales and bias.
//
// Row counts are rounded up (MatmulRows) so a server seeing every batch size builds a bounded
// set of primitives; callers size their buffers with MatmulRows(M) rows.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/ops/linear.h"
#include "engine/precision.h"
#include "engine/tensor.h"

namespace attn {

using Int8Buffer = std::vector<int8_t, AlignedAllocator<int8_t>>;
using Int32Buffer = std::vector<int32_t, AlignedAllocator<int32_t>>;

// Rows the matmul runs on for M rows of input: M itself up to 8, then multiples of 8 up to 64,
// then 8 steps per power of two (at most 1/8 padding). Rows [M, MatmulRows(M)) of an input must
// hold finite values; the same rows of an output are meaningless.
int64_t MatmulRows(int64_t rows);

class PreparedLinear {
 public:
  PreparedLinear() = default;
  PreparedLinear(PreparedLinear&&) = default;
  PreparedLinear& operator=(PreparedLinear&&) = default;
  // fp32, reading `weight` (N, K) in place: no copy, `weight` and `bias` must outlive this.
  static PreparedLinear Fp32View(const Tensor& weight, const Tensor& bias);
  // fp32 copy in the matmul's preferred layout (falls back to a view if none is better).
  static PreparedLinear Fp32Packed(const Tensor& weight, const Tensor& bias);
  // int8 per-output-channel quantisation (see above). `bias` is read in place.
  static PreparedLinear Int8(const Tensor& weight, const Tensor& bias);

  Precision precision() const { return precision_; }
  int64_t in_features() const { return in_features_; }                  // K
  int64_t out_features() const { return out_features_; }                // N
  const float* bias() const { return bias_; }                           // (N)
  const float* weight_scales() const { return scales_.data(); }         // int8: (N)
  const int8_t* quantized_weights() const { return qweights_.data(); }  // int8: (N, K)
  bool packed() const { return !packed_.empty(); }

  // fp32: y (rows, N) = epilogue(x (rows, K) · W^T + b). x and y hold MatmulRows(rows) rows.
  void Forward(ExecContext& ctx, const float* x, int64_t rows, LinearEpilogue epilogue,
               float* y) const;
  // int8: acc (rows, N) = xq (rows, K) · Wq^T in s32. xq and acc hold MatmulRows(rows) rows.
  void ForwardInt8(ExecContext& ctx, const int8_t* xq, int64_t rows, int32_t* acc) const;

 private:
  Precision precision_ = Precision::kFp32;
  int64_t in_features_ = 0, out_features_ = 0;
  const float* bias_ = nullptr;
  // The weights oneDNN reads: the view, or packed_, or qweights_.
  const void* weights_data() const;

  dnnl::memory::desc weights_desc_;  // (K, N) as oneDNN reads it
  const float* view_ = nullptr;      // fp32 view: the caller's (N, K) tensor
  FloatBuffer packed_;
  Int8Buffer qweights_;
  std::vector<float> scales_;
};

}  // namespace attn
