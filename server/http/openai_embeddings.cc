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

namespace attn::server::http {

namespace {

using nlohmann::json;

constexpr const char* kInputShapes =
    "a string, an array of strings, an array of token ids or an array of token-id arrays";

// The JSON type's name for an error message (never the value: it may be large or secret).
const char* TypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a fractional number";
    default:
      return "an integer";
  }
}

absl::Status ParseTokenIds(const json& array, const std::string& where, std::vector<int32_t>* ids) {
  ids->reserve(array.size());
  for (size_t k = 0; k < array.size(); ++k) {
    const json& id = array[k];
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "[", k, "] is ", TypeName(id),
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

// Builds the document as json::parse does, but moves each string out of the parser's buffer
// instead of copying it: a 50 MB text is held once while the body is parsed, not twice
// (tests/reliability/memory_limit_test.cc measures what a call holds).
class MovingDomBuilder {
 public:
  explicit MovingDomBuilder(json* root) : root_(root) {}
  bool null() { return Add(nullptr) != nullptr; }
  bool boolean(bool value) { return Add(value) != nullptr; }
  bool number_integer(json::number_integer_t value) { return Add(value) != nullptr; }
  bool number_unsigned(json::number_unsigned_t value) { return Add(value) != nullptr; }
  bool number_float(json::number_float_t value, const std::string&) {
    return Add(value) != nullptr;
  }
  bool string(std::string& value) { return Add(std::move(value)) != nullptr; }
  bool binary(json::binary_t& value) { return Add(std::move(value)) != nullptr; }
  bool start_object(std::size_t) { return Open(json::object()); }
  bool key(std::string& key) {
    key_ = std::move(key);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_array() { return Close(); }
  // What json::parse throws.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) {
    if (const auto* parse = dynamic_cast<const json::parse_error*>(&error)) throw *parse;
    if (const auto* range = dynamic_cast<const json::out_of_range*>(&error)) throw *range;
    throw json::other_error::create(501, error.what(), nullptr);
  }

 private:
  // The new value's place: the root, the open array's end or the open object's last key.
  json* Add(json value) {
    if (open_.empty()) {
      *root_ = std::move(value);
      return root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    json& slot = parent[key_];  // a repeated key keeps the last value, as json::parse does
    slot = std::move(value);
    return &slot;
  }
  // Only the innermost open container grows, so the pointers to the others stay valid.
  bool Open(json container) {
    open_.push_back(Add(std::move(container)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  json* root_;
  std::vector<json*> open_;
  std::string key_;
};

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
      return absl::InvalidArgumentError(
          absl::StrCat("long_text must be \"refuse\", \"truncate\" or \"chunk\"",
                       long_text->is_string() ? "" : absl::StrCat(", not ", TypeName(*long_text))));
    }
    mode = parsed;
  }
  if (const json* truncate = field("truncate")) {
    if (!truncate->is_boolean()) {
      *param = "truncate";
      return absl::InvalidArgumentError(
          absl::StrCat("truncate is ", TypeName(*truncate), "; give true or false"));
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
          absl::StrCat("chunk_overlap is ", TypeName(*overlap), "; give a number of tokens"));
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
  try {
    MovingDomBuilder builder(&root);
    json::sax_parse(body.begin(), body.end(), &builder);
  } catch (const json::parse_error& e) {
    // nlohmann's reason sits between " - " and "; last read:" (which would quote the input).
    std::string_view reason = e.what();
    const size_t begin = reason.find(" - ");
    reason = begin == std::string_view::npos ? "" : reason.substr(begin + 3);
    reason = reason.substr(0, std::min<size_t>(reason.find("; last read"), 120));
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body is not valid JSON (at byte ", e.byte, ": ",
        std::string(reason.empty() ? "syntax error" : reason),
        "); send a JSON object such as {\"input\": \"some text\", \"model\": \"...\"}"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is ", TypeName(root), "; send a JSON object"));
  }
  auto field = [&root](const char* name) -> const json* {
    auto it = root.find(name);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };

  if (const json* model = field("model")) {
    if (!model->is_string()) {
      *param = "model";
      return absl::InvalidArgumentError(
          absl::StrCat("model is ", TypeName(*model), "; give the model's name as a string"));
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
          absl::StrCat("dimensions is ", TypeName(*dimensions), "; give a positive integer"));
    }
    // Out-of-range values reach the core as a value it refuses, naming the model's size.
    const int64_t value =
        dimensions->is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(dimensions->get<uint64_t>(), INT32_MAX))
            : dimensions->get<int64_t>();
    request->encode.dimensions = static_cast<int32_t>(
        std::clamp<int64_t>(value, std::numeric_limits<int32_t>::min(), INT32_MAX));
  }
  // `user` (an end-user id for OpenAI's abuse monitoring) is accepted and ignored, like any
  // field this server does not know.
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
        return absl::InvalidArgumentError(
            absl::StrCat("input[", i, "] is ", TypeName(item), "; input must be ", kInputShapes));
      }
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("input is ", TypeName(*input), "; it must be ", kInputShapes));
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
