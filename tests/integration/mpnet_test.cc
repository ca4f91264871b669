// attnserve serving all-mpnet-base-v2 (--model_dir=models/all-mpnet-base-v2) through the
// single-model path: 768-dimensional embeddings equal to the Hugging Face / sentence-transformers
// ones of tests/golden/mpnet_cases.json (max abs <= 1e-5, as the engine's golden test), token
// ids and offsets of MPNet's tokenizer (<s> a </s></s> b </s>), and AttentionMap's pre-softmax
// scores including the relative position bias (<= 1e-4). The model is
// $ATTN_TEST_MPNET_MODEL_DIR or the configured one (scripts/setup.sh --model all-mpnet-base-v2);
// when it is absent the server does not start and every test fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "tests/integration/harness.h"
#include "tests/test_util.h"

namespace attn::integration {

// This binary starts its own server on MPNet (below), not the shared MiniLM one.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr double kPooledMaxAbs = 1e-5;
constexpr double kScoresMaxAbs = 1e-4;

using testing::MpnetModelDir;

nlohmann::json MpnetCases() {
  std::ifstream file(std::string(ATTN_GOLDEN_DIR) + "/mpnet_cases.json");
  return nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
}

std::vector<float> GoldenTensor(const std::string& name) {
  auto file = SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/mpnet_golden.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto tensor = (*file)->ReadFloat32(name);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return tensor.ok() ? std::vector<float>(tensor->data(), tensor->data() + tensor->numel())
                     : std::vector<float>{};
}

pb::Input InputOf(const nlohmann::json& c) {
  pb::Input input;
  if (c["text_pair"].is_null()) {
    input.set_text(c["text"].get<std::string>());
  } else {
    input.mutable_pair()->set_first(c["text"].get<std::string>());
    input.mutable_pair()->set_second(c["text_pair"].get<std::string>());
  }
  return input;
}

class MpnetServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--model_dir=" + MpnetModelDir()});
    start_error_ = new std::string();
    if (server_->StartAndWait(ScaledSeconds(120), start_error_)) start_error_->clear();
    stub_ = server_->NewStub().release();
  }
  static void TearDownTestSuite() {
    if (server_->spawned() && server_->process().Running())
      server_->process().Stop(ScaledSeconds(35));
    delete stub_;
    delete server_;
    delete start_error_;
    stub_ = nullptr;
    server_ = nullptr;
    start_error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(start_error_->empty()) << "attnserve on MPNet did not start: " << *start_error_;
  }

  static ServerProcess* server_;
  static pb::Encoder::Stub* stub_;
  static std::string* start_error_;
};
ServerProcess* MpnetServerTest::server_ = nullptr;
pb::Encoder::Stub* MpnetServerTest::stub_ = nullptr;
std::string* MpnetServerTest::start_error_ = nullptr;

TEST_F(MpnetServerTest, ReportsTheMpnetModel) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(30));
  pb::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, pb::GetModelInfoRequest(), &info);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(info.hidden_size(), 768);
  EXPECT_EQ(info.num_layers(), 12);
}

TEST_F(MpnetServerTest, EmbeddingsAndTokensEqualHuggingFace) {
  const nlohmann::json cases = MpnetCases();
  ASSERT_FALSE(cases.is_discarded()) << "tests/golden/mpnet_cases.json";
  int compared = 0;
  double worst = 0;
  for (const nlohmann::json& c : cases["cases"]) {
    if (!c["forward"].get<bool>()) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    pb::EncodeRequest request;
    *request.add_inputs() = InputOf(c);
    request.mutable_tokenization()->set_max_length(c["max_length"].get<int>());
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    const grpc::Status status = stub_->Encode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    ASSERT_EQ(response.results_size(), 1);
    const pb::EncodeResult& result = response.results(0);
    const std::vector<int32_t> ids = c["input_ids"].get<std::vector<int32_t>>();
    const std::vector<std::vector<int>> offsets = c["offsets"];
    ASSERT_EQ(result.tokens_size(), static_cast<int>(ids.size()));
    for (int t = 0; t < result.tokens_size(); ++t) {
      EXPECT_EQ(result.tokens(t).id(), ids[t]) << "token " << t;
      EXPECT_EQ(result.tokens(t).char_start(), offsets[t][0]) << "token " << t;
      EXPECT_EQ(result.tokens(t).char_end(), offsets[t][1]) << "token " << t;
    }
    const std::vector<float> pooled(result.embedding().begin(), result.embedding().end());
    ASSERT_EQ(pooled.size(), 768u);
    const double diff = MaxAbsDiff(pooled, GoldenTensor(c["name"].get<std::string>() + ".pooled"));
    EXPECT_LE(diff, kPooledMaxAbs);
    worst = std::max(worst, diff);
    ++compared;
  }
  EXPECT_GE(compared, 6);
  std::printf("[mpnet] %d inputs over gRPC: pooled max abs to HF %.3g\n", compared, worst);
}

// Layer 0's pre-softmax scores of king_queen: Q K^T / sqrt(d) + the relative position bias.
TEST_F(MpnetServerTest, AttentionScoresIncludeTheRelativePositionBias) {
  const nlohmann::json cases = MpnetCases();
  ASSERT_FALSE(cases.is_discarded());
  const nlohmann::json& c = cases["cases"][0];
  ASSERT_EQ(c["name"], "king_queen");
  const std::vector<int> rows = c["rows"];
  const int T = c["seq_len"].get<int>(), R = static_cast<int>(rows.size());
  pb::AttentionMapRequest request;
  *request.add_inputs() = InputOf(c);
  request.add_layers(0);
  request.set_include_scores(true);
  pb::AttentionMapResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
  const grpc::Status status = stub_->AttentionMap(&context, request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), 1);
  ASSERT_EQ(response.results(0).layers_size(), 1);
  const std::vector<float> scores = DecodeOrFail(response.results(0).layers(0).scores());
  ASSERT_EQ(scores.size(), static_cast<size_t>(12 * T * T));
  // The fixture's scores are [attention layers, heads, R, T] at `rows`; layer 0 comes first.
  const std::vector<float> golden = GoldenTensor("king_queen.scores");
  ASSERT_GE(golden.size(), static_cast<size_t>(12 * R * T));
  double worst = 0;
  for (int h = 0; h < 12; ++h) {
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < T; ++j) {
        worst = std::max<double>(
            worst, std::abs(scores[(h * T + rows[r]) * T + j] - golden[(h * R + r) * T + j]));
      }
    }
  }
  EXPECT_LE(worst, kScoresMaxAbs);
  std::printf("[mpnet] layer 0 pre-softmax scores (with the bias) max abs to HF %.3g\n", worst);
}

}  // namespace
}  // namespace attn::integration
