#include "server/encoder_service.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "server/request_prep.h"
#include "server/response_builder.h"
#include "server/status_map.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

namespace {

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
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

std::optional<std::chrono::system_clock::time_point> DeadlineOf(
    const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  // gRPC reports "no deadline" as the far future.
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return std::nullopt;
  }
  return deadline;
}

// One call's bookkeeping: finishes it (writing the response bytes first when it succeeded),
// records it in the metrics and gives back the memory it was admitted with.
class CallTracker {
 public:
  CallTracker(const char* method, Metrics* metrics, grpc::CallbackServerContext* context,
              std::function<grpc::Status()> serialize)
      : method_(method),
        metrics_(metrics),
        context_(context),
        reactor_(context->DefaultReactor()),
        serialize_(std::move(serialize)),
        deadline_(DeadlineOf(context)) {}

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  Clock::time_point received() const { return received_; }
  const std::optional<std::chrono::system_clock::time_point>& deadline() const { return deadline_; }

  // `bytes` of `budget` admitted for this call; given back when it finishes.
  void HoldMemory(MemoryBudget* budget, int64_t bytes) {
    budget_ = budget;
    held_bytes_ = bytes;
    metrics_->SetMemoryInFlight(budget->in_flight());
  }

  // Why nobody waits for the answer any more ("deadline" or "cancelled"), or nullptr.
  const char* DropReason() const {
    if (deadline_ && *deadline_ < std::chrono::system_clock::now()) return "deadline";
    // After the deadline check: gRPC also reports an expired call as cancelled.
    if (context_->IsCancelled()) return "cancelled";
    return nullptr;
  }

  // Finishes the call and records it. Call exactly once. `stage` says where the call was
  // ("queue": before its batch ran; "reply": its response built, not yet serialised): a call
  // whose client gave up is answered DEADLINE_EXCEEDED or CANCELLED whatever else happened
  // (an expired call is never counted OK, a cancelled one never as bad input) and counted in
  // attnserve_dropped_requests_total at that stage. The batcher counts its own drops.
  void Finish(grpc::Status status, const char* stage = "queue") {
    const bool dropped_already = status.error_code() == grpc::StatusCode::CANCELLED ||
                                 status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (const char* reason = dropped_already ? nullptr : DropReason()) {
      metrics_->RecordDropped(reason, stage);
      status = std::string_view(reason) == "deadline"
                   ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                  "the call's deadline passed before the server answered")
                   : grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
    }
    if (status.ok() && serialize_) status = serialize_();
    if (budget_ != nullptr) {
      budget_->Release(held_bytes_);
      metrics_->SetMemoryInFlight(budget_->in_flight());
      budget_ = nullptr;
    }
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
  grpc::CallbackServerContext* context_;
  grpc::ServerUnaryReactor* reactor_;
  std::function<grpc::Status()> serialize_;
  const std::optional<std::chrono::system_clock::time_point> deadline_;
  Clock::time_point received_ = Clock::now();
  MemoryBudget* budget_ = nullptr;
  int64_t held_bytes_ = 0;
};

grpc::Status CheckRequestSize(int64_t bytes, int64_t limit) {
  if (bytes <= limit) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the request is ", bytes, " bytes, more than the ", limit,
                                   "-byte limit (--max-message-bytes); split it into several "
                                   "calls or raise --max-message-bytes on the server"));
}

}  // namespace

EncoderService::EncoderService(const ServerOptions& options, ModelRegistry* registry,
                               Batcher* batcher, MemoryBudget* memory_budget, Metrics* metrics)
    : options_(options),
      registry_(registry),
      batcher_(batcher),
      memory_budget_(memory_budget),
      metrics_(metrics) {
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
      grpc::Status status = grpc::SerializationTraits<Response>::Serialize(
          messages->second, response_bytes, &own_buffer);
      Response().Swap(&messages->second);  // free the message while gRPC sends the bytes
      return status;
    };
    if (!request_bytes->Valid()) {
      // No message at all (a zero-byte request is still a valid buffer): the call ended before
      // its body arrived, i.e. the client cancelled it or its deadline passed. gRPC may not
      // report it cancelled yet, and parsing nothing would count it as bad input.
      CallTracker call(method, metrics_, context, nullptr);
      const bool expired =
          call.DropReason() != nullptr && std::string_view(call.DropReason()) == "deadline";
      metrics_->RecordDropped(expired ? "deadline" : "cancelled", "queue");
      call.Finish(expired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                         "the deadline passed before the request arrived")
                          : grpc::Status(grpc::StatusCode::CANCELLED,
                                         "the call ended before its request arrived"));
      return call.reactor();
    }
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
  if (call->DropReason() != nullptr) {
    call->Finish(grpc::Status::OK);  // answered DEADLINE_EXCEEDED or CANCELLED, counted dropped
    return reactor;
  }
  // Admission: what answering will cost, against the per-request limits and the budget.
  const RequestCost cost =
      EstimateCost(*version->model, **plan, static_cast<int64_t>(version->version.size()));
  std::string limit = "budget";
  absl::Status affordable =
      CheckRequestCost(cost, options_.max_message_bytes, options_.max_request_memory_bytes, &limit);
  if (affordable.ok()) affordable = memory_budget_->Acquire(cost.working_bytes);
  if (!affordable.ok()) {
    metrics_->RecordMemoryRefusal(limit);
    call->Finish(ToGrpcStatus(affordable));
    return reactor;
  }
  call->HoldMemory(memory_budget_, cost.working_bytes);

  auto job = std::make_shared<Job>();
  job->model = version->model;
  job->sequences = (*plan)->inputs.sequences;
  job->forward = (*plan)->forward;
  job->deadline = call->deadline();
  job->is_cancelled = [context] { return context->IsCancelled(); };
  const int64_t max_bytes = options_.max_message_bytes;
  // Runs on the batcher thread once the batch carrying this call is done.
  job->done = [call, plan, response, build, tokenization_ms, max_bytes, version = *version](
                  absl::Status status, JobOutput output) {
    if (!status.ok()) {
      call->Finish(ToGrpcStatus(status), "compute");
      return;
    }
    response->set_model_version(version.version);
    build(*version.model, **plan, output, response);
    FillMetadata((*plan)->inputs, tokenization_ms, output, call->received(),
                 response->mutable_metadata());
    call->Finish(CheckResponseSize(*response, max_bytes), "reply");
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
  call.Finish(CheckResponseSize(*response, options_.max_message_bytes), "reply");
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
  call.Finish(grpc::Status::OK, "reply");
  return call.reactor();
}

}  // namespace attn::server
