// The serving core's calls (server/core/serving_core.h) with the real model and no server: each
// call's result against the engine run directly on the same inputs, and one error per call with
// the message a client gets.
#include "server/core/serving_core.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "engine/model_store.h"
#include "engine/training/losses.h"

namespace attn::server::core {
namespace {

class NoMetrics final : public ServingMetrics {
 public:
  void RecordQueueTime(double) override {}
  void RecordTokenizationTime(double) override {}
  void RecordInferenceTime(double) override {}
  void RecordBatch(int64_t, int64_t) override {}
  void SetQueueDepth(int64_t) override {}
  void AddTokens(int64_t) override {}
  void RecordDropped(std::string_view, std::string_view) override {}
  void SetMemoryInFlight(int64_t) override {}
  void RecordMemoryRefusal(std::string_view) override {}
};

class ServingCoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::shared_ptr<const Model>> model = Model::Load(ATTN_TEST_MODEL_DIR);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = new std::shared_ptr<const Model>(*model);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    registry_ = std::make_unique<ModelRegistry>(1);
    ModelVersion base;
    base.version = "base";
    base.model = *model_;
    registry_->Add(base);
    batcher_ = std::make_unique<Batcher>(
        BatcherOptions{/*max_batch_tokens=*/1024, /*max_concurrent_requests=*/8, /*threads=*/0},
        &metrics_);
    CoreOptions options;
    options.limits.max_inputs_per_request = 4;
    options.max_message_bytes = 64 << 20;
    options.max_request_memory_bytes = 512 << 20;
    core_ = std::make_unique<ServingCore>(options, registry_.get(), batcher_.get(), &budget_,
                                          &metrics_);
  }

  // The engine call, waited for.
  template <typename Response, typename Request, typename Call>
  absl::StatusOr<Response> Wait(Call call, const Request& request) {
    std::promise<absl::StatusOr<Response>> promise;
    (core_.get()->*call)(request, CallControl{}, [&promise](absl::StatusOr<Response> r) {
      promise.set_value(std::move(r));
    });
    return promise.get_future().get();
  }

  // The engine's own forward of one input, pooled as the model says.
  ForwardResult EngineForward(const std::string& text, ForwardOptions options) {
    TruncationOptions truncation;
    truncation.max_length = (*model_)->default_max_length();
    absl::StatusOr<Encoding> encoding = (*model_)->tokenizer().Encode(text, truncation);
    EXPECT_TRUE(encoding.ok());
    absl::StatusOr<ForwardResult> result =
        (*model_)->Forward({{encoding->ids, encoding->type_ids}}, options);
    EXPECT_TRUE(result.ok()) << result.status();
    return std::move(*result);
  }

  // `text` must outlive the call (requests view their inputs).
  static Input Text(std::string_view text) {
    Input input;
    input.kind = Input::Kind::kText;
    input.text = text;
    return input;
  }

  static std::shared_ptr<const Model>* model_;
  NoMetrics metrics_;
  MemoryBudget budget_{int64_t{1} << 30};
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<ServingCore> core_;
};

std::shared_ptr<const Model>* ServingCoreTest::model_ = nullptr;

TEST_F(ServingCoreTest, EncodePoolsEachSequenceLikeTheEngine) {
  const std::vector<std::string> texts = {"The cat sat on the mat.",
                                          "A much longer sentence about serving embeddings."};
  EncodeRequest request;
  for (const std::string& text : texts) request.inputs.push_back(Text(text));
  request.token_embeddings = true;
  absl::StatusOr<EncodeResponse> response = Wait<EncodeResponse>(&ServingCore::Encode, request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->model_version, "base");
  ASSERT_EQ(response->results.size(), texts.size());
  const int last = (*model_)->config().num_hidden_layers;
  for (size_t i = 0; i < texts.size(); ++i) {
    ForwardOptions options = (*model_)->DefaultForwardOptions();
    options.hidden_layers = {last};
    const ForwardResult reference = EngineForward(texts[i], options);
    const EncodeResult& result = response->results[i];
    ASSERT_EQ(static_cast<int64_t>(result.embedding.size()), reference.pooled.numel());
    for (size_t k = 0; k < result.embedding.size(); ++k) {
      EXPECT_NEAR(result.embedding[k], reference.pooled.data()[k], 1e-5) << i << " " << k;
    }
    const Tensor* hidden = reference.HiddenState(last);
    ASSERT_EQ(result.token_embeddings.rows, hidden->dim(0));
    ASSERT_EQ(result.token_embeddings.size(), hidden->numel());
    for (int64_t k = 0; k < hidden->numel(); ++k) {
      ASSERT_NEAR(result.token_embeddings.data[k], hidden->data()[k], 1e-4) << i << " " << k;
    }
    EXPECT_EQ(result.encoding.size(), hidden->dim(0));
  }
  EXPECT_GT(response->metadata.token_count, 0);
}

TEST_F(ServingCoreTest, EncodeRejectsAnEmptyTextNamingItsIndex) {
  EncodeRequest request;
  request.inputs = {Text("fine"), Text("")};
  absl::StatusOr<EncodeResponse> response = Wait<EncodeResponse>(&ServingCore::Encode, request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(), "inputs[1]: text is empty");
}

// A call whose cost is over a limit on its word count alone is refused before it is tokenized
// (the message says "at least"); one within the limits is still served.
TEST_F(ServingCoreTest, CallOverTheMemoryLimitIsRefusedBeforeTokenizing) {
  CoreOptions options;
  options.limits.max_inputs_per_request = 4;
  options.max_message_bytes = 1 << 30;
  options.max_request_memory_bytes = 8 << 20;
  core_ =
      std::make_unique<ServingCore>(options, registry_.get(), batcher_.get(), &budget_, &metrics_);
  std::string paragraph;
  for (int i = 0; i < 500; ++i) paragraph += "word ";
  AttentionRequest request;
  request.inputs = {Text(paragraph), Text(paragraph)};
  request.tokenization.max_length = 512;
  request.include_scores = true;
  request.include_qkv = true;
  absl::StatusOr<AttentionResponse> refused =
      Wait<AttentionResponse>(&ServingCore::AttentionMap, request);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("at least"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("--max-request-memory-bytes"), std::string::npos);

  request.inputs = {Text("a short one")};
  EXPECT_TRUE(Wait<AttentionResponse>(&ServingCore::AttentionMap, request).ok());
  // The batcher thread drops its reference to the finished job just after answering.
  for (int i = 0; i < 500 && budget_.in_flight() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(budget_.in_flight(), 0) << "a refusal or a finished call holds no budget";
}

TEST_F(ServingCoreTest, AttentionSelectsTheRequestedHeads) {
  const std::string text = "Attention maps show what each token looks at.";
  AttentionRequest request;
  request.inputs = {Text(text)};
  const std::vector<int32_t> layers = {-1};
  const std::vector<int32_t> heads = {2, 0};
  request.layers = layers;
  request.heads = heads;
  absl::StatusOr<AttentionResponse> response =
      Wait<AttentionResponse>(&ServingCore::AttentionMap, request);
  ASSERT_TRUE(response.ok()) << response.status();
  const int last = (*model_)->config().num_hidden_layers - 1;
  ForwardOptions options;
  options.pool = false;
  options.attention_layers = {last};
  const ForwardResult reference = EngineForward(text, options);
  const Tensor& probs = reference.Attention(last)->sequences[0].probs;  // (heads, T, T)
  ASSERT_EQ(response->results.size(), 1u);
  ASSERT_EQ(response->results[0].layers.size(), 1u);
  const LayerAttentionResult& layer = response->results[0].layers[0];
  EXPECT_EQ(layer.layer, last);
  const int64_t T = probs.dim(1);
  // The result views the batch's maps of every head; the response names the selected ones.
  EXPECT_EQ(response->heads, (std::vector<int>{2, 0}));
  ASSERT_NE(layer.weights, nullptr);
  ASSERT_EQ(layer.weights->shape(), probs.shape());
  for (int h : heads) {
    for (int64_t k = 0; k < T * T; ++k) {
      ASSERT_NEAR(layer.weights->data()[h * T * T + k], probs.data()[h * T * T + k], 1e-5);
    }
  }
}

TEST_F(ServingCoreTest, AttentionRejectsAHeadOutOfRange) {
  AttentionRequest request;
  request.inputs = {Text("hello")};
  const std::vector<int32_t> heads = {12};
  request.heads = heads;
  absl::StatusOr<AttentionResponse> response =
      Wait<AttentionResponse>(&ServingCore::AttentionMap, request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(), "heads[0] = 12 is outside [0, 11]");
}

TEST_F(ServingCoreTest, TokenizeGivesBertIdsAndOffsets) {
  // Ids from Hugging Face's BertTokenizerFast on this vocabulary: [CLS] hello world [SEP].
  TokenizeRequest request;
  request.inputs = {Text("Hello world")};
  absl::StatusOr<TokenizeResponse> response = core_->Tokenize(request, CallControl{});
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->results.size(), 1u);
  EXPECT_EQ(response->results[0].ids, (std::vector<int32_t>{101, 7592, 2088, 102}));
  EXPECT_EQ(response->results[0].char_start, (std::vector<int32_t>{0, 0, 6, 0}));
  EXPECT_EQ(response->results[0].char_end, (std::vector<int32_t>{0, 5, 11, 0}));
  EXPECT_EQ(response->metadata.token_count, 4);
}

TEST_F(ServingCoreTest, TokenizeRejectsTooManyInputsNamingTheLimit) {
  TokenizeRequest request;
  request.inputs.assign(5, Text("x"));
  absl::StatusOr<TokenizeResponse> response = core_->Tokenize(request, CallControl{});
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(),
            "the request has 5 inputs, more than the limit of 4 (--max-inputs-per-request); "
            "split it into several calls");
}

// The batcher starts a batch with the cheapest queued request by its admission estimate, not
// the first few-token one: a costly request of few tokens (a 512-token AttentionMap with every
// map) queued first does not go ahead of an ordinary call; costly requests still finish.
TEST_F(ServingCoreTest, BatcherStartsWithTheCheapestQueuedRequest) {
  Batcher batcher(BatcherOptions{/*max_batch_tokens=*/256, /*max_concurrent_requests=*/8,
                                 /*threads=*/0},
                  &metrics_);
  absl::Mutex mutex;
  std::vector<std::string> finished;
  auto job = [&](const std::string& name, int sequences, int tokens, int64_t cost) {
    auto j = std::make_shared<Job>();
    j->model = *model_;
    for (int i = 0; i < sequences; ++i) {
      std::vector<int32_t> ids(tokens, 2000 + i);
      ids.front() = 101;
      ids.back() = 102;
      j->sequences.push_back({ids, {}});
    }
    j->forward.pool = false;
    j->forward.hidden_layers = {(*model_)->config().num_hidden_layers};
    j->cost_bytes = cost;
    j->done = [&, name](absl::Status status, JobOutput) {
      EXPECT_TRUE(status.ok()) << name << ": " << status;
      absl::MutexLock lock(&mutex);
      finished.push_back(name);
    };
    return j;
  };
  // A blocker holds the batcher thread (its cancellation check, made when its batch starts,
  // waits) until all three are queued, so the order does not depend on when the thread wakes.
  absl::Notification blocker_started, release_blocker;
  auto blocker = job("blocker", 1, 4, 0);
  blocker->is_cancelled = [&, first = std::make_shared<bool>(true)] {
    if (std::exchange(*first, false)) {
      blocker_started.Notify();
      release_blocker.WaitForNotification();
    }
    return false;
  };
  // Released on every way out, so that a failed assertion does not leave Stop() waiting.
  absl::Cleanup release_on_exit = [&] {
    if (!release_blocker.HasBeenNotified()) release_blocker.Notify();
  };
  ASSERT_TRUE(batcher.Submit(blocker).ok());
  blocker_started.WaitForNotification();
  ASSERT_TRUE(batcher.Submit(job("costly, many tokens", 4, 256, 1'000'000'000)).ok());
  ASSERT_TRUE(batcher.Submit(job("costly, few tokens", 1, 16, 100'000'000)).ok());
  ASSERT_TRUE(batcher.Submit(job("ordinary", 1, 16, 100'000)).ok());
  std::move(release_on_exit).Invoke();
  batcher.Stop();  // finishes everything queued
  ASSERT_EQ(finished.size(), 4u);
  EXPECT_EQ(finished, (std::vector<std::string>{"blocker", "ordinary", "costly, few tokens",
                                                "costly, many tokens"}));
}

TEST_F(ServingCoreTest, UnknownVersionIsNotFound) {
  ModelInfoRequest request{"no-such-version"};
  absl::StatusOr<ModelInfo> info = core_->GetModelInfo(request, CallControl{});
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<ModelInfo> base = core_->GetModelInfo({}, CallControl{});
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->num_layers, 6);
  EXPECT_EQ(base->hidden_size, 384);
}

// Classify and Rerank against a naive reference: heads written to a real model store, the
// engine's own pooled (normalised) embedding, logits and softmax in double in plain loops.
class ClassifyRerankCoreTest : public ServingCoreTest {
 protected:
  void SetUp() override {
    ServingCoreTest::SetUp();
    store_ = std::filesystem::temp_directory_path() /
             ("attn-classify-core-" + std::to_string(::getpid()));
    std::filesystem::remove_all(store_);
    // Large weights so the probabilities differ clearly between labels and inputs.
    text_head_ = MakeClassificationHead(3, 384, HeadInit::kNormal, /*seed=*/11, 2.0f);
    // The pair feature is ~1/H per element (its sum is a cosine): larger weights again.
    pair_head_ = MakeClassificationHead(2, 384, HeadInit::kNormal, /*seed=*/12, 40.0f);
    Commit("ft-000001-text", "classification", text_head_, {"red", "green", "blue"});
    Commit("ft-000002-pair", "pair_classification", pair_head_, {});
    CoreOptions options;
    options.limits.max_inputs_per_request = 4;
    options.max_message_bytes = 64 << 20;
    options.max_request_memory_bytes = 512 << 20;
    options.model_store = store_;
    core_ = std::make_unique<ServingCore>(options, registry_.get(), batcher_.get(), &budget_,
                                          &metrics_);
  }
  void TearDown() override { std::filesystem::remove_all(store_); }

  // The version's files hold the base weights: only its head differs from base.
  void Commit(const std::string& version, const std::string& objective,
              const ClassificationHead& head, std::vector<std::string> names) {
    CheckpointInfo info;
    info.base_version = "base";
    info.objective = objective;
    info.label_names = std::move(names);
    ASSERT_TRUE(WriteCheckpoint(**model_, (*model_)->weights(), &head, info, store_, version).ok());
    ModelVersion entry;
    entry.version = version;
    entry.model = *model_;
    registry_->Add(entry);
  }

  // What a pair head reads (engine/ops/segment_product.h), in double in plain loops: the mean of
  // the last layer over each text's tokens (type 0: [CLS] a [SEP]; type 1: b [SEP]), each
  // normalised, multiplied element-wise.
  std::vector<float> PairFeature(const std::string& a, const std::string& b) {
    TruncationOptions truncation;
    truncation.max_length = (*model_)->default_max_length();
    absl::StatusOr<Encoding> encoding = (*model_)->tokenizer().EncodePair(a, b, truncation);
    EXPECT_TRUE(encoding.ok());
    ForwardOptions options = (*model_)->DefaultForwardOptions();
    const int last = (*model_)->config().num_hidden_layers;
    options.hidden_layers = {last};
    absl::StatusOr<ForwardResult> result =
        (*model_)->Forward({{encoding->ids, encoding->type_ids}}, options);
    EXPECT_TRUE(result.ok()) << result.status();
    const Tensor& hidden = *result->HiddenState(last);
    const int64_t h = hidden.dim(1);
    std::vector<double> segment[2] = {std::vector<double>(h), std::vector<double>(h)};
    double count[2] = {0, 0};
    for (size_t t = 0; t < encoding->type_ids.size(); ++t) {
      const int type = encoding->type_ids[t];
      count[type] += 1;
      for (int64_t j = 0; j < h; ++j) segment[type][j] += hidden.data()[t * h + j];
    }
    for (int s = 0; s < 2; ++s) {
      double norm = 0;
      for (double& v : segment[s]) {
        v /= count[s];
        norm += v * v;
      }
      for (double& v : segment[s]) v /= std::sqrt(norm);
    }
    std::vector<float> feature(h);
    for (int64_t j = 0; j < h; ++j) feature[j] = static_cast<float>(segment[0][j] * segment[1][j]);
    return feature;
  }

  // softmax(W e + b), in double.
  static std::vector<double> NaiveProbabilities(const ClassificationHead& head, const float* e) {
    const int64_t k = head.num_labels(), h = head.hidden_size();
    std::vector<double> logits(k);
    for (int64_t i = 0; i < k; ++i) {
      double sum = head.bias.data()[i];
      for (int64_t j = 0; j < h; ++j) sum += double{head.weight.data()[i * h + j]} * e[j];
      logits[i] = sum;
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double& l : logits) total += (l = std::exp(l - max));
    for (double& l : logits) l /= total;
    return logits;
  }

  std::string store_;
  ClassificationHead text_head_, pair_head_;
};

TEST_F(ClassifyRerankCoreTest, ClassifyEqualsTheHeadOverTheEnginesEmbedding) {
  const std::vector<std::string> texts = {"a red apple", "Green fields under a blue sky."};
  ClassifyRequest request;
  request.model_version = "ft-000001-text";
  for (const std::string& text : texts) request.inputs.push_back(Text(text));
  absl::StatusOr<ClassifyResponse> response =
      Wait<ClassifyResponse>(&ServingCore::Classify, request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->results.size(), texts.size());
  const std::vector<std::string> names = {"red", "green", "blue"};
  for (size_t i = 0; i < texts.size(); ++i) {
    const ForwardResult forward = EngineForward(texts[i], (*model_)->DefaultForwardOptions());
    const std::vector<double> expected = NaiveProbabilities(text_head_, forward.pooled.data());
    const std::vector<LabelScore>& labels = response->results[i];
    ASSERT_EQ(labels.size(), 3u);
    for (size_t rank = 0; rank < labels.size(); ++rank) {
      EXPECT_NEAR(labels[rank].probability, expected[labels[rank].label], 1e-5);
      EXPECT_EQ(labels[rank].name, names[labels[rank].label]);
      if (rank > 0) EXPECT_GE(labels[rank - 1].probability, labels[rank].probability);
    }
    EXPECT_EQ(labels[0].label,
              std::max_element(expected.begin(), expected.end()) - expected.begin());
  }
  // Errors a client can act on.
  request.model_version = "base";
  absl::StatusOr<ClassifyResponse> refused =
      Wait<ClassifyResponse>(&ServingCore::Classify, request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "version base has no classification"))
      << refused.status();
  request.model_version = "ft-000001-text";
  request.top_k = -1;
  refused = Wait<ClassifyResponse>(&ServingCore::Classify, request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "top_k is -1; give 0 (every label) or a positive count");
}

TEST_F(ClassifyRerankCoreTest, RerankScoresAreCosinesOrThePairHeadsProbability) {
  const std::string query = "where can I buy a kettle";
  const std::vector<std::string> documents = {"Electric kettles on sale.", "The history of Rome.",
                                              "Tea and kettles."};
  RerankRequest request;
  request.query = query;
  for (const std::string& d : documents) request.documents.push_back(d);
  request.model_version = "ft-000001-text";  // a text head: cosine by default
  request.return_documents = true;
  absl::StatusOr<RerankResponse> cosine = Wait<RerankResponse>(&ServingCore::Rerank, request);
  ASSERT_TRUE(cosine.ok()) << cosine.status();
  EXPECT_EQ(cosine->method, RerankMethod::kCosine);
  const ForwardResult q = EngineForward(query, (*model_)->DefaultForwardOptions());
  ASSERT_EQ(cosine->results.size(), documents.size());
  for (size_t rank = 0; rank < documents.size(); ++rank) {
    const RerankResult& r = cosine->results[rank];
    const ForwardResult d = EngineForward(documents[r.index], (*model_)->DefaultForwardOptions());
    double dot = 0;
    for (int64_t j = 0; j < q.pooled.numel(); ++j)
      dot += double{q.pooled.data()[j]} * d.pooled.data()[j];
    EXPECT_NEAR(r.score, dot, 1e-5);
    EXPECT_EQ(r.document, documents[r.index]);
    if (rank > 0) EXPECT_GE(cosine->results[rank - 1].score, r.score);
  }
  EXPECT_EQ(cosine->results[0].index, 0) << "the kettle sale is the closest";

  request.model_version = "ft-000002-pair";  // a pair head: cross-encoder by default
  request.top_n = 2;
  absl::StatusOr<RerankResponse> cross = Wait<RerankResponse>(&ServingCore::Rerank, request);
  ASSERT_TRUE(cross.ok()) << cross.status();
  EXPECT_EQ(cross->method, RerankMethod::kCrossEncoder);
  ASSERT_EQ(cross->results.size(), 2u);
  std::vector<double> expected;
  for (const std::string& d : documents) {
    expected.push_back(NaiveProbabilities(pair_head_, PairFeature(query, d).data())[1]);
  }
  for (const RerankResult& r : cross->results) EXPECT_NEAR(r.score, expected[r.index], 1e-5);
  EXPECT_EQ(cross->results[0].index,
            std::max_element(expected.begin(), expected.end()) - expected.begin());

  // What each refusal says.
  auto refused = [&](RerankRequest bad) {
    absl::StatusOr<RerankResponse> r = Wait<RerankResponse>(&ServingCore::Rerank, bad);
    EXPECT_FALSE(r.ok());
    return r.status();
  };
  RerankRequest bad = request;
  bad.method = RerankMethod::kCrossEncoder;
  bad.model_version = "ft-000001-text";
  EXPECT_EQ(refused(bad).code(), absl::StatusCode::kFailedPrecondition);
  bad.model_version = "base";
  EXPECT_EQ(refused(bad).code(), absl::StatusCode::kFailedPrecondition);
  bad = request;
  bad.method = static_cast<RerankMethod>(7);
  EXPECT_EQ(refused(bad).message(), "method: unknown value 7");
  bad = request;
  bad.documents.push_back("one too many");  // 4 documents + the query > 4 inputs
  EXPECT_EQ(refused(bad).message(),
            "the request has 4 documents; send 1 to 3 (--max-inputs-per-request less one for the "
            "query) per call");
  bad = request;
  bad.documents[1] = "";
  EXPECT_EQ(refused(bad).message(), "documents[1] is empty");
  bad = request;
  bad.query = "";
  EXPECT_EQ(refused(bad).message(), "query is empty");
  bad = request;
  bad.top_n = -2;
  EXPECT_EQ(refused(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attn::server::core
