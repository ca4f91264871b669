// Classify and Rerank serve what fine-tuning trained, on the made-up product catalogue of
// product_catalog.h (invented brand and series words that no pretrained model knows):
//  * a CLASSIFICATION job with 3 named labels (which department sells a brand) makes Classify
//    label held-out items (brand/series combinations never trained on) correctly;
//  * a CONTRASTIVE job makes Rerank by cosine put each held-out query's item first among all
//    100 item names;
//  * a PAIR_CLASSIFICATION job (a cross-encoder over (query, item name)) gives a version whose
//    pair head Rerank uses by default and which puts each held-out query's item first, its
//    scores being Classify's "relevant" probability.
// Every job commits staged (no promotion), so the default version stays "base" throughout (checked
// at the end), and each call pins the version it is about.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/product_catalog.h"

namespace attn::integration {

// The server needs a token file and a model store made first, so the test starts its own.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "classify-rerank-test-token";

// Departments of the catalogue's products (ProductCatalog::kProducts, by brand): the 3 labels.
const std::vector<std::string> kDepartments = {"kitchen", "tools and electronics", "outdoor"};
int Department(int brand) {
  // kettle, drill, backpack, lamp, speaker, blender, tent, jacket, toaster, umbrella
  static constexpr int kByBrand[ProductCatalog::kBrands] = {0, 1, 2, 1, 1, 0, 2, 2, 0, 2};
  return kByBrand[brand];
}

// Asserted bounds, far above chance and below what was measured (see the test's printout).
constexpr double kClassifyAccuracyBound = 0.8;  // chance: ~0.33 (3 labels)
constexpr double kRerankTop1Bound = 0.8;        // chance: 0.01 (100 items); the goal

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

class ClassifyRerankTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-classify-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    const std::string token_file = *work_ + "/token";
    std::ofstream(token_file) << kToken << "\n";
    // One engine thread each (see learns_test.cc: a loaded 2-core machine stalls OpenMP).
    server_ = new ServerProcess({"--trainer_token_file=" + token_file,
                                 "--model_store=" + *work_ + "/store", "--trainer_threads=1",
                                 "--threads=1"});
    start_error_ = new std::string();
    if (!server_->StartAndWait(ScaledSeconds(90), start_error_)) return;
    start_error_->clear();
    encoder_ = server_->NewStub().release();
    trainer_ = pb::Trainer::NewStub(server_->NewChannel()).release();
  }

  static void TearDownTestSuite() {
    StopOwnServer(server_);
    delete encoder_;
    delete trainer_;
    delete server_;
    RemoveTestDir(*work_);
    delete work_;
    delete start_error_;
  }

  void SetUp() override {
    ASSERT_TRUE(start_error_->empty()) << "attnserve did not start: " << *start_error_;
  }

  // Runs one FineTune job over `batches` and commits it without serving it; returns the new
  // version ("" after a reported failure).
  static std::string TrainAndCommit(const pb::FineTuneConfig& config,
                                    const std::vector<std::vector<pb::TrainingExample>>& batches,
                                    const std::string& what) {
    const auto start = Clock::now();
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
    auto stream = trainer_->FineTune(&context);
    pb::FineTuneRequest config_request;
    *config_request.mutable_config() = config;
    EXPECT_TRUE(stream->Write(config_request));
    std::vector<double> losses;
    for (const auto& batch : batches) {
      pb::FineTuneRequest request;
      for (const pb::TrainingExample& example : batch) {
        *request.mutable_batch()->add_examples() = example;
      }
      pb::FineTuneProgress progress;
      if (!stream->Write(request) || !stream->Read(&progress)) break;
      losses.push_back(progress.loss());
    }
    pb::FineTuneRequest commit;
    commit.mutable_commit()->set_description("integration_classify_test: " + what);
    pb::FineTuneProgress final_progress;
    const bool committed = stream->Write(commit) && stream->Read(&final_progress);
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << what << ": " << StatusString(status);
    EXPECT_EQ(losses.size(), batches.size()) << what;
    if (!status.ok() || !committed || losses.size() != batches.size()) return "";
    std::printf("[classify] %s: %zu steps in %.1f s, loss %.3f -> %.3f, version %s\n", what.c_str(),
                losses.size(), Seconds(start), losses.front(), losses.back(),
                final_progress.committed_version().c_str());
    return final_progress.committed_version();
  }

  // Held-out top-1 of Rerank over all item names, one call per held-out query.
  // `stride` > 1 takes every stride-th held-out query only.
  static double RerankTop1(const ProductCatalog& catalog, const std::string& version,
                           pb::RerankMethod method, pb::RerankMethod* used, size_t stride = 1) {
    const auto start = Clock::now();
    int first = 0;
    std::vector<CatalogQuery> queries;
    for (size_t i = 0; i < catalog.held_out_queries().size(); i += stride) {
      queries.push_back(catalog.held_out_queries()[i]);
    }
    for (const CatalogQuery& query : queries) {
      pb::RerankRequest request;
      request.set_query(query.text);
      for (const std::string& name : catalog.ItemNames()) request.add_documents(name);
      request.set_model_version(version);
      request.set_method(method);
      request.set_top_n(3);
      pb::RerankResponse response;
      grpc::ClientContext context;
      const grpc::Status status = encoder_->Rerank(&context, request, &response);
      EXPECT_TRUE(status.ok()) << StatusString(status);
      if (!status.ok()) return 0;
      EXPECT_EQ(response.results_size(), 3);
      EXPECT_EQ(response.model_version(), version);
      for (int i = 1; i < response.results_size(); ++i) {
        EXPECT_GE(response.results(i - 1).score(), response.results(i).score());
      }
      *used = response.method();
      first += response.results(0).index() == query.item;
    }
    const double top1 = static_cast<double>(first) / queries.size();
    std::printf(
        "[classify] rerank %s (%s): held-out top-1 %.3f over %zu queries x %zu items "
        "(%.1f s)\n",
        version.c_str(), pb::RerankMethod_Name(*used).c_str(), top1, queries.size(),
        catalog.items().size(), Seconds(start));
    return top1;
  }

  static grpc::Status Classify(const pb::ClassifyRequest& request, pb::ClassifyResponse* response) {
    grpc::ClientContext context;
    return encoder_->Classify(&context, request, response);
  }

  static std::string* work_;
  static ServerProcess* server_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
  static std::string* start_error_;
};

std::string* ClassifyRerankTest::work_ = nullptr;
ServerProcess* ClassifyRerankTest::server_ = nullptr;
pb::Encoder::Stub* ClassifyRerankTest::encoder_ = nullptr;
pb::Trainer::Stub* ClassifyRerankTest::trainer_ = nullptr;
std::string* ClassifyRerankTest::start_error_ = nullptr;

TEST_F(ClassifyRerankTest, ClassifyReturnsTheTrainedLabelsOnHeldOutItems) {
  const ProductCatalog catalog;
  pb::ClassifyRequest base_request;
  base_request.add_inputs()->set_text("Vornak Zelto");
  base_request.set_model_version("base");
  pb::ClassifyResponse refused;
  grpc::Status status = Classify(base_request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("version base has no classification head"),
            std::string::npos)
      << status.error_message();

  // Training items' names (never the held-out ones), a pass of 80 per 5 steps.
  std::vector<const CatalogItem*> train;
  for (const CatalogItem& item : catalog.items()) {
    if (!item.held_out) train.push_back(&item);
  }
  std::mt19937_64 rng(3);
  std::vector<std::vector<pb::TrainingExample>> batches;
  constexpr int kSteps = 30, kBatch = 16;
  std::vector<const CatalogItem*> order;
  for (int step = 0; step < kSteps; ++step) {
    auto& batch = batches.emplace_back();
    for (int i = 0; i < kBatch; ++i) {
      if (order.empty()) {
        order = train;
        for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng() % k]);
      }
      pb::TrainingExample example;
      example.set_text(order.back()->name);
      example.set_label(Department(order.back()->brand));
      order.pop_back();
      batch.push_back(example);
    }
  }
  pb::FineTuneConfig config;
  config.set_objective(pb::CLASSIFICATION);
  config.set_num_labels(3);
  for (const std::string& name : kDepartments) config.add_label_names(name);
  config.set_learning_rate(1e-3);
  config.set_warmup_steps(2);
  config.set_total_steps(kSteps);
  config.set_disable_dropout(true);
  config.set_seed(7);
  const std::string version = TrainAndCommit(config, batches, "classification");
  ASSERT_FALSE(version.empty());

  pb::ClassifyRequest request;
  request.set_model_version(version);
  std::vector<int> expected;
  for (const CatalogItem& item : catalog.items()) {
    if (!item.held_out) continue;
    request.add_inputs()->set_text(item.name);
    expected.push_back(Department(item.brand));
  }
  pb::ClassifyResponse response;
  status = Classify(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(expected.size()));
  EXPECT_EQ(response.model_version(), version);
  int correct = 0;
  for (int i = 0; i < response.results_size(); ++i) {
    const pb::ClassifyResult& result = response.results(i);
    ASSERT_EQ(result.labels_size(), 3);
    double sum = 0;
    std::set<int> labels;
    for (int k = 0; k < 3; ++k) {
      const pb::LabelScore& label = result.labels(k);
      sum += label.probability();
      labels.insert(label.label());
      EXPECT_EQ(label.name(), kDepartments.at(label.label()));
      if (k > 0) {
        EXPECT_GE(result.labels(k - 1).probability(), label.probability());
        EXPECT_GE(result.labels(k - 1).logit(), label.logit());
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    EXPECT_EQ(labels.size(), 3u);
    correct += result.labels(0).label() == expected[i];
  }
  const double accuracy = static_cast<double>(correct) / expected.size();
  std::printf("[classify] %s: held-out accuracy %.3f (%d of %zu items)\n", version.c_str(),
              accuracy, correct, expected.size());
  EXPECT_GE(accuracy, kClassifyAccuracyBound);

  // top_k keeps the most probable labels only, the same as the full answer's first.
  request.set_top_k(1);
  pb::ClassifyResponse top1;
  ASSERT_TRUE(Classify(request, &top1).ok());
  ASSERT_EQ(top1.results_size(), response.results_size());
  for (int i = 0; i < top1.results_size(); ++i) {
    ASSERT_EQ(top1.results(i).labels_size(), 1);
    EXPECT_EQ(top1.results(i).labels(0).label(), response.results(i).labels(0).label());
  }

  // A text head refuses pairs, naming the input.
  pb::ClassifyRequest pair = request;
  pair.clear_inputs();
  pair.add_inputs()->set_text("Vornak Zelto");
  pair.add_inputs()->mutable_pair()->set_first("a");
  pair.mutable_inputs(1)->mutable_pair()->set_second("b");
  status = Classify(pair, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("inputs[1] is a text pair"), std::string::npos)
      << status.error_message();
  // Not the default: the classifier was committed staged.
  pb::GetModelInfoRequest info_request;
  pb::ModelInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(encoder_->GetModelInfo(&context, info_request, &info).ok());
  EXPECT_EQ(info.version(), "base");
}

TEST_F(ClassifyRerankTest, RerankByCosineAfterContrastiveFineTuning) {
  const ProductCatalog catalog;
  pb::RerankMethod used = pb::RERANK_METHOD_UNSPECIFIED;
  // (Every third held-out query: the premise needs no more.)
  const double base =
      RerankTop1(catalog, "base", pb::RERANK_METHOD_UNSPECIFIED, &used, /*stride=*/3);
  EXPECT_EQ(used, pb::RERANK_COSINE) << "base has no pair head: cosine by default";
  EXPECT_LE(base, 0.1) << "the premise: the base model cannot do this";

  // The job of learns_test.cc.
  constexpr int kSteps = 20;
  std::vector<std::vector<pb::TrainingExample>> batches;
  for (const auto& batch : catalog.TrainingBatches(kSteps, 16, 1, false)) {
    auto& out = batches.emplace_back();
    for (const CatalogExample& example : batch) {
      pb::TrainingExample e;
      e.set_anchor(example.anchor);
      e.set_positive(example.positive);
      out.push_back(e);
    }
  }
  pb::FineTuneConfig config;
  config.set_objective(pb::CONTRASTIVE);
  config.set_learning_rate(1e-4);
  config.set_warmup_steps(2);
  config.set_total_steps(kSteps);
  config.set_disable_dropout(true);
  config.set_seed(7);
  const std::string version = TrainAndCommit(config, batches, "contrastive");
  ASSERT_FALSE(version.empty());
  EXPECT_GE(RerankTop1(catalog, version, pb::RERANK_COSINE, &used), kRerankTop1Bound);

  // The scores are the cosines of the served embeddings (an Encode of the same texts).
  pb::RerankRequest request;
  request.set_model_version(version);
  request.set_query("a red kettle");
  request.add_documents("Vornak Zelto");
  request.add_documents("Quellix Prynn");
  request.set_return_documents(true);
  pb::RerankResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->Rerank(&context, request, &response).ok());
  }
  pb::EncodeRequest encode;
  encode.set_model_version(version);
  encode.add_inputs()->set_text(request.query());
  for (const std::string& document : request.documents()) encode.add_inputs()->set_text(document);
  pb::EncodeResponse encoded;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->Encode(&context, encode, &encoded).ok());
  }
  const std::vector<float> query(encoded.results(0).embedding().begin(),
                                 encoded.results(0).embedding().end());
  ASSERT_EQ(response.results_size(), 2);
  for (const pb::RerankResult& result : response.results()) {
    const auto& row = encoded.results(result.index() + 1).embedding();
    EXPECT_NEAR(result.score(), Cosine(query, std::vector<float>(row.begin(), row.end())), 1e-5);
    EXPECT_EQ(result.document(), request.documents(result.index()));
  }
  // Cross-encoding needs a pair head, which a contrastive version does not have.
  request.set_method(pb::RERANK_CROSS_ENCODER);
  grpc::ClientContext context;
  const grpc::Status status = encoder_->Rerank(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find(version), std::string::npos) << status.error_message();
}

TEST_F(ClassifyRerankTest, RerankByCrossEncoderAfterPairClassification) {
  const ProductCatalog catalog;
  // Each batch: 8 training queries, each with its item (label 1), an item sharing only its
  // brand, one sharing only its series and a random other item (label 0).
  std::vector<int> train_items;
  for (size_t i = 0; i < catalog.items().size(); ++i) {
    if (!catalog.items()[i].held_out) train_items.push_back(static_cast<int>(i));
  }
  std::mt19937_64 rng(5);
  auto pick = [&](auto accept) {
    std::vector<int> candidates;
    for (int item : train_items) {
      if (accept(catalog.items()[item])) candidates.push_back(item);
    }
    return candidates[rng() % candidates.size()];
  };
  std::vector<CatalogQuery> queries = catalog.train_queries();
  // 40 steps at 3e-4 measured held-out top-1 1.000 (20 steps: 0.15; 60 steps: 1.000).
  constexpr int kSteps = 40, kQueriesPerBatch = 8;
  std::vector<std::vector<pb::TrainingExample>> batches;
  size_t next = queries.size();
  for (int step = 0; step < kSteps; ++step) {
    auto& batch = batches.emplace_back();
    for (int q = 0; q < kQueriesPerBatch; ++q) {
      if (next == queries.size()) {
        for (size_t k = queries.size(); k > 1; --k) std::swap(queries[k - 1], queries[rng() % k]);
        next = 0;
      }
      const CatalogQuery& query = queries[next++];
      const CatalogItem& own = catalog.items()[query.item];
      const int same_brand = pick(
          [&](const CatalogItem& c) { return c.brand == own.brand && c.series != own.series; });
      const int same_series = pick(
          [&](const CatalogItem& c) { return c.series == own.series && c.brand != own.brand; });
      const int other = pick(
          [&](const CatalogItem& c) { return c.series != own.series && c.brand != own.brand; });
      for (const auto& [item, label] : {std::pair{query.item, 1}, std::pair{same_brand, 0},
                                        std::pair{same_series, 0}, std::pair{other, 0}}) {
        pb::TrainingExample example;
        example.set_first(query.text);
        example.set_second(catalog.items()[item].name);
        example.set_label(label);
        batch.push_back(example);
      }
    }
  }
  pb::FineTuneConfig config;
  config.set_objective(pb::PAIR_CLASSIFICATION);
  config.set_num_labels(2);
  config.add_label_names("irrelevant");
  config.add_label_names("relevant");
  config.set_learning_rate(3e-4);
  config.set_warmup_steps(3);
  config.set_total_steps(kSteps);
  config.set_disable_dropout(true);
  config.set_seed(7);
  const std::string version = TrainAndCommit(config, batches, "pair classification");
  ASSERT_FALSE(version.empty());

  // The pair head reads the segment product of the jointly encoded pair and starts at the label
  // prior (engine/ops/segment_product.h, MakePairHead): a linear head on the pooled pair instead
  // stayed at the prior (loss 0.562) and top-1 0.00-0.03 whatever the steps and rate.
  // (Every third held-out query, as the base premise above: 20 queries x 100 items.)
  pb::RerankMethod used = pb::RERANK_METHOD_UNSPECIFIED;
  EXPECT_GE(RerankTop1(catalog, version, pb::RERANK_METHOD_UNSPECIFIED, &used, /*stride=*/3),
            kRerankTop1Bound);
  EXPECT_EQ(used, pb::RERANK_CROSS_ENCODER) << "a pair head is used by default";

  // Classify on the same version reads pairs; its "relevant" probability is Rerank's score.
  pb::ClassifyRequest request;
  request.set_model_version(version);
  pb::TextPair* pair = request.add_inputs()->mutable_pair();
  pair->set_first("a red kettle");
  pair->set_second("Vornak Zelto");
  pb::ClassifyResponse classified;
  grpc::Status status = Classify(request, &classified);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  pb::RerankRequest rerank;
  rerank.set_model_version(version);
  rerank.set_query("a red kettle");
  rerank.add_documents("Vornak Zelto");
  pb::RerankResponse reranked;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->Rerank(&context, rerank, &reranked).ok());
  }
  for (const pb::LabelScore& label : classified.results(0).labels()) {
    if (label.name() == "relevant")
      EXPECT_FLOAT_EQ(label.probability(), reranked.results(0).score());
  }
  // A pair head refuses single texts.
  request.clear_inputs();
  request.add_inputs()->set_text("a red kettle");
  status = Classify(request, &classified);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("inputs[0] is a single text"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace attn::integration
