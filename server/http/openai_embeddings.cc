#include "server/http/openai_embeddings.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "server/http/json_message.h"

namespace attn::server::http {

namespace {

using nlohmann::json;

// The request fields this route takes: OpenAI's embeddings API and the long-input options
// (truncate as text-embeddings-inference names it, long_text and chunk_overlap as /v1/encode).
constexpr const char* kFields[] = {"input",        "model",    "encoding_format",      "dimensions",
                                   "user",         "truncate", "truncation_direction", "long_text",
                                   "chunk_overlap"};

constexpr const char* kInputShapes =
    "a string, an array of strings, an array of token ids or an array of token-id arrays";

absl::Status ParseTokenIds(const json& array, const std::string& where, std::vector<int32_t>* ids) {
  ids->reserve(array.size());
  for (size_t k = 0; k < array.size(); ++k) {
    const json& id = array[k];
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "[", k, "] is ", JsonTypeName(id),
                                                     "; token ids are integers of the vocabulary"));
    }
    const bool too_large =
        id.is_number_unsigned()
            ? id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
            : id.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
                  id.get<int64_t>() > std::numeric_limits<int32_t>::max();
    if (too_large) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", k,
                       "] is outside the 32-bit range; token ids are integers of the vocabulary"));
    }
    ids->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// "truncate", "truncation_direction", "long_text" and "chunk_overlap": how the request's
// over-long inputs are dealt with, into request->encode.
absl::Status ParseLongText(const json& root, LongTextMode default_mode, EmbeddingsRequest* request,
                           std::string* param) {
  auto field = [&root](const char* name) -> const json* {
    auto it = root.find(name);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  std::optional<LongTextMode> mode;
  if (const json* long_text = field("long_text")) {
    LongTextMode parsed;
    if (!long_text->is_string() || !ParseLongTextMode(long_text->get<std::string>(), &parsed)) {
      *param = "long_text";
      return absl::InvalidArgumentError(absl::StrCat(
          "long_text must be \"refuse\", \"truncate\" or \"chunk\"",
          long_text->is_string() ? "" : absl::StrCat(", not ", JsonTypeName(*long_text))));
    }
    mode = parsed;
  }
  if (const json* truncate = field("truncate")) {
    if (!truncate->is_boolean()) {
      *param = "truncate";
      return absl::InvalidArgumentError(
          absl::StrCat("truncate is ", JsonTypeName(*truncate), "; give true or false"));
    }
    const LongTextMode asked =
        truncate->get<bool>() ? LongTextMode::kTruncate : LongTextMode::kRefuse;
    if (mode.has_value() && *mode != asked) {
      *param = "truncate";
      return absl::InvalidArgumentError(
          "truncate and long_text ask for different things; give one of them");
    }
    mode = asked;
  }
  bool left = false;
  if (const json* direction = field("truncation_direction")) {
    const std::string value =
        direction->is_string() ? absl::AsciiStrToLower(direction->get<std::string>()) : "";
    if (value != "left" && value != "right") {
      *param = "truncation_direction";
      return absl::InvalidArgumentError(
          "truncation_direction must be \"right\" (keep the beginning) or \"left\" (the end)");
    }
    left = value == "left";
  }
  switch (mode.value_or(default_mode)) {
    case LongTextMode::kRefuse:
      request->encode.tokenization.truncation = core::Truncation::kNone;
      break;
    case LongTextMode::kTruncate:
      request->encode.tokenization.truncation =
          left ? core::Truncation::kLeft : core::Truncation::kRight;
      break;
    case LongTextMode::kChunk:
      request->encode.long_text = core::LongText::kChunk;
      break;
  }
  if (const json* overlap = field("chunk_overlap")) {
    *param = "chunk_overlap";
    if (!overlap->is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_overlap is ", JsonTypeName(*overlap), "; give a number of tokens"));
    }
    if (request->encode.long_text != core::LongText::kChunk) {
      return absl::InvalidArgumentError(
          "chunk_overlap is set, but the input is not chunked; send \"long_text\": \"chunk\" "
          "with it, or leave it out");
    }
    const int64_t value =
        overlap->is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(overlap->get<uint64_t>(), INT32_MAX))
            : overlap->get<int64_t>();
    request->encode.chunk_overlap = static_cast<int32_t>(
        std::clamp<int64_t>(value, std::numeric_limits<int32_t>::min(), INT32_MAX));
    param->clear();
  }
  return absl::OkStatus();
}

}  // namespace

bool ParseLongTextMode(std::string_view name, LongTextMode* mode) {
  if (name == "refuse") {
    *mode = LongTextMode::kRefuse;
  } else if (name == "truncate") {
    *mode = LongTextMode::kTruncate;
  } else if (name == "chunk") {
    *mode = LongTextMode::kChunk;
  } else {
    return false;
  }
  return true;
}

absl::Status ParseEmbeddingsRequest(std::string_view body, EmbeddingsRequest* request,
                                    std::string* param, LongTextMode default_long_text) {
  json root;
  if (absl::Status parsed = ParseJsonBody(
          body, "a JSON object such as {\"input\": \"some text\", \"model\": \"...\"}", &root);
      !parsed.ok()) {
    return parsed;
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is ", JsonTypeName(root), "; send a JSON object"));
  }
  // A field OpenAI's API does not have is refused, as OpenAI refuses it: a misspelt
  // "dimension" or "encodingFormat" would otherwise be ignored and the answer silently differ.
  for (const auto& [key, value] : root.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), key) == std::end(kFields)) {
      *param = "";
      return absl::InvalidArgumentError(UnknownFieldMessage(
          key, "/v1/embeddings", std::vector<std::string>(std::begin(kFields), std::end(kFields))));
    }
  }
  auto field = [&root](const char* name) -> const json* {
    auto it = root.find(name);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };

  if (const json* model = field("model")) {
    if (!model->is_string()) {
      *param = "model";
      return absl::InvalidArgumentError(
          absl::StrCat("model is ", JsonTypeName(*model), "; give the model's name as a string"));
    }
    request->model = model->get<std::string>();
  }
  if (const json* format = field("encoding_format")) {
    const bool is_float = format->is_string() && format->get<std::string>() == "float";
    request->base64 = format->is_string() && format->get<std::string>() == "base64";
    if (!is_float && !request->base64) {
      *param = "encoding_format";
      return absl::InvalidArgumentError("encoding_format must be \"float\" or \"base64\"");
    }
  }
  if (const json* dimensions = field("dimensions")) {
    if (!dimensions->is_number_integer()) {
      *param = "dimensions";
      return absl::InvalidArgumentError(
          absl::StrCat("dimensions is ", JsonTypeName(*dimensions), "; give a positive integer"));
    }
    // Out-of-range values reach the core as a value it refuses, naming the model's size.
    const int64_t value =
        dimensions->is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(dimensions->get<uint64_t>(), INT32_MAX))
            : dimensions->get<int64_t>();
    request->encode.dimensions = static_cast<int32_t>(
        std::clamp<int64_t>(value, std::numeric_limits<int32_t>::min(), INT32_MAX));
  }
  // `user` (an end-user id for OpenAI's abuse monitoring) is accepted and ignored.
  if (const json* user = field("user"); user != nullptr && !user->is_string()) {
    *param = "user";
    return absl::InvalidArgumentError(
        absl::StrCat("user is ", JsonTypeName(*user), "; it takes a string (an end-user id)"));
  }
  if (absl::Status long_text = ParseLongText(root, default_long_text, request, param);
      !long_text.ok()) {
    return long_text;
  }
  request->encode.token_ids_from_tokenizer = true;

  // Non-const: texts are moved out of the parsed JSON, not copied (a body may be 64 MiB).
  const auto found = root.find("input");
  json* input = found == root.end() || found->is_null() ? nullptr : &*found;
  *param = "input";
  if (input == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("input is required: ", kInputShapes));
  }
  // What each input is, in order: a text (index into texts) or token ids (into token_ids). The
  // storage is filled first and viewed afterwards, so that no view sees a moved string.
  std::vector<std::pair<bool, size_t>> order;
  if (input->is_string()) {
    request->texts.push_back(std::move(input->get_ref<std::string&>()));
    order.push_back({true, 0});
    request->single_input = true;
  } else if (input->is_array() && !input->empty() && input->front().is_number()) {
    // One input given as token ids.
    request->single_input = true;
    request->token_ids.emplace_back();
    if (absl::Status ids = ParseTokenIds(*input, "input", &request->token_ids.back()); !ids.ok()) {
      return ids;
    }
    order.push_back({false, 0});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      json& item = (*input)[i];
      if (item.is_string()) {
        order.push_back({true, request->texts.size()});
        request->texts.push_back(std::move(item.get_ref<std::string&>()));
      } else if (item.is_array()) {
        order.push_back({false, request->token_ids.size()});
        request->token_ids.emplace_back();
        if (absl::Status ids =
                ParseTokenIds(item, absl::StrCat("input[", i, "]"), &request->token_ids.back());
            !ids.ok()) {
          return ids;
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat("input[", i, "] is ", JsonTypeName(item),
                                                       "; input must be ", kInputShapes));
      }
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("input is ", JsonTypeName(*input), "; it must be ", kInputShapes));
  }
  param->clear();
  request->encode.inputs.reserve(order.size());
  for (const auto& [is_text, index] : order) {
    core::Input item;
    if (is_text) {
      item.kind = core::Input::Kind::kText;
      item.text = request->texts[index];
    } else {
      item.kind = core::Input::Kind::kTokens;
      item.ids = request->token_ids[index];
    }
    request->encode.inputs.push_back(item);
  }
  return absl::OkStatus();
}

std::string EmbeddingsResponseJson(const core::EncodeResponse& response, std::string_view model,
                                   bool base64) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
                "base64 embeddings are little-endian float32: swap bytes on this host");
  std::string out = "{\"object\":\"list\",\"data\":[";
  for (size_t i = 0; i < response.results.size(); ++i) {
    const core::EncodeResult& result = response.results[i];
    const std::vector<float>& embedding = result.embedding;
    absl::StrAppend(&out, i == 0 ? "" : ",", "{\"object\":\"embedding\",\"index\":", i,
                    ",\"embedding\":");
    if (base64) {
      absl::StrAppend(
          &out, "\"",
          absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(embedding.data()),
                                               embedding.size() * sizeof(float))),
          "\"");
    } else {
      out += '[';
      for (size_t k = 0; k < embedding.size(); ++k) {
        if (k > 0) out += ',';
        // 9 significant digits give back the same float32; JSON has no NaN or infinity.
        if (std::isfinite(embedding[k])) {
          absl::StrAppendFormat(&out, "%.9g", embedding[k]);
        } else {
          out += "null";
        }
      }
      out += ']';
    }
    // What happened to the input: its length, truncated or not, in how many windows.
    const Encoding& encoding = result.encoding;
    absl::StrAppend(
        &out, ",\"input_tokens\":", encoding.untruncated_length,
        encoding.untruncated_length_is_lower_bound ? ",\"input_tokens_lower_bound\":true" : "",
        ",\"truncated\":", encoding.truncated ? "true" : "false", ",\"chunks\":", result.chunks,
        "}");
  }
  const int64_t tokens = response.metadata.token_count;
  absl::StrAppend(&out, "],\"model\":", json(std::string(model)).dump(),
                  ",\"usage\":{\"prompt_tokens\":", tokens, ",\"total_tokens\":", tokens, "}}");
  return out;
}

}  // namespace attn::server::http
