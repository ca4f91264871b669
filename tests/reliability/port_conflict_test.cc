// Every port is one process's (issue 31, finding 1): a second attnserve given the gRPC, HTTP or
// metrics port of a running one exits non-zero with a message naming the port and the flag,
// never reports ready, and the first keeps answering every call (gRPC turned SO_REUSEPORT on by
// default, and a second server on the gRPC port used to start and take every other connection).
// The same holds for one server given one port for two of its listeners.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/integration/harness.h"

namespace attn::integration {

// The first server: default flags (gRPC, HTTP and metrics on ports it picks).
std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{"--threads=1"};
}

namespace {

struct Outcome {
  bool exited = false;
  int exit_code = -1;
  bool ready = false;  // wrote its ready file: it listens and serves
  std::string log;
};

// Starts a server with `flags` and waits until it exits or reports ready.
Outcome StartSecond(const std::vector<std::string>& flags) {
  ServerProcess server(flags);
  std::string error;
  Outcome outcome;
  if (!server.Start(&error)) {
    ADD_FAILURE() << error;
    return outcome;
  }
  WaitFor([&] { return !server.process().Running() || server.ReadyFileExists(); },
          ScaledSeconds(120));
  outcome.ready = server.ReadyFileExists();
  int wait_status = 0;
  outcome.exited = server.process().WaitExit(std::chrono::milliseconds(100), &wait_status);
  if (outcome.exited && WIFEXITED(wait_status)) outcome.exit_code = WEXITSTATUS(wait_status);
  outcome.log = server.process().LogTail();
  if (!outcome.exited) server.process().Stop();
  return outcome;
}

// Every one of `calls` Encodes on fresh connections reaches `server` and is answered.
void ExpectServesEveryConnection(const ServerProcess& server, int calls) {
  for (int i = 0; i < calls; ++i) {
    auto stub = server.NewStub();  // a new channel: a new connection, as a new client makes
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(30));
    pb::EncodeRequest request;
    request.add_inputs()->set_text("still the only server on this port");
    pb::EncodeResponse response;
    const grpc::Status status = stub->Encode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << "call " << i << ": " << StatusString(status);
  }
}

struct PortCase {
  const char* listener;  // "gRPC", "HTTP", "metrics"
  const char* flag;      // as the message names it
  int (ServerProcess::*port)() const;
};

void PrintTo(const PortCase& c, std::ostream* os) { *os << c.listener << " (" << c.flag << ")"; }

class PortConflictTest : public ::testing::TestWithParam<PortCase> {};

TEST_P(PortConflictTest, ASecondServerOnATakenPortExitsNamingThePortAndTheFlag) {
  const PortCase& c = GetParam();
  const ServerProcess& first = SharedServer();
  const int port = (first.*c.port)();
  ASSERT_GT(port, 0);
  std::string flag = std::string(c.flag).substr(2);  // "--http-port" -> "http-port"
  const Outcome second = StartSecond({"--" + flag + "=" + std::to_string(port), "--threads=1"});
  EXPECT_FALSE(second.ready) << "a second server started on the taken " << c.listener << " port "
                             << port << ":\n"
                             << second.log;
  ASSERT_TRUE(second.exited) << second.log;
  EXPECT_NE(second.exit_code, 0) << second.log;
  const std::string named = std::string(c.flag) + " " + std::to_string(port);
  EXPECT_TRUE(absl::StrContains(second.log, "cannot listen for " + std::string(c.listener) +
                                                " on 127.0.0.1:" + std::to_string(port)))
      << second.log;
  EXPECT_TRUE(absl::StrContains(second.log, "(" + named + ")")) << second.log;
  const size_t said = second.log.find("cannot listen");
  std::printf("[ports] %s port %d taken: %s\n", c.listener, port,
              said == std::string::npos ? "(no message)" : second.log.substr(said).c_str());
  ExpectServesEveryConnection(first, 24);
}

INSTANTIATE_TEST_SUITE_P(
    EachListener, PortConflictTest,
    ::testing::Values(PortCase{"gRPC", "--port", &ServerProcess::grpc_port},
                      PortCase{"HTTP", "--http-port", &ServerProcess::http_port},
                      PortCase{"metrics", "--metrics-port", &ServerProcess::metrics_port}),
    [](const ::testing::TestParamInfo<PortCase>& info) {
      return std::string(info.param.listener == std::string("gRPC")   ? "grpc"
                         : info.param.listener == std::string("HTTP") ? "http"
                                                                      : "metrics");
    });

// One server, one port for two listeners: the second listener to start refuses.
TEST(PortConflictHostile, OneServerGivenOnePortTwice) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  const std::string p = std::to_string(port);
  // gRPC starts before HTTP; metrics before gRPC.
  const Outcome http = StartSecond({"--port=" + p, "--http_port=" + p});
  EXPECT_FALSE(http.ready) << http.log;
  EXPECT_NE(http.exit_code, 0) << http.log;
  EXPECT_TRUE(absl::StrContains(http.log, "(--http-port " + p + ")")) << http.log;
  const Outcome grpc = StartSecond({"--port=" + p, "--metrics_port=" + p});
  EXPECT_FALSE(grpc.ready) << grpc.log;
  EXPECT_NE(grpc.exit_code, 0) << grpc.log;
  EXPECT_TRUE(absl::StrContains(grpc.log, "(--port " + p + ")")) << grpc.log;
}

}  // namespace
}  // namespace attn::integration
