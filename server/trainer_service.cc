#include "server/trainer_service.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/trainer.h"
#include "server/auth.h"
#include "server/request_prep.h"
#include "server/status_map.h"

namespace attn::server {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

namespace {

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

const char* ObjectiveName(v1::Objective objective) {
  switch (objective) {
    case v1::CONTRASTIVE:
      return "contrastive";
    case v1::COSINE_SIMILARITY:
      return "cosine_similarity";
    case v1::CLASSIFICATION:
      return "classification";
    default:
      return "unspecified";
  }
}

std::string FineTunedOrigin(const std::string& base, const std::string& objective, int64_t steps) {
  return absl::StrCat("fine-tuned from ", base, " (", objective, ", ", steps,
                      steps == 1 ? " step)" : " steps)");
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// What a FineTuneConfig asks for, checked and with defaults filled in.
struct JobSettings {
  TrainerOptions trainer;
  TruncationOptions truncation;
  v1::Objective objective = v1::OBJECTIVE_UNSPECIFIED;
  int num_labels = 0;
};

// Checks a finite, non-negative optional setting; `zero_means` documents what 0 does.
grpc::Status CheckNonNegative(const char* field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return Invalid(absl::StrCat("config.", field, " is ", value, "; it must be finite and >= 0"));
  }
  return grpc::Status::OK;
}

absl::StatusOr<JobSettings> ResolveConfig(const v1::FineTuneConfig& config, const Model& base) {
  auto invalid = [](const std::string& message) { return absl::InvalidArgumentError(message); };
  JobSettings s;
  TrainerOptions& t = s.trainer;
  switch (config.objective()) {
    case v1::CONTRASTIVE:
      t.objective = Objective::kContrastive;
      break;
    case v1::COSINE_SIMILARITY:
      t.objective = Objective::kCosineSimilarity;
      break;
    case v1::CLASSIFICATION:
      t.objective = Objective::kClassification;
      break;
    case v1::OBJECTIVE_UNSPECIFIED:
      return invalid(
          "config.objective is not set; use CONTRASTIVE, COSINE_SIMILARITY or "
          "CLASSIFICATION");
    default:
      return invalid(absl::StrCat("config.objective: unknown value ", config.objective()));
  }
  s.objective = config.objective();

  // AdamW: 0 means the default for every setting but weight_decay, which is optional.
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"learning_rate", config.learning_rate()},
        {"epsilon", config.epsilon()}}) {
    if (grpc::Status ok = CheckNonNegative(field, value); !ok.ok()) {
      return invalid(ok.error_message());
    }
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"beta1", config.beta1()}, {"beta2", config.beta2()}}) {
    if (!std::isfinite(value) || value < 0 || value >= 1) {
      return invalid(absl::StrCat("config.", field, " is ", value,
                                  "; it must be in [0, 1) (0 = the default)"));
    }
  }
  if (config.learning_rate() > 0) t.adamw.lr = config.learning_rate();
  if (config.beta1() > 0) t.adamw.beta1 = config.beta1();
  if (config.beta2() > 0) t.adamw.beta2 = config.beta2();
  if (config.epsilon() > 0) t.adamw.eps = config.epsilon();
  if (config.has_weight_decay()) {
    if (grpc::Status ok = CheckNonNegative("weight_decay", config.weight_decay()); !ok.ok()) {
      return invalid(ok.error_message());
    }
    t.adamw.weight_decay = config.weight_decay();
  }
  if (config.warmup_steps() < 0 || config.total_steps() < 0) {
    return invalid(absl::StrCat("config.warmup_steps (", config.warmup_steps(),
                                ") and config.total_steps (", config.total_steps(),
                                ") must be >= 0"));
  }
  if (config.total_steps() > 0 && config.warmup_steps() > config.total_steps()) {
    return invalid(absl::StrCat("config.warmup_steps (", config.warmup_steps(),
                                ") is more than config.total_steps (", config.total_steps(), ")"));
  }
  t.warmup_steps = config.warmup_steps();
  t.total_steps = config.total_steps();
  if (config.has_max_grad_norm()) {
    if (grpc::Status ok = CheckNonNegative("max_grad_norm", config.max_grad_norm()); !ok.ok()) {
      return invalid(ok.error_message());
    }
    t.max_grad_norm = config.max_grad_norm();  // 0 = no clipping
  }
  switch (config.parameters()) {
    case v1::PARAMETERS_UNSPECIFIED:
    case v1::PARAMETERS_ALL:
      t.trainable = TrainableSet::kAll;
      break;
    case v1::PARAMETERS_ATTENTION_ONLY:
      t.trainable = TrainableSet::kAttentionOnly;
      break;
    case v1::PARAMETERS_ALL_BUT_EMBEDDINGS:
      t.trainable = TrainableSet::kAllButEmbeddings;
      break;
    case v1::PARAMETERS_HEAD_ONLY:
      if (config.objective() != v1::CLASSIFICATION) {
        return invalid(
            "config.parameters PARAMETERS_HEAD_ONLY needs the CLASSIFICATION objective "
            "(only it has a head)");
      }
      t.trainable = TrainableSet::kHeadOnly;
      break;
    default:
      return invalid(absl::StrCat("config.parameters: unknown value ", config.parameters()));
  }
  t.seed = config.seed();
  t.dropout = !config.disable_dropout();

  if (!std::isfinite(config.contrastive_scale()) || config.contrastive_scale() < 0) {
    return invalid(absl::StrCat("config.contrastive_scale is ", config.contrastive_scale(),
                                "; it must be > 0 (0 = the default 20)"));
  }
  if (config.contrastive_scale() > 0) {
    if (config.objective() != v1::CONTRASTIVE) {
      return invalid("config.contrastive_scale is only for the CONTRASTIVE objective");
    }
    t.mnrl_scale = config.contrastive_scale();
  }
  constexpr int kMaxLabels = 1 << 16;
  if (config.objective() == v1::CLASSIFICATION) {
    if (config.num_labels() < 2 || config.num_labels() > kMaxLabels) {
      return invalid(absl::StrCat("config.num_labels is ", config.num_labels(),
                                  "; CLASSIFICATION needs 2 to ", kMaxLabels, " classes"));
    }
  } else if (config.num_labels() != 0) {
    return invalid("config.num_labels is only for the CLASSIFICATION objective");
  }
  t.num_labels = config.num_labels();
  s.num_labels = config.num_labels();

  absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(base, config.tokenization());
  if (!truncation.ok()) return invalid(absl::StrCat("config.", truncation.status().message()));
  s.truncation = *truncation;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
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
    if (grpc::Status auth = service_->Authorize(*context); !auth.ok()) {
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
      End(grpc::Status(grpc::StatusCode::CANCELLED,
                       job_id_.empty() ? absl::StrCat(why, " before a config")
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
      End(ToGrpcStatus(parsed), job_id_.empty() ? "" : "failed");
      return;
    }
    switch (request_.message_case()) {
      case v1::FineTuneRequest::kConfig:
        if (!job_id_.empty()) {
          End(Invalid(absl::StrCat("a second config in job ", job_id_,
                                   ": a stream runs one job; after the config send batches, then "
                                   "commit or abort")),
              "failed");
          return;
        }
        HandleConfig();
        return;
      case v1::FineTuneRequest::MESSAGE_NOT_SET:
        End(Invalid("empty FineTuneRequest: set config, batch, commit or abort"),
            job_id_.empty() ? "" : "failed");
        return;
      default:
        break;
    }
    if (job_id_.empty()) {
      End(Invalid("the first message must be a config (FineTuneConfig), then batches, then "
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
          End(Invalid("abort is false; send abort: true to stop the job"), "failed");
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
        End(Invalid(absl::StrCat("config.base_version: ", name.message())), "");
        return;
      }
    }
    absl::StatusOr<ModelVersion> base = service_->registry_->Get(config.base_version());
    if (!base.ok()) {
      End(ToGrpcStatus(base.status()), "");
      return;
    }
    absl::StatusOr<JobSettings> settings = ResolveConfig(config, *base->model);
    if (!settings.ok()) {
      End(ToGrpcStatus(settings.status()), "");
      return;
    }
    absl::StatusOr<std::string> job_id = service_->StartJob();
    if (!job_id.ok()) {
      End(ToGrpcStatus(job_id.status()), "");
      return;
    }
    job_id_ = *job_id;
    base_ = *base;
    settings_ = *settings;
    Log(LogLevel::kInfo, "fine-tuning job %s started: %s from version %s (lr %g)", job_id_,
        ObjectiveName(settings_.objective), base_.version, settings_.trainer.adamw.lr);
    // Copying the weights (and the optimiser set-up) is engine work: training thread.
    service_->Post([this] {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(base_.model, settings_.trainer);
      if (!trainer.ok()) {
        End(ToGrpcStatus(trainer.status()), "failed");
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
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("batch ", steps_ + 1, " is ", bytes, " bytes, more than the ",
                                    service_->options_.max_message_bytes,
                                    "-byte limit (--max-message-bytes); send smaller batches")),
          "failed");
      return;
    }
    const int examples = request_.batch().examples_size();
    if (examples == 0 || examples > limit) {
      End(Invalid(absl::StrCat("batch ", steps_ + 1, " has ", examples, " examples; send 1 to ",
                               limit, " (--max-inputs-per-request) per batch")),
          "failed");
      return;
    }
    if (settings_.objective == v1::CONTRASTIVE && examples < 2) {
      End(Invalid(absl::StrCat(
              "batch ", steps_ + 1,
              " has 1 example; the CONTRASTIVE objective (multiple-negatives ranking loss) "
              "scores each anchor against the other pairs' positives as negatives, so a single "
              "pair has loss exactly 0 and teaches nothing: send at least 2 (anchor, positive) "
              "pairs per batch")),
          "failed");
      return;
    }
    std::vector<std::string> warnings;
    if (settings_.objective == v1::CONTRASTIVE) {
      int same = 0;
      for (const v1::TrainingExample& e : request_.batch().examples()) {
        same += e.anchor() == e.positive();
      }
      if (same > 0) {
        warnings.push_back(absl::StrCat(
            "batch ", steps_ + 1, ": ", same, " of ", examples,
            " examples have anchor == positive; an identical pair is trivially similar (loss "
            "near 0) and teaches nothing, give real paraphrases or related texts"));
      }
    }
    service_->Post([this, warnings = std::move(warnings)]() mutable {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      TrainingBatch batch;
      if (grpc::Status converted = ConvertBatch(request_.batch(), &batch); !converted.ok()) {
        End(converted, "failed");
        return;
      }
      absl::StatusOr<StepResult> step = trainer_->Step(batch);
      if (!step.ok()) {
        const grpc::Status status = TrainingStepStatus(step.status());
        End(grpc::Status(status.error_code(),
                         absl::StrCat("job ", job_id_, " stopped at batch ", steps_ + 1, ": ",
                                      status.error_message(),
                                      ". Nothing was committed; the served version is unchanged")),
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
      End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("nothing to commit: job ", job_id_,
                                    " has not run a training step yet; send batches first")),
          "failed");
      return;
    }
    if (service_->options_.model_store.empty()) {
      End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("cannot commit job ", job_id_,
                                    ": this server keeps no model store; start the server with "
                                    "--model-store DIR to publish fine-tuned versions")),
          "failed");
      return;
    }
    service_->Post([this] {
      if (cancelled_.load()) {
        EndCancelled();
        return;
      }
      absl::StatusOr<ModelVersion> published = Publish();
      if (!published.ok()) {
        End(ToGrpcStatus(published.status()), "failed");
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
    service_->metrics_->RecordVersionPublished();
    Log(LogLevel::kInfo, "job %s committed version %s (%d steps, final loss %.5f) in %.2f s%s",
        job_id_, version, steps_, last_.loss, SecondsSince(start),
        serve ? "; now served by default" : " (not served by default)");
    return published;
  }

  // Validates the batch for the job's objective and tokenizes it with the base model's
  // tokenizer. INVALID_ARGUMENT naming the batch and the example otherwise.
  grpc::Status ConvertBatch(const v1::TrainingBatch& in, TrainingBatch* out) const {
    const Model& model = *base_.model;
    const std::string batch_name = absl::StrCat("batch ", steps_ + 1);
    const int examples = in.examples_size();
    auto tokenize = [&](int i, const char* field, const std::string& text,
                        std::vector<SequenceInput>* into) -> grpc::Status {
      const std::string where = absl::StrCat(batch_name, ", examples[", i, "].", field);
      if (text.empty()) return Invalid(absl::StrCat(where, " is empty"));
      absl::StatusOr<Encoding> encoding = model.tokenizer().Encode(text, settings_.truncation);
      if (!encoding.ok()) return Invalid(absl::StrCat(where, ": ", encoding.status().message()));
      if (!settings_.truncation.enabled && encoding->size() > settings_.truncation.max_length) {
        return Invalid(
            absl::StrCat(where, " has ", encoding->size(), " tokens, more than max_length ",
                         settings_.truncation.max_length, " and truncation is TRUNCATION_NONE"));
      }
      into->push_back({std::move(encoding->ids), std::move(encoding->type_ids)});
      return grpc::Status::OK;
    };
    // Fields of another objective are a client bug worth reporting, not silently ignoring.
    auto unused = [&](int i, const v1::TrainingExample& e,
                      std::initializer_list<std::pair<const char*, bool>> fields) {
      for (const auto& [name, set] : fields) {
        if (set) {
          return Invalid(absl::StrCat(batch_name, ", examples[", i, "].", name, " is set but the ",
                                      ObjectiveName(settings_.objective),
                                      " objective does not use it"));
        }
      }
      return grpc::Status::OK;
    };
    for (int i = 0; i < examples; ++i) {
      const v1::TrainingExample& e = in.examples(i);
      grpc::Status status;
      switch (settings_.objective) {
        case v1::CONTRASTIVE: {
          status = unused(i, e,
                          {{"first", !e.first().empty()},
                           {"second", !e.second().empty()},
                           {"score", e.score() != 0},
                           {"text", !e.text().empty()},
                           {"label", e.label() != 0}});
          if (!status.ok()) return status;
          const bool has_negative = !e.negative().empty();
          const bool batch_has_negatives = !in.examples(0).negative().empty();
          if (has_negative != batch_has_negatives) {
            return Invalid(
                absl::StrCat(batch_name, ", examples[", i, "] ", has_negative ? "has" : "has no",
                             " negative but examples[0] ", batch_has_negatives ? "has" : "has not",
                             "; give a hard negative for every example of a batch or for none"));
          }
          if (!(status = tokenize(i, "anchor", e.anchor(), &out->anchors)).ok()) return status;
          if (!(status = tokenize(i, "positive", e.positive(), &out->positives)).ok()) {
            return status;
          }
          if (has_negative &&
              !(status = tokenize(i, "negative", e.negative(), &out->negatives)).ok()) {
            return status;
          }
          break;
        }
        case v1::COSINE_SIMILARITY: {
          status = unused(i, e,
                          {{"anchor", !e.anchor().empty()},
                           {"positive", !e.positive().empty()},
                           {"negative", !e.negative().empty()},
                           {"text", !e.text().empty()},
                           {"label", e.label() != 0}});
          if (!status.ok()) return status;
          if (!std::isfinite(e.score()) || e.score() < -1.0f || e.score() > 1.0f) {
            return Invalid(absl::StrCat(batch_name, ", examples[", i, "].score is ", e.score(),
                                        "; gold scores must be finite and in [-1, 1]"));
          }
          if (!(status = tokenize(i, "first", e.first(), &out->first)).ok()) return status;
          if (!(status = tokenize(i, "second", e.second(), &out->second)).ok()) return status;
          out->scores.push_back(e.score());
          break;
        }
        case v1::CLASSIFICATION: {
          status = unused(i, e,
                          {{"anchor", !e.anchor().empty()},
                           {"positive", !e.positive().empty()},
                           {"negative", !e.negative().empty()},
                           {"first", !e.first().empty()},
                           {"second", !e.second().empty()},
                           {"score", e.score() != 0}});
          if (!status.ok()) return status;
          if (e.label() < 0 || e.label() >= settings_.num_labels) {
            return Invalid(absl::StrCat(batch_name, ", examples[", i, "].label is ", e.label(),
                                        ", outside [0, ", settings_.num_labels,
                                        ") (config.num_labels)"));
          }
          if (!(status = tokenize(i, "text", e.text(), &out->inputs)).ok()) return status;
          out->labels.push_back(e.label());
          break;
        }
        default:
          return grpc::Status(grpc::StatusCode::INTERNAL, "unresolved objective");
      }
    }
    return grpc::Status::OK;
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
    End(grpc::Status(grpc::StatusCode::CANCELLED,
                     job_id_.empty()
                         ? std::string("cancelled by the client")
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
  void End(const grpc::Status& status, const std::string& outcome) {
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

namespace {

// A unary call's bookkeeping: metrics on finish.
class UnaryCall {
 public:
  UnaryCall(const char* method, Metrics* metrics, grpc::CallbackServerContext* context)
      : method_(method), metrics_(metrics), reactor_(context->DefaultReactor()) {}
  grpc::ServerUnaryReactor* Finish(const grpc::Status& status) {
    metrics_->RecordRequest(method_, status.error_code(), SecondsSince(received_));
    reactor_->Finish(status);
    return reactor_;
  }

 private:
  const char* method_;
  Metrics* metrics_;
  grpc::ServerUnaryReactor* reactor_;
  Clock::time_point received_ = Clock::now();
};

grpc::Status CheckVersionName(const std::string& name, const char* field) {
  if (absl::Status valid = ValidateVersionName(name); !valid.ok()) {
    return Invalid(absl::StrCat(field, ": ", valid.message()));
  }
  return grpc::Status::OK;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The service.

TrainerService::TrainerService(const ServerOptions& options, std::optional<std::string> token,
                               ModelRegistry* registry, Metrics* metrics)
    : options_(options),
      token_(std::move(token)),
      registry_(registry),
      metrics_(metrics),
      training_thread_([this] { TrainingLoop(); }) {
  // FineTune takes raw bytes (see FineTuneReactor); the generated service registers its methods
  // in the .proto's order.
  MarkMethodRawCallback(
      v1::FineTuneRequest::descriptor()
          ->file()
          ->FindServiceByName("Trainer")
          ->FindMethodByName("FineTune")
          ->index(),
      new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
          [this](grpc::CallbackServerContext* context) { return NewFineTuneReactor(context); }));
  ServeVersionsMethod<v1::ListVersionsRequest>("ListVersions", &TrainerService::HandleListVersions);
  ServeVersionsMethod<v1::RollbackRequest>("Rollback", &TrainerService::HandleRollback);
  ServeVersionsMethod<v1::SetServingVersionRequest>("SetServingVersion",
                                                    &TrainerService::HandleSetServingVersion);
}

template <typename Request>
void TrainerService::ServeVersionsMethod(const char* method, VersionsHandler<Request> handler) {
  const int index = v1::FineTuneRequest::descriptor()
                        ->file()
                        ->FindServiceByName("Trainer")
                        ->FindMethodByName(method)
                        ->index();
  auto serve = [this, method, handler](grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request_bytes,
                                       grpc::ByteBuffer* response_bytes) {
    UnaryCall call(method, metrics_, context);
    // Authorization first: a caller without the token learns nothing about its bytes.
    if (grpc::Status auth = Authorize(*context); !auth.ok()) return call.Finish(auth);
    Request request;
    if (absl::Status parsed = ParseRequestBytes(*request_bytes, &request); !parsed.ok()) {
      Log(LogLevel::kDebug, "%s: %s", method, parsed.message());
      return call.Finish(ToGrpcStatus(parsed));
    }
    v1::ListVersionsResponse response;
    grpc::Status status = (this->*handler)(request, &response);
    if (status.ok()) {
      bool own_buffer = false;
      status = grpc::SerializationTraits<v1::ListVersionsResponse>::Serialize(
          response, response_bytes, &own_buffer);
    }
    return call.Finish(status);
  };
  MarkMethodRawCallback(
      index, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(serve));
}

TrainerService::~TrainerService() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  training_thread_.join();
}

void TrainerService::SetNextSequence(int64_t sequence) {
  absl::MutexLock lock(&mutex_);
  next_sequence_ = std::max<int64_t>(sequence, 1);
}

int64_t TrainerService::TakeSequence() {
  absl::MutexLock lock(&mutex_);
  return next_sequence_++;
}

void TrainerService::Post(std::function<void()> task) {
  absl::MutexLock lock(&mutex_);
  tasks_.push_back(std::move(task));
}

void TrainerService::TrainingLoop() {
  // OpenMP settings are per thread: this one only affects the engine work started here, so
  // training leaves the remaining cores to the batcher.
  if (options_.trainer_threads > 0) omp_set_num_threads(options_.trainer_threads);
  // A lower CPU priority makes the scheduler prefer the batcher's OpenMP team whenever both
  // want a core: with libgomp's spinning barriers, a serving team that loses a core to the
  // trainer stalls at every barrier (Encode latency went from ~10 ms to ~100 ms on 2 cores
  // without this). Threads created from here inherit it.
  if (options_.trainer_nice > 0) {
    const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
    const int nice = std::min(19, getpriority(PRIO_PROCESS, tid) + options_.trainer_nice);
    if (setpriority(PRIO_PROCESS, tid, nice) != 0) {
      Log(LogLevel::kWarning, "cannot lower the training thread's priority to nice %d: %s", nice,
          std::strerror(errno));
    }
  }
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return stopping_ || !tasks_.empty();
      };
      mutex_.Await(absl::Condition(&ready));
      // Tasks end their stream, so they run even while stopping (the server has drained).
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
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

grpc::Status TrainerService::Authorize(const grpc::CallbackServerContext& context) const {
  if (!token_.has_value()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "the Trainer service is disabled on this server; start it with "
                        "--trainer-token-file to enable fine-tuning and version management");
  }
  return CheckBearerToken(context, *token_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TrainerService::NewFineTuneReactor(
    grpc::CallbackServerContext* context) {
  return new FineTuneReactor(this, context);
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

grpc::Status TrainerService::HandleListVersions(const v1::ListVersionsRequest& /*request*/,
                                                v1::ListVersionsResponse* response) {
  FillVersions(response);
  return grpc::Status::OK;
}

grpc::Status TrainerService::HandleRollback(const v1::RollbackRequest& request,
                                            v1::ListVersionsResponse* response) {
  if (!request.version().empty()) {
    if (grpc::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
      return name;
    }
  }
  absl::StatusOr<ModelVersion> served = registry_->Rollback(request.version());
  if (!served.ok()) return ToGrpcStatus(served.status());
  Log(LogLevel::kInfo, "Rollback: now serving version %s", served->version);
  FillVersions(response);
  return grpc::Status::OK;
}

grpc::Status TrainerService::HandleSetServingVersion(const v1::SetServingVersionRequest& request,
                                                     v1::ListVersionsResponse* response) {
  if (grpc::Status name = CheckVersionName(request.version(), "version"); !name.ok()) {
    return name;
  }
  if (absl::Status set = registry_->SetServing(request.version()); !set.ok()) {
    return ToGrpcStatus(set);
  }
  Log(LogLevel::kInfo, "SetServingVersion: now serving version %s", request.version());
  FillVersions(response);
  return grpc::Status::OK;
}

}  // namespace attn::server
