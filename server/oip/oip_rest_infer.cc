// OipRest::Infer: the REST ModelInfer body (JSON tensors, or Triton's binary tensor extension)
// read into the transport-free InferRequest, and the response written back the same way.
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/json_depth.h"
#include "engine/quote.h"
#include "nlohmann/json.hpp"
#include "server/oip/oip_rest.h"

namespace attn::server::oip {

using http::HttpReply;
using http::HttpRequest;
using nlohmann::json;

namespace {

// The JSON part of the body and the binary tensors after it.
struct RestBody {
  json header;
  std::string_view binary;
};

absl::StatusOr<RestBody> SplitBody(const HttpRequest& request) {
  std::string_view text = request.body;
  RestBody body;
  if (request.inference_header_length.has_value()) {
    size_t length = 0;
    if (!absl::SimpleAtoi(*request.inference_header_length, &length) || length > text.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the Inference-Header-Content-Length header is ",
                       QuoteInput(*request.inference_header_length),
                       "; give the JSON part's length in bytes "
                       "(the body has ",
                       text.size(), ")"));
    }
    body.binary = text.substr(length);
    text = text.substr(0, length);
  }
  if (JsonNestsDeeperThan(text)) {
    return absl::InvalidArgumentError(absl::StrCat("the request's JSON nests deeper than ",
                                                   kMaxJsonDepth,
                                                   " levels; an inference request "
                                                   "needs a few"));
  }
  try {
    body.header = json::parse(text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body is not valid JSON (syntax error at byte ", e.byte,
        request.inference_header_length.has_value()
            ? " of the JSON part, as long as Inference-Header-Content-Length says)"
            : "; a body with binary tensors needs the Inference-Header-Content-Length header)"));
  }
  if (!body.header.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object with \"inputs\"");
  }
  return body;
}

absl::Status OnlyKeys(const json& object, std::initializer_list<std::string_view> keys,
                      std::string_view where) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string known;
      for (std::string_view k : keys)
        absl::StrAppend(&known, known.empty() ? "" : ", ", AbslView(k));
      return absl::InvalidArgumentError(absl::StrCat("unknown field ", QuoteInput(key), " in ",
                                                     AbslView(where), "; it has ", known));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadParameters(const json& object, std::string_view where,
                            std::vector<Parameter>* out) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(where), "'s \"parameters\" must be an object"));
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    // The key lives in the parsed body, which outlives the call.
    const std::string& key = it.key();
    const json& value = it.value();
    ParameterValue read;
    if (value.is_boolean()) {
      read = value.get<bool>();
    } else if (value.is_number_unsigned()) {
      read = value.get<uint64_t>();
    } else if (value.is_number_integer()) {
      read = value.get<int64_t>();
    } else if (value.is_number_float()) {
      read = value.get<double>();
    } else if (value.is_string()) {
      read = value.get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", QuoteInput(key), " of ",
                                                     AbslView(where),
                                                     " must be a bool, a number or a string"));
    }
    out->push_back({key, std::move(read)});
  }
  return absl::OkStatus();
}

// The elements of "data" (nested lists flattened, row-major) into `t`.
absl::Status ReadData(const json& data, InputTensor* t, int64_t* index) {
  if (data.is_array()) {
    for (const json& element : data) {
      if (absl::Status read = ReadData(element, t, index); !read.ok()) return read;
    }
    return absl::OkStatus();
  }
  if (t->datatype == "BYTES" && data.is_string()) {
    t->bytes_contents.push_back(data.get_ref<const std::string&>());
  } else if (t->datatype == "INT64" && data.is_number_integer()) {
    t->int64_contents.push_back(data.get<int64_t>());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", QuoteInput(t->name), ": data element ", *index, " is ", data.type_name(),
        t->datatype == "BYTES" ? "; BYTES elements are strings" : "; INT64 elements are integers"));
  }
  ++*index;
  return absl::OkStatus();
}

absl::Status ReadInput(const json& in, std::string_view binary, size_t* binary_at, InputTensor* t) {
  if (!in.is_object()) return absl::InvalidArgumentError("each of \"inputs\" must be an object");
  if (absl::Status ok =
          OnlyKeys(in, {"name", "shape", "datatype", "parameters", "data"}, "an input");
      !ok.ok())
    return ok;
  for (const char* key : {"name", "shape", "datatype"}) {
    if (!in.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("an input lacks \"", key, "\""));
    }
  }
  if (!in["name"].is_string() || !in["datatype"].is_string() || !in["shape"].is_array()) {
    return absl::InvalidArgumentError(
        "an input's \"name\" and \"datatype\" are strings and its \"shape\" a list of integers");
  }
  t->name = in["name"].get_ref<const std::string&>();
  t->datatype = in["datatype"].get_ref<const std::string&>();
  for (const json& d : in["shape"]) {
    if (!d.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", QuoteInput(t->name), ": \"shape\" must be a list of integers"));
    }
    t->shape.push_back(d.get<int64_t>());
  }
  if (in.contains("parameters")) {
    const std::string where = absl::StrCat("input ", QuoteInput(t->name));
    if (absl::Status ok = ReadParameters(in["parameters"], where, &t->parameters); !ok.ok())
      return ok;
  }
  const json* size = in.contains("parameters") && in["parameters"].contains("binary_data_size")
                         ? &in["parameters"]["binary_data_size"]
                         : nullptr;
  if ((size != nullptr) == in.contains("data")) {
    return absl::InvalidArgumentError(absl::StrCat("input ", QuoteInput(t->name),
                                                   size != nullptr ? " has both \"data\" and"
                                                                   : " has neither "
                                                                     "\"data\" nor",
                                                   " a \"binary_data_size\" parameter; give one"));
  }
  if (size != nullptr) {
    if (!size->is_number_unsigned() || size->get<uint64_t>() > binary.size() - *binary_at) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", QuoteInput(t->name), ": binary_data_size is ", size->dump().substr(0, 24),
          ", but only ", binary.size() - *binary_at, " bytes of binary data remain"));
    }
    t->raw = binary.substr(*binary_at, size->get<uint64_t>());
    *binary_at += size->get<uint64_t>();
    return absl::OkStatus();
  }
  if (t->datatype != "BYTES" && t->datatype != "INT64") {
    t->has_typed_contents = true;  // the datatype is refused with its name before the data
    t->typed_field = "data";
    return absl::OkStatus();
  }
  int64_t index = 0;
  return ReadData(in["data"], t, &index);
}

absl::Status ReadRequest(const RestBody& body, InferRequest* request) {
  const json& h = body.header;
  if (absl::Status ok = OnlyKeys(h, {"id", "parameters", "inputs", "outputs"}, "the request");
      !ok.ok())
    return ok;
  if (h.contains("id")) {
    if (!h["id"].is_string()) return absl::InvalidArgumentError("\"id\" must be a string");
    request->id = h["id"].get_ref<const std::string&>();
  }
  if (h.contains("parameters")) {
    if (absl::Status ok = ReadParameters(h["parameters"], "the request", &request->parameters);
        !ok.ok())
      return ok;
  }
  if (!h.contains("inputs") || !h["inputs"].is_array()) {
    return absl::InvalidArgumentError("the request needs \"inputs\": a list of tensors");
  }
  size_t binary_at = 0;
  for (const json& in : h["inputs"]) {
    InputTensor t;
    if (absl::Status ok = ReadInput(in, body.binary, &binary_at, &t); !ok.ok()) return ok;
    request->inputs.push_back(std::move(t));
  }
  if (binary_at != body.binary.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the body has ", body.binary.size(),
                                                   " bytes after the JSON header, but the inputs' "
                                                   "binary_data_size add up to ",
                                                   binary_at));
  }
  if (h.contains("outputs")) {
    if (!h["outputs"].is_array()) return absl::InvalidArgumentError("\"outputs\" must be a list");
    for (const json& out : h["outputs"]) {
      if (!out.is_object() || !out.contains("name") || !out["name"].is_string()) {
        return absl::InvalidArgumentError("each of \"outputs\" is an object with a \"name\"");
      }
      if (absl::Status ok = OnlyKeys(out, {"name", "parameters"}, "an output"); !ok.ok()) return ok;
      RequestedOutput o;
      o.name = out["name"].get_ref<const std::string&>();
      if (out.contains("parameters")) {
        const std::string where = absl::StrCat("output ", QuoteInput(o.name));
        if (absl::Status ok = ReadParameters(out["parameters"], where, &o.parameters); !ok.ok())
          return ok;
      }
      request->outputs.push_back(std::move(o));
    }
  }
  return absl::OkStatus();
}

// Whether the output called `name` goes back raw (after the JSON) rather than as "data".
bool Binary(const json& header, std::string_view name) {
  if (header.contains("outputs")) {
    for (const json& out : header["outputs"]) {
      if (out["name"] == name && out.contains("parameters") &&
          out["parameters"].contains("binary_data")) {
        return out["parameters"]["binary_data"] == true;
      }
    }
  }
  return header.contains("parameters") && header["parameters"].contains("binary_data_output") &&
         header["parameters"]["binary_data_output"] == true;
}

json DataOf(const OutputTensor& t) {
  json data = json::array();
  const char* raw = t.raw.data();
  if (t.datatype == "FP32") {
    for (size_t i = 0; i < t.raw.size() / 4; ++i) {
      float v;
      std::memcpy(&v, raw + 4 * i, 4);
      data.push_back(v);
    }
  } else if (t.datatype == "INT64") {
    for (size_t i = 0; i < t.raw.size() / 8; ++i) {
      int64_t v;
      std::memcpy(&v, raw + 8 * i, 8);
      data.push_back(v);
    }
  } else {  // BOOL
    for (char c : t.raw) data.push_back(c != 0);
  }
  return data;
}

HttpReply WriteResponse(const RestBody& body, std::string_view id, const InferResponse& result,
                        int64_t max_message_bytes) {
  json outputs = json::array();
  std::string binaries;
  int64_t json_estimate = 0;  // numbers as text: at most ~24 bytes each
  for (const OutputTensor& t : result.outputs) {
    if (!Binary(body.header, t.name)) json_estimate += static_cast<int64_t>(t.raw.size()) * 6;
  }
  if (json_estimate > max_message_bytes) {
    return OipErrorReply(TooLargeError(
        absl::StrCat("the outputs as JSON numbers would take up to ", json_estimate,
                     " bytes, more than the ", max_message_bytes,
                     "-byte limit (--max-message-bytes); ask for them raw (\"binary_data\": "
                     "true), or for fewer inputs")));
  }
  for (const OutputTensor& t : result.outputs) {
    json out = {{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}};
    if (Binary(body.header, t.name)) {
      out["parameters"] = {{"binary_data_size", t.raw.size()}};
      binaries += t.raw;
    } else {
      out["data"] = DataOf(t);
    }
    outputs.push_back(std::move(out));
  }
  json response = {{"model_name", result.model}, {"model_version", result.version}};
  if (!id.empty()) response["id"] = std::string(id);
  response["outputs"] = std::move(outputs);
  HttpReply reply;
  reply.body = response.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!binaries.empty()) {
    reply.headers.push_back({"Inference-Header-Content-Length", absl::StrCat(reply.body.size())});
    reply.content_type = "application/octet-stream";
    reply.body += binaries;
  }
  return reply;
}

}  // namespace

HttpReply OipRest::Infer(const HttpRequest& http_request, std::string_view model,
                         std::string_view version, const core::CallControl& control) const {
  absl::StatusOr<RestBody> body = SplitBody(http_request);
  if (!body.ok()) return OipErrorReply(body.status());
  InferRequest request;
  request.model = model;
  request.version = version;
  request.transport_input_parameters = {"binary_data_size"};
  request.transport_output_parameters = {"binary_data"};
  request.transport_request_parameters = {"binary_data_output"};
  if (absl::Status read = ReadRequest(*body, &request); !read.ok()) return OipErrorReply(read);
  absl::Notification answered;
  absl::StatusOr<InferResponse> result = absl::InternalError("no answer");
  inferrer_.Infer(request, control, [&](absl::StatusOr<InferResponse> answer) {
    result = std::move(answer);
    answered.Notify();
  });
  answered.WaitForNotification();
  if (!result.ok()) return OipErrorReply(result.status());
  return WriteResponse(*body, request.id, *result, options_.max_message_bytes);
}

}  // namespace attn::server::oip
