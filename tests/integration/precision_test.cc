// An attnserve started with --precision=int8, over gRPC: it says so (GetModelInfo, metrics) and
// its pooled embeddings of the golden cases stay within the engine's stated int8 bound of the
// fp32 reference (Hugging Face's, from the golden fixtures): cosine >= 0.995 for every case and
// >= 0.997 on average (engine/model.h, tests/unit/int8_encoder_test.cc). Its own server, next to
// the binary's shared fp32 one.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "tests/integration/harness.h"

namespace attn::integration {
namespace {

constexpr double kInt8MinCosine = 0.995;
constexpr double kInt8MeanCosine = 0.997;

class Int8ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--precision=int8"});
    start_error_ = new std::string();
    // Checked in SetUp: a failed assertion here would only mark the tests skipped.
    if (server_->StartAndWait(ScaledSeconds(90), start_error_)) start_error_->clear();
    stub_ = server_->NewStub().release();
  }
  static void TearDownTestSuite() {
    if (server_->spawned() && server_->process().Running()) {
      const int status = server_->process().Stop(ScaledSeconds(35));
      EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "int8 attnserve after SIGTERM: " << server_->process().ExitDescription();
    }
    delete stub_;
    delete server_;
    delete start_error_;
    stub_ = nullptr;
    server_ = nullptr;
    start_error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(start_error_->empty())
        << "attnserve --precision=int8 did not start: " << *start_error_;
  }

  static ServerProcess* server_;
  static pb::Encoder::Stub* stub_;
  static std::string* start_error_;
};
ServerProcess* Int8ServerTest::server_ = nullptr;
pb::Encoder::Stub* Int8ServerTest::stub_ = nullptr;
std::string* Int8ServerTest::start_error_ = nullptr;

TEST_F(Int8ServerTest, ReportsItsPrecision) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(30));
  pb::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, pb::GetModelInfoRequest(), &info);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(info.precision(), "int8");
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_EQ(metrics.Sum("attnserve_model_info", {{"precision", "int8"}}), 1);
}

TEST_F(Int8ServerTest, PooledEmbeddingsStayWithinTheInt8BoundOfFp32) {
  double min_cosine = 1, sum = 0, max_abs = 0;
  std::string worst;
  int compared = 0;
  for (const GoldenCase& c : GoldenCases()) {
    SCOPED_TRACE(c.name);
    pb::EncodeRequest request;
    *request.add_inputs() = GoldenInput(c);
    *request.mutable_tokenization() = GoldenTokenization(c);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    const grpc::Status status = stub_->Encode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    ASSERT_EQ(response.results_size(), 1);
    ExpectTokensMatchGolden(c, response.results(0).tokens());
    const std::vector<float> pooled(response.results(0).embedding().begin(),
                                    response.results(0).embedding().end());
    ASSERT_EQ(pooled.size(), static_cast<size_t>(kHidden));
    const double cosine = Cosine(pooled, c.pooled);
    EXPECT_GE(cosine, kInt8MinCosine);
    if (cosine < min_cosine) {
      min_cosine = cosine;
      worst = c.name;
    }
    sum += cosine;
    max_abs = std::max(max_abs, MaxAbsDiff(pooled, c.pooled));
    ++compared;
  }
  ASSERT_GT(compared, 0);
  const double mean = sum / compared;
  EXPECT_GE(mean, kInt8MeanCosine);
  // Not fp32 in disguise: int8 moves the embeddings measurably (fp32 parity is ~1e-6).
  EXPECT_GT(max_abs, 1e-4) << "the int8 server's embeddings equal fp32's";
  std::printf("[int8] %d golden cases: cosine to fp32 min %.5f (%s), mean %.5f; max abs %.3g\n",
              compared, min_cosine, worst.c_str(), mean, max_abs);
}

}  // namespace
}  // namespace attn::integration
