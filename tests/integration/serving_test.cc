// Serving behaviour of the real server: the dynamic batcher under 64 concurrent clients, the
// Prometheus metrics it exposes, and a real Prometheus server scraping them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--log_level=info"};
}

namespace {

class ServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  static grpc::Status Encode(pb::Encoder::Stub* stub, const pb::EncodeRequest& request,
                             pb::EncodeResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    return stub->Encode(&context, request, response);
  }

  // Waits (up to 5 s) until `done` holds for a fresh scrape: the server may update metrics just
  // after sending the response.
  static Metrics ScrapeUntil(const std::function<bool(const Metrics&)>& done) {
    Metrics metrics;
    WaitFor(
        [&] {
          metrics = ScrapeOrFail(SharedServer());
          return done(metrics);
        },
        ScaledSeconds(5));
    return metrics;
  }

  static pb::Encoder::Stub* stub_;
};
pb::Encoder::Stub* ServingTest::stub_ = nullptr;

using Labels = std::map<std::string, std::string>;

// 64 clients, one input each, all at once: the batcher merges them, and each client still gets
// exactly what a serial call returns.
TEST_F(ServingTest, ConcurrentClientsGetSerialResultsAndAreBatched) {
  constexpr int kClients = 64;
  std::vector<pb::EncodeRequest> requests(kClients);
  for (int i = 0; i < kClients; ++i) {
    requests[i].add_inputs()->set_text(TextOfTokens(6 + (i * 7) % 50, i));
    requests[i].set_return_token_embeddings(true);
  }
  std::vector<pb::EncodeResponse> serial(kClients);
  for (int i = 0; i < kClients; ++i) {
    const grpc::Status status = Encode(stub_, requests[i], &serial[i]);
    ASSERT_TRUE(status.ok()) << "serial " << i << ": " << StatusString(status);
  }

  const Metrics before = ScrapeOrFail(SharedServer());
  std::vector<pb::EncodeResponse> concurrent(kClients);
  std::vector<grpc::Status> statuses(kClients);
  std::shared_ptr<grpc::Channel> channel = SharedServer().NewChannel();
  std::atomic<int> waiting{kClients};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto stub = pb::Encoder::NewStub(channel);
      --waiting;
      while (waiting > 0) std::this_thread::yield();  // start together
      statuses[i] = Encode(stub.get(), requests[i], &concurrent[i]);
    });
  }
  for (std::thread& t : threads) t.join();

  int identical = 0;
  int max_batch_inputs = 0;
  double worst = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << "client " << i << ": " << StatusString(statuses[i]);
    ASSERT_EQ(concurrent[i].results_size(), 1);
    const pb::EncodeResult& a = serial[i].results(0);
    const pb::EncodeResult& b = concurrent[i].results(0);
    ASSERT_EQ(a.tokens_size(), b.tokens_size()) << "client " << i;
    const std::vector<float> pooled_a(a.embedding().begin(), a.embedding().end());
    const std::vector<float> pooled_b(b.embedding().begin(), b.embedding().end());
    const double error = std::max(
        MaxAbsDiff(pooled_a, pooled_b),
        MaxAbsDiff(DecodeOrFail(a.token_embeddings()), DecodeOrFail(b.token_embeddings())));
    EXPECT_LE(error, 1e-5) << "client " << i << " differs from its serial result";
    worst = std::max(worst, error);
    if (a.SerializeAsString() == b.SerializeAsString()) ++identical;
    max_batch_inputs = std::max(max_batch_inputs, concurrent[i].metadata().batch_inputs());
  }
  std::printf(
      "[info] %d/%d results bitwise identical to serial, worst difference %.3g, largest "
      "metadata.batch_inputs %d\n",
      identical, kClients, worst, max_batch_inputs);
  EXPECT_GT(max_batch_inputs, 1) << "no response reports a merged batch";

  // The batch size histogram saw batches of more than one input.
  const double count_before = before.Sum("attnserve_batch_size_count");
  const double sum_before = before.Sum("attnserve_batch_size_sum");
  const Metrics after = ScrapeUntil(
      [&](const Metrics& m) { return m.Sum("attnserve_batch_size_sum") - sum_before >= kClients; });
  const double batches = after.Sum("attnserve_batch_size_count") - count_before;
  const double inputs = after.Sum("attnserve_batch_size_sum") - sum_before;
  std::printf("[info] concurrent phase: %.0f engine batches for %.0f inputs\n", batches, inputs);
  EXPECT_GE(inputs, kClients);
  EXPECT_GT(batches, 0);
  EXPECT_GT(inputs, batches) << "attnserve_batch_size: sum should exceed count (batches > 1)";
  const double singles = after.Sum("attnserve_batch_size_bucket", {{"le", "1"}}) -
                         before.Sum("attnserve_batch_size_bucket", {{"le", "1"}});
  if (after.Has("attnserve_batch_size_bucket", {{"le", "1"}})) {
    EXPECT_LT(singles, batches) << "every batch had size <= 1";
  }
}

TEST_F(ServingTest, RequestCountersAndHistogramsCountExactly) {
  constexpr int kCalls = 5;
  const Labels encode_ok = {{"method", "Encode"}, {"code", "OK"}};
  const Labels encode_invalid = {{"method", "Encode"}, {"code", "INVALID_ARGUMENT"}};
  const Labels encode = {{"method", "Encode"}};
  const Metrics before = ScrapeOrFail(SharedServer());

  int64_t tokens = 0;
  for (int i = 0; i < kCalls; ++i) {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("counting request number " + std::to_string(i));
    request.add_inputs()->set_text(TextOfTokens(10 + i, i));
    pb::EncodeResponse response;
    const grpc::Status status = Encode(stub_, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    tokens += response.metadata().token_count();
  }
  pb::EncodeResponse response;
  ASSERT_EQ(Encode(stub_, pb::EncodeRequest(), &response).error_code(), grpc::INVALID_ARGUMENT);
  grpc::ClientContext context;
  pb::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, pb::GetModelInfoRequest(), &info).ok());

  const double ok_before = before.Sum("attnserve_requests_total", encode_ok);
  const Metrics after = ScrapeUntil([&](const Metrics& m) {
    return m.Sum("attnserve_requests_total", encode_ok) - ok_before >= kCalls &&
           m.Sum("attnserve_request_duration_seconds_count", encode) -
                   before.Sum("attnserve_request_duration_seconds_count", encode) >=
               kCalls &&
           m.Sum("attnserve_requests_total", {{"method", "GetModelInfo"}}) >
               before.Sum("attnserve_requests_total", {{"method", "GetModelInfo"}});
  });
  auto delta = [&](const std::string& name, const Labels& labels = {}) {
    return after.Sum(name, labels) - before.Sum(name, labels);
  };
  EXPECT_EQ(delta("attnserve_requests_total", encode_ok), kCalls);
  EXPECT_EQ(delta("attnserve_requests_total", encode_invalid), 1);
  EXPECT_EQ(delta("attnserve_requests_total", {{"method", "GetModelInfo"}, {"code", "OK"}}), 1);
  // The duration histogram counts every Encode call (OK or not); a count of only the OK ones
  // would be kCalls.
  const double durations = delta("attnserve_request_duration_seconds_count", encode);
  EXPECT_TRUE(durations == kCalls || durations == kCalls + 1) << durations;
  EXPECT_GT(delta("attnserve_request_duration_seconds_sum", encode), 0);
  EXPECT_EQ(
      delta("attnserve_request_duration_seconds_bucket", {{"method", "Encode"}, {"le", "+Inf"}}),
      durations);
  EXPECT_EQ(delta("attnserve_tokens_total"), tokens) << "tokens of the " << kCalls << " calls";
  for (const char* histogram :
       {"attnserve_queue_duration_seconds", "attnserve_tokenization_duration_seconds",
        "attnserve_inference_duration_seconds", "attnserve_batch_tokens"}) {
    EXPECT_GE(delta(std::string(histogram) + "_count"), 1) << histogram;
    EXPECT_TRUE(after.Has(std::string(histogram) + "_bucket", {{"le", "+Inf"}})) << histogram;
  }
  EXPECT_GE(delta("attnserve_batch_tokens_sum"), tokens);
  EXPECT_TRUE(after.Has("attnserve_queue_depth"));
  EXPECT_EQ(after.Sum("attnserve_queue_depth"), 0) << "idle server";
  EXPECT_EQ(after.Sum("attnserve_model_info", {{"version", "base"}}), 1);
}

// Debian's `prometheus` scrapes the metrics endpoint and answers a query over its HTTP API.
TEST_F(ServingTest, RealPrometheusScrapes) {
  std::string prometheus;
  ASSERT_TRUE(FindOnPath("prometheus", &prometheus))
      << "the `prometheus` binary is not on PATH: run scripts/setup.sh (it installs Debian's "
         "prometheus package)";
  for (int i = 0; i < 3; ++i) {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("scraped by prometheus");
    pb::EncodeResponse response;
    ASSERT_TRUE(Encode(stub_, request, &response).ok());
  }

  Subprocess server("prometheus");
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  const std::string config = server.dir() + "/prometheus.yml";
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n  - job_name: attnserve\n    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << SharedServer().metrics_port() << "']\n";
  }
  std::string error;
  ASSERT_TRUE(server.Start(
      {prometheus, "--config.file=" + config, "--storage.tsdb.path=" + server.dir() + "/data",
       "--web.listen-address=127.0.0.1:" + std::to_string(port)},
      &error))
      << error;

  const auto deadline = std::chrono::steady_clock::now() + ScaledSeconds(30);
  double best = 0;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline && best <= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(server.Running()) << "prometheus " << server.ExitDescription() << "\n"
                                  << server.LogTail();
    HttpResponse response;
    if (!HttpGet(port, "/api/v1/query?query=attnserve_requests_total", &response, &error)) {
      last = error;
      continue;
    }
    last = "HTTP " + std::to_string(response.status) + ": " + response.body.substr(0, 2000);
    const nlohmann::json reply = nlohmann::json::parse(response.body, nullptr, false);
    if (reply.is_discarded() || reply.value("status", "") != "success") continue;
    for (const nlohmann::json& series : reply["data"]["result"]) {
      // Instant vector entries: {"metric": {...}, "value": [time, "string value"]}.
      best = std::max(best, std::atof(series["value"][1].get<std::string>().c_str()));
    }
  }
  if (best <= 0) {
    HttpResponse targets;
    std::string targets_error;
    HttpGet(port, "/api/v1/targets", &targets, &targets_error);
    ADD_FAILURE() << "no attnserve_requests_total > 0 in Prometheus after 30 s; last answer: "
                  << last << "\ntargets: " << targets.body << targets_error
                  << "\n--- prometheus log ---\n"
                  << server.LogTail(6000);
  }
  std::printf("[info] Prometheus sees attnserve_requests_total up to %.0f\n", best);
  server.Stop(ScaledSeconds(10));
}

}  // namespace
}  // namespace attn::integration
