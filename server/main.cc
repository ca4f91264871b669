// attnserve: serves a BERT-family encoder over gRPC (attnserve.v1.Encoder) and HTTP/JSON (with
// the OpenAI-compatible /v1/embeddings) and, when a token is configured, fine-tunes it
// (attnserve.v1.Trainer), with the standard health service, server
// reflection and Prometheus metrics. Run with --help for the flags (server/options.cc).
#include <malloc.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cli_util.h"
#include "engine/log.h"
#include "server/auth.h"
#include "server/oip/oip_rest.h"
#include "server/options.h"
#include "server/server_runner.h"

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
  const std::string usage = absl::StrCat(
      "serves a BERT-family encoder over gRPC and HTTP/JSON (attnserve.v1.Encoder: Encode, "
      "AttentionMap, Tokenize, GetModelInfo; attnserve.v1.Trainer: FineTune, ListVersions, "
      "Rollback, SetServingVersion, enabled by --trainer-token-file) with grpc.health.v1 "
      "health checks, server reflection and Prometheus metrics; over HTTP the same calls "
      "as JSON, the OpenAI-compatible POST /v1/embeddings and Cohere/Jina-shaped POST "
      "/v1/rerank, /v2/rerank, /rerank (--http-port).\n",
      attn::server::oip::OipUsage(),
      "Flags take dashes or underscores (--model-dir or --model_dir).\n"
      "Example: attnserve --port 50051 --metrics-port 9464\n"
      "Several models: attnserve --model minilm=models/all-MiniLM-L6-v2 "
      "--model mpnet=models/all-mpnet-base-v2 (the first is the default; requests pick one "
      "with their `model` field)");
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
