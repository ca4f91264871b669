// Every attnserve flag, its default (taken from ServerOptions) and its validation.
#include "server/options.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "engine/quote.h"
#include "server/core/cost_model.h"
#include "server/core/model_set.h"

namespace {
const attn::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR,
          "Hugging Face model directory to serve (config.json, model.safetensors, vocab.txt, "
          "...) as the one model, named by --model-name. Default: the model installed by "
          "scripts/setup.sh. Use --model instead to serve several.");
ABSL_FLAG(std::vector<std::string>, model, {},
          "NAME=DIR: serve the Hugging Face model directory DIR under the name NAME (letters, "
          "digits, '.', '_', '-'; clients pick it with the request field `model`, attnctl "
          "--model, HTTP \"model\"). Repeatable (or comma-separated); the first is the default "
          "model, answering requests that name none. Replaces --model-dir/--model-name. Each "
          "model has its own versions, batcher queue and token budget (see --max-batch-tokens); "
          "--model-dir is ignored when --model is given; "
          "with several models, --model-store DIR keeps each model's versions in DIR/NAME/.");
ABSL_FLAG(std::string, host, kDefaults.host, "Address to listen on for gRPC.");
ABSL_FLAG(int, port, kDefaults.port, "gRPC port; 0 picks a free port (see --ready-file).");
ABSL_FLAG(int, metrics_port, kDefaults.metrics_port,
          "Prometheus /metrics port on the same host; 0 picks a free port, -1 disables.");
ABSL_FLAG(int, http_port, kDefaults.http_port,
          "HTTP/JSON port on the same host (the OpenAI-compatible POST /v1/embeddings, a route "
          "per Encoder call, Cohere/Jina-shaped rerank and the Open Inference Protocol's REST "
          "routes: the list is at the top of --help); 0 picks a free port, -1 disables.");
ABSL_FLAG(int, http_threads, kDefaults.http_threads,
          "HTTP worker threads: requests served at once (each waits for its engine call).");
ABSL_FLAG(int, http_max_connections, kDefaults.http_max_connections,
          "Open HTTP connections at most (idle keep-alive ones included); beyond it a new "
          "connection is closed at once.");
ABSL_FLAG(double, http_header_timeout_s, kDefaults.http_header_timeout_s,
          "Seconds a client has to send a whole HTTP request head, and to send the next one on a "
          "kept-alive connection (slow-loris protection: a client trickling its headers gets "
          "408 and the connection closes).");
ABSL_FLAG(std::string, openai_long_text, kDefaults.openai_long_text,
          "What POST /v1/embeddings does with an input over the model's limit (256 tokens for "
          "all-MiniLM-L6-v2) when the request says nothing: refuse (400 naming the input, its "
          "length and the ways out, as OpenAI's API does), truncate (embed its first tokens) or "
          "chunk (embed all of it in overlapping windows). A request chooses with \"truncate\": "
          "true/false or \"long_text\": \"chunk\"; every answer says per input what happened.");
ABSL_FLAG(double, http_request_timeout_s, kDefaults.http_request_timeout_s,
          "Deadline of one HTTP call, from receipt to answer (HTTP has no client deadline); "
          "beyond it the call is dropped and answered 504.");
ABSL_FLAG(double, http_body_timeout_s, kDefaults.http_body_timeout_s,
          "Seconds a client has to send a whole HTTP request body once its head has arrived; a "
          "body that stops arriving gets 408 and the connection closes.");
ABSL_FLAG(std::string, model_name, "",
          "The --model-dir model's name: the request field `model` (gRPC) and the OpenAI API's "
          "`model` (/v1/embeddings, /v1/models; a name ending in /<model-name> is accepted too). "
          "Empty: the basename of --model-dir.");
ABSL_FLAG(std::string, api_key_file, "",
          "Requires 'authorization: Bearer <key>' on Encoder calls (gRPC), the Open Inference "
          "Protocol's calls but its live/ready probes, and every HTTP route but /health: a file "
          "holding the key (surrounding whitespace ignored). Empty: open.");
ABSL_FLAG(std::string, ready_file, "",
          "If set, once the model is loaded and health is SERVING, write "
          "{\"grpc_port\":N,\"metrics_port\":M,\"http_port\":H,\"pid\":P} here "
          "(atomically; -1 for an endpoint that is off).");
ABSL_FLAG(int64_t, max_batch_tokens, kDefaults.max_batch_tokens,
          "Token budget of one packed engine batch; concurrent requests are merged up to it "
          "(at least 512). With several --model: the budget of the cheapest model; a model whose "
          "per-token cost (layers x (4 hidden^2 + 2 hidden x intermediate) multiply-adds) is k "
          "times the cheapest's gets max(512, this / k) tokens (all-mpnet-base-v2 next to "
          "all-MiniLM-L6-v2: k = 8, 1024 tokens at the default), so a batch of each model takes "
          "about as long.");
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
ABSL_FLAG(double, shutdown_delay_s, kDefaults.shutdown_delay_s,
          "On SIGTERM/SIGINT: seconds to keep answering calls while health says NOT_SERVING "
          "(gRPC health, GET /health and /v2/health/ready: 503) before the drain starts, so a load "
          "balancer's health checks take this replica out while it still answers (HAProxy in "
          "deploy/replicas/haproxy.cfg checks every 0.5 s, down after 2: give 1.5; Kubernetes' "
          "preStop sleep does the same). 0: drain at once.");
ABSL_FLAG(double, drain_timeout_s, kDefaults.drain_timeout_s,
          "On SIGTERM/SIGINT: seconds to let in-flight requests finish before exiting.");
ABSL_FLAG(std::string, log_level, kDefaults.log_level, "debug, info, warning or error.");
ABSL_FLAG(std::string, trainer_token_file, "",
          "Enables the Trainer service (FineTune, the job calls, versions and promotion): "
          "a file holding the bearer token clients must send as 'authorization: Bearer <token>' "
          "(surrounding whitespace is ignored; an empty file is an error). Without it the "
          "Trainer answers UNIMPLEMENTED. The Encoder service needs no token.");
ABSL_FLAG(std::string, model_store, "",
          "Directory of committed fine-tuned versions and server-side jobs (created if missing). "
          "Commits write new versions here, staged unless promoted. At start the server serves "
          "by default the version the store records as serving (serving.json, written by "
          "promote, rollback and promoting commits; base until one is promoted); a store "
          "without that record, from a release before it, serves its newest version. Empty: "
          "fine-tuning answers FAILED_PRECONDITION (a job's result could not be kept).");
ABSL_FLAG(int, trainer_threads, kDefaults.trainer_threads,
          "OpenMP threads of the training thread (0 = all cores). Few threads keep Encode "
          "latency low while a job runs.");
ABSL_FLAG(int, trainer_nice, kDefaults.trainer_nice,
          "Niceness (0-19) added to the training thread's: under CPU contention the kernel "
          "prefers the threads serving Encode/AttentionMap, so their latency stays near idle "
          "while a job runs; an idle server still gives training every spare cycle.");
ABSL_FLAG(int, max_queued_jobs, kDefaults.max_queued_jobs,
          "Server-side fine-tuning jobs (CreateJob, 'attnctl finetune --detach') that may wait "
          "per model, uploads in progress included; one runs at a time. Beyond it CreateJob "
          "answers RESOURCE_EXHAUSTED. A waiting job holds its dataset in --model-store.");
ABSL_FLAG(int64_t, max_job_dataset_bytes, kDefaults.max_job_dataset_bytes,
          "Largest dataset a server-side job may upload, in bytes (at most 4 GiB - 1). A bigger "
          "declared size is refused before any upload, a size that lied is caught while it "
          "arrives.");
ABSL_FLAG(double, stream_idle_timeout_s, kDefaults.stream_idle_timeout_s,
          "Seconds a FineTune or CreateJob stream may wait for its client's next message (time "
          "the server spends training does not count); then it is cancelled, the job discarded, "
          "and the model's fine-tuning slot or job queue place it held is free for the next "
          "job. A client that was killed, stopped or cut off by the network would otherwise "
          "hold them until a restart. 0 = never.");
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

absl::StatusOr<std::vector<ModelSpec>> ParseModelSpecs(const std::vector<std::string>& entries) {
  std::vector<ModelSpec> models;
  for (const std::string& entry : entries) {
    const size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == entry.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model ", QuoteInput(entry),
                       ": expected NAME=DIR, e.g. --model minilm=models/all-MiniLM-L6-v2"));
    }
    ModelSpec spec{entry.substr(0, equals), entry.substr(equals + 1)};
    if (absl::Status valid = ValidateModelName(spec.name); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--model: ", valid.message()));
    }
    for (const ModelSpec& other : models) {
      if (other.name == spec.name) {
        return absl::InvalidArgumentError(absl::StrCat("--model: the name '", spec.name,
                                                       "' is given twice; name each model once"));
      }
    }
    models.push_back(std::move(spec));
  }
  return models;
}

int64_t ScaledBatchTokens(int64_t max_batch_tokens, double model_cost, double cheapest_cost) {
  if (!(model_cost > cheapest_cost) || !(cheapest_cost > 0)) return max_batch_tokens;
  const double scaled =
      std::floor(static_cast<double>(max_batch_tokens) * cheapest_cost / model_cost);
  return std::max<int64_t>(std::min<int64_t>(512, max_batch_tokens), static_cast<int64_t>(scaled));
}

std::vector<char*> MergeRepeatedModelFlags(int argc, char** argv,
                                           std::vector<std::string>* storage) {
  std::vector<char*> merged;
  std::string values;
  int merged_at = -1;
  storage->reserve(storage->size() + 1);  // no reallocation: merged points into it
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg = argv[i];
    absl::string_view name = arg;
    if (i > 0 && absl::StartsWith(name, "-"))
      name.remove_prefix(absl::StartsWith(name, "--") ? 2 : 1);
    const bool separate = i > 0 && arg != name && name == "model" && i + 1 < argc;
    const bool joined = i > 0 && arg != name && absl::StartsWith(name, "model=");
    if (arg == "--") {  // the rest are positional arguments
      for (; i < argc; ++i) merged.push_back(argv[i]);
      break;
    }
    if (!separate && !joined) {
      merged.push_back(argv[i]);
      continue;
    }
    absl::string_view value = separate ? absl::string_view(argv[++i]) : name.substr(6);
    if (value.empty()) value = "=";  // refused by ParseModelSpecs, not read as "no --model"
    absl::StrAppend(&values, values.empty() && merged_at < 0 ? "" : ",", value);
    if (merged_at < 0) {
      merged_at = static_cast<int>(merged.size());
      merged.push_back(nullptr);
    }
  }
  if (merged_at >= 0) {
    storage->push_back(absl::StrCat("--model=", values));
    merged[merged_at] = storage->back().data();
  }
  return merged;
}

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
  options.http_body_timeout_s = absl::GetFlag(FLAGS_http_body_timeout_s);
  options.http_request_timeout_s = absl::GetFlag(FLAGS_http_request_timeout_s);
  options.openai_long_text = absl::GetFlag(FLAGS_openai_long_text);
  options.model_name = absl::GetFlag(FLAGS_model_name);
  options.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  const std::vector<std::string> model_entries = absl::GetFlag(FLAGS_model);
  if (!model_entries.empty()) {
    if (!options.model_name.empty()) {
      return absl::InvalidArgumentError(
          "--model NAME=DIR names each model itself: give either --model (one or more) or "
          "--model-dir [--model-name], not --model-name with --model");
    }
    const absl::CommandLineFlag& model_dir = absl::GetFlagReflectionHandle(FLAGS_model_dir);
    if (model_dir.CurrentValue() != model_dir.DefaultValue()) {
      Log(LogLevel::kWarning, "--model-dir %s is ignored: --model NAME=DIR gives the models",
          options.model_dir);
    }
    absl::StatusOr<std::vector<ModelSpec>> models = ParseModelSpecs(model_entries);
    if (!models.ok()) return models.status();
    options.models = *std::move(models);
  } else {
    if (options.model_name.empty()) {
      std::string_view dir = options.model_dir;
      while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
      const size_t slash = dir.rfind('/');
      options.model_name =
          std::string(slash == std::string_view::npos ? dir : dir.substr(slash + 1));
    }
    if (absl::Status valid = ValidateModelName(options.model_name); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-name (or the basename of --model-dir): ", valid.message()));
    }
    options.models = {{options.model_name, options.model_dir}};
  }
  options.model_dir = options.models.front().dir;
  options.model_name = options.models.front().name;
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
  options.shutdown_delay_s = absl::GetFlag(FLAGS_shutdown_delay_s);
  options.log_level = absl::GetFlag(FLAGS_log_level);
  options.trainer_token_file = absl::GetFlag(FLAGS_trainer_token_file);
  options.model_store = absl::GetFlag(FLAGS_model_store);
  options.trainer_threads = absl::GetFlag(FLAGS_trainer_threads);
  options.trainer_nice = absl::GetFlag(FLAGS_trainer_nice);
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  options.max_job_dataset_bytes = absl::GetFlag(FLAGS_max_job_dataset_bytes);
  options.stream_idle_timeout_s = absl::GetFlag(FLAGS_stream_idle_timeout_s);
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
  if (!(options.http_body_timeout_s > 0)) return invalid("--http-body-timeout-s must be > 0");
  if (!(options.http_request_timeout_s > 0)) {
    return invalid("--http-request-timeout-s must be > 0");
  }
  if (options.openai_long_text != "refuse" && options.openai_long_text != "truncate" &&
      options.openai_long_text != "chunk") {
    return invalid(absl::StrCat("--openai-long-text ", QuoteInput(options.openai_long_text),
                                ": must be refuse, truncate or chunk"));
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
  if (!(options.shutdown_delay_s >= 0 && options.shutdown_delay_s <= 300)) {
    return invalid("--shutdown-delay-s must be 0 .. 300");
  }
  if (options.trainer_threads < 0) return invalid("--trainer-threads must be >= 0");
  if (options.max_queued_jobs < 1 || options.max_queued_jobs > 10000) {
    return invalid("--max-queued-jobs must be in [1, 10000]");
  }
  // Datasets are indexed with 32-bit offsets (core/job_dataset.h).
  if (options.max_job_dataset_bytes < 1 || options.max_job_dataset_bytes > (int64_t{4} << 30) - 1) {
    return invalid("--max-job-dataset-bytes must be in [1, 4294967295]");
  }
  if (!(options.stream_idle_timeout_s >= 0) || options.stream_idle_timeout_s > 86400) {
    return invalid("--stream-idle-timeout-s must be in [0, 86400] (0 = never)");
  }
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
