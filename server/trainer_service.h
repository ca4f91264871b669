// attnserve.v1.Trainer over the gRPC callback API: fine-tuning jobs (FineTune, a bidirectional
// stream, an adapter over the core's FineTuneJob: server/core/fine_tuning.h) and model versions
// (ListVersions, Rollback, SetServingVersion, Promote), and the read-only analysis of versions
// (CompareVersions, Neighbors, Evaluate).
//
// Threads: gRPC threads only validate messages and move them along; every engine step runs on
// the core's training thread with --trainer-threads OpenMP threads, so training leaves the other
// cores to the batcher that serves Encode/AttentionMap. One job runs at a time per model: an
// interactive FineTune stream, or a server-side job from the model's queue (CreateJob).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "server/core/calls.h"
#include "server/core/fine_tuning.h"
#include "server/core/job_runner.h"
#include "server/core/model_registry.h"
#include "server/core/model_set.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/raw_method.h"
#include "server/stream_idle_watchdog.h"

namespace attn::server {

class TrainerService final : public attnserve::v1::Trainer::CallbackService {
 public:
  // `token` unset = the service is disabled (every call answers UNIMPLEMENTED). Starts the
  // training thread (core::FineTuning); destroying the service stops it, so destroy it after
  // the gRPC server has shut down. FineTune streams are served by fine_tune_reactor.cc.
  // Each served model in `models` gets its own jobs (one at a time per model), versions and
  // model store directory (ServedModel::store).
  TrainerService(const ServerOptions& options, std::optional<std::string> token,
                 const ModelSet* models, Metrics* metrics);

  // The sequence number the next commit of `model` gets (1 + the highest one in its store).
  void SetNextSequence(const std::string& model, int64_t sequence);

  // Server-side jobs (job_calls.cc, core/job_runner.h). StartJobs once the model store is
  // loaded: each model's runner records the jobs a previous stop left pending or running as
  // failed, then runs the queue. StopJobs before the gRPC server shuts down: running and queued
  // jobs end as failed ("the server shut down") and watchers get that last event.
  absl::Status StartJobs();
  void StopJobs();

 private:
  friend class FineTuneReactor;
  friend class CreateJobReactor;
  friend class WatchJobReactor;

  // A request's model (empty = the default): its registry and its jobs; NOT_FOUND naming the
  // served models.
  struct ModelJobs {
    const ServedModel* served = nullptr;
    core::FineTuning* fine_tuning = nullptr;
  };
  absl::StatusOr<ModelJobs> Find(const std::string& model) const;

  // OK, or UNIMPLEMENTED (no token configured), UNAUTHENTICATED or PERMISSION_DENIED.
  absl::Status Authorize(const grpc::CallbackServerContext& context) const;
  static void FillVersions(const ServedModel& served,
                           attnserve::v1::ListVersionsResponse* response);

  // ListVersions, Rollback and SetServingVersion: each registered by the constructor (through
  // ServeVersionsMethod) in place of the generated typed handler, so that request bytes gRPC
  // could not decode get INVALID_ARGUMENT naming the problem, not a bare UNIMPLEMENTED. Called
  // after authorization and parsing; they fill `response` when they return OK.
  template <typename Request, typename Response>
  using VersionsHandler = absl::Status (TrainerService::*)(const Request& request,
                                                           Response* response);
  template <typename Request, typename Response = attnserve::v1::ListVersionsResponse>
  void ServeVersionsMethod(const char* method, VersionsHandler<Request, Response> handler);
  absl::Status HandleListVersions(const attnserve::v1::ListVersionsRequest& request,
                                  attnserve::v1::ListVersionsResponse* response);
  absl::Status HandleRollback(const attnserve::v1::RollbackRequest& request,
                              attnserve::v1::ListVersionsResponse* response);
  absl::Status HandleSetServingVersion(const attnserve::v1::SetServingVersionRequest& request,
                                       attnserve::v1::ListVersionsResponse* response);
  absl::Status HandleGetTrainingReport(const attnserve::v1::GetTrainingReportRequest& request,
                                       attnserve::v1::TrainingReport* response);

  // Registers `method` as a raw-bytes unary method: authorization, size check and parsing
  // (server/raw_method.h), then `handle`, which must finish the call.
  template <typename Request>
  using UnaryHandler = std::function<void(std::shared_ptr<UnaryCall> call, const Request& request)>;
  template <typename Request>
  void ServeUnary(const char* method, UnaryHandler<Request> handle, bool answer_dropped = false);
  // CompareVersions, Neighbors (server/core/version_compare.h) and Evaluate
  // (server/core/evaluation.h): read-only, authorized like ListVersions; the core call finishes
  // the call from the batcher thread.
  template <typename CoreRequest, typename CoreResponse>
  using AnalysisCall = void (*)(const ModelSet& models, const CoreRequest& request,
                                const core::CallControl& control,
                                std::function<void(absl::StatusOr<CoreResponse>)> done);
  template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
  void ServeAnalysisMethod(const char* method, AnalysisCall<CoreRequest, CoreResponse> core_call);
  absl::Status HandlePromote(const attnserve::v1::PromoteRequest& request,
                             attnserve::v1::ListVersionsResponse* response);
  // SetServingVersion and Promote: the one way a named version becomes the default.
  absl::Status ServeVersion(const char* action, const std::string& version,
                            const std::string& model,
                            attnserve::v1::ListVersionsResponse* response);

  // GetJob, ListJobs, CancelJob (job_calls.cc, like the CreateJob and WatchJob reactors).
  absl::Status HandleGetJob(const attnserve::v1::GetJobRequest& request,
                            attnserve::v1::Job* response);
  absl::Status HandleListJobs(const attnserve::v1::ListJobsRequest& request,
                              attnserve::v1::ListJobsResponse* response);
  // Finishes `call` once the job has stopped.
  void HandleCancelJob(std::shared_ptr<UnaryCall> call,
                       const attnserve::v1::CancelJobRequest& request);
  // The job runner of `model` ("" = the default); NOT_FOUND naming the served models.
  absl::StatusOr<core::JobRunner*> Jobs(const std::string& model) const;
  // The runner of `model` that has job `id`: INVALID_ARGUMENT for a malformed id, NOT_FOUND
  // (naming the model that has it, if another one does) when `model` has no such job.
  absl::StatusOr<core::JobRunner*> FindJob(const std::string& model, const std::string& id) const;

  const ServerOptions options_;
  const std::optional<std::string> token_;
  const ModelSet* const models_;
  Metrics* const metrics_;
  // Cancels FineTune and CreateJob streams whose client went quiet (--stream-idle-timeout-s).
  StreamIdleWatchdog idle_watchdog_;
  // Last: destroyed first, their training threads running the tasks still queued while the
  // members they use live. One per served model, by name.
  std::map<std::string, std::unique_ptr<core::FineTuning>> fine_tuning_;
  // Destroyed before the FineTuning they run their jobs through.
  std::map<std::string, std::unique_ptr<core::JobRunner>> jobs_;
};

}  // namespace attn::server
