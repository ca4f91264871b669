#include "tests/integration/attnctl_runner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace attn::integration {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

std::string AttnctlBinary() {
  const char* env = std::getenv("ATTNCTL_BINARY");
  return env != nullptr && *env != '\0' ? env : ATTNCTL_BINARY;
}

std::string AttnctlResult::Describe() const {
  return "exit " + std::to_string(exit_code) + "\n--- stdout ---\n" + out.substr(0, 4000) +
         "\n--- stderr ---\n" + err.substr(0, 4000);
}

AttnctlResult RunAttnctl(const std::vector<std::string>& args, const std::string& stdin_bytes,
                         const std::vector<std::string>& env) {
  static int calls = 0;
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/attnctl-run-" +
                           std::to_string(getpid()) + "-" + std::to_string(++calls);
  const std::string in_path = base + ".in", err_path = base + ".err";
  std::ofstream(in_path, std::ios::binary) << stdin_bytes;
  std::string command = "env -u ATTNSERVE_ADDR -u ATTNSERVE_TOKEN -u ATTNSERVE_API_KEY";
  for (const std::string& e : env) command += " " + ShellQuote(e);
  command += " " + ShellQuote(AttnctlBinary());
  for (const std::string& a : args) command += " " + ShellQuote(a);
  command += " <" + ShellQuote(in_path) + " 2>" + ShellQuote(err_path);
  AttnctlResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe != nullptr) {
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) result.out.append(buffer, n);
    const int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result.err = ReadAll(err_path);
  std::remove(in_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

}  // namespace attn::integration
