// Request validation and tokenization: turns an API request into what the engine must compute,
// or an INVALID_ARGUMENT status whose message names the field, the input index and the limit.
// Pure functions of (model, request, limits); no gRPC calls, so they are easy to test and fuzz.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/encoder.pb.h"
#include "engine/half.h"
#include "engine/model.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "server/cost_model.h"

namespace attn::server {

struct RequestLimits {
  int max_inputs_per_request = 256;
};

// Inputs tokenized and ready for the engine.
struct TokenizedInputs {
  std::vector<SequenceInput> sequences;
  std::vector<Encoding> encodings;
  int64_t total_tokens = 0;
};

// TokenizationOptions -> the tokenizer's truncation settings for `model` (0 = the model's default
// length); INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<TruncationOptions> ResolveTruncation(
    const Model& model, const attnserve::v1::TokenizationOptions& options);

absl::StatusOr<TokenizedInputs> TokenizeInputs(
    const Model& model, const google::protobuf::RepeatedPtrField<attnserve::v1::Input>& inputs,
    const attnserve::v1::TokenizationOptions& tokenization, const RequestLimits& limits);

struct EncodePlan {
  TokenizedInputs inputs;
  std::optional<PoolingMode> pooling;  // nullopt = POOLING_NONE
  bool normalize = false;
  bool token_embeddings = false;
  std::vector<int> hidden_layers;  // resolved (0..L), request order
  bool static_embeddings = false;
  WireDType dtype = WireDType::kFloat32;
  ForwardOptions forward;  // what the engine must keep (pooling is done per request)
};

absl::StatusOr<EncodePlan> PrepareEncode(const Model& model,
                                         const attnserve::v1::EncodeRequest& request,
                                         const RequestLimits& limits);

struct AttentionPlan {
  TokenizedInputs inputs;
  std::vector<int> layers;  // resolved 0-based layers, request order
  std::vector<int> heads;   // selected heads, request order
  bool weights = true;
  bool scores = false;
  bool qkv = false;
  bool mean_over_heads = false;
  bool rollout = false;
  int top_k = 0;
  WireDType dtype = WireDType::kFloat32;
  ForwardOptions forward;
};

// Why `size` bytes from `input` are not a valid `type` message, as INVALID_ARGUMENT naming the
// field path and the problem ("inputs[1].text is not valid UTF-8 ..." or "malformed protobuf at
// byte 12: ..."); OK if no problem is found. Called after protobuf refused a request (it says
// only that it failed), so the client learns what to fix instead of getting a bare error.
absl::Status DescribeUnparsableMessage(const google::protobuf::Descriptor& type,
                                       google::protobuf::io::ZeroCopyInputStream* input,
                                       int64_t size);

// Parses a request's bytes into `message`; INVALID_ARGUMENT naming the problem if they do not
// parse (services take raw bytes so that a request gRPC cannot decode gets this, not gRPC's bare
// UNIMPLEMENTED).
absl::Status ParseRequestBytes(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);

absl::StatusOr<AttentionPlan> PrepareAttention(const Model& model,
                                               const attnserve::v1::AttentionMapRequest& request,
                                               const RequestLimits& limits);

// What answering the plan will cost (server/cost_model.h); `version_bytes`: the length of the
// model version name the response carries.
RequestCost EstimateCost(const Model& model, const EncodePlan& plan, int64_t version_bytes);
RequestCost EstimateCost(const Model& model, const AttentionPlan& plan, int64_t version_bytes);

}  // namespace attn::server
