// attn-load-gen: closed-loop gRPC load on a running attnserve. --clients threads, each with its
// own channel (its own TCP connection, like separate client processes), send Encode requests of
// ONE sentence each, back to back, cycling through --sentences. It starts nothing itself.
//
// After --warmup-s the requests that complete in the next --duration-s are counted: one JSON
// line with requests/s, latency p50/p90/p99/mean (ms, client-side wall time of the RPC) and
// errors by gRPC code. Bounded in time (warm-up + duration + the last in-flight call) and in
// count (--max-requests in total).
#include <algorithm>
#include <atomic>
#include <chrono>
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

ABSL_FLAG(std::string, target, "localhost:50051", "attnserve gRPC address.");
ABSL_FLAG(int, clients, 1, "Concurrent clients (threads, one channel each).");
ABSL_FLAG(double, duration_s, 10.0, "Measured seconds.");
ABSL_FLAG(double, warmup_s, 2.0, "Seconds of load before measuring (not counted).");
ABSL_FLAG(std::string, sentences, "",
          "File of sentences to send, one per line (empty lines skipped). Required.");
ABSL_FLAG(int64_t, max_requests, 1000000, "Stop after this many requests in total.");
ABSL_FLAG(int, timeout_ms, 30000, "Deadline of each request.");

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
  if (clients < 1 || duration_s <= 0 || warmup_s < 0 || absl::GetFlag(FLAGS_max_requests) < 1) {
    std::fprintf(stderr,
                 "need --clients >= 1, --duration-s > 0, --warmup-s >= 0, "
                 "--max-requests >= 1\n");
    return 2;
  }
  std::vector<std::string> sentences;
  {
    std::ifstream in(absl::GetFlag(FLAGS_sentences));
    if (!in) {
      std::fprintf(stderr, "cannot read --sentences '%s'\n",
                   absl::GetFlag(FLAGS_sentences).c_str());
      return 2;
    }
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) sentences.push_back(line);
    }
  }
  if (sentences.empty()) {
    std::fprintf(stderr, "--sentences has no sentences\n");
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
    threads.emplace_back(RunClient, i, std::cref(sentences), measure_from, measure_until, &budget,
                         &stats[i]);
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
  nlohmann::json report = {{"clients", clients},
                           {"duration_s", duration_s},
                           {"requests", latencies.size()},
                           {"requests_per_s", latencies.size() / duration_s},
                           {"p50_ms", Percentile(latencies, 0.50)},
                           {"p90_ms", Percentile(latencies, 0.90)},
                           {"p99_ms", Percentile(latencies, 0.99)},
                           {"mean_ms", mean},
                           {"errors", errors}};
  if (!first_error.empty()) report["first_error"] = first_error;
  if (budget.load() <= 0) report["stopped_by_max_requests"] = true;
  std::printf("%s\n", report.dump().c_str());
  return latencies.empty() ? 1 : 0;
}
