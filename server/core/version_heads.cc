#include "server/core/version_heads.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model_store.h"

namespace attn::server::core {

absl::StatusOr<std::shared_ptr<const VersionHead>> VersionHeads::Get(const std::string& store,
                                                                     const std::string& version,
                                                                     int64_t hidden_size) {
  const std::pair<std::string, std::string> key(store, version);
  auto no_head = [&version] {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version,
        " has no classification head; fine-tune one with the CLASSIFICATION (texts) or "
        "PAIR_CLASSIFICATION (query/document pairs) objective, commit it, and name that "
        "version"));
  };
  {
    absl::MutexLock lock(&mutex_);
    if (auto it = heads_.find(key); it != heads_.end()) {
      if (it->second == nullptr) return no_head();
      return it->second;
    }
  }
  if (store.empty()) return no_head();
  // Read outside the lock: a slow disk must not stall Classify calls of cached versions.
  absl::StatusOr<StoredVersion> stored = ReadStoredVersion(store, version);
  if (!stored.ok()) {
    // Versions the store does not hold ("base", or one loaded from elsewhere) have no head.
    if (absl::IsNotFound(stored.status())) {
      absl::MutexLock lock(&mutex_);
      heads_.emplace(key, nullptr);
      return no_head();
    }
    return stored.status();
  }
  std::shared_ptr<VersionHead> head;
  if (stored->num_labels > 0) {
    absl::StatusOr<ClassificationHead> weights = LoadStoredHead(*stored, hidden_size);
    if (!weights.ok()) return weights.status();  // not cached: a repaired file is read again
    head = std::make_shared<VersionHead>();
    head->head = *std::move(weights);
    head->objective = stored->objective;
    head->pairs = stored->objective == "pair_classification";
    head->label_names = stored->label_names;
  }
  absl::MutexLock lock(&mutex_);
  heads_.emplace(key, head);
  if (head == nullptr) return no_head();
  return std::shared_ptr<const VersionHead>(head);
}

void Softmax(const float* logits, int64_t count, float* probabilities) {
  if (count <= 0) return;
  const float max = *std::max_element(logits, logits + count);
  double sum = 0;
  for (int64_t k = 0; k < count; ++k) sum += std::exp(static_cast<double>(logits[k]) - max);
  for (int64_t k = 0; k < count; ++k) {
    probabilities[k] = static_cast<float>(std::exp(static_cast<double>(logits[k]) - max) / sum);
  }
}

}  // namespace attn::server::core
