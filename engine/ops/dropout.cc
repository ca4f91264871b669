#include "engine/ops/dropout.h"

#include <algorithm>
#include <cmath>

namespace attn {

namespace {

// Loops below this size run on the calling thread: a parallel region costs more than the work.
constexpr int64_t kParallelThreshold = 1 << 15;

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// Draws with top-32 bits below this are dropped. p * 2^32 in 64 bits so that p == 1 drops all.
inline uint64_t DropThreshold(float p) {
  if (!(p > 0.0f)) return 0;  // also maps NaN to "keep all"
  if (p >= 1.0f) return uint64_t{1} << 32;
  return static_cast<uint64_t>(std::ldexp(static_cast<double>(p), 32));
}

// 1 / (1 - p), and 0 when everything is dropped (so y = 0 rather than 0 * inf = NaN).
inline float KeepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

inline bool Keep(uint64_t mixed_seed, uint64_t counter, uint64_t threshold) {
  return (Mix64(mixed_seed + (counter + 1) * kGoldenGamma) >> 32) >= threshold;
}

// DropoutForward's loop body over [0, n) on the calling thread.
inline void DropoutRange(const float* x, int64_t n, uint64_t threshold, uint64_t mixed_seed,
                         float scale, uint64_t offset, float* y, uint8_t* mask) {
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = Keep(mixed_seed, offset + static_cast<uint64_t>(i), threshold);
    y[i] = keep ? x[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
  }
}

}  // namespace

bool DropoutKeep(uint64_t seed, uint64_t counter, float p) {
  return Keep(Mix64(seed), counter, DropThreshold(p));
}

void DropoutForward(const float* x, int64_t n, float p, uint64_t seed, uint64_t offset, float* y,
                    uint8_t* mask) {
  const uint64_t threshold = DropThreshold(p);
  if (threshold == 0) {
    // p == 0: identity, mask all ones (no draws needed).
#pragma omp parallel for simd schedule(static) if (n >= kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      y[i] = x[i];
      if (mask != nullptr) mask[i] = 1;
    }
    return;
  }
  const uint64_t mixed_seed = Mix64(seed);
  const float scale = KeepScale(p);
  // Each element's draw depends only on (seed, offset + i): any split of the loop gives the same
  // result.
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = Keep(mixed_seed, offset + static_cast<uint64_t>(i), threshold);
    y[i] = keep ? x[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
  }
}

void DropoutForwardSerial(const float* x, int64_t n, float p, uint64_t seed, uint64_t offset,
                          float* y, uint8_t* mask) {
  const uint64_t threshold = DropThreshold(p);
  if (threshold == 0) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    if (mask != nullptr) std::fill(mask, mask + n, uint8_t{1});
    return;
  }
  DropoutRange(x, n, threshold, Mix64(seed), KeepScale(p), offset, y, mask);
}

void DropoutBackward(const float* dy, const uint8_t* mask, int64_t n, float p, float* dx) {
  const float scale = KeepScale(p);
#pragma omp parallel for simd schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] != 0 ? dy[i] * scale : 0.0f;
}

}  // namespace attn
