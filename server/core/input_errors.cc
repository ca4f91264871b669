#include "server/core/input_errors.h"

#include <sstream>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace attn::server::core {

namespace {
constexpr char kInputErrorUrl[] = "type.attnserve.dev/input-error";
}  // namespace

// The payload: the fields separated by newlines (token texts have no newline: the tokenizer's
// special tokens are single vocabulary lines).
absl::Status WithInputError(absl::Status status, const InputError& error) {
  std::ostringstream payload;
  payload << static_cast<int>(error.kind) << '\n'
          << error.index << '\n'
          << error.tokens << '\n'
          << error.tokens_at_least << '\n'
          << error.limit << '\n'
          << error.cls_id << '\n'
          << error.sep_id << '\n'
          << error.cls_token << '\n'
          << error.sep_token;
  status.SetPayload(kInputErrorUrl, absl::Cord(payload.str()));
  return status;
}

std::optional<InputError> GetInputError(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(kInputErrorUrl);
  if (!payload.has_value()) return std::nullopt;
  std::istringstream in{std::string(*payload)};
  InputError error;
  int kind = 0;
  in >> kind >> error.index >> error.tokens >> error.tokens_at_least >> error.limit >>
      error.cls_id >> error.sep_id;
  in.ignore(1);
  std::getline(in, error.cls_token);
  std::getline(in, error.sep_token);
  if (!in && !in.eof()) return std::nullopt;
  error.kind = static_cast<InputError::Kind>(kind);
  return error;
}

}  // namespace attn::server::core
