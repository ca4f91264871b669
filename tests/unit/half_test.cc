// fp32 <-> half / bfloat16 conversions: exhaustive round trips, hand-derived bit patterns,
// an independent double-precision rounding reference, and x86 F16C hardware as an oracle.
#include "engine/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/test_policy.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ATTN_HAVE_X86 1
#endif

namespace attn {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Half

TEST(HalfTest, HandDerivedBitPatterns) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3C00},
      {-2.0f, 0xC000},
      {0.5f, 0x3800},
      {65504.0f, 0x7BFF},   // largest finite half
      {65519.99f, 0x7BFF},  // just below the rounding midpoint to inf
      {65520.0f, 0x7C00},   // midpoint 65504 / 65536: ties to even = inf
      {-65520.0f, 0xFC00},  //
      {1e10f, 0x7C00},      // overflow
      {std::numeric_limits<float>::max(), 0x7C00},
      {std::numeric_limits<float>::infinity(), 0x7C00},
      {-std::numeric_limits<float>::infinity(), 0xFC00},
      {std::ldexp(1.0f, -14), 0x0400},     // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},     // smallest subnormal
      {std::ldexp(1023.0f, -24), 0x03FF},  // largest subnormal
      {std::ldexp(1.0f, -25), 0x0000},     // half of the smallest subnormal: tie to even 0
      {std::ldexp(1.5f, -25), 0x0001},     // above the midpoint
      {std::ldexp(3.0f, -25), 0x0002},     // 1.5 * 2^-24: tie between 1 and 2 -> even 2
      {std::ldexp(5.0f, -25), 0x0002},     // 2.5 * 2^-24: tie between 2 and 3 -> even 2
      {std::ldexp(2047.0f, -25), 0x0400},  // 1023.5 * 2^-24 rounds up into the normals
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {1.0f + std::ldexp(1.0f, -11), 0x3C00},          // tie between 0x3C00 and 0x3C01: even
      {1.0f + std::ldexp(3.0f, -11), 0x3C02},          // tie between 0x3C01 and 0x3C02: even
      {1.0f + std::ldexp(1.0f, -11) + 1e-7f, 0x3C01},  // just above the tie
      {2048.0f + 1.0f, 0x6800},                        // ulp is 2 at 2048: tie -> even
      {2048.0f + 3.0f, 0x6802},                        //
      {0.1f, 0x2E66},                                  // 0.0999755859375
      {3.14159265f, 0x4248},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToHalfBits(c.value), c.bits)
        << "value " << c.value << " (0x" << std::hex << Bits(c.value) << ")";
  }
}

TEST(HalfTest, NaNStaysQuietNaNWithSignAndPayload) {
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(FloatToHalfBits(FromBits(0xFFC00000u)), 0xFE00);
  // Signalling NaN with its payload only in the top mantissa bits: quiet bit added, payload
  // kept, not turned into inf.
  EXPECT_EQ(FloatToHalfBits(FromBits(0x7F802000u)), 0x7E01);
  // Payload only in bits that do not fit: still NaN, never inf.
  EXPECT_EQ(FloatToHalfBits(FromBits(0x7F800001u)), 0x7E00);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7C01)));
  EXPECT_EQ(Bits(HalfBitsToFloat(0x7C01)), 0x7FC02000u);  // quietened, payload kept
  EXPECT_EQ(Bits(HalfBitsToFloat(0xFE00)), 0xFFC00000u);
}

TEST(HalfTest, AllHalfBitPatternsRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(bits);
    const bool is_nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      // Round trip of a NaN: same sign and payload, quiet bit set.
      ASSERT_EQ(FloatToHalfBits(f), bits | 0x0200) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalfBits(f), bits) << std::hex << h;
    }
  }
}

TEST(HalfTest, HalfToFloatValues) {
  EXPECT_EQ(HalfBitsToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(Bits(HalfBitsToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(HalfBitsToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfBitsToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  // Against the defining formula for every finite half.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    if (exp == 0x1F) continue;
    const double magnitude =
        exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);  // 2^(e-15-10)
    const double expected = (h & 0x8000) ? -magnitude : magnitude;
    ASSERT_EQ(HalfBitsToFloat(static_cast<uint16_t>(h)), expected) << std::hex << h;
  }
}

// Round to nearest even, decided in double independently of the bit tricks: of `truncated`
// (the pattern just below |x|, sign included) and the next pattern up, the one nearer to x,
// on a tie the even one. `decode` maps a pattern to its value.
template <typename Decode>
uint16_t NearestEven(float x, uint16_t truncated, Decode decode) {
  const uint16_t lo = truncated, hi = static_cast<uint16_t>(truncated + 1);
  const double d = std::fabs(static_cast<double>(x));
  const double lo_v = std::fabs(static_cast<double>(decode(lo)));
  const double hi_v = std::fabs(static_cast<double>(decode(hi)));  // may be inf
  const double dl = d - lo_v, dh = hi_v - d;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(HalfTest, RandomFloatsAgainstDoubleReference) {
  std::mt19937 rng(7);
  // Exponents that land in the half range (normals, subnormals and just around overflow).
  std::uniform_int_distribution<uint32_t> exp_dist(127 - 26, 127 + 16);
  std::uniform_int_distribution<uint32_t> mant_dist(0, 0x7FFFFF);
  std::uniform_int_distribution<uint32_t> sign_dist(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = (sign_dist(rng) << 31) | (exp_dist(rng) << 23) | mant_dist(rng);
    const float x = FromBits(u);
    const double ax = std::fabs(static_cast<double>(x));
    uint16_t expected;
    if (ax >= 65520.0) {
      expected = 0x7C00;
    } else {
      // Truncated magnitude: the largest half <= |x|, found by scaling to units of the ulp.
      const int e = std::max(std::ilogb(ax), -14);
      const double ulp = std::ldexp(1.0, e - 10);
      const uint32_t units = static_cast<uint32_t>(std::floor(ax / ulp));  // < 2048
      const uint16_t trunc = e == -14 && units < 1024
                                 ? static_cast<uint16_t>(units)
                                 : static_cast<uint16_t>(((e + 15) << 10) | (units - 1024));
      expected = NearestEven(static_cast<float>(ax), trunc, HalfBitsToFloat);
    }
    expected |= (u >> 16) & 0x8000;
    ASSERT_EQ(FloatToHalfBits(x), expected) << "x=" << x << " bits=0x" << std::hex << u;
  }
}

#ifdef ATTN_HAVE_X86
__attribute__((target("f16c"))) uint16_t HardwareToHalf(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareFromHalf(uint16_t h) { return _cvtsh_ss(h); }

// cpuid leaf 1 ECX bit 29, with AVX usable (F16C works on AVX registers): clang-14's
// __builtin_cpu_supports does not know "f16c".
bool HasF16C() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ((ecx >> 29) & 1) != 0 && __builtin_cpu_supports("avx");
}

TEST(HalfTest, MatchesF16CHardwareOnRandomFloats) {
  ATTN_SKIP_UNLESS_CPU_HAS("F16c", HasF16C());
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> exp_dist(127 - 26, 127 + 16);
  std::uniform_int_distribution<uint32_t> mant_dist(0, 0x7FFFFF);
  int mismatches = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    // Half the draws are arbitrary bit patterns (NaNs, infs, huge and tiny values), half are
    // concentrated where half has precision, so rounding is exercised at every exponent.
    const uint32_t u = (i & 1)
                           ? any_bits(rng)
                           : (any_bits(rng) & 0x80000000u) | (exp_dist(rng) << 23) | mant_dist(rng);
    const float x = FromBits(u);
    const uint16_t got = FloatToHalfBits(x), want = HardwareToHalf(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x bits 0x" << std::hex << u << ": got 0x" << got << ", F16C 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(HalfTest, HalfToFloatMatchesF16CForAllPatterns) {
  ATTN_SKIP_UNLESS_CPU_HAS("F16c", HasF16C());
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float got = HalfBitsToFloat(static_cast<uint16_t>(h));
    const float want = HardwareFromHalf(static_cast<uint16_t>(h));
    ASSERT_EQ(Bits(got), Bits(want)) << std::hex << h;
  }
}

// All 2^32 floats against F16C: about a minute, so run by hand with
// --gtest_also_run_disabled_tests.
TEST(HalfTest, DISABLED_ExhaustiveAgainstF16C) {
  ATTN_SKIP_UNLESS_CPU_HAS("F16c", HasF16C());
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; ++u) {
    const float x = FromBits(static_cast<uint32_t>(u));
    mismatches += FloatToHalfBits(x) != HardwareToHalf(x);
  }
  EXPECT_EQ(mismatches, 0u);
}
#endif

// ---------------------------------------------------------------------------------------------
// bfloat16

TEST(BFloat16Test, HandDerivedBitPatterns) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3F80},
      {-1.0f, 0xBF80},
      {1.00390625f, 0x3F80},  // 1 + 2^-8: tie between 0x3F80 and 0x3F81 -> even 0x3F80
      {1.01171875f, 0x3F82},  // 1 + 3 * 2^-8: tie between 0x3F81 and 0x3F82 -> even 0x3F82
      {1.0078125f, 0x3F81},   // 1 + 2^-7: exactly representable
      {1.00390636f, 0x3F81},  // just above the tie
      {3.14159265f, 0x4049},  // 0x40490FDB
      {std::numeric_limits<float>::max(), 0x7F80},  // rounds up to inf
      {-std::numeric_limits<float>::max(), 0xFF80},
      {FromBits(0x7F7F7FFFu), 0x7F7F},  // just below the midpoint: largest finite bf16
      {std::numeric_limits<float>::infinity(), 0x7F80},
      {-std::numeric_limits<float>::infinity(), 0xFF80},
      {std::numeric_limits<float>::denorm_min(), 0x0000},  // fp32 subnormals round like any
      {FromBits(0x00018000u), 0x0002},                     // tie between 1 and 2 -> even
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToBFloat16Bits(c.value), c.bits)
        << "value " << c.value << " (0x" << std::hex << Bits(c.value) << ")";
  }
}

TEST(BFloat16Test, NaNStaysQuietNaN) {
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0xFFC00000u)), 0xFFC0);
  // Signalling NaN whose payload sits in the low bits: naive rounding would carry it into
  // inf (0x7F800001 + 0x7FFF) -- it must stay NaN.
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7F810000u)), 0x7FC1);
}

TEST(BFloat16Test, AllBFloat16BitPatternsRoundTrip) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = BFloat16BitsToFloat(bits);
    ASSERT_EQ(Bits(f), b << 16);  // bfloat16 is the top half of fp32
    const bool is_nan = (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
    ASSERT_EQ(FloatToBFloat16Bits(f), is_nan ? (bits | 0x0040) : bits) << std::hex << b;
  }
}

// The bulk conversions (16 lanes at a time on AVX-512 CPUs, in blocks over threads) give the
// scalar conversion's bits for every element: all bf16 patterns with low halves that round
// down, to even and up (NaNs and infinities included), at lengths that leave vector tails.
TEST(BFloat16Test, BulkConversionsEqualTheScalarOne) {
  std::vector<float> x;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      x.push_back(FromBits(b << 16 | low));
  }
  for (const size_t n : {x.size(), size_t{1}, size_t{17}, size_t{1023}, size_t{1025}}) {
    std::vector<uint16_t> bits(n + 1, 0xABCD);
    std::vector<float> rounded(n + 1, 42.0f);
    FloatsToBFloat16Bits(x.data(), static_cast<int64_t>(n), bits.data());
    RoundFloatsToBFloat16(x.data(), static_cast<int64_t>(n), rounded.data());
    for (size_t i = 0; i < n; ++i) {
      const uint16_t expected = FloatToBFloat16Bits(x[i]);
      ASSERT_EQ(bits[i], expected) << std::hex << Bits(x[i]);
      ASSERT_EQ(Bits(rounded[i]), static_cast<uint32_t>(expected) << 16) << std::hex << Bits(x[i]);
    }
    EXPECT_EQ(bits[n], 0xABCD) << "wrote past the end";
    EXPECT_EQ(rounded[n], 42.0f) << "wrote past the end";
  }
}

TEST(BFloat16Test, RandomFloatsAgainstDoubleReference) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = any_bits(rng);
    const float x = FromBits(u);
    if (std::isnan(x)) continue;
    uint16_t expected;
    if (std::isinf(x)) {
      expected = static_cast<uint16_t>(u >> 16);
    } else {
      const uint16_t trunc = static_cast<uint16_t>(u >> 16);
      // Above the largest finite bf16 the next grid point would be 2^128 (the exponent
      // continuing); values at or past that midpoint round to it, which is inf.
      if ((trunc & 0x7FFF) == 0x7F7F) {
        const double d = std::fabs(static_cast<double>(x));
        const double lo = std::fabs(static_cast<double>(BFloat16BitsToFloat(trunc)));
        const double hi = std::ldexp(1.0, 128);
        expected = (d - lo < hi - d)   ? trunc
                   : (hi - d < d - lo) ? static_cast<uint16_t>(trunc + 1)
                   : (trunc & 1)       ? static_cast<uint16_t>(trunc + 1)
                                       : trunc;
      } else {
        expected = NearestEven(x, trunc, BFloat16BitsToFloat);
      }
    }
    ASSERT_EQ(FloatToBFloat16Bits(x), expected) << "bits 0x" << std::hex << u;
  }
}

// ---------------------------------------------------------------------------------------------
// Wire encoding

TEST(EncodeFloatsTest, LittleEndianBytes) {
  const float values[] = {1.0f, -2.0f, 65520.0f};
  EXPECT_EQ(EncodeFloats(values, 3, WireDType::kFloat32), std::string("\x00\x00\x80\x3F"
                                                                      "\x00\x00\x00\xC0"
                                                                      "\x00\xF0\x7F\x47",
                                                                      12));
  EXPECT_EQ(EncodeFloats(values, 3, WireDType::kFloat16), std::string("\x00\x3C"
                                                                      "\x00\xC0"
                                                                      "\x00\x7C",
                                                                      6));
  EXPECT_EQ(EncodeFloats(values, 3, WireDType::kBFloat16), std::string("\x80\x3F"
                                                                       "\x00\xC0"
                                                                       "\x80\x47",
                                                                       6));
  EXPECT_EQ(EncodeFloats(values, 0, WireDType::kFloat16), "");
  EXPECT_EQ(WireDTypeSize(WireDType::kFloat32), 4);
  EXPECT_EQ(WireDTypeSize(WireDType::kFloat16), 2);
  EXPECT_EQ(WireDTypeSize(WireDType::kBFloat16), 2);
}

TEST(EncodeFloatsTest, BulkMatchesScalar) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> values(10007);  // odd length: exercises any vector remainder loop
  for (float& v : values) v = dist(rng);
  // Every path of the conversion, spread over vector lanes and the scalar tail.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            1e30f,
                            65520.0f,
                            65519.0f,
                            std::ldexp(3.0f, -25),
                            1e-30f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min()};
  for (size_t i = 0; i < values.size(); i += 97) values[i] = specials[(i / 97) % 9];
  for (size_t i = values.size() - 9; i < values.size(); ++i) values[i] = specials[i % 9];
  // EncodeFloats may take the F16C path on this CPU; check the portable one explicitly too.
  const std::string half = EncodeFloats(values.data(), values.size(), WireDType::kFloat16);
  std::string portable(2 * values.size(), '\0');
  internal::EncodeHalfPortable(values.data(), values.size(), portable.data());
  const std::string bf16 = EncodeFloats(values.data(), values.size(), WireDType::kBFloat16);
  ASSERT_EQ(half.size(), 2 * values.size());
  ASSERT_EQ(bf16.size(), 2 * values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const auto at = [](const std::string& s, size_t i) {
      return static_cast<uint16_t>(static_cast<uint8_t>(s[2 * i]) |
                                   (static_cast<uint8_t>(s[2 * i + 1]) << 8));
    };
    ASSERT_EQ(at(half, i), FloatToHalfBits(values[i])) << i;
    ASSERT_EQ(at(portable, i), FloatToHalfBits(values[i])) << i;
    ASSERT_EQ(at(bf16, i), FloatToBFloat16Bits(values[i])) << i;
  }
}

}  // namespace
}  // namespace attn
