#include "server/fine_tune_reactor.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/fine_tuning.h"
#include "server/fine_tune_convert.h"
#include "server/request_parse.h"
#include "server/status_map.h"
#include "server/trainer_service.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

// FineTune: one job per stream, an adapter over the core's FineTuneJob (messages to core
// structs, core answers to messages and stream turns).
//
// At any moment exactly one of these is in flight: a read, a write, or a job call (whose answer
// comes on the training thread) (or the stream is finished). Each step hands over to the next,
// so the reactor's members are only ever touched by one thread at a time and Finish is called
// exactly once, as the last action of whoever holds the turn; OnCancel only sets a flag that the
// next step (and the job, through its CallControl) checks.
//
// Messages travel as raw bytes parsed here (ParseRequestBytes): gRPC's typed reader reports a
// message it cannot decode exactly like the end of the stream, so a client sending invalid
// UTF-8 would hear "the stream ended" instead of what is wrong.
class FineTuneReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  FineTuneReactor(TrainerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    control_.is_cancelled = [this] { return cancelled_.load(); };
    if (absl::Status auth = service_->Authorize(*context); !auth.ok()) {
      End(auth, "");
      return;
    }
    idle_ = service_->idle_watchdog_.Start([context] { context->TryCancel(); });
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    idle_->Received();
    if (!ok && idle_->timed_out()) {
      End(IdleTimeout("FineTune", service_->idle_watchdog_.timeout(),
                      job_ == nullptr ? "the config" : "the next batch, commit or abort",
                      job_ == nullptr ? std::string("no job was started")
                                      : absl::StrCat("job ", job_->id(),
                                                     " discarded; the model's fine-tuning slot "
                                                     "is free")),
          "cancelled");
      return;
    }
    if (!ok) {
      // The client half-closed, cancelled, hit its deadline, or the server is shutting down.
      const char* why = context_->IsCancelled()
                            ? "the call was cancelled (by the client, its deadline or a server "
                              "shutdown)"
                            : "the request stream ended without commit or abort";
      End(absl::CancelledError(job_ == nullptr
                                   ? absl::StrCat(why, " before a config")
                                   : absl::StrCat(why, "; job ", job_->id(), " discarded")),
          "cancelled");
      return;
    }
    if (cancelled_.load()) {
      EndCancelled();
      return;
    }
    request_.Clear();
    if (absl::Status parsed = ParseRequestBytes(request_bytes_, &request_); !parsed.ok()) {
      End(parsed, "failed");
      return;
    }
    switch (request_.message_case()) {
      case v1::FineTuneRequest::kConfig:
        if (job_ != nullptr) {
          End(absl::InvalidArgumentError(
                  absl::StrCat("a second config in job ", job_->id(),
                               ": a stream runs one job; after the config send batches, then "
                               "commit or abort")),
              "failed");
          return;
        }
        HandleConfig();
        return;
      case v1::FineTuneRequest::MESSAGE_NOT_SET:
        End(absl::InvalidArgumentError("empty FineTuneRequest: set config, batch, commit or abort"),
            "failed");
        return;
      default:
        break;
    }
    if (job_ == nullptr) {
      End(absl::InvalidArgumentError(
              "the first message must be a config (FineTuneConfig), then batches, then "
              "commit or abort"),
          "");
      return;
    }
    switch (request_.message_case()) {
      case v1::FineTuneRequest::kBatch:
        HandleBatch();
        return;
      case v1::FineTuneRequest::kCommit:
        job_->Commit(ToCore(request_.commit()), control_,
                     [this](auto progress) { Answer(std::move(progress), "committed"); });
        return;
      case v1::FineTuneRequest::kAbort:
        if (!request_.abort()) {
          End(absl::InvalidArgumentError("abort is false; send abort: true to stop the job"),
              "failed");
          return;
        }
        Answer(job_->Abort(), "aborted");
        return;
      default:
        return;
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      EndCancelled();
      return;
    }
    ReadNext();
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    // End() has ended the job on every path; destroying it frees the slot if one was missed.
    delete this;
  }

 private:
  // The client's next message, on the idle clock (--stream-idle-timeout-s).
  void ReadNext() {
    idle_->Waiting();
    StartRead(&request_bytes_);
  }

  void HandleConfig() {
    absl::StatusOr<core::FineTuneConfig> config = ToCore(request_.config());
    // The model first: its name decides which model's versions the job starts from.
    absl::StatusOr<TrainerService::ModelJobs> model = service_->Find(request_.config().model());
    if (config.ok() && !model.ok()) config = model.status();
    absl::StatusOr<std::unique_ptr<core::FineTuneJob>> job =
        config.ok() ? model->fine_tuning->Begin(*config)
                    : absl::StatusOr<std::unique_ptr<core::FineTuneJob>>(config.status());
    if (!job.ok()) {
      End(job.status(), "");
      return;
    }
    job_ = *std::move(job);
    job_->Prepare(control_, [this](absl::Status prepared) {
      if (cancelled_.load()) return EndCancelled();
      if (!prepared.ok()) return End(prepared, "failed");
      ReadNext();
    });
  }

  void HandleBatch() {
    const int64_t bytes = static_cast<int64_t>(request_.ByteSizeLong());
    if (bytes > service_->options_.max_message_bytes) {
      End(absl::ResourceExhaustedError(
              absl::StrCat("batch ", job_->steps() + 1, " is ", bytes, " bytes, more than the ",
                           service_->options_.max_message_bytes,
                           "-byte limit (--max-message-bytes); send smaller batches")),
          "failed");
      return;
    }
    job_->Step(ToCore(request_.batch()), control_, [this](auto progress) {
      if (cancelled_.load()) return EndCancelled();
      if (!progress.ok()) return End(progress.status(), "failed");
      ToProto(*progress, &progress_);
      StartWrite(SerializedProgress());
    });
  }

  // Ends the stream with the job's final `progress` and `outcome`, or its error as "failed".
  void Answer(absl::StatusOr<core::FineTuneProgress> progress, const char* outcome) {
    if (cancelled_.load()) return EndCancelled();
    if (!progress.ok()) return End(progress.status(), "failed");
    ToProto(*progress, &progress_);
    Release(grpc::StatusCode::OK, outcome, absl::OkStatus());
    StartWriteAndFinish(SerializedProgress(), grpc::WriteOptions(), grpc::Status::OK);
  }

  void EndCancelled() {
    End(absl::CancelledError(job_ == nullptr ? std::string("cancelled by the client")
                                             : absl::StrCat("cancelled by the client; job ",
                                                            job_->id(), " discarded")),
        "cancelled");
  }

  // Records the call and ends the job with `outcome` (ignored when no job was started).
  void Release(grpc::StatusCode code, const char* outcome, const absl::Status& status) {
    service_->metrics_->RecordStream(
        "FineTune", code, std::chrono::duration<double>(Clock::now() - received_).count());
    if (job_ != nullptr) job_->End(outcome, status);
  }

  // Ends the stream with `status`. Must be the caller's last use of `this`.
  void End(const absl::Status& absl_status, const char* outcome) {
    const grpc::Status status = ToGrpcStatus(absl_status);
    Release(status.error_code(), outcome, absl_status);
    Finish(status);
  }

  // progress_ as the bytes to send (the previous write, if any, is done with the buffer).
  const grpc::ByteBuffer* SerializedProgress() {
    progress_bytes_.Clear();
    bool own_buffer = false;
    grpc::SerializationTraits<v1::FineTuneProgress>::Serialize(progress_, &progress_bytes_,
                                                               &own_buffer);
    return &progress_bytes_;
  }

  TrainerService* const service_;
  grpc::CallbackServerContext* const context_;
  const Clock::time_point received_ = Clock::now();
  std::atomic<bool> cancelled_{false};
  core::CallControl control_;
  grpc::ByteBuffer request_bytes_;
  v1::FineTuneRequest request_;
  v1::FineTuneProgress progress_;
  grpc::ByteBuffer progress_bytes_;
  std::unique_ptr<core::FineTuneJob> job_;           // null = no config yet
  std::unique_ptr<StreamIdleWatchdog::Watch> idle_;  // the idle clock of the client's messages
};

RawMethods::BidiReactor* NewFineTuneReactor(TrainerService* service,
                                            grpc::CallbackServerContext* context) {
  return new FineTuneReactor(service, context);
}

}  // namespace attn::server
