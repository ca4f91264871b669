// fp32 <-> IEEE 754 binary16 ("half") and bfloat16 bit conversions, and the wire encoding of
// attnserve.v1.Tensor.data (prod(shape) little-endian values of the tensor's dtype).
//
// Float -> 16-bit rounds to nearest, ties to even; finite values beyond the format's range
// become +-inf; NaN stays NaN with its sign and top payload bits and the quiet bit set
// (what x86 F16C's vcvtps2ph does). Half keeps subnormals (down to 2^-24); bfloat16 shares
// fp32's exponent range, so only rounding applies. Branch-free per element, so whole
// hidden-state tensors convert at memory speed. Assumes the default FP rounding mode.
#pragma once

#include <cstdint>
#include <string>

namespace attn {

uint16_t FloatToHalfBits(float value);
// Exact for every half; NaN comes back quiet, with sign and payload.
float HalfBitsToFloat(uint16_t bits);

uint16_t FloatToBFloat16Bits(float value);
// Exact: bfloat16 is the upper half of fp32 (NaN bits pass through unchanged).
float BFloat16BitsToFloat(uint16_t bits);

// Bulk forms for the bf16 forward (OpenMP-parallel on large arrays):
// out[i] = FloatToBFloat16Bits(x[i]) for i < n.
void FloatsToBFloat16Bits(const float* x, int64_t n, uint16_t* out);
// out[i] = x[i] rounded to the nearest bfloat16, kept as fp32 (out may alias x).
void RoundFloatsToBFloat16(const float* x, int64_t n, float* out);
// FloatsToBFloat16Bits on the calling thread only: for one row inside a parallel kernel.
void FloatsToBFloat16BitsSerial(const float* x, int64_t n, uint16_t* out);

// Element types of attnserve.v1.Tensor.data (the server maps the proto enum onto this one;
// named apart from the safetensors DType).
enum class WireDType { kFloat32, kFloat16, kBFloat16 };

// Bytes per element: 4 or 2.
int WireDTypeSize(WireDType dtype);

// values: n floats -> n * WireDTypeSize(dtype) little-endian bytes. kFloat16 uses the CPU's
// F16C conversion when it has one (same bits as FloatToHalfBits, faster).
std::string EncodeFloats(const float* values, int64_t n, WireDType dtype);
// The same into `out` (n * WireDTypeSize(dtype) bytes), e.g. one piece of a larger message.
void EncodeFloatsTo(const float* values, int64_t n, WireDType dtype, char* out);

namespace internal {
// The portable float16 encoder EncodeFloats falls back to without F16C, exposed so tests can
// check it on any CPU. values: n floats -> out: 2n bytes.
void EncodeHalfPortable(const float* values, int64_t n, char* out);
}  // namespace internal

}  // namespace attn
