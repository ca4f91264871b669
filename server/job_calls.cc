#include "server/job_calls.h"

#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/core/job_dataset.h"
#include "server/core/job_runner.h"
#include "server/job_convert.h"
#include "server/request_parse.h"
#include "server/status_map.h"
#include "server/trainer_service.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

namespace {

// The reactors' answers as bytes (a write's buffer must live until the write is done).
void Serialize(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  out->Clear();
  bool own_buffer = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, out, &own_buffer);
}

}  // namespace

// CreateJob: the spec, answered with the job's id once the core accepted it (before any chunk
// is read: a refused spec costs the client no upload), then the chunks, each checked and
// written as it arrives, then the job. Like FineTuneReactor, exactly one of a read, a write or
// nothing (finished) is in flight, so the members are touched by one thread at a time.
class CreateJobReactor final : public RawMethods::BidiReactor {
 public:
  CreateJobReactor(TrainerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    if (absl::Status auth = service_->Authorize(*context); !auth.ok()) {
      End(auth);
      return;
    }
    idle_ = service_->idle_watchdog_.Start([context] { context->TryCancel(); });
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    idle_->Received();
    if (!ok) {
      if (idle_->timed_out()) {
        End(IdleTimeout("CreateJob", service_->idle_watchdog_.timeout(),
                        upload_ == nullptr ? "the spec" : "the next chunk",
                        upload_ == nullptr ? std::string("no job was created")
                                           : absl::StrCat("job ", upload_->id(),
                                                          " was not created; its queue place is "
                                                          "free")));
      } else if (context_->IsCancelled()) {
        End(
            absl::CancelledError("the call was cancelled (by the client, its deadline or a server "
                                 "shutdown); no job was created"));
      } else if (upload_ == nullptr) {
        End(absl::InvalidArgumentError("the stream ended before a spec; no job was created"));
      } else {
        // Half-closed before every declared byte arrived: Finish says how many did.
        absl::StatusOr<core::JobView> job = upload_->Finish();
        EndUpload(job.ok() ? absl::InternalError("the upload ended early but was complete")
                           : job.status());
      }
      return;
    }
    if (absl::Status size = CheckRequestSize(static_cast<int64_t>(request_bytes_.Length()),
                                             service_->options_.max_message_bytes);
        !size.ok()) {
      End(size);
      return;
    }
    request_.Clear();
    if (absl::Status parsed = ParseRequestBytes(request_bytes_, &request_); !parsed.ok()) {
      End(parsed);
      return;
    }
    switch (request_.message_case()) {
      case v1::CreateJobRequest::kSpec:
        HandleSpec();
        return;
      case v1::CreateJobRequest::kChunk:
        HandleChunk();
        return;
      case v1::CreateJobRequest::MESSAGE_NOT_SET:
        End(absl::InvalidArgumentError("empty CreateJobRequest: set spec (first), then chunk"));
        return;
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the client went away; no job was created"));
      return;
    }
    ReadNext();
  }

  void OnDone() override { delete this; }

 private:
  // The client's next message, on the idle clock (--stream-idle-timeout-s).
  void ReadNext() {
    idle_->Waiting();
    StartRead(&request_bytes_);
  }

  void HandleSpec() {
    if (upload_ != nullptr) {
      End(absl::InvalidArgumentError(absl::StrCat("a second spec in the upload of job ",
                                                  upload_->id(),
                                                  ": send one spec, then the dataset's chunks")));
      return;
    }
    absl::StatusOr<core::JobSpec> spec = ToCore(request_.spec());
    if (!spec.ok()) {
      End(spec.status());
      return;
    }
    absl::StatusOr<core::JobRunner*> runner = service_->Jobs(request_.spec().config().model());
    if (!runner.ok()) {
      End(runner.status());
      return;
    }
    absl::StatusOr<std::unique_ptr<core::JobUpload>> upload =
        (*runner)->BeginUpload(*std::move(spec), request_.spec().SerializeAsString());
    if (!upload.ok()) {
      End(upload.status());
      return;
    }
    upload_ = *std::move(upload);
    v1::CreateJobResponse accepted;
    accepted.set_job_id(upload_->id());
    accepted.set_max_chunk_bytes(core::kMaxChunkBytes);
    Serialize(accepted, &response_bytes_);
    StartWrite(&response_bytes_);
  }

  void HandleChunk() {
    if (upload_ == nullptr) {
      End(absl::InvalidArgumentError(
          "a chunk before the spec: the first message must be a spec (JobSpec), then the "
          "dataset's chunks"));
      return;
    }
    const v1::DatasetChunk& chunk = request_.chunk();
    if (absl::Status added = upload_->Add(chunk.index(), chunk.data()); !added.ok()) {
      EndUpload(added);
      return;
    }
    if (!upload_->complete()) {
      ReadNext();
      return;
    }
    absl::StatusOr<core::JobView> job = upload_->Finish();
    if (!job.ok()) {
      EndUpload(job.status());
      return;
    }
    v1::CreateJobResponse created;
    ToProto(*job, created.mutable_job());
    Serialize(created, &response_bytes_);
    Record(grpc::StatusCode::OK);
    StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void Record(grpc::StatusCode code) {
    service_->metrics_->RecordStream(
        "CreateJob", code, std::chrono::duration<double>(Clock::now() - received_).count());
  }

  // Ends the call with the upload's error, naming the job it would have been.
  void EndUpload(const absl::Status& status) {
    End(absl::Status(status.code(), absl::StrCat("job ", upload_->id(), ": ", status.message(),
                                                 status.code() == absl::StatusCode::kInvalidArgument
                                                     ? "; no job was created"
                                                     : "")));
  }

  // Ends the call with `status` (the upload, if any, is dropped with the reactor). Must be the
  // caller's last use of `this`.
  void End(const absl::Status& absl_status) {
    const grpc::Status status = ToGrpcStatus(absl_status);
    Record(status.error_code());
    Finish(status);
  }

  TrainerService* const service_;
  grpc::CallbackServerContext* const context_;
  const Clock::time_point received_ = Clock::now();
  grpc::ByteBuffer request_bytes_;
  v1::CreateJobRequest request_;
  grpc::ByteBuffer response_bytes_;
  std::unique_ptr<core::JobUpload> upload_;          // null until the spec is accepted
  std::unique_ptr<StreamIdleWatchdog::Watch> idle_;  // the idle clock of the client's messages
};

// WatchJob: the job's events from the requested index, read from the runner in small batches,
// then, while the job has not ended, each new one as the runner announces it. The reactor's
// state is guarded by one mutex shared with the runner's listener (which may call at any time
// until the reactor is done), in a block that outlives the reactor.
class WatchJobReactor final : public RawMethods::WriteReactor {
 public:
  WatchJobReactor(TrainerService* service, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request_bytes)
      : service_(service), shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    absl::Status status = service_->Authorize(*context);
    v1::WatchJobRequest request;
    if (status.ok()) status = ParseRequestBytes(*request_bytes, &request);
    if (status.ok() && request.from_index() < 0) {
      status = absl::InvalidArgumentError(absl::StrCat("from_index is ", request.from_index(),
                                                       "; give 0 (every event) or the next index"));
    }
    absl::StatusOr<core::JobRunner*> runner =
        status.ok() ? service_->FindJob(request.model(), request.job_id())
                    : absl::StatusOr<core::JobRunner*>(status);
    std::shared_ptr<Shared> shared = shared_;
    absl::MutexLock lock(&shared->mutex);
    if (!runner.ok()) {
      EndLocked(runner.status());
      return;
    }
    runner_ = *runner;
    job_id_ = request.job_id();
    next_ = request.from_index();
    listener_ = std::make_shared<std::function<void()>>([shared] {
      absl::MutexLock lock(&shared->mutex);
      if (shared->reactor != nullptr) shared->reactor->PumpLocked();
    });
    runner_->Listen(job_id_, listener_);
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<Shared> shared = shared_;
    absl::MutexLock lock(&shared->mutex);
    writing_ = false;
    if (!ok) {
      EndLocked(absl::CancelledError(absl::StrCat("the watcher went away; resume with from_index ",
                                                  next_ - static_cast<int64_t>(buffered_.size()))));
      return;
    }
    buffered_.pop_front();
    PumpLocked();
  }

  void OnCancel() override {
    std::shared_ptr<Shared> shared = shared_;
    absl::MutexLock lock(&shared->mutex);
    // A write in flight completes (not ok) first; OnWriteDone ends the call then.
    if (!writing_) EndLocked(absl::CancelledError("the watch was cancelled"));
  }

  void OnDone() override {
    {
      std::shared_ptr<Shared> shared = shared_;
      absl::MutexLock lock(&shared->mutex);
      shared->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Shared {
    absl::Mutex mutex;
    WatchJobReactor* reactor = nullptr;  // null once the call is done
  };

  // Sends the next event, reading more first when none is buffered; ends the call after the
  // job's last event. With nothing to send yet, the listener calls again.
  void PumpLocked() {
    if (finished_ || writing_) return;
    if (buffered_.empty() && !ended_) {
      absl::StatusOr<core::JobRunner::Events> events =
          runner_->ReadEvents(job_id_, next_, /*max_events=*/64, /*max_bytes=*/1 << 20);
      if (!events.ok()) {
        EndLocked(events.status());
        return;
      }
      for (std::string& event : events->encoded) buffered_.push_back(std::move(event));
      next_ = events->next;
      ended_ = events->ended;
    }
    if (!buffered_.empty()) {
      grpc::Slice slice(buffered_.front());
      event_bytes_ = grpc::ByteBuffer(&slice, 1);
      writing_ = true;
      StartWrite(&event_bytes_);
      return;
    }
    if (ended_) EndLocked(absl::OkStatus());
  }

  void EndLocked(const absl::Status& absl_status) {
    if (finished_) return;
    finished_ = true;
    const grpc::Status status = ToGrpcStatus(absl_status);
    service_->metrics_->RecordStream(
        "WatchJob", status.error_code(),
        std::chrono::duration<double>(Clock::now() - received_).count());
    Finish(status);
  }

  TrainerService* const service_;
  const Clock::time_point received_ = Clock::now();
  const std::shared_ptr<Shared> shared_;
  std::shared_ptr<std::function<void()>> listener_;  // the runner holds it weakly
  core::JobRunner* runner_ = nullptr;
  std::string job_id_;
  int64_t next_ = 0;  // the index after the last event read
  std::deque<std::string> buffered_;
  bool ended_ = false;  // the buffered events are the job's last
  bool writing_ = false;
  bool finished_ = false;
  grpc::ByteBuffer event_bytes_;
};

RawMethods::BidiReactor* NewCreateJobReactor(TrainerService* service,
                                             grpc::CallbackServerContext* context) {
  return new CreateJobReactor(service, context);
}

RawMethods::WriteReactor* NewWatchJobReactor(TrainerService* service,
                                             grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request) {
  return new WatchJobReactor(service, context, request);
}

// ---- TrainerService's job calls -------------------------------------------------------------

absl::Status TrainerService::StartJobs() {
  for (auto& [model, runner] : jobs_) {
    if (absl::Status started = runner->Start(); !started.ok()) {
      return absl::Status(started.code(),
                          absl::StrCat("model ", model, "'s jobs: ", started.message()));
    }
  }
  return absl::OkStatus();
}

void TrainerService::StopJobs() {
  for (auto& [model, runner] : jobs_) runner->Stop();
}

absl::StatusOr<core::JobRunner*> TrainerService::Jobs(const std::string& model) const {
  absl::StatusOr<ModelJobs> found = Find(model);
  if (!found.ok()) return found.status();
  return jobs_.at(found->served->name).get();
}

absl::StatusOr<core::JobRunner*> TrainerService::FindJob(const std::string& model,
                                                         const std::string& id) const {
  if (absl::Status valid = core::ValidateJobId(id); !valid.ok()) return valid;
  absl::StatusOr<core::JobRunner*> runner = Jobs(model);
  if (!runner.ok()) return runner.status();
  absl::StatusOr<core::JobView> job = (*runner)->Get(id);
  if (job.ok()) return *runner;
  if (job.status().code() != absl::StatusCode::kNotFound) return job.status();
  for (const auto& [name, other] : jobs_) {
    if (other.get() != *runner && other->Get(id).ok()) {
      return absl::NotFoundError(absl::StrCat(
          "job ", id, " is a job of model ", name, ", not of model ",
          model.empty() ? absl::StrCat(models_->models().front().name, " (the default)") : model,
          "; ask with model '", name, "'"));
    }
  }
  return job.status();
}

absl::Status TrainerService::HandleGetJob(const v1::GetJobRequest& request, v1::Job* response) {
  absl::StatusOr<core::JobRunner*> runner = FindJob(request.model(), request.job_id());
  if (!runner.ok()) return runner.status();
  absl::StatusOr<core::JobView> job = (*runner)->Get(request.job_id());
  if (!job.ok()) return job.status();
  ToProto(*job, response);
  absl::StatusOr<std::string> spec = (*runner)->Spec(request.job_id());
  if (spec.ok()) response->mutable_spec()->ParseFromString(*spec);
  return absl::OkStatus();
}

absl::Status TrainerService::HandleListJobs(const v1::ListJobsRequest& request,
                                            v1::ListJobsResponse* response) {
  absl::StatusOr<core::JobRunner*> runner = Jobs(request.model());
  if (!runner.ok()) return runner.status();
  // A server without a store (or following another's) says why instead of listing nothing.
  if (absl::Status usable = (*runner)->Usable(); !usable.ok()) return usable;
  for (const core::JobView& job : (*runner)->List()) ToProto(job, response->add_jobs());
  response->set_queued((*runner)->queued());
  response->set_max_queued_jobs((*runner)->max_queued_jobs());
  return absl::OkStatus();
}

void TrainerService::HandleCancelJob(std::shared_ptr<UnaryCall> call,
                                     const v1::CancelJobRequest& request) {
  absl::StatusOr<core::JobRunner*> runner = FindJob(request.model(), request.job_id());
  if (!runner.ok()) {
    call->Finish(runner.status());
    return;
  }
  (*runner)->Cancel(request.job_id(), [call](absl::StatusOr<core::JobView> job) {
    if (!job.ok()) {
      call->Finish(job.status());
      return;
    }
    v1::Job response;
    ToProto(*job, &response);
    call->Finish(absl::OkStatus(), response);
  });
}

}  // namespace attn::server
