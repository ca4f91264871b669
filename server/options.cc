// Every attnserve flag, its default (taken from ServerOptions) and its validation.
#include "server/options.h"

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "server/core/cost_model.h"

namespace {
const attn::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR,
          "Hugging Face model directory to serve (config.json, model.safetensors, vocab.txt, "
          "...). Default: the model installed by scripts/setup.sh.");
ABSL_FLAG(std::string, host, kDefaults.host, "Address to listen on for gRPC.");
ABSL_FLAG(int, port, kDefaults.port, "gRPC port; 0 picks a free port (see --ready-file).");
ABSL_FLAG(int, metrics_port, kDefaults.metrics_port,
          "Prometheus /metrics port on the same host; 0 picks a free port, -1 disables.");
ABSL_FLAG(int, http_port, kDefaults.http_port,
          "HTTP/JSON port on the same host: the OpenAI-compatible POST /v1/embeddings, REST "
          "routes of the Encoder calls (/v1/encode, /v1/attention, /v1/tokenize, /v1/models) "
          "and GET /health; 0 picks a free port, -1 disables.");
ABSL_FLAG(int, http_threads, kDefaults.http_threads,
          "HTTP worker threads: requests served at once (each waits for its engine call).");
ABSL_FLAG(int, http_max_connections, kDefaults.http_max_connections,
          "Open HTTP connections at most (idle keep-alive ones included); beyond it a new "
          "connection is closed at once.");
ABSL_FLAG(double, http_header_timeout_s, kDefaults.http_header_timeout_s,
          "Seconds a client has to send a whole HTTP request head, and to send the next one on a "
          "kept-alive connection (slow-loris protection: a client trickling its headers gets "
          "408 and the connection closes).");
ABSL_FLAG(double, http_request_timeout_s, kDefaults.http_request_timeout_s,
          "Deadline of one HTTP call, from receipt to answer (HTTP has no client deadline); "
          "beyond it the call is dropped and answered 504.");
ABSL_FLAG(std::string, model_name, "",
          "The model's name in the OpenAI API (`model` in /v1/embeddings, /v1/models); a name "
          "ending in /<model-name> is accepted too. Empty: the basename of --model-dir.");
ABSL_FLAG(std::string, api_key_file, "",
          "Requires 'authorization: Bearer <key>' on Encoder calls (gRPC) and every HTTP route "
          "but /health: a file holding the key (surrounding whitespace ignored). Empty: open.");
ABSL_FLAG(std::string, ready_file, "",
          "If set, once the model is loaded and health is SERVING, write "
          "{\"grpc_port\":N,\"metrics_port\":M,\"http_port\":H,\"pid\":P} here "
          "(atomically; -1 for an endpoint that is off).");
ABSL_FLAG(int64_t, max_batch_tokens, kDefaults.max_batch_tokens,
          "Token budget of one packed engine batch; concurrent requests are merged up to it "
          "(at least 512).");
ABSL_FLAG(int, max_concurrent_requests, kDefaults.max_concurrent_requests,
          "Requests admitted at once (queued or running); more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_inputs_per_request, kDefaults.max_inputs_per_request,
          "Most inputs in one Encode/AttentionMap/Tokenize call.");
ABSL_FLAG(int, max_explain_documents, kDefaults.max_explain_documents,
          "Most documents in one Explain call (each is explained against the query: an "
          "attribution costs tens to thousands of forwards).");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "Largest request and response in bytes.");
ABSL_FLAG(int64_t, max_request_memory_bytes, kDefaults.max_request_memory_bytes,
          "Largest estimated working memory of one Encode/AttentionMap call (engine outputs, "
          "the response and its serialised copy; see README); larger calls get "
          "RESOURCE_EXHAUSTED before any work. Capped at the memory budget.");
ABSL_FLAG(int64_t, memory_budget_bytes, kDefaults.memory_budget_bytes,
          "Estimated working memory of all admitted calls together; a call that does not fit "
          "gets RESOURCE_EXHAUSTED (retry with back-off). 0 = half the cgroup memory limit "
          "(cgroup v2 memory.max or v1 memory.limit_in_bytes), or half the physical memory "
          "when there is no limit.");
ABSL_FLAG(int, threads, kDefaults.threads, "Engine (OpenMP) threads; 0 = all cores.");
ABSL_FLAG(std::string, precision, attn::PrecisionName(kDefaults.precision),
          "Engine precision: float32 (fp32, bit-for-bit Hugging Face parity); int8 (linear "
          "layers quantised per output channel at load, activations per token; pooled cosine to "
          "fp32 >= 0.995); bf16 (every matmul on bfloat16 inputs with fp32 accumulation; "
          "cosine >= 0.999; needs avx512_bf16 or AMX, see --allow-slow-precision); auto (bf16 "
          "where the CPU has it, else float32). Applies to every served version, fine-tuned "
          "ones included; reported by GetModelInfo and the attnserve_model_info metric.");
ABSL_FLAG(bool, allow_slow_precision, kDefaults.allow_slow_precision,
          "Serve --precision bf16 on a CPU without bfloat16 instructions (emulated: correct, "
          "but no faster than float32).");
ABSL_FLAG(double, drain_timeout_s, kDefaults.drain_timeout_s,
          "On SIGTERM/SIGINT: seconds to let in-flight requests finish before exiting.");
ABSL_FLAG(std::string, log_level, kDefaults.log_level, "debug, info, warning or error.");
ABSL_FLAG(std::string, trainer_token_file, "",
          "Enables the Trainer service (FineTune, ListVersions, Rollback, SetServingVersion): "
          "a file holding the bearer token clients must send as 'authorization: Bearer <token>' "
          "(surrounding whitespace is ignored; an empty file is an error). Without it the "
          "Trainer answers UNIMPLEMENTED. The Encoder service needs no token.");
ABSL_FLAG(std::string, model_store, "",
          "Directory of committed fine-tuned versions (created if missing). At start every "
          "version in it is loaded and the latest one is served by default; commits write new "
          "versions here. Empty: FineTune answers FAILED_PRECONDITION (a job's result could not be "
          "kept).");
ABSL_FLAG(int, trainer_threads, kDefaults.trainer_threads,
          "OpenMP threads of the training thread (0 = all cores). Few threads keep Encode "
          "latency low while a job runs.");
ABSL_FLAG(int, trainer_nice, kDefaults.trainer_nice,
          "Niceness (0-19) added to the training thread's: under CPU contention the kernel "
          "prefers the threads serving Encode/AttentionMap, so their latency stays near idle "
          "while a job runs; an idle server still gives training every spare cycle.");
ABSL_FLAG(double, watch_store, kDefaults.watch_store_s,
          "Seconds between polls of --model-store for versions committed by another process "
          "(a trainer replica sharing the store); 0 = off. New complete versions are "
          "registered and the newest is served, unless an operator pinned an older one here "
          "with Rollback/SetServingVersion. Watching servers leave the store's temp dirs alone.");
ABSL_FLAG(int, max_loaded_versions, kDefaults.max_loaded_versions,
          "Model versions kept in memory (each ~175 MB for the default model in fp32). The served "
          "version and the most recently used ones stay; others are unloaded and loaded again "
          "from the model store when a request pins them.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve every service over TLS, the HTTP port included (give "
          "--tls-key too).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");

namespace attn::server {

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.http_header_timeout_s = absl::GetFlag(FLAGS_http_header_timeout_s);
  options.http_request_timeout_s = absl::GetFlag(FLAGS_http_request_timeout_s);
  options.model_name = absl::GetFlag(FLAGS_model_name);
  options.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  if (options.model_name.empty()) {
    std::string_view dir = options.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
    const size_t slash = dir.rfind('/');
    options.model_name = std::string(slash == std::string_view::npos ? dir : dir.substr(slash + 1));
  }
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  options.max_inputs_per_request = absl::GetFlag(FLAGS_max_inputs_per_request);
  options.max_explain_documents = absl::GetFlag(FLAGS_max_explain_documents);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_request_memory_bytes = absl::GetFlag(FLAGS_max_request_memory_bytes);
  options.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  options.log_level = absl::GetFlag(FLAGS_log_level);
  options.trainer_token_file = absl::GetFlag(FLAGS_trainer_token_file);
  options.model_store = absl::GetFlag(FLAGS_model_store);
  options.trainer_threads = absl::GetFlag(FLAGS_trainer_threads);
  options.trainer_nice = absl::GetFlag(FLAGS_trainer_nice);
  options.watch_store_s = absl::GetFlag(FLAGS_watch_store);
  options.max_loaded_versions = absl::GetFlag(FLAGS_max_loaded_versions);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);

  auto invalid = [](absl::string_view message) { return absl::InvalidArgumentError(message); };
  LogLevel level;
  if (!ParseLogLevel(options.log_level, &level)) {
    return invalid("--log-level must be debug, info, warning or error");
  }
  if (options.port < 0 || options.port > 65535) return invalid("--port must be in [0, 65535]");
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return invalid("--metrics-port must be -1 (off) or in [0, 65535]");
  }
  if (options.http_port < -1 || options.http_port > 65535) {
    return invalid("--http-port must be -1 (off) or in [0, 65535]");
  }
  if (options.http_threads < 1) return invalid("--http-threads must be >= 1");
  if (options.http_max_connections < 1) return invalid("--http-max-connections must be >= 1");
  if (!(options.http_header_timeout_s > 0)) return invalid("--http-header-timeout-s must be > 0");
  if (!(options.http_request_timeout_s > 0)) {
    return invalid("--http-request-timeout-s must be > 0");
  }
  if (options.max_batch_tokens < 512) return invalid("--max-batch-tokens must be >= 512");
  if (options.max_concurrent_requests < 1) {
    return invalid("--max-concurrent-requests must be >= 1");
  }
  if (options.max_inputs_per_request < 1) return invalid("--max-inputs-per-request must be >= 1");
  if (options.max_explain_documents < 1) return invalid("--max-explain-documents must be >= 1");
  if (options.max_message_bytes < 1024) return invalid("--max-message-bytes must be >= 1024");
  if (options.max_request_memory_bytes < 1) {
    return invalid("--max-request-memory-bytes must be >= 1");
  }
  if (options.memory_budget_bytes < 0) return invalid("--memory-budget-bytes must be >= 0");
  if (options.memory_budget_bytes == 0) options.memory_budget_bytes = DefaultMemoryBudgetBytes();
  if (options.threads < 0) return invalid("--threads must be >= 0");
  if (!ParsePrecision(absl::GetFlag(FLAGS_precision), &options.precision)) {
    return invalid("--precision must be float32 (or fp32), int8, bf16 or auto");
  }
  options.allow_slow_precision = absl::GetFlag(FLAGS_allow_slow_precision);
  if (const std::string slow = SlowPrecisionReason(options.precision);
      !slow.empty() && !options.allow_slow_precision) {
    return invalid(absl::StrCat("--precision ", absl::GetFlag(FLAGS_precision), ": ", slow,
                                "; use --precision auto or float32, or pass "
                                "--allow-slow-precision to serve it anyway"));
  }
  if (options.drain_timeout_s < 0) return invalid("--drain-timeout-s must be >= 0");
  if (options.trainer_threads < 0) return invalid("--trainer-threads must be >= 0");
  if (options.trainer_nice < 0 || options.trainer_nice > 19) {
    return invalid("--trainer-nice must be in [0, 19]");
  }
  if (options.watch_store_s < 0) return invalid("--watch-store must be >= 0 (0 = off)");
  if (options.watch_store_s > 0 && options.model_store.empty()) {
    return invalid("--watch-store needs --model-store (the directory to watch)");
  }
  if (options.max_loaded_versions < 1) return invalid("--max-loaded-versions must be >= 1");
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return invalid("--tls-cert and --tls-key go together: give both or neither");
  }
  return options;
}

}  // namespace attn::server
