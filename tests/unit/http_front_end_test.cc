// The HTTP front end's pieces that need no server: the status mapping (server/status_map.h), the
// OpenAI request parser and response writer (server/http/openai_embeddings.h) and the
// transport-free bearer check (server/auth.h). The routes against the real server are in
// tests/integration/http_test.cc and tests/reliability/http_hostile_test.cc.
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "server/core/cost_model.h"
#include "server/http/openai_embeddings.h"
#include "server/status_map.h"

namespace attn::server {
namespace {

TEST(ToHttpStatus, EachCodeHasItsStatusAndOpenAiType) {
  struct Row {
    absl::Status status;
    int code;
    std::string type;
  };
  const Row rows[] = {
      {absl::OkStatus(), 200, ""},
      {absl::InvalidArgumentError("x"), 400, "invalid_request_error"},
      {absl::FailedPreconditionError("x"), 400, "invalid_request_error"},
      {absl::UnauthenticatedError("x"), 401, "authentication_error"},
      {absl::PermissionDeniedError("x"), 401, "authentication_error"},
      {absl::NotFoundError("x"), 404, "not_found_error"},
      {absl::ResourceExhaustedError("queue full"), 429, "rate_limit_error"},
      {TooLargeError("over --max-message-bytes"), 413, "invalid_request_error"},
      {absl::UnavailableError("x"), 503, "service_unavailable_error"},
      {absl::DeadlineExceededError("x"), 504, "timeout_error"},
      {absl::InternalError("x"), 500, "server_error"},
  };
  for (const Row& row : rows) {
    const HttpStatus mapped = ToHttpStatus(row.status);
    EXPECT_EQ(mapped.code, row.code) << row.status;
    EXPECT_EQ(mapped.type, row.type) << row.status;
  }
  // Too large is still RESOURCE_EXHAUSTED for gRPC.
  EXPECT_EQ(ToGrpcStatus(TooLargeError("x")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(IsTooLarge(absl::ResourceExhaustedError("x")));
}

TEST(AuthorizationHeaderStatus, MissingWrongAndRight) {
  const std::string key = "k3y";
  EXPECT_EQ(AuthorizationHeaderStatus(nullptr, key, "x").code(),
            absl::StatusCode::kUnauthenticated);
  for (std::string_view value : {"Basic abc", "Bearer", "k3y"}) {
    EXPECT_EQ(AuthorizationHeaderStatus(&value, key, "x").code(),
              absl::StatusCode::kUnauthenticated)
        << value;
  }
  for (std::string_view value : {"Bearer k3", "Bearer k3yy", "Bearer K3Y"}) {
    EXPECT_EQ(AuthorizationHeaderStatus(&value, key, "x").code(),
              absl::StatusCode::kPermissionDenied)
        << value;
  }
  for (std::string_view value : {"Bearer k3y", "bearer k3y", "BEARER  k3y "}) {
    EXPECT_TRUE(AuthorizationHeaderStatus(&value, key, "x").ok()) << value;
  }
}

http::EmbeddingsRequest Parse(const std::string& body, absl::Status* status,
                              std::string* param = nullptr) {
  http::EmbeddingsRequest request;
  std::string ignored;
  *status = http::ParseEmbeddingsRequest(body, &request, param != nullptr ? param : &ignored);
  return request;
}

TEST(ParseEmbeddingsRequest, TheFourInputShapes) {
  absl::Status status;
  {
    // (Parse returns a copy; the views are checked on the parser's own object below.)
    http::EmbeddingsRequest request;
    std::string param;
    ASSERT_TRUE(
        http::ParseEmbeddingsRequest(R"({"input": "one text", "model": "m"})", &request, &param)
            .ok());
    ASSERT_EQ(request.encode.inputs.size(), 1u);
    EXPECT_EQ(request.encode.inputs[0].kind, core::Input::Kind::kText);
    EXPECT_EQ(request.encode.inputs[0].text, "one text");
    EXPECT_EQ(request.model, "m");
    EXPECT_FALSE(request.base64);
    EXPECT_FALSE(request.encode.dimensions.has_value());
  }
  {
    http::EmbeddingsRequest request;
    std::string param;
    // Many short strings: views must survive the storage growing (no small-string moves).
    std::string body = R"({"input": [)";
    for (int i = 0; i < 100; ++i) body += (i ? ",\"t" : "\"t") + std::to_string(i) + "\"";
    body += R"(, [1, 2, 3]], "encoding_format": "base64", "dimensions": 8, "user": "u"})";
    ASSERT_TRUE(http::ParseEmbeddingsRequest(body, &request, &param).ok());
    ASSERT_EQ(request.encode.inputs.size(), 101u);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(request.encode.inputs[i].text, "t" + std::to_string(i));
    EXPECT_EQ(request.encode.inputs[100].kind, core::Input::Kind::kTokens);
    EXPECT_EQ(std::vector<int32_t>(request.encode.inputs[100].ids.begin(),
                                   request.encode.inputs[100].ids.end()),
              (std::vector<int32_t>{1, 2, 3}));
    EXPECT_TRUE(request.base64);
    EXPECT_EQ(request.encode.dimensions, 8);
  }
  {
    http::EmbeddingsRequest request;
    std::string param;
    ASSERT_TRUE(
        http::ParseEmbeddingsRequest(R"({"input": [101, 7592, 102]})", &request, &param).ok());
    ASSERT_EQ(request.encode.inputs.size(), 1u);
    EXPECT_EQ(request.encode.inputs[0].ids.size(), 3u);
  }
  std::string param;
  Parse(R"({"input": "a", "dimensions": "8"})", &status, &param);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "dimensions");
  Parse(R"({"input": [true]})", &status, &param);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "input");
  EXPECT_NE(status.message().find("input[0] is a boolean"), std::string::npos) << status;
}

TEST(EmbeddingsResponseJson, FloatAndBase64CarryTheSameFloats) {
  core::EncodeResponse response;
  response.results.resize(2);
  response.results[0].embedding = {0.1f, -2.5f, 3.0e-8f};
  response.results[1].embedding = {1.0f / 3.0f, 0.0f, -0.0f};
  response.metadata.token_count = 7;
  for (bool base64 : {false, true}) {
    const nlohmann::json answer =
        nlohmann::json::parse(http::EmbeddingsResponseJson(response, "m\"odel", base64));
    EXPECT_EQ(answer.at("model"), "m\"odel");
    EXPECT_EQ(answer.at("usage").at("prompt_tokens"), 7);
    for (size_t i = 0; i < 2; ++i) {
      const nlohmann::json& embedding = answer.at("data").at(i).at("embedding");
      std::vector<float> values;
      if (base64) {
        std::string bytes;
        ASSERT_TRUE(absl::Base64Unescape(embedding.get<std::string>(), &bytes));
        values.resize(bytes.size() / 4);
        std::memcpy(values.data(), bytes.data(), bytes.size());
      } else {
        values = embedding.get<std::vector<float>>();
      }
      // Bit-exact: 9 significant digits give back the same float32.
      EXPECT_EQ(values, response.results[i].embedding) << (base64 ? "base64" : "float");
    }
  }
}

}  // namespace
}  // namespace attn::server
