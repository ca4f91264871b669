// "It learns": fine-tuning through the real Trainer service teaches the served model something
// the base model cannot know, and the Encoder serves it after commit.
//
// The task is the made-up product catalogue of product_catalog.h: 100 items named from invented
// words ("Vornak Zelto"), queries in plain words ("looking for the red kettle") that must
// retrieve their item's name among all 100 names by cosine similarity. The base
// all-MiniLM-L6-v2 is at chance (1/100); a short contrastive job on the training items makes it
// retrieve held-out items (never in the training data) asked for with held-out phrasings, which
// only works if the brand -> product and series -> colour meanings were learnt and combined.
//
// Order: held-out accuracy of "base" (pinned) first, then one FineTune job (contrastive,
// dropout off, fixed seed, 20 steps of 16 pairs), commit, then held-out accuracy of the
// committed version pinned and of the default version; "base" pinned must still give its old
// embeddings bit for bit. The same job in bf16 mixed precision (FineTuneConfig.precision) must
// learn the task too.
//
// The data as JSON Lines (catalog-train.jsonl for `attnctl finetune --objective contrastive`,
// catalog-heldout.jsonl), without starting a server:
//   ATTN_CATALOG_JSONL_DIR=DIR integration_learns_test --gtest_filter='ProductCatalog*'

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/product_catalog.h"

namespace attn::integration {

// The server needs a token file and a model store made first, so the test starts its own.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "learns-test-token";

// The job. With these settings every run gives the same numbers (dropout off, fixed seeds, one
// trainer thread): held-out top-1 0.000 for base, 0.950 fine-tuned, on this machine; other data
// seeds (1-6, same job run on the engine directly) gave 0.917-0.967.
#ifdef ATTN_LEARNS_MPNET
// integration_learns_mpnet_test: the same task on all-mpnet-base-v2 (--model-dir; 8x MiniLM's
// cost per token). 20 steps took 167 s on the shared 2-core AMD EPYC (6.6 s/step, held-out
// top-1 0.000 -> 1.000); 10 steps at 1e-4 were too few (0.250); 12 steps at 2e-4 gave 0.900
// in 156 s while the machine was busy (8.4 s/step), about 120 s when it is not.
constexpr int kSteps = 12;
constexpr int kBatchSize = 16;
constexpr double kLearningRate = 2e-4;
constexpr int kWarmupSteps = 1;
std::vector<std::string> ModelFlags() {
  const char* env = std::getenv("ATTN_TEST_MPNET_MODEL_DIR");
  return {"--model_dir=" +
          std::string(env != nullptr && *env != '\0' ? env : ATTN_TEST_MPNET_MODEL_DIR)};
}
#else
constexpr int kSteps = 20;
constexpr int kBatchSize = 16;
constexpr double kLearningRate = 1e-4;
constexpr int kWarmupSteps = 2;
std::vector<std::string> ModelFlags() { return {}; }  // the harness's default model
#endif
constexpr uint64_t kDataSeed = 1;
constexpr uint64_t kTrainerSeed = 7;
// The asserted gain in held-out top-1 accuracy (absolute, over 60 queries and 100 candidate
// items): half of the distance from chance to perfect, far below the ~0.9 gain measured, and
// unreachable without learning (the base model retrieves none of the held-out items).
constexpr double kRequiredGain = 0.5;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Embeddings {
  std::string version;                   // the version that answered
  std::vector<std::vector<float>> rows;  // one per text
};

struct Evaluation {
  Embeddings items, queries;
  double top1 = 0;  // fraction of queries whose most similar item is their own
  double mean_reciprocal_rank = 0;
};

class LearnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-learns-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    const std::string token_file = *work_ + "/token";
    std::ofstream(token_file) << kToken << "\n";
    const auto start = Clock::now();
    // One engine thread for serving too: this test is about what the model learns, and with
    // both cores busy elsewhere a 2-thread OpenMP forward can stall for seconds per barrier.
    std::vector<std::string> flags = {"--trainer_token_file=" + token_file,
                                      "--model_store=" + *work_ + "/store", "--trainer_threads=1",
                                      "--threads=1"};
    for (const std::string& flag : ModelFlags()) flags.push_back(flag);
    server_ = new ServerProcess(flags);
    // Checked in SetUp: a failed assertion here would only mark the tests skipped.
    start_error_ = new std::string();
    if (!server_->StartAndWait(ScaledSeconds(90), start_error_)) return;
    start_error_->clear();
    std::printf("[learns] attnserve ready after %.1f s\n", Seconds(start));
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

  // Pooled embeddings (the model default: mean, L2-normalised) of `texts` from `version`
  // ("" = the default version), in calls of at most 100 inputs (below the server's
  // --max-inputs-per-request).
  static Embeddings Embed(const std::vector<std::string>& texts, const std::string& version) {
    constexpr size_t kInputsPerCall = 100;
    Embeddings out;
    for (size_t first = 0; first < texts.size(); first += kInputsPerCall) {
      pb::EncodeRequest request;
      for (size_t i = first; i < std::min(texts.size(), first + kInputsPerCall); ++i) {
        request.add_inputs()->set_text(texts[i]);
      }
      request.set_model_version(version);
      pb::EncodeResponse response;
      grpc::ClientContext context;
      const grpc::Status status = encoder_->Encode(&context, request, &response);
      EXPECT_TRUE(status.ok()) << StatusString(status);
      out.version = response.model_version();
      for (const auto& result : response.results()) {
        out.rows.emplace_back(result.embedding().begin(), result.embedding().end());
      }
    }
    EXPECT_EQ(out.rows.size(), texts.size());
    return out;
  }

  // Retrieval over all catalogue items for the held-out queries, by cosine similarity.
  static Evaluation Evaluate(const ProductCatalog& catalog,
                             const std::vector<CatalogQuery>& queries, const std::string& version) {
    Evaluation eval;
    eval.items = Embed(catalog.ItemNames(), version);
    std::vector<std::string> texts;
    for (const CatalogQuery& query : queries) texts.push_back(query.text);
    eval.queries = Embed(texts, version);
    if (eval.items.rows.size() != catalog.items().size() ||
        eval.queries.rows.size() != queries.size()) {
      return eval;  // the Encode failure is already reported
    }
    for (size_t q = 0; q < queries.size(); ++q) {
      const double own = Cosine(eval.queries.rows[q], eval.items.rows[queries[q].item]);
      int rank = 1;  // ties count against the query
      for (size_t i = 0; i < eval.items.rows.size(); ++i) {
        if (static_cast<int>(i) != queries[q].item &&
            Cosine(eval.queries.rows[q], eval.items.rows[i]) >= own) {
          ++rank;
        }
      }
      eval.top1 += rank == 1;
      eval.mean_reciprocal_rank += 1.0 / rank;
    }
    eval.top1 /= queries.size();
    eval.mean_reciprocal_rank /= queries.size();
    return eval;
  }

  struct Job {
    std::vector<double> losses;  // per step
    std::string version;         // committed; empty after a failure (reported)
  };

  // The contrastive job of this test from "base" at `precision` ("" = the default), committed
  // (and promoted to the default version when `promote`).
  static Job RunJob(const ProductCatalog& catalog, const std::string& precision, bool promote) {
    Job job;
    const auto phase = Clock::now();
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(240));
    auto stream = trainer_->FineTune(&context);
    pb::FineTuneRequest config_request;
    pb::FineTuneConfig* config = config_request.mutable_config();
    config->set_objective(pb::CONTRASTIVE);
    config->set_learning_rate(kLearningRate);
    config->set_warmup_steps(kWarmupSteps);
    config->set_total_steps(kSteps);
    config->set_disable_dropout(true);
    config->set_seed(kTrainerSeed);
    config->set_base_version("base");
    config->set_precision(precision);
    EXPECT_TRUE(stream->Write(config_request));
    for (const auto& batch : catalog.TrainingBatches(kSteps, kBatchSize, kDataSeed, false)) {
      pb::FineTuneRequest request;
      for (const CatalogExample& example : batch) {
        pb::TrainingExample* out = request.mutable_batch()->add_examples();
        out->set_anchor(example.anchor);
        out->set_positive(example.positive);
      }
      pb::FineTuneProgress progress;
      if (!stream->Write(request) || !stream->Read(&progress)) break;
      EXPECT_EQ(progress.step(), static_cast<int64_t>(job.losses.size()) + 1);
      job.losses.push_back(progress.loss());
    }
    const double train_seconds = Seconds(phase);
    pb::FineTuneRequest commit;
    commit.mutable_commit()->set_description("integration_learns_test: product catalogue" +
                                             (precision.empty() ? "" : ", " + precision));
    commit.mutable_commit()->set_promote(promote);
    pb::FineTuneProgress final_progress;
    const bool committed = stream->Write(commit) && stream->Read(&final_progress);
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(job.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_TRUE(committed);
    if (!status.ok() || !committed || job.losses.size() != static_cast<size_t>(kSteps)) {
      return job;
    }
    job.version = final_progress.committed_version();
    std::printf(
        "[learns] fine-tune%s: %d steps x %d pairs in %.1f s (%.2f s/step), loss %.3f -> "
        "%.3f; commit %.1f s -> version %s\n",
        precision.empty() ? "" : (" " + precision).c_str(), kSteps, kBatchSize, train_seconds,
        train_seconds / kSteps, job.losses.front(), job.losses.back(),
        Seconds(phase) - train_seconds, job.version.c_str());
    return job;
  }

  static std::string* work_;
  static ServerProcess* server_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
  static std::string* start_error_;
};

std::string* LearnsTest::work_ = nullptr;
ServerProcess* LearnsTest::server_ = nullptr;
pb::Encoder::Stub* LearnsTest::encoder_ = nullptr;
pb::Trainer::Stub* LearnsTest::trainer_ = nullptr;
std::string* LearnsTest::start_error_ = nullptr;

// The generator keeps its promises: held-out items and phrasings never reach training, batches
// never hold one item twice, and the same seed gives the same batches.
TEST(ProductCatalogTest, TrainAndHeldOutAreSeparate) {
  const ProductCatalog catalog;
  ASSERT_EQ(catalog.items().size(), 100u);
  std::set<std::string> held_out_names, names;
  std::vector<int> held_out_per_brand(ProductCatalog::kBrands), per_series(ProductCatalog::kSeries);
  for (const CatalogItem& item : catalog.items()) {
    names.insert(item.name);
    if (!item.held_out) continue;
    held_out_names.insert(item.name);
    ++held_out_per_brand[item.brand];
    ++per_series[item.series];
  }
  EXPECT_EQ(names.size(), 100u);
  EXPECT_EQ(held_out_names.size(), 20u);
  for (int count : held_out_per_brand) EXPECT_EQ(count, 2);
  for (int count : per_series) EXPECT_EQ(count, 2);

  std::set<std::string> train_texts;
  for (const CatalogQuery& query : catalog.train_queries()) {
    EXPECT_FALSE(catalog.items()[query.item].held_out) << query.text;
    train_texts.insert(query.text);
  }
  EXPECT_EQ(catalog.held_out_queries().size(), 60u);
  for (const CatalogQuery& query : catalog.held_out_queries()) {
    EXPECT_TRUE(catalog.items()[query.item].held_out) << query.text;
    EXPECT_EQ(train_texts.count(query.text), 0u) << query.text;
  }
  for (const std::string& pattern : ProductCatalog::HeldOutTemplates()) {
    for (const std::string& train_pattern : ProductCatalog::TrainTemplates()) {
      EXPECT_NE(pattern, train_pattern);
    }
  }

  const auto batches = catalog.TrainingBatches(kSteps, kBatchSize, kDataSeed, true);
  ASSERT_EQ(batches.size(), static_cast<size_t>(kSteps));
  std::set<std::string> trained_items;
  for (const auto& batch : batches) {
    ASSERT_EQ(batch.size(), static_cast<size_t>(kBatchSize));
    std::set<std::string> positives;
    for (const CatalogExample& example : batch) {
      positives.insert(example.positive);
      trained_items.insert(example.positive);
      EXPECT_EQ(train_texts.count(example.anchor), 1u) << example.anchor;
      EXPECT_EQ(held_out_names.count(example.positive), 0u) << example.positive;
      EXPECT_EQ(held_out_names.count(example.negative), 0u) << example.negative;
      EXPECT_NE(example.negative, example.positive);
    }
    EXPECT_EQ(positives.size(), batch.size()) << "an item twice in one batch";
  }
  // 20 x 16 = 320 examples cover all 80 training items (4 passes).
  EXPECT_EQ(trained_items.size(), 80u);
  const auto again = catalog.TrainingBatches(kSteps, kBatchSize, kDataSeed, true);
  const auto other = catalog.TrainingBatches(kSteps, kBatchSize, kDataSeed + 1, true);
  bool same = true, differs = false;
  for (int step = 0; step < kSteps; ++step) {
    for (int i = 0; i < kBatchSize; ++i) {
      same = same && again[step][i].anchor == batches[step][i].anchor &&
             again[step][i].negative == batches[step][i].negative;
      differs = differs || other[step][i].anchor != batches[step][i].anchor;
    }
  }
  EXPECT_TRUE(same);
  EXPECT_TRUE(differs);
}

// The JSON Lines export is what `attnctl finetune` reads: every training query once, with a
// hard negative, and nothing of the held-out items. ATTN_CATALOG_JSONL_DIR=DIR writes it.
TEST(ProductCatalogTest, JsonlExport) {
  const ProductCatalog catalog;
  const std::string train = catalog.TrainingJsonl(kDataSeed);
  const std::string held_out = catalog.HeldOutJsonl();
  std::set<std::string> held_out_names;
  for (const CatalogItem& item : catalog.items()) {
    if (item.held_out) held_out_names.insert(item.name);
  }
  std::istringstream train_lines(train);
  size_t count = 0;
  for (std::string line; std::getline(train_lines, line); ++count) {
    const nlohmann::json example = nlohmann::json::parse(line);
    ASSERT_LT(count, catalog.train_queries().size());
    EXPECT_EQ(example.at("anchor"), catalog.train_queries()[count].text);
    EXPECT_EQ(example.at("positive"), catalog.items()[catalog.train_queries()[count].item].name);
    EXPECT_EQ(held_out_names.count(example.at("negative")), 0u) << line;
    EXPECT_NE(example.at("negative"), example.at("positive"));
  }
  EXPECT_EQ(count, catalog.train_queries().size());
  std::istringstream held_out_lines(held_out);
  size_t items = 0, queries = 0;
  for (std::string line; std::getline(held_out_lines, line);) {
    const nlohmann::json entry = nlohmann::json::parse(line);
    if (!entry.contains("query")) {
      EXPECT_EQ(queries, 0u) << "items come first: " << line;
      EXPECT_EQ(entry.at("item"), catalog.items()[items++].name);
      continue;
    }
    EXPECT_EQ(entry.at("query"), catalog.held_out_queries()[queries].text);
    EXPECT_EQ(held_out_names.count(entry.at("item")), 1u) << line;
    ++queries;
  }
  EXPECT_EQ(items, catalog.items().size());
  EXPECT_EQ(queries, catalog.held_out_queries().size());
  if (const char* dir = std::getenv("ATTN_CATALOG_JSONL_DIR")) {
    std::filesystem::create_directories(dir);
    std::ofstream(std::string(dir) + "/catalog-train.jsonl") << train;
    std::ofstream(std::string(dir) + "/catalog-heldout.jsonl") << held_out;
    std::printf("[learns] wrote %s/catalog-train.jsonl and catalog-heldout.jsonl\n", dir);
  }
  // The copies the README uses are what this generator makes (regenerate them with
  // ATTN_CATALOG_JSONL_DIR=examples/catalog when the catalogue changes).
  for (const auto& [name, expected] :
       {std::pair<std::string, const std::string*>{"catalog-train.jsonl", &train},
        {"catalog-heldout.jsonl", &held_out}}) {
    const std::string path = std::string(ATTN_CATALOG_EXAMPLES_DIR) + "/" + name;
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << path << " is missing";
    const std::string shipped((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    EXPECT_TRUE(shipped == *expected)
        << path << " differs from the generator's output; regenerate it: "
        << "ATTN_CATALOG_JSONL_DIR=examples/catalog integration_learns_test "
           "--gtest_filter='ProductCatalog*'";
  }
}

TEST_F(LearnsTest, FineTuningTeachesHeldOutRetrievalAndBaseStaysPinnable) {
  const ProductCatalog catalog;
  // 1. The base model, pinned.
  auto phase = Clock::now();
  const Evaluation base = Evaluate(catalog, catalog.held_out_queries(), "base");
  ASSERT_EQ(base.items.version, "base");
  ASSERT_EQ(base.items.rows.size(), catalog.items().size());
  const Evaluation base_train = Evaluate(catalog, catalog.train_queries(), "base");
  std::printf(
      "[learns] base: held-out top-1 %.3f (MRR %.3f), training queries top-1 %.3f "
      "(%zu held-out queries, %zu items; %.1f s)\n",
      base.top1, base.mean_reciprocal_rank, base_train.top1, catalog.held_out_queries().size(),
      catalog.items().size(), Seconds(phase));

  // The premise: the base model cannot do this (chance is 0.01).
  EXPECT_LE(base.top1, 0.1);

  // 2. One contrastive job over the real FineTune stream, then commit.
  const Job job = RunJob(catalog, "", /*promote=*/true);
  ASSERT_FALSE(job.version.empty());
  const std::string& version = job.version;
  const std::vector<double>& losses = job.losses;

  // 3. The committed version, pinned and as the default.
  phase = Clock::now();
  const Evaluation tuned = Evaluate(catalog, catalog.held_out_queries(), version);
  EXPECT_EQ(tuned.items.version, version);
  ASSERT_EQ(tuned.items.rows.size(), catalog.items().size());
  const Evaluation latest = Evaluate(catalog, catalog.held_out_queries(), "");
  EXPECT_EQ(latest.items.version, version) << "a promoted commit is served by default";
  const Evaluation tuned_train = Evaluate(catalog, catalog.train_queries(), version);
  std::printf(
      "[learns] %s: held-out top-1 %.3f (MRR %.3f) pinned, %.3f as default; training "
      "queries top-1 %.3f (%.1f s)\n",
      version.c_str(), tuned.top1, tuned.mean_reciprocal_rank, latest.top1, tuned_train.top1,
      Seconds(phase));
  EXPECT_GE(tuned.top1, base.top1 + kRequiredGain)
      << "held-out top-1: base " << base.top1 << ", fine-tuned " << tuned.top1;
  EXPECT_GE(latest.top1, base.top1 + kRequiredGain)
      << "held-out top-1: base " << base.top1 << ", default version " << latest.top1;
  EXPECT_LT(losses.back(), losses.front());

  // 4. "base" still serves the old weights: the same request gives the same bits.
  const Evaluation base_again = Evaluate(catalog, catalog.held_out_queries(), "base");
  EXPECT_EQ(base_again.items.version, "base");
  EXPECT_EQ(base_again.items.rows, base.items.rows) << "base item embeddings changed";
  EXPECT_EQ(base_again.queries.rows, base.queries.rows) << "base query embeddings changed";
  EXPECT_EQ(base_again.top1, base.top1);
  // And the new version really differs from it.
  EXPECT_GT(MaxAbsDiff(tuned.items.rows[0], base.items.rows[0]), 1e-3);
}

// The same job in mixed precision (FineTuneConfig.precision = bfloat16: the matmuls on bfloat16
// inputs, fp32 master weights and AdamW) learns the same task. Committed without promotion, so
// it does not disturb the test above in either order. MiniLM only (MPNet's job takes minutes).
#ifndef ATTN_LEARNS_MPNET
TEST_F(LearnsTest, Bf16MixedPrecisionFineTuningLearnsToo) {
  const ProductCatalog catalog;
  const Job job = RunJob(catalog, "bfloat16", /*promote=*/false);
  ASSERT_FALSE(job.version.empty());
  const Evaluation base = Evaluate(catalog, catalog.held_out_queries(), "base");
  const Evaluation tuned = Evaluate(catalog, catalog.held_out_queries(), job.version);
  EXPECT_EQ(tuned.items.version, job.version);
  std::printf("[learns] bf16 %s: held-out top-1 %.3f (MRR %.3f), base %.3f\n", job.version.c_str(),
              tuned.top1, tuned.mean_reciprocal_rank, base.top1);
  EXPECT_GE(tuned.top1, base.top1 + kRequiredGain)
      << "held-out top-1: base " << base.top1 << ", bf16 fine-tuned " << tuned.top1;
  EXPECT_LT(job.losses.back(), job.losses.front());
}
#endif

}  // namespace
}  // namespace attn::integration
