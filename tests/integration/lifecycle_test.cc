// The server's life cycle, each test with its own attnserve process: health from the moment the
// process starts (never SERVING before it can serve), reflection, and SIGTERM while requests are
// in flight (they finish, the process exits 0).
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/integration/harness.h"

namespace attn::integration {

// No shared server: every test here needs to watch a process from its start or its end.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

namespace health = ::grpc::health::v1;
namespace reflection = ::grpc::reflection::v1alpha;
using Clock = std::chrono::steady_clock;
using health::HealthCheckResponse;

// A channel of its own (no subchannel shared with other channels). Start-up polls take a fresh
// one each time: a channel that saw "connection refused" backs off before it reconnects (1 s by
// default; with gRPC 1.51 even 10-50 ms back-off arguments left a reused channel failing for the
// whole start-up), which would hide the NOT_SERVING window.
std::shared_ptr<grpc::Channel> FreshChannel(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

grpc::Status Check(health::Health::Stub* stub, const std::string& service,
                   HealthCheckResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  health::HealthCheckRequest request;
  request.set_service(service);
  return stub->Check(&context, request, response);
}

// What a health poller saw while the server started.
struct StartupObservations {
  std::map<std::string, int> counts;  // "UNAVAILABLE", "NOT_SERVING", "SERVING (before ready)"...
  std::map<std::string, std::pair<double, double>> first_last_s;  // since fork, per kind
  std::vector<std::string> violations;
  std::vector<grpc::Status> encode_while_loading;  // Encode calls while health said NOT_SERVING
  double ready_after_s = 0;
  int polls = 0;
};

class LifecycleTest : public ::testing::Test {
 protected:
  // Starts the server on a port chosen here (so it can be polled before the ready file names
  // it) and polls health until the ready file appears.
  static void SetUpTestSuite() {
    observations_ = new StartupObservations();
    const int port = PickFreePort();
    server_ = new ServerProcess({}, port);
    std::string error;
    const auto start = Clock::now();
    if (!server_->Start(&error)) {
      start_error_ = new std::string(error);
      return;
    }
    while (!server_->ReadyFileExists()) {
      auto channel = FreshChannel(port);
      auto stub = health::Health::NewStub(channel);
      auto encoder = pb::Encoder::NewStub(channel);
      if (!server_->process().Running() || Clock::now() - start > ScaledSeconds(90)) break;
      ++observations_->polls;
      for (const std::string service : {"", "attnserve.v1.Encoder"}) {
        const bool ready_before = server_->ReadyFileExists();
        // Only start-up is observed here; the first service's check may have waited for the file.
        if (ready_before) break;
        HealthCheckResponse response;
        const grpc::Status status = Check(stub.get(), service, &response);
        std::string what = status.ok() ? HealthCheckResponse::ServingStatus_Name(response.status())
                                       : CodeName(status.error_code());
        if (status.ok() && response.status() == HealthCheckResponse::SERVING && !ready_before) {
          what += " (before the ready file)";
          // SERVING may precede the ready file by the time it takes to write it, no more; and
          // the server must really serve then.
          pb::EncodeRequest request;
          request.add_inputs()->set_text("serving already?");
          pb::EncodeResponse encoded;
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(30));
          const grpc::Status encode_status = encoder->Encode(&context, request, &encoded);
          if (!encode_status.ok()) {
            observations_->violations.push_back(
                "health '" + service +
                "' said SERVING but Encode failed: " + StatusString(encode_status));
          }
          const auto seen = Clock::now();
          while (!server_->ReadyFileExists() && Clock::now() - seen < ScaledSeconds(1)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          if (!server_->ReadyFileExists()) {
            observations_->violations.push_back(
                "health '" + service + "' said SERVING more than 1 s before the ready file");
          }
        }
        if (status.ok() && response.status() == HealthCheckResponse::NOT_SERVING &&
            service.empty() && observations_->encode_while_loading.size() < 3) {
          // While loading, the Encoder answers UNAVAILABLE (retry), per the API contract.
          pb::EncodeRequest request;
          request.add_inputs()->set_text("too early");
          pb::EncodeResponse encoded;
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(10));
          const grpc::Status encode_status = encoder->Encode(&context, request, &encoded);
          if (!server_->ReadyFileExists()) {
            observations_->encode_while_loading.push_back(encode_status);
          }
        }
        const double at = std::chrono::duration<double>(Clock::now() - start).count();
        const std::string key = "'" + service + "' " + what;
        if (observations_->counts[key]++ == 0) observations_->first_last_s[key].first = at;
        observations_->first_last_s[key].second = at;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!server_->WaitReady(ScaledSeconds(5), &error)) {
      start_error_ =
          new std::string(error + "\n--- attnserve log ---\n" + server_->process().LogTail());
      return;
    }
    observations_->ready_after_s = std::chrono::duration<double>(Clock::now() - start).count();
  }

  static void TearDownTestSuite() {
    delete server_;
    delete observations_;
    delete start_error_;
    server_ = nullptr;
    observations_ = nullptr;
    start_error_ = nullptr;
  }

  void SetUp() override {
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
    ASSERT_TRUE(server_->process().Running()) << server_->process().ExitDescription();
  }

  static ServerProcess* server_;
  static StartupObservations* observations_;
  static std::string* start_error_;
};
ServerProcess* LifecycleTest::server_ = nullptr;
StartupObservations* LifecycleTest::observations_ = nullptr;
std::string* LifecycleTest::start_error_ = nullptr;

TEST_F(LifecycleTest, HealthNeverServingBeforeReady) {
  std::string seen;
  for (const auto& [what, count] : observations_->counts) {
    char times[64];
    std::snprintf(times, sizeof(times), " (%.3f-%.3f s)", observations_->first_last_s[what].first,
                  observations_->first_last_s[what].second);
    seen += what + " x" + std::to_string(count) + times + ", ";
  }
  std::printf("[info] ready file after %.2f s; %d health polls during start-up: %s\n",
              observations_->ready_after_s, observations_->polls, seen.c_str());
  for (const std::string& violation : observations_->violations) ADD_FAILURE() << violation;
  for (const auto& [key, count] : observations_->counts) {
    const std::string what = key.substr(key.find("' ") + 2);
    // Before the ready file: not listening yet (UNAVAILABLE), NOT_SERVING, or SERVING only in
    // the instant before the file appears (checked above). Anything else is wrong; NOT_FOUND in
    // particular means the service name was not registered as NOT_SERVING before loading, so a
    // probe of "attnserve.v1.Encoder" sees "unknown service" instead of "not serving yet".
    EXPECT_TRUE(what == "UNAVAILABLE" || what == "NOT_SERVING" || what == "DEADLINE_EXCEEDED" ||
                what == "SERVING (before the ready file)")
        << "during start-up, health Check " << key << " x" << count
        << " (expected NOT_SERVING until the model is loaded)";
  }

  // Start-up must have been observed, or this test proved nothing: the server listens (and
  // answers NOT_SERVING) before it loads the model, which takes far longer than a 5 ms poll.
  for (const std::string service : {"''", "'attnserve.v1.Encoder'"}) {
    EXPECT_GE(observations_->counts[service + " NOT_SERVING"], 1)
        << "health " << service << " was never seen NOT_SERVING during start-up";
  }
  EXPECT_FALSE(observations_->encode_while_loading.empty())
      << "no Encode call was made while the model loaded";
  for (const grpc::Status& status : observations_->encode_while_loading) {
    // OK is acceptable only if loading finished between the health check and the call.
    EXPECT_TRUE(status.error_code() == grpc::UNAVAILABLE || status.ok())
        << "Encode while health was NOT_SERVING: " << StatusString(status);
    std::printf("[info] Encode while NOT_SERVING -> %s\n", StatusString(status).c_str());
  }

  auto stub = health::Health::NewStub(server_->NewChannel());
  for (const std::string service : {"", "attnserve.v1.Encoder"}) {
    HealthCheckResponse response;
    const grpc::Status status = Check(stub.get(), service, &response);
    ASSERT_TRUE(status.ok()) << "'" << service << "': " << StatusString(status);
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << "'" << service << "'";
  }
  HealthCheckResponse response;
  EXPECT_EQ(Check(stub.get(), "no.such.Service", &response).error_code(), grpc::NOT_FOUND)
      << "the standard health service answers NOT_FOUND for unknown services";
}

TEST_F(LifecycleTest, ReflectionListsServicesAndDescribesEncoder) {
  auto stub = reflection::ServerReflection::NewStub(server_->NewChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(10));
  auto stream = stub->ServerReflectionInfo(&context);

  reflection::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  reflection::ServerReflectionResponse listed;
  ASSERT_TRUE(stream->Read(&listed));
  ASSERT_TRUE(listed.has_list_services_response())
      << "error: " << listed.error_response().error_message();
  std::set<std::string> services;
  for (const auto& service : listed.list_services_response().service()) {
    services.insert(service.name());
  }
  EXPECT_EQ(services.count("attnserve.v1.Encoder"), 1u);
  EXPECT_EQ(services.count("grpc.health.v1.Health"), 1u);

  // The descriptor a generic client (grpcurl) would fetch for the Encoder.
  reflection::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("attnserve.v1.Encoder");
  ASSERT_TRUE(stream->Write(symbol));
  reflection::ServerReflectionResponse described;
  ASSERT_TRUE(stream->Read(&described));
  ASSERT_TRUE(described.has_file_descriptor_response())
      << "error: " << described.error_response().error_message();
  bool found = false;
  for (const std::string& bytes : described.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& service : file.service()) {
      if (file.package() != "attnserve.v1" || service.name() != "Encoder") continue;
      found = true;
      std::set<std::string> methods;
      for (const auto& method : service.method()) methods.insert(method.name());
      EXPECT_EQ(methods, (std::set<std::string>{"Encode", "AttentionMap", "Tokenize",
                                                "GetModelInfo", "Explain", "ListModels",
                                                "Classify", "Rerank"}));
    }
  }
  EXPECT_TRUE(found) << "no attnserve.v1.Encoder service in the returned descriptors";
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// SIGTERM with ~20 requests in flight: every accepted request completes OK, requests sent after
// SIGTERM are refused (UNAVAILABLE) rather than hanging, and the process exits 0 in time.
TEST(DrainTest, SigtermFinishesInFlightRequestsAndExitsZero) {
  constexpr int kRequests = 20;
  constexpr int kInputsPerRequest = 2;
  // 30 s for 20 requests of 2 x 256 tokens; stretched for sanitizer builds (ASan's slowdown
  // made the accepted requests outlast an unscaled window: cancelled at the deadline).
  const int drain_timeout_s = static_cast<int>(ScaledSeconds(30).count());
  ServerProcess server({"--drain_timeout_s=" + std::to_string(drain_timeout_s)});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(90), &error)) << error;
  auto channel = server.NewChannel();

  struct Outcome {
    grpc::Status status;
    Clock::time_point sent, done;
  };
  std::vector<Outcome> outcomes(kRequests);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      auto stub = pb::Encoder::NewStub(channel);
      pb::EncodeRequest request;
      for (int k = 0; k < kInputsPerRequest; ++k) {
        request.add_inputs()->set_text(TextOfTokens(256, i * kInputsPerRequest + k));
      }
      pb::EncodeResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
      outcomes[i].sent = Clock::now();
      ++started;
      outcomes[i].status = stub->Encode(&context, request, &response);
      outcomes[i].done = Clock::now();
      if (outcomes[i].status.ok() && response.results_size() != kInputsPerRequest) {
        outcomes[i].status = grpc::Status(grpc::INTERNAL, "wrong number of results");
      }
    });
  }
  while (started < kRequests) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Every request reached the server: each is admitted (attnserve_queue_depth) or answered
  // (attnserve_requests_total; a request leaves the first just before entering the second, so
  // the sum reaches kRequests once the last one is in).
  ASSERT_TRUE(WaitFor(
      [&] {
        return ScrapeSum(server, "attnserve_queue_depth") +
                   ScrapeSum(server, "attnserve_requests_total", {{"method", "Encode"}}) >=
               kRequests;
      },
      ScaledSeconds(30)))
      << "not all " << kRequests << " requests reached the server";
  const Clock::time_point sigterm = Clock::now();
  server.process().Signal(SIGTERM);

  // A request sent during the drain must be refused promptly (or, at worst, served). The drain
  // has begun once the server logs it and has closed its listener (gRPC's Shutdown; a call that
  // slips in between the two is cancelled, not refused).
  EXPECT_TRUE(WaitFor(
      [&] {
        return server.process().LogTail().find("draining in-flight requests") !=
                   std::string::npos &&
               !AcceptsConnections(server.grpc_port());
      },
      ScaledSeconds(10)))
      << "no drain after SIGTERM:\n"
      << server.process().LogTail();
  grpc::Status late_status;
  double late_seconds = 0;
  {
    // A new client: its own subchannel pool, so gRPC cannot reuse the in-flight requests'
    // connection (a call on that connection during Shutdown is cancelled, not refused).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    auto stub = pb::Encoder::NewStub(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    pb::EncodeRequest request;
    request.add_inputs()->set_text("sent after SIGTERM");
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(drain_timeout_s));
    const auto start = Clock::now();
    late_status = stub->Encode(&context, request, &response);
    late_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }

  int wait_status = 0;
  const bool exited =
      server.process().WaitExit(std::chrono::seconds(drain_timeout_s + 5), &wait_status);
  const double exit_after = std::chrono::duration<double>(Clock::now() - sigterm).count();
  for (std::thread& t : threads) t.join();

  int ok = 0, after_sigterm = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& o = outcomes[i];
    const double sent_ms = std::chrono::duration<double, std::milli>(o.sent - sigterm).count();
    const double done_ms = std::chrono::duration<double, std::milli>(o.done - sigterm).count();
    if (o.status.ok()) ++ok;
    if (o.done > sigterm) ++after_sigterm;
    // All were admitted before SIGTERM, so UNAVAILABLE here means an accepted request was
    // dropped, not a new one refused.
    EXPECT_TRUE(o.status.ok()) << "request " << i << " sent " << -sent_ms
                               << " ms before SIGTERM, finished " << done_ms
                               << " ms after it: " << StatusString(o.status);
  }
  std::printf(
      "[info] %d/%d in-flight requests OK, %d of them finished after SIGTERM; late request "
      "-> %s in %.2f s; process exit %.2f s after SIGTERM (%s)\n",
      ok, kRequests, after_sigterm, StatusString(late_status).c_str(), late_seconds, exit_after,
      server.process().ExitDescription().c_str());
  EXPECT_GT(after_sigterm, 0) << "every request finished before SIGTERM: the load is too light "
                                 "to test draining (raise kInputsPerRequest)";
  EXPECT_TRUE(late_status.ok() || late_status.error_code() == grpc::UNAVAILABLE)
      << "a request after SIGTERM: " << StatusString(late_status);
  ASSERT_TRUE(exited) << "attnserve still running " << drain_timeout_s + 5 << " s after SIGTERM\n"
                      << server.process().LogTail();
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0)
      << "attnserve " << server.process().ExitDescription() << "\n"
      << server.process().LogTail();
  if (::testing::Test::HasFailure()) {
    std::printf("--- attnserve log ---\n%s\n", server.process().LogTail().c_str());
  }
}

// `attnserve --help` is an answer, not an error: exit 0, every flag spelled with dashes and its
// default, no build paths (Abseil's own listing exits 1 and groups flags by source file).
TEST(HelpTest, HelpExitsZeroAndListsFlagsWithDashes) {
  Subprocess help("help");
  std::string error;
  ASSERT_TRUE(help.Start({AttnserveBinary(), "--help"}, &error)) << error;
  int wait_status = 0;
  ASSERT_TRUE(help.WaitExit(ScaledSeconds(30), &wait_status)) << "--help did not exit";
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << help.ExitDescription();
  const std::string text = help.LogTail(1 << 20);
  for (const char* flag : {"--model-dir", "--max-request-memory-bytes", "--memory-budget-bytes",
                           "--trainer-token-file", "--drain-timeout-s", "(default: 8192)"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag << " missing from:\n" << text;
  }
  EXPECT_EQ(text.find("--max_batch_tokens"), std::string::npos) << text;
  EXPECT_EQ(text.find(".cc"), std::string::npos) << "a source path in --help:\n" << text;
}

}  // namespace
}  // namespace attn::integration
