// One attnserve serving two models side by side (--model minilm=all-MiniLM-L6-v2 --model
// mpnet=all-mpnet-base-v2): each answers with its own dimension (384 / 768) and its own
// versions, the first is the default, ListModels lists both, a fine-tune commit on one leaves
// the other's embeddings bit-identical, pinned versions are per model, an unknown model is
// refused NOT_FOUND naming the served ones (gRPC and HTTP), and the metrics carry the model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/test_util.h"

namespace attn::integration {

// This binary starts its own two-model server (below).
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr char kToken[] = "multi-model-token";

using testing::MpnetModelDir;

const std::vector<std::string>& ProbeTexts() {
  static const std::vector<std::string> texts = {"the cat sits on the mat",
                                                 "quarterly revenue grew by ten percent"};
  return texts;
}

class MultiModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-multi-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    {
      std::ofstream token(*work_ + "/token");
      token << kToken << "\n";
    }
    server_ =
        new ServerProcess({"--model=minilm=" + TestModelDir(), "--model",
                           "mpnet=" + MpnetModelDir(), "--trainer_token_file=" + *work_ + "/token",
                           "--model_store=" + *work_ + "/store", "--trainer_threads=1"});
    start_error_ = new std::string();
    if (server_->StartAndWait(ScaledSeconds(180), start_error_)) start_error_->clear();
    encoder_ = server_->NewStub().release();
    trainer_ = pb::Trainer::NewStub(server_->NewChannel()).release();
  }
  static void TearDownTestSuite() {
    if (server_->spawned() && server_->process().Running()) {
      const int status = server_->process().Stop(ScaledSeconds(35));
      EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << server_->process().ExitDescription();
    }
    delete encoder_;
    delete trainer_;
    delete server_;
    delete start_error_;
    if (std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ignored;
      std::filesystem::remove_all(*work_, ignored);
    }
    delete work_;
  }
  void SetUp() override {
    ASSERT_TRUE(start_error_->empty()) << "the two-model server did not start (is MPNet "
                                          "installed? scripts/setup.sh --model "
                                          "all-mpnet-base-v2): "
                                       << *start_error_;
  }

  // The probe texts' embeddings from `model` at `version`; the status and served version too.
  static grpc::Status Embed(const std::string& model, const std::string& version,
                            std::vector<std::vector<float>>* out, std::string* served = nullptr) {
    pb::EncodeRequest request;
    for (const std::string& text : ProbeTexts()) request.add_inputs()->set_text(text);
    request.set_model(model);
    request.set_model_version(version);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = encoder_->Encode(&context, request, &response);
    out->clear();
    for (const auto& result : response.results()) {
      out->emplace_back(result.embedding().begin(), result.embedding().end());
    }
    if (served != nullptr) *served = response.model_version();
    return status;
  }

  static pb::ListVersionsResponse Versions(const std::string& model) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::ListVersionsRequest request;
    request.set_model(model);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->ListVersions(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response;
  }

  // A one-step contrastive fine-tune of `model`, committed and promoted; the new version.
  static std::string TrainAndCommit(const std::string& model) {
    return CommitOneContrastiveStep(trainer_,
                                    {kToken, model, 5e-5, /*promote=*/true, "multi-model test"});
  }

  static std::string* work_;
  static ServerProcess* server_;
  static std::string* start_error_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
};

std::string* MultiModelTest::work_ = nullptr;
ServerProcess* MultiModelTest::server_ = nullptr;
std::string* MultiModelTest::start_error_ = nullptr;
pb::Encoder::Stub* MultiModelTest::encoder_ = nullptr;
pb::Trainer::Stub* MultiModelTest::trainer_ = nullptr;

TEST_F(MultiModelTest, EachModelAnswersWithItsOwnDimensionAndTheFirstIsTheDefault) {
  std::vector<std::vector<float>> minilm, mpnet, unnamed;
  ASSERT_TRUE(Embed("minilm", "", &minilm).ok());
  ASSERT_TRUE(Embed("mpnet", "", &mpnet).ok());
  ASSERT_TRUE(Embed("", "", &unnamed).ok());
  ASSERT_EQ(minilm.size(), 2u);
  ASSERT_EQ(mpnet.size(), 2u);
  EXPECT_EQ(minilm[0].size(), 384u);
  EXPECT_EQ(mpnet[0].size(), 768u);
  EXPECT_EQ(unnamed, minilm);  // the first --model is the default

  pb::ListModelsResponse models;
  grpc::ClientContext context;
  ASSERT_TRUE(encoder_->ListModels(&context, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 2);
  EXPECT_EQ(models.models(0).name(), "minilm");
  EXPECT_TRUE(models.models(0).is_default());
  EXPECT_EQ(models.models(0).hidden_size(), 384);
  EXPECT_EQ(models.models(0).model_type(), "bert");
  EXPECT_EQ(models.models(1).name(), "mpnet");
  EXPECT_FALSE(models.models(1).is_default());
  EXPECT_EQ(models.models(1).hidden_size(), 768);
  EXPECT_EQ(models.models(1).model_type(), "mpnet");
  EXPECT_EQ(models.models(1).architecture(), "MPNetModel");

  pb::GetModelInfoRequest info_request;
  info_request.set_model("mpnet");
  pb::ModelInfo info;
  grpc::ClientContext info_context;
  ASSERT_TRUE(encoder_->GetModelInfo(&info_context, info_request, &info).ok());
  EXPECT_EQ(info.name(), "mpnet");
  EXPECT_EQ(info.num_layers(), 12);
}

// Rerank and Classify name their model like every call: the cosine is MPNet's when asked for,
// and an unknown model is refused before anything else.
TEST_F(MultiModelTest, RerankAndClassifyUseTheNamedModel) {
  pb::RerankRequest rerank;
  rerank.set_model("mpnet");
  rerank.set_query("a kettle for tea");
  rerank.add_documents("An electric kettle boils water.");
  rerank.add_documents("The history of Rome.");
  pb::RerankResponse reranked;
  {
    grpc::ClientContext context;
    const grpc::Status status = encoder_->Rerank(&context, rerank, &reranked);
    ASSERT_TRUE(status.ok()) << StatusString(status);
  }
  EXPECT_EQ(reranked.method(), pb::RERANK_COSINE);
  ASSERT_EQ(reranked.results_size(), 2);
  EXPECT_EQ(reranked.results(0).index(), 0);
  // The score is the cosine of MPNet's embeddings (768 values), not MiniLM's.
  std::vector<std::vector<float>> mpnet;
  pb::EncodeRequest encode;
  encode.set_model("mpnet");
  encode.add_inputs()->set_text(rerank.query());
  encode.add_inputs()->set_text(rerank.documents(0));
  pb::EncodeResponse encoded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->Encode(&context, encode, &encoded).ok());
  }
  const auto& q = encoded.results(0).embedding();
  const auto& d = encoded.results(1).embedding();
  EXPECT_EQ(q.size(), 768);
  EXPECT_NEAR(reranked.results(0).score(), Cosine({q.begin(), q.end()}, {d.begin(), d.end()}),
              1e-5);

  rerank.set_model("nope");
  grpc::ClientContext unknown_context;
  EXPECT_EQ(encoder_->Rerank(&unknown_context, rerank, &reranked).error_code(),
            grpc::StatusCode::NOT_FOUND);
  pb::ClassifyRequest classify;
  classify.set_model("mpnet");
  classify.add_inputs()->set_text("hello");
  pb::ClassifyResponse classified;
  grpc::ClientContext classify_context;
  const grpc::Status status = encoder_->Classify(&classify_context, classify, &classified);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("version base has no classification head"),
            std::string::npos)
      << status.error_message();
}

TEST_F(MultiModelTest, UnknownModelIsNotFoundNamingTheServedOnes) {
  std::vector<std::vector<float>> out;
  grpc::Status status = Embed("bert-large", "", &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(),
            "model 'bert-large' is not served here; served models: minilm, mpnet (the first is "
            "the default)");
  // A 10,000-character name: refused, quoted short.
  status = Embed(std::string(10000, 'm'), "", &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(status.error_message().size(), 300u) << status.error_message();
  EXPECT_NE(status.error_message().find("minilm, mpnet"), std::string::npos);
  // Tokenize, GetModelInfo and the Trainer refuse it the same way.
  pb::TokenizeRequest tokenize;
  tokenize.add_inputs()->set_text("hello");
  tokenize.set_model("nope");
  pb::TokenizeResponse tokens;
  grpc::ClientContext context;
  EXPECT_EQ(encoder_->Tokenize(&context, tokenize, &tokens).error_code(),
            grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext trainer_context;
  trainer_context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  pb::ListVersionsRequest versions;
  versions.set_model("nope");
  pb::ListVersionsResponse listed;
  EXPECT_EQ(trainer_->ListVersions(&trainer_context, versions, &listed).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // HTTP: the OpenAI `model` field picks the model; an unknown one is 404 model_not_found.
  HttpResponse response;
  std::string error;
  ASSERT_TRUE(HttpRequest(server_->http_port(), "POST", "/v1/embeddings",
                          {"content-type: application/json"},
                          R"({"input": "hello", "model": "mpnet"})", &response, &error))
      << error;
  ASSERT_EQ(response.status, 200) << response.body;
  const nlohmann::json body = nlohmann::json::parse(response.body);
  EXPECT_EQ(body["data"][0]["embedding"].size(), 768u);
  EXPECT_EQ(body["model"], "mpnet");
  ASSERT_TRUE(HttpRequest(server_->http_port(), "POST", "/v1/embeddings",
                          {"content-type: application/json"},
                          R"({"input": "hello", "model": "nope"})", &response, &error))
      << error;
  EXPECT_EQ(response.status, 404) << response.body;
  EXPECT_NE(response.body.find("model_not_found"), std::string::npos) << response.body;
  // The server keeps serving.
  EXPECT_TRUE(Embed("mpnet", "", &out).ok());
}

TEST_F(MultiModelTest, FineTuneCommitOnOneModelLeavesTheOtherBitIdentical) {
  std::vector<std::vector<float>> mpnet_before, minilm_before;
  ASSERT_TRUE(Embed("mpnet", "", &mpnet_before).ok());
  ASSERT_TRUE(Embed("minilm", "", &minilm_before).ok());
  const int mpnet_versions = Versions("mpnet").versions_size();

  const std::string committed = TrainAndCommit("minilm");
  ASSERT_FALSE(committed.empty());

  // minilm serves the new version; its base stays pinnable and unchanged.
  std::vector<std::vector<float>> minilm_after, minilm_base;
  std::string served;
  ASSERT_TRUE(Embed("minilm", "", &minilm_after, &served).ok());
  EXPECT_EQ(served, committed);
  EXPECT_NE(minilm_after, minilm_before);
  ASSERT_TRUE(Embed("minilm", "base", &minilm_base).ok());
  EXPECT_EQ(minilm_base, minilm_before);
  EXPECT_EQ(Versions("minilm").serving_version(), committed);

  // mpnet: same versions, same served one, bit-identical embeddings.
  std::vector<std::vector<float>> mpnet_after;
  ASSERT_TRUE(Embed("mpnet", "", &mpnet_after, &served).ok());
  EXPECT_EQ(served, "base");
  EXPECT_EQ(mpnet_after, mpnet_before);
  const pb::ListVersionsResponse mpnet = Versions("mpnet");
  EXPECT_EQ(mpnet.versions_size(), mpnet_versions);
  EXPECT_EQ(mpnet.serving_version(), "base");
  // Versions are per model: minilm's new version is not one of mpnet's.
  std::vector<std::vector<float>> ignored;
  EXPECT_EQ(Embed("mpnet", committed, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  // The store keeps each model's versions in its own directory.
  EXPECT_TRUE(std::filesystem::is_directory(*work_ + "/store/minilm/" + committed));
  EXPECT_FALSE(std::filesystem::exists(*work_ + "/store/mpnet/" + committed));
}

// CompareVersions across two models' stores is refused, naming both models and what differs;
// the same request within one model is answered (issue 20).
TEST_F(MultiModelTest, CompareVersionsRefusesVersionsOfDifferentModels) {
  auto compare = [](const std::string& model_b, pb::CompareVersionsResponse* response) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::CompareVersionsRequest request;
    request.set_model("minilm");
    request.set_model_b(model_b);
    request.set_version_a("base");
    request.set_version_b("base");
    return trainer_->CompareVersions(&context, request, response);
  };
  pb::CompareVersionsResponse response;
  const grpc::Status refused = compare("mpnet", &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(refused);
  EXPECT_NE(refused.error_message().find("model minilm version base vs model mpnet version base"),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("different models"), std::string::npos)
      << refused.error_message();
  const grpc::Status same = compare("minilm", &response);
  ASSERT_TRUE(same.ok()) << StatusString(same);
  EXPECT_TRUE(response.can_mix());
  EXPECT_EQ(response.model(), "minilm");
}

TEST_F(MultiModelTest, MetricsCarryTheModel) {
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(Embed("mpnet", "", &out).ok());
  ASSERT_TRUE(Embed("minilm", "", &out).ok());
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_GT(metrics.Sum("attnserve_tokens_total", {{"model", "mpnet"}}), 0);
  EXPECT_GT(metrics.Sum("attnserve_tokens_total", {{"model", "minilm"}}), 0);
  EXPECT_EQ(metrics.Sum("attnserve_model_info", {{"model", "mpnet"}, {"hidden_size", "768"}}), 1);
  EXPECT_EQ(metrics.Sum("attnserve_model_info", {{"model", "minilm"}, {"hidden_size", "384"}}), 1);
}

}  // namespace
}  // namespace attn::integration
