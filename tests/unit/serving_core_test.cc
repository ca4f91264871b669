// The serving core's calls (server/core/serving_core.h) with the real model and no server: each
// call's result against the engine run directly on the same inputs, and one error per call with
// the message a client gets.
#include "server/core/serving_core.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  // Four 256-token chunks keep the engine busy while the other two are queued behind them.
  ASSERT_TRUE(batcher.Submit(job("costly, many tokens", 4, 256, 1'000'000'000)).ok());
  ASSERT_TRUE(batcher.Submit(job("costly, few tokens", 1, 16, 100'000'000)).ok());
  ASSERT_TRUE(batcher.Submit(job("ordinary", 1, 16, 100'000)).ok());
  batcher.Stop();  // finishes everything queued
  ASSERT_EQ(finished.size(), 3u);
  EXPECT_EQ(finished,
            (std::vector<std::string>{"ordinary", "costly, few tokens", "costly, many tokens"}));
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

}  // namespace
}  // namespace attn::server::core
