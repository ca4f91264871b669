#include "server/core/fine_tuning.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "server/core/store_versions.h"

namespace attn::server::core {

namespace {

// sqrt(sum of squared update norms) of the groups of each kind, in first-seen order: the
// Prometheus label set stays the dozen kinds, whatever the number of layers.
std::vector<std::pair<std::string, double>> UpdateNormByKind(const StepTelemetry& telemetry) {
  std::vector<std::pair<std::string, double>> by_kind;
  for (const GroupTelemetry& group : telemetry.groups) {
    auto it = std::find_if(by_kind.begin(), by_kind.end(),
                           [&](const auto& entry) { return entry.first == group.kind; });
    if (it == by_kind.end()) it = by_kind.insert(by_kind.end(), {group.kind, 0.0});
    it->second += group.update_norm * group.update_norm;
  }
  for (auto& entry : by_kind) entry.second = std::sqrt(entry.second);
  return by_kind;
}

}  // namespace

using Clock = std::chrono::steady_clock;

namespace {

std::string UtcNow(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), format, &tm);
  return text;
}

absl::Status Cancelled(const CallControl& control) {
  if (const char* reason = control.DropReason(); reason != nullptr) {
    return absl::CancelledError(absl::StrCat("nobody waits for the job any more (", reason, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStoreCanTakeCheckpoint(const std::string& store, int64_t checkpoint_bytes,
                                         int64_t dataset_bytes) {
  if (store.empty()) {
    return absl::FailedPreconditionError(
        "this server keeps no model store, so a fine-tuned version could not be committed; "
        "start it with --model-store DIR to run fine-tuning jobs");
  }
  std::error_code error;
  if (!std::filesystem::is_directory(store, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the model store ", store, " is not a directory", error ? ": " + error.message() : "",
        "; a fine-tuned version could not be committed"));
  }
  if (access(store.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the model store ", store, " is not writable by this server (",
                     std::strerror(errno), "); a fine-tuned version could not be committed"));
  }
  struct statvfs fs {};
  if (statvfs(store.c_str(), &fs) == 0) {
    const auto free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    // The weights, the tokenizer and config files (a few MB), and a margin for the file system.
    const int64_t needed =
        checkpoint_bytes + checkpoint_bytes / 10 + (int64_t{16} << 20) + dataset_bytes;
    if (free_bytes < needed) {
      return absl::FailedPreconditionError(
          absl::StrCat("the model store ", store, " has ", free_bytes >> 20, " MiB free; ",
                       dataset_bytes > 0 ? "the job's dataset and " : "",
                       "a checkpoint of this model need", dataset_bytes > 0 ? "" : "s", " about ",
                       needed >> 20, " MiB: free space or point --model-store at a larger volume"));
    }
  }
  return absl::OkStatus();
}

// ---- FineTuning -----------------------------------------------------------------------------

FineTuning::FineTuning(FineTuningOptions options, ModelRegistry* registry, TrainingMetrics* metrics)
    : options_(std::move(options)),
      registry_(registry),
      metrics_(metrics),
      training_thread_(options_.trainer_threads, options_.trainer_nice) {}

void FineTuning::SetNextSequence(int64_t sequence) {
  absl::MutexLock lock(&mutex_);
  next_sequence_ = std::max<int64_t>(sequence, 1);
}

int64_t FineTuning::TakeSequence() {
  absl::MutexLock lock(&mutex_);
  return next_sequence_++;
}

absl::StatusOr<FineTuning::CheckedConfig> FineTuning::Check(const FineTuneConfig& config) const {
  if (!config.base_version.empty()) {
    if (absl::Status name = ValidateVersionName(config.base_version); !name.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config.base_version: ", name.message()));
    }
  }
  absl::StatusOr<ModelVersion> base = registry_->Get(config.base_version);
  if (!base.ok()) return base.status();
  absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, *base->model);
  if (!settings.ok()) return settings.status();
  // Checkpoints are written in fp32 whatever precision the served copy runs at.
  if (absl::Status room = CheckStoreCanTakeCheckpoint(
          options_.model_store, base->model->weights().ParameterCount() * int64_t{4});
      !room.ok()) {
    return room;
  }
  return CheckedConfig{*std::move(base), *std::move(settings)};
}

absl::StatusOr<std::unique_ptr<FineTuneJob>> FineTuning::Begin(const FineTuneConfig& config,
                                                               const std::string& job_id) {
  absl::StatusOr<CheckedConfig> checked = Check(config);
  if (!checked.ok()) return checked.status();
  ModelVersion& base = checked->base;
  JobSettings& settings = checked->settings;

  std::string id;
  {
    absl::MutexLock lock(&mutex_);
    if (!running_job_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("fine-tuning job ", running_job_,
                       " is running; one job runs at a time (wait for it to commit or abort)"));
    }
    ++jobs_started_;
    running_job_ = !job_id.empty()
                       ? job_id
                       : absl::StrFormat("job-%s-%d", UtcNow("%Y%m%dT%H%M%SZ"), jobs_started_);
    id = running_job_;
  }
  Log(LogLevel::kInfo, "fine-tuning job %s started: %s from version %s (lr %g)", id,
      ObjectiveName(settings.trainer.objective), base.version, settings.trainer.adamw.lr);
  return std::unique_ptr<FineTuneJob>(
      new FineTuneJob(this, std::move(id), std::move(base), std::move(settings)));
}

void FineTuning::EndJob(const std::string& job_id) {
  std::function<void()> listener;
  {
    absl::MutexLock lock(&mutex_);
    if (running_job_ != job_id) return;
    running_job_.clear();
    listener = slot_freed_;
  }
  if (listener) listener();
}

std::string FineTuning::RunningJob() const {
  absl::MutexLock lock(&mutex_);
  return running_job_;
}

void FineTuning::SetSlotFreedListener(std::function<void()> listener) {
  absl::MutexLock lock(&mutex_);
  slot_freed_ = std::move(listener);
}

std::string FineTuning::ServedVersion() const {
  std::string serving;
  registry_->List(&serving);
  return serving;
}

absl::Status FineTuning::RecordOrRevert(const std::string& action, const std::string& from,
                                        const std::string& to, const std::string& committed) {
  absl::Status recorded = RecordServing(options_.model_store, action, from, to, committed);
  if (recorded.ok() || from.empty()) return recorded;
  // Not recorded: a restart or a replica would serve `from`, so this server does too, with the
  // serving history the store still records.
  registry_->SetServing(from).IgnoreError();
  ReloadServingHistory(options_.model_store, registry_);
  return absl::Status(recorded.code(), absl::StrCat(recorded.message(), "; still serving ", from));
}

// ---- FineTuneJob ----------------------------------------------------------------------------

FineTuneJob::FineTuneJob(FineTuning* owner, std::string id, ModelVersion base, JobSettings settings)
    : owner_(owner), id_(std::move(id)), base_(std::move(base)), settings_(std::move(settings)) {}

FineTuneJob::~FineTuneJob() { End("", absl::OkStatus()); }

void FineTuneJob::End(std::string_view outcome, const absl::Status& status) {
  if (ended_) return;
  ended_ = true;
  trainer_.reset();
  if (!status.ok()) {
    Log(LogLevel::kInfo, "fine-tuning job %s: %s %s", id_, absl::StatusCodeToString(status.code()),
        status.message());
  }
  if (!outcome.empty()) {
    owner_->metrics_->RecordFineTuneJob(outcome);
    Log(LogLevel::kInfo, "fine-tuning job %s ended (%s) after %d steps", id_, outcome, steps_);
  }
  owner_->EndJob(id_);
}

void FineTuneJob::Prepare(const CallControl& control, Done done) {
  // Copying the weights (and the optimiser set-up) is engine work: training thread.
  owner_->training_thread_.Post([this, control, done = std::move(done)] {
    if (absl::Status cancelled = Cancelled(control); !cancelled.ok()) return done(cancelled);
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(base_.model, settings_.trainer);
    if (!trainer.ok()) return done(trainer.status());
    trainer_ = *std::move(trainer);
    if (absl::Status evaluated = Evaluate(control); !evaluated.ok()) {
      return done(absl::Status(
          evaluated.code(), absl::StrCat("scoring the base version ", base_.version,
                                         " on the evaluation set failed: ", evaluated.message())));
    }
    done(absl::OkStatus());
  });
}

absl::Status FineTuneJob::Evaluate(const CallControl& control) {
  if (!settings_.evaluation) return absl::OkStatus();
  const BertConfig& config = base_.model->config();
  const BertWeights& weights = trainer_->weights();
  EvaluationOptions options;
  options.pooling = base_.model->sentence_config().pooling;
  options.num_layers = config.num_hidden_layers;
  options.head = trainer_->head();
  options.yield = [&control] { return control.DropReason() != nullptr; };
  absl::StatusOr<EvaluationResult> result =
      EvaluateEncoder(*settings_.evaluation, options,
                      [&](const std::vector<SequenceInput>& batch, const ForwardOptions& forward) {
                        return EncoderForward(config, weights, batch, forward);
                      });
  if (!result.ok()) return result.status();
  Log(LogLevel::kInfo, "job %s: evaluation after %d steps (%s, %d examples, %.2f s): %s", id_,
      steps_, EvaluationTaskName(result->task), result->examples, result->seconds,
      FormatMetrics(*result));
  result->per_example.clear();  // the report and the progress carry the metrics only
  evaluations_.push_back({steps_, *std::move(result)});
  return absl::OkStatus();
}

std::pair<bool, std::string> FineTuneJob::PromotionDecision(const CommitRequest& request) const {
  if (!settings_.gate) {
    return request.promote
               ? std::make_pair(true, std::string("promoted: the job asked for it"))
               : std::make_pair(false, std::string("staged: promotion not requested (pin it "
                                                   "per request, then promote it)"));
  }
  // Evaluate() ran on the base (first) and on the weights being committed (last).
  const GateOutcome gate =
      CheckPromotionGate(*settings_.gate, evaluations_.back().result, evaluations_.front().result);
  const std::string said = absl::StrCat("the gate ", settings_.gate->text, " ");
  if (!request.promote) {
    return {false, absl::StrCat("staged: promotion not requested; ", said,
                                gate.holds ? "would hold: " : "would fail: ", gate.detail)};
  }
  if (!gate.holds) return {false, absl::StrCat("staged: ", said, "failed: ", gate.detail)};
  return {true, absl::StrCat("promoted: ", said, "held: ", gate.detail)};
}

void FineTuneJob::Step(TrainingBatchRequest batch, const CallControl& control, ProgressDone done) {
  const int64_t number = steps_ + 1;
  if (absl::Status shape = CheckBatchShape(batch, number, owner_->options_.max_examples_per_batch);
      !shape.ok()) {
    return done(shape);
  }
  if (trainer_ == nullptr) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " has no trainer: it was not prepared or has ended")));
  }
  std::vector<std::string> warnings = BatchWarnings(batch, settings_, number);
  owner_->training_thread_.Post([this, number, batch = std::move(batch), control,
                                 warnings = std::move(warnings), done = std::move(done)]() mutable {
    if (absl::Status cancelled = Cancelled(control); !cancelled.ok()) return done(cancelled);
    TrainingBatch converted;
    if (absl::Status valid = ConvertBatch(batch, settings_, *base_.model, number, &converted);
        !valid.ok()) {
      return done(valid);
    }
    absl::StatusOr<StepResult> step = trainer_->Step(converted);
    if (!step.ok()) {
      return done(StepFailure(
          step.status(),
          absl::StrCat("job ", id_, " stopped at batch ", number, ": ", step.status().message(),
                       ". Nothing was committed; the served version is "
                       "unchanged")));
    }
    steps_ = step->step;
    examples_seen_ += step->examples;
    last_ = *step;
    last_.telemetry.reset();  // sent once, with this step's progress
    loss_curve_.push_back({step->step, step->loss, step->learning_rate, step->grad_norm});
    owner_->metrics_->RecordFineTuneStep(step->examples, step->loss);
    if (step->telemetry) owner_->metrics_->RecordUpdateNorms(UpdateNormByKind(*step->telemetry));
    Log(LogLevel::kDebug, "job %s step %d: loss %.5f, grad norm %.4f, %d examples in %.3f s", id_,
        steps_, step->loss, step->grad_norm, step->examples, step->seconds);
    zero_loss_steps_ = step->loss == 0.0 ? zero_loss_steps_ + 1 : 0;
    if (zero_loss_steps_ == kZeroLossSteps) {
      warnings.push_back(absl::StrCat(
          "the loss has been exactly 0 for ", kZeroLossSteps, " steps in a row (steps ",
          steps_ - kZeroLossSteps + 1, " to ", steps_,
          "): these batches give no gradient signal; check that the examples differ and, for "
          "CONTRASTIVE, that batches hold several unrelated pairs"));
    }
    if (settings_.eval_every > 0 && steps_ % settings_.eval_every == 0) {
      if (absl::Status evaluated = Evaluate(control); !evaluated.ok()) {
        return done(absl::Status(
            evaluated.code(),
            absl::StrCat("job ", id_, ": the evaluation after step ", steps_,
                         " failed: ", evaluated.message(), ". Nothing was committed")));
      }
    }
    FineTuneProgress progress = Progress();
    progress.telemetry = std::move(step->telemetry);
    Warn(warnings, &progress);
    done(std::move(progress));
  });
}

void FineTuneJob::Commit(CommitRequest request, const CallControl& control, ProgressDone done) {
  if (steps_ == 0) {
    return done(absl::FailedPreconditionError(absl::StrCat(
        "nothing to commit: job ", id_, " has not run a training step yet; send batches first")));
  }
  if (owner_->options_.model_store.empty()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("cannot commit job ", id_,
                     ": this server keeps no model store; start the server with "
                     "--model-store DIR to publish fine-tuned versions")));
  }
  if (request.promote && request.do_not_serve) {
    return done(absl::InvalidArgumentError(
        "commit.promote and commit.do_not_serve contradict each other; do_not_serve is "
        "deprecated (a commit is staged unless promote is set): drop it"));
  }
  owner_->training_thread_.Post(
      [this, request = std::move(request), control, done = std::move(done)] {
        if (absl::Status cancelled = Cancelled(control); !cancelled.ok()) return done(cancelled);
        // The weights being committed are scored unless the last step's were.
        if (settings_.evaluation && evaluations_.back().step != steps_) {
          if (absl::Status evaluated = Evaluate(control); !evaluated.ok()) {
            return done(absl::Status(evaluated.code(),
                                     absl::StrCat("commit of job ", id_,
                                                  ": scoring the trained "
                                                  "weights on the evaluation set failed: ",
                                                  evaluated.message(), "; nothing was published")));
          }
        }
        bool promote = false;
        std::tie(promote, promotion_) = PromotionDecision(request);
        absl::StatusOr<ModelVersion> published = Publish(request, promote);
        if (!published.ok()) return done(published.status());
        trainer_.reset();
        FineTuneProgress progress = Progress();
        progress.committed_version = published->version;
        progress.promoted = promote;
        progress.promotion = promotion_;
        done(std::move(progress));
      });
}

FineTuneProgress FineTuneJob::Abort() {
  trainer_.reset();
  return Progress();
}

// What the job did, for training_report.json: its settings, the loss curve and how far each
// parameter group moved from the version it started from.
TrainingReport FineTuneJob::Report() const {
  const TrainerOptions& t = settings_.trainer;
  TrainingReport report;
  auto setting = [&report](const char* name, auto value) {
    report.settings.emplace_back(name, absl::StrCat(value));
  };
  report.settings.emplace_back("job_id", id_);
  report.settings.emplace_back("base_version", base_.version);
  report.settings.emplace_back("objective", ObjectiveName(t.objective));
  report.settings.emplace_back("parameters", TrainableSetName(t.trainable));
  report.settings.emplace_back("precision", PrecisionName(t.precision));
  setting("learning_rate", t.adamw.lr);
  setting("beta1", t.adamw.beta1);
  setting("beta2", t.adamw.beta2);
  setting("epsilon", t.adamw.eps);
  setting("weight_decay", t.adamw.weight_decay);
  setting("warmup_steps", t.warmup_steps);
  setting("total_steps", t.total_steps);
  setting("max_grad_norm", t.max_grad_norm);
  setting("seed", t.seed);
  report.settings.emplace_back("dropout", t.dropout ? "true" : "false");
  if (t.objective == Objective::kContrastive) setting("contrastive_scale", t.contrastive_scale);
  if (t.num_labels > 0) setting("num_labels", t.num_labels);
  setting("max_length", settings_.truncation.max_length);
  setting("steps", steps_);
  setting("examples_seen", examples_seen_);
  report.loss_curve = loss_curve_;
  report.evaluations = evaluations_;
  report.promotion = promotion_;
  report.changes = RelativeChanges(trainer_->base().weights(), trainer_->weights(),
                                   &report.embedding_rows_changed, &report.total_relative_change);
  return report;
}

// Checkpoint to the store (atomic: temp dir, fsync, rename), then add the version to the
// registry and (if `promote`) serve it, in one registry step.
absl::StatusOr<ModelVersion> FineTuneJob::Publish(const CommitRequest& request, bool promote) {
  const std::string& store = owner_->options_.model_store;
  const int64_t sequence = owner_->TakeSequence();
  const std::string version = NewVersionName(sequence);
  CheckpointInfo info;
  info.base_version = base_.version;
  info.objective = ObjectiveName(settings_.trainer.objective);
  info.label_names = settings_.label_names;
  info.steps = steps_;
  info.final_loss = last_.loss;
  info.sequence = sequence;
  info.description = request.description;
  info.notes = notes_;
  info.training_report_json = TrainingReportJson(Report());
  const auto start = Clock::now();
  // Before the checkpoint appears: a --watch-store poll of this server may serve it as the
  // newest version before Publish does.
  const std::string previous = owner_->ServedVersion();
  if (!promote) {
    // A staged version is never the default, not even for one poll of a server that follows
    // the newest version: the store records what is served before the checkpoint appears.
    owner_->registry_->LetStoreDecide();
    if (absl::Status recorded = RecordServingIfUnrecorded(store, previous); !recorded.ok()) {
      return absl::Status(recorded.code(),
                          absl::StrCat("commit of job ", id_, " failed: ", recorded.message(),
                                       "; nothing was published"));
    }
  }
  if (absl::Status written = WriteCheckpoint(trainer_->base(), trainer_->weights(),
                                             trainer_->head(), info, store, version);
      !written.ok()) {
    return absl::Status(written.code(), absl::StrCat("commit of job ", id_, " failed: ",
                                                     written.message(), "; nothing was published"));
  }
  ModelVersion published;
  published.version = version;
  published.origin = FineTunedOrigin(base_.version, info.objective, steps_);
  published.model = trainer_->Snapshot();
  published.sequence = sequence;
  absl::StatusOr<StoredVersion> stored = ReadStoredVersion(store, version);
  published.created_utc = stored.ok() ? stored->created_utc : UtcNow("%Y-%m-%dT%H:%M:%SZ");
  published.description = stored.ok() ? stored->description : request.description;
  published.notes = notes_;
  const bool serve = promote;
  if (absl::Status added = owner_->registry_->Publish(published, serve); !added.ok()) {
    return added;
  }
  // Recorded also when the default stays (a replica or a restart must not serve the new
  // version as the newest one).
  if (absl::Status recorded = serve ? owner_->RecordOrRevert("commit", previous, version, version)
                                    : RecordServing(store, "commit-staged", previous, "", version);
      !recorded.ok()) {
    return absl::Status(recorded.code(), absl::StrCat("job ", id_, " committed version ", version,
                                                      " but: ", recorded.message()));
  }
  owner_->metrics_->RecordVersionPublished();
  Log(LogLevel::kInfo, "job %s committed version %s (%d steps, final loss %.5f) in %.2f s%s", id_,
      version, steps_, last_.loss, std::chrono::duration<double>(Clock::now() - start).count(),
      serve ? "; promoted: now served by default" : " (staged: not served by default)");
  return published;
}

void FineTuneJob::Warn(const std::vector<std::string>& warnings, FineTuneProgress* progress) {
  for (const std::string& warning : warnings) {
    Log(LogLevel::kWarning, "fine-tuning job %s: %s", id_, warning);
    progress->warnings.push_back(warning);
    if (notes_.size() < kMaxNotes) {
      notes_.push_back(warning);
    } else if (notes_.size() == kMaxNotes) {
      notes_.push_back("more warnings were raised; see the server log");
    }
  }
}

FineTuneProgress FineTuneJob::Progress() {
  FineTuneProgress progress;
  progress.job_id = id_;
  progress.step = steps_;
  progress.loss = last_.loss;
  progress.grad_norm = last_.grad_norm;
  progress.learning_rate = last_.learning_rate;
  progress.examples_per_second = last_.seconds > 0 ? last_.examples / last_.seconds : 0;
  progress.examples_seen = examples_seen_;
  if (!sent_base_version_) {
    progress.base_version = base_.version;
    sent_base_version_ = true;
  }
  progress.evaluations.assign(evaluations_.begin() + evaluations_sent_, evaluations_.end());
  evaluations_sent_ = evaluations_.size();
  return progress;
}

}  // namespace attn::server::core
