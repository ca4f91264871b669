// attnserve: serves a BERT-family encoder over gRPC (attnserve.v1.Encoder) and, when a token is
// configured, fine-tunes it (attnserve.v1.Trainer), with the standard health service, server
// reflection and Prometheus metrics. Run with --help for the flags.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <malloc.h>
#include <omp.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/cli_util.h"
#include "engine/log.h"
#include "engine/model.h"
#include "engine/model_store.h"
#include "server/auth.h"
#include "server/batcher.h"
#include "server/encoder_service.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/options.h"
#include "server/trainer_service.h"

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
ABSL_FLAG(std::string, ready_file, "",
          "If set, once the model is loaded and health is SERVING, write "
          "{\"grpc_port\":N,\"metrics_port\":M,\"pid\":P} here (atomically).");
ABSL_FLAG(int64_t, max_batch_tokens, kDefaults.max_batch_tokens,
          "Token budget of one packed engine batch; concurrent requests are merged up to it "
          "(at least 512).");
ABSL_FLAG(int, max_concurrent_requests, kDefaults.max_concurrent_requests,
          "Requests admitted at once (queued or running); more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_inputs_per_request, kDefaults.max_inputs_per_request,
          "Most inputs in one Encode/AttentionMap/Tokenize call.");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "Largest request and response in bytes.");
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
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");
ABSL_FLAG(std::string, trainer_token_file, "",
          "Enables the Trainer service (FineTune, ListVersions, Rollback, SetServingVersion): "
          "a file holding the bearer token clients must send as 'authorization: Bearer <token>' "
          "(surrounding whitespace is ignored; an empty file is an error). Without it the "
          "Trainer answers UNIMPLEMENTED. The Encoder service needs no token.");
ABSL_FLAG(std::string, model_store, "",
          "Directory of committed fine-tuned versions (created if missing). At start every "
          "version in it is loaded and the latest one is served by default; commits write new "
          "versions here. Empty: fine-tuning runs but commits fail with FAILED_PRECONDITION.");
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
          "PEM certificate chain: serve every service over TLS (give --tls-key too).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");

namespace attn::server {
namespace {

constexpr const char* kEncoderServiceName = "attnserve.v1.Encoder";

int Fail(const std::string& message) {
  Log(LogLevel::kError, "%s", message);
  return 1;
}

absl::Status WriteReadyFile(const std::string& path, int grpc_port, int metrics_port) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << "{\"grpc_port\": " << grpc_port << ", \"metrics_port\": " << metrics_port
        << ", \"pid\": " << getpid() << "}\n";
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", temp));
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot rename to ", path, ": ", error.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (contents.str().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is empty"));
  }
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadFile(options.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(options.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

// A stored version's registry entry, not loaded yet (the registry loads it when it is served
// or pinned).
ModelVersion UnloadedVersion(const StoredVersion& stored) {
  ModelVersion version;
  version.version = stored.version;
  version.origin = absl::StrCat("fine-tuned from ", stored.base_version, " (", stored.objective,
                                ", ", stored.steps, stored.steps == 1 ? " step)" : " steps)");
  version.sequence = stored.sequence;
  version.created_utc = stored.created_utc;
  version.description = stored.description;
  return version;
}

// Loads a version's model from disk: "base" from --model-dir, the others from the store.
absl::StatusOr<std::shared_ptr<const Model>> LoadVersion(const ServerOptions& options,
                                                         const ModelVersion& version) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const Model>> model;
  if (version.version == "base") {
    model = Model::Load(options.model_dir, ModelOptions{options.precision});
  } else if (options.model_store.empty()) {
    model = absl::FailedPreconditionError("the server has no --model-store to load it from");
  } else {
    absl::StatusOr<StoredVersion> stored = ReadStoredVersion(options.model_store, version.version);
    absl::StatusOr<LoadedVersion> loaded =
        stored.ok() ? LoadStoredVersion(*stored, ModelOptions{options.precision})
                    : absl::StatusOr<LoadedVersion>(stored.status());
    if (loaded.ok()) {
      model = loaded->model;
    } else {
      model = loaded.status();
    }
  }
  if (model.ok()) {
    Log(LogLevel::kInfo, "loaded version %s in %.2f s", version.version,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } else {
    Log(LogLevel::kWarning, "cannot load version %s: %s", version.version,
        model.status().message());
  }
  return model;
}

// Registers every committed version of the model store, newest first: the newest one that
// loads is served, the others are listed and load when pinned. Returns the next commit's
// sequence number. A server that only watches the store leaves temp dirs alone (they may be a
// commit in progress by the trainer replica).
absl::StatusOr<int64_t> LoadModelStore(const std::string& store, bool clean_temp_dirs,
                                       ModelRegistry* registry) {
  std::error_code error;
  std::filesystem::create_directories(store, error);
  if (error || !std::filesystem::is_directory(store)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--model-store ", store, " is not a usable directory",
                     error ? absl::StrCat(": ", error.message()) : std::string()));
  }
  if (clean_temp_dirs) {
    absl::StatusOr<int> removed = RemoveStaleTempDirs(store);
    if (!removed.ok()) return removed.status();
    if (*removed > 0) {
      Log(LogLevel::kWarning, "model store %s: removed %d unfinished checkpoint(s) left by a crash",
          store, *removed);
    }
  }
  std::vector<std::string> skipped;
  absl::StatusOr<std::vector<StoredVersion>> versions = ListStore(store, &skipped);
  if (!versions.ok()) return versions.status();
  for (const std::string& reason : skipped) {
    Log(LogLevel::kWarning, "model store %s: skipped %s", store, reason);
  }
  int64_t next_sequence = 1;
  for (auto stored = versions->rbegin(); stored != versions->rend(); ++stored) {
    next_sequence = std::max(next_sequence, stored->sequence + 1);
    absl::StatusOr<bool> served = registry->Discover(UnloadedVersion(*stored));
    if (!served.ok()) {
      Log(LogLevel::kWarning, "model store %s: version %s: %s", store, stored->version,
          served.status().message());
    }
  }
  if (!versions->empty()) {
    Log(LogLevel::kInfo, "model store %s: %d version(s) listed, loaded: %s", store,
        static_cast<int>(versions->size()), absl::StrJoin(registry->LoadedVersions(), ", "));
  }
  return next_sequence;
}

// Polls the model store for versions another process committed and registers them (the
// registry serves the newest unless an operator pinned an older one). Commits appear in the
// store with one rename of a complete directory, and ListStore ignores temp dirs, so a poll
// never sees half a version.
class StoreWatcher {
 public:
  StoreWatcher(std::string store, double interval_s, ModelRegistry* registry)
      : store_(std::move(store)), interval_s_(interval_s), registry_(registry) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~StoreWatcher() { Stop(); }

  void Stop() {
    {
      absl::MutexLock lock(&mutex_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    while (true) {
      {
        absl::MutexLock lock(&mutex_);
        mutex_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(interval_s_));
        if (stopping_) return;
      }
      Poll();
    }
  }

  void Poll() {
    std::vector<std::string> skipped;
    absl::StatusOr<std::vector<StoredVersion>> versions = ListStore(store_, &skipped);
    if (!versions.ok()) {
      Warn(absl::StrCat("cannot list: ", versions.status().message()));
      return;
    }
    for (const std::string& reason : skipped) Warn(reason);  // "'name' skipped: why"
    for (const StoredVersion& stored : *versions) {
      if (registry_->Contains(stored.version)) continue;
      absl::StatusOr<bool> served = registry_->Discover(UnloadedVersion(stored));
      if (!served.ok()) {
        if (served.status().code() != absl::StatusCode::kAlreadyExists) {
          Warn(absl::StrCat("version ", stored.version, ": ", served.status().message()));
        }
        continue;
      }
      Log(LogLevel::kInfo, "model store %s: found new version %s%s", store_, stored.version,
          *served
              ? "; now served by default"
              : (registry_->follows_latest() ? "" : " (not served: an older version is pinned)"));
    }
  }

  // Each distinct problem is logged once, not at every poll.
  void Warn(const std::string& message) {
    if (warned_.insert(message).second) {
      Log(LogLevel::kWarning, "model store %s: %s", store_, message);
    }
  }

  const std::string store_;
  const double interval_s_;
  ModelRegistry* const registry_;
  std::set<std::string> warned_;  // used by the watcher thread only
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

int Run(const ServerOptions& options, std::optional<std::string> trainer_token) {
  // Signals are taken by a dedicated thread with sigwait, so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (options.threads > 0) omp_set_num_threads(options.threads);

  Metrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = -1;
  if (options.metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::StrCat(options.host, ":", options.metrics_port));
    } catch (const std::exception& e) {
      return Fail(absl::StrCat("cannot listen for metrics on ", options.host, ":",
                               options.metrics_port, ": ", e.what()));
    }
    exposer->RegisterCollectable(metrics.registry());
    metrics_port = exposer->GetListeningPorts().front();
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));

  ModelRegistry registry(options.max_loaded_versions, [&options](const ModelVersion& version) {
    return LoadVersion(options, version);
  });
  registry.SetEvictionListener([](const std::string& version) {
    Log(LogLevel::kInfo,
        "unloaded version %s (--max-loaded-versions reached; it loads again "
        "when a request pins it)",
        version);
  });
  // Every change of the default version (start-up, commit, Rollback, SetServingVersion) shows
  // in the metrics.
  registry.SetServingListener([&metrics](const ModelVersion& served) {
    const BertConfig& c = served.model->config();
    metrics.SetModelInfo(served.version, "bert", PrecisionName(served.model->precision()),
                         c.num_hidden_layers, c.hidden_size, c.num_attention_heads);
    metrics.SetServingVersion(served.version);
  });
  Batcher batcher({options.max_batch_tokens, options.max_concurrent_requests, options.threads},
                  &metrics);
  EncoderService encoder(options, &registry, &batcher, &metrics);
  TrainerService trainer(options, std::move(trainer_token), &registry, &metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), *credentials, &grpc_port);
  builder.RegisterService(&encoder);
  builder.RegisterService(&trainer);
  // gRPC's own limits sit above ours so oversized requests reach our handler and get a message
  // that says which flag to raise; gRPC's hard cap still bounds memory.
  const int64_t hard_limit =
      std::min<int64_t>(options.max_message_bytes * 2 + (1 << 20), INT32_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(hard_limit));
  builder.SetMaxSendMessageSize(static_cast<int>(hard_limit));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return Fail(absl::StrCat("cannot listen for gRPC on ", options.host, ":", options.port,
                             " (port in use or address not available)"));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // Register both names as NOT_SERVING now: a name set only later would answer NOT_FOUND while
  // the model loads.
  health->SetServingStatus(false);
  health->SetServingStatus(kEncoderServiceName, false);
  Log(LogLevel::kInfo, "listening on %s:%d (gRPC), metrics on port %d; loading %s", options.host,
      grpc_port, metrics_port, options.model_dir);

  ModelOptions model_options;
  model_options.precision = options.precision;
  auto model = Model::Load(options.model_dir, model_options);
  if (!model.ok()) {
    server->Shutdown();
    return Fail(absl::StrCat("cannot load the model: ", model.status().message(),
                             " (run scripts/setup.sh for the default model, or pass --model-dir)"));
  }
  const BertConfig& config = (*model)->config();
  ModelVersion base;
  base.version = "base";
  base.origin = absl::StrCat("loaded from ", options.model_dir);
  base.model = *model;
  registry.Add(std::move(base));
  if (!options.model_store.empty()) {
    absl::StatusOr<int64_t> next_sequence =
        LoadModelStore(options.model_store, options.watch_store_s == 0, &registry);
    if (!next_sequence.ok()) {
      server->Shutdown();
      return Fail(absl::StrCat("cannot use the model store: ", next_sequence.status().message()));
    }
    trainer.SetNextSequence(*next_sequence);
  }
  std::unique_ptr<StoreWatcher> watcher;
  if (options.watch_store_s > 0) {
    watcher = std::make_unique<StoreWatcher>(options.model_store, options.watch_store_s, &registry);
    Log(LogLevel::kInfo, "watching model store %s every %g s for new versions", options.model_store,
        options.watch_store_s);
  }
  absl::StatusOr<ModelVersion> served = registry.Get("");
  health->SetServingStatus(true);
  health->SetServingStatus(kEncoderServiceName, true);
  Log(LogLevel::kInfo, "SERVING model version %s (%d layers, hidden %d, %d heads)%s%s",
      served.ok() ? served->version : "?", config.num_hidden_layers, config.hidden_size,
      config.num_attention_heads, options.tls_cert.empty() ? "" : " over TLS",
      options.trainer_token_file.empty() ? "; fine-tuning disabled (no --trainer-token-file)"
                                         : "; fine-tuning enabled");
  if (!options.ready_file.empty()) {
    if (absl::Status written = WriteReadyFile(options.ready_file, grpc_port, metrics_port);
        !written.ok()) {
      Log(LogLevel::kWarning, "%s", written.ToString());
    }
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Log(LogLevel::kInfo, "received %s: draining in-flight requests (up to %.0f s)",
      signal_number == SIGTERM ? "SIGTERM" : "SIGINT", options.drain_timeout_s);
  health->SetServingStatus(false);
  // Shutdown stops accepting calls and waits for the running ones (they finish through the
  // batcher, which keeps working) until the deadline, then cancels the rest.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(options.drain_timeout_s * 1e3)));
  batcher.Stop();
  if (watcher != nullptr) watcher->Stop();
  Log(LogLevel::kInfo, "drained; exiting");
  return 0;
}

}  // namespace
}  // namespace attn::server

int main(int argc, char** argv) {
  // Every engine batch allocates and frees large buffers (hidden states, attention maps,
  // responses) whose sizes follow the traffic. glibc raises its mmap threshold to the size of
  // each large block freed, after which such blocks come from the heap, where freed pages stay
  // resident in fragments: in a 30-minute soak the server's RSS kept climbing in steps whenever
  // a new batch shape appeared. A fixed threshold keeps blocks of 1 MiB and more on mmap, so
  // they go back to the system when freed (tests/reliability/README.md, "Load and soak").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  absl::SetProgramUsageMessage(
      "serves a BERT-family encoder over gRPC (attnserve.v1.Encoder: Encode, "
      "AttentionMap, Tokenize, GetModelInfo; attnserve.v1.Trainer: FineTune, ListVersions, "
      "Rollback, SetServingVersion, enabled by --trainer-token-file) with grpc.health.v1 "
      "health checks, server reflection and Prometheus metrics.\n"
      "Flags take dashes or underscores (--model-dir or --model_dir).\n"
      "Example: attnserve --port 50051 --metrics-port 9464");
  attn::ShowProjectFlagsInHelp("attnserve 0.1.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);

  attn::LogLevel level;
  if (!attn::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "attnserve: --log-level must be debug, info, warning or error\n");
    return 2;
  }
  attn::SetLogLevel(level);

  attn::server::ServerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  options.max_inputs_per_request = absl::GetFlag(FLAGS_max_inputs_per_request);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  options.trainer_token_file = absl::GetFlag(FLAGS_trainer_token_file);
  options.model_store = absl::GetFlag(FLAGS_model_store);
  options.trainer_threads = absl::GetFlag(FLAGS_trainer_threads);
  options.trainer_nice = absl::GetFlag(FLAGS_trainer_nice);
  options.watch_store_s = absl::GetFlag(FLAGS_watch_store);
  options.max_loaded_versions = absl::GetFlag(FLAGS_max_loaded_versions);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);

  auto usage_error = [](const std::string& message) {
    std::fprintf(stderr, "attnserve: %s (see --help)\n", message.c_str());
    return 2;
  };
  if (options.port < 0 || options.port > 65535) return usage_error("--port must be in [0, 65535]");
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return usage_error("--metrics-port must be -1 (off) or in [0, 65535]");
  }
  if (options.max_batch_tokens < 512) return usage_error("--max-batch-tokens must be >= 512");
  if (options.max_concurrent_requests < 1)
    return usage_error("--max-concurrent-requests must be >= 1");
  if (options.max_inputs_per_request < 1)
    return usage_error("--max-inputs-per-request must be >= 1");
  if (options.max_message_bytes < 1024) return usage_error("--max-message-bytes must be >= 1024");
  if (options.threads < 0) return usage_error("--threads must be >= 0");
  if (!attn::ParsePrecision(absl::GetFlag(FLAGS_precision), &options.precision)) {
    return usage_error("--precision must be float32 (or fp32), int8, bf16 or auto");
  }
  options.allow_slow_precision = absl::GetFlag(FLAGS_allow_slow_precision);
  if (const std::string slow = attn::SlowPrecisionReason(options.precision);
      !slow.empty() && !options.allow_slow_precision) {
    return usage_error(absl::StrCat("--precision ", absl::GetFlag(FLAGS_precision), ": ", slow,
                                    "; use --precision auto or float32, or pass "
                                    "--allow-slow-precision to serve it anyway"));
  }
  if (options.drain_timeout_s < 0) return usage_error("--drain-timeout-s must be >= 0");
  if (options.trainer_threads < 0) return usage_error("--trainer-threads must be >= 0");
  if (options.trainer_nice < 0 || options.trainer_nice > 19) {
    return usage_error("--trainer-nice must be in [0, 19]");
  }
  if (options.watch_store_s < 0) return usage_error("--watch-store must be >= 0 (0 = off)");
  if (options.watch_store_s > 0 && options.model_store.empty()) {
    return usage_error("--watch-store needs --model-store (the directory to watch)");
  }
  if (options.max_loaded_versions < 1) return usage_error("--max-loaded-versions must be >= 1");
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return usage_error("--tls-cert and --tls-key go together: give both or neither");
  }
  std::optional<std::string> trainer_token;
  if (!options.trainer_token_file.empty()) {
    absl::StatusOr<std::string> token = attn::server::ReadTokenFile(options.trainer_token_file);
    if (!token.ok()) return usage_error(std::string(token.status().message()));
    trainer_token = std::move(*token);
  }
  return attn::server::Run(options, std::move(trainer_token));
}
