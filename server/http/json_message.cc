#include "server/http/json_message.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/quote.h"

namespace attn::server::http {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using nlohmann::json;

// Far deeper than any request message nests (EncodeRequest -> Input -> TokenIds is 3).
constexpr int kMaxDepth = 32;

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

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Lower case without '_' or '-', so "hidden_layers", "hiddenLayers" and "Hidden-Layers" compare
// equal.
std::string Folded(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 2 * kMaxQuotedBytes)) {
    if (c != '_' && c != '-') out.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// What one value of `field` must be, in words.
std::string Expected(const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_INT32:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
      return "an integer >= 0";
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer (a number or a decimal string)";
    case FieldDescriptor::CPPTYPE_UINT64:
      return "an integer >= 0 (a number or a decimal string)";
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return "a number";
    case FieldDescriptor::CPPTYPE_STRING:
      return field.type() == FieldDescriptor::TYPE_BYTES ? "a base64 string" : "a string";
    case FieldDescriptor::CPPTYPE_ENUM: {
      std::vector<std::string> names;
      for (int i = 0; i < field.enum_type()->value_count(); ++i) {
        names.push_back(field.enum_type()->value(i)->name());
      }
      return absl::StrCat("one of ", absl::StrJoin(names, ", "), " (or its number)");
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return absl::StrCat("an object (", field.message_type()->full_name(), ")");
  }
  return "a value";
}

// Walks one request's JSON along its message descriptor, filling the message. The first problem
// ends the walk; `where` is then the offending field's path as the client spelled it.
class Filler {
 public:
  absl::Status Object(const json& value, Message* message, const std::string& path, int depth);

  const std::string& where() const { return where_; }

 private:
  // `field` of `message` from `value` (not null).
  absl::Status Field(const json& value, const FieldDescriptor& field, Message* message,
                     const std::string& path, const std::string& key, int depth);
  // One value (a singular field's, or an element of a repeated one: `repeated`).
  absl::Status Value(const json& value, const FieldDescriptor& field, Message* message,
                     bool repeated, const std::string& path, const std::string& key, int depth);
  // An integer field or an enum (by name or number).
  absl::Status WholeNumber(const json& value, const FieldDescriptor& field, Message* message,
                           bool repeated, const std::string& path);
  absl::Status Map(const json& value, const FieldDescriptor& field, Message* message,
                   const std::string& path, int depth);
  // An integer within [min, max] from a JSON number (fractions refused) or, when
  // `string_allowed`, a decimal string.
  absl::Status Integer(const json& value, bool string_allowed, __int128 min, __int128 max,
                       const std::string& path, const std::string& expected, __int128* out);

  absl::Status Wrong(const std::string& path, const json& value, const std::string& expected) {
    where_ = path;
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", JsonTypeName(value), "; ", expected));
  }
  absl::Status Fail(const std::string& path, const std::string& problem) {
    where_ = path;
    return absl::InvalidArgumentError(problem);
  }

  std::string where_;
};

absl::Status Filler::Object(const json& value, Message* message, const std::string& path,
                            int depth) {
  const Descriptor& type = *message->GetDescriptor();
  if (depth > kMaxDepth) {
    return Fail(path, absl::StrCat(path, ": objects nested more than ", kMaxDepth, " deep"));
  }
  if (!value.is_object()) {
    const std::string expected = absl::StrCat("it must be a JSON object (", type.full_name(), ")");
    if (!path.empty()) return Wrong(path, value, expected);
    return Fail("", absl::StrCat("the body is ", JsonTypeName(value), "; ", expected));
  }
  // Which key set each field (a field has two names) and each oneof. (Keys come in sorted
  // order; messages name fields in the .proto's order, whatever the order sent.)
  std::map<const FieldDescriptor*, std::string> given;
  std::map<const google::protobuf::OneofDescriptor*, const FieldDescriptor*> oneof_given;
  for (const auto& [key, item] : value.items()) {
    const FieldDescriptor* field = type.FindFieldByName(key);
    for (int i = 0; field == nullptr && i < type.field_count(); ++i) {
      if (type.field(i)->json_name() == key) field = type.field(i);
    }
    const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
    if (field == nullptr) {
      std::vector<std::string> known;
      for (int i = 0; i < type.field_count(); ++i) known.push_back(type.field(i)->json_name());
      where_ = path;
      return absl::InvalidArgumentError(
          absl::StrCat(path.empty() ? "" : absl::StrCat(path, ": "),
                       UnknownFieldMessage(key, type.full_name(), known)));
    }
    if (auto [it, fresh] = given.emplace(field, key); !fresh) {
      const std::string named =
          path.empty() ? field->json_name() : absl::StrCat(path, ".", field->json_name());
      return Fail(named, absl::StrCat(named, " is given twice (as ", field->name(), " and ",
                                      field->json_name(), ")"));
    }
    if (item.is_null()) continue;  // proto3 JSON: null is the default
    if (const auto* oneof = field->real_containing_oneof()) {
      if (auto [it, fresh] = oneof_given.emplace(oneof, field); !fresh) {
        const FieldDescriptor* first = it->second->index() < field->index() ? it->second : field;
        const FieldDescriptor* second = first == field ? it->second : field;
        std::vector<std::string> members;
        for (int i = 0; i < oneof->field_count(); ++i) {
          members.push_back(oneof->field(i)->json_name());
        }
        return Fail(
            path.empty() ? second->json_name() : absl::StrCat(path, ".", second->json_name()),
            absl::StrCat(path.empty() ? "the request" : path, " sets both ", first->json_name(),
                         " and ", second->json_name(), "; ", type.full_name(), " takes one of ",
                         absl::StrJoin(members, ", ")));
      }
    }
    if (absl::Status status = Field(item, *field, message, field_path, key, depth); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Filler::Field(const json& value, const FieldDescriptor& field, Message* message,
                           const std::string& path, const std::string& key, int depth) {
  if (field.is_map()) return Map(value, field, message, path, depth);
  if (!field.is_repeated()) return Value(value, field, message, false, path, key, depth);
  if (!value.is_array()) {
    return Wrong(path, value, absl::StrCat("it takes a list, each element ", Expected(field)));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string element = absl::StrCat(path, "[", i, "]");
    if (value[i].is_null() || value[i].is_array()) {
      // A nested list is not flattened: [[1], [2]] is not [1, 2].
      return Wrong(element, value[i],
                   absl::StrCat("each element of ", key, " is ", Expected(field)));
    }
    if (absl::Status status = Value(value[i], field, message, true, element, key, depth);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Filler::Map(const json& value, const FieldDescriptor& field, Message* message,
                         const std::string& path, int depth) {
  if (!value.is_object()) return Wrong(path, value, "it takes an object (a map)");
  const FieldDescriptor& key_field = *field.message_type()->map_key();
  const FieldDescriptor& value_field = *field.message_type()->map_value();
  for (const auto& [key, item] : value.items()) {
    const std::string entry_path = absl::StrCat(path, "[", QuoteInput(key), "]");
    Message* entry = message->GetReflection()->AddMessage(message, &field);
    json key_value = key;
    if (key_field.cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      if (key != "true" && key != "false") {
        return Fail(entry_path,
                    absl::StrCat(path, " keys are true or false, not ", QuoteInput(key)));
      }
      key_value = key == "true";
    }
    if (absl::Status status =
            Value(key_value, key_field, entry, false, entry_path, field.json_name(), depth);
        !status.ok()) {
      return status;
    }
    if (item.is_null()) continue;
    if (absl::Status status =
            Value(item, value_field, entry, false, entry_path, field.json_name(), depth + 1);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Filler::Integer(const json& value, bool string_allowed, __int128 min, __int128 max,
                             const std::string& path, const std::string& expected, __int128* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
  } else if (value.is_number_integer()) {
    *out = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    // 2.0 is 2 (some encoders write every number with a point); 2.5 is not an integer.
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) >= 0x1p64) {
      return Fail(path, absl::StrCat(path, " is not a whole number; it takes ", expected));
    }
    *out = static_cast<__int128>(d);
  } else if (value.is_string() && string_allowed) {
    const std::string& text = value.get_ref<const std::string&>();
    int64_t signed_value;
    uint64_t unsigned_value;
    if (absl::SimpleAtoi(text, &signed_value)) {
      *out = signed_value;
    } else if (absl::SimpleAtoi(text, &unsigned_value)) {
      *out = unsigned_value;
    } else {
      return Fail(path, absl::StrCat(path, " is ", QuoteInput(text), ", not ", expected));
    }
  } else {
    return Wrong(path, value, absl::StrCat("it takes ", expected));
  }
  if (*out < min || *out > max) {
    return Fail(
        path, absl::StrCat(path, " is outside the range of ", expected,
                           max > std::numeric_limits<uint32_t>::max() ? " (64-bit)" : " (32-bit)"));
  }
  return absl::OkStatus();
}

absl::Status Filler::Value(const json& value, const FieldDescriptor& field, Message* message,
                           bool repeated, const std::string& path, const std::string& key,
                           int depth) {
  const Reflection& r = *message->GetReflection();
  const std::string expected = repeated
                                   ? absl::StrCat("each element of ", key, " is ", Expected(field))
                                   : absl::StrCat("it takes ", Expected(field));
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      // Only true and false: the string "yes" or the number 1 is not a bool.
      if (!value.is_boolean()) return Wrong(path, value, expected);
      repeated ? r.AddBool(message, &field, value.get<bool>())
               : r.SetBool(message, &field, value.get<bool>());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_ENUM:
      return WholeNumber(value, field, message, repeated, path);
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double d;
      if (value.is_number()) {
        d = value.get<double>();
      } else if (value.is_string() && value == "NaN") {
        d = std::numeric_limits<double>::quiet_NaN();
      } else if (value.is_string() && (value == "Infinity" || value == "-Infinity")) {
        d = value == "Infinity" ? HUGE_VAL : -HUGE_VAL;
      } else {
        return Wrong(path, value, expected);
      }
      if (field.cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
        repeated ? r.AddFloat(message, &field, static_cast<float>(d))
                 : r.SetFloat(message, &field, static_cast<float>(d));
      } else {
        repeated ? r.AddDouble(message, &field, d) : r.SetDouble(message, &field, d);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      if (!value.is_string()) return Wrong(path, value, expected);
      std::string text = value.get<std::string>();
      if (field.type() == FieldDescriptor::TYPE_BYTES) {
        std::string bytes;
        if (!absl::Base64Unescape(text, &bytes) && !absl::WebSafeBase64Unescape(text, &bytes)) {
          return Fail(path, absl::StrCat(path, " is not valid base64"));
        }
        text = std::move(bytes);
      }
      repeated ? r.AddString(message, &field, std::move(text))
               : r.SetString(message, &field, std::move(text));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      if (field.message_type()->file()->package() == "google.protobuf") {
        return Fail(path, absl::StrCat(path, ": ", field.message_type()->full_name(),
                                       " fields are not taken over HTTP"));
      }
      if (!value.is_object()) return Wrong(path, value, expected);
      Message* child = repeated ? r.AddMessage(message, &field) : r.MutableMessage(message, &field);
      return Object(value, child, path, depth + 1);
    }
  }
  return Fail(path, absl::StrCat(path, " has a type this server cannot read"));
}

absl::Status Filler::WholeNumber(const json& value, const FieldDescriptor& field, Message* message,
                                 bool repeated, const std::string& path) {
  const Reflection& r = *message->GetReflection();
  using Limits32 = std::numeric_limits<int32_t>;
  using Limits64 = std::numeric_limits<int64_t>;
  __int128 n = 0;
  if (field.cpp_type() == FieldDescriptor::CPPTYPE_ENUM && value.is_string()) {
    const auto* named = field.enum_type()->FindValueByName(value.get<std::string>());
    if (named == nullptr) {
      return Fail(path, absl::StrCat(path, " is ", QuoteInput(value.get<std::string>()),
                                     ", which is not ", Expected(field)));
    }
    n = named->number();
  } else {
    // 64-bit integers may be strings (the mapping writes them so); 32-bit ones and enums may
    // not. Proto3 enums are open: a number the server does not know is the core's to refuse.
    __int128 min = Limits32::min(), max = Limits32::max();
    bool string_allowed = false;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32:
        min = 0, max = std::numeric_limits<uint32_t>::max();
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        min = Limits64::min(), max = Limits64::max(), string_allowed = true;
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        min = 0, max = std::numeric_limits<uint64_t>::max(), string_allowed = true;
        break;
      default:
        break;
    }
    if (absl::Status s = Integer(value, string_allowed, min, max, path, Expected(field), &n);
        !s.ok()) {
      return s;
    }
  }
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      repeated ? r.AddInt32(message, &field, static_cast<int32_t>(n))
               : r.SetInt32(message, &field, static_cast<int32_t>(n));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      repeated ? r.AddUInt32(message, &field, static_cast<uint32_t>(n))
               : r.SetUInt32(message, &field, static_cast<uint32_t>(n));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      repeated ? r.AddInt64(message, &field, static_cast<int64_t>(n))
               : r.SetInt64(message, &field, static_cast<int64_t>(n));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      repeated ? r.AddUInt64(message, &field, static_cast<uint64_t>(n))
               : r.SetUInt64(message, &field, static_cast<uint64_t>(n));
      break;
    default:  // an enum
      repeated ? r.AddEnumValue(message, &field, static_cast<int>(n))
               : r.SetEnumValue(message, &field, static_cast<int>(n));
  }
  return absl::OkStatus();
}

}  // namespace

const char* JsonTypeName(const json& value) {
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

absl::Status ParseJsonBody(std::string_view body, std::string_view example, json* root) {
  try {
    MovingDomBuilder builder(root);
    json::sax_parse(body.begin(), body.end(), &builder);
  } catch (const json::parse_error& e) {
    // nlohmann's reason sits between " - " and "; last read:" (which would quote the input).
    std::string_view reason = e.what();
    const size_t begin = reason.find(" - ");
    reason = begin == std::string_view::npos ? "" : reason.substr(begin + 3);
    reason = reason.substr(0, std::min<size_t>(reason.find("; last read"), 120));
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body is not valid JSON (at byte ", e.byte, ": ",
        std::string(reason.empty() ? "syntax error" : reason), "); send ", std::string(example)));
  }
  return absl::OkStatus();
}

absl::Status JsonToMessage(std::string_view body, Message* message, std::string* param) {
  param->clear();
  message->Clear();
  const std::string type = message->GetDescriptor()->full_name();
  // An empty body is the empty request (every field at its default), as protobuf reads it.
  json root = json::object();
  if (!body.empty()) {
    if (absl::Status parsed =
            ParseJsonBody(body, absl::StrCat("a JSON object (", type, ")"), &root);
        !parsed.ok()) {
      return parsed;
    }
  }
  Filler filler;
  absl::Status filled = filler.Object(root, message, "", 0);
  if (filled.ok()) return filled;
  message->Clear();
  *param = filler.where();
  return absl::InvalidArgumentError(
      absl::StrCat("the request body is not a valid ", type, ": ", filled.message()));
}

std::string UnknownFieldMessage(std::string_view name, std::string_view owner,
                                const std::vector<std::string>& known) {
  const std::string folded = Folded(name);
  const std::string* closest = nullptr;
  size_t best = std::numeric_limits<size_t>::max();
  for (const std::string& candidate : known) {
    const std::string other = Folded(candidate);
    // Close: at most a third of the name's letters differ (at least one may).
    const size_t distance = EditDistance(folded, other);
    if (distance < best && distance <= std::max<size_t>(1, other.size() / 3)) {
      best = distance;
      closest = &candidate;
    }
  }
  return absl::StrCat("unknown field ", QuoteInput(name),
                      closest != nullptr ? absl::StrCat(" (did you mean '", *closest, "'?)") : "",
                      "; ", std::string(owner), " takes: ", absl::StrJoin(known, ", "));
}

}  // namespace attn::server::http
