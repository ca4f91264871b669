// The models one server serves side by side (--model NAME=DIR, repeatable): each has its own
// versions (a ModelRegistry), its own batcher queue and token budget (so a slow big model does
// not stall a small one) and its own metrics series. The first model added is the default: a
// request that names no model gets it. Lookups are lock-free: the set is filled once at start
// and read-only afterwards.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/batcher.h"
#include "server/core/model_registry.h"
#include "server/core/serving_metrics.h"

namespace attn::server {

// One served model; the pointers are owned by whoever built the set (server_runner.cc) and
// outlive it.
struct ServedModel {
  std::string name;
  std::string dir;    // the model directory its "base" version loads from
  std::string store;  // its versions' directory in the model store ("" = none)
  ModelRegistry* registry = nullptr;
  Batcher* batcher = nullptr;
  ServingMetrics* metrics = nullptr;
};

// OK when `name` can name a served model: 1..128 characters of [A-Za-z0-9._-], not starting
// with '.' (it becomes a directory of the model store and a metrics label value). Otherwise
// INVALID_ARGUMENT saying what is allowed.
absl::Status ValidateModelName(std::string_view name);

class ModelSet {
 public:
  // Adds a model; the first one added is the default. AlreadyExists if the name is taken.
  absl::Status Add(ServedModel model);

  // The model called `name` (or whose name is the part after the last '/', as in
  // "sentence-transformers/all-MiniLM-L6-v2"); empty = the default. NOT_FOUND naming the served
  // models when no model has that name (the name quoted short: engine/quote.h); UNAVAILABLE when
  // empty.
  absl::StatusOr<const ServedModel*> Find(std::string_view name) const;

  const std::vector<ServedModel>& models() const { return models_; }
  bool empty() const { return models_.empty(); }

 private:
  std::vector<ServedModel> models_;  // the default first
};

}  // namespace attn::server
