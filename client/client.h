// attn::client::EncoderClient: a blocking C++ client for the attnserve.v1.Encoder service and the
// standard grpc.health.v1.Health service. Every call returns absl::StatusOr; a failed RPC becomes
// an absl::Status with the same code and the server's message, so callers never see grpc types
// in error paths.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/encoder.grpc.pb.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"

namespace attn::client {

struct ClientOptions {
  // Per-call deadline. Zero or negative = no deadline.
  std::chrono::milliseconds timeout{30000};
  // Largest response accepted. AttentionMap responses with Q/K/V or many layers get large;
  // gRPC's 4 MiB default is too small for them.
  int max_receive_message_bytes = 256 << 20;
  int max_send_message_bytes = 64 << 20;
  // Queue calls while the channel is connecting instead of failing fast with UNAVAILABLE
  // (useful for scripts that start the server and the client together).
  bool wait_for_ready = false;
  // TLS: off by default (plaintext, for loopback and in-cluster traffic). With use_tls, the
  // server certificate is verified against tls_root_certs_pem, or the system roots when empty.
  bool use_tls = false;
  std::string tls_root_certs_pem;
  // Sent as the metadata `authorization: Bearer <token>` on every call when not empty. The
  // Trainer service requires it (UNAUTHENTICATED without, PERMISSION_DENIED when wrong); the
  // Encoder service ignores it. Plaintext channels carry it in the clear: use TLS off-host.
  std::string bearer_token;
};

using HealthStatus = ::grpc::health::v1::HealthCheckResponse::ServingStatus;

class EncoderClient {
 public:
  // Connects lazily to `target` ("host:port", or any gRPC target URI).
  EncoderClient(std::string target, ClientOptions options = {});
  // Uses an existing channel (tests, shared channels). `target` is only used in messages.
  EncoderClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                ClientOptions options = {});

  absl::StatusOr<attnserve::v1::EncodeResponse> Encode(const attnserve::v1::EncodeRequest& request);
  absl::StatusOr<attnserve::v1::AttentionMapResponse> AttentionMap(
      const attnserve::v1::AttentionMapRequest& request);
  absl::StatusOr<attnserve::v1::TokenizeResponse> Tokenize(
      const attnserve::v1::TokenizeRequest& request);
  absl::StatusOr<attnserve::v1::ExplainResponse> Explain(
      const attnserve::v1::ExplainRequest& request);
  absl::StatusOr<attnserve::v1::ClassifyResponse> Classify(
      const attnserve::v1::ClassifyRequest& request);
  absl::StatusOr<attnserve::v1::RerankResponse> Rerank(const attnserve::v1::RerankRequest& request);
  absl::StatusOr<attnserve::v1::ModelInfo> GetModelInfo(
      const attnserve::v1::GetModelInfoRequest& request = {});
  // Every model the server serves, the default first.
  absl::StatusOr<attnserve::v1::ListModelsResponse> ListModels();

  // grpc.health.v1.Health/Check for `service` ("" = the server as a whole). A service the
  // server does not know comes back as NOT_FOUND (that is what the protocol specifies).
  absl::StatusOr<HealthStatus> Health(const std::string& service = "");

  const std::string& target() const { return target_; }
  const ClientOptions& options() const { return options_; }

 private:
  void PrepareContext(::grpc::ClientContext* context) const;
  absl::Status ToAbslStatus(const ::grpc::Status& status) const;
  // One unary Encoder call with this client's context (deadline, token).
  template <typename Response, typename Request>
  absl::StatusOr<Response> Unary(::grpc::Status (attnserve::v1::Encoder::Stub::*method)(
                                     ::grpc::ClientContext*, const Request&, Response*),
                                 const Request& request);

  std::string target_;
  ClientOptions options_;
  std::shared_ptr<::grpc::Channel> channel_;
  std::unique_ptr<attnserve::v1::Encoder::Stub> encoder_;
  std::unique_ptr<::grpc::health::v1::Health::Stub> health_;
};

// One fine-tuning job: a FineTune bidirectional stream. Obtained from TrainerClient::FineTune().
//
//   auto session = trainer.FineTune();
//   if (auto s = session->Start(config); !s.ok()) ...   // sends the FineTuneConfig
//   session->SendBatch(batch);                          // one optimisation step per batch
//   session->Read(&progress);                           // the server answers every batch
//   session->Commit("description");                     // or Abort(); both half-close
//   while (session->Read(&progress)) {}                 // the final message
//   absl::Status status = session->Finish();
//
// Send*, Commit and Abort return false once the stream is broken (the server ended the call,
// e.g. with an error for a bad batch); Read returns false at the end of the stream. Either way
// Finish() then gives the call's status. One thread may Read while another sends (the usual
// gRPC contract for a synchronous bidi stream); Cancel() may be called from any thread (a
// signal watcher, a watchdog). The stream itself has no deadline, as a job runs as long as it
// needs; ClientOptions::timeout bounds only the wait for a connection with wait_for_ready.
class FineTuneSession {
 public:
  ~FineTuneSession();
  FineTuneSession(const FineTuneSession&) = delete;
  FineTuneSession& operator=(const FineTuneSession&) = delete;

  // Opens the stream and sends `config`. An error is the call's final status (e.g.
  // UNAUTHENTICATED, UNAVAILABLE); the session is finished then.
  absl::Status Start(const attnserve::v1::FineTuneConfig& config);
  bool SendBatch(const attnserve::v1::TrainingBatch& batch);
  bool SendBatch(const std::vector<attnserve::v1::TrainingExample>& examples);
  // Publishes the trained weights as a new version, staged (pinnable, not the default) unless
  // `promote`, then half-closes the stream.
  bool Commit(const std::string& description = "", bool promote = false);
  // Stops and discards the job, then half-closes the stream.
  bool Abort();
  // The next progress message; false at the end of the stream (then call Finish()).
  bool Read(attnserve::v1::FineTuneProgress* progress);
  // Half-closes if still open, discards unread messages, and returns the call's status (the
  // same on every later call). A stream that was never started is FAILED_PRECONDITION.
  absl::Status Finish();
  // Cancels the call (thread-safe, idempotent); the server aborts the job. Finish() then
  // returns CANCELLED.
  void Cancel();

  bool started() const { return stream_ != nullptr; }
  bool half_closed() const { return half_closed_; }

 private:
  friend class TrainerClient;
  FineTuneSession(attnserve::v1::Trainer::Stub* stub, std::shared_ptr<::grpc::Channel> channel,
                  std::string target, ClientOptions options);
  bool Write(const attnserve::v1::FineTuneRequest& request);
  bool HalfClose();

  attnserve::v1::Trainer::Stub* stub_;
  std::shared_ptr<::grpc::Channel> channel_;
  std::string target_;
  ClientOptions options_;
  std::unique_ptr<::grpc::ClientContext> context_;
  std::unique_ptr<
      ::grpc::ClientReaderWriter<attnserve::v1::FineTuneRequest, attnserve::v1::FineTuneProgress>>
      stream_;
  std::mutex cancel_mu_;  // guards context_ against Cancel() during Start()
  std::atomic<bool> cancelled_{false};
  bool half_closed_ = false;
  bool finished_ = false;
  absl::Status final_status_;
};

// Blocking client for the attnserve.v1.Trainer service. Set ClientOptions::bearer_token: every
// Trainer call needs it.
class TrainerClient {
 public:
  TrainerClient(std::string target, ClientOptions options = {});
  TrainerClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                ClientOptions options = {});

  // A new, not yet started fine-tuning session (see FineTuneSession). The client must outlive
  // it.
  std::unique_ptr<FineTuneSession> FineTune();
  // `model`: a served model's name (--model NAME=DIR); "" = the server's default model.
  absl::StatusOr<attnserve::v1::ListVersionsResponse> ListVersions(const std::string& model = "");
  // Serves again the version served by default before the current one, or `version` (served
  // before) when not empty; never a version committed staged and never promoted.
  absl::StatusOr<attnserve::v1::ListVersionsResponse> Rollback(const std::string& version = "",
                                                               const std::string& model = "");
  absl::StatusOr<attnserve::v1::ListVersionsResponse> SetServingVersion(
      const std::string& version, const std::string& model = "");
  // What changed between two versions (read-only).
  absl::StatusOr<attnserve::v1::CompareVersionsResponse> CompareVersions(
      const attnserve::v1::CompareVersionsRequest& request);
  // A word's static and contextual neighbours in one version (read-only).
  absl::StatusOr<attnserve::v1::NeighborsResponse> Neighbors(
      const attnserve::v1::NeighborsRequest& request);
  // Serves a committed (staged) version by default, recorded in the server's model store.
  absl::StatusOr<attnserve::v1::ListVersionsResponse> Promote(const std::string& version,
                                                              const std::string& model = "");
  // The training report stored with a committed version (read-only).
  absl::StatusOr<attnserve::v1::TrainingReport> GetTrainingReport(const std::string& version,
                                                                  const std::string& model = "");
  // Scores a version on an evaluation set without training (read-only).
  absl::StatusOr<attnserve::v1::EvaluationResult> Evaluate(
      const attnserve::v1::EvaluateRequest& request);

  // Server-side jobs. CreateJob sends `spec` (its dataset field set from `examples`, see
  // EncodeJobDataset), and once the server has accepted it (a refused spec costs no upload)
  // uploads the examples in chunks; the job as created. The upload has no deadline.
  absl::StatusOr<attnserve::v1::Job> CreateJob(
      attnserve::v1::JobSpec spec, const std::vector<attnserve::v1::TrainingExample>& examples);
  absl::StatusOr<attnserve::v1::Job> GetJob(const std::string& job_id,
                                            const std::string& model = "");
  absl::StatusOr<attnserve::v1::ListJobsResponse> ListJobs(const std::string& model = "");
  // Answers once the job has stopped (a running one finishes its current step first).
  absl::StatusOr<attnserve::v1::Job> CancelJob(const std::string& job_id,
                                               const std::string& model = "");
  // Calls `on_event` with the job's events from `from_index` on, then with each new one, until
  // the job's last event (OK), an error, or `on_event` returns false (CANCELLED). No deadline.
  absl::Status WatchJob(const std::string& job_id, const std::string& model, int64_t from_index,
                        const std::function<bool(const attnserve::v1::JobEvent&)>& on_event);

  const std::string& target() const { return target_; }
  const ClientOptions& options() const { return options_; }

 private:
  // One unary Trainer call with this client's context (deadline, token).
  template <typename Response, typename Request>
  absl::StatusOr<Response> Unary(::grpc::Status (attnserve::v1::Trainer::Stub::*method)(
                                     ::grpc::ClientContext*, const Request&, Response*),
                                 const Request& request);

  std::string target_;
  ClientOptions options_;
  std::shared_ptr<::grpc::Channel> channel_;
  std::unique_ptr<attnserve::v1::Trainer::Stub> trainer_;
};

// Creates the channel EncoderClient uses for `target` with `options` (message size limits,
// credentials).
std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target,
                                               const ClientOptions& options);

// True if `status` came from a call that never reached a server (connection refused, DNS
// failure, TLS handshake failure), as opposed to an UNAVAILABLE answered by a server that is
// loading or draining. Set by EncoderClient as a status payload.
bool IsUnreachable(const absl::Status& status);

// Maps a gRPC status to the absl status with the same code and message. OK -> OkStatus().
absl::Status FromGrpcStatus(const ::grpc::Status& status);

}  // namespace attn::client
