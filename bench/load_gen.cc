// attn-load-gen: closed-loop load on a running attnserve. --clients threads, each with its own
// channel (its own TCP connection, like separate client processes), send Encode requests of ONE
// sentence each, back to back, cycling through --sentences. It starts nothing itself.
//
// --protocol=http sends the same load as OpenAI-style POST /v1/embeddings requests to --target
// (the server's --http-port): one keep-alive HTTP/1.1 connection per client (Boost.Beast, the
// library the server's HTTP front end uses), {"input": "<sentence>", "encoding_format": ...};
// errors are counted by HTTP status ("HTTP_429", ...) or "CONNECTION" for a transport failure.
//
// After --warmup-s the requests that complete in the next --duration-s are counted: one JSON
// line with requests/s, latency p50/p90/p99/mean (ms, client-side wall time of the RPC) and
// errors by gRPC code. Bounded in time (warm-up + duration + the last in-flight call) and in
// count (--max-requests in total).
//
// With --explain-per-s R, one more thread starts an Explain (pairwise, --explain-steps, two
// texts: --explain-sentences) every 1/R s from the start of the warm-up, without waiting for
// earlier ones, so the Encode latencies show what concurrent explanations cost them; the report's
// "explain" object counts them (sent, answered OK inside the window, errors by code). Explains
// still running when the window ends are cancelled.
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "attnserve/v1/encoder.grpc.pb.h"
#include "engine/cli_util.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, target, "localhost:50051",
          "attnserve address: its gRPC port, or its HTTP port with --protocol=http.");
ABSL_FLAG(std::string, protocol, "grpc",
          "grpc: Encode RPCs; http: POST /v1/embeddings (OpenAI-compatible JSON).");
ABSL_FLAG(std::string, http_encoding_format, "float",
          "--protocol=http: the request's encoding_format, float (JSON numbers) or base64.");
ABSL_FLAG(int, clients, 1, "Concurrent clients (threads, one channel each).");
ABSL_FLAG(double, duration_s, 10.0, "Measured seconds.");
ABSL_FLAG(double, warmup_s, 2.0, "Seconds of load before measuring (not counted).");
ABSL_FLAG(std::string, sentences, "",
          "File of sentences to send, one per line (empty lines skipped). Required.");
ABSL_FLAG(int64_t, max_requests, 1000000, "Stop after this many requests in total.");
ABSL_FLAG(int, timeout_ms, 30000, "Deadline of each request.");
ABSL_FLAG(double, explain_per_s, 0,
          "Explain calls started per second beside the Encode load (0 = none).");
ABSL_FLAG(int, explain_steps, 32, "Integrated-path steps of each Explain call.");
ABSL_FLAG(std::string, explain_sentences, "",
          "File whose first two lines are the texts each Explain compares (default: the first "
          "two of --sentences).");

namespace {

using Clock = std::chrono::steady_clock;

struct ClientStats {
  std::vector<double> latencies_ms;       // requests completed OK inside the measured window
  std::map<std::string, int64_t> errors;  // by gRPC code, inside the window
  std::string first_error;
};

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < 17 ? kNames[index] : std::to_string(index);
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(p * (sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

// One keep-alive HTTP/1.1 connection; reconnects after a failure.
class HttpConnection {
 public:
  explicit HttpConnection(const std::string& target) {
    const size_t colon = target.rfind(':');
    host_ = colon == std::string::npos ? target : target.substr(0, colon);
    port_ = colon == std::string::npos ? "80" : target.substr(colon + 1);
  }

  // POSTs `body` to `path`; the response's status (0 = no response: `error` says why).
  int Post(const std::string& path, const std::string& body, std::string* error) {
    namespace http = boost::beast::http;
    boost::beast::error_code ec;
    if (!socket_.is_open()) {
      boost::asio::ip::tcp::resolver resolver(io_);
      boost::asio::connect(socket_, resolver.resolve(host_, port_, ec), ec);
      if (ec) return Fail("connect: " + ec.message(), error);
      // The deadline of a call, as the gRPC clients' (a blocking read has no other).
      timeval timeout{};
      timeout.tv_sec = absl::GetFlag(FLAGS_timeout_ms) / 1000;
      timeout.tv_usec = (absl::GetFlag(FLAGS_timeout_ms) % 1000) * 1000;
      setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    }
    http::request<http::string_body> request{http::verb::post, path, 11};
    request.set(http::field::host, host_);
    request.set(http::field::content_type, "application/json");
    request.keep_alive(true);
    request.body() = body;
    request.prepare_payload();
    http::write(socket_, request, ec);
    if (ec) return Fail("write: " + ec.message(), error);
    http::response<http::string_body> response;
    http::read(socket_, buffer_, response, ec);
    if (ec) return Fail("read: " + ec.message(), error);
    if (!response.keep_alive()) Close();
    const int status = response.result_int();
    if (status != 200) {
      *error = response.body().substr(0, 300);
    } else if (response.body().find("\"embedding\"") == std::string::npos) {
      // A cheap check, not a parse: the gRPC clients do not look into their vectors either.
      *error = "200 without an embedding: " + response.body().substr(0, 300);
      return 0;
    }
    return status;
  }

 private:
  int Fail(std::string what, std::string* error) {
    *error = std::move(what);
    Close();
    return 0;
  }
  void Close() {
    boost::beast::error_code ignored;
    socket_.close(ignored);
    buffer_.clear();
  }

  std::string host_, port_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_{io_};
  boost::beast::flat_buffer buffer_;
};

void RunHttpClient(int id, const std::vector<std::string>& sentences,
                   Clock::time_point measure_from, Clock::time_point measure_until,
                   std::atomic<int64_t>* budget, ClientStats* stats) {
  HttpConnection connection(absl::GetFlag(FLAGS_target));
  const std::string format = absl::GetFlag(FLAGS_http_encoding_format);
  size_t next = (static_cast<size_t>(id) * 7919) % sentences.size();
  while (Clock::now() < measure_until && budget->fetch_sub(1) > 0) {
    const std::string body =
        nlohmann::json{{"input", sentences[next]}, {"encoding_format", format}}.dump();
    next = (next + 1) % sentences.size();
    std::string error;
    const Clock::time_point start = Clock::now();
    const int status = connection.Post("/v1/embeddings", body, &error);
    const Clock::time_point stop = Clock::now();
    if (stop < measure_from || stop > measure_until) continue;
    if (status == 200 && error.empty()) {
      stats->latencies_ms.push_back(
          std::chrono::duration<double, std::milli>(stop - start).count());
    } else {
      ++stats->errors[status == 0 ? "CONNECTION" : "HTTP_" + std::to_string(status)];
      if (stats->first_error.empty()) stats->first_error = error;
    }
  }
}

void RunClient(int id, const std::vector<std::string>& sentences, Clock::time_point measure_from,
               Clock::time_point measure_until, std::atomic<int64_t>* budget, ClientStats* stats) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_target),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = attnserve::v1::Encoder::NewStub(channel);
  // Clients start at different sentences so concurrent batches mix lengths.
  size_t next = (static_cast<size_t>(id) * 7919) % sentences.size();
  while (Clock::now() < measure_until && budget->fetch_sub(1) > 0) {
    attnserve::v1::EncodeRequest request;
    request.add_inputs()->set_text(sentences[next]);
    next = (next + 1) % sentences.size();
    attnserve::v1::EncodeResponse response;
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
    const Clock::time_point start = Clock::now();
    const grpc::Status status = stub->Encode(&context, request, &response);
    const Clock::time_point stop = Clock::now();
    if (stop < measure_from || stop > measure_until) continue;
    if (status.ok()) {
      stats->latencies_ms.push_back(
          std::chrono::duration<double, std::milli>(stop - start).count());
    } else {
      ++stats->errors[CodeName(status.error_code())];
      if (stats->first_error.empty()) stats->first_error = status.error_message();
    }
  }
}

// Open-loop Explain calls at `per_s` until `measure_until`; those still running then are
// cancelled. Counts what ended inside [measure_from, measure_until].
nlohmann::json RunExplains(double per_s, const std::string& query, const std::string& document,
                           Clock::time_point measure_from, Clock::time_point measure_until) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  auto stub = attnserve::v1::Encoder::NewStub(grpc::CreateCustomChannel(
      absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials(), args));
  struct Call {
    grpc::ClientContext context;
    attnserve::v1::ExplainRequest request;
    attnserve::v1::ExplainResponse response;
    Clock::time_point start;
  };
  std::mutex mutex;
  std::condition_variable all_done;
  int running = 0;
  int64_t sent = 0, ok = 0;
  std::vector<double> latencies_ms;
  std::map<std::string, int64_t> errors;
  std::vector<std::shared_ptr<Call>> calls;
  const auto period =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / per_s));
  for (Clock::time_point next = Clock::now(); next < measure_until; next += period) {
    std::this_thread::sleep_until(next);  // paces the load: one call per period
    auto call = std::make_shared<Call>();
    call->request.set_query(query);
    call->request.add_documents(document);
    call->request.set_method(attnserve::v1::ATTRIBUTION_PAIRWISE);
    call->request.set_steps(absl::GetFlag(FLAGS_explain_steps));
    call->context.set_wait_for_ready(true);
    call->start = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++running;
      ++sent;
      calls.push_back(call);
    }
    stub->async()->Explain(
        &call->context, &call->request, &call->response, [&, call](grpc::Status status) {
          const Clock::time_point stop = Clock::now();
          std::lock_guard<std::mutex> lock(mutex);
          if (stop >= measure_from && stop <= measure_until) {
            if (status.ok()) {
              ++ok;
              latencies_ms.push_back(
                  std::chrono::duration<double, std::milli>(stop - call->start).count());
            } else {
              ++errors[CodeName(status.error_code())];
            }
          }
          if (--running == 0) all_done.notify_all();
        });
  }
  std::this_thread::sleep_until(measure_until);
  std::unique_lock<std::mutex> lock(mutex);
  for (const std::shared_ptr<Call>& call : calls) call->context.TryCancel();
  all_done.wait(lock, [&] { return running == 0; });
  std::sort(latencies_ms.begin(), latencies_ms.end());
  return {{"per_s", per_s},
          {"steps", absl::GetFlag(FLAGS_explain_steps)},
          {"sent", sent},
          {"ok_in_window", ok},
          {"p50_ms", Percentile(latencies_ms, 0.50)},
          {"errors_in_window", errors}};
}

// The non-empty lines of `path`; false (with a message naming `flag`) if it cannot be read.
bool ReadSentences(const std::string& path, const char* flag, std::vector<std::string>* out) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s '%s'\n", flag, path.c_str());
    return false;
  }
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out->push_back(line);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Closed-loop Encode load on a running attnserve: attn-load-gen --target localhost:50051 "
      "--clients 8 --duration-s 10 --sentences FILE");
  attn::ShowProjectFlagsInHelp(attn::ProgramVersion("attn-load-gen"));
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients);
  const double duration_s = absl::GetFlag(FLAGS_duration_s),
               warmup_s = absl::GetFlag(FLAGS_warmup_s);
  const double explain_per_s = absl::GetFlag(FLAGS_explain_per_s);
  const std::string protocol = absl::GetFlag(FLAGS_protocol);
  const std::string format = absl::GetFlag(FLAGS_http_encoding_format);
  if ((protocol != "grpc" && protocol != "http") || (format != "float" && format != "base64") ||
      (protocol == "http" && explain_per_s > 0)) {
    std::fprintf(stderr,
                 "--protocol is grpc or http, --http-encoding-format float or base64; Explain "
                 "load (--explain-per-s) is gRPC only\n");
    return 2;
  }
  if (clients < 1 || duration_s <= 0 || warmup_s < 0 || absl::GetFlag(FLAGS_max_requests) < 1 ||
      explain_per_s < 0 || explain_per_s > 100 || absl::GetFlag(FLAGS_explain_steps) < 1) {
    std::fprintf(stderr,
                 "need --clients >= 1, --duration-s > 0, --warmup-s >= 0, "
                 "--max-requests >= 1, --explain-per-s in [0, 100], --explain-steps >= 1\n");
    return 2;
  }
  std::vector<std::string> sentences;
  if (!ReadSentences(absl::GetFlag(FLAGS_sentences), "--sentences", &sentences)) return 2;
  std::vector<std::string> explain_texts;
  if (!absl::GetFlag(FLAGS_explain_sentences).empty() &&
      !ReadSentences(absl::GetFlag(FLAGS_explain_sentences), "--explain-sentences",
                     &explain_texts)) {
    return 2;
  }
  if (explain_texts.empty()) explain_texts = sentences;
  if (sentences.empty() || (explain_per_s > 0 && explain_texts.size() < 2)) {
    std::fprintf(stderr, "%s\n",
                 sentences.empty() ? "--sentences has no sentences"
                                   : "Explain needs two texts (--explain-sentences)");
    return 2;
  }

  const Clock::time_point begin = Clock::now();
  const auto to_duration = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const Clock::time_point measure_from = begin + to_duration(warmup_s);
  const Clock::time_point measure_until = measure_from + to_duration(duration_s);
  std::atomic<int64_t> budget{absl::GetFlag(FLAGS_max_requests)};
  std::vector<ClientStats> stats(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back(protocol == "http" ? RunHttpClient : RunClient, i, std::cref(sentences),
                         measure_from, measure_until, &budget, &stats[i]);
  }
  nlohmann::json explain;
  if (explain_per_s > 0) {
    threads.emplace_back([&] {
      explain = RunExplains(explain_per_s, explain_texts[0], explain_texts[1], measure_from,
                            measure_until);
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::vector<double> latencies;
  std::map<std::string, int64_t> errors;
  std::string first_error;
  for (const ClientStats& client : stats) {
    latencies.insert(latencies.end(), client.latencies_ms.begin(), client.latencies_ms.end());
    for (const auto& [code, count] : client.errors) errors[code] += count;
    if (first_error.empty()) first_error = client.first_error;
  }
  std::sort(latencies.begin(), latencies.end());
  double mean = 0;
  for (double ms : latencies) mean += ms / latencies.size();
  nlohmann::json report = {{"protocol", protocol},
                           {"clients", clients},
                           {"duration_s", duration_s},
                           {"requests", latencies.size()},
                           {"requests_per_s", latencies.size() / duration_s},
                           {"p50_ms", Percentile(latencies, 0.50)},
                           {"p90_ms", Percentile(latencies, 0.90)},
                           {"p99_ms", Percentile(latencies, 0.99)},
                           {"mean_ms", mean},
                           {"errors", errors}};
  if (!first_error.empty()) report["first_error"] = first_error;
  if (!explain.is_null()) report["explain"] = explain;
  if (budget.load() <= 0) report["stopped_by_max_requests"] = true;
  std::printf("%s\n", report.dump().c_str());
  return latencies.empty() ? 1 : 0;
}
