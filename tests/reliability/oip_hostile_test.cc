// The hostile-input catalogue of the Open Inference Protocol front end (server/oip/), over gRPC
// (inference.GRPCInferenceService) and REST (/v2): bad datatypes, shape lies, raw contents of the
// wrong length, huge BYTES elements, unknown parameters, inputs and outputs, broken REST bodies
// and binary sections. One table row per case: what is sent, the code (gRPC) or status (HTTP)
// it must get and words its message must contain; the message may repeat at most 64 bytes of
// what was sent in a row. After every case the server must be alive, healthy and answering
// Encode; at the end its log must be free of crash lines.
//
// Run one case: reliability_oip_hostile_test --gtest_filter='*raw_ids_wrong_length*'
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

constexpr int kMaxMessageBytes = 4 << 20;  // a 3 MB BYTES element fits, a 5 MB one does not
constexpr char kModel[] = "all-MiniLM-L6-v2";

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--max_message_bytes=" + std::to_string(kMaxMessageBytes)};
}

namespace {

using nlohmann::json;
using Request = inference::ModelInferRequest;

struct Answer {
  int code = -1;  // the gRPC code or the HTTP status
  std::string message;
};

struct OipCase {
  std::string name;  // [A-Za-z0-9_], the gtest parameter name
  std::string what;  // one line: what is sent
  std::function<Answer()> send;
  int code;                        // the gRPC code (grpc::StatusCode) or HTTP status it must get
  std::vector<std::string> parts;  // words the message must contain
  std::string sent;                // a long piece of the input the message must not repeat
};

std::ostream& operator<<(std::ostream& out, const OipCase& c) { return out << c.name; }

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
            std::vector<std::string> headers = {}) {
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

constexpr int kInvalid = static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
constexpr int kNotFound = static_cast<int>(grpc::StatusCode::NOT_FOUND);
constexpr int kExhausted = static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);

// The request with `mutate` applied (copies: each case builds its own).
std::function<Answer()> Infer(Request request, std::function<void(Request*)> mutate = nullptr) {
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

std::vector<OipCase> ParameterCases() {
  const std::string long_name(300, 'p');
  auto with = [](std::function<void(Request*)> mutate) {
    return Infer(TextRequest({"a text"}), std::move(mutate));
  };
  return {
      {"unknown_parameter",
       "request parameter 'poolng'",
       with([](Request* r) { SetParameter(r->mutable_parameters(), "poolng", "mean"); }),
       kInvalid,
       {"poolng", "pooling, normalize"},
       ""},
      {"unknown_parameter_300_bytes",
       "a request parameter with a 300-byte name",
       with([long_name](Request* r) { SetParameter(r->mutable_parameters(), long_name, "x"); }),
       kInvalid,
       {"unknown request parameter"},
       long_name},
      {"parameter_wrong_type",
       "normalize: \"yes\"",
       with([](Request* r) { SetParameter(r->mutable_parameters(), "normalize", "yes"); }),
       kInvalid,
       {"normalize", "a bool", "a string"},
       ""},
      {"parameter_without_value",
       "pooling with no value set",
       with([](Request* r) { (*r->mutable_parameters())["pooling"]; }),
       kInvalid,
       {"pooling", "no value"},
       ""},
      {"pooling_unknown",
       "pooling: \"median\"",
       with([](Request* r) { SetParameter(r->mutable_parameters(), "pooling", "median"); }),
       kInvalid,
       {"'median'", "cls, mean, max"},
       ""},
      {"layers_garbage",
       "layers: \"a,b\"",
       with([](Request* r) { SetParameter(r->mutable_parameters(), "layers", "a,b"); }),
       kInvalid,
       {"layers", "comma-separated"},
       ""},
      {"layers_out_of_range",
       "layers 99 with TOKEN_EMBEDDINGS",
       with([](Request* r) {
         (*r->mutable_parameters())["layers"].set_int64_param(99);
         r->add_outputs()->set_name("TOKEN_EMBEDDINGS");
       }),
       kInvalid,
       {"parameter 'layers'"},
       ""},
      {"dimensions_zero",
       "dimensions 0",
       with([](Request* r) { (*r->mutable_parameters())["dimensions"].set_int64_param(0); }),
       kInvalid,
       {"dimensions", "1 .."},
       ""},
      {"dimensions_over_hidden",
       "dimensions 10000 (hidden 384)",
       with([](Request* r) { (*r->mutable_parameters())["dimensions"].set_uint64_param(10000); }),
       kInvalid,
       {"dimensions", "384"},
       ""},
      {"timeout_negative",
       "timeout -5",
       with([](Request* r) { (*r->mutable_parameters())["timeout"].set_int64_param(-5); }),
       kInvalid,
       {"timeout"},
       ""},
      {"unknown_input_parameter",
       "input parameter 'foo'",
       with([](Request* r) {
         (*r->mutable_inputs(0)->mutable_parameters())["foo"].set_bool_param(true);
       }),
       kInvalid,
       {"input TEXT", "'foo'", "content_type"},
       ""},
      {"unknown_output_parameter",
       "output parameter 'classification' (Triton's, not ours)",
       with([](Request* r) {
         auto* out = r->add_outputs();
         out->set_name("EMBEDDING");
         (*out->mutable_parameters())["classification"].set_int64_param(3);
       }),
       kInvalid,
       {"output EMBEDDING", "'classification'"},
       ""},
  };
}

std::vector<OipCase> TensorNameCases() {
  auto with = [](std::function<void(Request*)> mutate) {
    return Infer(TextRequest({"a text"}), std::move(mutate));
  };
  return {
      {"unknown_input",
       "an input named IMAGE",
       with([](Request* r) { r->mutable_inputs(0)->set_name("IMAGE"); }),
       kInvalid,
       {"'IMAGE'", "TEXT", "INPUT_IDS"},
       ""},
      {"no_inputs",
       "no inputs",
       with([](Request* r) { r->clear_inputs(); }),
       kInvalid,
       {"no input"},
       ""},
      {"text_and_ids",
       "TEXT and INPUT_IDS",
       with([](Request* r) {
         *r->add_inputs() = IdsRequest({1, 2}, {101, 102}).inputs(0);
       }),
       kInvalid,
       {"both TEXT and INPUT_IDS"},
       ""},
      {"input_twice",
       "TEXT twice",
       with([](Request* r) { *r->add_inputs() = r->inputs(0); }),
       kInvalid,
       {"given twice"},
       ""},
      {"unknown_output",
       "output LOGITS",
       with([](Request* r) { r->add_outputs()->set_name("LOGITS"); }),
       kInvalid,
       {"'LOGITS'", "EMBEDDING, TOKEN_EMBEDDINGS"},
       ""},
      {"output_twice",
       "EMBEDDING asked twice",
       with([](Request* r) {
         r->add_outputs()->set_name("EMBEDDING");
         r->add_outputs()->set_name("EMBEDDING");
       }),
       kInvalid,
       {"asked twice"},
       ""},
      {"embedding_without_pooling",
       "EMBEDDING with pooling none",
       with([](Request* r) { SetParameter(r->mutable_parameters(), "pooling", "none"); }),
       kInvalid,
       {"EMBEDDING", "pooling"},
       ""},
      {"mask_not_a_prefix",
       "ATTENTION_MASK [1, 0, 1]",
       Infer(IdsRequest({1, 3}, {101, 7592, 102}),
             [](Request* r) {
               auto* mask = r->add_inputs();
               *mask = r->inputs(0);
               mask->set_name("ATTENTION_MASK");
               mask->mutable_contents()->clear_int64_contents();
               for (int64_t m : {1, 0, 1}) mask->mutable_contents()->add_int64_contents(m);
             }),
       kInvalid,
       {"ATTENTION_MASK", "ones then zeros"},
       ""},
      {"ids_negative",
       "INPUT_IDS with -5",
       Infer(IdsRequest({1, 2}, {101, -5})),
       kInvalid,
       {"INPUT_IDS[0][1]", "-5"},
       ""},
      {"ids_out_of_vocabulary",
       "INPUT_IDS with 999999 (vocabulary 30522)",
       Infer(IdsRequest({1, 3}, {101, 999999, 102})),
       kInvalid,
       {"999999"},
       ""},
      {"unknown_model",
       "model_name 'no-such-model'",
       with([](Request* r) { r->set_model_name("no-such-model"); }),
       kNotFound,
       {"'no-such-model'", kModel},
       ""},
      {"unknown_version",
       "model_version 'ft-999'",
       with([](Request* r) { r->set_model_version("ft-999"); }),
       kNotFound,
       {"ft-999"},
       ""},
  };
}

std::string InferPath() { return std::string("/v2/models/") + kModel + "/infer"; }

std::vector<OipCase> RestCases() {
  const json text = {{"name", "TEXT"}, {"shape", {1}}, {"datatype", "BYTES"}, {"data", {"a"}}};
  auto post = [](std::string body, std::vector<std::string> headers = {}) {
    return [body, headers] { return Rest("POST", InferPath(), body, headers); };
  };
  std::string deep(10000, '[');
  return {
      {"rest_not_json",
       "POST .../infer with 'inputs: [' (not JSON)",
       post("inputs: ["),
       400,
       {"not valid JSON", "byte"},
       ""},
      {"rest_deep_nesting",
       "10,000 nested lists",
       post("{\"inputs\": " + deep),
       400,
       {"nests deeper than 64"},
       ""},
      {"rest_unknown_field",
       "{\"inputz\": ...}",
       post(json{{"inputz", {text}}}.dump()),
       400,
       {"'inputz'", "inputs"},
       ""},
      {"rest_data_wrong_type",
       "TEXT data [1, 2]",
       post(json{{"inputs",
                  {{{"name", "TEXT"}, {"shape", {2}}, {"datatype", "BYTES"}, {"data", {1, 2}}}}}}
                .dump()),
       400,
       {"data element 0", "strings"},
       ""},
      {"rest_shape_lie",
       "TEXT shape [3], data of 2",
       post(
           json{{"inputs",
                 {{{"name", "TEXT"}, {"shape", {3}}, {"datatype", "BYTES"}, {"data", {"a", "b"}}}}}}
               .dump()),
       400,
       {"3 elements", "2 came"},
       ""},
      {"rest_header_length_garbage",
       "Inference-Header-Content-Length: abc",
       post(json{{"inputs", {text}}}.dump(), {"Inference-Header-Content-Length: abc"}),
       400,
       {"Inference-Header-Content-Length", "'abc'"},
       ""},
      {"rest_header_length_beyond_body",
       "Inference-Header-Content-Length: 99999",
       post(json{{"inputs", {text}}}.dump(), {"Inference-Header-Content-Length: 99999"}),
       400,
       {"Inference-Header-Content-Length"},
       ""},
      {"rest_binary_not_adding_up",
       "10 binary bytes, binary_data_size 7",
       [] {
         const std::string header = json{{"inputs",
                                          {{{"name", "TEXT"},
                                            {"shape", {1}},
                                            {"datatype", "BYTES"},
                                            {"parameters", {{"binary_data_size", 7}}}}}}}
                                        .dump();
         return Rest("POST", InferPath(), header + BytesElement("abc") + "xyz",
                     {"Inference-Header-Content-Length: " + std::to_string(header.size())});
       },
       400,
       {"10 bytes after", "add up to 7"},
       ""},
      {"rest_binary_size_beyond",
       "binary_data_size 1000 with 7 binary bytes",
       [] {
         const std::string header = json{{"inputs",
                                          {{{"name", "TEXT"},
                                            {"shape", {1}},
                                            {"datatype", "BYTES"},
                                            {"parameters", {{"binary_data_size", 1000}}}}}}}
                                        .dump();
         return Rest("POST", InferPath(), header + BytesElement("abc"),
                     {"Inference-Header-Content-Length: " + std::to_string(header.size())});
       },
       400,
       {"binary_data_size is 1000", "7 bytes"},
       ""},
      {"rest_data_and_binary",
       "an input with data and binary_data_size",
       post(json{{"inputs",
                  {{{"name", "TEXT"},
                    {"shape", {1}},
                    {"datatype", "BYTES"},
                    {"data", {"a"}},
                    {"parameters", {{"binary_data_size", 5}}}}}}}
                .dump()),
       400,
       {"both"},
       ""},
      {"rest_parameters_not_object",
       "\"parameters\": [1]",
       post(json{{"inputs", {text}}, {"parameters", {1}}}.dump()),
       400,
       {"\"parameters\" must be an object"},
       ""},
      {"rest_unknown_route",
       "GET /v2/repository/index (not served)",
       [] { return Rest("GET", "/v2/repository/index", ""); },
       404,
       {"no route", "/v2/health"},
       ""},
      {"rest_wrong_method",
       "GET .../infer",
       [] { return Rest("GET", InferPath(), ""); },
       405,
       {"POST"},
       ""},
      {"rest_bad_escape",
       "GET /v2/models/%zz",
       [] { return Rest("GET", "/v2/models/%zz", ""); },
       404,
       {"no model"},
       ""},
      {"rest_unknown_model",
       "GET /v2/models/nope/ready",
       [] { return Rest("GET", "/v2/models/nope/ready", ""); },
       404,
       {"'nope'"},
       ""},
  };
}

std::vector<OipCase> AllCases() {
  std::vector<OipCase> cases;
  for (auto group : {DatatypeAndShapeCases(), RawContentCases(), HugeCases(), ParameterCases(),
                     TensorNameCases(), RestCases()}) {
    cases.insert(cases.end(), group.begin(), group.end());
  }
  return cases;
}

// The longest run of `sent` (its first 4 KiB) that `message` repeats, in bytes.
size_t LongestEcho(const std::string& message, const std::string& sent) {
  const std::string probe = sent.substr(0, 4096);
  size_t longest = 0;
  for (size_t start = 0; start < probe.size(); ++start) {
    size_t low = longest + 1;
    while (start + low <= probe.size() &&
           message.find(probe.substr(start, low)) != std::string::npos) {
      longest = low++;
    }
  }
  return longest;
}

class OipHostileTest : public ::testing::TestWithParam<OipCase> {
 protected:
  static void TearDownTestSuite() {
    const std::vector<std::string> crashes =
        reliability::CrashLines(reliability::FullLog(SharedServer()));
    EXPECT_TRUE(crashes.empty()) << "the server log shows a crash:\n" << crashes.front();
  }
};

TEST_P(OipHostileTest, RefusedClearlyAndServingOn) {
  const OipCase& c = GetParam();
  const Answer answer = c.send();
  EXPECT_EQ(answer.code, c.code) << c.what << ": " << answer.message;
  for (const std::string& part : c.parts) {
    EXPECT_NE(answer.message.find(part), std::string::npos)
        << c.what << ": the message lacks '" << part << "': " << answer.message;
  }
  if (!c.sent.empty()) {
    EXPECT_LE(LongestEcho(answer.message, c.sent), 64u)
        << c.what << ": the message repeats more than 64 bytes of the input: " << answer.message;
  }
  reliability::ExpectHealthy(SharedServer(), c.name);
}

INSTANTIATE_TEST_SUITE_P(Catalogue, OipHostileTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<OipCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace attn::integration
