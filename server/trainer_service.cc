#include "server/trainer_service.h"

#include <algorithm>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "server/auth.h"
#include "server/fine_tune_reactor.h"
#include "server/raw_method.h"
#include "server/store_versions.h"

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
                               ModelRegistry* registry, Metrics* metrics)
    : options_(options),
      token_(std::move(token)),
      registry_(registry),
      metrics_(metrics),
      training_thread_(options.trainer_threads, options.trainer_nice) {
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

void TrainerService::SetNextSequence(int64_t sequence) {
  absl::MutexLock lock(&mutex_);
  next_sequence_ = std::max<int64_t>(sequence, 1);
}

int64_t TrainerService::TakeSequence() {
  absl::MutexLock lock(&mutex_);
  return next_sequence_++;
}

absl::StatusOr<std::string> TrainerService::StartJob() {
  absl::MutexLock lock(&mutex_);
  if (!running_job_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("fine-tuning job ", running_job_,
                     " is running; one job runs at a time (wait for it to commit or abort)"));
  }
  ++jobs_started_;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
  running_job_ = absl::StrFormat("job-%s-%d", stamp, jobs_started_);
  return running_job_;
}

void TrainerService::EndJob(const std::string& job_id) {
  absl::MutexLock lock(&mutex_);
  if (running_job_ == job_id) running_job_.clear();
}

absl::Status TrainerService::Authorize(const grpc::CallbackServerContext& context) const {
  if (!token_.has_value()) {
    return absl::UnimplementedError(
        "the Trainer service is disabled on this server; start it with "
        "--trainer-token-file to enable fine-tuning and version management");
  }
  return BearerTokenStatus(context, *token_);
}

void TrainerService::FillVersions(v1::ListVersionsResponse* response) const {
  std::string serving;
  for (const ModelVersion& version : registry_->List(&serving)) {
    v1::VersionInfo* info = response->add_versions();
    info->set_version(version.version);
    info->set_origin(version.origin);
    info->set_created_utc(version.created_utc);
    info->set_serving(version.version == serving);
    info->set_description(version.description);
    for (const std::string& note : version.notes) info->add_notes(note);
  }
  response->set_serving_version(serving);
}

absl::Status TrainerService::HandleListVersions(const v1::ListVersionsRequest& /*request*/,
                                                v1::ListVersionsResponse* response) {
  FillVersions(response);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleRollback(const v1::RollbackRequest& request,
                                            v1::ListVersionsResponse* response) {
  if (!request.version().empty()) {
    if (absl::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
      return name;
    }
  }
  const std::string previous = ServedVersion();
  absl::StatusOr<ModelVersion> served = registry_->Rollback(request.version());
  if (!served.ok()) return served.status();
  if (absl::Status recorded = RecordOrRevert("rollback", previous, served->version);
      !recorded.ok()) {
    return recorded;
  }
  Log(LogLevel::kInfo, "Rollback: now serving version %s", served->version);
  FillVersions(response);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleSetServingVersion(const v1::SetServingVersionRequest& request,
                                                     v1::ListVersionsResponse* response) {
  if (absl::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
    return name;
  }
  const std::string previous = ServedVersion();
  if (absl::Status set = registry_->SetServing(request.version()); !set.ok()) return set;
  if (absl::Status recorded = RecordOrRevert("set-serving", previous, request.version());
      !recorded.ok()) {
    return recorded;
  }
  Log(LogLevel::kInfo, "SetServingVersion: now serving version %s", request.version());
  FillVersions(response);
  return absl::OkStatus();
}

std::string TrainerService::ServedVersion() const {
  std::string serving;
  registry_->List(&serving);
  return serving;
}

absl::Status TrainerService::RecordOrRevert(const std::string& action, const std::string& from,
                                            const std::string& to, const std::string& committed) {
  absl::Status recorded = RecordServing(options_.model_store, action, from, to, committed);
  if (recorded.ok() || from.empty()) return recorded;
  // Not recorded: a restart or a replica would serve `from`, so this server does too.
  registry_->SetServing(from).IgnoreError();
  return absl::Status(recorded.code(), absl::StrCat(recorded.message(), "; still serving ", from));
}

}  // namespace attn::server
