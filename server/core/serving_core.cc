#include "server/core/serving_core.h"

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/ops/pooling.h"
#include "server/core/explain.h"
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

// What the batcher runs for a plan: a packed forward of its sequences, or (Explain) a task.
template <typename Plan>
void FillJob(const std::shared_ptr<const Model>&, absl::StatusOr<Plan>* plan, Job* job) {
  job->sequences = (*plan)->inputs.sequences;
  job->forward = (*plan)->forward;
}

void FillJob(const std::shared_ptr<const Model>& model, absl::StatusOr<ExplainPlan>* plan,
             Job* job) {
  job->task_tokens = (*plan)->cost_tokens;
  // The plan lives as long as the job (the job's callback holds it).
  job->task = [model, plan](const std::function<bool()>& yield) {
    return RunExplain(*model, &**plan, yield);
  };
}

}  // namespace

const char* CallControl::DropReason() const {
  if (deadline && *deadline < std::chrono::system_clock::now()) return "deadline";
  // After the deadline check: gRPC also reports an expired call as cancelled.
  if (is_cancelled && is_cancelled()) return "cancelled";
  return nullptr;
}

Admission::Admission(MemoryBudget* budget, int64_t bytes, ServingMetrics* metrics)
    : budget_(budget), bytes_(bytes), metrics_(metrics) {
  metrics_->SetMemoryInFlight(budget_->in_flight());
}

void Admission::Release() {
  if (budget_ == nullptr) return;
  budget_->Release(bytes_);
  metrics_->SetMemoryInFlight(budget_->in_flight());
  budget_ = nullptr;
}

absl::Status UnlessDropped(const CallControl& control, absl::Status status, const char* stage,
                           ServingMetrics* metrics) {
  return UnlessDropped(control, std::move(status), stage,
                       [metrics](std::string_view reason, std::string_view where) {
                         metrics->RecordDropped(reason, where);
                       });
}

absl::Status UnlessDropped(
    const CallControl& control, absl::Status status, const char* stage,
    const std::function<void(std::string_view, std::string_view)>& record_dropped) {
  if (status.code() == absl::StatusCode::kCancelled ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    return status;  // dropped already (and counted where)
  }
  const char* reason = control.DropReason();
  if (reason == nullptr) return status;
  record_dropped(reason, stage);
  return std::string_view(reason) == "deadline"
             ? absl::DeadlineExceededError("the call's deadline passed before the server answered")
             : absl::CancelledError("the client cancelled the call");
}

namespace {
// The per-request limits the planning functions see, the memory limit among them.
CoreOptions WithRequestLimits(CoreOptions options) {
  options.limits.max_request_memory_bytes = options.max_request_memory_bytes;
  return options;
}

ModelSet OneModel(ModelRegistry* registry, Batcher* batcher, ServingMetrics* metrics,
                  const std::string& store) {
  ModelSet models;
  models.Add({"default", "", store, registry, batcher, metrics}).IgnoreError();  // the only name
  return models;
}
}  // namespace

ServingCore::ServingCore(CoreOptions options, ModelRegistry* registry, Batcher* batcher,
                         MemoryBudget* memory_budget, ServingMetrics* metrics)
    : options_(WithRequestLimits(options)),
      own_models_(OneModel(registry, batcher, metrics, options.model_store)),
      models_(&own_models_),
      registry_(registry),
      batcher_(batcher),
      memory_budget_(memory_budget),
      metrics_(metrics) {}

ServingCore::ServingCore(CoreOptions options, const ModelSet* models, MemoryBudget* memory_budget,
                         ServingMetrics* metrics)
    : options_(WithRequestLimits(options)),
      models_(models),
      registry_(models->models().front().registry),
      batcher_(models->models().front().batcher),
      memory_budget_(memory_budget),
      metrics_(metrics) {}

absl::StatusOr<ServingCore::Resolved> ServingCore::Resolve(std::string_view model,
                                                           std::string_view version) const {
  absl::StatusOr<const ServedModel*> served = models_->Find(model);
  if (!served.ok()) return served.status();
  absl::StatusOr<ModelVersion> found = (*served)->registry->Get(std::string(version));
  if (!found.ok()) {
    if (models_->models().size() == 1) return found.status();
    return absl::Status(found.status().code(),
                        absl::StrCat("model '", (*served)->name, "': ", found.status().message()));
  }
  return Resolved{*served, *std::move(found)};
}

// The shared path of Encode, AttentionMap and Explain: version, `prepare` (validate + tokenize),
// drop check, cost and admission, submit; `build` makes the response on the batcher thread.
template <typename Request, typename Plan, typename Response, typename Prepare, typename Build>
void ServingCore::RunEngineCall(const Request& request, const CallControl& control, Prepare prepare,
                                Build build, Done<Response> done) {
  auto answer = [&](absl::Status status) {
    done(UnlessDropped(control, std::move(status), "queue", metrics_));
  };
  absl::StatusOr<Resolved> resolved = Resolve(request.model, request.model_version);
  if (!resolved.ok()) return answer(resolved.status());
  ServingMetrics* const metrics = resolved->served->metrics;
  Batcher* const batcher = resolved->served->batcher;
  const ModelVersion* const version = &resolved->version;
  const int64_t version_bytes = static_cast<int64_t>(version->version.size());
  // Admission, against the per-request limits and the budget: first on a lower bound of the
  // cost before tokenizing (a call far over a limit is refused without the work), then on the
  // estimate from the tokens, which takes its share of the budget.
  auto admit = [&](const RequestCost& cost, bool lower_bound) {
    std::string limit = "budget";
    absl::Status affordable = CheckRequestCost(
        cost, options_.max_message_bytes, options_.max_request_memory_bytes, &limit, lower_bound);
    if (affordable.ok()) {
      affordable = lower_bound ? memory_budget_->CheckFits(cost.working_bytes)
                               : memory_budget_->Acquire(cost.working_bytes);
    }
    if (!affordable.ok()) metrics->RecordMemoryRefusal(limit);
    return affordable;
  };
  const LowerBoundCheck<Plan> lower_bound_check = [&](const Plan& lower_bound) {
    return admit(EstimateCost(*version->model, lower_bound, version_bytes), true);
  };
  const auto tokenize_start = Clock::now();
  auto plan = std::make_shared<absl::StatusOr<Plan>>(
      prepare(*version->model, request, options_.limits, lower_bound_check));
  const double tokenization_ms = MillisSince(tokenize_start);
  metrics->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!plan->ok()) return answer(plan->status());
  if (control.DropReason() != nullptr) return answer(absl::OkStatus());  // answered dropped
  const RequestCost cost = EstimateCost(*version->model, **plan, version_bytes);
  if (absl::Status affordable = admit(cost, false); !affordable.ok()) return answer(affordable);
  auto admission = std::make_shared<Admission>(memory_budget_, cost.working_bytes, metrics);

  auto job = std::make_shared<Job>();
  job->model = version->model;
  FillJob(version->model, plan.get(), job.get());
  job->cost_bytes = cost.working_bytes;
  job->deadline = control.deadline;
  job->is_cancelled = control.is_cancelled;
  // `done` is shared: it is called here if Submit refuses the job, else by the job's callback.
  auto shared_done = std::make_shared<Done<Response>>(std::move(done));
  job->done = [shared_done, plan, build, tokenization_ms, control, admission, metrics,
               version = *version](absl::Status status, JobOutput output) {
    if (!status.ok()) {
      admission->Release();
      return (*shared_done)(UnlessDropped(control, std::move(status), "compute", metrics));
    }
    Response response;
    response.model_version = version.version;
    response.model = version.model;
    response.metadata.token_count = (*plan)->inputs.total_tokens;
    response.metadata.tokenization_ms = tokenization_ms;
    SetEngineTimes(output, &response.metadata);
    build(*version.model, **plan, output, &response);
    response.metadata.total_ms = MillisSince(control.received);
    if (absl::Status dropped = UnlessDropped(control, absl::OkStatus(), "reply", metrics);
        !dropped.ok()) {
      admission->Release();
      return (*shared_done)(dropped);
    }
    response.admission = admission;
    (*shared_done)(std::move(response));
  };
  if (absl::Status submitted = batcher->Submit(job); !submitted.ok()) {
    admission->Release();
    (*shared_done)(UnlessDropped(control, std::move(submitted), "queue", metrics));
  }
}

void ServingCore::Encode(const EncodeRequest& request, const CallControl& control,
                         Done<EncodeResponse> done) {
  RunEngineCall<EncodeRequest, EncodePlan, EncodeResponse>(
      request, control, PrepareEncode,
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
      request, control, PrepareAttention,
      [](const Model& model, AttentionPlan& plan, JobOutput& output, AttentionResponse* response) {
        response->dtype = plan.dtype;
        response->heads = plan.heads;
        BuildAttentionResults(model, plan, output, &response->results);
        // The dense maps in the results point into the batch results.
        response->batch = std::make_shared<const JobOutput>(std::move(output));
      },
      std::move(done));
}

void ServingCore::Explain(const ExplainRequest& request, const CallControl& control,
                          Done<ExplainResponse> done) {
  RunEngineCall<ExplainRequest, ExplainPlan, ExplainResponse>(
      request, control, PrepareExplain,
      [](const Model&, ExplainPlan& plan, JobOutput&, ExplainResponse* response) {
        response->query = std::move(plan.inputs.encodings[0]);
        response->results = std::move(plan.results);
        response->metadata.batch_inputs = 1;
      },
      std::move(done));
}

absl::StatusOr<TokenizeResponse> ServingCore::Tokenize(const TokenizeRequest& request,
                                                       const CallControl& control) {
  absl::StatusOr<Resolved> resolved = Resolve(request.model, request.model_version);
  if (!resolved.ok()) return UnlessDropped(control, resolved.status(), "queue", metrics_);
  const ModelVersion* const version = &resolved->version;
  const auto start = Clock::now();
  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(*version->model, request.inputs, request.tokenization, options_.limits);
  const double tokenization_ms = MillisSince(start);
  resolved->served->metrics->RecordTokenizationTime(tokenization_ms / 1e3);
  if (!inputs.ok()) return UnlessDropped(control, inputs.status(), "queue", metrics_);
  TokenizeResponse response;
  response.model_version = version->version;
  response.model = version->model;
  response.results = std::move(inputs->encodings);
  response.metadata.token_count = inputs->total_tokens;
  response.metadata.tokenization_ms = tokenization_ms;
  response.metadata.total_ms = MillisSince(control.received);
  if (absl::Status dropped = UnlessDropped(control, absl::OkStatus(), "reply", metrics_);
      !dropped.ok()) {
    return dropped;
  }
  return response;
}

ModelInfo ServingCore::Info(const ServedModel& served, const ModelVersion& version) const {
  const Model& model = *version.model;
  const BertConfig& config = model.config();
  ModelInfo info;
  info.name = served.name;
  info.is_default = &served == &models_->models().front();
  info.architecture = config.spec().model_class;
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
  info.version = version.version;
  info.version_origin = version.origin;
  info.available_versions = served.registry->Versions();
  info.max_inputs_per_request = options_.limits.max_inputs_per_request;
  return info;
}

absl::StatusOr<ModelInfo> ServingCore::GetModelInfo(const ModelInfoRequest& request,
                                                    const CallControl& control) {
  absl::StatusOr<Resolved> resolved = Resolve(request.model, request.model_version);
  if (!resolved.ok()) return UnlessDropped(control, resolved.status(), "queue", metrics_);
  ModelInfo info = Info(*resolved->served, resolved->version);
  if (absl::Status dropped = UnlessDropped(control, absl::OkStatus(), "reply", metrics_);
      !dropped.ok()) {
    return dropped;
  }
  return info;
}

absl::StatusOr<std::vector<ModelInfo>> ServingCore::ListModels(const CallControl& control) {
  std::vector<ModelInfo> models;
  for (const ServedModel& served : models_->models()) {
    absl::StatusOr<ModelVersion> version = served.registry->Get("");
    if (!version.ok()) return UnlessDropped(control, version.status(), "queue", metrics_);
    models.push_back(Info(served, *version));
  }
  if (absl::Status dropped = UnlessDropped(control, absl::OkStatus(), "reply", metrics_);
      !dropped.ok()) {
    return dropped;
  }
  return models;
}

}  // namespace attn::server::core
