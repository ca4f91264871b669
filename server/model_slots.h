// The served models' parts and the start-up steps that make them (RunServer, server_runner.cc):
// each model's config, token budget and store directory, its registry and batcher, its weights
// and its versions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "server/core/batcher.h"
#include "server/core/cost_model.h"
#include "server/core/model_registry.h"
#include "server/core/model_set.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/store_watcher.h"
#include "server/trainer_service.h"

namespace attn::server {

// One served model's parts (model_set.h's ServedModel points into it).
struct ModelSlot {
  ModelSpec spec;
  std::string store;  // its directory of the model store ("" = none)
  BertConfig config;
  int64_t batch_tokens = 0;  // its batcher's token budget (ScaledBatchTokens)
  ModelMetrics* metrics = nullptr;
  std::unique_ptr<ModelRegistry> registry;
  std::unique_ptr<Batcher> batcher;
};

// The models' configs (config.json only), token budgets and store directories. The model store
// layout: one served model keeps its versions in --model-store itself (as before); with several,
// each keeps them in <store>/<name>/, and a store holding versions at its top (made by a
// one-model server) is refused with how to move them, so no version is served by the wrong
// model.
absl::StatusOr<std::vector<ModelSlot>> MakeModelSlots(const ServerOptions& options);

// Each served model: its own versions, batcher queue (token budget scaled by its cost) and
// metrics series, added to `models`.
void AddModels(const ServerOptions& options, Metrics* metrics, std::vector<ModelSlot>* slots,
               ModelSet* models);

// Every model's weights: all load before any serves, so a server never starts half-loaded.
absl::StatusOr<std::vector<std::shared_ptr<const Model>>> LoadModels(
    const ServerOptions& options, const std::vector<ModelSlot>& slots);

// The engine's per-thread workspace lives as long as the server: off the budget once.
void ReserveWorkspace(const ServerOptions& options, const std::vector<ModelSlot>& slots,
                      const std::vector<std::shared_ptr<const Model>>& loaded,
                      MemoryBudget* memory_budget);

// Each model's versions: the loaded weights as "base", then its store's (and, with
// --watch-store-s, a watcher of the store for new ones).
absl::Status AddVersions(const ServerOptions& options, std::vector<ModelSlot>* slots,
                         std::vector<std::shared_ptr<const Model>> loaded, TrainerService* trainer,
                         std::vector<std::unique_ptr<StoreWatcher>>* watchers);

}  // namespace attn::server
