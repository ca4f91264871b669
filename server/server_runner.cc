#include "server/server_runner.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/log.h"
#include "engine/model.h"
#include "server/core/batcher.h"
#include "server/core/cost_model.h"
#include "server/core/model_registry.h"
#include "server/core/model_set.h"
#include "server/core/serving_core.h"
#include "server/encoder_service.h"
#include "server/http/http_routes.h"
#include "server/http/http_server.h"
#include "server/metrics.h"
#include "server/model_slots.h"
#include "server/oip/oip_rest.h"
#include "server/oip/oip_service.h"
#include "server/store_watcher.h"
#include "server/trainer_service.h"

namespace attn::server {
namespace {

constexpr const char* kEncoderServiceName = "attnserve.v1.Encoder";

int Fail(const std::string& message) {
  Log(LogLevel::kError, "%s", message);
  return 1;
}

// A listener that cannot start: the port and the flag that chose it, and what to do. Every port
// is this process's alone (no SO_REUSEPORT), so a second server on a taken port stops here
// instead of sharing the port's calls with the first.
std::string ListenFailure(const char* what, const std::string& host, int port, const char* flag,
                          absl::string_view detail) {
  return absl::StrCat("cannot listen for ", what, " on ", host, ":", port, " (", flag, " ", port,
                      "): ", absl::StripSuffix(detail, "."),
                      "; is another attnserve running there? Stop it or choose another port with ",
                      flag);
}

// A listener's start error less its "cannot serve HTTP on HOST:PORT: " prefix: the reason.
absl::string_view ListenReason(const absl::Status& status) {
  absl::string_view reason = status.message();
  if (const size_t colon = reason.find(": "); colon != absl::string_view::npos) {
    reason.remove_prefix(colon + 2);
  }
  return reason;
}

absl::Status WriteReadyFile(const std::string& path, int grpc_port, int metrics_port,
                            int http_port) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << "{\"grpc_port\": " << grpc_port << ", \"metrics_port\": " << metrics_port
        << ", \"http_port\": " << http_port << ", \"pid\": " << getpid() << "}\n";
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

// The gRPC server with `services`, health checks and reflection, listening on --host:--port
// (its port in *port); null when it cannot listen.
std::unique_ptr<grpc::Server> StartGrpcServer(
    const ServerOptions& options, const std::shared_ptr<grpc::ServerCredentials>& credentials,
    const std::vector<grpc::Service*>& services, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), credentials, port);
  // gRPC turns SO_REUSEPORT on by default: a second server on the same port would start and
  // take every other connection.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* service : services) builder.RegisterService(service);
  // gRPC's own limits sit above ours so oversized requests reach our handler and get a message
  // that says which flag to raise; gRPC's hard cap still bounds memory.
  const int64_t hard_limit =
      std::min<int64_t>(options.max_message_bytes * 2 + (1 << 20), INT32_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(hard_limit));
  builder.SetMaxSendMessageSize(static_cast<int>(hard_limit));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) return nullptr;
  return server;
}

// The Prometheus endpoint: GET /metrics on its own port, served by the HTTP front end's listener
// (prometheus-cpp's exposer would add its own unprefixed self-metrics, one a summary that reads
// NaN until the second scrape).
std::unique_ptr<http::HttpServer> MetricsServer(const ServerOptions& options,
                                                const Metrics* metrics) {
  auto text = [](int status, std::string body) {
    http::HttpReply reply;
    reply.status = status;
    reply.content_type = "text/plain; charset=utf-8";
    reply.body = std::move(body) + "\n";
    return reply;
  };
  http::HttpServerOptions listener;
  listener.host = options.host;
  listener.port = options.metrics_port;
  listener.threads = 2;
  listener.max_connections = 64;
  listener.max_body_bytes = 4096;
  return std::make_unique<http::HttpServer>(
      listener,
      [metrics, text](const http::HttpRequest& request) {
        if (request.path != "/metrics") return text(404, "this port serves GET /metrics");
        if (request.method != "GET") {
          http::HttpReply reply = text(405, "/metrics takes GET");
          reply.headers.push_back({"Allow", "GET"});
          return reply;
        }
        http::HttpReply reply;
        reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
        reply.body = metrics->Exposition();
        return reply;
      },
      [text](int64_t) { return text(413, "/metrics takes no request body"); },
      [text](int status, const std::string& why) { return text(status, why); });
}

// SIGTERM and SIGINT, blocked before any thread starts (threads inherit the mask) so that only
// RunServer's sigwait takes them.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The metrics endpoint, with --metrics-port (its port in *port; -1 without).
absl::Status StartMetricsServer(const ServerOptions& options, const Metrics* metrics,
                                std::unique_ptr<http::HttpServer>* server, int* port) {
  *port = -1;
  if (options.metrics_port < 0) return absl::OkStatus();
  *server = MetricsServer(options, metrics);
  absl::StatusOr<int> listening = (*server)->Start();
  if (!listening.ok()) {
    return absl::UnavailableError(ListenFailure("metrics", options.host, options.metrics_port,
                                                "--metrics-port",
                                                ListenReason(listening.status())));
  }
  *port = *listening;
  return absl::OkStatus();
}

// The serving core and the front ends over it, built in this order (destroyed in reverse): the
// gRPC Encoder, the HTTP/JSON routes (server/http/, their own worker pool), the Trainer, and the
// Open Inference Protocol (server/oip/: gRPC beside the Encoder, REST under /v2).
struct FrontEnds {
  FrontEnds(const ServerOptions& options, std::optional<std::string> trainer_token,
            const std::optional<std::string>& api_key, ModelSet* models, Metrics* metrics)
      : memory_budget(options.memory_budget_bytes),
        serving_core({{options.max_inputs_per_request, options.max_explain_documents},
                      options.max_message_bytes,
                      options.max_request_memory_bytes},
                     models, &memory_budget, models->models().front().metrics),
        encoder(&serving_core, options.max_message_bytes, metrics, api_key),
        http_routes({options.model_name, options.http_request_timeout_s, options.max_message_bytes,
                     options.openai_long_text},
                    &serving_core, api_key, metrics),
        trainer(options, std::move(trainer_token), models, metrics),
        oip_options{options.max_message_bytes, options.max_request_memory_bytes, ATTN_VERSION},
        oip_grpc(&serving_core, &memory_budget, oip_options, metrics, api_key),
        oip_rest(&serving_core, &memory_budget, oip_options, options.http_request_timeout_s,
                 api_key) {
    http_routes.SetOipRoutes(&oip_rest);
  }
  // What health does not cover (the HTTP routes, the Open Inference Protocol's own readiness).
  void SetServing(bool serving) {
    http_routes.SetServing(serving);
    oip_grpc.SetServing(serving);
    oip_rest.SetServing(serving);
  }
  void SetDraining(bool draining) {
    http_routes.SetDraining(draining);
    oip_grpc.SetDraining(draining);
    oip_rest.SetDraining(draining);
  }

  MemoryBudget memory_budget;
  core::ServingCore serving_core;
  EncoderService encoder;
  http::HttpRoutes http_routes;
  TrainerService trainer;
  const oip::OipOptions oip_options;
  oip::OipService oip_grpc;
  oip::OipRest oip_rest;
};

// The gRPC server of the front ends' services (its port in *port), NOT_SERVING until the models
// are loaded; null when it cannot listen.
std::unique_ptr<grpc::Server> StartGrpcFrontEnd(
    const ServerOptions& options, const std::shared_ptr<grpc::ServerCredentials>& credentials,
    FrontEnds* front, int* port) {
  std::unique_ptr<grpc::Server> server = StartGrpcServer(
      options, credentials, {&front->encoder, &front->trainer, &front->oip_grpc}, port);
  if (server == nullptr) return nullptr;
  front->http_routes.SetGrpcPort(*port);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // Register both names as NOT_SERVING at once: gRPC's default health service answers SERVING
  // for "" from the moment the server listens, and starting the HTTP front end first left that
  // window open long enough for a probe to see SERVING before the model was loaded (seen by
  // LifecycleTest.HealthNeverServingBeforeReady on a loaded host). A name set only later would
  // answer NOT_FOUND while the model loads.
  health->SetServingStatus(false);
  health->SetServingStatus(kEncoderServiceName, false);
  return server;
}

// The HTTP/JSON front end, with --http-port (its port in *port; -1 without).
absl::Status StartHttpServer(const ServerOptions& options, http::HttpRoutes* routes,
                             std::unique_ptr<http::HttpServer>* server, int* port) {
  *port = -1;
  if (options.http_port < 0) return absl::OkStatus();
  *server = std::make_unique<http::HttpServer>(
      http::HttpServerOptions{options.host, options.http_port, options.http_threads,
                              options.http_max_connections, options.http_header_timeout_s,
                              options.http_body_timeout_s, options.max_message_bytes,
                              options.tls_cert, options.tls_key},
      [routes](const http::HttpRequest& request) { return routes->Handle(request); },
      [routes](int64_t bytes) { return routes->TooLarge(bytes); },
      [routes](int status, const std::string& why) { return routes->Refused(status, why); });
  absl::StatusOr<int> listening = (*server)->Start();
  if (!listening.ok()) {
    return absl::UnavailableError(ListenFailure("HTTP", options.host, options.http_port,
                                                "--http-port", ListenReason(listening.status())));
  }
  *port = *listening;
  return absl::OkStatus();
}

// The start-up's last lines (what each model serves, TLS, fine-tuning) and --ready-file.
void AnnounceReady(const ServerOptions& options, const std::vector<ModelSlot>& slots, int grpc_port,
                   int metrics_port, int http_port) {
  for (const ModelSlot& slot : slots) {
    absl::StatusOr<ModelVersion> served = slot.registry->Get("");
    const BertConfig& config = slot.config;
    Log(LogLevel::kInfo,
        "SERVING model %s%s version %s (%s, %d layers, hidden %d, %d heads; batches of up to %d "
        "tokens)",
        slot.spec.name, &slot == &slots.front() ? " (default)" : "",
        served.ok() ? served->version : "?", config.model_type, config.num_hidden_layers,
        config.hidden_size, config.num_attention_heads, slot.batch_tokens);
  }
  Log(LogLevel::kInfo, "%s%s", options.tls_cert.empty() ? "no TLS" : "over TLS",
      options.trainer_token_file.empty() ? "; fine-tuning disabled (no --trainer-token-file)"
                                         : "; fine-tuning enabled");
  if (!options.ready_file.empty()) {
    if (absl::Status written =
            WriteReadyFile(options.ready_file, grpc_port, metrics_port, http_port);
        !written.ok()) {
      Log(LogLevel::kWarning, "%s", written.ToString());
    }
  }
}

// After SIGTERM or SIGINT (`signal_number`): health NOT_SERVING, the lame-duck delay, then both
// listeners drain the calls in flight, jobs end, and the batchers and store watchers stop.
void Drain(const ServerOptions& options, int signal_number, FrontEnds* front, grpc::Server* server,
           http::HttpServer* http_server, const std::vector<ModelSlot>& slots,
           const std::vector<std::unique_ptr<StoreWatcher>>& watchers) {
  Log(LogLevel::kInfo, "received %s: draining in-flight requests (up to %.0f s)",
      signal_number == SIGTERM ? "SIGTERM" : "SIGINT", options.drain_timeout_s);
  server->GetHealthCheckService()->SetServingStatus(false);
  if (options.shutdown_delay_s > 0) {
    // Lame duck: health says NOT_SERVING while calls are still answered, until the balancers'
    // health checks have taken this replica out (deploy/replicas/haproxy.cfg).
    front->SetDraining(true);
    Log(LogLevel::kInfo, "not serving for new clients; draining in %.1f s (--shutdown-delay-s)",
        options.shutdown_delay_s);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_delay_s * 1e3)));
  }
  front->SetServing(false);
  // HTTP drains beside gRPC: its listener closes and each worker finishes the call it serves
  // (bounded by --http-request-timeout-s, the calls' deadline).
  std::thread http_drain([http_server] {
    if (http_server != nullptr) http_server->Stop();
  });
  // Server-side jobs cannot finish within a drain: they end now, recorded failed, so that their
  // watchers get the last event and end their streams instead of holding the drain.
  front->trainer.StopJobs();
  // Shutdown stops accepting calls and waits for the running ones (they finish through the
  // batcher, which keeps working) until the deadline, then cancels the rest.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(options.drain_timeout_s * 1e3)));
  http_drain.join();
  for (const ModelSlot& slot : slots) slot.batcher->Stop();
  for (auto& watcher : watchers) watcher->Stop();
  Log(LogLevel::kInfo, "drained; exiting");
}

}  // namespace

int RunServer(const ServerOptions& options, std::optional<std::string> trainer_token,
              std::optional<std::string> api_key) {
  const sigset_t signals = BlockStopSignals();
  if (options.threads > 0) omp_set_num_threads(options.threads);

  Metrics metrics;
  std::unique_ptr<http::HttpServer> metrics_server;
  int metrics_port = -1;
  if (absl::Status started = StartMetricsServer(options, &metrics, &metrics_server, &metrics_port);
      !started.ok()) {
    return Fail(std::string(started.message()));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));

  // Only config.json is read here (the weights load once the ports are up).
  absl::StatusOr<std::vector<ModelSlot>> slots = MakeModelSlots(options);
  if (!slots.ok()) return Fail(std::string(slots.status().message()));
  ModelSet models;
  AddModels(options, &metrics, &*slots, &models);
  FrontEnds front(options, std::move(trainer_token), api_key, &models, &metrics);

  int grpc_port = 0;
  std::unique_ptr<grpc::Server> server =
      StartGrpcFrontEnd(options, *credentials, &front, &grpc_port);
  if (server == nullptr) {
    return Fail(ListenFailure("gRPC", options.host, options.port, "--port",
                              "the port is in use or the address is not available"));
  }
  // From here on a start that fails shuts the gRPC server down first.
  auto fail = [&server](const absl::Status& status) {
    server->Shutdown();
    return Fail(std::string(status.message()));
  };
  std::unique_ptr<http::HttpServer> http_server;
  int http_port = -1;
  if (absl::Status started = StartHttpServer(options, &front.http_routes, &http_server, &http_port);
      !started.ok()) {
    return fail(started);
  }
  std::vector<std::string> loading;
  for (const ModelSlot& slot : *slots)
    loading.push_back(absl::StrCat(slot.spec.name, "=", slot.spec.dir));
  Log(LogLevel::kInfo, "listening on %s:%d (gRPC), %d (HTTP), metrics on port %d; loading %s",
      options.host, grpc_port, http_port, metrics_port, absl::StrJoin(loading, ", "));

  absl::StatusOr<std::vector<std::shared_ptr<const Model>>> loaded = LoadModels(options, *slots);
  if (!loaded.ok()) return fail(loaded.status());
  ReserveWorkspace(options, *slots, *loaded, &front.memory_budget);
  std::vector<std::unique_ptr<StoreWatcher>> watchers;
  if (absl::Status added =
          AddVersions(options, &*slots, *std::move(loaded), &front.trainer, &watchers);
      !added.ok()) {
    return fail(added);
  }
  // After the store's versions are known: a job a previous stop left running is recorded
  // failed, or succeeded when its commit had completed.
  if (absl::Status jobs = front.trainer.StartJobs(); !jobs.ok()) {
    return fail(
        absl::Status(jobs.code(), absl::StrCat("cannot use the model store: ", jobs.message())));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kEncoderServiceName, true);
  front.SetServing(true);
  AnnounceReady(options, *slots, grpc_port, metrics_port, http_port);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Drain(options, signal_number, &front, server.get(), http_server.get(), *slots, watchers);
  return 0;
}

}  // namespace attn::server
