#include "tests/reliability/oip_hostile_cases.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace attn::integration::oip_hostile {

using nlohmann::json;

std::string LittleEndian32(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}
std::string BytesElement(const std::string& text) {
  return LittleEndian32(static_cast<uint32_t>(text.size())) + text;
}

Request TextRequest(const std::vector<std::string>& texts) {
  Request request;
  request.set_model_name(kModel);
  auto* input = request.add_inputs();
  input->set_name("TEXT");
  input->set_datatype("BYTES");
  input->add_shape(static_cast<int64_t>(texts.size()));
  for (const std::string& t : texts) input->mutable_contents()->add_bytes_contents(t);
  return request;
}

Request IdsRequest(std::vector<int64_t> shape, std::vector<int64_t> ids) {
  Request request;
  request.set_model_name(kModel);
  auto* input = request.add_inputs();
  input->set_name("INPUT_IDS");
  input->set_datatype("INT64");
  for (int64_t d : shape) input->add_shape(d);
  for (int64_t id : ids) input->mutable_contents()->add_int64_contents(id);
  return request;
}

Answer Grpc(const Request& request) {
  auto stub = inference::GRPCInferenceService::NewStub(SharedServer().NewChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
  inference::ModelInferResponse response;
  const grpc::Status status = stub->ModelInfer(&context, request, &response);
  return {static_cast<int>(status.error_code()), status.error_message()};
}

Answer Rest(const std::string& method, const std::string& path, const std::string& body,
            std::vector<std::string> headers) {
  HttpResponse response;
  std::string error;
  headers.push_back("Content-Type: application/json");
  if (!HttpRequest(SharedServer().http_port(), method, path, headers, body, &response, &error)) {
    return {0, error};
  }
  const json parsed = json::parse(response.body, nullptr, false);
  return {response.status, parsed.is_object() && parsed.contains("error")
                               ? parsed["error"].get<std::string>()
                               : response.body};
}

std::function<Answer()> Infer(Request request, std::function<void(Request*)> mutate) {
  return [request, mutate]() mutable {
    if (mutate) mutate(&request);
    return Grpc(request);
  };
}

void SetParameter(google::protobuf::Map<std::string, inference::InferParameter>* map,
                  const std::string& name, const std::string& value) {
  (*map)[name].set_string_param(value);
}

std::vector<OipCase> DatatypeAndShapeCases() {
  const std::string long_type(200, 'Z');
  return {
      {"text_as_fp32",
       "TEXT with datatype FP32 (fp32_contents)",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_datatype("FP32");
               r->mutable_inputs(0)->set_shape(0, 2);
               r->mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
               r->mutable_inputs(0)->mutable_contents()->add_fp32_contents(2);
             }),
       kInvalid,
       {"TEXT", "'FP32'", "BYTES"},
       ""},
      {"ids_as_fp32",
       "INPUT_IDS with datatype FP32",
       Infer(IdsRequest({1, 2}, {}),
             [](Request* r) { r->mutable_inputs(0)->set_datatype("FP32"); }),
       kInvalid,
       {"INPUT_IDS", "INT64"},
       ""},
      {"datatype_200_bytes",
       "TEXT with a 200-byte datatype name",
       Infer(TextRequest({"a"}),
             [long_type](Request* r) { r->mutable_inputs(0)->set_datatype(long_type); }),
       kInvalid,
       {"datatype", "BYTES"},
       long_type},
      {"shape_more_than_contents",
       "TEXT shape [3] with 2 elements",
       Infer(TextRequest({"a", "b"}), [](Request* r) { r->mutable_inputs(0)->set_shape(0, 3); }),
       kInvalid,
       {"3 elements", "2 came"},
       ""},
      {"shape_fewer_than_raw",
       "TEXT shape [1], raw contents holding 2 elements",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1);
               r->add_raw_input_contents(BytesElement("one") + BytesElement("two"));
             }),
       kInvalid,
       {"7 bytes more than the shape's 1 elements"},
       ""},
      {"shape_a_billion",
       "TEXT shape [1000000000] with raw contents of 1 element",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1000000000);
               r->add_raw_input_contents(BytesElement("one"));
             }),
       kInvalid,
       {"1000000000 elements", "end after 1"},
       ""},
      {"shape_overflows",
       "TEXT shape [2^62, 4]",
       Infer(TextRequest({"a"}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, int64_t{1} << 62);
               r->mutable_inputs(0)->add_shape(4);
             }),
       kInvalid,
       {"[N]"},
       ""},
      {"shape_negative",
       "TEXT shape [-1] (the metadata's wildcard sent as a size)",
       Infer(TextRequest({"a"}), [](Request* r) { r->mutable_inputs(0)->set_shape(0, -1); }),
       kInvalid,
       {"negative dimension"},
       ""},
      {"ids_rank_1",
       "INPUT_IDS shape [3]",
       Infer(IdsRequest({3}, {101, 102, 103})),
       kInvalid,
       {"[N, T]"},
       ""},
      {"ids_shape_lie",
       "INPUT_IDS shape [2, 3] with 5 ids",
       Infer(IdsRequest({2, 3}, {101, 7592, 102, 101, 102})),
       kInvalid,
       {"6 elements", "5 came"},
       ""},
      {"ids_in_wrong_list",
       "INPUT_IDS in int_contents",
       Infer(IdsRequest({1, 2}, {}),
             [](Request* r) {
               r->mutable_inputs(0)->mutable_contents()->add_int_contents(101);
               r->mutable_inputs(0)->mutable_contents()->add_int_contents(102);
             }),
       kInvalid,
       {"int_contents", "int64_contents"},
       ""},
  };
}

std::vector<OipCase> RawContentCases() {
  return {
      {"raw_ids_wrong_length",
       "INPUT_IDS [1, 3] with 23 raw bytes",
       Infer(IdsRequest({1, 3}, {}),
             [](Request* r) { r->add_raw_input_contents(std::string(23, '\1')); }),
       kInvalid,
       {"24 bytes", "23 bytes"},
       ""},
      {"raw_prefix_overruns",
       "TEXT raw element whose length prefix says 4294967295",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1);
               r->add_raw_input_contents(LittleEndian32(0xffffffffu) + "abc");
             }),
       kInvalid,
       {"4294967295", "3 bytes"},
       ""},
      {"raw_short_prefix",
       "TEXT raw contents of 2 bytes (half a length prefix)",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1);
               r->add_raw_input_contents("ab");
             }),
       kInvalid,
       {"end after 0"},
       ""},
      {"raw_count_mismatch",
       "1 input, 2 raw_input_contents",
       Infer(TextRequest({}),
             [](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1);
               r->add_raw_input_contents(BytesElement("a"));
               r->add_raw_input_contents(BytesElement("b"));
             }),
       kInvalid,
       {"2 entries for 1 inputs"},
       ""},
      {"raw_and_contents",
       "raw_input_contents and contents.bytes_contents both",
       Infer(TextRequest({"a"}), [](Request* r) { r->add_raw_input_contents(BytesElement("a")); }),
       kInvalid,
       {"one or the other"},
       ""},
      {"raw_invalid_utf8",
       "a TEXT element of invalid UTF-8",
       Infer(TextRequest({std::string("ok \xff\xfe bad")})),
       kInvalid,
       {"TEXT[0]", "UTF-8"},
       ""},
      {"empty_text",
       "a TEXT element of 0 bytes",
       Infer(TextRequest({"a", ""})),
       kInvalid,
       {"TEXT[1]", "empty"},
       ""},
  };
}

std::vector<OipCase> HugeCases() {
  const std::string three_mb = [] {
    std::string text;
    while (text.size() < (3u << 20)) text += "a long document about rivers and towns ";
    return text;
  }();
  const std::string five_mb(5u << 20, 'w');
  return {
      {"huge_bytes_element",
       "one 3 MB TEXT element (no truncation asked)",
       Infer(TextRequest({three_mb})),
       kInvalid,
       {"TEXT[0]", "tokens"},
       three_mb},
      {"huge_raw_element",
       "one 3 MB TEXT element as raw contents, 'truncation': 'right'",
       Infer(TextRequest({}),
             [three_mb](Request* r) {
               r->mutable_inputs(0)->set_shape(0, 1);
               r->add_raw_input_contents(BytesElement(three_mb));
               SetParameter(r->mutable_parameters(), "truncation", "right");
             }),
       0,
       {},
       three_mb},
      {"over_message_limit",
       "a 5 MB TEXT element (over --max-message-bytes 4 MiB)",
       Infer(TextRequest({five_mb})),
       kExhausted,
       {"--max-message-bytes"},
       five_mb},
      {"attention_padding_too_large",
       "ATTENTION for 256 inputs, one of 250 tokens: padded, 800 MB",
       Infer(TextRequest({}),
             [](Request* r) {
               std::string long_text;
               for (int i = 0; i < 240; ++i) long_text += "word ";
               r->mutable_inputs(0)->set_shape(0, 256);
               r->mutable_inputs(0)->mutable_contents()->add_bytes_contents(long_text);
               for (int i = 1; i < 256; ++i) {
                 r->mutable_inputs(0)->mutable_contents()->add_bytes_contents("x");
               }
               r->add_outputs()->set_name("ATTENTION");
             }),
       kExhausted,
       {"padded", "--max-message-bytes"},
       ""},
  };
}

}  // namespace attn::integration::oip_hostile
