// CompareVersions and Neighbors in the serving core: validate the request, resolve the model(s)
// and the versions (loading a stored version that is not in memory, which never changes the
// served one), tokenize, then run the engine work (engine/version_compare.h,
// engine/neighbors.h) as one task job on the model's batcher thread, so it stays off the gRPC
// threads and yields to queued Encode batches between probe chunks. Both are read-only.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/neighbors.h"
#include "engine/version_compare.h"
#include "server/core/calls.h"
#include "server/core/model_set.h"

namespace attn::server::core {

// Cost bounds (INVALID_ARGUMENT beyond them, naming the limit).
inline constexpr int kMinProbes = 11;  // top-10 neighbours need 10 other probes
inline constexpr int kMaxProbes = 1000;
inline constexpr size_t kMaxProbeBytes = 2000;
inline constexpr size_t kMaxWordChars = 100;
inline constexpr int kMaxNeighbours = 100;
inline constexpr int kMaxSentences = 64;

// The built-in probe set: 200 hand-written sentences (server/core/default_probes.inc).
const std::vector<std::string>& DefaultProbes();

struct CompareVersionsRequest {
  std::string model;    // empty = the default model
  std::string model_b;  // version_b's model; empty = `model`
  std::string version_a, version_b;
  std::vector<std::string> probes;  // empty = DefaultProbes()
  int top_heads = 0;                // 0 = 10
};

struct CompareVersionsResponse {
  std::string model, version_a, version_b;
  WeightComparison weights;
  ProbeComparison probes;
  std::vector<int> most_changed_heads;  // indices into probes.attention_js, largest first
  ReindexVerdict verdict;
  bool default_probes = false;
  double seconds = 0;
};

// `done` is called exactly once: on the calling thread when the request is refused before the
// work, else on the batcher thread.
void CompareVersions(const ModelSet& models, const CompareVersionsRequest& request,
                     const CallControl& control,
                     std::function<void(absl::StatusOr<CompareVersionsResponse>)> done);

struct NeighborsRequest {
  std::string model, version;  // empty = the default model / its served version
  std::string word;
  std::optional<int32_t> token_id;  // instead of `word`
  int top_k = 0;                    // 0 = 10
  std::vector<std::string> sentences;
  std::optional<int> layer;  // unset = the last layer
};

struct NeighborsResponse {
  std::string model_version;
  std::vector<int32_t> word_ids;
  std::vector<std::string> word_tokens;
  std::vector<TokenNeighbour> neighbours;
  std::vector<std::string> neighbour_tokens;
  int layer = 0;
  std::vector<double> contextual_cosine;  // (S, S), empty without sentences
};

void Neighbors(const ModelSet& models, const NeighborsRequest& request, const CallControl& control,
               std::function<void(absl::StatusOr<NeighborsResponse>)> done);

}  // namespace attn::server::core
