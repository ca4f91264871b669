#include "client/client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "client/training_data.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;
namespace health = ::grpc::health::v1;

constexpr char kUnreachablePayloadUrl[] = "type.attnserve.dev/client.unreachable";

// Messages gRPC core uses when no connection could be made at all.
bool LooksLikeConnectFailure(absl::string_view message) {
  return absl::StrContains(message, "failed to connect") ||
         absl::StrContains(message, "DNS resolution failed") ||
         absl::StrContains(message, "empty address list") ||
         absl::StrContains(message, "Connection refused") ||
         absl::StrContains(message, "Ssl handshake failed");
}

// Deadline (when `with_deadline`), wait-for-ready and the bearer token: what every call sets.
void SetUpContext(const ClientOptions& options, bool with_deadline,
                  ::grpc::ClientContext* context) {
  if (with_deadline && options.timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options.timeout);
  }
  context->set_wait_for_ready(options.wait_for_ready);
  if (!options.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options.bearer_token);
  }
}

// FromGrpcStatus plus the "never reached a server" payload (see IsUnreachable).
absl::Status ToClientStatus(const ::grpc::Status& grpc_status, ::grpc::Channel* channel,
                            const std::string& target) {
  absl::Status status = FromGrpcStatus(grpc_status);
  if (status.ok()) return status;
  // A server that is loading or draining also answers UNAVAILABLE; only the channel state
  // (never got a connection) tells "nobody there" apart from "server said not now".
  const grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/false);
  const bool not_connected =
      state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_CONNECTING;
  const bool transport_code = status.code() == absl::StatusCode::kUnavailable ||
                              status.code() == absl::StatusCode::kDeadlineExceeded;
  if (transport_code && (not_connected || (status.code() == absl::StatusCode::kUnavailable &&
                                           LooksLikeConnectFailure(status.message())))) {
    status.SetPayload(kUnreachablePayloadUrl, absl::Cord(target));
  }
  return status;
}

}  // namespace

// gRPC's retry policy for the calls that only read (every Encoder call, the Open Inference
// Protocol's, the Trainer's queries): a call answered UNAVAILABLE (a replica that died or is
// draining behind a load balancer, a connection refused) is sent again, up to 5 attempts in
// about 1.5 s. Calls that change state (FineTune, Promote, Rollback, ...) are never retried.
// The Python client carries the same policy (client/python/src/attnserve/_base.py).
constexpr char kRetryServiceConfig[] = R"json({
  "methodConfig": [{
    "name": [
      {"service": "attnserve.v1.Encoder"},
      {"service": "inference.GRPCInferenceService"},
      {"service": "attnserve.v1.Trainer", "method": "ListVersions"},
      {"service": "attnserve.v1.Trainer", "method": "CompareVersions"},
      {"service": "attnserve.v1.Trainer", "method": "Neighbors"},
      {"service": "attnserve.v1.Trainer", "method": "GetTrainingReport"},
      {"service": "attnserve.v1.Trainer", "method": "Evaluate"},
      {"service": "attnserve.v1.Trainer", "method": "GetJob"},
      {"service": "attnserve.v1.Trainer", "method": "ListJobs"},
      {"service": "attnserve.v1.Trainer", "method": "WatchJob"}
    ],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})json";

std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target,
                                               const ClientOptions& options) {
  ::grpc::ChannelArguments args;
  args.SetServiceConfigJSON(kRetryServiceConfig);
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  std::shared_ptr<::grpc::ChannelCredentials> credentials;
  if (options.use_tls) {
    ::grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    credentials = ::grpc::SslCredentials(ssl);
  } else {
    credentials = ::grpc::InsecureChannelCredentials();
  }
  return ::grpc::CreateCustomChannel(target, credentials, args);
}

absl::Status FromGrpcStatus(const ::grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // gRPC and absl share the canonical code numbering (0..16).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsUnreachable(const absl::Status& status) {
  return status.GetPayload(kUnreachablePayloadUrl).has_value();
}

EncoderClient::EncoderClient(std::string target, ClientOptions options)
    : EncoderClient(CreateChannel(target, options), target, options) {}

EncoderClient::EncoderClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                             ClientOptions options)
    : target_(std::move(target)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      encoder_(v1::Encoder::NewStub(channel_)),
      health_(health::Health::NewStub(channel_)) {}

void EncoderClient::PrepareContext(::grpc::ClientContext* context) const {
  SetUpContext(options_, /*with_deadline=*/true, context);
}

absl::Status EncoderClient::ToAbslStatus(const ::grpc::Status& grpc_status) const {
  return ToClientStatus(grpc_status, channel_.get(), target_);
}

template <typename Response, typename Request>
absl::StatusOr<Response> EncoderClient::Unary(
    ::grpc::Status (v1::Encoder::Stub::*method)(::grpc::ClientContext*, const Request&, Response*),
    const Request& request) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  Response response;
  ::grpc::Status status = (encoder_.get()->*method)(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<v1::EncodeResponse> EncoderClient::Encode(const v1::EncodeRequest& request) {
  return Unary(&v1::Encoder::Stub::Encode, request);
}

absl::StatusOr<v1::ExplainResponse> EncoderClient::Explain(const v1::ExplainRequest& request) {
  return Unary(&v1::Encoder::Stub::Explain, request);
}

absl::StatusOr<v1::ClassifyResponse> EncoderClient::Classify(const v1::ClassifyRequest& request) {
  return Unary(&v1::Encoder::Stub::Classify, request);
}

absl::StatusOr<v1::RerankResponse> EncoderClient::Rerank(const v1::RerankRequest& request) {
  return Unary(&v1::Encoder::Stub::Rerank, request);
}

absl::StatusOr<v1::AttentionMapResponse> EncoderClient::AttentionMap(
    const v1::AttentionMapRequest& request) {
  return Unary(&v1::Encoder::Stub::AttentionMap, request);
}

absl::StatusOr<v1::TokenizeResponse> EncoderClient::Tokenize(const v1::TokenizeRequest& request) {
  return Unary(&v1::Encoder::Stub::Tokenize, request);
}

absl::StatusOr<v1::ModelInfo> EncoderClient::GetModelInfo(const v1::GetModelInfoRequest& request) {
  return Unary(&v1::Encoder::Stub::GetModelInfo, request);
}

absl::StatusOr<v1::ListModelsResponse> EncoderClient::ListModels() {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  v1::ListModelsResponse response;
  ::grpc::Status status = encoder_->ListModels(&context, v1::ListModelsRequest(), &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<HealthStatus> EncoderClient::Health(const std::string& service) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  health::HealthCheckRequest request;
  request.set_service(service);
  health::HealthCheckResponse response;
  ::grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response.status();
}

// ---------------------------------------------------------------------------------------------
// FineTuneSession

FineTuneSession::FineTuneSession(v1::Trainer::Stub* stub, std::shared_ptr<::grpc::Channel> channel,
                                 std::string target, ClientOptions options)
    : stub_(stub),
      channel_(std::move(channel)),
      target_(std::move(target)),
      options_(std::move(options)) {}

FineTuneSession::~FineTuneSession() {
  // Dropping an unfinished call must not leave the server training: cancel, then reap it.
  if (stream_ != nullptr && !finished_) {
    Cancel();
    Finish().IgnoreError();
  }
}

absl::Status FineTuneSession::Start(const v1::FineTuneConfig& config) {
  if (stream_ != nullptr || finished_) {
    return absl::FailedPreconditionError("FineTuneSession::Start called twice");
  }
  auto context = std::make_unique<::grpc::ClientContext>();
  SetUpContext(options_, /*with_deadline=*/false, context.get());
  if (options_.wait_for_ready && options_.timeout.count() > 0 &&
      !channel_->WaitForConnected(std::chrono::system_clock::now() + options_.timeout)) {
    finished_ = true;
    final_status_ = absl::DeadlineExceededError(
        absl::StrFormat("no connection within %d ms", options_.timeout.count()));
    final_status_.SetPayload(kUnreachablePayloadUrl, absl::Cord(target_));
    return final_status_;
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    context_ = std::move(context);
    if (cancelled_) context_->TryCancel();
  }
  stream_ = stub_->FineTune(context_.get());
  v1::FineTuneRequest request;
  *request.mutable_config() = config;
  if (stream_->Write(request)) return absl::OkStatus();
  absl::Status status = Finish();
  if (status.ok()) {
    final_status_ = absl::UnknownError("the server ended the stream before the job started");
    status = final_status_;
  }
  return status;
}

bool FineTuneSession::Write(const v1::FineTuneRequest& request) {
  if (stream_ == nullptr || half_closed_ || finished_) return false;
  return stream_->Write(request);
}

bool FineTuneSession::HalfClose() {
  if (stream_ == nullptr || finished_) return false;
  if (half_closed_) return true;
  half_closed_ = true;
  return stream_->WritesDone();
}

bool FineTuneSession::SendBatch(const v1::TrainingBatch& batch) {
  v1::FineTuneRequest request;
  *request.mutable_batch() = batch;
  return Write(request);
}

bool FineTuneSession::SendBatch(const std::vector<v1::TrainingExample>& examples) {
  v1::FineTuneRequest request;
  request.mutable_batch()->mutable_examples()->Assign(examples.begin(), examples.end());
  return Write(request);
}

bool FineTuneSession::Commit(const std::string& description, bool promote) {
  v1::FineTuneRequest request;
  request.mutable_commit()->set_description(description);
  request.mutable_commit()->set_promote(promote);
  const bool written = Write(request);
  return HalfClose() && written;
}

bool FineTuneSession::Abort() {
  v1::FineTuneRequest request;
  request.set_abort(true);
  const bool written = Write(request);
  return HalfClose() && written;
}

bool FineTuneSession::Read(v1::FineTuneProgress* progress) {
  if (stream_ == nullptr || finished_) return false;
  return stream_->Read(progress);
}

absl::Status FineTuneSession::Finish() {
  if (finished_) return final_status_;
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError("FineTuneSession::Finish before Start");
  }
  HalfClose();
  v1::FineTuneProgress unread;
  while (stream_->Read(&unread)) {
  }
  finished_ = true;
  final_status_ = ToClientStatus(stream_->Finish(), channel_.get(), target_);
  return final_status_;
}

void FineTuneSession::Cancel() {
  std::lock_guard<std::mutex> lock(cancel_mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

// ---------------------------------------------------------------------------------------------
// TrainerClient

TrainerClient::TrainerClient(std::string target, ClientOptions options)
    : TrainerClient(CreateChannel(target, options), target, options) {}

TrainerClient::TrainerClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                             ClientOptions options)
    : target_(std::move(target)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      trainer_(v1::Trainer::NewStub(channel_)) {}

std::unique_ptr<FineTuneSession> TrainerClient::FineTune() {
  return std::unique_ptr<FineTuneSession>(
      new FineTuneSession(trainer_.get(), channel_, target_, options_));
}

template <typename Response, typename Request>
absl::StatusOr<Response> TrainerClient::Unary(
    ::grpc::Status (v1::Trainer::Stub::*method)(::grpc::ClientContext*, const Request&, Response*),
    const Request& request) {
  ::grpc::ClientContext context;
  SetUpContext(options_, /*with_deadline=*/true, &context);
  Response response;
  ::grpc::Status status = (trainer_.get()->*method)(&context, request, &response);
  if (!status.ok()) return ToClientStatus(status, channel_.get(), target_);
  return response;
}

absl::StatusOr<v1::ListVersionsResponse> TrainerClient::ListVersions(const std::string& model) {
  v1::ListVersionsRequest request;
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::ListVersions, request);
}

absl::StatusOr<v1::ListVersionsResponse> TrainerClient::Rollback(const std::string& version,
                                                                 const std::string& model) {
  v1::RollbackRequest request;
  request.set_version(version);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::Rollback, request);
}

absl::StatusOr<v1::ListVersionsResponse> TrainerClient::SetServingVersion(
    const std::string& version, const std::string& model) {
  v1::SetServingVersionRequest request;
  request.set_version(version);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::SetServingVersion, request);
}

absl::StatusOr<v1::ListVersionsResponse> TrainerClient::Promote(const std::string& version,
                                                                const std::string& model) {
  v1::PromoteRequest request;
  request.set_version(version);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::Promote, request);
}

absl::StatusOr<v1::CompareVersionsResponse> TrainerClient::CompareVersions(
    const v1::CompareVersionsRequest& request) {
  return Unary(&v1::Trainer::Stub::CompareVersions, request);
}

absl::StatusOr<v1::NeighborsResponse> TrainerClient::Neighbors(
    const v1::NeighborsRequest& request) {
  return Unary(&v1::Trainer::Stub::Neighbors, request);
}

absl::StatusOr<v1::TrainingReport> TrainerClient::GetTrainingReport(const std::string& version,
                                                                    const std::string& model) {
  v1::GetTrainingReportRequest request;
  request.set_version(version);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::GetTrainingReport, request);
}

absl::StatusOr<v1::EvaluationResult> TrainerClient::Evaluate(const v1::EvaluateRequest& request) {
  return Unary(&v1::Trainer::Stub::Evaluate, request);
}

absl::StatusOr<v1::Job> TrainerClient::CreateJob(v1::JobSpec spec,
                                                 const std::vector<v1::TrainingExample>& examples) {
  const JobDataset dataset = EncodeJobDataset(examples);
  *spec.mutable_dataset() = dataset.info;
  ::grpc::ClientContext context;
  SetUpContext(options_, /*with_deadline=*/false, &context);
  auto stream = trainer_->CreateJob(&context);
  auto finish = [&]() -> absl::Status {
    ::grpc::Status status = stream->Finish();
    if (status.ok()) return absl::InternalError("the server ended CreateJob without the job");
    return ToClientStatus(status, channel_.get(), target_);
  };
  v1::CreateJobRequest request;
  *request.mutable_spec() = std::move(spec);
  v1::CreateJobResponse response;
  // The server answers the spec before any chunk is sent: a refused job costs no upload.
  if (!stream->Write(request) || !stream->Read(&response)) return finish();
  const size_t chunk_bytes =
      static_cast<size_t>(std::clamp<int64_t>(response.max_chunk_bytes(), 1, 1 << 20));
  int64_t index = 0;
  for (size_t at = 0; at < dataset.bytes.size(); at += chunk_bytes) {
    request.Clear();
    v1::DatasetChunk* chunk = request.mutable_chunk();
    chunk->set_index(index++);
    chunk->set_data(dataset.bytes.substr(at, chunk_bytes));
    if (!stream->Write(request)) break;  // the server ended the call: Finish says why
  }
  stream->WritesDone();
  if (!stream->Read(&response) || !response.has_job()) return finish();
  ::grpc::Status status = stream->Finish();
  if (!status.ok()) return ToClientStatus(status, channel_.get(), target_);
  return response.job();
}

absl::StatusOr<v1::Job> TrainerClient::GetJob(const std::string& job_id, const std::string& model) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::GetJob, request);
}

absl::StatusOr<v1::ListJobsResponse> TrainerClient::ListJobs(const std::string& model) {
  v1::ListJobsRequest request;
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::ListJobs, request);
}

absl::StatusOr<v1::Job> TrainerClient::CancelJob(const std::string& job_id,
                                                 const std::string& model) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_model(model);
  return Unary(&v1::Trainer::Stub::CancelJob, request);
}

absl::Status TrainerClient::WatchJob(const std::string& job_id, const std::string& model,
                                     int64_t from_index,
                                     const std::function<bool(const v1::JobEvent&)>& on_event) {
  ::grpc::ClientContext context;
  SetUpContext(options_, /*with_deadline=*/false, &context);
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_model(model);
  request.set_from_index(from_index);
  auto stream = trainer_->WatchJob(&context, request);
  v1::JobEvent event;
  while (stream->Read(&event)) {
    if (!on_event(event)) {
      context.TryCancel();
      while (stream->Read(&event)) {
      }
      stream->Finish();
      return absl::CancelledError("stopped watching");
    }
  }
  ::grpc::Status status = stream->Finish();
  if (!status.ok()) return ToClientStatus(status, channel_.get(), target_);
  return absl::OkStatus();
}

}  // namespace attn::client
