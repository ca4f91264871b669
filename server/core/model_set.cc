#include "server/core/model_set.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/quote.h"

namespace attn::server {

absl::Status ValidateModelName(std::string_view name) {
  constexpr size_t kMaxModelNameBytes = 128;
  bool valid = !name.empty() && name.size() <= kMaxModelNameBytes && name.front() != '.';
  for (const char c : name) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-');
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model name ", QuoteInput(name), " is not valid: use 1 to ", kMaxModelNameBytes,
                   " characters among letters, digits, '.', '_' and '-', not starting with '.'"));
}

absl::Status ModelSet::Add(ServedModel model) {
  for (const ServedModel& served : models_) {
    if (served.name == model.name) {
      return absl::AlreadyExistsError(
          absl::StrCat("model name '", model.name, "' is given twice; name each model once"));
    }
  }
  models_.push_back(std::move(model));
  return absl::OkStatus();
}

absl::StatusOr<const ServedModel*> ModelSet::Find(std::string_view name) const {
  if (models_.empty()) return absl::UnavailableError("no model is loaded yet");
  if (name.empty()) return &models_.front();
  for (const ServedModel& served : models_) {
    if (served.name == name) return &served;
  }
  // A hub-style name ("sentence-transformers/all-MiniLM-L6-v2") names the model of its last part.
  if (const size_t slash = name.rfind('/'); slash != std::string_view::npos) {
    for (const ServedModel& served : models_) {
      if (served.name == name.substr(slash + 1)) return &served;
    }
  }
  std::vector<std::string> names;
  for (const ServedModel& served : models_) names.push_back(served.name);
  return absl::NotFoundError(
      absl::StrCat("model ", QuoteInput(name), " is not served here; served models: ",
                   absl::StrJoin(names, ", "), " (the first is the default)"));
}

}  // namespace attn::server
