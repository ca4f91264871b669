// attnserve: serves a BERT-family encoder over gRPC (attnserve.v1.Encoder), with the standard
// health service, server reflection and Prometheus metrics. Run with --help for the flags.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <omp.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/cli_util.h"
#include "engine/log.h"
#include "engine/model.h"
#include "server/batcher.h"
#include "server/encoder_service.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/options.h"

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
ABSL_FLAG(double, drain_timeout_s, kDefaults.drain_timeout_s,
          "On SIGTERM/SIGINT: seconds to let in-flight requests finish before exiting.");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");

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

int Run(const ServerOptions& options) {
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

  ModelRegistry registry;
  Batcher batcher({options.max_batch_tokens, options.max_concurrent_requests}, &metrics);
  EncoderService encoder(options, &registry, &batcher, &metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &grpc_port);
  builder.RegisterService(&encoder);
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

  auto model = Model::Load(options.model_dir);
  if (!model.ok()) {
    server->Shutdown();
    return Fail(absl::StrCat("cannot load the model: ", model.status().message(),
                             " (run scripts/setup.sh for the default model, or pass --model-dir)"));
  }
  const BertConfig& config = (*model)->config();
  registry.Add({"base", absl::StrCat("loaded from ", options.model_dir), *model});
  metrics.SetModelInfo("base", "bert", "float32", config.num_hidden_layers, config.hidden_size,
                       config.num_attention_heads);
  health->SetServingStatus(true);
  health->SetServingStatus(kEncoderServiceName, true);
  Log(LogLevel::kInfo, "SERVING model version base (%d layers, hidden %d, %d heads)",
      config.num_hidden_layers, config.hidden_size, config.num_attention_heads);
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
  Log(LogLevel::kInfo, "drained; exiting");
  return 0;
}

}  // namespace
}  // namespace attn::server

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "serves a BERT-family encoder over gRPC (attnserve.v1.Encoder: Encode, "
      "AttentionMap, Tokenize, GetModelInfo) with grpc.health.v1 health checks, server "
      "reflection and Prometheus metrics.\n"
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
  if (options.drain_timeout_s < 0) return usage_error("--drain-timeout-s must be >= 0");
  return attn::server::Run(options);
}
