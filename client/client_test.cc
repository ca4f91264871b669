// EncoderClient and attnctl against an in-process fake Encoder server (real gRPC over loopback,
// real grpc++ built-in health service): status mapping, deadlines, unreachable servers, the
// grpc.health.v1 wire contract, and every attnctl command's request building, output and exit
// codes. The real server's behaviour is covered by tests/integration.
#include "client/client.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/tensor_decode.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined by the build"
#endif

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;

constexpr int kLayers = 6;
constexpr int kHeads = 12;
constexpr int kHidden = 8;  // hidden-state width of the fake (the pooled embedding has 384)

// Float -> half by search: fine for a test that encodes a few exactly representable values.
uint16_t ExactHalf(float f) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    if (HalfToFloat(static_cast<uint16_t>(bits)) == f) return static_cast<uint16_t>(bits);
  }
  ADD_FAILURE() << f << " is not a half";
  return 0;
}

v1::Tensor EncodeTensor(const std::vector<int64_t>& shape, const std::vector<float>& values,
                        v1::DType dtype) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(dtype == v1::DTYPE_UNSPECIFIED ? v1::FLOAT32 : dtype);
  std::string bytes;
  for (float f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (t.dtype() == v1::FLOAT32) {
      for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
    } else {
      const uint16_t h = t.dtype() == v1::BFLOAT16 ? static_cast<uint16_t>(u >> 16) : ExactHalf(f);
      bytes.push_back(static_cast<char>(h & 0xFF));
      bytes.push_back(static_cast<char>(h >> 8));
    }
  }
  t.set_data(bytes);
  return t;
}

// Whitespace tokenizer with [CLS]/[SEP] and ASCII char offsets: enough structure to check the
// client's handling of tokens, pairs and offsets.
void AppendWords(const std::string& text, int source,
                 google::protobuf::RepeatedPtrField<v1::Token>* out) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    const size_t start = i;
    while (i < text.size() && text[i] != ' ') ++i;
    if (i == start) break;
    v1::Token* t = out->Add();
    t->set_text(absl::AsciiStrToLower(text.substr(start, i - start)));
    t->set_id(1000 + static_cast<int>(t->text().size()));
    t->set_char_start(static_cast<int>(start));
    t->set_char_end(static_cast<int>(i));
    t->set_byte_start(static_cast<int>(start));
    t->set_byte_end(static_cast<int>(i));
    t->set_type_id(source);
    t->set_source(source);
  }
}

void AppendSpecial(const char* text, int id, int type_id,
                   google::protobuf::RepeatedPtrField<v1::Token>* out) {
  v1::Token* t = out->Add();
  t->set_text(text);
  t->set_id(id);
  t->set_type_id(type_id);
  t->set_special(true);
  t->set_source(-1);
}

google::protobuf::RepeatedPtrField<v1::Token> FakeTokenize(const v1::Input& input) {
  google::protobuf::RepeatedPtrField<v1::Token> tokens;
  AppendSpecial("[CLS]", 101, 0, &tokens);
  if (input.has_pair()) {
    AppendWords(input.pair().first(), 0, &tokens);
    AppendSpecial("[SEP]", 102, 0, &tokens);
    AppendWords(input.pair().second(), 1, &tokens);
    AppendSpecial("[SEP]", 102, 1, &tokens);
  } else {
    AppendWords(input.text(), 0, &tokens);
    AppendSpecial("[SEP]", 102, 0, &tokens);
  }
  return tokens;
}

class FakeEncoder final : public v1::Encoder::Service {
 public:
  // Every RPC fails with this status when it is not OK.
  void FailWith(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(status);
  }
  void SetDelay(std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_ = delay;
  }
  v1::EncodeRequest last_encode() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_encode_;
  }
  v1::AttentionMapRequest last_attention() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_attention_;
  }
  v1::TokenizeRequest last_tokenize() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_tokenize_;
  }

  grpc::Status Encode(grpc::ServerContext*, const v1::EncodeRequest* request,
                      v1::EncodeResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_encode_ = *request;
    }
    for (const v1::Input& input : request->inputs()) {
      v1::EncodeResult* r = response->add_results();
      *r->mutable_tokens() = FakeTokenize(input);
      const int t = r->tokens_size();
      if (request->pooling() != v1::POOLING_NONE) {
        // A unit vector: 384 equal components.
        for (int k = 0; k < 384; ++k) r->add_embedding((k % 2 ? -1.0f : 1.0f) / std::sqrt(384.0f));
      }
      for (int layer : request->hidden_layers()) {
        const int resolved = layer < 0 ? kLayers + 1 + layer : layer;
        std::vector<float> values;
        for (int i = 0; i < t * kHidden; ++i) values.push_back(0.25f * (i % 16) - 1.0f);
        v1::LayerTensor* lt = r->add_hidden_states();
        lt->set_layer(resolved);
        *lt->mutable_tensor() = EncodeTensor({t, kHidden}, values, request->output_dtype());
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status AttentionMap(grpc::ServerContext*, const v1::AttentionMapRequest* request,
                            v1::AttentionMapResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_attention_ = *request;
    }
    std::vector<int> heads(request->heads().begin(), request->heads().end());
    if (heads.empty()) {
      for (int h = 0; h < kHeads; ++h) heads.push_back(h);
    }
    for (const v1::Input& input : request->inputs()) {
      v1::AttentionResult* r = response->add_results();
      *r->mutable_tokens() = FakeTokenize(input);
      const int t = r->tokens_size();
      // Head h's row i puts 0.5 on token (i + h) % T, the rest spread evenly.
      auto weight = [t](int h, int i, int j) { return j == (i + h) % t ? 0.5f : 0.5f / (t - 1); };
      for (int layer : request->layers()) {
        v1::LayerAttention* la = r->add_layers();
        la->set_layer(layer < 0 ? kLayers + layer : layer);
        std::vector<float> w, mean(static_cast<size_t>(t) * t, 0.0f);
        for (int h : heads) {
          la->add_heads(h);
          for (int i = 0; i < t; ++i) {
            for (int j = 0; j < t; ++j) w.push_back(weight(h, i, j));
          }
        }
        for (int h = 0; h < kHeads; ++h) {
          for (int i = 0; i < t; ++i) {
            for (int j = 0; j < t; ++j) mean[i * t + j] += weight(h, i, j) / kHeads;
          }
        }
        if (!request->has_include_weights() || request->include_weights()) {
          *la->mutable_weights() =
              EncodeTensor({static_cast<int64_t>(heads.size()), t, t}, w, request->output_dtype());
        }
        if (request->mean_over_heads()) {
          *la->mutable_mean_weights() = EncodeTensor({t, t}, mean, v1::FLOAT32);
        }
      }
      if (request->rollout()) {
        std::vector<float> rollout(static_cast<size_t>(t) * t, 0.0f);
        for (int i = 0; i < t; ++i) {
          for (int j = 0; j <= i; ++j) rollout[i * t + j] = 1.0f / (i + 1);
        }
        *r->mutable_rollout() = EncodeTensor({t, t}, rollout, v1::FLOAT32);
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_tokenize_ = *request;
    }
    for (const v1::Input& input : request->inputs()) {
      *response->add_results()->mutable_tokens() = FakeTokenize(input);
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* info) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    if (!request->model_version().empty() && request->model_version() != "v1" &&
        request->model_version() != "v2") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("unknown model version '", request->model_version(), "'"));
    }
    info->set_architecture("BertModel");
    info->set_model_type("bert");
    info->set_hidden_size(384);
    info->set_num_layers(kLayers);
    info->set_num_heads(kHeads);
    info->set_head_dim(32);
    info->set_intermediate_size(1536);
    info->set_vocab_size(30522);
    info->set_type_vocab_size(2);
    info->set_max_position_embeddings(512);
    info->set_default_max_length(256);
    info->set_default_pooling("mean");
    info->set_default_normalize(true);
    info->set_parameter_count(22713216);
    info->set_precision("float32");
    info->set_version(request->model_version().empty() ? "v1" : request->model_version());
    info->set_version_origin("/models/all-MiniLM-L6-v2");
    info->add_available_versions("v1");
    info->add_available_versions("v2");
    return grpc::Status::OK;
  }

 private:
  grpc::Status Prologue() {
    std::chrono::milliseconds delay;
    grpc::Status fail;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay = delay_;
      fail = fail_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    return fail;
  }

  static void FillMetadata(const std::string& requested_version, std::string* version,
                           v1::ResponseMetadata* metadata, int inputs) {
    *version = requested_version.empty() ? "v1" : requested_version;
    metadata->set_total_ms(1.5);
    metadata->set_inference_ms(1.0);
    metadata->set_batch_inputs(inputs);
  }

  std::mutex mu_;
  grpc::Status fail_;
  std::chrono::milliseconds delay_{0};
  v1::EncodeRequest last_encode_;
  v1::AttentionMapRequest last_attention_;
  v1::TokenizeRequest last_tokenize_;
};

// One fake server for the whole binary (cheap, but tests share it: each resets what it sets).
class ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    grpc::EnableDefaultHealthCheckService(true);
    service_ = new FakeEncoder;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_);
    server_ = builder.BuildAndStart().release();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    server_->GetHealthCheckService()->SetServingStatus("attnserve.v1.Encoder", true);
  }
  static void TearDownTestSuite() {
    server_->Shutdown();
    delete server_;
    delete service_;
  }
  void TearDown() override {
    service_->FailWith(grpc::Status::OK);
    service_->SetDelay(std::chrono::milliseconds(0));
    server_->GetHealthCheckService()->SetServingStatus(true);
  }

  static std::string Target() { return absl::StrCat("127.0.0.1:", port_); }

  static FakeEncoder* service_;
  static grpc::Server* server_;
  static int port_;
};

FakeEncoder* ClientTest::service_ = nullptr;
grpc::Server* ClientTest::server_ = nullptr;
int ClientTest::port_ = 0;

v1::EncodeRequest OneText(const std::string& text) {
  v1::EncodeRequest request;
  request.add_inputs()->set_text(text);
  return request;
}

// ---------------------------------------------------------------------------------------------
// Library

TEST_F(ClientTest, EncodeRoundTrip) {
  EncoderClient client(Target());
  auto response = client.Encode(OneText("the cat sat"));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->results_size(), 1);
  EXPECT_EQ(response->results(0).tokens_size(), 5);
  EXPECT_EQ(response->results(0).embedding_size(), 384);
  EXPECT_EQ(response->model_version(), "v1");
}

TEST_F(ClientTest, ServerErrorKeepsCodeAndMessage) {
  service_->FailWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "inputs[0]: 600 tokens exceed max_length 512"));
  EncoderClient client(Target());
  auto response = client.Encode(OneText("x"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(), "inputs[0]: 600 tokens exceed max_length 512");
  EXPECT_FALSE(IsUnreachable(response.status()));
}

TEST_F(ClientTest, UnavailableFromServerIsNotUnreachable) {
  service_->FailWith(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
  EncoderClient client(Target());
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(info.status().message(), "draining");
  EXPECT_FALSE(IsUnreachable(info.status()));
}

TEST_F(ClientTest, DeadlineExceeded) {
  service_->SetDelay(std::chrono::milliseconds(500));
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(100);
  EncoderClient client(Target(), options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(IsUnreachable(info.status()));
}

TEST_F(ClientTest, ConnectionRefusedIsUnreachable) {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(5000);
  EncoderClient client("127.0.0.1:1", options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsUnreachable(info.status())) << info.status();
  auto health = client.Health();
  ASSERT_FALSE(health.ok());
  EXPECT_TRUE(IsUnreachable(health.status()));
}

TEST_F(ClientTest, WaitForReadyOnDeadServerEndsAtDeadlineAsUnreachable) {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(300);
  options.wait_for_ready = true;
  EncoderClient client("127.0.0.1:1", options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(IsUnreachable(info.status()));
}

TEST_F(ClientTest, ResponseLargerThanLimit) {
  ClientOptions options;
  options.max_receive_message_bytes = 512;
  EncoderClient client(Target(), options);
  auto response = client.Encode(OneText("a b c"));  // 384 floats > 512 bytes
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
}

// The copy of health.proto in client/proto must match grpc++'s built-in service on the wire.
TEST_F(ClientTest, HealthAgainstBuiltInHealthService) {
  EncoderClient client(Target());
  auto overall = client.Health();
  ASSERT_TRUE(overall.ok()) << overall.status();
  EXPECT_EQ(*overall, grpc::health::v1::HealthCheckResponse::SERVING);
  auto encoder = client.Health("attnserve.v1.Encoder");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_EQ(*encoder, grpc::health::v1::HealthCheckResponse::SERVING);
  auto unknown = client.Health("no.such.Service");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  server_->GetHealthCheckService()->SetServingStatus(false);
  auto down = client.Health();
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(*down, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

// ---------------------------------------------------------------------------------------------
// attnctl

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/attnctl_test_", getpid(), "_", name);
}

// Runs attnctl with `args`, `stdin_text` on stdin, ATTNSERVE_ADDR unset unless `env` ("NAME=value")
// sets it.
CliResult RunCli(const std::vector<std::string>& args, const std::string& stdin_text = "",
                 const std::string& env = "") {
  const std::string in_path = TempPath("stdin");
  const std::string err_path = TempPath("stderr");
  {
    std::ofstream in(in_path, std::ios::binary);
    in << stdin_text;
  }
  std::string command = absl::StrCat("env -u ATTNSERVE_ADDR ", env, " ", ATTNCTL_BINARY);
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  absl::StrAppend(&command, " <", in_path, " 2>", err_path);
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  std::remove(in_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

#define EXPECT_EXIT_CODE(result, code) \
  EXPECT_EQ((result).exit_code, code) << "stdout:\n" << (result).out << "stderr:\n" << (result).err

TEST(AttnctlUsage, HelpAndUsageErrors) {
  CliResult r = RunCli({});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "Commands:"));

  r = RunCli({"--help"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "Usage: attnctl <command> [flags]"));
  for (const char* cmd : {"encode", "attention", "tokenize", "info", "health"}) {
    EXPECT_TRUE(absl::StrContains(r.out, cmd)) << cmd;
  }
  r = RunCli({"help", "attention"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--rollout"));
  r = RunCli({"encode", "--help"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--pooling"));
  EXPECT_TRUE(absl::StrContains(r.out, "--server"));
  r = RunCli({"health", "-h"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "HEALTHCHECK"));

  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"--json"}, "missing command"},
      {{"encode", "--no-such-flag"}, "unknown flag --no_such_flag"},
      {{"info", "--pooling", "cls"}, "--pooling does not apply to 'info'"},
      {{"health", "--text", "x"}, "--text does not apply to 'health'"},
      {{"info", "--rollout"}, "--rollout does not apply to 'info'"},
      {{"tokenize", "--nomean", "--text", "a"}, "--mean does not apply to 'tokenize'"},
      {{"encode", "--timeout-ms", "soon"}, "invalid value 'soon' for --timeout_ms"},
      {{"encode", "--text"}, "--text needs a value"},
      {{"encode", "--text", "a", "stray"}, "unexpected argument 'stray'"},
      {{"encode", "--pooling", "median", "--text", "a"}, "--pooling must be"},
      {{"encode", "--normalize", "maybe", "--text", "a"}, "--normalize must be"},
      {{"encode", "--layers", "0,last", "--text", "a"}, "--layers takes integers"},
      {{"encode", "--dtype", "int8", "--text", "a"}, "--dtype must be"},
      {{"tokenize", "--truncation", "middle", "--text", "a"}, "--truncation must be"},
      {{"tokenize", "--max-length", "-4", "--text", "a"}, "--max-length must be >= 0"},
      {{"tokenize", "--pair", "b"}, "--pair needs --text"},
      {{"tokenize"}, "no input"},
      {{"attention", "--rollout", "--mean", "--text", "a"}, "exclude each other"},
      {{"attention", "--head", "2", "--mean", "--text", "a"}, "--head picks one head"},
      {{"attention", "--head", "-3", "--text", "a"}, "--head must be"},
  };
  for (const Case& c : cases) {
    r = RunCli(c.args);
    EXPECT_EXIT_CODE(r, 2) << absl::StrJoin(c.args, " ");
    EXPECT_TRUE(absl::StrContains(r.err, c.message))
        << absl::StrJoin(c.args, " ") << " -> " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(AttnctlUsage, UnreachableServer) {
  for (const char* cmd : {"info", "health"}) {
    CliResult r = RunCli({cmd, "--server", "localhost:1", "--timeout-ms", "5000"});
    EXPECT_EXIT_CODE(r, 1);
    EXPECT_TRUE(absl::StartsWith(r.err, "attnctl: cannot reach localhost:1 (UNAVAILABLE): "))
        << r.err;
  }
  // Without --server: $ATTNSERVE_ADDR.
  CliResult r = RunCli({"encode", "--text", "hi"}, "", "ATTNSERVE_ADDR=localhost:1");
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot reach localhost:1 (UNAVAILABLE)")) << r.err;
  r = RunCli({"--server=localhost:1", "health", "--wait-for-ready", "--timeout_ms=300"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot reach localhost:1 (DEADLINE_EXCEEDED)")) << r.err;
}

TEST_F(ClientTest, CliInfo) {
  CliResult r = RunCli({"info", "--server", Target()});
  EXPECT_EXIT_CODE(r, 0);
  // Aligned "key: value" lines in proto field order.
  EXPECT_TRUE(absl::StartsWith(r.out, "architecture:            BertModel\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\nnum_heads:               12\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\ndefault_normalize:       true\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\navailable_versions:      v1, v2\n")) << r.out;

  r = RunCli({"info", "--server", Target(), "--model-version", "v9"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: NOT_FOUND: unknown model version 'v9'\n");

  r = RunCli({"info", "--server", Target(), "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"architecture\":\"BertModel\"")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"num_layers\":6")) << r.out;
}

TEST_F(ClientTest, CliHealth) {
  CliResult r = RunCli({"health", "--server", Target()});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(r.out, "SERVING\n");
  r = RunCli({"health", "--server", Target(), "--service", "attnserve.v1.Encoder", "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(r.out, "{\"status\":\"SERVING\"}\n");
  r = RunCli({"health", "--server", Target(), "--service", "nope"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
  server_->GetHealthCheckService()->SetServingStatus(false);
  r = RunCli({"health", "--server", Target()});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.out, "NOT_SERVING\n");
}

TEST_F(ClientTest, CliEncode) {
  CliResult r = RunCli({"encode", "--server", Target(), "--text", "The cat sat", "--pooling", "cls",
                        "--normalize", "false", "--layers", "0,-1", "--dtype", "bfloat16",
                        "--max-length", "16", "--truncation", "left", "--model-version", "v2"});
  EXPECT_EXIT_CODE(r, 0);
  const v1::EncodeRequest req = service_->last_encode();
  ASSERT_EQ(req.inputs_size(), 1);
  EXPECT_EQ(req.inputs(0).text(), "The cat sat");
  EXPECT_EQ(req.pooling(), v1::POOLING_CLS);
  ASSERT_TRUE(req.has_normalize());
  EXPECT_FALSE(req.normalize());
  EXPECT_EQ(std::vector<int>(req.hidden_layers().begin(), req.hidden_layers().end()),
            (std::vector<int>{0, -1}));
  EXPECT_EQ(req.output_dtype(), v1::BFLOAT16);
  EXPECT_EQ(req.tokenization().max_length(), 16);
  EXPECT_EQ(req.tokenization().truncation(), v1::TRUNCATION_LEFT);
  EXPECT_EQ(req.model_version(), "v2");
  EXPECT_TRUE(absl::StrContains(r.out, "[0] \"The cat sat\" (5 tokens)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "embedding [384] norm 1.0000: +0.0510 -0.0510")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 0 [5 x 8] BFLOAT16, [CLS] row: -1.0000 -0.7500"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 6 [5 x 8]")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "model v2:")) << r.out;

  // Defaults: model pooling, normalize unset, float32; stdin gives one input per line.
  r = RunCli({"encode", "--server", Target(), "--dtype", "float16", "--layers", "-1"},
             "first line\n\nsecond line\r\n");
  EXPECT_EXIT_CODE(r, 0);
  const v1::EncodeRequest req2 = service_->last_encode();
  ASSERT_EQ(req2.inputs_size(), 2);
  EXPECT_EQ(req2.inputs(1).text(), "second line");
  EXPECT_EQ(req2.pooling(), v1::POOLING_MODEL_DEFAULT);
  EXPECT_FALSE(req2.has_normalize());
  EXPECT_TRUE(absl::StrContains(r.out, "[1] \"second line\" (4 tokens)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 6 [4 x 8] FLOAT16, [CLS] row: -1.0000 -0.7500"))
      << r.out;

  r = RunCli({"encode", "--server", Target(), "--json", "--text", "a", "--pair", "b"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(service_->last_encode().inputs(0).has_pair());
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"results\":[{\"tokens\":[{\"id\":101,\"text\":\"[CLS]\""))
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);

  service_->FailWith(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full (64)"));
  r = RunCli({"encode", "--server", Target(), "--text", "a"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: RESOURCE_EXHAUSTED: queue full (64)\n");
}

TEST_F(ClientTest, CliTokenize) {
  // A value that starts with '-' and contains dashes keeps its dashes (only names are rewritten).
  CliResult r =
      RunCli({"tokenize", "--server", Target(), "--text", "-a-b Hello", "--pair", "Bye now"});
  EXPECT_EXIT_CODE(r, 0);
  const v1::TokenizeRequest req = service_->last_tokenize();
  ASSERT_EQ(req.inputs_size(), 1);
  EXPECT_EQ(req.inputs(0).pair().first(), "-a-b Hello");
  EXPECT_EQ(req.inputs(0).pair().second(), "Bye now");
  const std::string expected =
      "[0] \"-a-b Hello\" + \"Bye now\" (7 tokens)\n"
      "   #  token  id    type  chars  text\n"
      "   0  [CLS]  101   0     -\n"
      "   1  -a-b   1004  0     0-4    \"-a-b\"\n"
      "   2  hello  1005  0     5-10   \"Hello\"\n"
      "   3  [SEP]  102   0     -\n"
      "   4  bye    1003  1     0-3    \"Bye\"\n"
      "   5  now    1003  1     4-7    \"now\"\n"
      "   6  [SEP]  102   1     -\n";
  EXPECT_TRUE(absl::StartsWith(r.out, expected)) << r.out;
}

TEST_F(ClientTest, CliAttentionText) {
  CliResult r = RunCli({"attention", "--server", Target(), "--text", "a b c"});
  EXPECT_EXIT_CODE(r, 0);
  v1::AttentionMapRequest req = service_->last_attention();
  EXPECT_EQ(std::vector<int>(req.layers().begin(), req.layers().end()), std::vector<int>{-1});
  EXPECT_TRUE(req.heads().empty());
  EXPECT_TRUE(req.has_include_weights());
  EXPECT_FALSE(req.include_weights());  // text without --head shows the mean only
  EXPECT_TRUE(req.mean_over_heads());
  EXPECT_TRUE(absl::StrContains(r.out, "layer 5, mean over heads, top 3 attended tokens per row"))
      << r.out;

  r = RunCli({"attention", "--server", Target(), "--text", "a b c", "--layer", "2", "--head", "1",
              "--top", "2"});
  EXPECT_EXIT_CODE(r, 0);
  req = service_->last_attention();
  EXPECT_EQ(std::vector<int>(req.heads().begin(), req.heads().end()), std::vector<int>{1});
  EXPECT_TRUE(req.include_weights());
  EXPECT_FALSE(req.mean_over_heads());
  // Head 1 puts 0.5 on the next token.
  EXPECT_TRUE(absl::StrContains(r.out, "layer 2, head 1, top 2 attended tokens per row")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "    0 [CLS] ->  a(1) 0.500  [CLS](0) 0.125\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "    4 [SEP] ->  [CLS](0) 0.500  a(1) 0.125\n")) << r.out;
}

TEST_F(ClientTest, CliAttentionPictures) {
  const std::string svg = TempPath("grid.svg");
  const std::string html = TempPath("page.html");
  CliResult r = RunCli({"attention", "--server", Target(), "--text", "the <b> & cat", "--svg", svg,
                        "--html", html, "--dtype", "bfloat16"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat("wrote ", svg))) << r.err;
  const std::string grid = ReadFile(svg);
  EXPECT_TRUE(absl::StartsWith(grid, "<svg"));
  int panels = 0;
  for (size_t p = grid.find("class=\"panel\""); p != std::string::npos;
       p = grid.find("class=\"panel\"", p + 1)) {
    ++panels;
  }
  EXPECT_EQ(panels, kHeads);
  EXPECT_TRUE(absl::StrContains(grid, "&lt;b&gt;"));
  const std::string page = ReadFile(html);
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::StrContains(page, "Input 0: &quot;the &lt;b&gt; &amp; cat&quot;")) << page;
  std::remove(svg.c_str());
  std::remove(html.c_str());

  // Rollout for two inputs from stdin: one SVG per input.
  const std::string base = TempPath("rollout.svg");
  r = RunCli({"attention", "--server", Target(), "--rollout", "--svg", base}, "one two\nthree\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(service_->last_attention().rollout());
  EXPECT_FALSE(service_->last_attention().include_weights());
  const std::string first = base.substr(0, base.size() - 4) + "-0.svg";
  const std::string second = base.substr(0, base.size() - 4) + "-1.svg";
  EXPECT_TRUE(absl::StrContains(ReadFile(first), "attention rollout through all layers"));
  EXPECT_TRUE(absl::StrContains(ReadFile(second), "three (1)"));
  std::remove(first.c_str());
  std::remove(second.c_str());

  // Unwritable path: exit 1 with the OS error.
  r = RunCli({"attention", "--server", Target(), "--text", "a", "--head", "0", "--svg",
              "/nonexistent-dir/x.svg"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot write /nonexistent-dir/x.svg")) << r.err;
}

}  // namespace
}  // namespace attn::client
