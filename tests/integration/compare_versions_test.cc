// CompareVersions and Neighbors (Trainer service) on the real model over loopback gRPC:
//  * base vs base: every weight change exactly 0, every probe's cosine 1, "can be mixed";
//  * base vs a version fine-tuned on the product catalogue (the learns test's task, fewer
//    steps): the per-matrix changes equal a numpy reference over the two safetensors files
//    (tests/integration/compare_versions_reference.py) to 1e-6 relative, and the verdict is
//    "re-index";
//  * static neighbours of "king" equal the numpy reference's top-10 ids over the safetensors
//    word-embedding table; "bank" by a river is closer to another river bank than to a bank
//    that lends, in context.
// (Versions of different models are refused in integration_multi_model_test, which serves two.)

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/product_catalog.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr char kToken[] = "compare-test-token";
// Enough of the learns test's job to teach the model the catalogue (its top-1 rises well above
// chance after ~10 steps), which moves the embeddings far beyond the mixing thresholds.
constexpr int kSteps = 10;
constexpr int kBatchSize = 16;

std::string Reference(const std::string& args) {
  const std::string python = ATTN_TEST_VENV_PYTHON;
  EXPECT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing (scripts/setup.sh)";
  int code = -1;
  const std::string output =
      RunCommand("'" + python + "' '" + ATTN_COMPARE_REFERENCE_SCRIPT + "' " + args, &code);
  EXPECT_EQ(code, 0) << output;
  return output;
}

// The reference's relative change per (layer, matrix, part).
using ReferenceChanges = std::map<std::tuple<int, std::string, std::string>, double>;
ReferenceChanges ParseReference(const std::string& output) {
  ReferenceChanges changes;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    changes[{row.at("layer").get<int>(), row.at("matrix").get<std::string>(),
             row.at("part").get<std::string>()}] = row.at("relative").get<double>();
  }
  return changes;
}

class CompareVersionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-compare-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    std::ofstream(*work_ + "/token") << kToken << "\n";
    server_ = new ServerProcess({"--trainer_token_file=" + *work_ + "/token",
                                 "--model_store=" + *work_ + "/store", "--trainer_threads=1"});
    start_error_ = new std::string();
    if (!server_->StartAndWait(ScaledSeconds(90), start_error_)) return;
    start_error_->clear();
    trainer_ = pb::Trainer::NewStub(server_->NewChannel()).release();
  }

  static void TearDownTestSuite() {
    StopOwnServer(server_);
    delete trainer_;
    delete server_;
    RemoveTestDir(*work_);
    delete work_;
    delete start_error_;
  }

  void SetUp() override { ASSERT_TRUE(start_error_->empty()) << *start_error_; }

  static grpc::Status Compare(const pb::CompareVersionsRequest& request,
                              pb::CompareVersionsResponse* response) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
    return trainer_->CompareVersions(&context, request, response);
  }

  static grpc::Status Neighbors(const pb::NeighborsRequest& request,
                                pb::NeighborsResponse* response) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
    return trainer_->Neighbors(&context, request, response);
  }

  // A FineTune job: `config`, one step per batch, then a commit that leaves the default alone;
  // the committed version ("" and a test failure when the job fails).
  static std::string TrainAndCommit(const pb::FineTuneConfig& config,
                                    const std::vector<pb::TrainingBatch>& batches) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(400));
    auto stream = trainer_->FineTune(&context);
    pb::FineTuneRequest request;
    *request.mutable_config() = config;
    EXPECT_TRUE(stream->Write(request));
    pb::FineTuneProgress progress;
    for (const pb::TrainingBatch& batch : batches) {
      *request.mutable_batch() = batch;
      if (!stream->Write(request) || !stream->Read(&progress)) break;
    }
    request.mutable_commit()->set_do_not_serve(true);
    const bool committed = stream->Write(request) && stream->Read(&progress);
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << StatusString(status);
    EXPECT_TRUE(committed);
    return progress.committed_version();
  }

  // The catalogue version, trained once for the suite.
  static std::string CatalogueVersion() {
    if (!catalogue_version_.empty()) return catalogue_version_;
    pb::FineTuneConfig config;
    config.set_objective(pb::CONTRASTIVE);
    config.set_learning_rate(1e-4);
    config.set_warmup_steps(2);
    config.set_total_steps(kSteps);
    config.set_disable_dropout(true);
    config.set_seed(7);
    std::vector<pb::TrainingBatch> batches;
    for (const auto& batch : ProductCatalog().TrainingBatches(kSteps, kBatchSize, 1, false)) {
      pb::TrainingBatch& out = batches.emplace_back();
      for (const CatalogExample& example : batch) {
        pb::TrainingExample* pair = out.add_examples();
        pair->set_anchor(example.anchor);
        pair->set_positive(example.positive);
      }
    }
    catalogue_version_ = TrainAndCommit(config, batches);
    return catalogue_version_;
  }

  // One CLASSIFICATION step (2 labels, seed `seed`) from base, committed without serving it.
  static std::string ClassifierVersion(uint64_t seed) {
    pb::FineTuneConfig config;
    config.set_objective(pb::CLASSIFICATION);
    config.set_num_labels(2);
    config.set_base_version("base");
    config.set_seed(seed);
    config.set_learning_rate(1e-4);
    pb::TrainingBatch batch;
    for (const auto& [text, label] :
         std::vector<std::pair<const char*, int>>{{"great product, works well", 1},
                                                  {"broke after a day", 0},
                                                  {"very happy with it", 1},
                                                  {"a waste of money", 0}}) {
      pb::TrainingExample* example = batch.add_examples();
      example->set_text(text);
      example->set_label(label);
    }
    return TrainAndCommit(config, {batch});
  }

  // The directory of `version` in the model store.
  static std::string VersionDir(const std::string& version) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(*work_ + "/store")) {
      if (entry.is_directory() && entry.path().filename() == version) return entry.path();
    }
    return "";
  }

  static std::string* work_;
  static ServerProcess* server_;
  static pb::Trainer::Stub* trainer_;
  static std::string* start_error_;
  static std::string catalogue_version_;
};

std::string* CompareVersionsTest::work_ = nullptr;
ServerProcess* CompareVersionsTest::server_ = nullptr;
pb::Trainer::Stub* CompareVersionsTest::trainer_ = nullptr;
std::string* CompareVersionsTest::start_error_ = nullptr;
std::string CompareVersionsTest::catalogue_version_;

TEST_F(CompareVersionsTest, BaseVsBaseIsUnchangedAndCanBeMixed) {
  pb::CompareVersionsRequest request;
  request.set_version_a("base");
  request.set_version_b("base");
  pb::CompareVersionsResponse response;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = Compare(request, &response);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(status.ok()) << StatusString(status);
  std::printf(
      "[compare] base vs base, %d default probes: %.2f s round trip (%.2f s in the server)\n",
      response.drift().probes(), seconds, response.seconds());
  EXPECT_TRUE(response.default_probes());
  EXPECT_EQ(response.drift().probes(), 200);
  EXPECT_EQ(response.matrices_size(), 101);  // 5 embedding tensors + 6 layers x 16
  for (const pb::MatrixChange& change : response.matrices()) {
    EXPECT_EQ(change.relative_change(), 0.0) << change.matrix() << " " << change.layer();
    EXPECT_GT(change.norm_a(), 0.0) << change.matrix() << " " << change.layer();
  }
  ASSERT_EQ(response.heads_size(), 6 * 12);
  for (const pb::HeadChange& head : response.heads()) {
    EXPECT_EQ(head.query_change(), 0.0);
    EXPECT_EQ(head.attention_js(), 0.0);
  }
  EXPECT_EQ(response.most_changed_heads_size(), 10);
  EXPECT_NEAR(response.drift().min_cosine(), 1.0, 1e-6);
  EXPECT_NEAR(response.drift().mean_cosine(), 1.0, 1e-6);
  EXPECT_NEAR(response.drift().spearman(), 1.0, 1e-12);
  EXPECT_EQ(response.drift().neighbour_overlap(), 1.0);
  EXPECT_EQ(response.drift().neighbours_k(), 10);
  EXPECT_TRUE(response.can_mix());
  EXPECT_EQ(response.verdict().rfind("vectors from A can be mixed with B", 0), 0u)
      << response.verdict();
}

TEST_F(CompareVersionsTest, CatalogueVersionMatchesNumpyAndNeedsReindex) {
  const std::string version = CatalogueVersion();
  ASSERT_FALSE(version.empty());
  pb::CompareVersionsRequest request;
  request.set_version_a("base");
  request.set_version_b(version);
  pb::CompareVersionsResponse response;
  const grpc::Status status = Compare(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  std::printf("[compare] base vs %s: %s (%.2f s)\n", version.c_str(), response.verdict().c_str(),
              response.seconds());
  EXPECT_FALSE(response.can_mix());
  EXPECT_EQ(response.verdict().rfind("re-index: ", 0), 0u) << response.verdict();
  EXPECT_LT(response.drift().min_cosine(), 0.99);
  EXPECT_GT(response.most_changed_heads(0).attention_js(), 0.0);
  // Read-only: loading the compared version did not change what is served.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::ListVersionsResponse versions;
    ASSERT_TRUE(trainer_->ListVersions(&context, pb::ListVersionsRequest(), &versions).ok());
    EXPECT_EQ(versions.serving_version(), "base");
  }

  // Every reported tensor against numpy over the two safetensors files.
  const std::string dir = VersionDir(version);
  ASSERT_FALSE(dir.empty()) << "no directory for " << version << " under the store";
  const std::string output = Reference("weights '" + TestModelDir() + "/model.safetensors' '" +
                                       dir + "/model.safetensors'");
  const ReferenceChanges expected = ParseReference(output);
  ASSERT_EQ(expected.size(), static_cast<size_t>(response.matrices_size())) << output;
  int moved = 0;
  for (const pb::MatrixChange& change : response.matrices()) {
    const auto it = expected.find({change.layer(), change.matrix(), change.part()});
    ASSERT_NE(it, expected.end()) << change.matrix() << " " << change.layer();
    EXPECT_NEAR(change.relative_change(), it->second, 1e-6 * std::max(it->second, 1e-12))
        << change.layer() << " " << change.matrix() << " " << change.part();
    moved += change.relative_change() > 0;
  }
  // Contrastive training with every parameter trainable moves every tensor.
  EXPECT_EQ(moved, response.matrices_size());
}

// Two classification versions: their heads are compared too (head.safetensors, numpy).
TEST_F(CompareVersionsTest, ClassificationHeadsAreCompared) {
  const std::string first = ClassifierVersion(1), second = ClassifierVersion(2);
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  pb::CompareVersionsRequest request;
  request.set_version_a(first);
  request.set_version_b(second);
  pb::CompareVersionsResponse response;
  const grpc::Status status = Compare(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.matrices_size(), 103);  // the 101 encoder tensors and the head's two
  const std::string dir_a = VersionDir(first), dir_b = VersionDir(second);
  const std::string output =
      Reference("weights '" + dir_a + "/model.safetensors' '" + dir_b + "/model.safetensors' '" +
                dir_a + "/head.safetensors' '" + dir_b + "/head.safetensors'");
  const ReferenceChanges expected = ParseReference(output);
  ASSERT_EQ(expected.size(), 103u) << output;
  int heads = 0;
  for (const pb::MatrixChange& change : response.matrices()) {
    const auto it = expected.find({change.layer(), change.matrix(), change.part()});
    ASSERT_NE(it, expected.end()) << change.matrix();
    EXPECT_NEAR(change.relative_change(), it->second, 1e-6 * std::max(it->second, 1e-12))
        << change.layer() << " " << change.matrix() << " " << change.part();
    if (change.matrix() == "head") {
      ++heads;
      EXPECT_GT(change.relative_change(), 0.1);  // different seeds, different initial heads
    }
  }
  EXPECT_EQ(heads, 2);
  // base has no head: the comparison leaves it out.
  request.set_version_a("base");
  ASSERT_TRUE(Compare(request, &response).ok());
  EXPECT_EQ(response.matrices_size(), 101);
}

TEST_F(CompareVersionsTest, StaticNeighboursOfKingMatchNumpy) {
  pb::NeighborsRequest request;
  request.set_version("base");
  request.set_word("king");
  pb::NeighborsResponse response;
  const grpc::Status status = Neighbors(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.word_token_ids_size(), 1);
  ASSERT_EQ(response.static_neighbors_size(), 10);
  std::string got;
  std::vector<int> ids;
  for (const pb::TokenNeighbor& neighbour : response.static_neighbors()) {
    ids.push_back(neighbour.token_id());
    got += neighbour.token() + " ";
  }
  std::printf("[compare] static neighbours of 'king': %s\n", got.c_str());
  const nlohmann::json expected =
      nlohmann::json::parse(Reference("neighbours '" + TestModelDir() + "/model.safetensors' " +
                                      std::to_string(response.word_token_ids(0))));
  EXPECT_EQ(ids, expected.get<std::vector<int>>());
  EXPECT_GT(response.static_neighbors(0).cosine(), response.static_neighbors(9).cosine());
}

TEST_F(CompareVersionsTest, ContextualBankSeparatesRiverFromMoney) {
  pb::NeighborsRequest request;
  request.set_version("base");
  request.set_word("bank");
  for (const char* sentence : {"We sat on the bank of the river and watched the boats.",
                               "The fisherman pulled his boat onto the muddy bank of the stream.",
                               "The bank approved my loan and lowered the interest rate.",
                               "She deposited her salary at the bank on Monday."}) {
    request.add_sentences(sentence);
  }
  pb::NeighborsResponse response;
  const grpc::Status status = Neighbors(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.contextual_cosine_size(), 16);
  EXPECT_EQ(response.layer(), 6);
  auto cosine = [&](int i, int j) { return response.contextual_cosine(i * 4 + j); };
  std::printf("[compare] 'bank' at layer 6: river-river %.3f, money-money %.3f, river-money %.3f\n",
              cosine(0, 1), cosine(2, 3), cosine(0, 2));
  EXPECT_NEAR(cosine(0, 0), 1.0, 1e-6);
  EXPECT_GT(cosine(0, 1), cosine(0, 2));
  EXPECT_GT(cosine(2, 3), cosine(1, 3));
  // At layer 0 (before any attention) only the position differs: far more alike.
  request.set_layer(0);
  pb::NeighborsResponse static_response;
  ASSERT_TRUE(Neighbors(request, &static_response).ok());
  EXPECT_GT(static_response.contextual_cosine(0 * 4 + 2), cosine(0, 2));
}

// attnctl diff and neighbors against the same server: tables, verdict, the SVG.
TEST_F(CompareVersionsTest, AttnctlDiffAndNeighbors) {
  const std::string attnctl = ATTNCTL_BINARY;
  const std::string env = "ATTNSERVE_TOKEN=" + std::string(kToken) +
                          " ATTNSERVE_ADDR=" + server_->address() + " NO_PROXY='*' no_proxy='*' ";
  const std::string svg = *work_ + "/diff.svg";
  int code = -1;
  const std::string diff = RunCommand(
      env + "'" + attnctl + "' diff --from base --to base --timeout-ms 0 --svg '" + svg + "' 2>&1",
      &code);
  EXPECT_EQ(code, 0) << diff;
  EXPECT_NE(diff.find("layer 5"), std::string::npos) << diff;
  EXPECT_NE(diff.find("verdict: vectors from A can be mixed with B"), std::string::npos) << diff;
  std::ifstream in(svg);
  const std::string picture((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(picture.rfind("<svg", 0), 0u) << picture.substr(0, 200);
  EXPECT_NE(picture.find("attention_output"), std::string::npos);
  EXPECT_NE(picture.find("head 11"), std::string::npos);
  const std::string neighbors = RunCommand(
      env + "'" + attnctl + "' neighbors --word bank --version base --in 'the bank of the river' " +
          "--in 'the bank lends money' 2>&1",
      &code);
  EXPECT_EQ(code, 0) << neighbors;
  EXPECT_NE(neighbors.find("banks"), std::string::npos) << neighbors;
  EXPECT_NE(neighbors.find("contextual cosine at layer 6"), std::string::npos) << neighbors;
  EXPECT_NE(neighbors.find("[1] the bank lends money"), std::string::npos) << neighbors;
  const std::string refused =
      RunCommand(env + "'" + attnctl + "' diff --from base --to nope 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(refused.find("nope"), std::string::npos) << refused;
}

}  // namespace
}  // namespace attn::integration
