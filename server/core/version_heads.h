// The classification heads of committed versions, read from the model store when Classify or
// Rerank first asks for one and kept: a version is immutable, so its head never changes, and a
// head is small (num_labels x hidden floats).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/training/losses.h"

namespace attn::server::core {

// A version's trained head, as the job that trained it left it.
struct VersionHead {
  ClassificationHead head;
  // PAIR_CLASSIFICATION: the head reads a text pair encoded together (a cross-encoder);
  // else single texts (CLASSIFICATION).
  bool pairs = false;
  std::string objective;                 // "classification" or "pair_classification"
  std::vector<std::string> label_names;  // empty, or one per label
};

class VersionHeads {
 public:
  // The head of `version` of a model with `hidden_size` whose versions live in `store` ("" =
  // none: then no version has a head). FAILED_PRECONDITION naming the version when it has none
  // (the base model, a version trained with another objective); the store's error (DATA_LOSS
  // for a damaged head file) when it cannot be read.
  absl::StatusOr<std::shared_ptr<const VersionHead>> Get(const std::string& store,
                                                         const std::string& version,
                                                         int64_t hidden_size);

 private:
  absl::Mutex mutex_;
  // By (store, version); null for a version known to have no head.
  std::map<std::pair<std::string, std::string>, std::shared_ptr<const VersionHead>> heads_
      ABSL_GUARDED_BY(mutex_);
};

// Softmax of `logits` (K values) into `probabilities`, computed in double and stable for any
// finite logits.
void Softmax(const float* logits, int64_t count, float* probabilities);

}  // namespace attn::server::core
