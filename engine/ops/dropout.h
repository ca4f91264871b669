// Inverted dropout with a counter-based RNG, as HF's nn.Dropout in training mode:
//   y = x * mask / (1 - p),   mask ~ Bernoulli(1 - p)
// Element i's draw is a pure function of (seed, offset + i) (see DropoutKeep), so masks are
// reproducible, independent of the thread count, and a buffer may be processed in chunks: the
// chunk starting at element k passes offset + k and gets the same mask as one whole call.
#pragma once

#include <cstdint>

namespace attn {

// Whether element `counter` is kept at drop probability p under `seed`:
//   h = splitmix64_mix(splitmix64_mix(seed) + (counter + 1) * 0x9E3779B97F4A7C15)
//   keep  <=>  (h >> 32) >= p * 2^32
// i.e. the counter-th output of SplitMix64 started at the mixed seed, top 32 bits compared
// against p. p <= 0 keeps everything; p >= 1 drops everything.
bool DropoutKeep(uint64_t seed, uint64_t counter, float p);

// y = x * mask / (1-p), mask ~ Bernoulli(1-p). p == 0: y = x, mask all 1.
// x, y: n floats, may alias. mask: n bytes (1 = kept, 0 = dropped); may be null when the
// backward will not run. p must be in [0, 1]; p == 1 gives y = 0 and an all-zero mask.
// Draw i uses counter offset + i: callers give each dropout site/step a distinct seed or a
// disjoint offset range.
void DropoutForward(const float* x, int64_t n, float p, uint64_t seed, uint64_t offset, float* y,
                    uint8_t* mask);

// DropoutForward on the calling thread only (no OpenMP region), for kernels that already run
// inside one: same draws, same y and mask for the same (seed, offset).
void DropoutForwardSerial(const float* x, int64_t n, float p, uint64_t seed, uint64_t offset,
                          float* y, uint8_t* mask);

// forward: y = x * mask / (1-p)   =>   dx = dy * mask / (1-p)
// dy, dx: n floats, may alias; mask and p as given to / returned by DropoutForward.
void DropoutBackward(const float* dy, const uint8_t* mask, int64_t n, float p, float* dx);

}  // namespace attn
