// main() of every integration test binary: starts the binary's shared attnserve (flags from
// SharedServerFlags()) before the first test and stops it after the last, printing its log if
// anything failed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>

#include "tests/integration/harness.h"
#include "tests/test_policy.h"

namespace attn::integration {
namespace {

ServerProcess* g_shared_server = nullptr;

class SharedServerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::optional<std::vector<std::string>> flags = SharedServerFlags();
    if (!flags.has_value()) return;
    g_shared_server = new ServerProcess(*flags);
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    // A fatal failure here makes gtest skip every test, which fails the binary
    // (tests/test_policy.h).
    ASSERT_TRUE(g_shared_server->StartAndWait(std::chrono::seconds(90), &error)) << error;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[harness] attnserve pid %d ready on 127.0.0.1:%d (metrics :%d) after %.2f s\n",
                static_cast<int>(g_shared_server->process().pid()), g_shared_server->grpc_port(),
                g_shared_server->metrics_port(), seconds);
    std::fflush(stdout);
  }

  void TearDown() override {
    if (g_shared_server == nullptr) return;
    if (!g_shared_server->spawned()) {  // SetUp already reported why
      delete g_shared_server;
      g_shared_server = nullptr;
      return;
    }
    const bool was_running = g_shared_server->process().Running();
    const int status = g_shared_server->process().Stop(std::chrono::seconds(35));
    // A clean SIGTERM exit is part of the contract, also for an idle server.
    if (was_running) {
      EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "shared attnserve after SIGTERM: " << g_shared_server->process().ExitDescription();
    }
    if (!::testing::UnitTest::GetInstance()->Passed()) {
      std::printf("--- shared attnserve log (%s) ---\n%s\n--- end of log ---\n",
                  g_shared_server->process().ExitDescription().c_str(),
                  g_shared_server->process().LogTail().c_str());
    }
    delete g_shared_server;
    g_shared_server = nullptr;
  }
};

}  // namespace

ServerProcess& SharedServer() {
  if (g_shared_server == nullptr) {
    std::fprintf(stderr, "SharedServer(): this binary's SharedServerFlags() returned nullopt\n");
    std::abort();
  }
  // A server that died in an earlier test would make every later failure confusing.
  if (!g_shared_server->process().Running()) {
    ADD_FAILURE() << "the shared attnserve is not running: "
                  << g_shared_server->process().ExitDescription() << "\n--- log ---\n"
                  << g_shared_server->process().LogTail();
  }
  return *g_shared_server;
}

}  // namespace attn::integration

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  attn::testing::InstallTestPolicy();
  // A test that writes to a closed socket must fail, not die.
  signal(SIGPIPE, SIG_IGN);
  ::testing::AddGlobalTestEnvironment(new attn::integration::SharedServerEnvironment());
  return attn::testing::FinishTestPolicy(RUN_ALL_TESTS());
}
