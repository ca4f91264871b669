// attnctl finetune: checks a JSON Lines file and the flags (the whole job, before connecting),
// then runs the job through FineTuneRunner with live progress; Ctrl-C aborts it cleanly.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/attnctl/progress_printer.h"
#include "client/client.h"
#include "client/fine_tune_runner.h"
#include "client/training_data.h"
#include "engine/training/epoch_order.h"

ABSL_FLAG(std::string, data, "", "training data (JSON Lines), required");
ABSL_FLAG(std::string, objective, "",
          "contrastive | cosine | classification | pair_classification, required");
ABSL_FLAG(int, epochs, 1, "passes over the data");
ABSL_FLAG(double, lr, 2e-5, "peak learning rate, AdamW");
ABSL_FLAG(int, batch_size, 16, "examples per step, at most the server's --max-inputs-per-request");
ABSL_FLAG(int64_t, warmup_steps, 0, "linear warm-up steps before the linear decay to 0");
ABSL_FLAG(int, num_labels, 0,
          "classification: classes (default: the largest label in the data + 1)");
ABSL_FLAG(std::string, parameters, "all",
          "what is trained: all | attention (Q, K, V, O) | all-but-embeddings | head "
          "(classification head only)");
ABSL_FLAG(uint64_t, seed, 0,
          "seeds the per-epoch shuffle, dropout masks and the head initialisation");
ABSL_FLAG(bool, no_dropout, false, "train without dropout");
ABSL_FLAG(std::string, precision, "",
          "float32 (the server's default) or bfloat16: mixed precision, the matmuls on bf16 "
          "inputs with fp32 master weights (fast on CPUs with avx512_bf16 or AMX)");
ABSL_FLAG(std::string, base_version, "", "start from this version (default: the served one)");
ABSL_FLAG(bool, commit, false,
          "publish the result as a new version, staged: listed and pinnable per request "
          "(--model-version), not served by default until promoted");
ABSL_FLAG(bool, promote, false,
          "with --commit: serve the new version by default once committed (else 'attnctl "
          "promote --version V' after evaluating it)");
ABSL_FLAG(bool, do_not_serve, false,
          "deprecated, no effect: --commit stages the version unless --promote is given");
ABSL_FLAG(std::string, label_names, "",
          "classification objectives: the classes' names, comma-separated, one per label "
          "(Classify returns them)");
ABSL_FLAG(std::string, description, "", "stored with the committed version (with --commit)");
ABSL_FLAG(int, log_every, 0,
          "without a terminal: a progress line every N steps; also how often the server reports "
          "training telemetry (the matrices that moved most); 0 = about 20 per job");
ABSL_FLAG(bool, dry_run, false, "check the data, print the plan, do not connect");
ABSL_FLAG(std::string, eval_data, "",
          "held-out data (JSON Lines, see 'attnctl eval --help') scored on the base, every "
          "--eval-every steps and on the trained weights");
ABSL_FLAG(int, eval_every, 0,
          "steps between evaluations on --eval-data; 0 = only the base and the end");
ABSL_FLAG(std::string, promote_if, "",
          "with --commit: promote the version only if this holds on --eval-data, e.g. "
          "\"recall@1>=0.8\" or \"mrr@10>base\" (conditions joined by ',')");
ABSL_FLAG(bool, detach, false,
          "upload the data and let the server run the job on its own (a server-side job): "
          "prints its id and exits; the job commits its version at its end (staged unless "
          "--promote). 'attnctl job watch ID' follows it, 'attnctl job cancel ID' stops it");

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

struct FineTunePlan {
  std::string data_path;
  TrainingData data;
  int epochs = 1;
  int batch_size = 16;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  uint64_t seed = 0;
  bool commit = false;
  bool promote = false;
  std::string description;
  std::string eval_data_path;  // "" = no evaluation set
  v1::FineTuneConfig config;
};

// Steps between progress lines (and telemetry): --log-every, else about 20 per job.
int64_t LogEvery(const FineTunePlan& plan) {
  const int log_every = absl::GetFlag(FLAGS_log_every);
  return log_every > 0 ? log_every : std::max<int64_t>(1, (plan.total_steps + 19) / 20);
}

std::string DescribePlan(const FineTunePlan& plan) {
  const size_t n = plan.data.examples.size();
  std::string what = absl::StrFormat("%d %s examples", n, ObjectiveFlagName(plan.data.objective));
  if (plan.data.objective == v1::CONTRASTIVE && plan.data.has_negatives) {
    absl::StrAppend(&what, " with hard negatives");
  }
  if (plan.data.objective == v1::CLASSIFICATION || plan.data.objective == v1::PAIR_CLASSIFICATION) {
    absl::StrAppendFormat(&what, ", %d labels", plan.config.num_labels());
  }
  auto plural = [](int64_t k, const char* word) {
    return absl::StrFormat("%d %s%s", k, word, k == 1 ? "" : "s");
  };
  std::string steps =
      absl::StrFormat("%s x %s = %s, ", plural(plan.epochs, "epoch"),
                      plural(plan.steps_per_epoch, "step"), plural(plan.total_steps, "step"));
  if (static_cast<int64_t>(n) <= plan.batch_size) {
    absl::StrAppendFormat(&steps, "one batch of %d", n);
  } else if (n % plan.batch_size == 0) {
    absl::StrAppendFormat(&steps, "batches of %d", plan.batch_size);
  } else if (n % plan.batch_size == 1 && plan.data.objective == v1::CONTRASTIVE &&
             plan.batch_size >= 3) {
    // One pair alone teaches nothing: the runner moves one from the batch before (EpochBatches).
    absl::StrAppendFormat(&steps, "batches of %d (the last two of each epoch: %d and 2)",
                          plan.batch_size, plan.batch_size - 1);
  } else {
    absl::StrAppendFormat(&steps, "batches of %d (the last of each epoch: %d)", plan.batch_size,
                          n % plan.batch_size);
  }
  std::string lr = absl::StrFormat("lr %g", plan.config.learning_rate());
  if (plan.config.warmup_steps() > 0) {
    absl::StrAppendFormat(&lr, ", warm-up %d steps", plan.config.warmup_steps());
  }
  absl::StrAppend(&lr, ", linear decay to 0");
  std::string described =
      absl::StrFormat("%s: %s\nplan: %s; %s; seed %d", plan.data_path, what, steps, lr, plan.seed);
  if (!plan.eval_data_path.empty()) {
    const v1::EvaluationSet& set = plan.config.evaluation();
    absl::StrAppendFormat(&described, "\nevaluation: %s, %s", plan.eval_data_path,
                          DescribeEvaluationSet(set));
    absl::StrAppend(&described, plan.config.eval_every() > 0
                                    ? absl::StrFormat(", every %d steps", plan.config.eval_every())
                                    : std::string(", on the base and the trained weights"));
    if (!plan.config.promote_if().empty()) {
      absl::StrAppend(&described, "; promote if ", plan.config.promote_if());
    }
  }
  return described;
}

// Checks the flags and the data file: the whole job, before any connection. Returns the exit
// code on error.
absl::StatusOr<FineTunePlan> PlanFineTune(const Command& command, int* exit_code) {
  auto usage = [&](const std::string& message) {
    *exit_code = UsageError(message, &command);
    return absl::InvalidArgumentError(message);
  };
  FineTunePlan plan;
  plan.data_path = absl::GetFlag(FLAGS_data);
  if (plan.data_path.empty()) return usage("finetune needs --data FILE (JSON Lines)");
  const std::string objective_flag = absl::AsciiStrToLower(absl::GetFlag(FLAGS_objective));
  v1::Objective objective;
  if (objective_flag == "contrastive") {
    objective = v1::CONTRASTIVE;
  } else if (objective_flag == "cosine" || objective_flag == "cosine-similarity" ||
             objective_flag == "cosine_similarity") {
    objective = v1::COSINE_SIMILARITY;
  } else if (objective_flag == "classification") {
    objective = v1::CLASSIFICATION;
  } else if (objective_flag == "pair_classification" || objective_flag == "pair-classification") {
    objective = v1::PAIR_CLASSIFICATION;
  } else if (objective_flag.empty()) {
    return usage(
        "finetune needs --objective contrastive|cosine|classification|pair_classification");
  } else {
    return usage(absl::StrCat(
        "--objective must be contrastive, cosine, classification or pair_classification, not '",
        objective_flag, "'"));
  }
  const bool has_head = objective == v1::CLASSIFICATION || objective == v1::PAIR_CLASSIFICATION;
  plan.epochs = absl::GetFlag(FLAGS_epochs);
  if (plan.epochs < 1) return usage("--epochs must be >= 1");
  plan.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (plan.batch_size < 1) return usage("--batch-size must be >= 1");
  const double lr = absl::GetFlag(FLAGS_lr);
  if (!(lr > 0) || !std::isfinite(lr)) return usage("--lr must be a positive number");
  const int64_t warmup = absl::GetFlag(FLAGS_warmup_steps);
  if (warmup < 0) return usage("--warmup-steps must be >= 0");
  const int num_labels = absl::GetFlag(FLAGS_num_labels);
  if (num_labels != 0 && !has_head) {
    return usage("--num-labels applies to --objective classification and pair_classification only");
  }
  std::vector<std::string> label_names;
  if (const std::string names = absl::GetFlag(FLAGS_label_names); !names.empty()) {
    if (!has_head) {
      return usage("--label-names applies to --objective classification and pair_classification");
    }
    label_names = absl::StrSplit(names, ',');
    if (num_labels != 0 && static_cast<int>(label_names.size()) != num_labels) {
      return usage(absl::StrFormat("--label-names has %d names for --num-labels %d",
                                   label_names.size(), num_labels));
    }
  }
  if (num_labels < 0 || num_labels == 1) return usage("--num-labels must be >= 2");
  const std::string parameters = absl::AsciiStrToLower(absl::GetFlag(FLAGS_parameters));
  v1::ParameterSelection selection;
  if (parameters == "all") {
    selection = v1::PARAMETERS_ALL;
  } else if (parameters == "attention") {
    selection = v1::PARAMETERS_ATTENTION_ONLY;
  } else if (parameters == "all-but-embeddings" || parameters == "all_but_embeddings") {
    selection = v1::PARAMETERS_ALL_BUT_EMBEDDINGS;
  } else if (parameters == "head") {
    selection = v1::PARAMETERS_HEAD_ONLY;
  } else {
    return usage(absl::StrCat(
        "--parameters must be all, attention, all-but-embeddings or head, not '", parameters, "'"));
  }
  if (selection == v1::PARAMETERS_HEAD_ONLY && !has_head) {
    return usage(
        "--parameters head needs --objective classification or pair_classification (only they "
        "have a head)");
  }
  // A detached job always commits its version (what else would it leave?).
  plan.commit = absl::GetFlag(FLAGS_commit) || absl::GetFlag(FLAGS_detach);
  plan.promote = absl::GetFlag(FLAGS_promote);
  const bool do_not_serve = absl::GetFlag(FLAGS_do_not_serve);
  if (do_not_serve && !plan.commit) return usage("--do-not-serve goes with --commit");
  if (plan.promote && !plan.commit) return usage("--promote goes with --commit");
  if (plan.promote && do_not_serve) {
    return usage(
        "--promote and --do-not-serve contradict each other (--do-not-serve is "
        "deprecated: a commit is staged unless --promote)");
  }
  const std::string eval_data = absl::GetFlag(FLAGS_eval_data);
  const int eval_every = absl::GetFlag(FLAGS_eval_every);
  const std::string promote_if = absl::GetFlag(FLAGS_promote_if);
  if (eval_every < 0) return usage("--eval-every must be >= 0");
  if (eval_every > 0 && eval_data.empty()) return usage("--eval-every goes with --eval-data FILE");
  if (!promote_if.empty()) {
    if (eval_data.empty()) {
      return usage("--promote-if needs --eval-data FILE: the gate compares its scores");
    }
    if (!plan.commit) return usage("--promote-if goes with --commit");
    plan.promote = true;  // promote when the gate holds, else stage
  }
  plan.description = absl::GetFlag(FLAGS_description);
  if (!plan.description.empty() && !plan.commit) {
    return usage("--description is stored with a committed version: add --commit");
  }
  if (absl::GetFlag(FLAGS_log_every) < 0) return usage("--log-every must be >= 0");
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return usage(std::string(tokenization.status().message()));

  DataLimits limits;
  limits.num_labels = num_labels;
  auto data = ReadTrainingData(plan.data_path, objective, limits);
  if (!data.ok()) {
    *exit_code = PrintDataError(data.status(), "finetune");
    return data.status();
  }
  plan.data = *std::move(data);
  if (!eval_data.empty()) {
    auto evaluation = ReadEvaluationData(eval_data, DataLimits{});
    if (!evaluation.ok()) {
      *exit_code = PrintDataError(evaluation.status(), "finetune");
      return evaluation.status();
    }
    *plan.config.mutable_evaluation() = *std::move(evaluation);
    plan.config.set_eval_every(eval_every);
    plan.config.set_promote_if(promote_if);
    plan.eval_data_path = eval_data;
  }
  if (objective == v1::CONTRASTIVE &&
      attn::EndsWithALonePair(plan.data.examples.size(), plan.batch_size)) {
    return usage(absl::StrFormat(
        "with %d pairs in batches of %d each epoch would end with a batch of 1 pair, which the "
        "contrastive objective cannot learn from; use --batch-size 3 or more",
        plan.data.examples.size(), plan.batch_size));
  }
  plan.steps_per_epoch = StepsPerEpoch(plan.data.examples.size(), plan.batch_size);
  plan.total_steps = plan.steps_per_epoch * plan.epochs;
  if (warmup > plan.total_steps) {
    return usage(
        absl::StrFormat("--warmup-steps %d exceeds the job's %d steps", warmup, plan.total_steps));
  }
  plan.seed = absl::GetFlag(FLAGS_seed);

  v1::FineTuneConfig& config = plan.config;
  config.set_objective(objective);
  config.set_learning_rate(lr);
  config.set_warmup_steps(warmup);
  config.set_total_steps(plan.total_steps);
  config.set_parameters(selection);
  config.set_seed(plan.seed);
  config.set_disable_dropout(absl::GetFlag(FLAGS_no_dropout));
  config.set_precision(absl::GetFlag(FLAGS_precision));
  config.set_base_version(absl::GetFlag(FLAGS_base_version));
  config.set_model(absl::GetFlag(FLAGS_model));
  // Telemetry as often as progress lines: what each matrix did (--json has all of it).
  config.set_telemetry_every(static_cast<int32_t>(LogEvery(plan)));
  *config.mutable_tokenization() = *tokenization;
  if (has_head) {
    const int labels = num_labels > 0         ? num_labels
                       : !label_names.empty() ? static_cast<int>(label_names.size())
                                              : std::max(2, plan.data.max_label + 1);
    if (!label_names.empty() && plan.data.max_label >= static_cast<int>(label_names.size())) {
      return usage(absl::StrFormat("the data has label %d but --label-names names %d classes",
                                   plan.data.max_label, label_names.size()));
    }
    config.set_num_labels(labels);
    for (const std::string& name : label_names) config.add_label_names(name);
  }
  return plan;
}

// --detach: the plan as a server-side job (CreateJob); its id on stdout, the rest on stderr.
int RunDetached(const FineTunePlan& plan, TrainerClient* client) {
  v1::JobSpec spec;
  *spec.mutable_config() = plan.config;
  spec.set_epochs(plan.epochs);
  spec.set_batch_size(plan.batch_size);
  spec.set_description(plan.description);
  spec.set_promote(plan.promote);
  absl::StatusOr<v1::Job> job = client->CreateJob(std::move(spec), plan.data.examples);
  if (!job.ok()) return TrainerRpcError(job.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*job) ? kExitOk : kExitFailure;
  const std::string& id = job->job_id();
  const std::string where = job->state() != v1::JOB_PENDING ? "running"
                            : job->queue_position() == 0
                                ? "queued, next to run"
                                : absl::StrCat("queued behind ", job->queue_position(), " job(s)");
  std::printf("%s\n", id.c_str());
  absl::FPrintF(stderr,
                "created job %s (%s, %d steps): the server runs it with no client attached and "
                "commits its version at the end, %s\n  follow it: attnctl job watch %s\n  "
                "stop it:   attnctl job cancel %s\n",
                id, where, job->total_steps(),
                !job->promote() ? std::string("staged")
                : plan.config.promote_if().empty()
                    ? std::string("promoted")
                    : "promoted if " + plan.config.promote_if() + " holds, else staged",
                id, id);
  return kExitOk;
}

// Set by SIGINT/SIGTERM: the runner to interrupt, and the last signal.
std::atomic<FineTuneRunner*> g_runner{nullptr};
std::atomic<int> g_interrupt_signal{0};

void OnInterrupt(int signal) {
  g_interrupt_signal.store(signal);
  if (FineTuneRunner* runner = g_runner.load()) runner->Interrupt();
}

void InstallInterruptHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int RunFineTune(const Command& command) {
  int exit_code = kExitOk;
  auto planned = PlanFineTune(command, &exit_code);
  if (!planned.ok()) return exit_code;
  const FineTunePlan& plan = *planned;
  const bool json = absl::GetFlag(FLAGS_json);
  if (absl::GetFlag(FLAGS_dry_run)) {
    std::printf("%s\n", DescribePlan(plan).c_str());
    std::printf("dry run: data OK, nothing sent\n");
    return kExitOk;
  }
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  std::fprintf(stderr, "%s\n", DescribePlan(plan).c_str());
  if (absl::GetFlag(FLAGS_detach)) return RunDetached(plan, client.get());

  const ProgressPrinter::Mode mode = json                    ? ProgressPrinter::Mode::kJson
                                     : isatty(STDERR_FILENO) ? ProgressPrinter::Mode::kBar
                                                             : ProgressPrinter::Mode::kLines;
  ProgressPrinter printer({plan.epochs, plan.steps_per_epoch, plan.total_steps, LogEvery(plan)},
                          mode);
  std::unique_ptr<FineTuneSession> session = client->FineTune();
  FineTuneRunnerOptions options;
  const int timeout_ms = std::max(0, absl::GetFlag(FLAGS_timeout_ms));
  options.idle_timeout = std::chrono::milliseconds(timeout_ms);
  FineTuneRunner runner(session.get(), options, &printer);
  g_runner.store(&runner);
  InstallInterruptHandlers();
  FineTuneJob job;
  job.config = plan.config;
  job.examples = plan.data.examples;
  job.epochs = plan.epochs;
  job.batch_size = plan.batch_size;
  job.commit = plan.commit;
  job.description = plan.description;
  job.promote = plan.promote;
  const FineTuneOutcome outcome = runner.Run(job);
  g_runner.store(nullptr);  // a late signal must not reach the runner once it is gone
  printer.BreakLine();
  if (!outcome.started) return TrainerRpcError(outcome.status, client->target());
  const double seconds = printer.Elapsed();

  // Summary: stdout, or stderr when stdout carries the JSON lines.
  FILE* out = json ? stderr : stdout;
  std::string summary = absl::StrFormat("%d/%d steps in %s", outcome.steps, plan.total_steps,
                                        FormatDuration(seconds));
  if (!std::isnan(outcome.first_loss)) {
    absl::StrAppendFormat(&summary, ", loss %.4f \u2192 %.4f", outcome.first_loss,
                          outcome.last_loss);
  }
  if (!outcome.job_id.empty()) summary = absl::StrCat("job ", outcome.job_id, ": ", summary);
  if (!outcome.base_version.empty()) {
    absl::StrAppend(&summary, " (from ", outcome.base_version, ")");
  }

  if (outcome.timed_out) {
    std::fprintf(out, "%s\n", summary.c_str());
    std::fprintf(stderr,
                 "attnctl: no answer from the server for %d ms: cancelled the job (nothing "
                 "committed; raise --timeout-ms for slow steps, 0 = no limit)\n",
                 timeout_ms);
    return kExitFailure;
  }
  if (outcome.interrupted && outcome.committed_version.empty()) {
    std::fprintf(out, "%s\n", summary.c_str());
    std::fprintf(out, "aborted: nothing committed, serving unchanged\n");
    const int signal = g_interrupt_signal.load();
    return 128 + (signal > 0 ? signal : SIGINT);
  }
  if (!outcome.ended_ok()) {
    // A job refused at the start (auth, a running job, a bad config) gets the error alone.
    if (outcome.job_id.empty()) return TrainerRpcError(outcome.status, client->target());
    std::fprintf(out, "%s\n", summary.c_str());
    TrainerRpcError(outcome.status, client->target());
    absl::FPrintF(stderr, "attnctl: the job stopped after step %d of %d; nothing committed\n",
                  outcome.steps, plan.total_steps);
    return kExitFailure;
  }
  std::fprintf(out, "%s\n", summary.c_str());
  if (const std::string change = printer.EvaluationChange(); !change.empty()) {
    std::fprintf(out, "%s\n", change.c_str());
  }
  if (plan.commit) {
    if (outcome.committed_version.empty()) {
      std::fprintf(stderr, "attnctl: the server ended the job without a committed version\n");
      return kExitFailure;
    }
    PrintCommitted(out, outcome.committed_version, outcome.promoted, outcome.promotion);
  } else {
    std::fprintf(out, "not committed (pass --commit to publish)\n");
  }
  return kExitOk;
}

}  // namespace

Command FineTuneCommand() {
  return {"finetune",
          "fine-tune on a JSON Lines file, with live progress; --commit stages a version",
          "attnctl finetune --data FILE --objective OBJ [flags]",
          R"(The file is checked completely before connecting (errors name file:line). Examples are
shuffled every epoch (--seed), sent in batches of --batch-size, one optimisation step per
batch; the server's learning rate warms up over --warmup-steps, then decays linearly to 0 at
the last step (ceil(examples / batch-size) x epochs). Progress goes to stderr: a live bar on a
terminal, else a line every --log-every steps. Without --commit the trained weights are
discarded at the end (watch the loss first). Ctrl-C aborts the job (nothing is published,
serving is unchanged).

The flow is train -> evaluate -> promote: --commit publishes a new version *staged* (listed
by 'attnctl versions', served only to requests that pin it with --model-version V, never
the default), so you can evaluate it before any other client sees it; then 'attnctl
promote --version V' serves it by default ('attnctl rollback' undoes). --commit --promote
serves it by default as soon as it is committed.

Data, one JSON object per line (other fields ignored, blank lines skipped):
  contrastive       {"anchor": "...", "positive": "...", "negative": "..."}
                    (negative optional: on every line or on none; in-batch negatives, so
                    larger batches help)
  cosine            {"first": "...", "second": "...", "score": 0.8}   score in [-1, 1]
  classification    {"text": "...", "label": 2}   label in [0, num-labels)
  pair_classification {"first": "query", "second": "document", "label": 1}
                    a cross-encoder head over the pair; label 1 = relevant is what
                    'attnctl rerank' scores
A classification job's version has a head 'attnctl classify' uses: leave it staged
(no --promote) so the embeddings every other client gets stay as they are.

Evaluation: --eval-data FILE (held-out data; formats in 'attnctl eval --help') is scored on
the base version before the first step, every --eval-every steps and on the weights a
--commit publishes; the scores are printed, stored in the version's training report
('attnctl report --version V') and can gate promotion: --commit --promote-if
"recall@1>=0.8" promotes only if that holds, else the version stays staged and the
summary says why ("base", "base+0.02" compare with the base version's score).
)",
          {{"Flags",
            {{"data", "FILE"},
             {"objective", "OBJ"},
             {"epochs", "N"},
             {"lr", "X"},
             {"batch_size", "N"},
             {"warmup_steps", "N"},
             {"num_labels", "K"},
             {"label_names", "A,B,..."},
             {"parameters", "P"},
             {"seed", "S"},
             {"no_dropout", ""},
             {"precision", "P"},
             {"max_length", "N", "max tokens per text; 0 = the model's default"},
             {"truncation", "MODE"},
             {"base_version", "V"},
             {"model", "NAME", "fine-tune this served model (default: the server's default)"},
             {"commit", ""},
             {"promote", ""},
             {"do_not_serve", ""},
             {"description", "TEXT"},
             {"eval_data", "FILE"},
             {"eval_every", "N"},
             {"promote_if", "EXPR"},
             {"token_file", "PATH"},
             {"log_every", "N"},
             {"dry_run", ""},
             {"detach", ""}}},
           CommonFlags({{"timeout_ms", "N",
                         "longest wait for the server's next message in milliseconds; 0 = none"},
                        {"json", "", "every progress message as a JSON line on stdout"}})},
          R"(  attnctl finetune --data pairs.jsonl --objective contrastive --epochs 2 --lr 2e-5 \
      --batch-size 16 --warmup-steps 10 --commit --description "support FAQ pairs"
  attnctl promote --version ft-000003-20261122T050000Z
  attnctl finetune --data sts.jsonl --objective cosine --dry-run
  attnctl finetune --data intents.jsonl --objective classification --num-labels 5 --json
  attnctl finetune --data tickets.jsonl --objective classification \
      --label-names billing,bug,other --commit
  attnctl finetune --data catalog-train.jsonl --objective contrastive --lr 1e-4 \
      --eval-data catalog-heldout.jsonl --eval-every 5 --commit --promote-if "recall@1>=base+0.3"
)",
          RunFineTune};
}

}  // namespace attn::client::attnctl
