// What a request will cost, from the request alone, before any work: the bytes of its response
// and the peak working memory of serving it; and the server-wide budget calls are admitted
// against. The core links no RPC or serialisation library: the wire sizes of the responses
// (Protocol Buffers encoding) are computed by hand.
//
// Working memory of one Encode/AttentionMap call, at its peak (the response being serialised
// while everything it was built from is still held):
//   token copies     16 B per token + 128 B per input (the batcher's and the engine's id lists)
//   forward result   what the engine keeps for the call, fp32: hidden states (M, H) per kept
//                    layer, static embeddings (M, H), per input and kept attention layer the
//                    (heads, T, T) probabilities [and scores] [and (3, heads, T, d) Q K V]
//                    (rollout keeps every layer)
//   response         the message under construction: the wire bytes plus ~128 B per token
//                    (a Token message and its text string in memory)
//   serialised       the wire bytes once more (the buffer gRPC sends)
//   held             the core's per-sequence results until the message is built from them
//                    (server/core/results.h): pooled embeddings, top-k values and indices,
//                    means over heads, rollouts
//   transient        the largest temporary of the response build (rollout's per-layer means,
//                    a copy of the selected heads for top-k)
// The engine's per-thread workspace (sized by --max-batch-tokens, reused by every batch) is
// not per call: EngineWorkspaceBytes() is reserved from the budget once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/half.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"

namespace attn::server {

struct RequestCost {
  int64_t response_bytes = 0;  // wire size of the response (Protocol Buffers encoding)
  int64_t working_bytes = 0;   // peak memory of serving the call, response included
};

// What an Encode call returns besides the tokens.
struct EncodeCostQuery {
  bool pooled = true;              // the sentence embedding
  bool token_embeddings = false;   // (T, H) of the last layer
  int hidden_layers = 0;           // (T, H) per requested layer
  bool keeps_last_layer = false;   // the requested layers include the last one
  bool static_embeddings = false;  // (T, H)
  WireDType dtype = WireDType::kFloat32;
  // Chunked inputs (LONG_TEXT_CHUNK): the windows each input is encoded in (null = one each)
  // and the tokens of all windows (-1 = the inputs' tokens), which the forward keeps.
  const std::vector<int>* windows = nullptr;
  int64_t forward_tokens = -1;
};

// What an AttentionMap call returns besides the tokens.
struct AttentionCostQuery {
  std::vector<int> layers;  // returned layers (0-based)
  std::vector<int> heads;   // selected heads
  bool weights = true, scores = false, qkv = false, mean_over_heads = false, rollout = false;
  int top_k = 0;
  WireDType dtype = WireDType::kFloat32;
};

RequestCost EstimateEncodeCost(const BertConfig& config, const WordPieceTokenizer& tokenizer,
                               const std::vector<Encoding>& inputs, const EncodeCostQuery& query,
                               int64_t model_version_bytes);
RequestCost EstimateAttentionCost(const BertConfig& config, const WordPieceTokenizer& tokenizer,
                                  const std::vector<Encoding>& inputs,
                                  const AttentionCostQuery& query, int64_t model_version_bytes);

// The engine's per-thread forward buffers for batches of up to `max_batch_tokens` tokens.
int64_t EngineWorkspaceBytes(const BertConfig& config, int64_t max_batch_tokens);

// Multiply-adds per token of the model's linear layers (Q, K, V, O and the FFN of every layer):
// layers x (4 H^2 + 2 H I). What sets one batch's time at ordinary lengths (all-MiniLM-L6-v2
// 10.6 M, all-mpnet-base-v2 84.9 M); scales the per-model token budget (options.h).
double ModelTokenCost(const BertConfig& config);

// Memory the server may use: the cgroup limit of this process (cgroup v2 memory.max of its
// cgroup and every ancestor, or v1 memory.limit_in_bytes) when there is one, else physical
// memory.
int64_t MemoryLimitBytes();
// The default --memory-budget-bytes: half of MemoryLimitBytes() (the rest holds the loaded
// model versions, the engine workspace, gRPC buffers and allocator slack).
int64_t DefaultMemoryBudgetBytes();

// Per-request limits: RESOURCE_EXHAUSTED naming the figure, the limit and what to change when
// `cost` exceeds the response limit (--max-message-bytes) or the working-memory limit
// (--max-request-memory-bytes). `limit_name` receives "message" or "request" on refusal.
// `lower_bound`: `cost` is a lower bound (the message says "at least" rather than "about").
// RESOURCE_EXHAUSTED for a call too large for this server whatever its load (over a per-call
// limit), marked so that a front end can tell it from overload: retrying it cannot succeed
// (HTTP answers it 413, overload 429; server/status_map.cc).
absl::Status TooLargeError(const std::string& message);
bool IsTooLarge(const absl::Status& status);

absl::Status CheckRequestCost(const RequestCost& cost, int64_t max_message_bytes,
                              int64_t max_request_memory_bytes, std::string* limit_name,
                              bool lower_bound = false);

// The server-wide in-flight budget. Calls that do not fit are refused at once
// (RESOURCE_EXHAUSTED, retry with back-off), never queued: a queued call would hold its
// request and tokens while waiting, and the client's deadline is a better judge of how long
// to wait. The last quarter of the budget is kept for light calls (at most 1/16 of the
// budget each), so a burst of heavy calls cannot starve ordinary Encodes.
class MemoryBudget {
 public:
  // `budget_bytes` for calls in flight (the engine workspace already taken off).
  explicit MemoryBudget(int64_t budget_bytes) : budget_(budget_bytes) {}

  int64_t budget() const;
  int64_t in_flight() const;
  // Takes `bytes` off the budget for good (memory the server holds whatever the calls).
  void Reserve(int64_t bytes);

  // Takes `bytes` from the budget, or says why not. Pair every success with Release(bytes).
  absl::Status Acquire(int64_t bytes);
  void Release(int64_t bytes);
  // Whether a call needing at least `lower_bound_bytes` could be admitted now: the status
  // Acquire would give, without taking anything (a refusal before tokenizing).
  absl::Status CheckFits(int64_t lower_bound_bytes) const;

 private:
  absl::Status Refusal(int64_t bytes, bool lower_bound) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  mutable absl::Mutex mutex_;
  int64_t budget_ ABSL_GUARDED_BY(mutex_);
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace attn::server
