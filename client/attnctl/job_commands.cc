// attnctl's server-side job commands: jobs (list), job watch|cancel|show ID. Jobs are created by
// 'attnctl finetune --detach' (finetune_command.cc, which also shows a watched job's progress).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"

ABSL_FLAG(int64_t, from_event, 0,
          "job watch: the first event to show (0 = all of them; after a disconnect, the next one)");

namespace attn::client::attnctl {

int WatchJobEvents(TrainerClient* client, const attnserve::v1::Job& job,
                   int64_t from_index);  // finetune_command.cc

namespace {

namespace v1 = ::attnserve::v1;

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
