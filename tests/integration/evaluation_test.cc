// Evaluation before promotion (issue 16) on the real model over loopback gRPC, with the product
// catalogue's held-out set as shipped in examples/catalog/ (read by the client library, as
// `attnctl eval` reads it):
//  * Evaluate on base: the metrics and every query's rank equal a numpy reference computed from
//    the gRPC Encode embeddings of the same texts (tests/integration/evaluation_reference.py) to
//    1e-6; the same for a cosine-similarity set (Spearman, per-pair cosines);
//  * a contrastive job carrying the held-out set, eval_every 5 and the gate
//    "recall@1>=base+0.3": the stream reports the evaluations of steps 0, 6 and 12, the gate
//    holds and the commit promotes; the training report stores the same evaluations and the
//    decision; Evaluate on the new version agrees with numpy on its Encode embeddings;
//  * a harmful job from that version (every query paired with another query's item) under the
//    gate "recall@1>=base": the gate fails, the version is staged saying why, and unpinned
//    Encode answers stay bit-identical;
//  * `attnctl eval` prints the same numbers for two versions side by side.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "client/client.h"
#include "client/training_data.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/integration/product_catalog.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr char kToken[] = "evaluation-test-token";
constexpr int kBatchSize = 16;
constexpr uint64_t kDataSeed = 11;

std::map<std::string, double> Metrics(const pb::EvaluationResult& result) {
  std::map<std::string, double> metrics;
  for (const pb::EvaluationMetric& m : result.metrics()) metrics[m.name()] = m.value();
  return metrics;
}

class EvaluationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-evaluation-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    std::ofstream(*work_ + "/token") << kToken << "\n";
    server_ = new ServerProcess({"--trainer_token_file=" + *work_ + "/token",
                                 "--model_store=" + *work_ + "/store", "--trainer_threads=1",
                                 "--threads=1"});
    start_error_ = new std::string();
    if (!server_->StartAndWait(ScaledSeconds(90), start_error_)) return;
    start_error_->clear();
    encoder_ = server_->NewStub().release();
    trainer_ = pb::Trainer::NewStub(server_->NewChannel()).release();
    client::ClientOptions options;
    options.bearer_token = kToken;
    options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ScaledSeconds(300));
    client_ = new client::TrainerClient(server_->address(), options);
  }

  static void TearDownTestSuite() {
    StopOwnServer(server_);
    delete client_;
    delete encoder_;
    delete trainer_;
    delete server_;
    RemoveTestDir(*work_);
    delete work_;
    delete start_error_;
  }

  void SetUp() override { ASSERT_TRUE(start_error_->empty()) << *start_error_; }

  static pb::EvaluationSet HeldOut() {
    absl::StatusOr<pb::EvaluationSet> set = client::ReadEvaluationData(
        std::string(ATTN_CATALOG_EXAMPLES_DIR) + "/catalog-heldout.jsonl", client::DataLimits{});
    EXPECT_TRUE(set.ok()) << set.status();
    return set.ok() ? *set : pb::EvaluationSet();
  }

  static pb::EvaluationResult Evaluate(const pb::EvaluationSet& set, const std::string& version) {
    pb::EvaluateRequest request;
    request.set_version(version);
    *request.mutable_evaluation() = set;
    absl::StatusOr<pb::EvaluationResult> result = client_->Evaluate(request);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : pb::EvaluationResult();
  }

  // Pooled, normalised embeddings of `texts` from `version` as JSON rows (calls of 100 inputs).
  static nlohmann::json Embed(const std::vector<std::string>& texts, const std::string& version) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t first = 0; first < texts.size(); first += 100) {
      pb::EncodeRequest request;
      for (size_t i = first; i < std::min(texts.size(), first + 100); ++i) {
        request.add_inputs()->set_text(texts[i]);
      }
      request.set_model_version(version);
      pb::EncodeResponse response;
      grpc::ClientContext context;
      const grpc::Status status = encoder_->Encode(&context, request, &response);
      EXPECT_TRUE(status.ok()) << StatusString(status);
      for (const auto& result : response.results()) {
        rows.push_back(std::vector<float>(result.embedding().begin(), result.embedding().end()));
      }
    }
    return rows;
  }

  // The numpy reference's answer for `task` on `data`.
  static nlohmann::json Reference(const std::string& task, const nlohmann::json& data) {
    const std::string path = *work_ + "/reference-input.json";
    std::ofstream(path) << data.dump();
    const std::string python = ATTN_TEST_VENV_PYTHON;
    EXPECT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing (scripts/setup.sh)";
    int code = -1;
    const std::string output = RunCommand(
        "'" + python + "' '" + ATTN_EVALUATION_REFERENCE_SCRIPT + "' " + task + " '" + path + "'",
        &code);
    EXPECT_EQ(code, 0) << output;
    return code == 0 ? nlohmann::json::parse(output) : nlohmann::json::object();
  }

  // Evaluate(version) on the held-out set against numpy over the Encode embeddings of `version`.
  static void ExpectRetrievalEqualsNumpy(const pb::EvaluationSet& set, const std::string& version) {
    const pb::EvaluationResult result = Evaluate(set, version);
    const nlohmann::json reference =
        Reference("retrieval",
                  {{"queries", Embed({set.queries().begin(), set.queries().end()}, version)},
                   {"corpus", Embed({set.corpus().begin(), set.corpus().end()}, version)},
                   {"relevant", std::vector<int>(set.relevant().begin(), set.relevant().end())}});
    ASSERT_EQ(result.metrics_size(), 4);
    for (const auto& [name, value] : Metrics(result)) {
      EXPECT_NEAR(value, reference["metrics"][name].get<double>(), 1e-6) << version << " " << name;
    }
    ASSERT_EQ(result.per_example_size(), set.queries_size());
    for (int i = 0; i < set.queries_size(); ++i) {
      EXPECT_EQ(result.per_example(i), reference["per_example"][i].get<double>())
          << version << " query " << i;
    }
    std::printf("[evaluation] %s on %d held-out queries: %s\n", version.c_str(), set.queries_size(),
                reference["metrics"].dump().c_str());
  }

  // A FineTune job: config, one step per batch, then a commit asking for promotion; every
  // progress message.
  static std::vector<pb::FineTuneProgress> Train(const pb::FineTuneConfig& config,
                                                 const std::vector<pb::TrainingBatch>& batches,
                                                 grpc::Status* status) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(600));
    auto stream = trainer_->FineTune(&context);
    pb::FineTuneRequest request;
    *request.mutable_config() = config;
    std::vector<pb::FineTuneProgress> answers;
    pb::FineTuneProgress progress;
    bool ok = stream->Write(request);
    for (const pb::TrainingBatch& batch : batches) {
      *request.mutable_batch() = batch;
      if (!(ok = ok && stream->Write(request) && stream->Read(&progress))) break;
      answers.push_back(progress);
    }
    request.mutable_commit()->set_promote(true);
    if (ok && stream->Write(request) && stream->Read(&progress)) answers.push_back(progress);
    stream->WritesDone();
    *status = stream->Finish();
    return answers;
  }

  static std::vector<pb::TrainingBatch> Batches(
      const std::vector<std::vector<CatalogExample>>& batches) {
    std::vector<pb::TrainingBatch> out;
    for (const std::vector<CatalogExample>& batch : batches) {
      pb::TrainingBatch& b = out.emplace_back();
      for (const CatalogExample& e : batch) {
        pb::TrainingExample* example = b.add_examples();
        example->set_anchor(e.anchor);
        example->set_positive(e.positive);
      }
    }
    return out;
  }

  static std::string* work_;
  static ServerProcess* server_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
  static client::TrainerClient* client_;
  static std::string* start_error_;
};

std::string* EvaluationTest::work_ = nullptr;
ServerProcess* EvaluationTest::server_ = nullptr;
pb::Encoder::Stub* EvaluationTest::encoder_ = nullptr;
pb::Trainer::Stub* EvaluationTest::trainer_ = nullptr;
client::TrainerClient* EvaluationTest::client_ = nullptr;
std::string* EvaluationTest::start_error_ = nullptr;

TEST_F(EvaluationTest, BaseMetricsEqualNumpyOverEncodeEmbeddings) {
  const pb::EvaluationSet held_out = HeldOut();
  ASSERT_EQ(held_out.queries_size(), 60);
  ASSERT_EQ(held_out.corpus_size(), 100);
  ExpectRetrievalEqualsNumpy(held_out, "base");

  // Cosine similarity: each held-out query with its own item (gold 1) and with an item of
  // another brand and series (gold 0).
  const ProductCatalog catalog;
  pb::EvaluationSet cosine;
  cosine.set_task(pb::EVALUATION_COSINE_SIMILARITY);
  std::vector<std::string> first, second;
  std::vector<double> scores;
  for (size_t q = 0; q < catalog.held_out_queries().size(); q += 3) {
    const CatalogQuery& query = catalog.held_out_queries()[q];
    const CatalogItem& own = catalog.items()[query.item];
    for (const CatalogItem& other : {own, catalog.items()[(query.item + 33) % 100]}) {
      pb::TrainingExample* e = cosine.add_examples();
      e->set_first(query.text);
      e->set_second(other.name);
      e->set_score(other.name == own.name ? 1.0f : 0.0f);
      first.push_back(e->first());
      second.push_back(e->second());
      scores.push_back(e->score());
    }
  }
  const pb::EvaluationResult result = Evaluate(cosine, "base");
  const nlohmann::json reference = Reference(
      "cosine",
      {{"first", Embed(first, "base")}, {"second", Embed(second, "base")}, {"scores", scores}});
  ASSERT_EQ(result.metrics_size(), 1);
  EXPECT_EQ(result.metrics(0).name(), "spearman");
  EXPECT_NEAR(result.metrics(0).value(), reference["metrics"]["spearman"].get<double>(), 1e-6);
  ASSERT_EQ(result.per_example_size(), static_cast<int>(first.size()));
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(result.per_example(i), reference["per_example"][i].get<double>(), 1e-6) << i;
  }

  // A classification set needs a head: base has none.
  pb::EvaluateRequest request;
  request.mutable_evaluation()->set_task(pb::EVALUATION_CLASSIFICATION);
  request.mutable_evaluation()->add_examples()->set_text("a kettle");
  const absl::StatusOr<pb::EvaluationResult> refused = client_->Evaluate(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("no classification head"), std::string::npos);
}

TEST_F(EvaluationTest, TheGatePromotesAGoodJobAndStagesAHarmfulOne) {
  const ProductCatalog catalog;
  const pb::EvaluationSet held_out = HeldOut();

  // A good job: the learns test's task, 12 steps, evaluated every 6.
  pb::FineTuneConfig config;
  config.set_objective(pb::CONTRASTIVE);
  config.set_learning_rate(1e-4);
  config.set_warmup_steps(2);
  config.set_total_steps(12);
  config.set_disable_dropout(true);
  config.set_seed(7);
  *config.mutable_evaluation() = held_out;
  config.set_eval_every(6);
  config.set_promote_if("recall@1>=base+0.3");
  grpc::Status status;
  const std::vector<pb::FineTuneProgress> progress =
      Train(config, Batches(catalog.TrainingBatches(12, kBatchSize, kDataSeed, false)), &status);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(progress.size(), 13u);
  std::vector<pb::EvaluationResult> streamed;
  for (const pb::FineTuneProgress& p : progress) {
    for (const pb::EvaluationResult& e : p.evaluations()) streamed.push_back(e);
  }
  ASSERT_EQ(streamed.size(), 3u);  // the last step was evaluated: none more at the commit
  for (size_t i = 0; i < streamed.size(); ++i) {
    EXPECT_EQ(streamed[i].step(), static_cast<int64_t>(6 * i));
    EXPECT_EQ(streamed[i].task(), pb::EVALUATION_RETRIEVAL);
    EXPECT_EQ(streamed[i].examples(), 60);
    std::printf("[evaluation] job after step %d (%.1f s): %s\n",
                static_cast<int>(streamed[i].step()), streamed[i].seconds(),
                nlohmann::json(Metrics(streamed[i])).dump().c_str());
  }
  EXPECT_EQ(progress[0].evaluations_size(), 1);  // the base's, with the first step
  const double base_recall = Metrics(streamed.front())["recall@1"];
  const double final_recall = Metrics(streamed.back())["recall@1"];
  EXPECT_GE(final_recall, base_recall + 0.3);
  const pb::FineTuneProgress& committed = progress.back();
  const std::string good = committed.committed_version();
  ASSERT_FALSE(good.empty());
  EXPECT_TRUE(committed.promoted()) << committed.promotion();
  EXPECT_NE(committed.promotion().find("promoted: the gate recall@1>=base+0.3 held"),
            std::string::npos)
      << committed.promotion();

  // Stored with the version.
  absl::StatusOr<pb::TrainingReport> report = client_->GetTrainingReport(good);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->evaluations_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Metrics(report->evaluations(i)), Metrics(streamed[i])) << i;
  }
  EXPECT_EQ(report->promotion(), committed.promotion());

  // The served version's scores: numpy over its Encode embeddings, and close to what the job
  // measured on the same weights before they were packed for serving.
  ExpectRetrievalEqualsNumpy(held_out, good);
  const pb::EvaluationResult served = Evaluate(held_out, good);
  EXPECT_EQ(served.model_version(), good);
  for (const auto& [name, value] : Metrics(served)) {
    EXPECT_NEAR(value, Metrics(streamed.back())[name], 0.02) << name;
  }

  // A harmful job from the good version: every query taught another query's item.
  std::vector<std::vector<CatalogExample>> shuffled =
      catalog.TrainingBatches(4, kBatchSize, kDataSeed + 1, false);
  for (std::vector<CatalogExample>& batch : shuffled) {
    std::vector<std::string> positives;
    for (const CatalogExample& e : batch) positives.push_back(e.positive);
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].positive = positives[(i + 1) % positives.size()];
    }
  }
  pb::EncodeRequest probe;
  probe.add_inputs()->set_text("looking for the red kettle");
  auto encode_unpinned = [&]() {
    pb::EncodeResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(encoder_->Encode(&context, probe, &response).ok());
    return response.results(0).embedding();
  };
  const auto before = encode_unpinned();
  config.set_base_version(good);
  config.set_total_steps(4);
  config.set_learning_rate(2e-4);
  config.set_eval_every(0);
  config.set_promote_if("recall@1>=base");
  const std::vector<pb::FineTuneProgress> harmful = Train(config, Batches(shuffled), &status);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_FALSE(harmful.empty());
  const pb::FineTuneProgress& staged = harmful.back();
  ASSERT_FALSE(staged.committed_version().empty());
  EXPECT_FALSE(staged.promoted());
  EXPECT_NE(staged.promotion().find("staged: the gate recall@1>=base failed"), std::string::npos)
      << staged.promotion();
  std::printf("[evaluation] harmful job: %s\n", staged.promotion().c_str());
  const auto after = encode_unpinned();
  ASSERT_EQ(after.size(), before.size());
  for (int i = 0; i < before.size(); ++i) ASSERT_EQ(after[i], before[i]) << i;
  absl::StatusOr<pb::ListVersionsResponse> versions = client_->ListVersions();
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->serving_version(), good);

  // attnctl eval: the same numbers, one column per version.
  int code = -1;
  const std::string output = RunCommand(
      std::string("ATTNSERVE_TOKEN=") + kToken + " '" + ATTNCTL_BINARY + "' eval --server " +
          server_->address() + " --data '" + ATTN_CATALOG_EXAMPLES_DIR +
          "/catalog-heldout.jsonl' --version base --version " + good + " --json 2>&1",
      &code);
  ASSERT_EQ(code, 0) << output;
  std::istringstream lines(output);
  std::vector<nlohmann::json> printed;  // one JSON object per line, one per version
  for (std::string line; std::getline(lines, line);) printed.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(printed.size(), 2u) << output;
  EXPECT_EQ(printed[0]["model_version"], "base");
  EXPECT_EQ(printed[1]["model_version"], good);
  for (const nlohmann::json& metric : printed[1]["metrics"]) {
    EXPECT_NEAR(metric["value"].get<double>(), Metrics(served)[metric["name"]], 1e-9);
  }
}

}  // namespace
}  // namespace attn::integration
