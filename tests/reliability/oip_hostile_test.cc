// The hostile-input catalogue of the Open Inference Protocol front end (server/oip/), over gRPC
// (inference.GRPCInferenceService) and REST (/v2): bad datatypes, shape lies, raw contents of the
// wrong length, huge BYTES elements, unknown parameters, inputs and outputs, broken REST bodies
// and binary sections. One table row per case: what is sent, the code (gRPC) or status (HTTP)
// it must get and words its message must contain; the message may repeat at most 64 bytes of
// what was sent in a row. After every case the server must be alive, healthy and answering
// Encode; at the end its log must be free of crash lines.
//
// Run one case: reliability_oip_hostile_test --gtest_filter='*raw_ids_wrong_length*'
// (The case type, the senders and three of the groups are in oip_hostile_cases.h.)
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/reliability/oip_hostile_cases.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--max_message_bytes=" +
                                  std::to_string(oip_hostile::kMaxMessageBytes)};
}

namespace {

using nlohmann::json;
using oip_hostile::Answer;
using oip_hostile::BytesElement;
using oip_hostile::DatatypeAndShapeCases;
using oip_hostile::HugeCases;
using oip_hostile::IdsRequest;
using oip_hostile::Infer;
using oip_hostile::kInvalid;
using oip_hostile::kModel;
using oip_hostile::kNotFound;
using oip_hostile::OipCase;
using oip_hostile::RawContentCases;
using oip_hostile::Request;
using oip_hostile::Rest;
using oip_hostile::SetParameter;
using oip_hostile::TextRequest;

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
