// attnctl's Trainer commands besides finetune (finetune_command.cc): versions, promote,
// rollback, serve-version.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"

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
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  std::printf("%s %s\n\n",
              rollback  ? "rolled back: now serving"
              : promote ? "promoted: now serving"
                        : "now serving",
              response->serving_version().c_str());
  PrintVersionsTable(*response);
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
       "serve the version before the current one (or --version V)",
       "attnctl rollback [--version V] [flags]",
       R"(Without --version: the version committed before the one served now. Prints the new serving
version and the versions table. Requests that pin a version keep it.
)",
       {{"Flags",
         {{"model_version", "V", "serve this (older) version instead", "version"},
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
  return group;
}

}  // namespace attn::client::attnctl
