// attnctl's server-side job commands: jobs (list), job watch|cancel|show ID. Jobs are created by
// 'attnctl finetune --detach' (finetune_command.cc, which also shows a watched job's progress).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/attnctl/progress_printer.h"
#include "client/client.h"

ABSL_FLAG(int64_t, from_event, 0,
          "job watch: the first event to show (0 = all of them; after a disconnect, the next one)");
ABSL_DECLARE_FLAG(int, log_every);  // finetune_command.cc

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// Seconds from `from` to `to`, times as the server writes them ("2026-11-27T23:55:47Z"); NaN
// when either is missing or does not parse.
double SecondsBetween(const std::string& from, const std::string& to) {
  absl::Time a, b;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, from, &a, &error) ||
      !absl::ParseTime(absl::RFC3339_full, to, &b, &error)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return absl::ToDoubleSeconds(b - a);
}

// What a watch saw of a job.
struct Watched {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string started_utc;  // when the job started (from the job, or its first running event)
  int64_t steps = 0;        // the last step seen
  bool saw_first_step = false;
  double first_loss = std::numeric_limits<double>::quiet_NaN();
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  v1::FineTuneProgress committed;
};

// Shows one event of `job` (fetched before the watch: events before its count are replays).
void ShowEvent(const v1::JobEvent& event, const v1::Job& job, ProgressPrinter* printer,
               Watched* watched) {
  if (watched->started_utc.empty() && event.state() == v1::JOB_RUNNING) {
    watched->started_utc = event.time_utc();
  }
  if (event.has_progress()) {
    const v1::FineTuneProgress& p = event.progress();
    if (!p.committed_version().empty()) watched->committed = p;
    const bool new_step = p.step() > watched->steps;
    if (new_step) {
      if (p.step() == 1) {
        watched->saw_first_step = true;
        watched->first_loss = p.loss();
      }
      watched->last_loss = p.loss();
      watched->steps = p.step();
    }
    const StepTiming timing{SecondsBetween(watched->started_utc, event.time_utc()),
                            event.index() < job.events()};
    printer->OnStep(p, new_step, timing);
  }
  if (!event.message().empty()) {
    printer->BreakLine();
    absl::FPrintF(stderr, "[%s] %s\n", event.time_utc(), event.message());
  }
}

// "job ID: succeeded, 20/20 steps, loss 3.6862 -> 0.5311": the steps the job ran and its loss,
// from the job as it ended (`ended`, when it could be fetched) whichever events were watched.
std::string WatchSummary(const v1::Job& job, const v1::Job* ended, const Watched& watched) {
  const int64_t steps = std::max<int64_t>(watched.steps, ended != nullptr ? ended->step() : 0);
  const v1::JobState state = ended != nullptr ? ended->state() : watched.state;
  std::string summary = absl::StrFormat("job %s: %s, %d/%d steps", job.job_id(),
                                        absl::AsciiStrToLower(v1::JobState_Name(state)).substr(4),
                                        steps, job.total_steps());
  const double last_loss = ended != nullptr && ended->step() > 0 && ended->step() >= watched.steps
                               ? ended->loss()
                               : watched.last_loss;
  if (watched.saw_first_step && !std::isnan(last_loss)) {
    absl::StrAppendFormat(&summary, ", loss %.4f \u2192 %.4f", watched.first_loss, last_loss);
  } else if (!std::isnan(last_loss)) {
    absl::StrAppendFormat(&summary, ", loss %.4f at step %d", last_loss, steps);
  }
  return summary;
}

// attnctl job watch: `job`'s events from `from_index` on, with finetune's progress display
// (--json: every event as a JSON line), then the job's outcome. 0 when it succeeded.
int WatchJobEvents(TrainerClient* client, const v1::Job& job, int64_t from_index) {
  ProgressPlan plan;
  plan.epochs = std::max(1, job.epochs());
  plan.total_steps = job.total_steps();
  plan.steps_per_epoch = plan.total_steps / plan.epochs;
  const int log_every = absl::GetFlag(FLAGS_log_every);
  plan.log_every = log_every > 0 ? log_every : std::max<int64_t>(1, (plan.total_steps + 19) / 20);
  const bool json = absl::GetFlag(FLAGS_json);
  ProgressPrinter printer(plan, json                    ? ProgressPrinter::Mode::kJson
                                : isatty(STDERR_FILENO) ? ProgressPrinter::Mode::kBar
                                                        : ProgressPrinter::Mode::kLines);
  if (!json) {
    absl::FPrintF(stderr,
                  "job %s (model %s): %s from version %s, %d steps (%d epoch%s x %d), batches of "
                  "%d, %d examples\n",
                  job.job_id(), job.model(), job.objective(), job.base_version(), plan.total_steps,
                  plan.epochs, plan.epochs == 1 ? "" : "s", plan.steps_per_epoch, job.batch_size(),
                  job.dataset().examples());
  }
  Watched watched;
  watched.state = job.state();
  watched.started_utc = job.started_utc();
  const absl::Status status =
      client->WatchJob(job.job_id(), job.model(), from_index, [&](const v1::JobEvent& event) {
        watched.state = event.state();
        if (json) {
          PrintJson(event);
          std::fflush(stdout);
        } else {
          ShowEvent(event, job, &printer, &watched);
        }
        return true;
      });
  printer.BreakLine();
  if (!status.ok()) return TrainerRpcError(status, client->target());
  if (json) return watched.state == v1::JOB_SUCCEEDED ? kExitOk : kExitFailure;
  absl::StatusOr<v1::Job> ended = client->GetJob(job.job_id(), job.model());
  std::printf("%s\n", WatchSummary(job, ended.ok() ? &*ended : nullptr, watched).c_str());
  if ((ended.ok() ? ended->state() : watched.state) != v1::JOB_SUCCEEDED) return kExitFailure;
  if (ended.ok()) {
    PrintCommitted(stdout, ended->committed_version(), ended->promoted(), ended->promotion());
  } else {
    PrintCommitted(stdout, watched.committed.committed_version(), watched.committed.promoted(),
                   watched.committed.promotion());
  }
  return kExitOk;
}

// "pending", "running", "succeeded", "failed", "cancelled".
std::string StateName(v1::JobState state) {
  return absl::AsciiStrToLower(v1::JobState_Name(state)).substr(4);
}

// What a job came to, in one cell: its version, its error, its loss so far, its queue place.
std::string Outcome(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_PENDING:
      return job.queue_position() == 0 ? "next to run"
                                       : absl::StrCat(job.queue_position(), " ahead");
    case v1::JOB_RUNNING:
      return job.step() > 0 ? absl::StrFormat("loss %.4f", job.loss()) : "starting";
    case v1::JOB_SUCCEEDED:
      return absl::StrCat(job.committed_version(), job.promoted() ? " (promoted)" : " (staged)");
    default:
      return ShortText(absl::StrCat(job.error_code(), ": ", job.error()), 70);
  }
}

int RunJobs(const Command&) {
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->ListJobs(absl::GetFlag(FLAGS_model));
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  if (response->jobs_size() == 0) {
    std::printf("no jobs (create one with 'attnctl finetune --detach')\n");
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const v1::Job& job : response->jobs()) {
      rows.push_back({job.job_id(), StateName(job.state()), job.created_utc(),
                      absl::StrCat(job.step(), "/", job.total_steps()), Outcome(job)});
    }
    PrintTable({"job", "state", "created", "steps", "result"}, rows, "", {});
  }
  std::printf("%d queued (at most %d)\n", response->queued(), response->max_queued_jobs());
  return kExitOk;
}

void PrintJob(const v1::Job& job) {
  auto line = [](const char* name, const std::string& value) {
    if (!value.empty()) std::printf("%-18s %s\n", name, value.c_str());
  };
  line("job", job.job_id());
  line("model", job.model());
  line("state", StateName(job.state()));
  if (job.state() == v1::JOB_PENDING) {
    line("queue position", absl::StrCat(job.queue_position(), " (0 = next to run)"));
  }
  line("created", job.created_utc());
  line("started", job.started_utc());
  line("ended", job.ended_utc());
  line("objective", job.objective());
  line("base version", job.base_version());
  line("steps",
       absl::StrFormat("%d of %d (%d epoch%s, batches of %d)", job.step(), job.total_steps(),
                       job.epochs(), job.epochs() == 1 ? "" : "s", job.batch_size()));
  if (job.step() > 0) line("loss", absl::StrFormat("%.4f", job.loss()));
  line("dataset", absl::StrFormat("%d examples, %d bytes, sha256 %s", job.dataset().examples(),
                                  job.dataset().bytes(), job.dataset().sha256()));
  line("description", job.description());
  line("commit", job.promote() ? "promote" : "staged");
  line("committed version", job.committed_version());
  line("promotion", job.promotion());
  if (!job.error().empty()) line("error", absl::StrCat(job.error_code(), ": ", job.error()));
  line("events", absl::StrCat(job.events()));
}

int RunJob(const Command& command) {
  const std::vector<std::string>& args = CommandArguments();
  const std::string action = args.empty() ? "" : args[0];
  if (args.size() != 2 || (action != "watch" && action != "cancel" && action != "show")) {
    return UsageError("job needs an action and a job id: attnctl job watch|cancel|show ID",
                      &command);
  }
  const std::string& id = args[1];
  const std::string model = absl::GetFlag(FLAGS_model);
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  if (action == "cancel") {
    auto job = client->CancelJob(id, model);
    if (!job.ok()) return TrainerRpcError(job.status(), client->target());
    if (absl::GetFlag(FLAGS_json)) return PrintJson(*job) ? kExitOk : kExitFailure;
    if (job->started_utc().empty()) {
      absl::PrintF("job %s: %s before it started; nothing was trained\n", id,
                   StateName(job->state()));
    } else {
      absl::PrintF("job %s: %s at step %d of %d; nothing was published\n", id,
                   StateName(job->state()), job->step(), job->total_steps());
    }
    return kExitOk;
  }
  auto job = client->GetJob(id, model);
  if (!job.ok()) return TrainerRpcError(job.status(), client->target());
  if (action == "show") {
    if (absl::GetFlag(FLAGS_json)) return PrintJson(*job) ? kExitOk : kExitFailure;
    PrintJob(*job);
    return kExitOk;
  }
  return WatchJobEvents(client.get(), *job, absl::GetFlag(FLAGS_from_event));
}

}  // namespace

CommandGroup JobCommands() {
  const FlagUse token_file{"token_file", "PATH"};
  const FlagUse model{"model", "NAME", "the served model (default: the server's default one)"};
  CommandGroup group{"Server-side jobs (Trainer service; the same token)", {}};
  group.commands.push_back(
      {"jobs",
       "the server-side jobs of a model: queued, running and the last 100 ended",
       "attnctl jobs [flags]",
       R"(A table, newest first: job id, state (pending, running, succeeded, failed, cancelled),
creation time (UTC), steps done of the job's steps, and its result (the committed version,
the error, the loss so far, or its place in the queue); then how many jobs wait and the
server's limit (--max-queued-jobs). Create jobs with 'attnctl finetune --detach'.
)",
       {{"Flags", {model, token_file}}, CommonFlags()},
       "  attnctl jobs\n  attnctl jobs --model mpnet --json\n",
       RunJobs});
  group.commands.push_back(
      {"job",
       "watch, cancel or show one server-side job",
       "attnctl job watch|cancel|show ID [flags]",
       R"(watch: replays the job's events from the first (--from-event N: from event N, e.g. after a
disconnect), then follows them until the job ends, with finetune's progress display; exits 0
when the job succeeded (committed its version), 1 otherwise. Ctrl-C stops watching only: the
job goes on.
cancel: stops the job (a queued one at once, a running one after its current step) and
answers once it has stopped; nothing is published. A job that has ended, or is committing its
version, cannot be cancelled.
show: everything the server records about the job (its error, if it failed).
)",
       {{"Flags",
         {{"from_event", "N"},
          {"log_every", "N", "watch without a terminal: a progress line every N steps"},
          model,
          token_file}},
        CommonFlags({{"json", "", "every event (watch) or the job as JSON on stdout"}})},
       "  attnctl job watch job-20261127T225000Z-1a2b3c4d\n"
       "  attnctl job watch job-20261127T225000Z-1a2b3c4d --from-event 40\n"
       "  attnctl job cancel job-20261127T225000Z-1a2b3c4d\n",
       RunJob,
       /*max_arguments=*/2});
  return group;
}

}  // namespace attn::client::attnctl
