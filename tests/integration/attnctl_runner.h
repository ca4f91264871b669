// Runs the real attnctl binary from a test (tests/integration, tests/reliability): its exit code,
// stdout and stderr apart, with chosen stdin and environment.
#pragma once

#include <string>
#include <vector>

namespace attn::integration {

// $ATTNCTL_BINARY (to run the tests against another build, e.g. an older attnctl), else the one
// CMake built.
std::string AttnctlBinary();

struct AttnctlResult {
  int exit_code = -1;  // -1: killed or not run
  std::string out;
  std::string err;
  std::string Describe() const;  // for assertion messages
};

// attnctl `args` with `stdin_bytes` on stdin, the attnctl variables (ATTNSERVE_ADDR,
// ATTNSERVE_TOKEN, ATTNSERVE_API_KEY) unset unless `env` ("NAME=value" entries) sets them.
AttnctlResult RunAttnctl(const std::vector<std::string>& args, const std::string& stdin_bytes = "",
                         const std::vector<std::string>& env = {});

}  // namespace attn::integration
