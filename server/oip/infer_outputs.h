// ModelInfer's second half (infer_call.h): the core's answers laid out as the protocol's output
// tensors, and the signature the model shows in metadata.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/calls.h"
#include "server/oip/infer_call.h"

namespace attn::server::oip {

bool IsOutputName(std::string_view name);
// "EMBEDDING, TOKEN_EMBEDDINGS, ...": every output, for messages.
std::string OutputNames();

// What the response holds: the outputs in order, and the layers TOKEN_EMBEDDINGS/ATTENTION
// asked for.
struct OutputPlan {
  std::vector<std::string> names;
  std::vector<int32_t> layers;
};

// Waits for ModelInfer's core calls (Encode, AttentionMap or both), then builds the response
// from their answers, or passes on the first failure.
class InferJoin {
 public:
  explicit InferJoin(int calls) : remaining_(calls) {}

  OutputPlan plan;
  std::string model, version;
  std::string tensor;  // the input tensor ("TEXT", "INPUT_IDS"), for messages
  InferLimits limits;
  MemoryBudget* memory_budget = nullptr;
  std::function<void(absl::StatusOr<InferResponse>)> done;

  void Fail(absl::Status status);
  void SetEncode(core::EncodeResponse response);
  void SetAttention(core::AttentionResponse response);

 private:
  void Arrived();

  absl::Mutex mutex_;
  int remaining_ ABSL_GUARDED_BY(mutex_);
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  std::optional<core::EncodeResponse> encode_ ABSL_GUARDED_BY(mutex_);
  std::optional<core::AttentionResponse> attention_ ABSL_GUARDED_BY(mutex_);
};

// The response from the core's answers (either may be absent when not needed). Checks the
// outputs' size against the response limit and takes the memory zero-padding adds (beyond what
// the core admitted) from `memory_budget`.
absl::StatusOr<InferResponse> BuildResponse(const OutputPlan& plan,
                                            const std::optional<core::EncodeResponse>& encode,
                                            const std::optional<core::AttentionResponse>& attention,
                                            const InferLimits& limits, MemoryBudget* memory_budget);

}  // namespace attn::server::oip
