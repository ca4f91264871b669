#include "server/trainer_service.h"

#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "server/auth.h"
#include "server/core/store_versions.h"
#include "server/fine_tune_reactor.h"
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

}  // namespace

TrainerService::TrainerService(const ServerOptions& options, std::optional<std::string> token,
                               const ModelSet* models, Metrics* metrics)
    : options_(options), token_(std::move(token)), models_(models), metrics_(metrics) {
  for (const ServedModel& served : models->models()) {
    fine_tuning_[served.name] = std::make_unique<core::FineTuning>(
        core::FineTuningOptions{options.max_inputs_per_request, served.store,
                                options.trainer_threads, options.trainer_nice},
        served.registry, metrics->ForModel(served.name));
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
  ServeVersionsMethod<v1::PromoteRequest>("Promote", &TrainerService::HandlePromote);
}

template <typename Request>
void TrainerService::ServeVersionsMethod(const char* method, VersionsHandler<Request> handler) {
  const google::protobuf::FileDescriptor& file = *v1::FineTuneRequest::descriptor()->file();
  MarkMethodRawCallback(
      MethodIndex(file, "Trainer", method),
      RawMethods::Unary<Request>(
          method, metrics_, options_.max_message_bytes,
          // Authorization first: a caller without the token learns nothing about its bytes.
          [this](const grpc::CallbackServerContext& context) { return Authorize(context); },
          [this, handler](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                          Request request) {
            v1::ListVersionsResponse response;
            call->Finish((this->*handler)(request, &response), response);
          }));
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
  const std::set<std::string> served_ever = VersionsServedEver(served.store);
  for (const ModelVersion& version : versions) {
    v1::VersionInfo* info = response->add_versions();
    info->set_version(version.version);
    info->set_origin(version.origin);
    info->set_created_utc(version.created_utc);
    info->set_serving(version.version == serving);
    info->set_description(version.description);
    for (const std::string& note : version.notes) info->add_notes(note);
    // Without a recorded serving state every commit was served when made (staging records one).
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

}  // namespace attn::server
