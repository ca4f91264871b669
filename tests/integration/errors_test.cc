// Bad requests get the right gRPC code and a message that names the input and the limit; after
// every one of them the server still serves. The shared server runs with small limits
// (16 inputs per request, 1 MiB messages, 4 admitted requests) so the limits are cheap to hit.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>

#include "tests/integration/harness.h"

namespace attn::integration {

constexpr int kMaxInputs = 16;
constexpr int kMaxMessageBytes = 1 << 20;
constexpr int kMaxConcurrent = 4;

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--max_inputs_per_request=" + std::to_string(kMaxInputs),
                                  "--max_message_bytes=" + std::to_string(kMaxMessageBytes),
                                  "--max_concurrent_requests=" + std::to_string(kMaxConcurrent)};
}

namespace {

class ErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  // Every test ends by proving the server survived it.
  void TearDown() override { ExpectStillServing(); }

  static void ExpectStillServing() {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("still serving after a bad request");
    pb::EncodeResponse response;
    const grpc::Status status = Encode(request, &response);
    EXPECT_TRUE(status.ok()) << "server not serving after the test: " << StatusString(status);
    EXPECT_EQ(response.results_size(), 1);
    grpc::ClientContext context;
    pb::ModelInfo info;
    EXPECT_TRUE(stub_->GetModelInfo(&context, pb::GetModelInfoRequest(), &info).ok());
  }

  static grpc::Status Encode(const pb::EncodeRequest& request, pb::EncodeResponse* response,
                             std::chrono::milliseconds timeout = ScaledSeconds(60)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    return stub_->Encode(&context, request, response);
  }
  static grpc::Status Attention(const pb::AttentionMapRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    pb::AttentionMapResponse response;
    return stub_->AttentionMap(&context, request, &response);
  }

  static pb::Encoder::Stub* stub_;
};
pb::Encoder::Stub* ErrorsTest::stub_ = nullptr;

// Asserts the code and that the message contains every one of `parts`.
void ExpectError(const grpc::Status& status, grpc::StatusCode code,
                 const std::vector<std::string>& parts, const std::string& what) {
  EXPECT_EQ(status.error_code(), code)
      << what << ": expected " << CodeName(code) << ", got " << StatusString(status);
  for (const std::string& part : parts) {
    EXPECT_NE(status.error_message().find(part), std::string::npos)
        << what << ": message should mention '" << part << "': " << StatusString(status);
  }
}

pb::EncodeRequest TextRequest(const std::vector<std::string>& texts) {
  pb::EncodeRequest request;
  for (const std::string& text : texts) request.add_inputs()->set_text(text);
  return request;
}

TEST_F(ErrorsTest, EmptyRequest) {
  pb::EncodeResponse response;
  ExpectError(Encode(pb::EncodeRequest(), &response), grpc::INVALID_ARGUMENT, {"inputs"},
              "Encode without inputs");
  ExpectError(Attention(pb::AttentionMapRequest()), grpc::INVALID_ARGUMENT, {"inputs"},
              "AttentionMap without inputs");
}

TEST_F(ErrorsTest, EmptyText) {
  pb::EncodeResponse response;
  ExpectError(Encode(TextRequest({"first", "second", ""}), &response), grpc::INVALID_ARGUMENT,
              {"inputs[2]", "empty"}, "empty text at index 2");
  pb::EncodeRequest pair;
  pair.add_inputs()->set_text("fine");
  pair.add_inputs()->mutable_pair()->set_first("");
  pair.mutable_inputs(1)->mutable_pair()->set_second("second half");
  ExpectError(Encode(pair, &response), grpc::INVALID_ARGUMENT, {"inputs[1]"},
              "pair with an empty first text");
  pb::EncodeRequest no_kind;
  no_kind.add_inputs();  // oneof not set
  ExpectError(Encode(no_kind, &response), grpc::INVALID_ARGUMENT, {"inputs[0]"},
              "input with neither text, pair nor tokens");
}

TEST_F(ErrorsTest, TooLongWithTruncationNone) {
  pb::EncodeRequest request = TextRequest({TextOfTokens(600)});
  request.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
  pb::EncodeResponse response;
  ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT, {"inputs[0]", "600", "256"},
              "600 tokens, default max_length 256, TRUNCATION_NONE");

  request.mutable_tokenization()->set_max_length(512);
  ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT, {"inputs[0]", "600", "512"},
              "600 tokens, max_length 512, TRUNCATION_NONE");

  // The same text is fine with (default) truncation.
  request.mutable_tokenization()->set_truncation(pb::TRUNCATION_UNSPECIFIED);
  request.mutable_tokenization()->set_max_length(0);
  const grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_TRUE(response.results(0).truncated());
  EXPECT_EQ(response.results(0).untruncated_length(), 600);
  EXPECT_EQ(response.results(0).tokens_size(), 256);

  pb::AttentionMapRequest attention;
  attention.add_inputs()->set_text("short");
  attention.add_inputs()->set_text(TextOfTokens(300));
  attention.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
  ExpectError(Attention(attention), grpc::INVALID_ARGUMENT, {"inputs[1]", "300", "256"},
              "AttentionMap: 300 tokens, TRUNCATION_NONE");
}

TEST_F(ErrorsTest, MaxLengthBeyondPositionTable) {
  pb::EncodeRequest request = TextRequest({"hello"});
  request.mutable_tokenization()->set_max_length(1000);
  pb::EncodeResponse response;
  ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT, {"1000", "512"},
              "max_length 1000 > max_position_embeddings 512");
  request.mutable_tokenization()->set_max_length(-5);
  ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT, {"-5"}, "negative max_length");
}

TEST_F(ErrorsTest, InvalidTokenIds) {
  for (int bad : {-1, kVocabSize}) {
    pb::EncodeRequest request = TextRequest({"a valid text first"});
    pb::TokenIds* tokens = request.add_inputs()->mutable_tokens();
    for (int id : {101, 2023, bad, 102}) tokens->add_ids(id);
    pb::EncodeResponse response;
    ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT,
                {"inputs[1]", std::to_string(bad), std::to_string(kVocabSize)},
                "token id " + std::to_string(bad));
  }
  pb::EncodeRequest types;
  pb::TokenIds* tokens = types.add_inputs()->mutable_tokens();
  for (int id : {101, 2023, 102}) tokens->add_ids(id);
  for (int type : {0, 2, 0}) tokens->add_type_ids(type);
  pb::EncodeResponse response;
  ExpectError(Encode(types, &response), grpc::INVALID_ARGUMENT, {"inputs[0]", "2"},
              "type id 2 with type_vocab_size 2");
  tokens->clear_type_ids();
  tokens->add_type_ids(0);
  ExpectError(Encode(types, &response), grpc::INVALID_ARGUMENT, {"inputs[0]"},
              "1 type id for 3 ids");
  pb::EncodeRequest empty;
  empty.add_inputs()->mutable_tokens();
  ExpectError(Encode(empty, &response), grpc::INVALID_ARGUMENT, {"inputs[0]"}, "no token ids");
  pb::EncodeRequest too_long;
  pb::TokenIds* long_ids = too_long.add_inputs()->mutable_tokens();
  for (int i = 0; i < 513; ++i) long_ids->add_ids(1000);
  ExpectError(Encode(too_long, &response), grpc::INVALID_ARGUMENT, {"inputs[0]", "513", "512"},
              "513 token ids, more than the 512 positions");
}

TEST_F(ErrorsTest, LayerOutOfRange) {
  pb::EncodeResponse response;
  for (int layer : {7, -8}) {
    pb::EncodeRequest request = TextRequest({"layers"});
    request.add_hidden_layers(layer);
    ExpectError(Encode(request, &response), grpc::INVALID_ARGUMENT, {std::to_string(layer)},
                "Encode hidden_layers " + std::to_string(layer));
  }
  pb::EncodeRequest duplicate = TextRequest({"layers"});
  duplicate.add_hidden_layers(-1);
  duplicate.add_hidden_layers(6);
  ExpectError(Encode(duplicate, &response), grpc::INVALID_ARGUMENT, {}, "hidden_layers -1 and 6");

  for (int layer : {6, -7}) {
    pb::AttentionMapRequest request;
    request.add_inputs()->set_text("layers");
    request.add_layers(layer);
    ExpectError(Attention(request), grpc::INVALID_ARGUMENT, {"layer", std::to_string(layer)},
                "AttentionMap layers " + std::to_string(layer));
  }
}

TEST_F(ErrorsTest, HeadOutOfRange) {
  for (int head : {12, 13, -1}) {
    pb::AttentionMapRequest request;
    request.add_inputs()->set_text("heads");
    request.add_heads(head);
    ExpectError(Attention(request), grpc::INVALID_ARGUMENT, {"head", std::to_string(head)},
                "AttentionMap heads " + std::to_string(head));
  }
  pb::AttentionMapRequest duplicate;
  duplicate.add_inputs()->set_text("heads");
  duplicate.add_heads(3);
  duplicate.add_heads(3);
  ExpectError(Attention(duplicate), grpc::INVALID_ARGUMENT, {"head"}, "heads 3 and 3");
  pb::AttentionMapRequest negative_top_k;
  negative_top_k.add_inputs()->set_text("heads");
  negative_top_k.set_top_k(-1);
  ExpectError(Attention(negative_top_k), grpc::INVALID_ARGUMENT, {"top_k"}, "top_k -1");
}

TEST_F(ErrorsTest, TooManyInputs) {
  std::vector<std::string> texts(kMaxInputs + 1, "one of many");
  pb::EncodeResponse response;
  ExpectError(Encode(TextRequest(texts), &response), grpc::INVALID_ARGUMENT,
              {std::to_string(kMaxInputs + 1), std::to_string(kMaxInputs)},
              "17 inputs with --max_inputs_per_request=16");
  texts.pop_back();
  const grpc::Status status = Encode(TextRequest(texts), &response);
  EXPECT_TRUE(status.ok()) << "exactly the limit: " << StatusString(status);
  EXPECT_EQ(response.results_size(), kMaxInputs);
}

TEST_F(ErrorsTest, UnknownModelVersion) {
  pb::EncodeRequest request = TextRequest({"versions"});
  request.set_model_version("v999");
  pb::EncodeResponse response;
  ExpectError(Encode(request, &response), grpc::NOT_FOUND, {"v999", "base"}, "Encode v999");

  pb::AttentionMapRequest attention;
  attention.add_inputs()->set_text("versions");
  attention.set_model_version("v999");
  ExpectError(Attention(attention), grpc::NOT_FOUND, {"v999", "base"}, "AttentionMap v999");

  grpc::ClientContext context;
  pb::GetModelInfoRequest info_request;
  info_request.set_model_version("v999");
  pb::ModelInfo info;
  ExpectError(stub_->GetModelInfo(&context, info_request, &info), grpc::NOT_FOUND, {"v999", "base"},
              "GetModelInfo v999");
}

// proto3 enums are open: a client can send any int. The server must not treat it as a default.
TEST_F(ErrorsTest, UnknownEnumValues) {
  pb::EncodeResponse response;
  pb::EncodeRequest pooling = TextRequest({"enums"});
  pooling.set_pooling(static_cast<pb::Pooling>(99));
  ExpectError(Encode(pooling, &response), grpc::INVALID_ARGUMENT, {"99"}, "pooling 99");

  pb::EncodeRequest dtype = TextRequest({"enums"});
  dtype.set_output_dtype(static_cast<pb::DType>(99));
  ExpectError(Encode(dtype, &response), grpc::INVALID_ARGUMENT, {"99"}, "output_dtype 99");

  pb::EncodeRequest truncation = TextRequest({"enums"});
  truncation.mutable_tokenization()->set_truncation(static_cast<pb::Truncation>(99));
  ExpectError(Encode(truncation, &response), grpc::INVALID_ARGUMENT, {"99"}, "truncation 99");
}

// Requests and responses over --max_message_bytes get RESOURCE_EXHAUSTED with a message that
// names the limit and the flag that raises it.
TEST_F(ErrorsTest, MessageOverSizeLimit) {
  pb::EncodeRequest request = TextRequest({std::string(2 * kMaxMessageBytes, 'a')});
  pb::EncodeResponse response;
  grpc::Status status = Encode(request, &response);
  ExpectError(status, grpc::RESOURCE_EXHAUSTED, {std::to_string(kMaxMessageBytes), "max"},
              "2 MiB request with --max_message_bytes=1048576");
  EXPECT_TRUE(status.error_message().find("max-message-bytes") != std::string::npos ||
              status.error_message().find("max_message_bytes") != std::string::npos)
      << "the message should name the flag that raises the limit: " << StatusString(status);
  std::printf("[info] 2 MiB request -> %s\n", StatusString(status).c_str());

  // Far over the limit, gRPC's own transport limit answers before the handler runs.
  request = TextRequest({std::string(4 * kMaxMessageBytes, 'a')});
  status = Encode(request, &response);
  EXPECT_EQ(status.error_code(), grpc::RESOURCE_EXHAUSTED) << StatusString(status);
  std::printf("[info] 4 MiB request -> %s\n", StatusString(status).c_str());

  // A response over the limit (all 6 x 12 attention maps of 256 tokens: 18 MiB of float32).
  pb::AttentionMapRequest attention;
  attention.add_inputs()->set_text(TextOfTokens(256));
  status = Attention(attention);
  ExpectError(status, grpc::RESOURCE_EXHAUSTED, {std::to_string(kMaxMessageBytes)},
              "18 MiB AttentionMap response with --max_message_bytes=1048576");
  std::printf("[info] 18 MiB response -> %s\n", StatusString(status).c_str());

  // Under the limit is accepted (and truncated to 256 tokens).
  std::string text;
  while (text.size() < kMaxMessageBytes / 2) text += "lorem ipsum dolor sit amet ";
  const grpc::Status under = Encode(TextRequest({text}), &response);
  EXPECT_TRUE(under.ok()) << "half a MiB request: " << StatusString(under);
}

TEST_F(ErrorsTest, DeadlineAlreadyExpired) {
  for (auto offset : {std::chrono::microseconds(1), std::chrono::microseconds(-1000000)}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + offset);
    pb::EncodeResponse response;
    const grpc::Status status = stub_->Encode(&context, TextRequest({"too late"}), &response);
    EXPECT_EQ(status.error_code(), grpc::DEADLINE_EXCEEDED)
        << "deadline now + " << offset.count() << " us: " << StatusString(status);
  }
}

// Runs `probe` (a short request) once a long batch (8 x 512 tokens, ~180 GFLOP: seconds here,
// well over 100 ms on any CPU) is running, so the probe waits in the queue
// behind it. "Running" is observed, not assumed: the batcher records a request's queue time
// (attnserve_queue_duration_seconds_count) when its batch starts. The probe's status.
grpc::Status BehindLongBatch(pb::Encoder::Stub* stub, const std::function<grpc::Status()>& probe) {
  const double started_before = ScrapeSum(SharedServer(), "attnserve_queue_duration_seconds_count");
  EXPECT_EQ(ScrapeSum(SharedServer(), "attnserve_queue_depth"), 0) << "the server is not idle";
  grpc::Status heavy_status;
  std::thread heavy([&] {
    pb::EncodeRequest request;
    for (int i = 0; i < 8; ++i) request.add_inputs()->set_text(TextOfTokens(512, i));
    request.mutable_tokenization()->set_max_length(512);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    heavy_status = stub->Encode(&context, request, &response);
  });
  const bool started = WaitFor(
      [&] {
        return ScrapeSum(SharedServer(), "attnserve_queue_duration_seconds_count") > started_before;
      },
      ScaledSeconds(30));
  EXPECT_TRUE(started) << "the long batch never started";
  const grpc::Status status = probe();
  heavy.join();
  EXPECT_TRUE(heavy_status.ok()) << StatusString(heavy_status);
  return status;
}

// The batcher counts a dropped entry when it reaches it: poll for a little while.
void ExpectDroppedIncrease(const std::string& reason, double before) {
  double dropped = before;
  Metrics metrics;
  WaitFor(
      [&] {
        metrics = ScrapeOrFail(SharedServer());
        dropped = metrics.Sum("attnserve_dropped_requests_total", {{"reason", reason}});
        return dropped > before;
      },
      ScaledSeconds(5));
  std::string all;
  for (const MetricSample& sample : metrics.samples()) {
    if (sample.name != "attnserve_dropped_requests_total") continue;
    for (const auto& [key, value] : sample.labels) all += key + "=" + value + " ";
    all += std::to_string(sample.value) + "; ";
  }
  EXPECT_EQ(dropped, before + 1) << "attnserve_dropped_requests_total{reason=\"" << reason
                                 << "\"} should count the dropped request once; all samples: "
                                 << (all.empty() ? "none" : all);
}

// A request whose deadline passes while it waits behind a long batch is dropped (not
// computed): DEADLINE_EXCEEDED, and counted in attnserve_dropped_requests_total.
TEST_F(ErrorsTest, DeadlineExpiresInQueue) {
  const double before = ScrapeOrFail(SharedServer())
                            .Sum("attnserve_dropped_requests_total", {{"reason", "deadline"}});
  const grpc::Status status = BehindLongBatch(stub_, [] {
    pb::EncodeResponse response;
    return Encode(TextRequest({"queued behind a long batch"}), &response, ScaledMilliseconds(50));
  });
  EXPECT_EQ(status.error_code(), grpc::DEADLINE_EXCEEDED) << StatusString(status);
  ExpectDroppedIncrease("deadline", before);
}

// Same for a request the client cancels while it is queued.
TEST_F(ErrorsTest, CancelledInQueue) {
  const double before = ScrapeOrFail(SharedServer())
                            .Sum("attnserve_dropped_requests_total", {{"reason", "cancelled"}});
  const grpc::Status status = BehindLongBatch(stub_, [] {
    grpc::ClientContext context;
    std::thread canceller([&] {
      // Cancel once the probe is admitted (queued behind the running long batch).
      EXPECT_TRUE(WaitFor([] { return ScrapeSum(SharedServer(), "attnserve_queue_depth") >= 2; },
                          ScaledSeconds(30)))
          << "the probe was never admitted";
      context.TryCancel();
    });
    pb::EncodeResponse response;
    const grpc::Status result =
        stub_->Encode(&context, TextRequest({"cancelled while queued"}), &response);
    canceller.join();
    return result;
  });
  EXPECT_EQ(status.error_code(), grpc::CANCELLED) << StatusString(status);
  ExpectDroppedIncrease("cancelled", before);
}

// More concurrent requests than --max_concurrent_requests: the excess gets RESOURCE_EXHAUSTED
// (retry later), the admitted ones complete.
TEST_F(ErrorsTest, QueueFullIsResourceExhausted) {
  constexpr int kClients = 12;
  std::vector<grpc::Status> statuses(kClients);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      pb::EncodeRequest request;
      for (int k = 0; k < 4; ++k) request.add_inputs()->set_text(TextOfTokens(200, i * 4 + k));
      ++ready;
      while (ready < kClients) std::this_thread::yield();
      pb::EncodeResponse response;
      statuses[i] = Encode(request, &response);
    });
  }
  for (std::thread& t : threads) t.join();
  std::map<std::string, int> codes;
  for (const grpc::Status& status : statuses) {
    ++codes[CodeName(status.error_code())];
    if (status.error_code() == grpc::RESOURCE_EXHAUSTED) {
      EXPECT_FALSE(status.error_message().empty());
    } else {
      EXPECT_TRUE(status.ok()) << StatusString(status);
    }
  }
  std::string summary;
  for (const auto& [code, count] : codes) summary += code + " x" + std::to_string(count) + " ";
  std::printf("[info] %d concurrent requests, limit %d: %s\n", kClients, kMaxConcurrent,
              summary.c_str());
  EXPECT_GE(codes["RESOURCE_EXHAUSTED"], 1) << summary;
  EXPECT_GE(codes["OK"], 1) << summary;
}

}  // namespace
}  // namespace attn::integration
