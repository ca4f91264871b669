#include "server/model_slots.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/serving_state.h"
#include "engine/training/training_report.h"
#include "server/core/store_versions.h"
#include "server/server_runner.h"

namespace attn::server {
namespace {

// `text` for a POSIX shell: as it is when it is plain, else in single quotes.
std::string ShellWord(const std::string& text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
           (c != '\0' && std::strchr("_./-+:@%", c) != nullptr);
  });
  if (plain) return text;
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "'\\''"}}), "'");
}

}  // namespace

std::string MoveStoreUnderModelCommand(const std::string& store, const std::string& model) {
  // What a one-model server keeps at the store's top: its versions (ft-*), the serving record
  // and the job history; the lock file is made again where needed.
  const std::string from = ShellWord(store);
  const std::string to = ShellWord((std::filesystem::path(store) / model).string());
  std::string command = absl::StrCat("mkdir -p ", to, " && mv ", from, "/ft-*");
  for (const char* entry : {kServingStateFile, kJobsDir}) {
    std::error_code error;
    if (std::filesystem::exists(std::filesystem::path(store) / entry, error)) {
      absl::StrAppend(&command, " ", from, "/", entry);
    }
  }
  return absl::StrCat(command, " ", to, "/");
}

absl::StatusOr<std::vector<ModelSlot>> MakeModelSlots(const ServerOptions& options) {
  std::vector<ModelSlot> slots;
  double cheapest = 0;
  for (const ModelSpec& spec : options.models) {
    ModelSlot slot;
    slot.spec = spec;
    absl::StatusOr<BertConfig> config =
        LoadBertConfig((std::filesystem::path(spec.dir) / "config.json").string());
    if (!config.ok()) {
      return absl::Status(
          config.status().code(),
          absl::StrCat("cannot load the model", options.models.size() > 1 ? " " : "",
                       options.models.size() > 1 ? spec.name : "", ": ", config.status().message(),
                       " (run scripts/setup.sh for the default model, or pass "
                       "--model-dir or --model NAME=DIR)"));
    }
    slot.config = *config;
    const double cost = ModelTokenCost(slot.config);
    cheapest = cheapest == 0 ? cost : std::min(cheapest, cost);
    if (!options.model_store.empty()) {
      slot.store = options.models.size() == 1
                       ? options.model_store
                       : (std::filesystem::path(options.model_store) / spec.name).string();
    }
    slots.push_back(std::move(slot));
  }
  for (ModelSlot& slot : slots) {
    slot.batch_tokens =
        ScaledBatchTokens(options.max_batch_tokens, ModelTokenCost(slot.config), cheapest);
  }
  if (slots.size() > 1 && !options.model_store.empty()) {
    absl::StatusOr<std::vector<StoredVersion>> top = ListStore(options.model_store, nullptr);
    if (top.ok() && !top->empty()) {
      const std::string& store = options.model_store;
      return absl::FailedPreconditionError(absl::StrCat(
          "--model-store ", store, " holds versions at its top (", top->front().version,
          ", ...), the layout of a one-model server; with several --model each model keeps its "
          "versions in ",
          store,
          "/<name>/. Move them, with their serving record and job history, to the model "
          "they belong to, e.g.: ",
          MoveStoreUnderModelCommand(store, options.models.front().name),
          " (or serve one model with this store)"));
    }
  }
  return slots;
}

void AddModels(const ServerOptions& options, Metrics* metrics, std::vector<ModelSlot>* slots,
               ModelSet* models) {
  for (ModelSlot& slot : *slots) {
    const ModelSpec spec = slot.spec;
    const std::string store = slot.store;
    slot.metrics = metrics->ForModel(spec.name);
    slot.registry = std::make_unique<ModelRegistry>(
        options.max_loaded_versions, [spec, store, &options](const ModelVersion& version) {
          return LoadVersion(spec.dir, store, options.precision, version);
        });
    slot.registry->SetEvictionListener([name = spec.name](const std::string& version) {
      Log(LogLevel::kInfo,
          "model %s: unloaded version %s (--max-loaded-versions reached; it loads again "
          "when a request pins it)",
          name, version);
    });
    // Every change of the default version (start-up, commit, Rollback, SetServingVersion) shows
    // in the metrics.
    slot.registry->SetServingListener(
        [model_metrics = slot.metrics, store](const ModelVersion& served) {
          const BertConfig& c = served.model->config();
          model_metrics->SetModelInfo(served.version, c.model_type,
                                      PrecisionName(served.model->precision()), c.num_hidden_layers,
                                      c.hidden_size, c.num_attention_heads);
          model_metrics->SetServingVersion(served.version);
          // A fine-tuned version's distance from its parent, from the report stored with it.
          double change = 0;
          if (!store.empty() && served.version != "base") {
            absl::StatusOr<TrainingReport> report = ReadTrainingReport(store, served.version);
            if (report.ok()) change = report->total_relative_change;
          }
          model_metrics->SetServedVersionWeightChange(change);
        });
    slot.batcher = std::make_unique<Batcher>(
        BatcherOptions{slot.batch_tokens, options.max_concurrent_requests, options.threads},
        slot.metrics);
    models->Add({spec.name, spec.dir, store, slot.registry.get(), slot.batcher.get(), slot.metrics})
        .IgnoreError();  // names checked unique by OptionsFromFlags
  }
}

absl::StatusOr<std::vector<std::shared_ptr<const Model>>> LoadModels(
    const ServerOptions& options, const std::vector<ModelSlot>& slots) {
  ModelOptions model_options;
  model_options.precision = options.precision;
  std::vector<std::shared_ptr<const Model>> loaded;
  for (const ModelSlot& slot : slots) {
    auto model = Model::Load(slot.spec.dir, model_options);
    if (!model.ok()) {
      return absl::Status(
          model.status().code(),
          absl::StrCat("cannot load the model", slots.size() > 1 ? " " : "",
                       slots.size() > 1 ? slot.spec.name : "", ": ", model.status().message(),
                       " (run scripts/setup.sh for the default model, or pass "
                       "--model-dir or --model NAME=DIR)"));
    }
    loaded.push_back(*model);
  }
  return loaded;
}

void ReserveWorkspace(const ServerOptions& options, const std::vector<ModelSlot>& slots,
                      const std::vector<std::shared_ptr<const Model>>& loaded,
                      MemoryBudget* memory_budget) {
  int64_t workspace_bytes = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    workspace_bytes += EngineWorkspaceBytes(loaded[i]->config(), slots[i].batch_tokens);
  }
  memory_budget->Reserve(workspace_bytes);
  Log(LogLevel::kInfo,
      "memory: %d bytes per call at most (--max-request-memory-bytes), %d bytes for calls in "
      "flight (--memory-budget-bytes %d less the engine workspace)",
      options.max_request_memory_bytes, memory_budget->budget(), options.memory_budget_bytes);
}

absl::Status AddVersions(const ServerOptions& options, std::vector<ModelSlot>* slots,
                         std::vector<std::shared_ptr<const Model>> loaded, TrainerService* trainer,
                         std::vector<std::unique_ptr<StoreWatcher>>* watchers) {
  for (size_t i = 0; i < slots->size(); ++i) {
    ModelSlot& slot = (*slots)[i];
    ModelVersion base;
    base.version = "base";
    base.origin = absl::StrCat("loaded from ", slot.spec.dir);
    base.model = loaded[i];
    slot.registry->Add(std::move(base));
    if (!slot.store.empty()) {
      absl::StatusOr<int64_t> next_sequence =
          LoadModelStore(slot.store, options.watch_store_s == 0, slot.registry.get());
      if (!next_sequence.ok()) {
        return absl::Status(
            next_sequence.status().code(),
            absl::StrCat("cannot use the model store: ", next_sequence.status().message()));
      }
      trainer->SetNextSequence(slot.spec.name, *next_sequence);
    }
    if (options.watch_store_s > 0) {
      watchers->push_back(
          std::make_unique<StoreWatcher>(slot.store, options.watch_store_s, slot.registry.get()));
      Log(LogLevel::kInfo, "watching model store %s every %g s for new versions", slot.store,
          options.watch_store_s);
    }
  }
  return absl::OkStatus();
}

}  // namespace attn::server
