// Typed causes of an INVALID_ARGUMENT about one input, carried as a status payload so that a
// front end can say them in its own client's vocabulary (server/status_map.cc: the OpenAI route
// names its `input` field, its `truncate` and `long_text` options and LangChain's setting) while
// the core's message stays the gRPC API's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace attn::server::core {

struct InputError {
  enum class Kind { kTooLong, kForeignTokenIds };
  Kind kind = Kind::kTooLong;
  int index = 0;  // the input (inputs[index])
  // kTooLong: the input's tokens ([CLS] and [SEP] included), a lower bound when
  // `tokens_at_least` (the tokenizer's look-ahead ended before the text); `limit`: max_length.
  int64_t tokens = 0;
  bool tokens_at_least = false;
  int limit = 0;
  // kForeignTokenIds: the first and last ids this model's tokenizer output has.
  std::string cls_token, sep_token;
  int32_t cls_id = 0, sep_id = 0;
};

// `status` (INVALID_ARGUMENT) carrying `error`.
absl::Status WithInputError(absl::Status status, const InputError& error);
std::optional<InputError> GetInputError(const absl::Status& status);

}  // namespace attn::server::core
