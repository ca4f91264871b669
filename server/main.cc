// attnserve: serves a BERT-family encoder over gRPC (attnserve.v1.Encoder) and HTTP/JSON (with
// the OpenAI-compatible /v1/embeddings) and, when a token is configured, fine-tunes it
// (attnserve.v1.Trainer), with the standard health service, server
// reflection and Prometheus metrics. Run with --help for what it serves (server/usage.cc) and the
// flags (server/options.cc).
#include <malloc.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/cli_util.h"
#include "engine/log.h"
#include "server/auth.h"
#include "server/options.h"
#include "server/server_runner.h"
#include "server/usage.h"

int main(int argc, char** argv) {
  // Every engine batch allocates and frees large buffers (hidden states, attention maps,
  // responses) whose sizes follow the traffic. glibc raises its mmap threshold to the size of
  // each large block freed, after which such blocks come from the heap, where freed pages stay
  // resident in fragments: in a 30-minute soak the server's RSS kept climbing in steps whenever
  // a new batch shape appeared. A fixed threshold keeps blocks of 1 MiB and more on mmap, so
  // they go back to the system when freed (tests/reliability/README.md, "Load and soak").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // --model NAME=DIR is repeatable: its occurrences become one comma-separated list.
  std::vector<std::string> merged_storage;
  std::vector<char*> merged_argv =
      attn::server::MergeRepeatedModelFlags(argc, argv, &merged_storage);
  const std::string usage = attn::server::ServerUsage();
  attn::StartProgram(static_cast<int>(merged_argv.size()), merged_argv.data(), "attnserve",
                     usage.c_str());

  auto usage_error = [](const absl::Status& status) {
    std::fprintf(stderr, "attnserve: %s (see --help)\n", std::string(status.message()).c_str());
    return 2;
  };
  absl::StatusOr<attn::server::ServerOptions> options = attn::server::OptionsFromFlags();
  if (!options.ok()) return usage_error(options.status());
  attn::LogLevel level = attn::LogLevel::kInfo;
  attn::ParseLogLevel(options->log_level, &level);  // validated by OptionsFromFlags
  attn::SetLogLevel(level);

  std::optional<std::string> trainer_token;
  if (!options->trainer_token_file.empty()) {
    absl::StatusOr<std::string> token = attn::server::ReadTokenFile(options->trainer_token_file);
    if (!token.ok()) return usage_error(token.status());
    trainer_token = std::move(*token);
  }
  std::optional<std::string> api_key;
  if (!options->api_key_file.empty()) {
    absl::StatusOr<std::string> key = attn::server::ReadTokenFile(options->api_key_file, "API key");
    if (!key.ok()) return usage_error(key.status());
    api_key = std::move(*key);
  }
  return attn::server::RunServer(*options, std::move(trainer_token), std::move(api_key));
}
