#include "server/encoder_service.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/attention_analysis.h"
#include "engine/log.h"
#include "engine/ops/pooling.h"
#include "server/request_prep.h"
#include "server/status_map.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

namespace {

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

v1::DType ToProtoDType(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFloat16:
      return v1::FLOAT16;
    case WireDType::kBFloat16:
      return v1::BFLOAT16;
    default:
      return v1::FLOAT32;
  }
}

void SetTensor(const std::vector<int64_t>& shape, const float* data, WireDType dtype,
               v1::Tensor* out) {
  int64_t count = 1;
  for (int64_t d : shape) {
    out->add_shape(d);
    count *= d;
  }
  out->set_dtype(ToProtoDType(dtype));
  out->set_data(EncodeFloats(data, count, dtype));
}

void SetTensor(const Tensor& tensor, WireDType dtype, v1::Tensor* out) {
  SetTensor(tensor.shape(), tensor.data(), dtype, out);
}

void FillTokens(const Model& model, const Encoding& encoding,
                google::protobuf::RepeatedPtrField<v1::Token>* tokens) {
  tokens->Reserve(encoding.size());
  for (int t = 0; t < encoding.size(); ++t) {
    v1::Token* token = tokens->Add();
    token->set_id(encoding.ids[t]);
    token->set_text(model.tokenizer().IdToToken(encoding.ids[t]));
    token->set_char_start(encoding.char_start[t]);
    token->set_char_end(encoding.char_end[t]);
    token->set_byte_start(encoding.byte_start[t]);
    token->set_byte_end(encoding.byte_end[t]);
    token->set_type_id(encoding.type_ids[t]);
    token->set_special(encoding.special_tokens_mask[t] != 0);
    token->set_source(encoding.sequence_index[t]);
  }
}

// Tokens and truncation info of one input, for any result message that has them.
template <typename Result>
void FillInputResult(const Model& model, const Encoding& encoding, Result* result) {
  FillTokens(model, encoding, result->mutable_tokens());
  result->set_truncated(encoding.truncated);
  result->set_untruncated_length(encoding.untruncated_length);
}

void FillMetadata(const TokenizedInputs& inputs, double tokenization_ms, const JobOutput& output,
                  Clock::time_point received, v1::ResponseMetadata* metadata) {
  metadata->set_token_count(inputs.total_tokens);
  metadata->set_tokenization_ms(tokenization_ms);
  metadata->set_queue_ms(output.queue_seconds * 1e3);
  metadata->set_inference_ms(output.inference_seconds * 1e3);
  metadata->set_batch_inputs(output.batch_inputs);
  metadata->set_total_ms(MillisSince(received));
}

// Responses over the size limit would fail in gRPC with a bare RESOURCE_EXHAUSTED; say what to
// change instead.
grpc::Status CheckResponseSize(const google::protobuf::Message& response, int64_t limit) {
  const size_t bytes = response.ByteSizeLong();
  if (static_cast<int64_t>(bytes) <= limit) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the response would be ", bytes, " bytes, more than the ", limit,
                                   "-byte limit (--max-message-bytes); ask for fewer inputs, "
                                   "layers or heads, use top_k or float16, or raise "
                                   "--max-message-bytes on the server and the client's maximum "
                                   "receive size"));
}

// One call's bookkeeping: finishes it (writing the response bytes first when it succeeded) and
// records it in the metrics.
class CallTracker {
 public:
  CallTracker(const char* method, Metrics* metrics, grpc::CallbackServerContext* context,
              std::function<grpc::Status()> serialize)
      : method_(method),
        metrics_(metrics),
        reactor_(context->DefaultReactor()),
        serialize_(std::move(serialize)) {}

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  Clock::time_point received() const { return received_; }

  // Finishes the call and records it. Call exactly once.
  void Finish(grpc::Status status) {
    if (status.ok() && serialize_) status = serialize_();
    metrics_->RecordRequest(method_, status.error_code(),
                            std::chrono::duration<double>(Clock::now() - received_).count());
    if (!status.ok() && status.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
        status.error_code() != grpc::StatusCode::NOT_FOUND) {
      Log(LogLevel::kDebug, "%s failed: %s %s", method_,
          std::string(GrpcCodeName(status.error_code())), status.error_message());
    }
    reactor_->Finish(status);
  }

 private:
  const char* method_;
  Metrics* metrics_;
  grpc::ServerUnaryReactor* reactor_;
  std::function<grpc::Status()> serialize_;
  Clock::time_point received_ = Clock::now();
};

grpc::Status CheckRequestSize(int64_t bytes, int64_t limit) {
  if (bytes <= limit) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the request is ", bytes, " bytes, more than the ", limit,
                                   "-byte limit (--max-message-bytes); split it into several "
                                   "calls or raise --max-message-bytes on the server"));
}

std::optional<std::chrono::system_clock::time_point> DeadlineOf(
    const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  // gRPC reports "no deadline" as the far future.
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return std::nullopt;
  }
  return deadline;
}

// Selected heads of a (heads, T, X) tensor -> (selected, T, X).
Tensor SelectHeads(const Tensor& full, const std::vector<int>& heads) {
  const int64_t per_head = full.numel() / full.dim(0);
  Tensor out({static_cast<int64_t>(heads.size()), full.dim(1), full.dim(2)});
  for (size_t i = 0; i < heads.size(); ++i) {
    std::memcpy(out.data() + i * per_head, full.data() + heads[i] * per_head,
                sizeof(float) * per_head);
  }
  return out;
}

// Fills the Encode results from the batch output (one per input, in order).
void BuildEncodeResults(const Model& model, const EncodePlan& p, const JobOutput& output,
                        v1::EncodeResponse* response) {
  const int64_t H = model.config().hidden_size;
  const int last_layer = model.config().num_hidden_layers;
  for (size_t i = 0; i < output.sequences.size(); ++i) {
    const SequenceView& view = output.sequences[i];
    const int64_t T = view.length();
    v1::EncodeResult* result = response->add_results();
    FillInputResult(model, p.inputs.encodings[i], result);
    const float* last_hidden = view.hidden(last_layer, H);
    if (p.pooling) {
      std::vector<float> pooled(H);
      PoolForward(last_hidden, H, {0, T}, *p.pooling, pooled.data());
      if (p.normalize) L2NormalizeRows(pooled.data(), 1, H);
      result->mutable_embedding()->Add(pooled.begin(), pooled.end());
    }
    if (p.token_embeddings) {
      SetTensor({T, H}, last_hidden, p.dtype, result->mutable_token_embeddings());
    }
    for (int layer : p.hidden_layers) {
      v1::LayerTensor* layer_tensor = result->add_hidden_states();
      layer_tensor->set_layer(layer);
      SetTensor({T, H}, view.hidden(layer, H), p.dtype, layer_tensor->mutable_tensor());
    }
    if (p.static_embeddings) {
      SetTensor({T, H}, view.result->static_embeddings.data() + view.row_begin() * H, p.dtype,
                result->mutable_static_embeddings());
    }
  }
}

// Fills the AttentionMap results from the batch output (one per input, in order).
void BuildAttentionResults(const Model& model, const AttentionPlan& p, const JobOutput& output,
                           v1::AttentionMapResponse* response) {
  const int num_layers = model.config().num_hidden_layers;
  for (size_t i = 0; i < output.sequences.size(); ++i) {
    const SequenceView& view = output.sequences[i];
    v1::AttentionResult* result = response->add_results();
    FillInputResult(model, p.inputs.encodings[i], result);
    for (int layer : p.layers) {
      const SequenceAttention& attention = view.attention(layer);
      v1::LayerAttention* out = result->add_layers();
      out->set_layer(layer);
      out->mutable_heads()->Add(p.heads.begin(), p.heads.end());
      if (p.weights) {
        const Tensor weights = SelectHeads(attention.probs, p.heads);
        if (p.top_k > 0) {
          TopKRowsResult top = TopKRows(weights, p.top_k);
          v1::SparseRows* sparse = out->mutable_weights_top_k();
          sparse->set_k(static_cast<int32_t>(top.values.dim(-1)));
          SetTensor(top.values, p.dtype, sparse->mutable_values());
          sparse->mutable_indices()->Add(top.indices.begin(), top.indices.end());
        } else {
          SetTensor(weights, p.dtype, out->mutable_weights());
        }
      }
      if (p.scores) {
        SetTensor(SelectHeads(attention.scores, p.heads), p.dtype, out->mutable_scores());
      }
      if (p.qkv) {
        SetTensor(SelectHeads(attention.query, p.heads), p.dtype, out->mutable_query());
        SetTensor(SelectHeads(attention.key, p.heads), p.dtype, out->mutable_key());
        SetTensor(SelectHeads(attention.value, p.heads), p.dtype, out->mutable_value());
      }
      if (p.mean_over_heads) {
        SetTensor(MeanOverHeads(attention.probs), p.dtype, out->mutable_mean_weights());
      }
    }
    if (p.rollout) {
      std::vector<Tensor> means;
      for (int layer = 0; layer < num_layers; ++layer) {
        means.push_back(MeanOverHeads(view.attention(layer).probs));
      }
      SetTensor(AttentionRollout(means), p.dtype, result->mutable_rollout());
    }
  }
}

}  // namespace

EncoderService::EncoderService(const ServerOptions& options, ModelRegistry* registry,
                               Batcher* batcher, Metrics* metrics)
    : options_(options), registry_(registry), batcher_(batcher), metrics_(metrics) {
  ServeParsed<v1::EncodeRequest, v1::EncodeResponse>("Encode", &EncoderService::HandleEncode);
  ServeParsed<v1::AttentionMapRequest, v1::AttentionMapResponse>(
      "AttentionMap", &EncoderService::HandleAttentionMap);
  ServeParsed<v1::TokenizeRequest, v1::TokenizeResponse>("Tokenize",
                                                         &EncoderService::HandleTokenize);
  ServeParsed<v1::GetModelInfoRequest, v1::ModelInfo>("GetModelInfo",
                                                      &EncoderService::HandleGetModelInfo);
}

template <typename Request, typename Response>
void EncoderService::ServeParsed(const char* method, Handler<Request, Response> handler) {
  // The generated service registers its methods in the .proto's order.
  const google::protobuf::MethodDescriptor* descriptor =
      v1::EncodeRequest::descriptor()->file()->FindServiceByName("Encoder")->FindMethodByName(
          method);
  auto serve = [this, method, handler](grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request_bytes,
                                       grpc::ByteBuffer* response_bytes) {
    // The typed messages live as long as the call's tracker: the batcher thread fills the
    // response, and it is serialized into `response_bytes` when the call finishes.
    auto messages = std::make_shared<std::pair<Request, Response>>();
    auto serialize = [messages, response_bytes] {
      bool own_buffer = false;
      return grpc::SerializationTraits<Response>::Serialize(messages->second, response_bytes,
                                                            &own_buffer);
    };
    grpc::Status rejected =
        CheckRequestSize(static_cast<int64_t>(request_bytes->Length()), options_.max_message_bytes);
    if (rejected.ok()) rejected = ToGrpcStatus(ParseRequestBytes(*request_bytes, &messages->first));
    if (!rejected.ok()) {
      if (rejected.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        Log(LogLevel::kDebug, "%s: %s", method, rejected.error_message());
      }
      CallTracker call(method, metrics_, context, nullptr);
      call.Finish(rejected);
      return call.reactor();
    }
    return (this->*handler)(context, &messages->first, &messages->second, serialize);
  };
  MarkMethodRawCallback(
      descriptor->index(),
      new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(serve));
}

template <typename Request, typename Response, typename Plan>
grpc::ServerUnaryReactor* EncoderService::RunEngineCall(const char* method,
                                                        grpc::CallbackServerContext* context,
                                                        const Request* request, Response* response,
                                                        SerializeFn serialize,
                                                        PrepareFn<Request, Plan> prepare,
                                                        BuildFn<Plan, Response> build) {
  auto call = std::make_shared<CallTracker>(method, metrics_, context, std::move(serialize));
  grpc::ServerUnaryReactor* reactor = call->reactor();
  absl::StatusOr<ModelVersion> version = registry_->Get(request->model_version());
  if (!version.ok()) {
    call->Finish(ToGrpcStatus(version.status()));
    return reactor;
  }
  const auto tokenize_start = Clock::now();
  auto plan = std::make_shared<absl::StatusOr<Plan>>(
      prepare(*version->model, *request, {options_.max_inputs_per_request}));
  const double tokenization_ms = MillisSince(tokenize_start);
  metrics_->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!plan->ok()) {
    call->Finish(ToGrpcStatus(plan->status()));
    return reactor;
  }
  const auto deadline = DeadlineOf(context);
  if (deadline && *deadline < std::chrono::system_clock::now()) {
    metrics_->RecordDropped("deadline");
    call->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "the call's deadline had already passed when it arrived"));
    return reactor;
  }

  auto job = std::make_shared<Job>();
  job->model = version->model;
  job->sequences = (*plan)->inputs.sequences;
  job->forward = (*plan)->forward;
  job->deadline = deadline;
  job->is_cancelled = [context] { return context->IsCancelled(); };
  const int64_t max_bytes = options_.max_message_bytes;
  // Runs on the batcher thread once the batch carrying this call is done.
  job->done = [call, plan, response, build, tokenization_ms, max_bytes, version = *version](
                  absl::Status status, JobOutput output) {
    if (!status.ok()) {
      call->Finish(ToGrpcStatus(status));
      return;
    }
    response->set_model_version(version.version);
    build(*version.model, **plan, output, response);
    FillMetadata((*plan)->inputs, tokenization_ms, output, call->received(),
                 response->mutable_metadata());
    call->Finish(CheckResponseSize(*response, max_bytes));
  };
  if (absl::Status submitted = batcher_->Submit(job); !submitted.ok()) {
    call->Finish(ToGrpcStatus(submitted));
  }
  return reactor;
}

grpc::ServerUnaryReactor* EncoderService::HandleEncode(grpc::CallbackServerContext* context,
                                                       const v1::EncodeRequest* request,
                                                       v1::EncodeResponse* response,
                                                       SerializeFn serialize) {
  return RunEngineCall<v1::EncodeRequest, v1::EncodeResponse, EncodePlan>(
      "Encode", context, request, response, std::move(serialize), PrepareEncode,
      BuildEncodeResults);
}

grpc::ServerUnaryReactor* EncoderService::HandleAttentionMap(grpc::CallbackServerContext* context,
                                                             const v1::AttentionMapRequest* request,
                                                             v1::AttentionMapResponse* response,
                                                             SerializeFn serialize) {
  return RunEngineCall<v1::AttentionMapRequest, v1::AttentionMapResponse, AttentionPlan>(
      "AttentionMap", context, request, response, std::move(serialize), PrepareAttention,
      BuildAttentionResults);
}

grpc::ServerUnaryReactor* EncoderService::HandleTokenize(grpc::CallbackServerContext* context,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response,
                                                         SerializeFn serialize) {
  CallTracker call("Tokenize", metrics_, context, std::move(serialize));
  absl::StatusOr<ModelVersion> version = registry_->Get(request->model_version());
  if (!version.ok()) {
    call.Finish(ToGrpcStatus(version.status()));
    return call.reactor();
  }
  const auto start = Clock::now();
  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(*version->model, request->inputs(), request->tokenization(),
                     {options_.max_inputs_per_request});
  const double tokenization_ms = MillisSince(start);
  metrics_->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!inputs.ok()) {
    call.Finish(ToGrpcStatus(inputs.status()));
    return call.reactor();
  }
  response->set_model_version(version->version);
  for (const Encoding& encoding : inputs->encodings) {
    FillInputResult(*version->model, encoding, response->add_results());
  }
  v1::ResponseMetadata* metadata = response->mutable_metadata();
  metadata->set_token_count(inputs->total_tokens);
  metadata->set_tokenization_ms(tokenization_ms);
  metadata->set_total_ms(MillisSince(call.received()));
  call.Finish(CheckResponseSize(*response, options_.max_message_bytes));
  return call.reactor();
}

grpc::ServerUnaryReactor* EncoderService::HandleGetModelInfo(grpc::CallbackServerContext* context,
                                                             const v1::GetModelInfoRequest* request,
                                                             v1::ModelInfo* response,
                                                             SerializeFn serialize) {
  CallTracker call("GetModelInfo", metrics_, context, std::move(serialize));
  absl::StatusOr<ModelVersion> version = registry_->Get(request->model_version());
  if (!version.ok()) {
    call.Finish(ToGrpcStatus(version.status()));
    return call.reactor();
  }
  const Model& model = *version->model;
  const BertConfig& config = model.config();
  response->set_architecture("BertModel");
  response->set_model_type(config.model_type);
  response->set_hidden_size(config.hidden_size);
  response->set_num_layers(config.num_hidden_layers);
  response->set_num_heads(config.num_attention_heads);
  response->set_head_dim(config.head_dim());
  response->set_intermediate_size(config.intermediate_size);
  response->set_vocab_size(config.vocab_size);
  response->set_type_vocab_size(config.type_vocab_size);
  response->set_max_position_embeddings(config.max_position_embeddings);
  response->set_default_max_length(model.default_max_length());
  response->set_default_pooling(std::string(PoolingModeName(model.sentence_config().pooling)));
  response->set_default_normalize(model.sentence_config().normalize);
  response->set_parameter_count(model.weights().ParameterCount());
  response->set_precision(PrecisionName(model.precision()));
  response->set_version(version->version);
  response->set_version_origin(version->origin);
  for (const std::string& name : registry_->Versions()) response->add_available_versions(name);
  call.Finish(grpc::Status::OK);
  return call.reactor();
}

}  // namespace attn::server
