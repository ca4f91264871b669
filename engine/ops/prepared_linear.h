// Linear layers prepared once at load for the inference forward:
//   y (M, N) = x (M, K) · W^T + b,   W (N, K) as stored by Hugging Face.
//
// fp32: W copied into the blocked layout oneDNN's matmul asks for (format_tag::any), so no call
//       repacks it; bias and GELU run as post-ops. The copies are laid end to end in slabs
//       backed by transparent huge pages: a batch-1 forward streams all 42 MB of them from
//       memory, and with 4 KB pages every page of that stream is a TLB miss (a two-level page
//       walk in a VM).
// int8 (Int8Outliers): W quantised per output channel, symmetric, to 8 bits (packed once in the
//       layout oneDNN's kernel asks for: with AMX, repacking them on every call was 15% of a
//       1 x 128 forward):
//       scale[n] = max_k |W[n, k]| / 127,  Wq[n, k] = round(W[n, k] / scale[n]) in [-127, 127].
//       Inputs are quantised per token by QuantizeInput to u8 with a zero point (see Int8Input),
//       their outlier elements kept in fp32. The levels are 0..127 on CPUs without AVX-512 VNNI
//       (their u8 x s8 multiply-add sums pairs into saturating 16 bits, and
//       2 * 127 * 127 < 2^15) and 0..255 with VNNI. The matmul gives s32 accumulators, which
//       the epilogue (engine/ops/int8_kernels.h) corrects for the zero points and adds the
//       outliers' fp32 products while it applies the input and weight scales and the bias.
// bf16 (Bf16): W converted to bfloat16 once; each call converts x to bfloat16 and runs a
//       bf16 x bf16 -> fp32 matmul (fp32 accumulation, bias and GELU as post-ops). Where oneDNN
//       has no bf16 matmul (CPUs without AVX-512: it reports "unimplemented" instead of
//       emulating), W and x are rounded to bfloat16 values kept in fp32 and the fp32 matmul
//       runs: a product of two bfloat16 values is exact in fp32, so this computes the same as
//       the native kernel up to the order of the fp32 sums.
//
// Apply() is the one entry point of the forward: the precision is the layer's business, and
// the caller only says what happens to the product (bias, then GELU or residual + LayerNorm).
//
// Row counts are rounded up (MatmulRows) so a server seeing every batch size builds a bounded
// set of primitives; callers size their buffers with MatmulRows(M) rows.

#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/ops/int8_kernels.h"
#include "engine/ops/linear.h"
#include "engine/precision.h"
#include "engine/tensor.h"

namespace attn {

using Int8Buffer = std::vector<int8_t, AlignedAllocator<int8_t>>;
using Int32Buffer = std::vector<int32_t, AlignedAllocator<int32_t>>;

using Uint8Buffer = std::vector<uint8_t, AlignedAllocator<uint8_t>>;

// A per-token quantised input of an int8 linear layer (PreparedLinear::QuantizeInput),
// asymmetric: x[m, k] ~= (q[m, k] - zero_points[m]) * scales[m] with q in [0, L_in] (u8). BERT's
// LayerNorm and GELU outputs carry a few elements per row 20-40x the row's RMS (largest on
// [CLS] and [SEP]); scaling the row by them would leave the other elements a handful of levels.
// So the elements above kOutlierRatio x RMS (at most kMaxOutliers per row, the largest) are not
// quantised (q = zero point) but kept in fp32, and the epilogue adds their products.
struct Int8Input {
  static constexpr float kOutlierRatio = kInt8OutlierRatio;
  static constexpr int kMaxOutliers = kInt8MaxOutliers;
  Uint8Buffer q;                        // (MatmulRows(rows), K)
  FloatBuffer scales;                   // (MatmulRows(rows))
  std::vector<int32_t> zero_points;     // (rows)
  std::vector<int32_t> outlier_counts;  // (rows)
  std::vector<int32_t> outlier_cols;    // (rows, kMaxOutliers)
  std::vector<float> outlier_values;    // (rows, kMaxOutliers)
};

class PreparedLinear;

// Rows the matmul runs on for M rows of input: M itself up to 8, then multiples of 8 up to 64,
// then 8 steps per power of two (at most 1/8 padding). Rows [M, MatmulRows(M)) of an input must
// hold finite values; the same rows of an output are meaningless.
int64_t MatmulRows(int64_t rows);

// What Apply() does with the product x · W^T + b before storing it in y.
struct LinearOutput {
  LinearEpilogue epilogue = LinearEpilogue::kNone;  // kNone or kGelu
  // When residual is set: y = LayerNorm(residual + x · W^T + b) * gamma + beta.
  const float* residual = nullptr;  // (rows, N)
  const float* gamma = nullptr;     // (N)
  const float* beta = nullptr;      // (N)
  float eps = 0.0f;
  // int8 only (ApplyInt8/Apply of an int8 layer): with next_layer (an int8 layer), the output
  // rows are also quantised as next_layer's input into *next_input, in the same pass (the
  // GELU epilogue's y may then be null); next_layer->ApplyInt8(ctx, *next_input, ...) runs it.
  const PreparedLinear* next_layer = nullptr;
  Int8Input* next_input = nullptr;
  // Native bf16 layers with a residual only: y also written here as bfloat16 bits
  // (MatmulRows(rows) rows; the padding ones zero), as the next native bf16 layer's input
  // (ApplyBf16In, ApplyBf16InOut).
  uint16_t* bf16_copy = nullptr;

  static LinearOutput Plain() { return {}; }
  static LinearOutput Gelu() { return {LinearEpilogue::kGelu}; }
  static LinearOutput AddLayerNorm(const float* residual, const float* gamma, const float* beta,
                                   float eps) {
    return {LinearEpilogue::kNone, residual, gamma, beta, eps};
  }
};

class PreparedLinear {
 public:
  PreparedLinear() = default;
  PreparedLinear(PreparedLinear&&) = default;
  PreparedLinear& operator=(PreparedLinear&&) = default;
  // fp32, reading `weight` (N, K) in place: no copy, `weight` and `bias` must outlive this.
  static PreparedLinear Fp32View(const Tensor& weight, const Tensor& bias);
  // fp32 copy in the matmul's preferred layout (falls back to a view if none is better).
  static PreparedLinear Fp32Packed(const Tensor& weight, const Tensor& bias);
  // int8 per-output-channel quantisation (see above), for inputs quantised by QuantizeInput
  // (outliers apart, so it also keeps an fp32 W^T for them). `bias` is read in place.
  static PreparedLinear Int8Outliers(const Tensor& weight, const Tensor& bias);
  // bfloat16 weights (see above): native where oneDNN has a bf16 matmul, else emulated.
  static PreparedLinear Bf16(const Tensor& weight, const Tensor& bias);

  Precision precision() const { return precision_; }
  int64_t in_features() const { return in_features_; }                  // K
  int64_t out_features() const { return out_features_; }                // N
  const float* bias() const { return bias_; }                           // (N)
  const float* weight_scales() const { return scales_.data(); }         // int8: (N)
  const int8_t* quantized_weights() const { return qweights_.data(); }  // int8: (N, K)
  // Weights copied into a layout the matmul prefers (fp32, native bf16, int8), not read as
  // stored.
  bool packed() const { return packed_ != nullptr || !packed_int8_.empty(); }
  // bf16: whether oneDNN runs a bf16 matmul (false: bf16-rounded values in the fp32 matmul).
  bool native_bf16() const { return native_bf16_; }

  // y (rows, N) = output(x (rows, K) · W^T + b) at the layer's precision. x holds
  // MatmulRows(rows) rows (the padding rows finite); y holds MatmulRows(rows) rows, of which
  // the first `rows` are written. y must not alias x. Per-thread scratch: concurrent calls
  // from different threads are safe.
  void Apply(ExecContext& ctx, const float* x, int64_t rows, const LinearOutput& output,
             float* y) const;
  // Native bf16 layers only (native_bf16()), for two layers in a row whose activation between
  // them need not exist in fp32 (the FFN): ApplyBf16Out writes y (MatmulRows(rows), N) as
  // bfloat16 from its epilogue (kNone or kGelu; every row, padding included), ApplyBf16In reads
  // such an x. The same values as Apply(): the next layer would round them to bfloat16 anyway.
  void ApplyBf16Out(ExecContext& ctx, const float* x, int64_t rows, LinearEpilogue epilogue,
                    uint16_t* y) const;
  void ApplyBf16In(ExecContext& ctx, const uint16_t* x, int64_t rows, const LinearOutput& output,
                   float* y) const;
  // Both: x and y bfloat16 (the FFN's first layer on a LayerNorm's bf16_copy).
  void ApplyBf16InOut(ExecContext& ctx, const uint16_t* x, int64_t rows, LinearEpilogue epilogue,
                      uint16_t* y) const;
  // int8 layers only: Apply() on an input already quantised for this layer (QuantizeInput, or
  // the previous layer's LinearOutput::next_layer). The zero points and outliers are applied in
  // the epilogue (Int8Accumulators), not by a pass over the accumulators.
  void ApplyInt8(ExecContext& ctx, const Int8Input& x, int64_t rows, const LinearOutput& output,
                 float* y) const;

  // The kernels Apply() runs, public for tests.
  // fp32 (and emulated bf16): y (rows, N) = epilogue(x (rows, K) · W^T + b). x and y hold
  // MatmulRows(rows) rows.
  void Forward(ExecContext& ctx, const float* x, int64_t rows, LinearEpilogue epilogue,
               float* y) const;
  // int8: quantises x (rows, K) into `input` (buffers grown as needed, padding rows
  // zeroed), then acc (rows, N) = (q - zero point) · Wq^T plus the outliers' products, in
  // units of input.scales[m] * weight_scales()[n] (ForwardInt8 corrects the accumulators in a
  // plain loop, for tests: Apply corrects them in its epilogue).
  void QuantizeInput(const float* x, int64_t rows, Int8Input* input) const;
  void ForwardInt8(ExecContext& ctx, const Int8Input& input, int64_t rows, int32_t* acc) const;
  // int8: `input`'s buffers grown for `rows` (padding rows zeroed), as QuantizedRows at this
  // layer's input level, for a kernel to write.
  QuantizedRows PrepareInput(int64_t rows, Int8Input* input) const;

 private:
  Precision precision_ = Precision::kFp32;
  int64_t in_features_ = 0, out_features_ = 0;
  const float* bias_ = nullptr;
  // The weights oneDNN reads: the view, or packed_, or qweights_.
  const void* weights_data() const;
  // Native bf16: y = epilogue(bf16(x) · W^T + b), W already bf16.
  void ForwardBf16(ExecContext& ctx, const float* x, int64_t rows, LinearEpilogue epilogue,
                   float* y) const;
  // The cached matmul (primitive `key`) y (rows, N) = epilogue(x · W^T + b), x of x_desc, y of
  // y_type (f32, or bf16 for ApplyBf16Out).
  void RunMatmul(ExecContext& ctx, const std::string& key, const dnnl::memory::desc& x_desc,
                 const void* x, LinearEpilogue epilogue, void* y,
                 dnnl::memory::data_type y_type = dnnl::memory::data_type::f32) const;

  dnnl::memory::desc weights_desc_;  // (K, N) as oneDNN reads it
  const float* view_ = nullptr;      // fp32 view: the caller's (N, K) tensor
  // Packed fp32 weights: a slice of a slab shared with other layers' (see PackedWeightSlab).
  std::shared_ptr<const float> packed_;  // fp32, or bf16 bits when native_bf16_
  bool native_bf16_ = false;
  Tensor rounded_weights_;  // emulated bf16: W rounded to bfloat16 (the view or packing source)
  Int8Buffer qweights_;     // (N, K) row-major
  Int8Buffer packed_int8_;  // qweights_ in the layout the u8 x s8 matmul asks for (AMX: blocked
                            // in groups of 4 along K), so no call repacks them; empty when
                            // that is the plain layout
  // y = LayerNorm(product + output.residual), and output.bf16_copy when set.
  void LayerNormInto(const LinearOutput& output, const float* product, int64_t rows,
                     float* y) const;
  // int8: acc (MatmulRows(rows), N) = q · Wq^T, the zero points not subtracted.
  void MatmulInt8(ExecContext& ctx, const Int8Input& input, int64_t rows, int32_t* acc) const;
  // int8: what the epilogue needs to turn `acc` of `input` into x · W^T + b.
  Int8Accumulators Accumulators(const Int8Input& input, const int32_t* acc) const;
  // Packs qweights_ into packed_int8_ and points weights_desc_ at it, where oneDNN's kernel
  // prefers another layout for every row count.
  void PackInt8Weights();
  std::vector<float> scales_;
  float input_level_ = 127.0f;         // L_in, the largest input level
  FloatBuffer transposed_weights_;     // (K, N) fp32, for the outliers' products
  std::vector<int32_t> weight_sums_;   // sum_k Wq[n, k], for the zero points
  std::vector<float> inverse_scales_;  // 1 / weight scale (0 for an all-zero row)
};

}  // namespace attn
