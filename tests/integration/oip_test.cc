// The Open Inference Protocol front end (server/oip/) against the real server: the real
// `tritonclient` package (PyPI, from the test venv scripts/setup.sh creates) over gRPC and REST
// gets attnserve.v1.Encoder's answers for the same inputs (tests/integration/oip_client_check.py);
// a pinned version answers as that version; the call counts in the request metrics under the
// protocol's method names; a server with an API key wants it on OIP calls but not on its probes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "inference/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/oip/oip_rest.h"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using nlohmann::json;

constexpr int kLayer = 2;  // TOKEN_EMBEDDINGS' hidden state 2 and ATTENTION's layer 2

const std::vector<std::string>& Texts() {
  static const auto* texts = new std::vector<std::string>{
      "The animal didn't cross the street because it was too tired.",
      "A man is playing a guitar.",
      "Ünïcödé text, CJK 日本語 and emoji 🙂 travel as BYTES intact.",
      "x",
  };
  return *texts;
}

pb::EncodeRequest TextRequest() {
  pb::EncodeRequest request;
  for (const std::string& text : Texts()) request.add_inputs()->set_text(text);
  // OIP refuses an over-long input unless asked to truncate: so does this reference.
  request.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
  return request;
}

template <typename Request, typename Response, typename Call>
Response CallOrFail(Call call, const Request& request) {
  Response response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  const grpc::Status status = call(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

// What attnserve.v1.Encoder answers for the inputs oip_client_check.py sends.
json ExpectedAnswers(pb::Encoder::Stub* stub) {
  auto encode = [stub](grpc::ClientContext* c, const pb::EncodeRequest& r, pb::EncodeResponse* o) {
    return stub->Encode(c, r, o);
  };
  json expected = {{"texts", Texts()}, {"hidden", 384}, {"dimensions", 128}, {"layer", kLayer}};
  pb::EncodeRequest request = TextRequest();
  request.add_hidden_layers(kLayer);
  const pb::EncodeResponse full =
      CallOrFail<pb::EncodeRequest, pb::EncodeResponse>(encode, request);
  expected["version"] = full.model_version();
  json embeddings = json::array(), counts = json::array(), ids = json::array(),
       tokens = json::array();
  for (const pb::EncodeResult& r : full.results()) {
    embeddings.push_back(std::vector<float>(r.embedding().begin(), r.embedding().end()));
    counts.push_back(r.tokens_size());
    json row = json::array();
    for (const pb::Token& t : r.tokens()) row.push_back(t.id());
    ids.push_back(row);
    if (r.hidden_states_size() != 1) {
      ADD_FAILURE() << "Encode gave " << r.hidden_states_size() << " hidden states";
      return expected;
    }
    const std::vector<float> values = DecodeOrFail(r.hidden_states(0).tensor());
    const std::vector<int64_t> shape = Shape(r.hidden_states(0).tensor());  // (T, hidden)
    json matrix = json::array();
    for (int64_t t = 0; t < shape[0]; ++t) {
      matrix.push_back(
          std::vector<float>(values.begin() + t * shape[1], values.begin() + (t + 1) * shape[1]));
    }
    tokens.push_back(matrix);
  }
  expected["embeddings"] = embeddings;
  expected["token_counts"] = counts;
  expected["token_ids"] = ids;
  expected["token_embeddings"] = tokens;

  pb::EncodeRequest cut = TextRequest();
  cut.set_dimensions(128);
  json cut_embeddings = json::array();
  const pb::EncodeResponse cut_response =
      CallOrFail<pb::EncodeRequest, pb::EncodeResponse>(encode, cut);
  for (const pb::EncodeResult& r : cut_response.results()) {
    cut_embeddings.push_back(std::vector<float>(r.embedding().begin(), r.embedding().end()));
  }
  expected["embeddings_dimensions"] = cut_embeddings;

  pb::AttentionMapRequest attention;
  for (const std::string& text : Texts()) attention.add_inputs()->set_text(text);
  attention.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
  attention.add_layers(kLayer);
  auto attention_call = [stub](grpc::ClientContext* c, const pb::AttentionMapRequest& r,
                               pb::AttentionMapResponse* o) { return stub->AttentionMap(c, r, o); };
  json maps = json::array();
  const pb::AttentionMapResponse attention_response =
      CallOrFail<pb::AttentionMapRequest, pb::AttentionMapResponse>(attention_call, attention);
  for (const pb::AttentionResult& r : attention_response.results()) {
    if (r.layers_size() != 1) {
      ADD_FAILURE() << "AttentionMap gave " << r.layers_size() << " layers";
      return expected;
    }
    const std::vector<float> values = DecodeOrFail(r.layers(0).weights());
    const std::vector<int64_t> shape = Shape(r.layers(0).weights());  // (heads, T, T)
    json heads = json::array();
    for (int64_t h = 0; h < shape[0]; ++h) {
      json rows = json::array();
      for (int64_t q = 0; q < shape[1]; ++q) {
        const auto begin = values.begin() + (h * shape[1] + q) * shape[2];
        rows.push_back(std::vector<float>(begin, begin + shape[2]));
      }
      heads.push_back(rows);
    }
    maps.push_back(heads);
  }
  expected["attention"] = maps;
  return expected;
}

std::string RunPython(const std::string& arguments, int* exit_code) {
  const std::string python = ATTN_TEST_VENV_PYTHON;
  EXPECT_EQ(access(python.c_str(), X_OK), 0)
      << python << " is missing: scripts/setup.sh creates the test venv with tritonclient";
  return RunCommand("NO_PROXY='*' no_proxy='*' '" + python + "' " + arguments + " 2>&1", exit_code);
}

TEST(OipTest, TritonClient) {
  std::unique_ptr<pb::Encoder::Stub> stub = SharedServer().NewStub();
  const std::string path = SharedServer().process().dir() + "/oip_expected.json";
  std::ofstream(path) << ExpectedAnswers(stub.get()).dump();
  int exit_code = -1;
  const std::string output =
      RunPython(std::string("'") + ATTN_OIP_CHECK_SCRIPT +
                    "' --grpc 127.0.0.1:" + std::to_string(SharedServer().grpc_port()) +
                    " --http 127.0.0.1:" + std::to_string(SharedServer().http_port()) +
                    " --expected '" + path + "'",
                &exit_code);
  std::cout << output;  // each check's figures, in the test log
  EXPECT_EQ(exit_code, 0);
  EXPECT_NE(output.find("tritonclient: all checks passed"), std::string::npos) << output;
}

// Calls count in attnserve_requests_total under OIP's method names, per protocol.
TEST(OipTest, RequestMetricsNameTheProtocolsMethods) {
  auto channel = SharedServer().NewChannel();
  auto oip = inference::GRPCInferenceService::NewStub(channel);
  grpc::ClientContext context;
  inference::ServerLiveRequest request;
  inference::ServerLiveResponse response;
  ASSERT_TRUE(oip->ServerLive(&context, request, &response).ok());
  EXPECT_TRUE(response.live());
  HttpResponse http;
  std::string error;
  ASSERT_TRUE(HttpGet(SharedServer().http_port(), "/v2/health/ready", &http, &error)) << error;
  EXPECT_EQ(http.status, 200) << http.body;
  EXPECT_GE(ScrapeSum(SharedServer(), "attnserve_requests_total",
                      {{"protocol", "grpc"}, {"method", "ServerLive"}, {"code", "OK"}}),
            1);
  EXPECT_GE(ScrapeSum(SharedServer(), "attnserve_requests_total",
                      {{"protocol", "http"}, {"method", "ServerReady"}, {"code", "OK"}}),
            1);
}

// --api-key-file covers OIP calls on both transports; the probes (live, ready) stay open, as
// Kubernetes and KServe probe without credentials.
TEST(OipTest, ApiKeyCoversCallsNotProbes) {
  const std::string key_file = SharedServer().process().dir() + "/oip-api-key";
  std::ofstream(key_file) << "oip-test-key\n";
  ServerProcess server({"--api_key_file=" + key_file});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(90), &error)) << error;
  HttpResponse response;
  ASSERT_TRUE(HttpGet(server.http_port(), "/v2/health/ready", &response, &error)) << error;
  EXPECT_EQ(response.status, 200);
  ASSERT_TRUE(HttpGet(server.http_port(), "/v2/models/all-MiniLM-L6-v2", &response, &error));
  EXPECT_EQ(response.status, 401) << response.body;
  EXPECT_NE(response.body.find("\"error\""), std::string::npos) << response.body;
  ASSERT_TRUE(HttpRequest(server.http_port(), "GET", "/v2/models/all-MiniLM-L6-v2",
                          {"Authorization: Bearer oip-test-key"}, "", &response, &error));
  EXPECT_EQ(response.status, 200) << response.body;

  auto oip = inference::GRPCInferenceService::NewStub(server.NewChannel());
  {
    grpc::ClientContext context;
    inference::ServerReadyResponse ready;
    ASSERT_TRUE(oip->ServerReady(&context, {}, &ready).ok());
    EXPECT_TRUE(ready.ready());
  }
  inference::ModelMetadataRequest request;
  request.set_name("all-MiniLM-L6-v2");
  inference::ModelMetadataResponse metadata;
  {
    grpc::ClientContext context;
    EXPECT_EQ(oip->ModelMetadata(&context, request, &metadata).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer oip-test-key");
  const grpc::Status with_key = oip->ModelMetadata(&context, request, &metadata);
  ASSERT_TRUE(with_key.ok()) << with_key.error_code() << " " << with_key.error_message();
  ASSERT_GT(metadata.outputs_size(), 0);
  EXPECT_EQ(metadata.outputs(0).name(), "EMBEDDING");
}

// --shutdown-delay-s: after SIGTERM the server says NOT_SERVING (gRPC health, /health,
// /v2/health/ready) while it still answers calls (gRPC Encode, OIP REST infer), so a load
// balancer takes it out before it stops accepting; then it drains and exits 0.
TEST(OipTest, ShutdownDelayKeepsAnsweringWhileNotReady) {
  ServerProcess server({"--shutdown_delay_s=4"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(90), &error)) << error;
  server.process().Signal(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  HttpResponse health;
  ASSERT_TRUE(WaitFor(
      [&] {
        return HttpGet(server.http_port(), "/health", &health, &error) && health.status == 503;
      },
      ScaledSeconds(3)))
      << "/health still " << health.status;
  HttpResponse ready;
  ASSERT_TRUE(HttpGet(server.http_port(), "/v2/health/ready", &ready, &error)) << error;
  EXPECT_EQ(ready.status, 503) << ready.body;
  HttpResponse infer;
  ASSERT_TRUE(HttpRequest(server.http_port(), "POST", "/v2/models/all-MiniLM-L6-v2/infer",
                          {"Content-Type: application/json"},
                          R"({"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES",)"
                          R"( "data": ["still answered"]}]})",
                          &infer, &error))
      << error;
  EXPECT_EQ(infer.status, 200) << infer.body;
  auto stub = server.NewStub();
  pb::EncodeRequest request;
  request.add_inputs()->set_text("still answered over gRPC");
  pb::EncodeResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(stub->Encode(&context, request, &response).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(4))
      << "the checks above ran after the delay: the machine is too slow for this test";
  int status = 0;
  ASSERT_TRUE(server.process().WaitExit(ScaledSeconds(60), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.process().ExitDescription();
}

// attnserve --help lists the gRPC service's every method and every REST route of the table the
// server dispatches from.
TEST(OipTest, HelpListsTheServiceAndTheRoutes) {
  int exit_code = -1;
  const std::string help = RunCommand("'" + AttnserveBinary() + "' --help 2>&1", &exit_code);
  const google::protobuf::ServiceDescriptor* service =
      inference::ModelInferRequest::descriptor()->file()->FindServiceByName("GRPCInferenceService");
  ASSERT_NE(service, nullptr);
  EXPECT_NE(help.find("inference.GRPCInferenceService"), std::string::npos) << help;
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_NE(help.find(service->method(i)->name()), std::string::npos)
        << service->method(i)->name() << " missing from --help";
  }
  for (const server::oip::OipRoute& route : server::oip::OipRouteTable()) {
    EXPECT_NE(help.find(std::string(route.method) + " " + route.path), std::string::npos)
        << route.path << " missing from --help";
  }
  for (const char* rerank : {"/v1/rerank", "/v2/rerank", "/rerank"}) {
    EXPECT_NE(help.find(rerank), std::string::npos) << rerank;
  }
}

}  // namespace
}  // namespace attn::integration
