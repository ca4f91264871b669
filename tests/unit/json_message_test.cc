// The HTTP routes' strict JSON reader (server/http/json_message.h) against protobuf's own JSON
// parser, the reference for what the mapping means: every body both accept must give the same
// message; the bodies protobuf reads leniently (issue 31, finding 8) must be refused here,
// naming the field, quoting at most 64 bytes of input.
#include "server/http/json_message.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "attnserve/v1/encoder.pb.h"

namespace attn::server::http {
namespace {

namespace v1 = attnserve::v1;

template <typename Message>
absl::Status Strict(const std::string& body, Message* message, std::string* param = nullptr) {
  std::string ignored;
  return JsonToMessage(body, message, param != nullptr ? param : &ignored);
}

template <typename Message>
bool Lenient(const std::string& body, Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  return google::protobuf::util::JsonStringToMessage(body, message, options).ok();
}

TEST(JsonToMessage, ReadsWhatProtobufReadsTheSameWay) {
  const std::vector<std::string> encode_bodies = {
      "",
      "{}",
      R"({"inputs": [{"text": "a"}, {"pair": {"first": "q", "second": "d"}}]})",
      R"({"inputs": [{"tokens": {"ids": [101, 7592, 102], "typeIds": [0, 0, 0]}}]})",
      R"({"inputs": [{"text": "a"}], "pooling": "POOLING_MEAN", "normalize": false})",
      R"({"inputs": [{"text": "a"}], "pooling": 2, "normalize": null, "sparse": true})",
      R"({"inputs": [{"text": "a"}], "hidden_layers": [0, -1], "dimensions": 64})",
      R"({"inputs": [{"text": "a"}], "hiddenLayers": [], "outputDtype": "BFLOAT16"})",
      R"({"inputs": [{"text": "a"}], "tokenization": {"truncation": "TRUNCATION_LEFT",
          "max_length": 16}, "modelVersion": "base", "model": "m"})",
      R"({"inputs": [{"text": "caf\u00e9 \ud83d\ude00"}], "return_token_embeddings": true})",
      R"({"inputs": [{"text": "a"}], "dimensions": 64.0})",
  };
  for (const std::string& body : encode_bodies) {
    v1::EncodeRequest strict, lenient;
    const absl::Status status = Strict(body, &strict);
    ASSERT_TRUE(status.ok()) << body << ": " << status;
    ASSERT_TRUE(Lenient(body.empty() ? "{}" : body, &lenient)) << body;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(strict, lenient))
        << body << "\nstrict:  " << strict.ShortDebugString()
        << "\nlenient: " << lenient.ShortDebugString();
  }
  // Optional fields keep their presence: normalize false is "false", not "unset".
  v1::EncodeRequest request;
  ASSERT_TRUE(Strict(R"({"normalize": false})", &request).ok());
  EXPECT_TRUE(request.has_normalize());
}

TEST(JsonToMessage, RefusesWhatProtobufReadsLeniently) {
  struct Case {
    std::string body;
    std::string param;    // the field named in the error's param
    std::string message;  // a part of the message
  };
  const std::vector<Case> cases = {
      {R"({"inputs": [[{"text": "x"}]]})", "inputs[0]", "inputs[0] is an array"},
      {R"({"hiddenLayers": [[1], [2]]})", "hiddenLayers[0]", "hiddenLayers[0] is an array"},
      {R"({"sparse": "yes"})", "sparse", "sparse is a string; it takes true or false"},
      {R"({"sparse": "true"})", "sparse", "sparse is a string"},
      {R"({"sparse": 1})", "sparse", "sparse is an integer"},
      {R"({"dimensions": "64"})", "dimensions", "dimensions is a string; it takes an integer"},
      {R"({"dimensions": 6.5})", "dimensions", "dimensions is not a whole number"},
      {R"({"dimensions": 4294967296})", "dimensions", "outside the range"},
      {R"({"hiddenLayers": [1, null]})", "hiddenLayers[1]", "hiddenLayers[1] is null"},
      {R"({"inputs": [{"text": "x", "tokens": {"ids": [1]}}]})", "inputs[0].tokens",
       "inputs[0] sets both text and tokens"},
      {R"({"hidden_layers": [1], "hiddenLayers": [2]})", "hiddenLayers",
       "hiddenLayers is given twice (as hidden_layers and hiddenLayers)"},
      {R"({"inputs": {"text": "x"}})", "inputs", "inputs is an object; it takes a list"},
      {R"({"inputs": ["x"]})", "inputs[0]", "each element of inputs is an object"},
      {R"({"pooling": "mean"})", "pooling", "pooling is 'mean', which is not one of"},
      {R"({"pooling": true})", "pooling", "pooling is a boolean"},
      {R"({"inputz": []})", "", "unknown field 'inputz' (did you mean 'inputs'?)"},
      {R"({"inputs": [{"txt": "x"}]})", "inputs[0]", "unknown field 'txt' (did you mean 'text'?)"},
      {R"({"hiddenLayer": [1]})", "", "(did you mean 'hiddenLayers'?)"},
      {R"([1, 2])", "", "the body is an array; it must be a JSON object"},
      {R"({"inputs": )", "", "not valid JSON"},
  };
  for (const Case& c : cases) {
    v1::EncodeRequest request;
    std::string param = "unset";
    const absl::Status status = Strict(c.body, &request, &param);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_TRUE(absl::StrContains(status.message(), c.message))
        << c.body << "\n  wanted: " << c.message << "\n  got:    " << status.message();
    EXPECT_TRUE(absl::StartsWith(status.message(), "the request body is not")) << status.message();
    EXPECT_EQ(param, c.param) << c.body << ": " << status.message();
  }
}

TEST(JsonToMessage, QuotesAtMost64BytesOfWhatItWasSent) {
  const std::string name(10000, 'n');
  v1::EncodeRequest request;
  std::string param;
  absl::Status status = Strict("{\"" + name + "\": 1}", &request, &param);
  EXPECT_TRUE(
      absl::StrContains(status.message(), "'" + std::string(64, 'n') + "'\u2026(10000 bytes)"))
      << status.message();
  EXPECT_FALSE(absl::StrContains(status.message(), std::string(65, 'n')));
  EXPECT_LT(status.message().size(), 600u);
  status = Strict(R"({"pooling": ")" + std::string(5000, 'P') + "\"}", &request, &param);
  EXPECT_FALSE(absl::StrContains(status.message(), std::string(65, 'P'))) << status.message();
  EXPECT_TRUE(absl::StrContains(status.message(), "(5000 bytes)")) << status.message();
}

TEST(UnknownFieldMessage, SuggestsTheClosestNameOnlyWhenClose) {
  const std::vector<std::string> known = {"input", "model", "encoding_format", "dimensions"};
  EXPECT_EQ(UnknownFieldMessage("dimension", "/v1/embeddings", known),
            "unknown field 'dimension' (did you mean 'dimensions'?); /v1/embeddings takes: "
            "input, model, encoding_format, dimensions");
  EXPECT_TRUE(absl::StrContains(UnknownFieldMessage("encodingFormat", "x", known),
                                "did you mean 'encoding_format'"));
  EXPECT_FALSE(absl::StrContains(UnknownFieldMessage("temperature", "x", known), "did you mean"));
}

}  // namespace
}  // namespace attn::server::http
