// attnctl's Trainer commands besides finetune (finetune_command.cc): versions, promote,
// rollback, serve-version, eval, report.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"
#include "client/training_data.h"

ABSL_DECLARE_FLAG(std::string, data);  // finetune_command.cc

namespace attn::client::attnctl {

Command FineTuneCommand();  // finetune_command.cc

namespace {

namespace v1 = ::attnserve::v1;

void PrintVersionsTable(const v1::ListVersionsResponse& response) {
  if (response.versions_size() == 0) {
    std::printf("no versions\n");
    return;
  }
  bool descriptions = false;
  for (const v1::VersionInfo& v : response.versions()) descriptions |= !v.description().empty();
  std::vector<std::string> header = {"", "version", "created", "origin"};
  if (descriptions) header.push_back("description");
  std::vector<std::vector<std::string>> rows;
  for (const v1::VersionInfo& v : response.versions()) {
    const bool serving = v.serving() || v.version() == response.serving_version();
    std::vector<std::string> row = {serving ? "*" : (v.staged() ? "s" : ""), v.version(),
                                    v.created_utc(), v.origin()};
    if (descriptions) row.push_back(ShortText(v.description(), 60));
    rows.push_back(std::move(row));
  }
  PrintTable(header, rows, "", {1});
}

int RunVersions(const Command&) {
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->ListVersions(absl::GetFlag(FLAGS_model));
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  PrintVersionsTable(*response);
  return kExitOk;
}

int RunServingChange(const Command& command) {
  const bool rollback = command.name == "rollback";
  const bool promote = command.name == "promote";
  const std::string version = absl::GetFlag(FLAGS_model_version);
  if (!rollback && version.empty()) {
    return UsageError(command.name + " needs --version V (see 'attnctl versions')", &command);
  }
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  const std::string model = absl::GetFlag(FLAGS_model);
  auto response = rollback  ? client->Rollback(version, model)
                  : promote ? client->Promote(version, model)
                            : client->SetServingVersion(version, model);
  if (!response.ok()) {
    TrainerRpcError(response.status(), client->target());
    if (rollback && absl::StrContains(response.status().message(), "never served")) {
      // A staged version is served by a promotion, which the store records as such.
      std::fprintf(stderr, "attnctl: hint: attnctl promote --version %s\n", version.c_str());
    }
    return kExitFailure;
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  std::printf("%s %s\n\n",
              rollback  ? "rolled back: now serving"
              : promote ? "promoted: now serving"
                        : "now serving",
              response->serving_version().c_str());
  PrintVersionsTable(*response);
  return kExitOk;
}

// One row per metric, one column per version.
void PrintEvaluations(const std::vector<v1::EvaluationResult>& results) {
  std::vector<std::string> header = {"metric"};
  for (const v1::EvaluationResult& r : results) header.push_back(r.model_version());
  std::vector<std::vector<std::string>> rows;
  for (int m = 0; m < results.front().metrics_size(); ++m) {
    std::vector<std::string> row = {results.front().metrics(m).name()};
    for (const v1::EvaluationResult& r : results) {
      row.push_back(m < r.metrics_size() ? absl::StrFormat("%.4f", r.metrics(m).value()) : "");
    }
    rows.push_back(std::move(row));
  }
  PrintTable(header, rows, "", {});
}

int RunEval(const Command& command) {
  const std::string path = absl::GetFlag(FLAGS_data);
  if (path.empty()) return UsageError("eval needs --data FILE (JSON Lines)", &command);
  auto set = ReadEvaluationData(path, DataLimits{});
  if (!set.ok()) return PrintDataError(set.status(), "eval");
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  std::vector<std::string> versions =
      absl::StrSplit(absl::GetFlag(FLAGS_model_version), kRepeatedFlagSeparator);
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) std::printf("%s: %s\n", path.c_str(), DescribeEvaluationSet(*set).c_str());
  std::vector<v1::EvaluationResult> results;
  for (const std::string& version : versions) {
    v1::EvaluateRequest request;
    request.set_model(absl::GetFlag(FLAGS_model));
    request.set_version(version);
    *request.mutable_evaluation() = *set;
    *request.mutable_tokenization() = *tokenization;
    auto result = client->Evaluate(request);
    if (!result.ok()) return TrainerRpcError(result.status(), client->target());
    if (json && !PrintJson(*result)) return kExitFailure;
    results.push_back(*std::move(result));
  }
  if (!json) PrintEvaluations(results);
  return kExitOk;
}

int RunReport(const Command& command) {
  const std::string version = absl::GetFlag(FLAGS_model_version);
  if (version.empty()) {
    return UsageError("report needs --version V (see 'attnctl versions')", &command);
  }
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto report = client->GetTrainingReport(version, absl::GetFlag(FLAGS_model));
  if (!report.ok()) return TrainerRpcError(report.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*report) ? kExitOk : kExitFailure;
  std::printf("version %s\n", report->version().c_str());
  const auto& settings = report->settings();
  std::vector<std::string> names;
  for (const auto& [name, value] : settings) names.push_back(name);
  std::sort(names.begin(), names.end());
  std::vector<std::string> shown;
  for (const std::string& name : names) shown.push_back(name + " " + settings.at(name));
  std::printf("settings: %s\n", absl::StrJoin(shown, ", ").c_str());
  if (report->loss_curve_size() > 0) {
    const v1::LossPoint& first = report->loss_curve(0);
    const v1::LossPoint& last = report->loss_curve(report->loss_curve_size() - 1);
    std::printf("loss: %.4f at step %d -> %.4f at step %d\n", first.loss(),
                static_cast<int>(first.step()), last.loss(), static_cast<int>(last.step()));
  }
  if (report->evaluations_size() > 0) {
    std::printf("\nevaluations\n");
    std::vector<std::string> header = {"step"};
    for (const v1::EvaluationMetric& m : report->evaluations(0).metrics()) {
      header.push_back(m.name());
    }
    std::vector<std::vector<std::string>> rows;
    for (const v1::EvaluationResult& e : report->evaluations()) {
      std::vector<std::string> row = {e.step() == 0 ? std::string("0 (base)")
                                                    : absl::StrCat(e.step())};
      for (const v1::EvaluationMetric& m : e.metrics()) {
        row.push_back(absl::StrFormat("%.4f", m.value()));
      }
      rows.push_back(std::move(row));
    }
    PrintTable(header, rows, "  ", {});
  }
  if (!report->promotion().empty()) std::printf("\n%s\n", report->promotion().c_str());
  std::vector<const v1::ParameterGroupTelemetry*> groups;
  for (const v1::ParameterGroupTelemetry& g : report->relative_change()) groups.push_back(&g);
  const size_t top = std::min<size_t>(8, groups.size());
  std::partial_sort(groups.begin(), groups.begin() + top, groups.end(),
                    [](auto* a, auto* b) { return a->relative_change() > b->relative_change(); });
  if (top > 0) {
    std::printf("\nparameter groups that moved most (||W - W0|| / ||W0||)\n");
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < top; ++i) {
      rows.push_back({groups[i]->name(), absl::StrFormat("%.3e", groups[i]->relative_change())});
    }
    PrintTable({"group", "relative change"}, rows, "  ", {});
  }
  std::printf("embedding rows changed: %d\n", static_cast<int>(report->embedding_rows_changed()));
  return kExitOk;
}

}  // namespace

CommandGroup TrainCommands() {
  const FlagUse token_file{"token_file", "PATH"};
  const FlagUse model{"model", "NAME", "the served model (default: the server's default one)"};
  CommandGroup group{
      "Fine-tuning and versions (Trainer service; token from --token-file PATH or "
      "$ATTNSERVE_TOKEN)",
      {}};
  group.commands.push_back(FineTuneCommand());
  group.commands.push_back(
      {"versions",
       "committed model versions and which one is served",
       "attnctl versions [flags]",
       R"(Prints a table, oldest first: version, creation time (UTC), origin (the loaded directory, or
the base version, objective and steps of a fine-tune) and description; '*' marks the version
served by default, 's' a staged one (committed, never served by default: pin it with
--model-version V, or 'attnctl promote --version V').
)",
       {{"Flags", {model, token_file}}, CommonFlags()},
       "  attnctl versions\n  attnctl versions --model mpnet --json\n",
       RunVersions});
  // --version V: the model version (Abseil's own --version, the program's, is for the others).
  group.commands.push_back(
      {"promote",
       "serve a committed (staged) version by default",
       "attnctl promote --version V [--model M] [flags]",
       R"(The last step of train -> evaluate -> promote: 'attnctl finetune --commit' stages a
version (requests that pin it with --model-version V get it, nobody else does); once it
is evaluated, promote serves it to every request that does not pin a version. The server
records the change in its model store (who, when, from, to), so it survives restarts and
--watch-store replicas follow it. 'attnctl rollback' undoes it. Prints the new serving
version and the versions table.
)",
       {{"Flags",
         {{"model_version", "V", "the version to promote, required (see 'attnctl versions')",
           "version"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl promote --version ft-000002-20261122T041900Z\n"
       "  attnctl promote --version ft-000001-20261122T040000Z --model mpnet\n",
       RunServingChange});
  group.commands.push_back(
      {"rollback",
       "serve again the version served before the current one (or --version V)",
       "attnctl rollback [--version V] [flags]",
       R"(Without --version: the version served by default before the one served now (the serving
history the server records: promotions, commits that served, rollbacks), never a version that
was committed staged and never promoted: 'attnctl promote --version V' serves one of those.
Each rollback goes one step further back. Prints the new serving version and the versions
table. Requests that pin a version keep it.
)",
       {{"Flags",
         {{"model_version", "V", "serve this version, served by default before, instead",
           "version"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl rollback\n  attnctl rollback --version base\n",
       RunServingChange});
  group.commands.push_back(
      {"serve-version",
       "serve --version V by default",
       "attnctl serve-version --version V [flags]",
       "Prints the new serving version and the versions table.\n",
       {{"Flags",
         {{"model_version", "V", "the version to serve, required (see 'attnctl versions')",
           "version"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl serve-version --version ft-000002-20261122T041900Z\n",
       RunServingChange});
  FlagUse versions{"model_version", "V",
                   "a version to score (repeat --version to compare; default: the served one)",
                   "version"};
  versions.repeatable = true;
  group.commands.push_back(
      {"eval",
       "score versions on held-out data: retrieval, cosine similarity or classification",
       "attnctl eval --data FILE [--version V --version W ...] [flags]",
       R"(Scores each version on the file without training (the server's Evaluate call: read-only,
the same token as 'attnctl versions') and prints one row per metric, one column per version.
The file's first JSON object tells the task:
  retrieval            {"query": "...", "item": "..."}   the item relevant to the query; a
                       line {"item": "..."} alone adds a distractor. The corpus is every
                       distinct item. Metrics: mrr@10, recall@1, recall@10, ndcg@10 (the
                       relevant item's rank among the corpus by cosine)
  contrastive pairs    {"anchor": ..., "positive": ...[, "negative": ...]}: retrieval of each
                       anchor's positive among every positive and negative of the file
  cosine similarity    {"first": ..., "second": ..., "score": 0.8}: spearman
  classification       {"text": ..., "label": 2}: accuracy, macro_f1 (a version with a head)
  pair classification  {"first": ..., "second": ..., "label": 1}: accuracy, macro_f1
At most 5,000 texts per file. --json prints each version's result, per example included (the
rank, cosine or predicted label of each line).
)",
       {{"Flags",
         {{"data", "FILE", "held-out data (JSON Lines), required"},
          versions,
          {"max_length", "N", "max tokens per text; 0 = the model's default"},
          {"truncation", "MODE"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl eval --data catalog-heldout.jsonl\n"
       "  attnctl eval --data catalog-heldout.jsonl --version base --version "
       "ft-000001-20261127T230000Z\n",
       RunEval});
  group.commands.push_back(
      {"report",
       "what a fine-tuning job recorded with its version: settings, loss, evaluations",
       "attnctl report --version V [flags]",
       R"(Prints the training report stored with a committed version: the job's settings, the loss
from the first to the last step, its evaluations (the base at step 0, every --eval-every steps,
the committed weights last), the promotion decision, the parameter groups that moved most
and how many word-embedding rows changed. --json prints it all (the whole loss curve).
)",
       {{"Flags",
         {{"model_version", "V", "a committed version, required (see 'attnctl versions')",
           "version"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl report --version ft-000001-20261127T230000Z\n",
       RunReport});
  return group;
}

}  // namespace attn::client::attnctl
