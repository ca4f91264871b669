// Issue 13's five findings, each as a test against the real server (default limits, a trainer
// token and a model store): a request that would cost more memory than the server can afford is
// refused before any work; a deadline that passes during inference stops the work and is never
// counted OK; user input is quoted short in error messages; a cancelled call is counted
// CANCELLED whatever stage it was in; degenerate fine-tuning batches are refused or warned
// about. Each of these failed against the server before the change (see README.md).
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

namespace {
constexpr char kToken[] = "limits-test-token";
}  // namespace

std::optional<std::vector<std::string>> SharedServerFlags() {
  static reliability::TempDir* dir = new reliability::TempDir("limits");
  return std::vector<std::string>{
      "--trainer_token_file=" + dir->WriteFile("token", std::string(kToken) + "\n"),
      "--model_store=" + dir->path() + "/store", "--trainer_threads=1"};
}

namespace {

using Clock = std::chrono::steady_clock;
using reliability::ExpectStatus;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Metrics Scrape() { return ScrapeOrFail(SharedServer()); }

double Count(const Metrics& m, const std::string& method, const std::string& code) {
  return m.Sum("attnserve_requests_total", {{"method", method}, {"code", code}});
}

// Polls until attnserve_requests_total{method} has grown by `calls` over `before` (the server
// counts a call when it finishes it, which may be after the client gave up).
Metrics WaitForCounted(const Metrics& before, const std::string& method, double calls,
                       std::chrono::seconds timeout) {
  const double target = before.Sum("attnserve_requests_total", {{"method", method}}) + calls;
  const auto deadline = Clock::now() + timeout;
  Metrics now = Scrape();
  while (now.Sum("attnserve_requests_total", {{"method", method}}) < target &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = Scrape();
  }
  EXPECT_EQ(now.Sum("attnserve_requests_total", {{"method", method}}), target)
      << "the server did not count every " << method << " call in time";
  return now;
}

std::string Breakdown(const Metrics& before, const Metrics& after, const std::string& method) {
  std::map<std::string, double> codes;
  for (const MetricSample& s : after.samples()) {
    if (s.name != "attnserve_requests_total" || s.labels.at("method") != method) continue;
    codes[s.labels.at("code")] += s.value;
  }
  std::string out;
  for (const auto& [code, value] : codes) {
    const double delta = value - Count(before, method, code);
    if (delta != 0) out += code + "=" + std::to_string(static_cast<int>(delta)) + " ";
  }
  return out.empty() ? "(none)" : out;
}

pb::AttentionMapRequest LongInputs(int inputs, int tokens) {
  pb::AttentionMapRequest request;
  for (int i = 0; i < inputs; ++i) request.add_inputs()->set_text(TextOfTokens(tokens, i));
  request.mutable_tokenization()->set_max_length(512);
  return request;
}

// ---------------------------------------------------------------------------------------------
// Finding 1: one small request could make the server build a 2.6 GB response (peak RSS 5.7 GB)
// before refusing it. Now its cost is estimated from the request and it is refused before any
// work: RESOURCE_EXHAUSTED naming the figure, the limit and what to change.

TEST(LimitsTest, ResponseOverMessageLimitRefusedBeforeAnyWork) {
  ServerProcess& server = SharedServer();
  auto stub = server.NewStub();
  // 16 x 512 tokens, every layer and head, scores and Q K V: ~2.6 GB of fp32 maps. ~80 KB sent.
  pb::AttentionMapRequest request = LongInputs(16, 512);
  request.set_include_scores(true);
  request.set_include_qkv(true);
  const int64_t peak_before = reliability::PeakRssBytes(server.process().pid());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
  pb::AttentionMapResponse response;
  const auto start = Clock::now();
  const grpc::Status status = stub->AttentionMap(&context, request, &response);
  const double seconds = Seconds(Clock::now() - start);
  const int64_t peak_after = reliability::PeakRssBytes(server.process().pid());
  std::printf("answered in %.2f s: %s\npeak RSS %.0f MB -> %.0f MB\n", seconds,
              StatusString(status).c_str(), peak_before / 1e6, peak_after / 1e6);
  ExpectStatus(status, grpc::StatusCode::RESOURCE_EXHAUSTED,
               {"response would be at least", "--max-message-bytes", "top_k", "FLOAT16"},
               "16 x 512 tokens with scores and qkv");
  EXPECT_LT(peak_after - peak_before, 64ll << 20)
      << "the server allocated for a request it refused";
  EXPECT_TRUE(reliability::ExpectHealthy(server, "a refused 2.6 GB AttentionMap"));
}

// Under the message limit but not the memory one: rollout over 24 x 512 tokens returns 24 MB
// but keeps every layer's (12, 512, 512) maps, 1.8 GB. Refused by --max-request-memory-bytes.
TEST(LimitsTest, WorkingMemoryOverRequestLimitRefusedBeforeAnyWork) {
  ServerProcess& server = SharedServer();
  auto stub = server.NewStub();
  pb::AttentionMapRequest request = LongInputs(24, 512);
  request.add_layers(0);
  request.set_include_weights(false);
  request.set_rollout(true);
  const int64_t peak_before = reliability::PeakRssBytes(server.process().pid());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
  pb::AttentionMapResponse response;
  const grpc::Status status = stub->AttentionMap(&context, request, &response);
  const int64_t peak_after = reliability::PeakRssBytes(server.process().pid());
  std::printf("%s\npeak RSS %.0f MB -> %.0f MB\n", StatusString(status).c_str(), peak_before / 1e6,
              peak_after / 1e6);
  ExpectStatus(status, grpc::StatusCode::RESOURCE_EXHAUSTED,
               {"bytes of memory", "--max-request-memory-bytes", "fewer inputs"},
               "rollout over 24 x 512 tokens");
  EXPECT_LT(peak_after - peak_before, 64ll << 20)
      << "the server allocated for a request it refused";
  const Metrics metrics = Scrape();
  EXPECT_GE(metrics.Sum("attnserve_memory_refusals_total", {{"limit", "request"}}), 1);
}

// ---------------------------------------------------------------------------------------------
// Finding 2: a deadline that passed during inference was not enforced: the server computed
// everything and counted the call OK. Now the batcher stops between layers and the call is
// counted DEADLINE_EXCEEDED and in attnserve_dropped_requests_total{reason="deadline"}.

TEST(LimitsTest, DeadlinePassingDuringInferenceIsNeverCountedOk) {
  ServerProcess& server = SharedServer();
  auto stub = server.NewStub();
  // 16 x 512 tokens: tokenized in milliseconds, computed in seconds, and one engine batch (the
  // default --max-batch-tokens is 8192), so only a check during or after the forward can see
  // the deadline pass: the server before the fix checked when the batch formed, computed it
  // all and counted the call OK (a request of several batches was caught between them).
  pb::EncodeRequest request;
  for (int i = 0; i < 16; ++i) request.add_inputs()->set_text(TextOfTokens(512, 100 + i));
  request.mutable_tokenization()->set_max_length(512);
  // A deadline well after tokenization (measured now, on this machine) and well before the end
  // of inference.
  pb::TokenizeRequest tokenize;
  *tokenize.mutable_inputs() = request.inputs();
  *tokenize.mutable_tokenization() = request.tokenization();
  pb::TokenizeResponse tokenized;
  grpc::ClientContext tokenize_context;
  ASSERT_TRUE(stub->Tokenize(&tokenize_context, tokenize, &tokenized).ok());
  const auto deadline_after = std::chrono::milliseconds(
      100 + static_cast<int64_t>(4 * tokenized.metadata().tokenization_ms()));
  std::printf("tokenization %.1f ms: deadline %ld ms after the call starts\n",
              tokenized.metadata().tokenization_ms(), static_cast<long>(deadline_after.count()));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Metrics before = Scrape();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline_after);
    pb::EncodeResponse response;
    const grpc::Status status = stub->Encode(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << StatusString(status);
    const Metrics after = WaitForCounted(before, "Encode", 1, ScaledSeconds(120));
    std::printf(
        "attempt %d: server counted %s; dropped{deadline} by stage: queue +%.0f, "
        "compute +%.0f, reply +%.0f\n",
        attempt, Breakdown(before, after, "Encode").c_str(),
        after.Sum("attnserve_dropped_requests_total",
                  {{"reason", "deadline"}, {"stage", "queue"}}) -
            before.Sum("attnserve_dropped_requests_total",
                       {{"reason", "deadline"}, {"stage", "queue"}}),
        after.Sum("attnserve_dropped_requests_total",
                  {{"reason", "deadline"}, {"stage", "compute"}}) -
            before.Sum("attnserve_dropped_requests_total",
                       {{"reason", "deadline"}, {"stage", "compute"}}),
        after.Sum("attnserve_dropped_requests_total",
                  {{"reason", "deadline"}, {"stage", "reply"}}) -
            before.Sum("attnserve_dropped_requests_total",
                       {{"reason", "deadline"}, {"stage", "reply"}}));
    EXPECT_EQ(Count(after, "Encode", "OK"), Count(before, "Encode", "OK"))
        << "an expired call was counted OK";
    EXPECT_EQ(Count(after, "Encode", "DEADLINE_EXCEEDED"),
              Count(before, "Encode", "DEADLINE_EXCEEDED") + 1);
    EXPECT_EQ(after.Sum("attnserve_dropped_requests_total", {{"reason", "deadline"}}),
              before.Sum("attnserve_dropped_requests_total", {{"reason", "deadline"}}) + 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 3: a 10 KB model_version came back whole in a 10,283-character NOT_FOUND message
// (over gRPC's 8 KiB metadata limit: a default client saw RESOURCE_EXHAUSTED instead). Now user
// input is quoted at most 64 bytes, with "…(N bytes)".

TEST(LimitsTest, LongUserInputIsQuotedShortInErrors) {
  ServerProcess& server = SharedServer();
  // A default channel: gRPC's default metadata limits.
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto encoder = pb::Encoder::NewStub(channel);
  auto trainer = pb::Trainer::NewStub(channel);
  const std::string long_name(10240, 'v');
  auto check = [&](const grpc::Status& status, grpc::StatusCode code, const std::string& what) {
    std::printf("%s: %s (%zu characters)\n", what.c_str(),
                StatusString(status).substr(0, 200).c_str(), status.error_message().size());
    EXPECT_EQ(status.error_code(), code) << what << ": " << StatusString(status).substr(0, 300);
    EXPECT_LT(status.error_message().size(), 400u) << what;
    EXPECT_NE(status.error_message().find("\u2026(10240 bytes)"), std::string::npos)
        << what << ": " << status.error_message().substr(0, 300);
  };
  for (int i = 0; i < 5; ++i) {
    grpc::ClientContext context;
    pb::EncodeRequest request;
    request.add_inputs()->set_text("hello");
    request.set_model_version(long_name);
    pb::EncodeResponse response;
    check(encoder->Encode(&context, request, &response), grpc::StatusCode::NOT_FOUND,
          "Encode model_version");
  }
  {
    grpc::ClientContext context;
    pb::GetModelInfoRequest request;
    request.set_model_version(long_name);
    pb::ModelInfo response;
    check(encoder->GetModelInfo(&context, request, &response), grpc::StatusCode::NOT_FOUND,
          "GetModelInfo model_version");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::RollbackRequest request;
    request.set_version(long_name);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer->Rollback(&context, request, &response);
    std::printf("Rollback: %s\n", StatusString(status).substr(0, 200).c_str());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(status.error_message().size(), 400u);
  }
}

// ---------------------------------------------------------------------------------------------
// Finding 4: of 200 cancelled calls up to 89 were counted INVALID_ARGUMENT (a call cancelled
// before its body arrived was parsed as an empty request). Now a call the client cancelled is
// counted CANCELLED whatever stage it was in, and once in attnserve_dropped_requests_total.

// Starts a raw Encode call, sends its body only if `send_body`, cancels it after `delay` and
// returns the status the client saw.
grpc::Status CancelledCall(grpc::GenericStub* stub, const std::string& body, bool send_body,
                           std::chrono::microseconds delay) {
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto call = stub->PrepareCall(&context, "/attnserve.v1.Encoder/Encode", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer request_buffer;
  grpc::ByteBuffer response_buffer;
  grpc::Slice slice(body);
  request_buffer = grpc::ByteBuffer(&slice, 1);
  if (send_body) {
    call->WriteLast(request_buffer, grpc::WriteOptions(), reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->Read(&response_buffer, reinterpret_cast<void*>(3));
  }
  std::this_thread::sleep_for(delay);
  context.TryCancel();
  if (send_body) cq.Next(&tag, &ok);  // the read ends (with or without a response)
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST(LimitsTest, CancelledCallsAreCountedCancelledAtEveryStage) {
  constexpr int kCalls = 200, kThreads = 8;
  ServerProcess& server = SharedServer();
  auto channel = server.NewChannel();
  pb::EncodeRequest request;
  for (int i = 0; i < 2; ++i) request.add_inputs()->set_text(TextOfTokens(48, 300 + i));
  const std::string body = request.SerializeAsString();
  const Metrics before = Scrape();
  std::mutex mutex;
  std::map<std::string, int> client_codes;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      grpc::GenericStub stub(channel);
      std::mt19937 random(1234 + t);
      for (int i = 0; i < kCalls / kThreads; ++i) {
        // A third before the body is sent; the rest at a random moment of the first 250 ms
        // (tokenization, the queue, inference, the reply; some calls finish first).
        const bool send_body = random() % 3 != 0;
        const auto delay = std::chrono::microseconds(random() % 250000);
        const grpc::Status status = CancelledCall(&stub, body, send_body, delay);
        std::lock_guard<std::mutex> lock(mutex);
        ++client_codes[CodeName(status.error_code())];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const Metrics after = WaitForCounted(before, "Encode", kCalls, ScaledSeconds(120));
  std::string client;
  for (const auto& [code, n] : client_codes) client += code + "=" + std::to_string(n) + " ";
  std::printf("client saw: %s\nserver counted: %s\n", client.c_str(),
              Breakdown(before, after, "Encode").c_str());
  const double ok = Count(after, "Encode", "OK") - Count(before, "Encode", "OK");
  const double cancelled =
      Count(after, "Encode", "CANCELLED") - Count(before, "Encode", "CANCELLED");
  // Every call the server did not answer OK was cancelled, nothing else: the breakdown is exactly
  // {OK: ok, CANCELLED: 200 - ok}.
  EXPECT_EQ(ok + cancelled, kCalls) << Breakdown(before, after, "Encode");
  EXPECT_EQ(Count(after, "Encode", "INVALID_ARGUMENT"), Count(before, "Encode", "INVALID_ARGUMENT"))
      << "cancelled calls were counted as bad input";
  // A call the server answered OK may still reach the client as CANCELLED (cancelled while the
  // answer was on its way), never the other way round.
  EXPECT_EQ(client_codes["OK"] + client_codes["CANCELLED"], kCalls) << client;
  EXPECT_LE(client_codes["OK"], ok);
  EXPECT_GE(client_codes["CANCELLED"], cancelled);
  EXPECT_GT(cancelled, 0);
  // Each CANCELLED call once in the drop counter, at whichever stage it was.
  EXPECT_EQ(after.Sum("attnserve_dropped_requests_total", {{"reason", "cancelled"}}) -
                before.Sum("attnserve_dropped_requests_total", {{"reason", "cancelled"}}),
            cancelled);
  EXPECT_TRUE(reliability::ExpectHealthy(server, "200 cancelled calls"));
}

// ---------------------------------------------------------------------------------------------
// Finding 5: a contrastive batch of one pair (loss exactly 0: no in-batch negatives) or of
// identical anchor/positive pairs trained and could be committed without a word.

pb::FineTuneRequest ContrastiveConfig() {
  pb::FineTuneRequest request;
  request.mutable_config()->set_objective(pb::CONTRASTIVE);
  request.mutable_config()->set_seed(7);
  return request;
}

pb::FineTuneRequest Batch(const std::vector<std::pair<std::string, std::string>>& pairs) {
  pb::FineTuneRequest request;
  for (const auto& [anchor, positive] : pairs) {
    pb::TrainingExample* e = request.mutable_batch()->add_examples();
    e->set_anchor(anchor);
    e->set_positive(positive);
  }
  return request;
}

grpc::Status RunJob(const std::vector<pb::FineTuneRequest>& requests,
                    std::vector<pb::FineTuneProgress>* answers) {
  auto trainer = pb::Trainer::NewStub(SharedServer().NewChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  auto stream = trainer->FineTune(&context);
  for (const pb::FineTuneRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  pb::FineTuneProgress progress;
  while (stream->Read(&progress)) answers->push_back(progress);
  return stream->Finish();
}

TEST(LimitsTest, ContrastiveBatchOfOnePairIsRefused) {
  std::vector<pb::FineTuneProgress> answers;
  const grpc::Status status =
      RunJob({ContrastiveConfig(), Batch({{"a red shoe", "crimson sneaker"}})}, &answers);
  std::printf("%s\n", StatusString(status).c_str());
  ExpectStatus(status, grpc::StatusCode::INVALID_ARGUMENT, {"batch 1", "at least 2", "negatives"},
               "a contrastive batch of one pair");
}

TEST(LimitsTest, IdenticalPairsWarnAndTheNoteIsStoredWithTheVersion) {
  std::vector<pb::FineTuneRequest> requests = {ContrastiveConfig()};
  for (int step = 0; step < 2; ++step) {
    requests.push_back(Batch({{"blue kettle", "blue kettle"},
                              {"garden hose", "garden hose"},
                              {"desk lamp", "reading light"}}));
  }
  pb::FineTuneRequest commit;
  commit.mutable_commit()->set_description("identical pairs");
  requests.push_back(commit);
  std::vector<pb::FineTuneProgress> answers;
  const grpc::Status status = RunJob(requests, &answers);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_GE(answers.size(), 3u);
  for (const pb::FineTuneProgress& answer : answers) {
    for (const std::string& warning : answer.warnings()) {
      std::printf("step %ld warning: %s\n", static_cast<long>(answer.step()), warning.c_str());
    }
  }
  ASSERT_EQ(answers[0].warnings_size(), 1) << "no warning for the first batch";
  EXPECT_NE(answers[0].warnings(0).find("2 of 3 examples have anchor == positive"),
            std::string::npos)
      << answers[0].warnings(0);
  const std::string version = answers.back().committed_version();
  ASSERT_FALSE(version.empty());

  auto trainer = pb::Trainer::NewStub(SharedServer().NewChannel());
  grpc::ClientContext context;
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  pb::ListVersionsResponse versions;
  ASSERT_TRUE(trainer->ListVersions(&context, pb::ListVersionsRequest(), &versions).ok());
  bool found = false;
  for (const pb::VersionInfo& info : versions.versions()) {
    if (info.version() != version) continue;
    found = true;
    ASSERT_EQ(info.notes_size(), 2) << "one note per warned batch";
    EXPECT_NE(info.notes(0).find("anchor == positive"), std::string::npos) << info.notes(0);
  }
  EXPECT_TRUE(found) << version << " not listed";
}

// A loss of exactly 0 for 3 steps in a row: identical pairs, no dropout and a similarity scale
// so large that the in-batch negatives underflow (exp(-500) is 0 in fp32).
TEST(LimitsTest, LossStuckAtZeroWarns) {
  pb::FineTuneRequest config = ContrastiveConfig();
  config.mutable_config()->set_disable_dropout(true);
  config.mutable_config()->set_contrastive_scale(1000);
  std::vector<pb::FineTuneRequest> requests = {config};
  for (int step = 0; step < 3; ++step) {
    requests.push_back(Batch({{"blue kettle", "blue kettle"}, {"tax forms", "tax forms"}}));
  }
  pb::FineTuneRequest abort;
  abort.set_abort(true);
  requests.push_back(abort);
  std::vector<pb::FineTuneProgress> answers;
  const grpc::Status status = RunJob(requests, &answers);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_GE(answers.size(), 3u);
  for (const pb::FineTuneProgress& answer : answers) {
    std::printf("step %ld loss %g, %d warnings\n", static_cast<long>(answer.step()), answer.loss(),
                answer.warnings_size());
  }
  ASSERT_EQ(answers[2].loss(), 0.0) << "the set-up no longer gives a loss of exactly 0";
  bool warned = false;
  for (const std::string& warning : answers[2].warnings()) {
    warned |= warning.find("exactly 0 for 3 steps") != std::string::npos;
  }
  EXPECT_TRUE(warned) << "no zero-loss warning at step 3";
}

}  // namespace
}  // namespace attn::integration
