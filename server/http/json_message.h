// Request JSON -> protobuf message for the HTTP routes, strictly: protobuf's own JSON parser
// (3.21) flattens nested arrays into repeated fields ({"inputs": [[{"text": "x"}]]} became one
// input), reads the string "yes" as true and quotes an unknown field name back in full. Here a
// value of the wrong shape or type is refused naming its field, an unknown field name is refused
// with the closest known one, and user input is quoted only through QuoteInput (engine/quote.h).
//
// The mapping is protobuf's (proto3 JSON): field names as in the .proto or lowerCamelCase; null
// leaves a field at its default; enums by name or number; 64-bit integers as numbers or decimal
// strings; bytes as base64. What it refuses that protobuf accepts: a nested array in a repeated
// field, a string or number for a bool, a string for a 32-bit integer, a fraction for an
// integer, two members of one oneof, the same field under both of its names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace attn::server::http {

// Parses `body` as JSON; INVALID_ARGUMENT saying where and why it is not (never quoting it),
// ending with `example` (what to send instead). An empty body is an error too.
absl::Status ParseJsonBody(std::string_view body, std::string_view example, nlohmann::json* root);

// Fills `message` (cleared first) from the JSON `body`. On failure INVALID_ARGUMENT "the request
// body is not a valid <type>: <problem>", with the offending field's path in *param
// ("inputs[0].text"; "" when the body itself is wrong).
absl::Status JsonToMessage(std::string_view body, google::protobuf::Message* message,
                           std::string* param);

// "unknown field 'naem' (did you mean 'name'?); <owner> takes: a, b, c": the message for a field
// name nobody defined, quoting it through QuoteInput and suggesting the closest of `known`.
std::string UnknownFieldMessage(std::string_view name, std::string_view owner,
                                const std::vector<std::string>& known);

// The JSON type of `value` in words ("a string", "an array", ...) for error messages: the value
// itself may be long or secret.
const char* JsonTypeName(const nlohmann::json& value);

}  // namespace attn::server::http
