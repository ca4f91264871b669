#include "server/fine_tune_reactor.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/trainer.h"
#include "server/fine_tune_job.h"
#include "server/request_parse.h"
#include "server/status_map.h"
#include "server/store_versions.h"
#include "server/trainer_service.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

namespace {

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

// FineTune: one job per stream.
//
// At any moment exactly one of these is in flight: a read, a write, or a task on the training
// thread (or the stream is finished). Each step hands over to the next, so the job's members
// are only ever touched by one thread at a time and Finish is called exactly once, as the last
// action of whoever holds the turn; OnCancel only sets a flag that the next step checks.
//
// Messages travel as raw bytes parsed here (ParseRequestBytes): gRPC's typed reader reports a
// message it cannot decode exactly like the end of the stream, so a client sending invalid
// UTF-8 would hear "the stream ended" instead of what is wrong.
class FineTuneReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  FineTuneReactor(TrainerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    if (absl::Status auth = service_->Authorize(*context); !auth.ok()) {
      End(auth, "");
      return;
    }
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, cancelled, hit its deadline, or the server is shutting down.
      const char* why = context_->IsCancelled()
                            ? "the call was cancelled (by the client, its deadline or a server "
                              "shutdown)"
                            : "the request stream ended without commit or abort";
      End(absl::CancelledError(job_id_.empty()
                                   ? absl::StrCat(why, " before a config")
                                   : absl::StrCat(why, "; job ", job_id_, " discarded")),
          job_id_.empty() ? "" : "cancelled");
      return;
    }
    if (cancelled_.load()) {
      EndCancelled();
      return;
    }
    request_.Clear();
    if (absl::Status parsed = ParseRequestBytes(request_bytes_, &request_); !parsed.ok()) {
      End(parsed, job_id_.empty() ? "" : "failed");
      return;
    }
    switch (request_.message_case()) {
      case v1::FineTuneRequest::kConfig:
        if (!job_id_.empty()) {
          End(absl::InvalidArgumentError(
                  absl::StrCat("a second config in job ", job_id_,
                               ": a stream runs one job; after the config send batches, then "
                               "commit or abort")),
              "failed");
          return;
        }
        HandleConfig();
        return;
      case v1::FineTuneRequest::MESSAGE_NOT_SET:
        End(absl::InvalidArgumentError("empty FineTuneRequest: set config, batch, commit or abort"),
            job_id_.empty() ? "" : "failed");
        return;
      default:
        break;
    }
    if (job_id_.empty()) {
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
        HandleCommit();
        return;
      case v1::FineTuneRequest::kAbort:
        if (!request_.abort()) {
          End(absl::InvalidArgumentError("abort is false; send abort: true to stop the job"),
              "failed");
          return;
        }
        trainer_.reset();
        FillProgress(&progress_);
        EndWithProgress("aborted");
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
    StartRead(&request_bytes_);
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    // End() has released the job on every path; this only guards against a missed one.
    if (!job_released_ && !job_id_.empty()) service_->EndJob(job_id_);
    delete this;
  }

 private:
  void HandleConfig() {
    const v1::FineTuneConfig& config = request_.config();
    if (!config.base_version().empty()) {
      if (absl::Status name = ValidateVersionName(config.base_version()); !name.ok()) {
        End(absl::InvalidArgumentError(absl::StrCat("config.base_version: ", name.message())), "");
        return;
      }
    }
    absl::StatusOr<ModelVersion> base = service_->registry_->Get(config.base_version());
    if (!base.ok()) {
      End(base.status(), "");
      return;
    }
    absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, *base->model);
    if (!settings.ok()) {
      End(settings.status(), "");
      return;
    }
    absl::StatusOr<std::string> job_id = service_->StartJob();
    if (!job_id.ok()) {
      End(job_id.status(), "");
      return;
    }
    job_id_ = *job_id;
    base_ = *base;
    settings_ = *settings;
    Log(LogLevel::kInfo, "fine-tuning job %s started: %s from version %s (lr %g)", job_id_,
        ObjectiveName(settings_.objective), base_.version, settings_.trainer.adamw.lr);
    // Copying the weights (and the optimiser set-up) is engine work: training thread.
    service_->training_thread_.Post([this] {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(base_.model, settings_.trainer);
      if (!trainer.ok()) {
        End(trainer.status(), "failed");
        return;
      }
      trainer_ = std::move(*trainer);
      StartRead(&request_bytes_);
    });
  }

  void HandleBatch() {
    const int limit = service_->options_.max_inputs_per_request;
    const int64_t bytes = static_cast<int64_t>(request_.ByteSizeLong());
    if (bytes > service_->options_.max_message_bytes) {
      End(absl::ResourceExhaustedError(
              absl::StrCat("batch ", steps_ + 1, " is ", bytes, " bytes, more than the ",
                           service_->options_.max_message_bytes,
                           "-byte limit (--max-message-bytes); send smaller batches")),
          "failed");
      return;
    }
    if (absl::Status shape = CheckBatchShape(request_.batch(), steps_ + 1, limit); !shape.ok()) {
      End(shape, "failed");
      return;
    }
    std::vector<std::string> warnings = BatchWarnings(request_.batch(), settings_, steps_ + 1);
    service_->training_thread_.Post([this, warnings = std::move(warnings)]() mutable {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      TrainingBatch batch;
      if (absl::Status converted =
              ConvertBatch(request_.batch(), settings_, *base_.model, steps_ + 1, &batch);
          !converted.ok()) {
        End(converted, "failed");
        return;
      }
      absl::StatusOr<StepResult> step = trainer_->Step(batch);
      if (!step.ok()) {
        End(StepFailure(step.status(),
                        absl::StrCat("job ", job_id_, " stopped at batch ", steps_ + 1, ": ",
                                     step.status().message(),
                                     ". Nothing was committed; the served version is "
                                     "unchanged")),
            "failed");
        return;
      }
      steps_ = step->step;
      examples_seen_ += step->examples;
      last_ = *step;
      service_->metrics_->RecordFineTuneStep(step->examples, step->loss);
      Log(LogLevel::kDebug, "job %s step %d: loss %.5f, grad norm %.4f, %d examples in %.3f s",
          job_id_, steps_, step->loss, step->grad_norm, step->examples, step->seconds);
      zero_loss_steps_ = step->loss == 0.0 ? zero_loss_steps_ + 1 : 0;
      if (zero_loss_steps_ == kZeroLossSteps) {
        warnings.push_back(absl::StrCat(
            "the loss has been exactly 0 for ", kZeroLossSteps, " steps in a row (steps ",
            steps_ - kZeroLossSteps + 1, " to ", steps_,
            "): these batches give no gradient signal; check that the examples differ and, for "
            "CONTRASTIVE, that batches hold several unrelated pairs"));
      }
      FillProgress(&progress_);
      Warn(warnings);
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      StartWrite(SerializedProgress());
    });
  }

  void HandleCommit() {
    if (steps_ == 0) {
      End(absl::FailedPreconditionError(
              absl::StrCat("nothing to commit: job ", job_id_,
                           " has not run a training step yet; send batches first")),
          "failed");
      return;
    }
    if (service_->options_.model_store.empty()) {
      End(absl::FailedPreconditionError(
              absl::StrCat("cannot commit job ", job_id_,
                           ": this server keeps no model store; start the server with "
                           "--model-store DIR to publish fine-tuned versions")),
          "failed");
      return;
    }
    service_->training_thread_.Post([this] {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      absl::StatusOr<ModelVersion> published = Publish();
      if (!published.ok()) {
        End(published.status(), "failed");
        return;
      }
      trainer_.reset();
      FillProgress(&progress_);
      progress_.set_committed_version(published->version);
      EndWithProgress("committed");
    });
  }

  // Checkpoint to the store (atomic: temp dir, fsync, rename), then add the version to the
  // registry and (unless do_not_serve) serve it, in one registry step.
  absl::StatusOr<ModelVersion> Publish() {
    const v1::CommitRequest& commit = request_.commit();
    const std::string& store = service_->options_.model_store;
    const int64_t sequence = service_->TakeSequence();
    const std::string version = NewVersionName(sequence);
    CheckpointInfo info;
    info.base_version = base_.version;
    info.objective = ObjectiveName(settings_.objective);
    info.steps = steps_;
    info.final_loss = last_.loss;
    info.sequence = sequence;
    info.description = commit.description();
    info.notes = notes_;
    const auto start = Clock::now();
    // Before the checkpoint appears: a --watch-store poll of this server may serve it as the
    // newest version before Publish does.
    const std::string previous = service_->ServedVersion();
    if (absl::Status written = WriteCheckpoint(trainer_->base(), trainer_->weights(),
                                               trainer_->head(), info, store, version);
        !written.ok()) {
      return absl::Status(written.code(),
                          absl::StrCat("commit of job ", job_id_, " failed: ", written.message(),
                                       "; nothing was published"));
    }
    ModelVersion published;
    published.version = version;
    published.origin = FineTunedOrigin(base_.version, info.objective, steps_);
    published.model = trainer_->Snapshot();
    published.sequence = sequence;
    absl::StatusOr<StoredVersion> stored = ReadStoredVersion(store, version);
    published.created_utc = stored.ok() ? stored->created_utc : UtcNow();
    published.description = stored.ok() ? stored->description : commit.description();
    published.notes = notes_;
    const bool serve = !commit.do_not_serve();
    if (absl::Status added = service_->registry_->Publish(published, serve); !added.ok()) {
      return added;
    }
    // Recorded also when the default stays (a replica or a restart must not serve the new
    // version as the newest one).
    if (absl::Status recorded = serve
                                    ? service_->RecordOrRevert("commit", previous, version, version)
                                    : RecordServing(store, "commit-staged", previous, "", version);
        !recorded.ok()) {
      return absl::Status(recorded.code(), absl::StrCat("job ", job_id_, " committed version ",
                                                        version, " but: ", recorded.message()));
    }
    service_->metrics_->RecordVersionPublished();
    Log(LogLevel::kInfo, "job %s committed version %s (%d steps, final loss %.5f) in %.2f s%s",
        job_id_, version, steps_, last_.loss, SecondsSince(start),
        serve ? "; now served by default" : " (not served by default)");
    return published;
  }

  // Sends `warnings` with the next progress message and keeps them as the job's notes (stored
  // with the version if it is committed).
  void Warn(const std::vector<std::string>& warnings) {
    for (const std::string& warning : warnings) {
      Log(LogLevel::kWarning, "fine-tuning job %s: %s", job_id_, warning);
      progress_.add_warnings(warning);
      if (notes_.size() < kMaxNotes) {
        notes_.push_back(warning);
      } else if (notes_.size() == kMaxNotes) {
        notes_.push_back("more warnings were raised; see the server log");
      }
    }
  }

  void FillProgress(v1::FineTuneProgress* progress) {
    progress->Clear();
    progress->set_job_id(job_id_);
    progress->set_step(steps_);
    progress->set_loss(last_.loss);
    progress->set_grad_norm(last_.grad_norm);
    progress->set_learning_rate(last_.learning_rate);
    progress->set_examples_per_second(last_.seconds > 0 ? last_.examples / last_.seconds : 0);
    progress->set_examples_seen(examples_seen_);
    if (!sent_base_version_) {
      progress->set_base_version(base_.version);
      sent_base_version_ = true;
    }
  }

  void EndCancelled() {
    End(absl::CancelledError(
            job_id_.empty() ? std::string("cancelled by the client")
                            : absl::StrCat("cancelled by the client; job ", job_id_, " discarded")),
        job_id_.empty() ? "" : "cancelled");
  }

  // Records the call and the job's outcome ("" = no job was started) and frees the job slot.
  void Release(grpc::StatusCode code, const std::string& outcome) {
    service_->metrics_->RecordRequest("FineTune", code, SecondsSince(received_));
    if (!job_id_.empty() && !job_released_) {
      job_released_ = true;
      if (!outcome.empty()) service_->metrics_->RecordFineTuneJob(outcome);
      Log(LogLevel::kInfo, "fine-tuning job %s ended (%s) after %d steps", job_id_, outcome,
          steps_);
      service_->EndJob(job_id_);
    }
  }

  // Ends the stream with `status`. Must be the caller's last use of `this`.
  void End(const absl::Status& absl_status, const std::string& outcome) {
    const grpc::Status status = ToGrpcStatus(absl_status);
    trainer_.reset();
    if (!status.ok() && !job_id_.empty()) {
      Log(LogLevel::kInfo, "fine-tuning job %s: %s %s", job_id_,
          std::string(GrpcCodeName(status.error_code())), status.error_message());
    }
    Release(status.error_code(), outcome);
    Finish(status);
  }

  // Ends the stream with the final progress message (already in progress_) and OK.
  void EndWithProgress(const std::string& outcome) {
    Release(grpc::StatusCode::OK, outcome);
    StartWriteAndFinish(SerializedProgress(), grpc::WriteOptions(), grpc::Status::OK);
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
  grpc::ByteBuffer request_bytes_;
  v1::FineTuneRequest request_;
  v1::FineTuneProgress progress_;
  grpc::ByteBuffer progress_bytes_;

  // The job (empty id = no config yet).
  std::string job_id_;
  bool job_released_ = false;
  ModelVersion base_;
  JobSettings settings_;
  std::unique_ptr<Trainer> trainer_;
  int64_t steps_ = 0;
  int64_t examples_seen_ = 0;
  StepResult last_;
  bool sent_base_version_ = false;
  // Degenerate batches: a loss of exactly 0 this many steps in a row is worth a warning.
  static constexpr int kZeroLossSteps = 3;
  static constexpr size_t kMaxNotes = 16;
  int zero_loss_steps_ = 0;
  std::vector<std::string> notes_;
};

RawMethods::BidiReactor* NewFineTuneReactor(TrainerService* service,
                                            grpc::CallbackServerContext* context) {
  return new FineTuneReactor(service, context);
}

}  // namespace attn::server
