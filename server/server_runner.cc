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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "engine/log.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_store.h"
#include "engine/serving_state.h"
#include "engine/training/training_report.h"
#include "server/core/batcher.h"
#include "server/core/cost_model.h"
#include "server/core/model_registry.h"
#include "server/core/model_set.h"
#include "server/core/serving_core.h"
#include "server/core/store_versions.h"
#include "server/encoder_service.h"
#include "server/http/http_routes.h"
#include "server/http/http_server.h"
#include "server/metrics.h"
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
int ListenFailure(const char* what, const std::string& host, int port, const char* flag,
                  absl::string_view detail) {
  return Fail(absl::StrCat("cannot listen for ", what, " on ", host, ":", port, " (", flag, " ",
                           port, "): ", absl::StripSuffix(detail, "."),
                           "; is another attnserve running there? Stop it or choose another "
                           "port with ",
                           flag));
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

// `text` for a POSIX shell: as it is when it is plain, else in single quotes.
std::string ShellWord(const std::string& text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
           (c != '\0' && std::strchr("_./-+:@%", c) != nullptr);
  });
  if (plain) return text;
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "'\\''"}}), "'");
}

}  // namespace

std::string MoveStoreUnderModelCommand(const std::string& store, const std::string& model) {
  // What a one-model server keeps at the store's top: its versions (ft-*), the serving record
  // and the job history; the lock file is made again where needed.
  const std::string from = ShellWord(store);
  const std::string to = ShellWord((std::filesystem::path(store) / model).string());
  std::string command = absl::StrCat("mkdir -p ", to, " && mv ", from, "/ft-*");
  for (const char* entry : {kServingStateFile, kJobsDir}) {
    std::error_code error;
    if (std::filesystem::exists(std::filesystem::path(store) / entry, error)) {
      absl::StrAppend(&command, " ", from, "/", entry);
    }
  }
  return absl::StrCat(command, " ", to, "/");
}

namespace {

// One served model's parts (model_set.h's ServedModel points into it).
struct ModelSlot {
  ModelSpec spec;
  std::string store;  // its directory of the model store ("" = none)
  BertConfig config;
  int64_t batch_tokens = 0;  // its batcher's token budget (ScaledBatchTokens)
  ModelMetrics* metrics = nullptr;
  std::unique_ptr<ModelRegistry> registry;
  std::unique_ptr<Batcher> batcher;
};

// The models' configs (config.json only), token budgets and store directories. The model store
// layout: one served model keeps its versions in --model-store itself (as before); with several,
// each keeps them in <store>/<name>/, and a store holding versions at its top (made by a
// one-model server) is refused with how to move them, so no version is served by the wrong
// model.
absl::StatusOr<std::vector<ModelSlot>> MakeModelSlots(const ServerOptions& options) {
  std::vector<ModelSlot> slots;
  double cheapest = 0;
  for (const ModelSpec& spec : options.models) {
    ModelSlot slot;
    slot.spec = spec;
    absl::StatusOr<BertConfig> config =
        LoadBertConfig((std::filesystem::path(spec.dir) / "config.json").string());
    if (!config.ok()) {
      return absl::Status(
          config.status().code(),
          absl::StrCat("cannot load the model", options.models.size() > 1 ? " " : "",
                       options.models.size() > 1 ? spec.name : "", ": ", config.status().message(),
                       " (run scripts/setup.sh for the default model, or pass "
                       "--model-dir or --model NAME=DIR)"));
    }
    slot.config = *config;
    const double cost = ModelTokenCost(slot.config);
    cheapest = cheapest == 0 ? cost : std::min(cheapest, cost);
    if (!options.model_store.empty()) {
      slot.store = options.models.size() == 1
                       ? options.model_store
                       : (std::filesystem::path(options.model_store) / spec.name).string();
    }
    slots.push_back(std::move(slot));
  }
  for (ModelSlot& slot : slots) {
    slot.batch_tokens =
        ScaledBatchTokens(options.max_batch_tokens, ModelTokenCost(slot.config), cheapest);
  }
  if (slots.size() > 1 && !options.model_store.empty()) {
    absl::StatusOr<std::vector<StoredVersion>> top = ListStore(options.model_store, nullptr);
    if (top.ok() && !top->empty()) {
      const std::string& store = options.model_store;
      return absl::FailedPreconditionError(absl::StrCat(
          "--model-store ", store, " holds versions at its top (", top->front().version,
          ", ...), the layout of a one-model server; with several --model each model keeps its "
          "versions in ",
          store,
          "/<name>/. Move them, with their serving record and job history, to the model "
          "they belong to, e.g.: ",
          MoveStoreUnderModelCommand(store, options.models.front().name),
          " (or serve one model with this store)"));
    }
  }
  return slots;
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

}  // namespace

int RunServer(const ServerOptions& options, std::optional<std::string> trainer_token,
              std::optional<std::string> api_key) {
  // Signals are taken by a dedicated thread with sigwait, so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (options.threads > 0) omp_set_num_threads(options.threads);

  Metrics metrics;
  std::unique_ptr<http::HttpServer> metrics_server;
  int metrics_port = -1;
  if (options.metrics_port >= 0) {
    metrics_server = MetricsServer(options, &metrics);
    absl::StatusOr<int> listening = metrics_server->Start();
    if (!listening.ok()) {
      // Its message starts "cannot serve HTTP on HOST:PORT: ": the rest is the reason.
      absl::string_view reason = listening.status().message();
      if (const size_t colon = reason.find(": "); colon != absl::string_view::npos) {
        reason.remove_prefix(colon + 2);
      }
      return ListenFailure("metrics", options.host, options.metrics_port, "--metrics-port", reason);
    }
    metrics_port = *listening;
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));

  // Each served model: its own versions, batcher queue (token budget scaled by its cost) and
  // metrics series. Only config.json is read here (the weights load once the ports are up).
  absl::StatusOr<std::vector<ModelSlot>> slots = MakeModelSlots(options);
  if (!slots.ok()) return Fail(std::string(slots.status().message()));
  ModelSet models;
  for (ModelSlot& slot : *slots) {
    const ModelSpec spec = slot.spec;
    const std::string store = slot.store;
    slot.metrics = metrics.ForModel(spec.name);
    slot.registry = std::make_unique<ModelRegistry>(
        options.max_loaded_versions, [spec, store, &options](const ModelVersion& version) {
          return LoadVersion(spec.dir, store, options.precision, version);
        });
    slot.registry->SetEvictionListener([name = spec.name](const std::string& version) {
      Log(LogLevel::kInfo,
          "model %s: unloaded version %s (--max-loaded-versions reached; it loads again "
          "when a request pins it)",
          name, version);
    });
    // Every change of the default version (start-up, commit, Rollback, SetServingVersion) shows
    // in the metrics.
    slot.registry->SetServingListener(
        [model_metrics = slot.metrics, store](const ModelVersion& served) {
          const BertConfig& c = served.model->config();
          model_metrics->SetModelInfo(served.version, c.model_type,
                                      PrecisionName(served.model->precision()), c.num_hidden_layers,
                                      c.hidden_size, c.num_attention_heads);
          model_metrics->SetServingVersion(served.version);
          // A fine-tuned version's distance from its parent, from the report stored with it.
          double change = 0;
          if (!store.empty() && served.version != "base") {
            absl::StatusOr<TrainingReport> report = ReadTrainingReport(store, served.version);
            if (report.ok()) change = report->total_relative_change;
          }
          model_metrics->SetServedVersionWeightChange(change);
        });
    slot.batcher = std::make_unique<Batcher>(
        BatcherOptions{slot.batch_tokens, options.max_concurrent_requests, options.threads},
        slot.metrics);
    models.Add({spec.name, spec.dir, store, slot.registry.get(), slot.batcher.get(), slot.metrics})
        .IgnoreError();  // names checked unique by OptionsFromFlags
  }
  MemoryBudget memory_budget(options.memory_budget_bytes);
  core::ServingCore serving_core({{options.max_inputs_per_request, options.max_explain_documents},
                                  options.max_message_bytes,
                                  options.max_request_memory_bytes},
                                 &models, &memory_budget, models.models().front().metrics);
  EncoderService encoder(&serving_core, options.max_message_bytes, &metrics, api_key);
  // The HTTP/JSON front end: the same core calls, its own worker pool (server/http/).
  http::HttpRoutes http_routes({options.model_name, options.http_request_timeout_s,
                                options.max_message_bytes, options.openai_long_text},
                               &serving_core, api_key, &metrics);
  TrainerService trainer(options, std::move(trainer_token), &models, &metrics);
  // The Open Inference Protocol (server/oip/): gRPC beside the Encoder, REST under /v2.
  const oip::OipOptions oip_options{options.max_message_bytes, options.max_request_memory_bytes,
                                    ATTN_VERSION};
  oip::OipService oip_grpc(&serving_core, &memory_budget, oip_options, &metrics, api_key);
  oip::OipRest oip_rest(&serving_core, &memory_budget, oip_options, options.http_request_timeout_s,
                        api_key);
  http_routes.SetOipRoutes(&oip_rest);

  int grpc_port = 0;
  std::unique_ptr<grpc::Server> server =
      StartGrpcServer(options, *credentials, {&encoder, &trainer, &oip_grpc}, &grpc_port);
  if (server == nullptr) {
    return ListenFailure("gRPC", options.host, options.port, "--port",
                         "the port is in use or the address is not available");
  }
  http_routes.SetGrpcPort(grpc_port);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // Register both names as NOT_SERVING at once: gRPC's default health service answers SERVING
  // for "" from the moment the server listens, and starting the HTTP front end first left that
  // window open long enough for a probe to see SERVING before the model was loaded (seen by
  // LifecycleTest.HealthNeverServingBeforeReady on a loaded host). A name set only later would
  // answer NOT_FOUND while the model loads.
  health->SetServingStatus(false);
  health->SetServingStatus(kEncoderServiceName, false);
  std::unique_ptr<http::HttpServer> http_server;
  int http_port = -1;
  if (options.http_port >= 0) {
    http_server = std::make_unique<http::HttpServer>(
        http::HttpServerOptions{options.host, options.http_port, options.http_threads,
                                options.http_max_connections, options.http_header_timeout_s,
                                options.http_body_timeout_s, options.max_message_bytes,
                                options.tls_cert, options.tls_key},
        [&http_routes](const http::HttpRequest& request) { return http_routes.Handle(request); },
        [&http_routes](int64_t bytes) { return http_routes.TooLarge(bytes); },
        [&http_routes](int status, const std::string& why) {
          return http_routes.Refused(status, why);
        });
    absl::StatusOr<int> listening = http_server->Start();
    if (!listening.ok()) {
      server->Shutdown();
      // Its message starts "cannot serve HTTP on HOST:PORT: ": the rest is the reason.
      absl::string_view reason = listening.status().message();
      if (const size_t colon = reason.find(": "); colon != absl::string_view::npos) {
        reason.remove_prefix(colon + 2);
      }
      return ListenFailure("HTTP", options.host, options.http_port, "--http-port", reason);
    }
    http_port = *listening;
  }
  std::vector<std::string> loading;
  for (const ModelSlot& slot : *slots)
    loading.push_back(absl::StrCat(slot.spec.name, "=", slot.spec.dir));
  Log(LogLevel::kInfo, "listening on %s:%d (gRPC), %d (HTTP), metrics on port %d; loading %s",
      options.host, grpc_port, http_port, metrics_port, absl::StrJoin(loading, ", "));

  ModelOptions model_options;
  model_options.precision = options.precision;
  // Every model loads before any serves: a server never starts half-loaded.
  std::vector<std::shared_ptr<const Model>> loaded;
  for (const ModelSlot& slot : *slots) {
    auto model = Model::Load(slot.spec.dir, model_options);
    if (!model.ok()) {
      server->Shutdown();
      return Fail(absl::StrCat("cannot load the model", slots->size() > 1 ? " " : "",
                               slots->size() > 1 ? slot.spec.name : "", ": ",
                               model.status().message(),
                               " (run scripts/setup.sh for the default model, or pass "
                               "--model-dir or --model NAME=DIR)"));
    }
    loaded.push_back(*model);
  }
  int64_t workspace_bytes = 0;
  for (size_t i = 0; i < slots->size(); ++i) {
    // The engine's per-thread workspace lives as long as the server: off the budget once.
    workspace_bytes += EngineWorkspaceBytes(loaded[i]->config(), (*slots)[i].batch_tokens);
  }
  memory_budget.Reserve(workspace_bytes);
  Log(LogLevel::kInfo,
      "memory: %d bytes per call at most (--max-request-memory-bytes), %d bytes for calls in "
      "flight (--memory-budget-bytes %d less the engine workspace)",
      options.max_request_memory_bytes, memory_budget.budget(), options.memory_budget_bytes);
  std::vector<std::unique_ptr<StoreWatcher>> watchers;
  for (size_t i = 0; i < slots->size(); ++i) {
    ModelSlot& slot = (*slots)[i];
    ModelVersion base;
    base.version = "base";
    base.origin = absl::StrCat("loaded from ", slot.spec.dir);
    base.model = loaded[i];
    slot.registry->Add(std::move(base));
    if (!slot.store.empty()) {
      absl::StatusOr<int64_t> next_sequence =
          LoadModelStore(slot.store, options.watch_store_s == 0, slot.registry.get());
      if (!next_sequence.ok()) {
        server->Shutdown();
        return Fail(absl::StrCat("cannot use the model store: ", next_sequence.status().message()));
      }
      trainer.SetNextSequence(slot.spec.name, *next_sequence);
    }
    if (options.watch_store_s > 0) {
      watchers.push_back(
          std::make_unique<StoreWatcher>(slot.store, options.watch_store_s, slot.registry.get()));
      Log(LogLevel::kInfo, "watching model store %s every %g s for new versions", slot.store,
          options.watch_store_s);
    }
  }
  loaded.clear();
  // After the store's versions are known: a job a previous stop left running is recorded
  // failed, or succeeded when its commit had completed.
  if (absl::Status jobs = trainer.StartJobs(); !jobs.ok()) {
    server->Shutdown();
    return Fail(absl::StrCat("cannot use the model store: ", jobs.message()));
  }
  health->SetServingStatus(true);
  health->SetServingStatus(kEncoderServiceName, true);
  http_routes.SetServing(true);
  oip_grpc.SetServing(true);
  oip_rest.SetServing(true);
  for (const ModelSlot& slot : *slots) {
    absl::StatusOr<ModelVersion> served = slot.registry->Get("");
    const BertConfig& config = slot.config;
    Log(LogLevel::kInfo,
        "SERVING model %s%s version %s (%s, %d layers, hidden %d, %d heads; batches of up to %d "
        "tokens)",
        slot.spec.name, &slot == &slots->front() ? " (default)" : "",
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

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Log(LogLevel::kInfo, "received %s: draining in-flight requests (up to %.0f s)",
      signal_number == SIGTERM ? "SIGTERM" : "SIGINT", options.drain_timeout_s);
  health->SetServingStatus(false);
  if (options.shutdown_delay_s > 0) {
    // Lame duck: health says NOT_SERVING while calls are still answered, until the balancers'
    // health checks have taken this replica out (deploy/replicas/haproxy.cfg).
    http_routes.SetDraining(true);
    oip_grpc.SetDraining(true);
    oip_rest.SetDraining(true);
    Log(LogLevel::kInfo, "not serving for new clients; draining in %.1f s (--shutdown-delay-s)",
        options.shutdown_delay_s);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_delay_s * 1e3)));
  }
  http_routes.SetServing(false);
  oip_grpc.SetServing(false);
  oip_rest.SetServing(false);
  // HTTP drains beside gRPC: its listener closes and each worker finishes the call it serves
  // (bounded by --http-request-timeout-s, the calls' deadline).
  std::thread http_drain([&http_server] {
    if (http_server != nullptr) http_server->Stop();
  });
  // Server-side jobs cannot finish within a drain: they end now, recorded failed, so that their
  // watchers get the last event and end their streams instead of holding the drain.
  trainer.StopJobs();
  // Shutdown stops accepting calls and waits for the running ones (they finish through the
  // batcher, which keeps working) until the deadline, then cancels the rest.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(options.drain_timeout_s * 1e3)));
  http_drain.join();
  for (ModelSlot& slot : *slots) slot.batcher->Stop();
  for (auto& watcher : watchers) watcher->Stop();
  Log(LogLevel::kInfo, "drained; exiting");
  return 0;
}

}  // namespace attn::server
