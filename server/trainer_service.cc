#include "server/trainer_service.h"

#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/training_report.h"
#include "server/auth.h"
#include "server/core/evaluation.h"
#include "server/core/store_versions.h"
#include "server/core/version_compare.h"
#include "server/fine_tune_convert.h"
#include "server/fine_tune_reactor.h"
#include "server/job_calls.h"
#include "server/job_convert.h"
#include "server/proto_convert.h"
#include "server/raw_method.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

absl::Status CheckVersionName(const std::string& name, const char* field) {
  if (absl::Status valid = ValidateVersionName(name); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", valid.message()));
  }
  return absl::OkStatus();
}

core::CompareVersionsRequest FromProto(const v1::CompareVersionsRequest& in) {
  core::CompareVersionsRequest out;
  out.model = in.model();
  out.model_b = in.model_b();
  out.version_a = in.version_a();
  out.version_b = in.version_b();
  out.probes.assign(in.probes().begin(), in.probes().end());
  out.top_heads = in.top_heads();
  return out;
}

void FillHead(const core::CompareVersionsResponse& in, int index, v1::HeadChange* out) {
  const HeadWeightChange& weights = in.weights.heads[index];
  out->set_layer(weights.layer);
  out->set_head(weights.head);
  out->set_query_change(weights.query);
  out->set_key_change(weights.key);
  out->set_value_change(weights.value);
  out->set_attention_js(in.probes.attention_js[index]);
}

void ToProto(const core::CompareVersionsResponse& in, v1::CompareVersionsResponse* out) {
  out->set_model(in.model);
  out->set_version_a(in.version_a);
  out->set_version_b(in.version_b);
  for (const TensorChange& change : in.weights.tensors) {
    v1::MatrixChange* matrix = out->add_matrices();
    matrix->set_layer(change.layer);
    matrix->set_matrix(change.matrix);
    matrix->set_part(change.part);
    matrix->set_relative_change(change.relative_change);
    matrix->set_norm_a(change.norm_a);
    matrix->set_norm_diff(change.norm_diff);
  }
  for (size_t i = 0; i < in.weights.heads.size(); ++i) {
    FillHead(in, static_cast<int>(i), out->add_heads());
  }
  for (int index : in.most_changed_heads) FillHead(in, index, out->add_most_changed_heads());
  v1::EmbeddingDrift* drift = out->mutable_drift();
  drift->set_probes(in.probes.probes);
  drift->set_mean_cosine(in.probes.mean_cosine);
  drift->set_min_cosine(in.probes.min_cosine);
  drift->set_min_cosine_probe(in.probes.min_cosine_probe);
  drift->set_spearman(in.probes.spearman);
  drift->set_neighbour_overlap(in.probes.neighbour_overlap);
  drift->set_neighbours_k(in.probes.neighbours_k);
  out->set_can_mix(in.verdict.can_mix);
  out->set_verdict(in.verdict.text);
  out->set_default_probes(in.default_probes);
  out->set_seconds(in.seconds);
}

core::NeighborsRequest FromProto(const v1::NeighborsRequest& in) {
  core::NeighborsRequest out;
  out.model = in.model();
  out.version = in.version();
  out.word = in.word();
  if (in.has_token_id()) out.token_id = in.token_id();
  out.top_k = in.top_k();
  out.sentences.assign(in.sentences().begin(), in.sentences().end());
  if (in.has_layer()) out.layer = in.layer();
  return out;
}

void ToProto(const core::NeighborsResponse& in, v1::NeighborsResponse* out) {
  out->set_model_version(in.model_version);
  for (int32_t id : in.word_ids) out->add_word_token_ids(id);
  for (const std::string& token : in.word_tokens) out->add_word_tokens(token);
  for (size_t i = 0; i < in.neighbours.size(); ++i) {
    v1::TokenNeighbor* neighbour = out->add_static_neighbors();
    neighbour->set_token_id(in.neighbours[i].id);
    neighbour->set_token(in.neighbour_tokens[i]);
    neighbour->set_cosine(in.neighbours[i].cosine);
  }
  out->set_layer(in.layer);
  for (double cosine : in.contextual_cosine) out->add_contextual_cosine(cosine);
}

absl::StatusOr<core::EvaluateRequest> FromProto(const v1::EvaluateRequest& in) {
  core::EvaluateRequest out;
  out.model = in.model();
  out.version = in.version();
  absl::StatusOr<core::EvaluationSetRequest> evaluation = ToCore(in.evaluation(), "evaluation");
  if (!evaluation.ok()) return evaluation.status();
  out.evaluation = *std::move(evaluation);
  out.tokenization = ToCore(in.tokenization());
  return out;
}

void ToProto(const core::EvaluateResponse& in, v1::EvaluationResult* out) {
  attn::server::ToProto(in.result, /*step=*/0, out);
  out->set_model(in.model);
  out->set_model_version(in.model_version);
}

}  // namespace

TrainerService::TrainerService(const ServerOptions& options, std::optional<std::string> token,
                               const ModelSet* models, Metrics* metrics)
    : options_(options),
      token_(std::move(token)),
      models_(models),
      metrics_(metrics),
      idle_watchdog_(std::chrono::duration<double>(options.stream_idle_timeout_s)) {
  for (const ServedModel& served : models->models()) {
    fine_tuning_[served.name] = std::make_unique<core::FineTuning>(
        core::FineTuningOptions{options.max_inputs_per_request, served.store,
                                options.trainer_threads, options.trainer_nice},
        served.registry, metrics->ForModel(served.name));
    jobs_[served.name] = std::make_unique<core::JobRunner>(
        core::JobRunnerOptions{served.name, served.store, options.watch_store_s > 0,
                               options.max_queued_jobs, options.max_job_dataset_bytes},
        fine_tuning_[served.name].get(), JobProtoCodec(), metrics->ForModel(served.name));
  }
  const google::protobuf::FileDescriptor& file = *v1::FineTuneRequest::descriptor()->file();
  // FineTune takes raw bytes (see FineTuneReactor).
  MarkMethodRawCallback(MethodIndex(file, "Trainer", "FineTune"),
                        RawMethods::Bidi([this](grpc::CallbackServerContext* context) {
                          return NewFineTuneReactor(this, context);
                        }));
  ServeVersionsMethod<v1::ListVersionsRequest>("ListVersions", &TrainerService::HandleListVersions);
  ServeVersionsMethod<v1::RollbackRequest>("Rollback", &TrainerService::HandleRollback);
  ServeVersionsMethod<v1::SetServingVersionRequest>("SetServingVersion",
                                                    &TrainerService::HandleSetServingVersion);
  ServeVersionsMethod<v1::GetTrainingReportRequest, v1::TrainingReport>(
      "GetTrainingReport", &TrainerService::HandleGetTrainingReport);
  ServeAnalysisMethod<v1::CompareVersionsRequest, v1::CompareVersionsResponse>(
      "CompareVersions", &core::CompareVersions);
  ServeAnalysisMethod<v1::NeighborsRequest, v1::NeighborsResponse>("Neighbors", &core::Neighbors);
  ServeVersionsMethod<v1::PromoteRequest>("Promote", &TrainerService::HandlePromote);
  ServeAnalysisMethod<v1::EvaluateRequest, v1::EvaluationResult>("Evaluate", &core::Evaluate);
  MarkMethodRawCallback(MethodIndex(file, "Trainer", "CreateJob"),
                        RawMethods::Bidi([this](grpc::CallbackServerContext* context) {
                          return NewCreateJobReactor(this, context);
                        }));
  MarkMethodRawCallback(MethodIndex(file, "Trainer", "WatchJob"),
                        RawMethods::ServerStream([this](grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request) {
                          return NewWatchJobReactor(this, context, request);
                        }));
  ServeVersionsMethod<v1::GetJobRequest, v1::Job>("GetJob", &TrainerService::HandleGetJob);
  ServeVersionsMethod<v1::ListJobsRequest, v1::ListJobsResponse>("ListJobs",
                                                                 &TrainerService::HandleListJobs);
  ServeUnary<v1::CancelJobRequest>(
      "CancelJob", [this](std::shared_ptr<UnaryCall> call, const v1::CancelJobRequest& request) {
        HandleCancelJob(std::move(call), request);
      });
}

template <typename Request>
void TrainerService::ServeUnary(const char* method, UnaryHandler<Request> handle,
                                bool answer_dropped) {
  const google::protobuf::FileDescriptor& file = *v1::FineTuneRequest::descriptor()->file();
  MarkMethodRawCallback(
      MethodIndex(file, "Trainer", method),
      RawMethods::Unary<Request>(
          method, metrics_, options_.max_message_bytes,
          // Authorization first: a caller without the token learns nothing about its bytes.
          [this](const grpc::CallbackServerContext& context) { return Authorize(context); },
          [handle = std::move(handle)](std::shared_ptr<UnaryCall> call,
                                       grpc::CallbackServerContext*,
                                       Request request) { handle(std::move(call), request); },
          answer_dropped));
}

template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
void TrainerService::ServeAnalysisMethod(const char* method,
                                         AnalysisCall<CoreRequest, CoreResponse> core_call) {
  ServeUnary<Request>(
      method,
      [this, core_call](std::shared_ptr<UnaryCall> call, const Request& request) {
        absl::StatusOr<CoreRequest> converted = FromProto(request);
        if (!converted.ok()) {
          call->Finish(converted.status());
          return;
        }
        // The core answers on this thread when it refuses the request, else on the model's
        // batcher thread once the work is done.
        core_call(*models_, *converted, call->Control(),
                  [call](absl::StatusOr<CoreResponse> result) {
                    if (!result.ok()) {
                      call->Finish(result.status());
                      return;
                    }
                    Response response;
                    ToProto(*result, &response);
                    call->Finish(absl::OkStatus(), response);
                  });
      },
      /*answer_dropped=*/true);
}

template <typename Request, typename Response>
void TrainerService::ServeVersionsMethod(const char* method,
                                         VersionsHandler<Request, Response> handler) {
  ServeUnary<Request>(method,
                      [this, handler](std::shared_ptr<UnaryCall> call, const Request& request) {
                        Response response;
                        call->Finish((this->*handler)(request, &response), response);
                      });
}

void TrainerService::SetNextSequence(const std::string& model, int64_t sequence) {
  fine_tuning_.at(model)->SetNextSequence(sequence);
}

absl::StatusOr<TrainerService::ModelJobs> TrainerService::Find(const std::string& model) const {
  absl::StatusOr<const ServedModel*> served = models_->Find(model);
  if (!served.ok()) return served.status();
  return ModelJobs{*served, fine_tuning_.at((*served)->name).get()};
}

absl::Status TrainerService::Authorize(const grpc::CallbackServerContext& context) const {
  if (!token_.has_value()) {
    return absl::UnimplementedError(
        "the Trainer service is disabled on this server; start it with "
        "--trainer-token-file to enable fine-tuning and version management");
  }
  return BearerTokenStatus(context, *token_);
}

void TrainerService::FillVersions(const ServedModel& served, v1::ListVersionsResponse* response) {
  std::string serving;
  const std::vector<ModelVersion> versions = served.registry->List(&serving);
  // The versions served by default at some point, as Rollback knows them; without a recorded
  // serving state every commit was served when made.
  const std::set<std::string> served_ever = served.registry->serving_history().served_ever;
  for (const ModelVersion& version : versions) {
    v1::VersionInfo* info = response->add_versions();
    info->set_version(version.version);
    info->set_origin(version.origin);
    info->set_created_utc(version.created_utc);
    info->set_serving(version.version == serving);
    info->set_description(version.description);
    for (const std::string& note : version.notes) info->add_notes(note);
    info->set_staged(!served_ever.empty() && version.sequence > 0 && version.version != serving &&
                     served_ever.count(version.version) == 0);
  }
  response->set_serving_version(serving);
}

absl::Status TrainerService::HandleListVersions(const v1::ListVersionsRequest& request,
                                                v1::ListVersionsResponse* response) {
  absl::StatusOr<ModelJobs> model = Find(request.model());
  if (!model.ok()) return model.status();
  FillVersions(*model->served, response);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleRollback(const v1::RollbackRequest& request,
                                            v1::ListVersionsResponse* response) {
  if (!request.version().empty()) {
    if (absl::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
      return name;
    }
  }
  absl::StatusOr<ModelJobs> model = Find(request.model());
  if (!model.ok()) return model.status();
  const std::string previous = model->fine_tuning->ServedVersion();
  absl::StatusOr<ModelVersion> served = model->served->registry->Rollback(request.version());
  if (!served.ok()) return served.status();
  if (absl::Status recorded =
          model->fine_tuning->RecordOrRevert("rollback", previous, served->version);
      !recorded.ok()) {
    return recorded;
  }
  Log(LogLevel::kInfo, "Rollback: model %s now serves version %s", model->served->name,
      served->version);
  FillVersions(*model->served, response);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleSetServingVersion(const v1::SetServingVersionRequest& request,
                                                     v1::ListVersionsResponse* response) {
  return ServeVersion("set-serving", request.version(), request.model(), response);
}

absl::Status TrainerService::HandlePromote(const v1::PromoteRequest& request,
                                           v1::ListVersionsResponse* response) {
  return ServeVersion("promote", request.version(), request.model(), response);
}

absl::Status TrainerService::ServeVersion(const char* action, const std::string& version,
                                          const std::string& model_name,
                                          v1::ListVersionsResponse* response) {
  if (absl::Status name = CheckVersionName(version, "version"); !name.ok()) return name;
  absl::StatusOr<ModelJobs> model = Find(model_name);
  if (!model.ok()) return model.status();
  if (std::string_view(action) == "promote" && model->served->store.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model->served->name,
        " has no model store on this server, so there is no staged version to promote and a "
        "promotion would not survive a restart; start the server with --model-store DIR"));
  }
  const std::string previous = model->fine_tuning->ServedVersion();
  if (absl::Status set = model->served->registry->SetServing(version); !set.ok()) return set;
  if (absl::Status recorded = model->fine_tuning->RecordOrRevert(action, previous, version);
      !recorded.ok()) {
    return recorded;
  }
  Log(LogLevel::kInfo, "%s: model %s now serves version %s (was %s)", action, model->served->name,
      version, previous);
  FillVersions(*model->served, response);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleGetTrainingReport(const v1::GetTrainingReportRequest& request,
                                                     v1::TrainingReport* response) {
  if (absl::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
    return name;
  }
  absl::StatusOr<ModelJobs> model = Find(request.model());
  if (!model.ok()) return model.status();
  if (model->served->store.empty()) {
    return absl::FailedPreconditionError(
        "this server has no --model-store, so no version has a training report");
  }
  if (request.version() == "base") {
    // Not a missing version: base is there, it was loaded, not trained.
    return absl::FailedPreconditionError(
        absl::StrCat("base has no training report: it is model ", model->served->name,
                     " as loaded, not a fine-tuned version; ask for a committed version "
                     "(ListVersions lists them)"));
  }
  absl::StatusOr<TrainingReport> report =
      ReadTrainingReport(model->served->store, request.version());
  if (!report.ok()) return report.status();
  response->set_version(request.version());
  for (const auto& [name, value] : report->settings) (*response->mutable_settings())[name] = value;
  for (const LossPoint& p : report->loss_curve) {
    v1::LossPoint* point = response->add_loss_curve();
    point->set_step(p.step);
    point->set_loss(p.loss);
    point->set_learning_rate(p.learning_rate);
    point->set_grad_norm(p.grad_norm);
  }
  for (const GroupChange& c : report->changes) {
    v1::ParameterGroupTelemetry* group = response->add_relative_change();
    group->set_name(c.name);
    group->set_kind(c.kind);
    group->set_layer(c.layer);
    group->set_relative_change(c.relative_change);
  }
  response->set_embedding_rows_changed(report->embedding_rows_changed);
  for (const StepEvaluation& e : report->evaluations) {
    ToProto(e.result, e.step, response->add_evaluations());
  }
  response->set_promotion(report->promotion);
  return absl::OkStatus();
}

}  // namespace attn::server
