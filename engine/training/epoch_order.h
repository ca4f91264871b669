// The order a fine-tuning job visits its examples in each epoch, shared by the client (attnctl
// finetune sends batches in it) and the server (a server-side job runs them in it), so the same
// data, seed and batch size give the same batches on either path. Header-only and free of any
// library: the client includes it without linking the engine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace attn {

namespace epoch_order_detail {

// SplitMix64: seeds the shuffle generator from (seed, epoch) and is the generator.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection sampling).
inline uint64_t Below(uint64_t bound, uint64_t* state) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t r;
  do {
    r = SplitMix64(state);
  } while (r >= limit);
  return r % bound;
}

}  // namespace epoch_order_detail

// The order examples are visited in epoch `epoch` (0-based): a permutation of [0, n) from a
// Fisher-Yates shuffle with a generator seeded by (seed, epoch) only, so a run is reproducible
// and independent of the standard library.
inline std::vector<size_t> EpochOrder(size_t n, uint64_t seed, int epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed;
  state = epoch_order_detail::SplitMix64(&state) ^
          (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL);
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(epoch_order_detail::Below(i, &state));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

// Optimisation steps per epoch: ceil(examples / batch_size); the last batch may be smaller.
inline int64_t StepsPerEpoch(size_t examples, int batch_size) {
  if (batch_size <= 0) return 0;
  return static_cast<int64_t>((examples + batch_size - 1) / batch_size);
}

// One epoch's batches as [begin, end) ranges of its order: `batch_size` examples each, the last
// one smaller. A batch needs at least `min_batch` examples (contrastive: 2, for one pair has no
// in-batch negative): a last batch short of it takes what it lacks from the batch before it
// (for 9 pairs in batches of 4: 4, 3, 2), so the step count stays StepsPerEpoch.
inline std::vector<std::pair<size_t, size_t>> EpochBatches(size_t n, int batch_size,
                                                           size_t min_batch = 1) {
  std::vector<std::pair<size_t, size_t>> batches;
  if (batch_size <= 0) return batches;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(batch_size)) {
    batches.emplace_back(begin, std::min(n, begin + static_cast<size_t>(batch_size)));
  }
  if (batches.size() >= 2) {
    auto& last = batches.back();
    auto& before = batches[batches.size() - 2];
    const size_t lacking =
        last.second - last.first < min_batch ? min_batch - (last.second - last.first) : 0;
    if (lacking > 0 && before.second - before.first >= lacking + min_batch) {
      before.second -= lacking;
      last.first -= lacking;
    }
  }
  return batches;
}

// Whether an epoch of `n` contrastive pairs in batches of `batch_size` still ends with a batch of
// one pair after EpochBatches borrowed what it could (batches of 2 have nothing to lend).
inline bool EndsWithALonePair(size_t n, int batch_size) {
  const std::vector<std::pair<size_t, size_t>> batches = EpochBatches(n, batch_size, 2);
  return batches.size() >= 2 && batches.back().second - batches.back().first == 1;
}

}  // namespace attn
