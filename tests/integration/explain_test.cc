// Explain and sparse Encode over the real server: attributions of a torch fixture case through
// the RPC (tests/golden/make_explain_golden.py), the swapped-texts transpose, word aggregation
// offsets, several documents; Explain yields to Encode and stops when cancelled; BM42 sparse
// vectors and attention-weighted pooling against the Hugging Face reference
// (tests/golden/make_bm42_golden.py). Small step counts: the host is slow.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/golden/golden_json.h"
#include "tests/golden/relative_error.h"
#include "tests/integration/harness.h"
#include "tests/integration/product_catalog.h"

namespace attn::integration {

// Default flags: Explain's limits are the server defaults (16 documents).
std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using ::attn::testing::GoldenJson;
using ::attn::testing::WorstRelative;

class ExplainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  static grpc::Status Explain(const pb::ExplainRequest& request, pb::ExplainResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(240));
    return stub_->Explain(&context, request, response);
  }

  static pb::ExplainResponse ExplainOk(const pb::ExplainRequest& request) {
    pb::ExplainResponse response;
    const grpc::Status status = Explain(request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(response.results_size(), status.ok() ? request.documents_size() : 0);
    return response;
  }

  static const nlohmann::json& FixtureCase(const std::string& name) {
    const auto& file = GoldenJson("explain_cases.json");
    EXPECT_TRUE(file.error.empty()) << file.error;
    for (const auto& c : file.json["cases"]) {
      if (c["name"] == name) return c;
    }
    ADD_FAILURE() << "no case " << name;
    static const nlohmann::json none;
    return none;
  }

  static pb::Encoder::Stub* stub_;
};
pb::Encoder::Stub* ExplainTest::stub_ = nullptr;

std::vector<float> Floats(const google::protobuf::RepeatedField<float>& field) {
  return {field.begin(), field.end()};
}

TEST_F(ExplainTest, PairwiseMatchesTorchThroughTheRpc) {
  const nlohmann::json& c = FixtureCase("pairwise_8_steps");
  ASSERT_FALSE(c.is_null());
  pb::ExplainRequest request;
  request.set_query(c["text_a"].get<std::string>());
  request.add_documents(c["text_b"].get<std::string>());
  request.set_method(pb::ATTRIBUTION_PAIRWISE);
  request.set_steps(c["steps"].get<int>());
  const pb::ExplainResponse response = ExplainOk(request);
  ASSERT_EQ(response.results_size(), 1);
  const pb::ExplainResult& r = response.results(0);
  EXPECT_NEAR(r.similarity(), c["similarity"].get<float>(), 1e-5);
  EXPECT_NEAR(r.query().baseline_similarity(), c["s_ra_b"].get<float>(), 1e-5);
  EXPECT_NEAR(r.document().baseline_similarity(), c["s_a_rb"].get<float>(), 1e-5);
  EXPECT_NEAR(r.baselines_similarity(), c["s_ra_rb"].get<float>(), 1e-5);
  ASSERT_EQ(r.query_tokens_size(), static_cast<int>(c["ids_a"].size()));
  ASSERT_EQ(r.document_tokens_size(), static_cast<int>(c["ids_b"].size()));
  for (int i = 0; i < r.query_tokens_size(); ++i) EXPECT_EQ(r.query_tokens(i).id(), c["ids_a"][i]);
  EXPECT_LT(WorstRelative(Floats(r.query().gradient_x_input()), c["gxi_a"]), 1e-3);
  EXPECT_LT(WorstRelative(Floats(r.document().gradient_x_input()), c["gxi_b"]), 1e-3);
  EXPECT_LT(WorstRelative(Floats(r.query().integrated_gradients()), c["ig_a"]), 1e-3);
  EXPECT_LT(WorstRelative(Floats(r.document().integrated_gradients()), c["ig_b"]), 1e-3);
  ASSERT_EQ(Shape(r.pair_matrix()),
            (std::vector<int64_t>{r.query_tokens_size(), r.document_tokens_size()}));
  std::vector<float> ref;
  for (const auto& row : c["pair_matrix"]) {
    for (float v : row) ref.push_back(v);
  }
  const std::vector<float> matrix = DecodeOrFail(r.pair_matrix());
  EXPECT_LT(WorstRelative(matrix, ref), 1e-3);
  EXPECT_NEAR(r.completeness_error(), c["completeness_error"].get<float>(), 1e-3);
  double sum = 0;
  for (float v : matrix) sum += v;
  EXPECT_NEAR(r.attribution_sum(), sum, 1e-4);
  EXPECT_NEAR(r.completeness_error(), std::fabs(r.attribution_sum() - r.completeness_target()),
              1e-6);
  EXPECT_GT(response.metadata().inference_ms(), 0);
  EXPECT_EQ(response.metadata().token_count(), r.query_tokens_size() + r.document_tokens_size());

  // Swapping the texts transposes the matrix (same model, same path: equal up to rounding).
  pb::ExplainRequest swapped = request;
  swapped.set_query(c["text_b"].get<std::string>());
  swapped.set_documents(0, c["text_a"].get<std::string>());
  const pb::ExplainResponse back = ExplainOk(swapped);
  ASSERT_EQ(back.results_size(), 1);
  const std::vector<float> transposed = DecodeOrFail(back.results(0).pair_matrix());
  const int rows = r.query_tokens_size(), cols = r.document_tokens_size();
  ASSERT_EQ(transposed.size(), matrix.size());
  double max_abs = 0;
  for (float v : matrix) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      EXPECT_NEAR(transposed[j * rows + i], matrix[i * cols + j], 1e-4 * max_abs)
          << "A[" << i << "," << j << "]";
    }
  }
  EXPECT_NEAR(back.results(0).similarity(), r.similarity(), 1e-6);
}

TEST_F(ExplainTest, WordLevelSpansCoverTheTextAndSumTheirTokens) {
  const std::string query = "Photosynthesis converts sunlight.";
  pb::ExplainRequest request;
  request.set_query(query);
  request.add_documents("Chlorophyll absorbs light.");
  request.set_method(pb::ATTRIBUTION_PAIRWISE);
  request.set_steps(2);
  request.set_word_level(true);
  const pb::ExplainResponse response = ExplainOk(request);
  ASSERT_EQ(response.results_size(), 1);
  const pb::ExplainResult& r = response.results(0);
  // "photosynthesis" is several word pieces, one word.
  ASSERT_LT(r.query_words_size(), r.query_tokens_size());
  std::vector<std::string> words;
  for (const pb::Word& w : r.query_words()) {
    if (w.special()) continue;
    // Code point offsets; the text is ASCII, so they index bytes too. Lower-cased by the
    // tokenizer: compare case-insensitively.
    std::string span = query.substr(w.char_start(), w.char_end() - w.char_start());
    std::transform(span.begin(), span.end(), span.begin(), ::tolower);
    EXPECT_EQ(span, w.text());
    words.push_back(w.text());
    float ig = 0;
    for (int t = w.first_token(); t < w.first_token() + w.num_tokens(); ++t) {
      ig += r.query().integrated_gradients(t);
    }
    EXPECT_NEAR(w.integrated_gradients(), ig, 1e-6);
  }
  EXPECT_EQ(words, (std::vector<std::string>{"photosynthesis", "converts", "sunlight", "."}));
  // The word matrix sums the token matrix's blocks: equal totals.
  const std::vector<float> tokens = DecodeOrFail(r.pair_matrix());
  const std::vector<float> word_matrix = DecodeOrFail(r.word_pair_matrix());
  ASSERT_EQ(Shape(r.word_pair_matrix()),
            (std::vector<int64_t>{r.query_words_size(), r.document_words_size()}));
  double token_sum = 0, word_sum = 0;
  for (float v : tokens) token_sum += v;
  for (float v : word_matrix) word_sum += v;
  EXPECT_NEAR(word_sum, token_sum, 1e-5);
}

TEST_F(ExplainTest, SeveralDocumentsEachExplainedAgainstTheQuery) {
  pb::ExplainRequest request;
  request.set_query("fresh bread from the bakery");
  request.add_documents("a loaf baked this morning");
  request.add_documents("bond yields rose sharply");
  request.set_method(pb::ATTRIBUTION_GRADIENT_X_INPUT);
  const pb::ExplainResponse response = ExplainOk(request);
  ASSERT_EQ(response.results_size(), 2);
  EXPECT_GT(response.results(0).similarity(), response.results(1).similarity());
  for (const pb::ExplainResult& r : response.results()) {
    EXPECT_EQ(r.query().gradient_x_input_size(), r.query_tokens_size());
    EXPECT_EQ(r.document().gradient_x_input_size(), r.document_tokens_size());
    EXPECT_EQ(r.query().integrated_gradients_size(), 0);
    EXPECT_FALSE(r.has_pair_matrix());
  }
}

// A long Explain runs on the engine thread, yielding between units of work: an Encode sent
// while it runs is answered before it ends, and cancelling it stops it (CANCELLED, counted as
// dropped), after which the server serves as before.
TEST_F(ExplainTest, EncodeIsServedWhileExplainRunsAndCancelStopsIt) {
  pb::ExplainRequest request;
  request.set_query(
      "The committee reviewed the annual report on regional water supplies and reservoirs.");
  request.add_documents("Engineers proposed repairing leaking pipes near the coast.");
  request.set_method(pb::ATTRIBUTION_PAIRWISE);
  request.set_steps(256);  // many minutes here: it must be cancelled, never finish
  const double queued_before =
      ScrapeSum(SharedServer(), "attnserve_queue_duration_seconds_count", {});
  grpc::ClientContext explain_context;
  explain_context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(600));
  std::atomic<bool> explain_done{false};
  grpc::Status explain_status;
  std::thread explain([&] {
    pb::ExplainResponse response;
    explain_status = stub_->Explain(&explain_context, request, &response);
    explain_done = true;
  });
  // Until the engine thread has started it (its queue time is recorded then).
  ASSERT_TRUE(WaitFor(
      [&] {
        return ScrapeSum(SharedServer(), "attnserve_queue_duration_seconds_count", {}) >
                   queued_before ||
               explain_done;
      },
      ScaledSeconds(30)));
  pb::EncodeRequest encode;
  encode.add_inputs()->set_text("is anyone there?");
  pb::EncodeResponse encoded;
  grpc::ClientContext encode_context;
  encode_context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  const grpc::Status encode_status = stub_->Encode(&encode_context, encode, &encoded);
  EXPECT_TRUE(encode_status.ok()) << StatusString(encode_status);
  EXPECT_FALSE(explain_done) << "Explain ended before the cancel: " << StatusString(explain_status);
  explain_context.TryCancel();
  explain.join();
  EXPECT_EQ(explain_status.error_code(), grpc::StatusCode::CANCELLED)
      << StatusString(explain_status);
  // The engine thread is free again: a short Explain completes.
  pb::ExplainRequest small;
  small.set_query("cats");
  small.add_documents("dogs");
  small.set_method(pb::ATTRIBUTION_GRADIENT_X_INPUT);
  ExplainOk(small);
  EXPECT_TRUE(WaitFor(
      [&] {
        return ScrapeSum(SharedServer(), "attnserve_dropped_requests_total",
                         {{"reason", "cancelled"}}) >= 1;
      },
      ScaledSeconds(30)));
}

// ---- Sparse vectors and attention pooling ---------------------------------------------------

TEST_F(ExplainTest, SparseVectorsAndAttentionPoolingMatchTheHuggingFaceReference) {
  const auto& file = GoldenJson("bm42_cases.json");
  ASSERT_TRUE(file.error.empty()) << file.error;
  const auto& cases = file.json["cases"];
  ASSERT_GE(cases.size(), 50u);
  pb::EncodeRequest request;
  for (const auto& c : cases) request.add_inputs()->set_text(c["text"].get<std::string>());
  request.set_sparse(true);
  request.set_pooling(pb::POOLING_CLS_ATTENTION);
  request.set_normalize(false);
  request.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
  request.mutable_tokenization()->set_max_length(512);
  pb::EncodeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  const grpc::Status status = stub_->Encode(&context, request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(cases.size()));
  int nonempty = 0, pooled_cases = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    const pb::EncodeResult& r = response.results(static_cast<int>(k));
    std::map<uint32_t, double> expected;
    for (size_t i = 0; i < c["indices"].size(); ++i) {
      expected[c["indices"][i].get<uint32_t>()] = c["values"][i].get<double>();
    }
    std::map<uint32_t, double> ours;
    for (int i = 0; i < r.sparse().indices_size(); ++i) {
      if (i > 0) EXPECT_LT(r.sparse().indices(i - 1), r.sparse().indices(i));
      ours[r.sparse().indices(i)] = r.sparse().values(i);
    }
    ASSERT_EQ(ours.size(), expected.size()) << c["text"];
    for (const auto& [index, value] : expected) {
      ASSERT_TRUE(ours.count(index)) << c["text"] << ": index " << index;
      EXPECT_NEAR(ours[index], value, 1e-5) << c["text"];
    }
    nonempty += !expected.empty();
    if (!c.contains("attention_pooled") || c["attention_pooled"].is_null()) continue;
    ++pooled_cases;
    const std::vector<float> pooled = c["attention_pooled"];
    ASSERT_EQ(r.embedding_size(), static_cast<int>(pooled.size()));
    for (size_t i = 0; i < pooled.size(); ++i) EXPECT_NEAR(r.embedding(i), pooled[i], 1e-4);
  }
  EXPECT_GE(nonempty, 50);
  EXPECT_GE(pooled_cases, 5);
}

// Hybrid retrieval on the made-up product catalogue (product_catalog.h): each item's document
// names it and says what it is; queries ask in plain words. Dense (cosine) and sparse (BM42 with
// Qdrant's idf modifier, computed over the documents) rankings fused by reciprocal rank (k = 60,
// Qdrant's RRF) must find at least as many items at rank 1 as dense alone.
TEST_F(ExplainTest, DenseAndSparseFusionIsNotWorseThanDenseOnTheCatalogue) {
  const ProductCatalog catalog;
  std::vector<std::string> documents;
  for (const CatalogItem& item : catalog.items()) {
    documents.push_back(absl::StrCat(item.name, ": a ", ProductCatalog::kColours[item.series], " ",
                                     ProductCatalog::kProducts[item.brand]));
  }
  std::vector<CatalogQuery> queries = catalog.held_out_queries();
  for (size_t i = 0; i < catalog.train_queries().size() && queries.size() < 200; i += 3) {
    queries.push_back(catalog.train_queries()[i]);
  }
  auto encode = [](const std::vector<std::string>& texts) {
    pb::EncodeRequest request;
    for (const std::string& t : texts) request.add_inputs()->set_text(t);
    request.set_sparse(true);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
    const grpc::Status status = stub_->Encode(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response;
  };
  std::vector<std::string> query_texts;
  for (const CatalogQuery& q : queries) query_texts.push_back(q.text);
  const pb::EncodeResponse docs = encode(documents), qs = encode(query_texts);
  ASSERT_EQ(docs.results_size(), static_cast<int>(documents.size()));
  ASSERT_EQ(qs.results_size(), static_cast<int>(queries.size()));
  // idf over the documents, as Qdrant's modifier: log((N - n + 0.5) / (n + 0.5) + 1).
  std::map<uint32_t, int> document_frequency;
  for (const pb::EncodeResult& d : docs.results()) {
    for (uint32_t index : d.sparse().indices()) ++document_frequency[index];
  }
  const double n_docs = documents.size();
  auto idf = [&](uint32_t index) {
    const double n = document_frequency.count(index) ? document_frequency[index] : 0;
    return std::log((n_docs - n + 0.5) / (n + 0.5) + 1.0);
  };
  auto ranks = [](const std::vector<double>& scores) {  // rank (0 = best) of every document
    std::vector<int> order(scores.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return scores[a] > scores[b]; });
    std::vector<int> rank(scores.size());
    for (size_t r = 0; r < order.size(); ++r) rank[order[r]] = static_cast<int>(r);
    return rank;
  };
  int dense_hits = 0, sparse_hits = 0, fused_hits = 0;
  for (size_t qi = 0; qi < queries.size(); ++qi) {
    const pb::EncodeResult& q = qs.results(static_cast<int>(qi));
    std::map<uint32_t, float> query_sparse;
    for (int k = 0; k < q.sparse().indices_size(); ++k) {
      query_sparse[q.sparse().indices(k)] = q.sparse().values(k);
    }
    std::vector<double> dense(documents.size()), sparse(documents.size());
    for (size_t di = 0; di < documents.size(); ++di) {
      const pb::EncodeResult& d = docs.results(static_cast<int>(di));
      for (int c = 0; c < d.embedding_size(); ++c) dense[di] += q.embedding(c) * d.embedding(c);
      for (int k = 0; k < d.sparse().indices_size(); ++k) {
        auto it = query_sparse.find(d.sparse().indices(k));
        if (it != query_sparse.end())
          sparse[di] += it->second * d.sparse().values(k) * idf(it->first);
      }
    }
    const std::vector<int> dense_rank = ranks(dense), sparse_rank = ranks(sparse);
    std::vector<double> fused(documents.size());
    for (size_t di = 0; di < documents.size(); ++di) {
      fused[di] = 1.0 / (60 + dense_rank[di] + 1) + 1.0 / (60 + sparse_rank[di] + 1);
    }
    const int item = queries[qi].item;
    dense_hits += dense_rank[item] == 0;
    sparse_hits += sparse_rank[item] == 0;
    fused_hits += ranks(fused)[item] == 0;
  }
  const double n = queries.size();
  std::printf(
      "catalogue retrieval, %d queries over %d documents: top-1 dense %.3f, sparse %.3f, "
      "dense+sparse (RRF) %.3f\n",
      static_cast<int>(queries.size()), static_cast<int>(documents.size()), dense_hits / n,
      sparse_hits / n, fused_hits / n);
  EXPECT_GE(fused_hits, dense_hits);
  EXPECT_GT(sparse_hits, 0);  // the sparse side finds something of its own
}

TEST_F(ExplainTest, NoSparseVectorUnlessAsked) {
  pb::EncodeRequest request;
  request.add_inputs()->set_text("a red kettle");
  pb::EncodeResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Encode(&context, request, &response).ok());
  EXPECT_FALSE(response.results(0).has_sparse());
}

}  // namespace
}  // namespace attn::integration
