// The Open Inference Protocol's model, free of its two transports: what each served model looks
// like as an OIP model (its input and output tensors), an inference request as both front ends
// read it (oip_service.h for gRPC, oip_rest.h for REST), and ModelInfer itself: validate the
// tensors and parameters, call the serving core (Encode, and AttentionMap for ATTENTION) and
// lay the answer out as tensors of raw little-endian bytes.
//
// A model (each served model, each of its versions an OIP version):
//   inputs   TEXT            BYTES [-1]           one UTF-8 text per element ([-1, 1] too), or
//            INPUT_IDS       INT64 [-1, -1]       token ids, one row per input, with optional
//            ATTENTION_MASK  INT64 [-1, -1]       1 = token, 0 = padding (a row's ones first)
//            TOKEN_TYPE_IDS  INT64 [-1, -1]       segment ids (default 0)
//   outputs  EMBEDDING         FP32  [-1, H]               pooled (and normalised) per input
//            TOKEN_EMBEDDINGS  FP32  [-1, -1, -1, H]       (input, layer, token, H), zero-padded
//            TOKEN_COUNT       INT64 [-1]                  tokens per input ([CLS]/[SEP] included)
//            ATTENTION         FP32  [-1, -1, heads, -1, -1]  (input, layer, head, query, key)
//            SPARSE_INDICES    INT64 [-1], SPARSE_VALUES FP32 [-1], SPARSE_OFFSETS INT64 [-1]:
//                              BM42 sparse vectors, input i's entries at OFFSETS[i]..[i+1]
//            TRUNCATED         BOOL  [-1]                  whether each input was truncated
// Without `outputs` a request gets EMBEDDING only; the others cost memory and time and are
// computed only when named. Request parameters: pooling ("cls", "mean", "max", "none",
// "cls_attention"), normalize (bool), layers (int or "0,-1": hidden states for
// TOKEN_EMBEDDINGS, 0 = the embedding output; attention layers for ATTENTION; negatives count
// from the end; default -1), dimensions (int, Matryoshka), truncation ("none", the default,
// refuses an input longer than the model takes; "right", "left"), max_length (int), timeout
// (microseconds, Triton's). Anything else is refused, naming what is known.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/calls.h"
#include "server/core/cost_model.h"
#include "server/core/serving_core.h"

namespace attn::server::oip {

// Debian's Abseil has its own string_view type: absl::StrCat takes a std::string_view through
// this.
inline absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

// The protocol's name for this server's models ("platform" in metadata, "backend" in config).
inline constexpr char kPlatform[] = "attnserve";

// One tensor of a model's signature. A -1 in `shape` is any size.
struct TensorSpec {
  std::string name;
  std::string datatype;  // "BYTES", "INT64", "FP32", "BOOL"
  std::vector<int64_t> shape;
  bool optional = false;  // inputs: may be left out; outputs: computed only when asked
};
struct ModelSignature {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};
ModelSignature SignatureOf(const core::ModelInfo& info);

// A parameter's value, as the protocol types it.
using ParameterValue = std::variant<bool, int64_t, uint64_t, double, std::string>;
struct Parameter {
  std::string_view name;
  ParameterValue value;
};

// One input tensor, viewing the transport's storage. Its elements come either as raw bytes
// (little-endian; BYTES elements each a 4-byte length and the bytes) or as typed lists.
struct InputTensor {
  std::string_view name;
  std::string_view datatype;
  std::vector<int64_t> shape;
  std::optional<std::string_view> raw;
  std::vector<std::string_view> bytes_contents;
  std::vector<int64_t> int64_contents;
  bool has_typed_contents = false;  // any typed list was given (even of another datatype)
  std::string_view typed_field;     // which list, for the message ("fp32_contents")
  std::vector<Parameter> parameters;
};

struct RequestedOutput {
  std::string_view name;
  std::vector<Parameter> parameters;
};

struct InferRequest {
  std::string_view model;
  std::string_view version;  // empty: the served version
  std::string_view id;
  std::vector<Parameter> parameters;
  std::vector<InputTensor> inputs;
  std::vector<RequestedOutput> outputs;
  // Input and output parameter names the transport itself reads (REST: binary_data_size,
  // binary_data); they pass the check for unknown names.
  std::vector<std::string_view> transport_input_parameters;
  std::vector<std::string_view> transport_output_parameters;
  std::vector<std::string_view> transport_request_parameters;
};

struct OutputTensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string raw;  // little-endian elements, row-major
};

struct InferResponse {
  std::string model;
  std::string version;
  std::vector<OutputTensor> outputs;  // in the order asked for (EMBEDDING alone by default)
  // The memory the call was admitted with; hold until the response is written.
  std::vector<std::shared_ptr<void>> held;
};

// The limits ModelInfer answers within (the server's options).
struct InferLimits {
  int64_t max_message_bytes = 0;
  int64_t max_request_memory_bytes = 0;
};

// ModelInfer over the core. `done` is called once, on the calling thread or the batcher's.
// `request` is read only until Infer returns.
class Inferrer {
 public:
  Inferrer(core::ServingCore* core, MemoryBudget* memory_budget, InferLimits limits)
      : core_(core), memory_budget_(memory_budget), limits_(limits) {}

  void Infer(const InferRequest& request, core::CallControl control,
             std::function<void(absl::StatusOr<InferResponse>)> done) const;

 private:
  core::ServingCore* const core_;
  MemoryBudget* const memory_budget_;
  const InferLimits limits_;
};

// BYTES elements from raw contents: `count` elements of a 4-byte little-endian length and the
// bytes, filling `raw` exactly. INVALID_ARGUMENT naming `tensor` and what does not add up.
absl::StatusOr<std::vector<std::string_view>> SplitBytesElements(std::string_view raw,
                                                                 int64_t count,
                                                                 std::string_view tensor);

}  // namespace attn::server::oip
