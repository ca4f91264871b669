#include "server/core/serving_core.h"

#include <chrono>
#include <memory>
#include <utility>

#include "engine/ops/pooling.h"
#include "server/core/results.h"

namespace attn::server::core {

namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void SetEngineTimes(const JobOutput& output, Metadata* metadata) {
  metadata->queue_ms = output.queue_seconds * 1e3;
  metadata->inference_ms = output.inference_seconds * 1e3;
  metadata->batch_inputs = output.batch_inputs;
}

// The shared path of Encode and AttentionMap: version, `prepare` (validate + tokenize), deadline,
// submit; `finish(version, plan, output)` builds the response on the batcher thread.
template <typename Request, typename Plan, typename Response, typename Prepare, typename Build>
void RunEngineCall(const Request& request, const CallControl& control, const RequestLimits& limits,
                   ModelRegistry* registry, Batcher* batcher, ServingMetrics* metrics,
                   Prepare prepare, Build build,
                   std::function<void(absl::StatusOr<Response>)> done) {
  absl::StatusOr<ModelVersion> version = registry->Get(std::string(request.model_version));
  if (!version.ok()) return done(version.status());
  const auto tokenize_start = Clock::now();
  auto plan = std::make_shared<absl::StatusOr<Plan>>(prepare(*version->model, request, limits));
  const double tokenization_ms = MillisSince(tokenize_start);
  metrics->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!plan->ok()) return done(plan->status());
  if (control.deadline && *control.deadline < std::chrono::system_clock::now()) {
    metrics->RecordDropped("deadline");
    return done(
        absl::DeadlineExceededError("the call's deadline had already passed when it arrived"));
  }

  auto job = std::make_shared<Job>();
  job->model = version->model;
  job->sequences = (*plan)->inputs.sequences;
  job->forward = (*plan)->forward;
  job->deadline = control.deadline;
  job->is_cancelled = control.is_cancelled;
  const Clock::time_point received = control.received;
  // `done` is shared: it is called here if Submit refuses the job, else by the job's callback.
  auto shared_done =
      std::make_shared<std::function<void(absl::StatusOr<Response>)>>(std::move(done));
  job->done = [shared_done, plan, build, tokenization_ms, received, version = *version](
                  absl::Status status, JobOutput output) {
    if (!status.ok()) return (*shared_done)(status);
    Response response;
    response.model_version = version.version;
    response.model = version.model;
    response.metadata.token_count = (*plan)->inputs.total_tokens;
    response.metadata.tokenization_ms = tokenization_ms;
    SetEngineTimes(output, &response.metadata);
    build(*version.model, **plan, output, &response);
    response.metadata.total_ms = MillisSince(received);
    (*shared_done)(std::move(response));
  };
  if (absl::Status submitted = batcher->Submit(job); !submitted.ok()) (*shared_done)(submitted);
}

}  // namespace

ServingCore::ServingCore(RequestLimits limits, ModelRegistry* registry, Batcher* batcher,
                         ServingMetrics* metrics)
    : limits_(limits), registry_(registry), batcher_(batcher), metrics_(metrics) {}

void ServingCore::Encode(const EncodeRequest& request, const CallControl& control,
                         Done<EncodeResponse> done) {
  RunEngineCall<EncodeRequest, EncodePlan, EncodeResponse>(
      request, control, limits_, registry_, batcher_, metrics_, PrepareEncode,
      [](const Model& model, EncodePlan& plan, JobOutput& output, EncodeResponse* response) {
        response->dtype = plan.dtype;
        BuildEncodeResults(model, plan, output, &response->results);
        // The views in the results point into the batch results.
        response->batch = std::make_shared<const JobOutput>(std::move(output));
      },
      std::move(done));
}

void ServingCore::AttentionMap(const AttentionRequest& request, const CallControl& control,
                               Done<AttentionResponse> done) {
  RunEngineCall<AttentionRequest, AttentionPlan, AttentionResponse>(
      request, control, limits_, registry_, batcher_, metrics_, PrepareAttention,
      [](const Model& model, AttentionPlan& plan, JobOutput& output, AttentionResponse* response) {
        response->dtype = plan.dtype;
        response->heads = plan.heads;
        BuildAttentionResults(model, plan, output, &response->results);
      },
      std::move(done));
}

absl::StatusOr<TokenizeResponse> ServingCore::Tokenize(const TokenizeRequest& request,
                                                       const CallControl& control) {
  absl::StatusOr<ModelVersion> version = registry_->Get(std::string(request.model_version));
  if (!version.ok()) return version.status();
  const auto start = Clock::now();
  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(*version->model, request.inputs, request.tokenization, limits_);
  const double tokenization_ms = MillisSince(start);
  metrics_->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!inputs.ok()) return inputs.status();
  TokenizeResponse response;
  response.model_version = version->version;
  response.model = version->model;
  response.results = std::move(inputs->encodings);
  response.metadata.token_count = inputs->total_tokens;
  response.metadata.tokenization_ms = tokenization_ms;
  response.metadata.total_ms = MillisSince(control.received);
  return response;
}

absl::StatusOr<ModelInfo> ServingCore::GetModelInfo(const ModelInfoRequest& request) {
  absl::StatusOr<ModelVersion> version = registry_->Get(std::string(request.model_version));
  if (!version.ok()) return version.status();
  const Model& model = *version->model;
  const BertConfig& config = model.config();
  ModelInfo info;
  info.architecture = "BertModel";
  info.model_type = config.model_type;
  info.hidden_size = config.hidden_size;
  info.num_layers = config.num_hidden_layers;
  info.num_heads = config.num_attention_heads;
  info.head_dim = config.head_dim();
  info.intermediate_size = config.intermediate_size;
  info.vocab_size = config.vocab_size;
  info.type_vocab_size = config.type_vocab_size;
  info.max_position_embeddings = config.max_position_embeddings;
  info.default_max_length = model.default_max_length();
  info.default_pooling = std::string(PoolingModeName(model.sentence_config().pooling));
  info.default_normalize = model.sentence_config().normalize;
  info.parameter_count = model.weights().ParameterCount();
  info.precision = PrecisionName(model.precision());
  info.version = version->version;
  info.version_origin = version->origin;
  info.available_versions = registry_->Versions();
  return info;
}

}  // namespace attn::server::core
