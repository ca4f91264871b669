// Server settings, one struct with defaults: the single source of every default (the flags in
// options.cc show them in --help; the core's option structs get their values from here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/precision.h"

namespace attn::server {

// One served model: its name (clients pick it with the `model` request field) and the Hugging
// Face directory its version "base" loads from.
struct ModelSpec {
  std::string name;
  std::string dir;
};

struct ServerOptions {
  // The served models, the default first: --model NAME=DIR..., else one model from --model-dir
  // named by --model-name (or the directory's basename). Never empty after OptionsFromFlags.
  std::vector<ModelSpec> models;
  std::string model_dir;  // the default model's directory (models[0].dir)
  std::string host = "0.0.0.0";
  int port = 50051;                 // 0 = pick a free port
  int metrics_port = 9464;          // 0 = pick a free port, -1 = no metrics endpoint
  int http_port = 8080;             // HTTP/JSON + OpenAI front end; 0 = pick, -1 = off
  std::string ready_file;           // written (JSON ports + pid) once SERVING
  int64_t max_batch_tokens = 8192;  // token budget of one packed engine batch
  int max_concurrent_requests =
      256;  // admitted (queued + running) requests; beyond: RESOURCE_EXHAUSTED
  int max_inputs_per_request = 256;
  int max_explain_documents = 16;          // documents of one Explain call
  int64_t max_message_bytes = 64ll << 20;  // request and response size limit
  // Estimated working memory of one Encode/AttentionMap call (server/core/cost_model.h);
  // beyond it the call is refused before any work.
  int64_t max_request_memory_bytes = 512ll << 20;
  // Working memory of all admitted calls together; 0 = half the cgroup memory limit (or of
  // physical memory when there is none). The engine workspace is taken off it once.
  int64_t memory_budget_bytes = 0;
  int threads = 0;                         // OpenMP threads for the engine; 0 = all cores
  Precision precision = Precision::kFp32;  // fp32, int8 or bf16 (see --precision)
  bool allow_slow_precision = false;       // serve bf16 where the CPU only emulates it
  double drain_timeout_s = 30.0;  // SIGTERM: how long in-flight requests may take to finish
  // SIGTERM: how long to keep serving while health says NOT_SERVING, before the drain, so a load
  // balancer's health checks take the replica out first (0 = drain at once).
  double shutdown_delay_s = 0;
  std::string log_level = "info";  // debug, info, warning or error

  // Fine-tuning. The Trainer service answers UNIMPLEMENTED unless a token is configured.
  std::string trainer_token_file;  // file holding the bearer token ("" = Trainer disabled)
  std::string model_store;         // committed versions live here ("" = no fine-tuning jobs)
  int trainer_threads = 1;         // OpenMP threads of the training thread
  int trainer_nice = 10;           // niceness added to the training thread (0 = as the server)
  // Server-side jobs (CreateJob), per model: pending jobs (uploads included) and the largest
  // dataset one may upload.
  int max_queued_jobs = 16;
  int64_t max_job_dataset_bytes = 256ll << 20;
  // A FineTune or CreateJob stream waiting this long for its client's next message is
  // cancelled, freeing the fine-tuning slot or queue place it held (0 = never).
  double stream_idle_timeout_s = 300;

  // Scaling out: several servers share one model store that a single trainer writes.
  double watch_store_s = 0;  // poll --model-store this often for new versions (0 = off)
  int max_loaded_versions =
      4;  // versions kept in memory (~175 MB each in fp32); others load on demand

  // HTTP front end (server/http/).
  int http_threads = 16;               // worker threads: HTTP requests served at once
  int http_max_connections = 1024;     // open HTTP connections; more are closed at once
  double http_header_timeout_s = 10;   // a whole request head (line + headers) must arrive in it
  double http_request_timeout_s = 60;  // deadline of one HTTP call (gRPC clients set their own)
  // What POST /v1/embeddings does with an input over the model's limit when the request does
  // not say ("truncate" / "long_text"): refuse it (400, as OpenAI's API does), truncate it or
  // chunk it (server/http/openai_embeddings.h).
  std::string openai_long_text = "refuse";
  double http_body_timeout_s = 60;  // a request body must arrive in it (else 408)
  std::string model_name;           // the default model's name (models[0].name)

  // Inference authentication: a bearer token for the Encoder service and every HTTP route but
  // /health ("" = open).
  std::string api_key_file;

  // TLS for every service, HTTP included (both or neither; PEM files).
  std::string tls_cert;
  std::string tls_key;
};

// The options given by the command-line flags (parsed already), validated: INVALID_ARGUMENT
// naming the flag and its allowed values otherwise.
absl::StatusOr<ServerOptions> OptionsFromFlags();

// The --model entries ("NAME=DIR", comma-separated lists allowed) as specs, in order; the
// first one is the default. INVALID_ARGUMENT quoting (shortly) the malformed entry or naming
// the repeated name.
absl::StatusOr<std::vector<ModelSpec>> ParseModelSpecs(const std::vector<std::string>& entries);

// A model's token budget (`--max-batch-tokens` scaled by cost): `max_batch_tokens` is the budget
// of the cheapest served model; a model whose per-token cost (ModelTokenCost) is k times that
// gets max_batch_tokens / k tokens, at least 512 (one full-length sequence), so a batch of any
// model takes about as long as a full batch of the cheapest one.
int64_t ScaledBatchTokens(int64_t max_batch_tokens, double model_cost, double cheapest_cost);

// argv with every "--model V" / "--model=V" (one or two dashes) merged into one "--model=V1,V2"
// at the first one's place: absl flags keep only the last occurrence of a flag, and --model is
// repeatable. The strings live in `storage`.
std::vector<char*> MergeRepeatedModelFlags(int argc, char** argv,
                                           std::vector<std::string>* storage);

}  // namespace attn::server
