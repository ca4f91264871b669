// The HTTP/JSON front end against the real server: POST /v1/embeddings (OpenAI's shape) gives the
// same vectors as gRPC Encode of the same texts, in float and base64, with `dimensions`
// (checked against a truncate-and-renormalise loop over the full gRPC embedding too); a batch of
// 256 strings; token-id inputs; each REST route against its gRPC call; the real `openai`
// Python package (installed by scripts/setup.sh in the test venv) calling the server; HTTPS
// from the same --tls-cert/--tls-key as gRPC; the protocol label of the request metrics; a client
// that disconnects while its request is queued gets its work dropped.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using nlohmann::json;

constexpr double kTolerance = 1e-6;
constexpr int kHidden = 384;  // all-MiniLM-L6-v2

const std::vector<std::string>& Texts() {
  static const auto* texts = new std::vector<std::string>{
      "The animal didn't cross the street because it was too tired.",
      "A man is playing a guitar.",
      "Ünïcödé text, CJK 日本語 and emoji 🙂 travel through JSON intact.",
      "x",
  };
  return *texts;
}

class HttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  static int Port() { return SharedServer().http_port(); }

  // POST `body` to `path`; the parsed JSON answer, after checking the status.
  static json Post(const std::string& path, const json& body, int expected_status = 200) {
    HttpResponse response;
    std::string error;
    EXPECT_TRUE(HttpRequest(Port(), "POST", path, {"Content-Type: application/json"}, body.dump(),
                            &response, &error))
        << error;
    EXPECT_EQ(response.status, expected_status) << path << ": " << response.body;
    const json parsed = json::parse(response.body, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << response.body.substr(0, 200);
    return parsed;
  }

  static std::vector<std::vector<float>> GrpcEmbeddings(const std::vector<std::string>& texts,
                                                        std::optional<int> dimensions,
                                                        int64_t* tokens = nullptr) {
    pb::EncodeRequest request;
    for (const std::string& text : texts) request.add_inputs()->set_text(text);
    if (dimensions.has_value()) request.set_dimensions(*dimensions);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
    const grpc::Status status = stub_->Encode(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::vector<float>> out;
    for (const pb::EncodeResult& result : response.results()) {
      out.emplace_back(result.embedding().begin(), result.embedding().end());
    }
    if (tokens != nullptr) *tokens = response.metadata().token_count();
    return out;
  }

  // The `data[i].embedding`s of an OpenAI answer, decoding base64 when it is a string.
  static std::vector<std::vector<float>> Embeddings(const json& answer) {
    std::vector<std::vector<float>> out;
    EXPECT_EQ(answer.value("object", ""), "list");
    const json& data = answer.at("data");
    for (size_t i = 0; i < data.size(); ++i) {
      EXPECT_EQ(data[i].at("object"), "embedding");
      EXPECT_EQ(data[i].at("index"), static_cast<int>(i));
      const json& embedding = data[i].at("embedding");
      if (embedding.is_string()) {
        std::string bytes;
        EXPECT_TRUE(absl::Base64Unescape(embedding.get<std::string>(), &bytes));
        EXPECT_EQ(bytes.size() % 4, 0u);
        std::vector<float> values(bytes.size() / 4);
        std::memcpy(values.data(), bytes.data(), bytes.size());  // little-endian host
        out.push_back(std::move(values));
      } else {
        out.push_back(embedding.get<std::vector<float>>());
      }
    }
    return out;
  }

  // The largest MaxAbsDiff over the inputs (infinite when the counts or sizes differ).
  static double MaxAbsDifference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return INFINITY;
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, MaxAbsDiff(a[i], b[i]));
    return worst;
  }

  static pb::Encoder::Stub* stub_;
};

pb::Encoder::Stub* HttpTest::stub_ = nullptr;

TEST_F(HttpTest, EmbeddingsFloatEqualGrpcEncode) {
  int64_t tokens = 0;
  const auto expected = GrpcEmbeddings(Texts(), std::nullopt, &tokens);
  const json answer =
      Post("/v1/embeddings", {{"input", Texts()}, {"model", "all-MiniLM-L6-v2"}, {"user", "u1"}});
  const auto got = Embeddings(answer);
  ASSERT_EQ(got.size(), Texts().size());
  EXPECT_EQ(got[0].size(), static_cast<size_t>(kHidden));
  EXPECT_LE(MaxAbsDifference(got, expected), kTolerance);
  EXPECT_EQ(answer.at("model"), "all-MiniLM-L6-v2");
  EXPECT_EQ(answer.at("usage").at("prompt_tokens"), tokens);
  EXPECT_EQ(answer.at("usage").at("total_tokens"), tokens);
}

TEST_F(HttpTest, EmbeddingsBase64AreTheFloat32Bytes) {
  const auto expected = GrpcEmbeddings(Texts(), std::nullopt);
  const json answer = Post("/v1/embeddings", {{"input", Texts()},
                                              {"model", "sentence-transformers/all-MiniLM-L6-v2"},
                                              {"encoding_format", "base64"}});
  ASSERT_TRUE(answer.at("data").at(0).at("embedding").is_string());
  // The same float32 values bit for bit: the same core call on the same batch shape.
  EXPECT_LE(MaxAbsDifference(Embeddings(answer), expected), kTolerance);
}

TEST_F(HttpTest, DimensionsTruncateThenRenormalise) {
  for (int dimensions : {1, 64, 383, kHidden}) {
    SCOPED_TRACE(dimensions);
    const auto full = GrpcEmbeddings(Texts(), std::nullopt);
    const auto grpc_truncated = GrpcEmbeddings(Texts(), dimensions);
    // The independent reference: the full embedding's first values, normalised by a plain loop.
    std::vector<std::vector<float>> reference;
    for (const auto& embedding : full) {
      std::vector<float> head(embedding.begin(), embedding.begin() + dimensions);
      double norm = 0;
      for (float v : head) norm += static_cast<double>(v) * v;
      for (float& v : head) v = static_cast<float>(v / std::sqrt(norm));
      reference.push_back(std::move(head));
    }
    EXPECT_LE(MaxAbsDifference(grpc_truncated, reference), kTolerance);
    for (const char* format : {"float", "base64"}) {
      const json answer =
          Post("/v1/embeddings",
               {{"input", Texts()}, {"dimensions", dimensions}, {"encoding_format", format}});
      EXPECT_LE(MaxAbsDifference(Embeddings(answer), grpc_truncated), kTolerance) << format;
    }
  }
}

TEST_F(HttpTest, GrpcDimensionsOutOfRangeIsInvalidArgument) {
  for (int dimensions : {0, -1, kHidden + 1, 10000}) {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("a");
    request.set_dimensions(dimensions);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->Encode(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << dimensions;
    EXPECT_NE(status.error_message().find("1 .. 384"), std::string::npos) << status.error_message();
  }
}

TEST_F(HttpTest, BatchOf256Strings) {
  // What LangChain's OpenAIEmbeddings sends: chunks of many strings in one call.
  std::vector<std::string> texts;
  for (int i = 0; i < 256; ++i) {
    texts.push_back("document chunk number " + std::to_string(i) + " about topic " +
                    std::to_string(i % 7));
  }
  const auto expected = GrpcEmbeddings(texts, std::nullopt);
  const auto got = Embeddings(Post("/v1/embeddings", {{"input", texts}}));
  ASSERT_EQ(got.size(), 256u);
  EXPECT_LE(MaxAbsDifference(got, expected), kTolerance);
}

TEST_F(HttpTest, TokenIdInputsEqualTheirText) {
  // Token ids from the tokenizer route, sent back as OpenAI's token-array input.
  const json tokenized = Post("/v1/tokenize", {{"inputs", {{{"text", Texts()[0]}}}}});
  std::vector<int> ids;
  for (const json& token : tokenized.at("results").at(0).at("tokens")) {
    ids.push_back(token.value("id", 0));
  }
  ASSERT_GT(ids.size(), 2u);
  const auto expected = GrpcEmbeddings({Texts()[0]}, std::nullopt);
  EXPECT_LE(MaxAbsDifference(Embeddings(Post("/v1/embeddings", {{"input", ids}})), expected),
            kTolerance);
  EXPECT_LE(MaxAbsDifference(Embeddings(Post("/v1/embeddings", {{"input", {ids, ids}}})),
                             {expected[0], expected[0]}),
            kTolerance);
}

TEST_F(HttpTest, EncodeRouteIsTheProtobufJsonOfEncode) {
  const json answer = Post("/v1/encode", {{"inputs", {{{"text", Texts()[1]}}}},
                                          {"pooling", "POOLING_CLS"},
                                          {"return_token_embeddings", true}});
  const auto expected_tokens = answer.at("results").at(0).at("tokens").size();
  pb::EncodeRequest request;
  request.add_inputs()->set_text(Texts()[1]);
  request.set_pooling(pb::POOLING_CLS);
  pb::EncodeResponse grpc_answer;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Encode(&context, request, &grpc_answer).ok());
  const auto http_embedding = answer.at("results").at(0).at("embedding").get<std::vector<float>>();
  const std::vector<float> grpc_embedding(grpc_answer.results(0).embedding().begin(),
                                          grpc_answer.results(0).embedding().end());
  EXPECT_LE(MaxAbsDifference({http_embedding}, {grpc_embedding}), kTolerance);
  const json& tensor = answer.at("results").at(0).at("tokenEmbeddings");
  EXPECT_EQ(tensor.at("shape"), json({std::to_string(expected_tokens), std::to_string(kHidden)}));
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(tensor.at("data").get<std::string>(), &bytes));
  EXPECT_EQ(bytes.size(), expected_tokens * kHidden * 4);
  EXPECT_EQ(answer.at("modelVersion"), "base");
}

// /v1/rerank scores are the cosines of the gRPC embeddings, best first; /v1/classify on a
// version without a head is a 400 naming it.
TEST_F(HttpTest, RerankAndClassifyRoutes) {
  const std::vector<std::string> documents = {"The history of Rome.",
                                              "An electric kettle boils water fast."};
  const json answer = Post("/v1/rerank", {{"query", "a kettle for tea"},
                                          {"documents", documents},
                                          {"topN", 2},
                                          {"returnDocuments", true}});
  EXPECT_EQ(answer.at("method"), "RERANK_COSINE");
  const json& results = answer.at("results");
  ASSERT_EQ(results.size(), 2u);
  const auto grpc = GrpcEmbeddings({"a kettle for tea", documents[0], documents[1]}, std::nullopt);
  ASSERT_EQ(grpc.size(), 3u);
  float previous = 2;
  for (const json& result : results) {
    const int index = result.value("index", 0);  // protobuf's JSON leaves out index 0
    EXPECT_NEAR(result.at("score").get<double>(), Cosine(grpc[0], grpc[index + 1]), 1e-5);
    EXPECT_EQ(result.at("document"), documents[index]);
    EXPECT_LE(result.at("score").get<float>(), previous);
    previous = result.at("score").get<float>();
  }
  EXPECT_EQ(results.at(0).value("index", 0), 1) << "the kettle first";

  const json refused = Post("/v1/classify", {{"inputs", {{{"text", "hello"}}}}}, 400);
  EXPECT_NE(refused.at("error").at("message").get<std::string>().find(
                "version base has no classification head"),
            std::string::npos)
      << refused.dump();
}

TEST_F(HttpTest, AttentionTokenizeAndModelsRoutes) {
  const json attention = Post(
      "/v1/attention", {{"inputs", {{{"text", "the cat sat"}}}}, {"layers", {0}}, {"heads", {1}}});
  const json& layer = attention.at("results").at(0).at("layers").at(0);
  const size_t tokens = attention.at("results").at(0).at("tokens").size();
  EXPECT_EQ(tokens, 5u);  // [CLS] the cat sat [SEP]
  EXPECT_EQ(layer.at("weights").at("shape"),
            json({"1", std::to_string(tokens), std::to_string(tokens)}));

  const json tokenized = Post("/v1/tokenize", {{"inputs", {{{"text", "Hello there"}}}}});
  std::vector<std::string> pieces;
  for (const json& token : tokenized.at("results").at(0).at("tokens")) {
    pieces.push_back(token.at("text"));
  }
  EXPECT_EQ(pieces, (std::vector<std::string>{"[CLS]", "hello", "there", "[SEP]"}));

  HttpResponse response;
  std::string error;
  ASSERT_TRUE(HttpGet(Port(), "/v1/models", &response, &error)) << error;
  ASSERT_EQ(response.status, 200) << response.body;
  const json models = json::parse(response.body);
  EXPECT_EQ(models.at("object"), "list");
  EXPECT_EQ(models.at("data").at(0).at("id"), "all-MiniLM-L6-v2");
  EXPECT_EQ(models.at("data").at(0).at("object"), "model");
  EXPECT_EQ(models.at("data").at(0).at("info").at("hiddenSize"), kHidden);
  ASSERT_TRUE(HttpGet(Port(), "/v1/models/all-MiniLM-L6-v2", &response, &error)) << error;
  EXPECT_EQ(response.status, 200) << response.body;
  ASSERT_TRUE(HttpGet(Port(), "/health", &response, &error)) << error;
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(json::parse(response.body).at("status"), "SERVING");
}

TEST_F(HttpTest, RequestMetricsCarryTheProtocol) {
  Post("/v1/embeddings", {{"input", "counted"}});
  std::string text, error;
  ASSERT_TRUE(SharedServer().ScrapeMetrics(&text, &error)) << error;
  Metrics metrics;
  ASSERT_TRUE(Metrics::Parse(text, &metrics, &error)) << error;
  EXPECT_GE(metrics.Sum("attnserve_requests_total",
                        {{"protocol", "http"}, {"method", "Embeddings"}, {"code", "OK"}}),
            1);
  EXPECT_GE(metrics.Sum("attnserve_requests_total",
                        {{"protocol", "grpc"}, {"method", "Encode"}, {"code", "OK"}}),
            0);
}

// The real `openai` package (PyPI) against the server: float, base64 (its default) and
// `dimensions`, each equal to gRPC Encode within 1e-6 (tests/integration/openai_client_check.py).
TEST_F(HttpTest, OpenAiPythonClient) {
  const std::string python = ATTN_TEST_VENV_PYTHON;
  ASSERT_EQ(access(python.c_str(), X_OK), 0)
      << python << " is missing: scripts/setup.sh creates the test venv with the openai package";
  json expected = {{"texts", Texts()},
                   {"full", GrpcEmbeddings(Texts(), std::nullopt)},
                   {"dimensions", 128},
                   {"truncated", GrpcEmbeddings(Texts(), 128)}};
  const std::string dir = SharedServer().process().dir();
  const std::string path = dir + "/openai_expected.json";
  std::ofstream(path) << expected.dump();
  const std::string command = "NO_PROXY='*' no_proxy='*' '" + python + "' '" +
                              ATTN_OPENAI_CHECK_SCRIPT +
                              "' --base-url http://127.0.0.1:" + std::to_string(Port()) +
                              "/v1 --expected '" + path + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("openai client: all checks passed"), std::string::npos) << output;
}

// --tls-cert/--tls-key cover the HTTP port, and --api-key-file guards the Encoder's gRPC calls
// and the HTTP routes alike (a server of its own).
TEST_F(HttpTest, TlsAndApiKeyCoverHttpAndGrpc) {
  std::string openssl;
  ASSERT_TRUE(FindOnPath("openssl", &openssl))
      << "no openssl on PATH to make a test certificate (scripts/setup.sh installs it)";
  const std::string dir = SharedServer().process().dir();
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem", key_file = dir + "/api-key";
  const std::string command =
      openssl + " req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext " +
      "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key + " -out " + cert +
      " > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const std::string api_key = "k3y-for-inference";
  std::ofstream(key_file) << api_key << "\n";
  ServerProcess server({"--tls_cert=" + cert, "--tls_key=" + key, "--api_key_file=" + key_file});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(90), &error)) << error;

  // HTTPS with the key: the venv's Python (its own TLS stack) posts to /v1/embeddings; without
  // the key, or with a wrong one, 401.
  const std::string python = ATTN_TEST_VENV_PYTHON;
  ASSERT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing (scripts/setup.sh)";
  auto https_status = [&](const std::string& authorization) {
    const std::string script =
        "import ssl, sys, urllib.request, urllib.error\n"
        "ctx = ssl.create_default_context(cafile=sys.argv[1])\n"
        "headers = {'Content-Type': 'application/json'}\n"
        "if sys.argv[3]: headers['Authorization'] = sys.argv[3]\n"
        "request = urllib.request.Request(sys.argv[2], data=b'{\"input\": \"over tls\"}', "
        "headers=headers)\n"
        "try:\n"
        "    r = urllib.request.urlopen(request, context=ctx, timeout=60)\n"
        "    print(r.status, len(__import__('json').load(r)['data'][0]['embedding']))\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, __import__('json').load(e)['error']['type'])\n";
    const std::string script_path = dir + "/https_check.py";
    std::ofstream(script_path) << script;
    const std::string run = "NO_PROXY='*' no_proxy='*' '" + python + "' '" + script_path + "' '" +
                            cert + "' https://localhost:" + std::to_string(server.http_port()) +
                            "/v1/embeddings '" + authorization + "' 2>&1";
    FILE* pipe = popen(run.c_str(), "r");
    std::string output;
    char buffer[1024];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
    pclose(pipe);
    return output;
  };
  EXPECT_EQ(https_status("Bearer " + api_key), "200 384\n");
  EXPECT_EQ(https_status(""), "401 authentication_error\n");
  EXPECT_EQ(https_status("Bearer wrong"), "401 authentication_error\n");
  // Plain HTTP on the TLS port gets no HTTP answer.
  HttpResponse plain;
  EXPECT_FALSE(HttpGet(server.http_port(), "/health", &plain, &error, ScaledSeconds(5)) &&
               plain.status == 200);

  // gRPC over TLS: the Encoder needs the key too.
  std::ifstream in(cert);
  const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto encoder = pb::Encoder::NewStub(TlsChannel(server.grpc_port(), pem));
  auto encode = [&](const std::string& authorization) {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("over tls");
    pb::EncodeResponse response;
    grpc::ClientContext context;
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
    return encoder->Encode(&context, request, &response).error_code();
  };
  EXPECT_EQ(encode("Bearer " + api_key), grpc::StatusCode::OK);
  EXPECT_EQ(encode(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(encode("Bearer wrong"), grpc::StatusCode::PERMISSION_DENIED);
  server.process().Stop();
}

// Requests whose clients close their connections while the requests wait in the batcher's
// queue (behind a long gRPC call that holds the engine) are dropped, not computed: the dropped
// counter grows by exactly their number at the queue stage, and the server keeps serving.
TEST_F(HttpTest, ClientDisconnectCancelsQueuedWork) {
  constexpr int kDisconnecting = 6;
  // Dropped in the queue, or between layers if the batch carrying it had started just before.
  const auto cancelled = [] {
    return ScrapeSum(SharedServer(), "attnserve_dropped_requests_total",
                     {{"reason", "cancelled"}, {"stage", "queue"}}) +
           ScrapeSum(SharedServer(), "attnserve_dropped_requests_total",
                     {{"reason", "cancelled"}, {"stage", "compute"}});
  };
  const auto answered = [] {
    return ScrapeSum(SharedServer(), "attnserve_requests_total",
                     {{"protocol", "http"}, {"method", "Embeddings"}, {"code", "OK"}});
  };
  const double cancelled_before = cancelled(), answered_before = answered();
  ASSERT_FALSE(std::isnan(cancelled_before) || std::isnan(answered_before));

  // The blocker: 32 inputs of 256 tokens, seconds of work on this engine.
  grpc::Status blocker_status;
  std::thread blocker([&] {
    pb::EncodeRequest request;
    for (int i = 0; i < 32; ++i) request.add_inputs()->set_text(TextOfTokens(256, 100 + i));
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
    blocker_status = stub_->Encode(&context, request, &response);
  });
  // The blocker is admitted first.
  ASSERT_TRUE(WaitFor([] { return ScrapeSum(SharedServer(), "attnserve_queue_depth") >= 1; },
                      ScaledSeconds(30)));

  // Each request on its own connection, sent whole; the socket stays open until it is queued.
  std::vector<int> sockets;
  for (int i = 0; i < kDisconnecting; ++i) {
    const std::string body =
        json{{"input", "a request nobody waits for " + std::to_string(i)}}.dump();
    const std::string request =
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockets.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(Port()));
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
  }
  // (The depth counts every admitted call: the blocker too.)
  const bool queued = WaitFor(
      [&] { return ScrapeSum(SharedServer(), "attnserve_queue_depth") >= kDisconnecting + 1; },
      ScaledSeconds(30));
  for (int fd : sockets) close(fd);  // the clients go away
  blocker.join();
  ASSERT_TRUE(queued) << "the requests never waited in the queue together";
  ASSERT_TRUE(blocker_status.ok()) << blocker_status.error_message();
  EXPECT_TRUE(
      WaitFor([&] { return cancelled() - cancelled_before >= kDisconnecting; }, ScaledSeconds(30)));
  EXPECT_EQ(cancelled() - cancelled_before, kDisconnecting);
  EXPECT_EQ(answered() - answered_before, 0) << "work of a client that went away was computed";
  EXPECT_EQ(Embeddings(Post("/v1/embeddings", {{"input", "still serving"}})).size(), 1u);
}

// SIGTERM with HTTP calls in flight: each is answered 200, the HTTP port stops accepting, and
// the process exits 0 (the HTTP front end drains beside gRPC).
TEST_F(HttpTest, SigtermDrainsHttpCallsInFlight) {
  constexpr int kRequests = 8;
  ServerProcess server({"--drain_timeout_s=" + std::to_string(ScaledSeconds(30).count())});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(90), &error)) << error;
  std::vector<HttpResponse> responses(kRequests);
  std::vector<std::string> errors(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      const json body = {{"input", {TextOfTokens(256, 2 * i), TextOfTokens(256, 2 * i + 1)}}};
      HttpRequest(server.http_port(), "POST", "/v1/embeddings", {}, body.dump(), &responses[i],
                  &errors[i], ScaledSeconds(120));
    });
  }
  // Every call reached the server: admitted (queue depth) or answered.
  ASSERT_TRUE(WaitFor(
      [&] {
        return ScrapeSum(server, "attnserve_queue_depth") +
                   ScrapeSum(server, "attnserve_requests_total",
                             {{"protocol", "http"}, {"method", "Embeddings"}}) >=
               kRequests;
      },
      ScaledSeconds(30)));
  server.process().Signal(SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return !AcceptsConnections(server.http_port()); }, ScaledSeconds(10)))
      << "the HTTP port still accepts connections after SIGTERM";
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(responses[i].status, 200)
        << i << ": " << errors[i] << responses[i].body.substr(0, 200);
    const json answer = json::parse(responses[i].body, nullptr, false);
    EXPECT_TRUE(!answer.is_discarded() && answer.value("data", json::array()).size() == 2) << i;
  }
  int wait_status = 0;
  ASSERT_TRUE(server.process().WaitExit(ScaledSeconds(40), &wait_status))
      << "attnserve still running after SIGTERM";
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0)
      << server.process().ExitDescription();
}

}  // namespace
}  // namespace attn::integration
