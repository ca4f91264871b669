#include "engine/half.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "engine/ops/avx512_math.h"

namespace attn {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// cond ? x : y as mask arithmetic. A plain ?: lets GCC sink the (possibly trapping, under
// its default -ftrapping-math) fp32 add of the subnormal path into a branch, which then
// blocks vectorisation; masks keep every path computed and the loop branch-free.
inline uint32_t Select(bool cond, uint32_t x, uint32_t y) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (x & mask) | (y & ~mask);
}

// Every case is computed and the result picked with Select, so a loop over a tensor has no
// data-dependent branches and vectorises.
inline uint16_t ToHalf(float value) {
  const uint32_t u = FloatBits(value);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;  // |value|

  // Normal half (|value| in [2^-14, 65520)): rebias the exponent by 15 - 127 and round the
  // 23-bit mantissa to 10 bits. Adding 0xFFF plus the kept LSB rounds half to even; a carry
  // out of the mantissa correctly bumps the exponent (up to inf for [65520, 65536)).
  const uint32_t normal = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;

  // Subnormal half or zero (|value| < 2^-14): in [0.5, 1) the fp32 ulp is 2^-24, the half's
  // subnormal step, so the FPU's round-to-nearest-even of |value| + 0.5 is exactly the
  // rounding needed; the sum's bits minus 0.5's bits count 2^-24 steps, which is the half's
  // bit pattern (0x400, the smallest normal, when it rounds all the way up).
  const uint32_t subnormal = FloatBits(BitsFloat(a) + 0.5f) - FloatBits(0.5f);

  // NaN: quiet bit set, sign and the top 9 payload bits kept.
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);

  uint32_t h = Select(a < (113u << 23), subnormal, normal);
  h = Select(a >= (143u << 23), 0x7C00u, h);  // |value| >= 65536, or inf: overflow to inf
  h = Select(a > 0x7F800000u, nan, h);
  return static_cast<uint16_t>(h | sign);
}

inline float FromHalf(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(bits & 0x7FFFu) << 13;  // exponent+mantissa, fp32
  const uint32_t exp = em & 0x0F800000u;

  const uint32_t normal = em + (112u << 23);  // rebias 15 -> 127
  // Inf/NaN: exponent 31 -> 255; a NaN also gets the quiet bit (as F16C's vcvtph2ps does).
  const uint32_t special = (em + (224u << 23)) | Select(em > 0x0F800000u, 0x00400000u, 0u);
  // Subnormal or zero: read mant * 2^-24 as 2^-14 * (1 + mant / 1024) - 2^-14, exact in fp32.
  const uint32_t subnormal = FloatBits(BitsFloat(em + (113u << 23)) - BitsFloat(113u << 23));

  uint32_t f = Select(exp == 0, subnormal, normal);
  f = Select(exp == 0x0F800000u, special, f);
  return BitsFloat(f | sign);
}

inline uint16_t ToBFloat16(float value) {
  const uint32_t u = FloatBits(value);
  // Round the low 16 bits half to even; a carry lands in the exponent, so FLT_MAX-sized
  // values round to inf as they should. Cannot overflow 32 bits: only NaNs are that large.
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;  // keep sign and top payload, set the quiet bit
  // No fp op here, so a plain ?: stays a blend (and measures faster than Select).
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

template <uint16_t (*Convert)(float)>
void Encode16(const float* values, int64_t n, char* out) {
  // Convert a chunk into an aligned local buffer, then copy: the conversion loop then has no
  // char* stores that might alias `values`, and `omp simd` vectorises it even at -O2 (whose
  // cost model skips loops of unknown trip count).
  constexpr int64_t kChunk = 512;
  alignas(64) uint16_t buffer[kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - begin);
    const float* src = values + begin;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) buffer[i] = Convert(src[i]);
    char* dst = out + 2 * begin;
    if constexpr (kLittleEndian) {
      std::memcpy(dst, buffer, static_cast<size_t>(len) * 2);
    } else {
      for (int64_t i = 0; i < len; ++i) {
        dst[2 * i] = static_cast<char>(buffer[i] & 0xFF);
        dst[2 * i + 1] = static_cast<char>(buffer[i] >> 8);
      }
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// vcvtps2ph converts 8 floats per instruction, ~10x the portable loop (which SSE2 vectorises
// poorly: no 32->16-bit pack). Its results equal ToHalf's bit for bit, checked over all 2^32
// inputs (half_test). The immediate selects round-to-nearest-even whatever MXCSR says.
__attribute__((target("avx,f16c"))) void EncodeHalfF16C(const float* values, int64_t n, char* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(values + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = ToHalf(values[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

bool CpuHasF16C() {
  // "avx" also checks that the OS saves the YMM registers. F16C comes from CPUID leaf 1 directly:
  // clang 14 (which builds the fuzzers) does not know __builtin_cpu_supports("f16c").
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}
#endif

}  // namespace

namespace internal {
void EncodeHalfPortable(const float* values, int64_t n, char* out) {
  Encode16<ToHalf>(values, n, out);
}
}  // namespace internal

uint16_t FloatToHalfBits(float value) { return ToHalf(value); }
float HalfBitsToFloat(uint16_t bits) { return FromHalf(bits); }
uint16_t FloatToBFloat16Bits(float value) { return ToBFloat16(value); }
float BFloat16BitsToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

namespace {
constexpr int64_t kParallelConversions = int64_t{1} << 16;
}  // namespace

namespace {

// The bulk conversions feed every bf16 matmul (a linear layer's input, each call): 16 lanes of
// ToBFloat16's integer formula (the same bits, NaNs included) where the CPU has AVX-512; it was
// 4% of the bf16 forward as a scalar loop.
constexpr int64_t kConversionBlock = 1024;

// CPU detection of its own: this file is also built without engine/ops (the loaders' sanitizer
// build in tests/).
bool CpuHasAvx512() {
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return avx512;
}

// Lanes of ToBFloat16(x): the bfloat16 bits in the low half of each 32-bit lane.
ATTN_AVX512 inline __m512i BFloat16Lanes(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, nan);
}

// Elements [begin, end) of the conversion; `bits` (uint16_t) or `rounded` (float) is written.
ATTN_AVX512 void BFloat16BlockAvx512(const float* x, int64_t begin, int64_t end, uint16_t* bits,
                                     float* rounded) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = avx512::TailMask(end - i);
    const __m512i lanes = BFloat16Lanes(_mm512_maskz_loadu_ps(k, x + i));
    if (bits != nullptr) {
      _mm512_mask_cvtepi32_storeu_epi16(bits + i, k, lanes);
    } else {
      _mm512_mask_storeu_epi32(rounded + i, k, _mm512_slli_epi32(lanes, 16));
    }
  }
}

void BFloat16Blocks(const float* x, int64_t n, uint16_t* bits, float* rounded) {
  const int64_t blocks = (n + kConversionBlock - 1) / kConversionBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelConversions)
  for (int64_t b = 0; b < blocks; ++b) {
    BFloat16BlockAvx512(x, b * kConversionBlock, std::min(n, (b + 1) * kConversionBlock), bits,
                        rounded);
  }
}

}  // namespace

void FloatsToBFloat16Bits(const float* x, int64_t n, uint16_t* out) {
  if (CpuHasAvx512()) return BFloat16Blocks(x, n, out, nullptr);
#pragma omp parallel for schedule(static) if (n >= kParallelConversions)
  for (int64_t i = 0; i < n; ++i) out[i] = ToBFloat16(x[i]);
}

void FloatsToBFloat16BitsSerial(const float* x, int64_t n, uint16_t* out) {
  if (CpuHasAvx512()) return BFloat16BlockAvx512(x, 0, n, out, nullptr);
  for (int64_t i = 0; i < n; ++i) out[i] = ToBFloat16(x[i]);
}

void RoundFloatsToBFloat16(const float* x, int64_t n, float* out) {
  if (CpuHasAvx512()) return BFloat16Blocks(x, n, nullptr, out);
#pragma omp parallel for schedule(static) if (n >= kParallelConversions)
  for (int64_t i = 0; i < n; ++i) out[i] = BitsFloat(static_cast<uint32_t>(ToBFloat16(x[i])) << 16);
}

int WireDTypeSize(WireDType dtype) { return dtype == WireDType::kFloat32 ? 4 : 2; }

std::string EncodeFloats(const float* values, int64_t n, WireDType dtype) {
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) * WireDTypeSize(dtype), '\0');
  EncodeFloatsTo(values, n, dtype, out.data());
  return out;
}

void EncodeFloatsTo(const float* values, int64_t n, WireDType dtype, char* dst) {
  if (n <= 0) return;
  switch (dtype) {
    case WireDType::kFloat32:
      if constexpr (kLittleEndian) {
        std::memcpy(dst, values, static_cast<size_t>(n) * 4);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t u = FloatBits(values[i]);
          for (int b = 0; b < 4; ++b) dst[4 * i + b] = static_cast<char>(u >> (8 * b));
        }
      }
      break;
    case WireDType::kFloat16:
#if defined(__x86_64__) || defined(__i386__)
      if (CpuHasF16C()) {
        EncodeHalfF16C(values, n, dst);
        break;
      }
#endif
      internal::EncodeHalfPortable(values, n, dst);
      break;
    case WireDType::kBFloat16:
      Encode16<ToBFloat16>(values, n, dst);
      break;
  }
}

}  // namespace attn
