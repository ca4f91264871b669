// Fuzz target: Encode, AttentionMap and Explain request conversion and validation
// (server/proto_convert.cc, server/core/request_plan.cc, server/core/explain.cc) followed by
// the engine work the server would do for an accepted request, on the checked-in tiny model
// (fuzz/tiny_model: 2 layers, 2 heads, 16 positions), so a request that validation lets through
// but the engine cannot handle shows up as a crash here instead of in the server.
//
// Input: byte 0 picks the message in its low 2 bits (0 and 3: EncodeRequest, 1:
// AttentionMapRequest, 2: ExplainRequest) and, in its upper 6 bits, where to split the bytes into
// two gRPC slices; the rest is that message serialized. fuzz/make_seeds.py writes the seeds from
// text format with protoc.
//
// For an accepted request it checks what server/core/results.cc's builders index without
// checking: the forward result holds every hidden state and attention layer the plan reads,
// heads are inside the model, and then it runs the same engine calls they make (pooling,
// normalisation, head selection, top-k, mean over heads, rollout, wire encoding). An accepted
// Explain runs whole (the attributions of every document) and its results are checked against
// the texts' token counts.
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "attnserve/v1/encoder.pb.h"
#include "engine/attention_analysis.h"
#include "engine/half.h"
#include "engine/model.h"
#include "engine/ops/pooling.h"
#include "fuzz/fuzz_check.h"
#include "server/core/explain.h"
#include "server/core/request_plan.h"
#include "server/proto_convert.h"
#include "server/request_parse.h"

namespace {

std::shared_ptr<const attn::Model> g_model;

// Few inputs per request keep every forward small (at most 4 x 16 tokens).
constexpr attn::server::core::RequestLimits kLimits{.max_inputs_per_request = 4,
                                                    .max_explain_documents = 2};

void Encode(const float* values, int64_t n, attn::WireDType dtype) {
  const std::string bytes = attn::EncodeFloats(values, n, dtype);
  FUZZ_CHECK(bytes.size() == static_cast<size_t>(n * attn::WireDTypeSize(dtype)),
             "EncodeFloats gave %zu bytes for %lld values", bytes.size(), (long long)n);
}

const attn::SequenceAttention& AttentionOf(const attn::ForwardResult& result, int layer,
                                           size_t sequence) {
  const attn::LayerAttention* attention = result.Attention(layer);
  FUZZ_CHECK(attention != nullptr && attention->sequences.size() > sequence,
             "layer %d attention missing for sequence %zu", layer, sequence);
  return attention->sequences[sequence];
}

// A request either fails validation with INVALID_ARGUMENT, or its plan runs in the engine
// without error. Returns the engine's result for a valid plan, nullopt otherwise.
template <typename Plan>
std::optional<attn::ForwardResult> ForwardIfValid(const absl::StatusOr<Plan>& plan) {
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               plan.status().ToString().c_str());
    return std::nullopt;
  }
  auto result = g_model->Forward(plan->inputs.sequences, plan->forward);
  FUZZ_CHECK(result.ok(), "validated request failed in the engine: %s",
             result.status().ToString().c_str());
  return std::move(*result);
}

void RunEncode(const attnserve::v1::EncodeRequest& request) {
  auto plan = attn::server::core::PrepareEncode(*g_model, attn::server::ToCore(request), kLimits);
  std::optional<attn::ForwardResult> result = ForwardIfValid(plan);
  if (!result) return;
  const int64_t H = g_model->config().hidden_size;
  const int last_layer = g_model->config().num_hidden_layers;
  const attn::Tensor* last = result->HiddenState(last_layer);
  FUZZ_CHECK(last != nullptr, "the last layer's hidden state is missing");
  for (size_t i = 0; i < plan->inputs.sequences.size(); ++i) {
    const int64_t begin = result->seq_offsets[i], T = result->seq_offsets[i + 1] - begin;
    FUZZ_CHECK(T == static_cast<int64_t>(plan->inputs.sequences[i].token_ids.size()),
               "sequence %zu has %lld rows", i, (long long)T);
    if (plan->pooling) {
      std::vector<float> pooled(H);
      attn::PoolForward(last->data() + begin * H, H, {0, T}, *plan->pooling, pooled.data());
      if (plan->normalize) attn::L2NormalizeRows(pooled.data(), 1, H);
    }
    for (int layer : plan->hidden_layers) {
      const attn::Tensor* hidden = result->HiddenState(layer);
      FUZZ_CHECK(hidden != nullptr, "hidden state of layer %d missing", layer);
      Encode(hidden->data() + begin * H, T * H, plan->dtype);
    }
    if (plan->static_embeddings) {
      FUZZ_CHECK(result->static_embeddings.numel() == result->total_tokens() * H,
                 "static embeddings missing");
      Encode(result->static_embeddings.data() + begin * H, T * H, plan->dtype);
    }
  }
}

void RunAttention(const attnserve::v1::AttentionMapRequest& request) {
  auto plan =
      attn::server::core::PrepareAttention(*g_model, attn::server::ToCore(request), kLimits);
  std::optional<attn::ForwardResult> result = ForwardIfValid(plan);
  if (!result) return;
  const int heads = g_model->config().num_attention_heads;
  for (int head : plan->heads) FUZZ_CHECK(head >= 0 && head < heads, "head %d", head);
  for (size_t i = 0; i < plan->inputs.sequences.size(); ++i) {
    for (int layer : plan->layers) {
      const attn::SequenceAttention& attention = AttentionOf(*result, layer, i);
      FUZZ_CHECK(attention.probs.rank() == 3 && attention.probs.dim(0) == heads,
                 "layer %d probs shape %s", layer, attention.probs.ShapeString().c_str());
      if (plan->weights && plan->top_k > 0) {
        attn::TopKRowsResult top = attn::TopKRows(attention.probs, plan->top_k);
        FUZZ_CHECK(top.indices.size() == static_cast<size_t>(top.values.numel()), "top-k sizes");
        Encode(top.values.data(), top.values.numel(), plan->dtype);
      }
      if (plan->scores) {
        FUZZ_CHECK(attention.scores.numel() == attention.probs.numel(), "scores missing");
      }
      if (plan->qkv) {
        FUZZ_CHECK(!attention.query.empty() && !attention.key.empty() && !attention.value.empty(),
                   "q/k/v missing");
      }
      if (plan->mean_over_heads) {
        const attn::Tensor mean = attn::MeanOverHeads(attention.probs);
        Encode(mean.data(), mean.numel(), plan->dtype);
      }
    }
    if (plan->rollout) {
      std::vector<attn::Tensor> means;
      for (int layer = 0; layer < g_model->config().num_hidden_layers; ++layer) {
        means.push_back(attn::MeanOverHeads(AttentionOf(*result, layer, i).probs));
      }
      const attn::Tensor rollout = attn::AttentionRollout(means);
      Encode(rollout.data(), rollout.numel(), plan->dtype);
    }
  }
}

void RunExplain(const attnserve::v1::ExplainRequest& request) {
  auto plan =
      attn::server::core::PrepareExplain(*g_model, attn::server::ToCore(request), kLimits, nullptr);
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               plan.status().ToString().c_str());
    return;
  }
  const size_t documents = plan->inputs.encodings.size() - 1;
  const absl::Status ran = attn::server::core::RunExplain(*g_model, &*plan, [] { return false; });
  FUZZ_CHECK(ran.ok(), "validated Explain failed in the engine: %s", ran.ToString().c_str());
  FUZZ_CHECK(plan->results.size() == documents, "%zu results for %zu documents",
             plan->results.size(), documents);
  const size_t Ta = plan->inputs.encodings[0].size();
  for (size_t d = 0; d < documents; ++d) {
    const attn::AttributionResult& r = plan->results[d].attribution;
    const size_t Tb = plan->inputs.encodings[d + 1].size();
    FUZZ_CHECK(r.a.gradient_x_input.size() == Ta && r.b.gradient_x_input.size() == Tb,
               "per-token attributions of %zu / %zu values for %zu / %zu tokens",
               r.a.gradient_x_input.size(), r.b.gradient_x_input.size(), Ta, Tb);
    FUZZ_CHECK(r.pair_matrix.empty() || r.pair_matrix.size() == Ta * Tb,
               "pair matrix of %zu cells for %zu x %zu tokens", r.pair_matrix.size(), Ta, Tb);
  }
}

// The server's own decoding: bytes as gRPC hands them over (here in two slices, split where
// byte 0 says, so reads across slice boundaries are exercised) -> ParseRequestBytes, which
// explains a refusal with DescribeUnparsableMessage's own wire-format walk.
bool Parse(const uint8_t* data, size_t size, size_t split, google::protobuf::Message* message) {
  split = std::min(split, size);
  grpc::Slice slices[2] = {grpc::Slice(data, split), grpc::Slice(data + split, size - split)};
  const grpc::ByteBuffer bytes(slices, 2);
  const absl::Status parsed = attn::server::ParseRequestBytes(bytes, message);
  FUZZ_CHECK(parsed.ok() || parsed.code() == absl::StatusCode::kInvalidArgument, "%s",
             parsed.ToString().c_str());
  if (parsed.ok()) {
    // What protobuf accepts, the diagnosis must not call broken.
    google::protobuf::io::ArrayInputStream stream(data, static_cast<int>(size));
    const absl::Status described =
        attn::server::DescribeUnparsableMessage(*message->GetDescriptor(), &stream, size);
    FUZZ_CHECK(described.ok(), "protobuf parsed the request but the diagnosis says: %s",
               described.ToString().c_str());
  }
  return parsed.ok();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  auto model = attn::Model::Load(ATTN_FUZZ_TINY_MODEL_DIR);
  if (!model.ok()) {
    std::fprintf(stderr, "request_fuzzer: %s\n", model.status().ToString().c_str());
    std::abort();
  }
  g_model = *std::move(model);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t split = data[0] >> 2;
  switch (data[0] & 3) {
    case 1: {
      attnserve::v1::AttentionMapRequest request;
      if (Parse(data + 1, size - 1, split, &request)) RunAttention(request);
      break;
    }
    case 2: {
      attnserve::v1::ExplainRequest request;
      if (Parse(data + 1, size - 1, split, &request)) RunExplain(request);
      break;
    }
    default: {
      attnserve::v1::EncodeRequest request;
      if (Parse(data + 1, size - 1, split, &request)) RunEncode(request);
    }
  }
  return 0;
}
