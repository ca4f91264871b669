// Overload: with --max-concurrent-requests 2, a burst beyond the limit gets RESOURCE_EXHAUSTED at
// once (not a timeout, not a queue wait), the server serves the next request as soon as a slot is
// free, health stays SERVING, and attnserve_requests_total counts every reject.
//
// Timings are printed for information only; what is asserted is ordering (the rejects are all
// answered while the admitted requests are still computing) and counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

constexpr int kMaxConcurrent = 2;

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--max_concurrent_requests=" + std::to_string(kMaxConcurrent)};
}

namespace {

using Clock = std::chrono::steady_clock;
using reliability::ExpectStatus;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A request that keeps the engine busy for a while: 8 inputs of 512 tokens.
pb::EncodeRequest HeavyRequest(int seed) {
  pb::EncodeRequest request;
  for (int i = 0; i < 8; ++i) request.add_inputs()->set_text(TextOfTokens(512, seed * 8 + i));
  request.mutable_tokenization()->set_max_length(512);
  return request;
}

// Long enough (4 x 128 tokens) that concurrent calls overlap.
pb::EncodeRequest MediumRequest(int seed) {
  pb::EncodeRequest request;
  for (int i = 0; i < 4; ++i) request.add_inputs()->set_text(TextOfTokens(128, seed * 4 + i));
  return request;
}

pb::EncodeRequest LightRequest(int seed) {
  pb::EncodeRequest request;
  request.add_inputs()->set_text(TextOfTokens(16, seed));
  return request;
}

struct Outcome {
  grpc::Status status;
  Clock::time_point done;
  double seconds = 0;
};

Outcome Call(pb::Encoder::Stub* stub, const pb::EncodeRequest& request) {
  grpc::ClientContext context;
  // Far longer than anything here takes: a reject must come from the server, not a deadline.
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  pb::EncodeResponse response;
  const auto start = Clock::now();
  Outcome outcome;
  outcome.status = stub->Encode(&context, request, &response);
  outcome.done = Clock::now();
  outcome.seconds = Seconds(outcome.done - start);
  return outcome;
}

double QueueDepth() { return ScrapeOrFail(SharedServer()).Sum("attnserve_queue_depth"); }

// Polls the queue-depth gauge until it reads `depth` (or `timeout` passes).
bool WaitForQueueDepth(double depth, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (QueueDepth() == depth) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string Summary(const std::vector<Outcome>& outcomes) {
  std::map<std::string, int> codes;
  for (const Outcome& o : outcomes) ++codes[CodeName(o.status.error_code())];
  std::string text;
  for (const auto& [code, count] : codes) text += code + " x" + std::to_string(count) + " ";
  return text;
}

class OverloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { channel_ = new auto(SharedServer().NewChannel()); }
  static void TearDownTestSuite() {
    delete channel_;
    channel_ = nullptr;
  }
  void TearDown() override {
    reliability::ExpectHealthy(SharedServer(), "the overload test");
    EXPECT_TRUE(WaitForQueueDepth(0, ScaledSeconds(30)))
        << "attnserve_queue_depth should return to 0, reads " << QueueDepth();
  }
  static std::shared_ptr<grpc::Channel>* channel_;
};
std::shared_ptr<grpc::Channel>* OverloadTest::channel_ = nullptr;

// Both slots held by long requests: every request of a 32-client burst is rejected, and all of
// the rejects arrive before either long request finishes (none waited for the engine).
TEST_F(OverloadTest, BurstWhileFullGetsImmediateResourceExhausted) {
  auto stub = pb::Encoder::NewStub(*channel_);
  const double rejected_before =
      reliability::RequestCount(SharedServer(), "Encode", "RESOURCE_EXHAUSTED");
  const double ok_before = reliability::RequestCount(SharedServer(), "Encode", "OK");

  std::vector<Outcome> heavy(kMaxConcurrent);
  std::vector<std::thread> heavy_threads;
  for (int i = 0; i < kMaxConcurrent; ++i) {
    heavy_threads.emplace_back([&, i] { heavy[i] = Call(stub.get(), HeavyRequest(i)); });
  }
  ASSERT_TRUE(WaitForQueueDepth(kMaxConcurrent, ScaledSeconds(30)))
      << "the long requests were not admitted; queue depth " << QueueDepth();

  constexpr int kBurst = 32;
  std::vector<Outcome> burst(kBurst);
  std::vector<std::thread> burst_threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kBurst; ++i) {
    burst_threads.emplace_back([&, i] {
      const pb::EncodeRequest request = LightRequest(i);
      ++ready;
      while (ready < kBurst) std::this_thread::yield();
      burst[i] = Call(stub.get(), request);
    });
  }
  // Health is answered while the engine is saturated.
  EXPECT_EQ(reliability::HealthOf(*channel_, "attnserve.v1.Encoder"), "SERVING");
  for (std::thread& t : burst_threads) t.join();
  for (std::thread& t : heavy_threads) t.join();

  Clock::time_point last_reject = Clock::time_point::min();
  Clock::time_point first_heavy_done = Clock::time_point::max();
  std::vector<double> reject_seconds;
  for (const Outcome& o : burst) {
    ExpectStatus(o.status, grpc::StatusCode::RESOURCE_EXHAUSTED,
                 {"busy", std::to_string(kMaxConcurrent), "max-concurrent-requests", "retry"},
                 "a burst request while both slots are taken");
    last_reject = std::max(last_reject, o.done);
    reject_seconds.push_back(o.seconds);
  }
  for (const Outcome& o : heavy) {
    EXPECT_TRUE(o.status.ok()) << StatusString(o.status);
    first_heavy_done = std::min(first_heavy_done, o.done);
  }
  EXPECT_LT(last_reject, first_heavy_done)
      << "a reject was answered only after a long request finished: it waited instead of being "
         "turned away";
  std::sort(reject_seconds.begin(), reject_seconds.end());
  std::printf(
      "[info] burst of %d while full: %s; reject latency median %.1f ms, max %.1f ms; "
      "long requests took %.2f s and %.2f s\n",
      kBurst, Summary(burst).c_str(), reject_seconds[kBurst / 2] * 1e3, reject_seconds.back() * 1e3,
      heavy[0].seconds, heavy[1].seconds);

  // Recovery: the very next request, without any retry, is served.
  const Outcome next = Call(stub.get(), LightRequest(99));
  EXPECT_TRUE(next.status.ok()) << "the first request after the burst: "
                                << StatusString(next.status);

  // Every reject was counted once; the admitted ones as OK.
  const double rejected = reliability::RequestCount(SharedServer(), "Encode", "RESOURCE_EXHAUSTED");
  EXPECT_EQ(rejected - rejected_before, kBurst);
  EXPECT_GE(reliability::RequestCount(SharedServer(), "Encode", "OK") - ok_before,
            kMaxConcurrent + 1);
}

// Repeated bursts of mixed Encode and AttentionMap calls: only OK or RESOURCE_EXHAUSTED (no
// timeouts, no other errors), at least one of each, the count of rejects in the metrics equals
// what the clients saw, and the server serves normally after every burst.
TEST_F(OverloadTest, RepeatedMixedBurstsOnlyOkOrResourceExhausted) {
  auto stub = pb::Encoder::NewStub(*channel_);
  constexpr int kRounds = 3;
  constexpr int kClients = 24;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const double encode_before =
        reliability::RequestCount(SharedServer(), "Encode", "RESOURCE_EXHAUSTED");
    const double attention_before =
        reliability::RequestCount(SharedServer(), "AttentionMap", "RESOURCE_EXHAUSTED");
    std::vector<Outcome> outcomes(kClients);
    std::vector<bool> is_attention(kClients);
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    for (int i = 0; i < kClients; ++i) {
      is_attention[i] = i % 3 == 0;
      threads.emplace_back([&, i] {
        ++ready;
        while (ready < kClients) std::this_thread::yield();
        if (!is_attention[i]) {
          outcomes[i] = Call(stub.get(), MediumRequest(round * kClients + i));
          return;
        }
        pb::AttentionMapRequest request;
        request.add_inputs()->set_text(TextOfTokens(128, i));
        request.add_layers(-1);
        request.set_top_k(4);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
        pb::AttentionMapResponse response;
        const auto start = Clock::now();
        outcomes[i].status = stub->AttentionMap(&context, request, &response);
        outcomes[i].done = Clock::now();
        outcomes[i].seconds = Seconds(outcomes[i].done - start);
      });
    }
    for (std::thread& t : threads) t.join();
    int encode_rejects = 0, attention_rejects = 0, ok = 0;
    for (int i = 0; i < kClients; ++i) {
      const grpc::Status& status = outcomes[i].status;
      if (status.ok()) {
        ++ok;
      } else {
        ExpectStatus(status, grpc::StatusCode::RESOURCE_EXHAUSTED, {"max-concurrent-requests"},
                     is_attention[i] ? "AttentionMap in a burst" : "Encode in a burst");
        ++(is_attention[i] ? attention_rejects : encode_rejects);
      }
    }
    std::printf("[info] round %d: %d clients -> %s\n", round, kClients, Summary(outcomes).c_str());
    EXPECT_GE(ok, 1);
    EXPECT_GE(encode_rejects + attention_rejects, 1);
    EXPECT_EQ(
        reliability::RequestCount(SharedServer(), "Encode", "RESOURCE_EXHAUSTED") - encode_before,
        encode_rejects);
    EXPECT_EQ(reliability::RequestCount(SharedServer(), "AttentionMap", "RESOURCE_EXHAUSTED") -
                  attention_before,
              attention_rejects);
    const Outcome after = Call(stub.get(), LightRequest(round));
    EXPECT_TRUE(after.status.ok()) << "after round " << round << ": " << StatusString(after.status);
  }
}

// What the message tells clients to do works: clients that retry RESOURCE_EXHAUSTED with
// exponential back-off all get served.
TEST_F(OverloadTest, ClientsRetryingWithBackoffAllSucceed) {
  auto stub = pb::Encoder::NewStub(*channel_);
  constexpr int kClients = 12;
  std::vector<grpc::Status> final_status(kClients);
  std::vector<int> attempts(kClients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto backoff = std::chrono::milliseconds(20 + 7 * i);
      for (attempts[i] = 1; attempts[i] <= 30; ++attempts[i]) {
        final_status[i] = Call(stub.get(), MediumRequest(100 + i)).status;
        if (final_status[i].error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int retried = 0;
  for (int i = 0; i < kClients; ++i) {
    EXPECT_TRUE(final_status[i].ok()) << "client " << i << " after " << attempts[i]
                                      << " attempts: " << StatusString(final_status[i]);
    if (attempts[i] > 1) ++retried;
  }
  std::printf("[info] %d clients with back-off: %d needed retries, at most %d attempts\n", kClients,
              retried, *std::max_element(attempts.begin(), attempts.end()));
  EXPECT_GE(retried, 1) << "with 12 clients and 2 slots some must have been turned away";
}

// The log shows no crash after all of it.
TEST_F(OverloadTest, ServerLogShowsNoCrash) {
  const std::vector<std::string> crashes =
      reliability::CrashLines(reliability::FullLog(SharedServer()));
  EXPECT_TRUE(crashes.empty()) << crashes.front();
}

}  // namespace
}  // namespace attn::integration
