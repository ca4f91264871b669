// Load and soak (issue 7 §4): 64 closed-loop clients on loopback, each with its own channel (its
// own TCP connection), send a mix of Encode (60%: 1-8 texts, mostly single sentences of 3 to
// ~130 tokens, some paragraphs and pairs), AttentionMap (25%: one sentence, a subset of layers and
// heads) and Tokenize (15%: 1-8 texts) to one attnserve for ATTN_SOAK_SECONDS (default 60, the CI
// run; the documented long run is 1800), back to back, at most 100 calls per client-second.
// Meanwhile the server's resident memory (VmRSS) is sampled every second.
//
// Asserted: no errors at all (RESOURCE_EXHAUSTED only when ATTN_SOAK_MAX_CONCURRENT puts the
// server's --max-concurrent-requests below the client count on purpose), every response has the
// shape that was asked for, every client made progress after the warm-up, the server's RSS level
// (median of a window) at the end of the load is at most 10% above its level after the warm-up,
// attnserve_requests_total counts exactly what the clients sent, and the server is healthy
// (SERVING, answers, queue empty, no crash lines in its log). Latencies and throughput are
// reported, never asserted.
//
// Environment:
//   ATTN_SOAK_SECONDS         load duration including warm-up (default 60)
//   ATTN_SOAK_WARMUP_SECONDS  shortest warm-up (default max(30, 10% of the duration)); it also
//                             lasts until every client has had 3 calls answered and the server
//                             has run 15 engine batches, at most half the run (kWarmupBatches).
//                             Latencies and the RSS baseline are taken after it.
//   ATTN_SOAK_SERVER_THREADS  the server's --threads (default 1, see SharedServerFlags)
//   ATTN_SOAK_MAX_CONCURRENT  the server's --max-concurrent-requests (default 256, its default)
//   ATTN_SOAK_REPORT          where the JSON summary goes (default reliability_soak_report.json
//                             in the working directory: the build's tests/reliability under ctest)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {
namespace {

constexpr int kClients = 64;

double EnvDouble(const char* name, double fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(parsed > 0)) {
    std::fprintf(stderr, "ignoring %s='%s' (not a positive number)\n", name, value);
    return fallback;
  }
  return parsed;
}

int ServerThreads() { return static_cast<int>(EnvDouble("ATTN_SOAK_SERVER_THREADS", 1)); }
int MaxConcurrentRequests() { return static_cast<int>(EnvDouble("ATTN_SOAK_MAX_CONCURRENT", 256)); }

}  // namespace

std::optional<std::vector<std::string>> SharedServerFlags() {
  // One engine thread by default: ctest runs two tests at once on this 2-core machine, and a
  // 2-thread OpenMP forward whose second thread is descheduled waits at every barrier, which
  // turns a soak into a measurement of the neighbour's load. The long run may set 2.
  return std::vector<std::string>{
      "--threads=" + std::to_string(ServerThreads()),
      "--max_concurrent_requests=" + std::to_string(MaxConcurrentRequests())};
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---------------------------------------------------------------------------------------------
// Real-looking text: sentences of the kinds an embedding service gets (reviews, tickets, news,
// chat), built from phrase tables by a seeded generator so every run sends the same traffic.

const std::vector<std::string> kOpeners = {"the courier",
                                           "my neighbour",
                                           "the finance team",
                                           "this blender",
                                           "the night shift",
                                           "the city library",
                                           "our backend service",
                                           "the head chef",
                                           "a regional newspaper",
                                           "the new intern",
                                           "the ferry company",
                                           "the firmware update",
                                           "my grandmother",
                                           "the bakery on the corner",
                                           "the insurance provider",
                                           "the hiking club",
                                           "the customer in room 12",
                                           "the cloud console",
                                           "the school nurse",
                                           "the tram operator"};
const std::vector<std::string> kVerbs = {"delivered",  "forgot",    "approved",     "returned",
                                         "rebuilt",    "postponed", "recommended",  "lost",
                                         "repaired",   "cancelled", "photographed", "renamed",
                                         "questioned", "priced",    "reorganised",  "tasted",
                                         "uploaded",   "misplaced", "inspected",    "celebrated"};
const std::vector<std::string> kObjects = {
    "the wrong parcel",         "a cheaper subscription", "the annual report",
    "the broken hinge",         "a gluten-free menu",     "the overdue invoice",
    "the spare keys",           "the staging database",   "a café au lait",
    "the naïve estimate",       "the concert tickets",    "the password reset email",
    "a second-hand bicycle",    "the quarterly forecast", "the leaking dishwasher",
    "the timetable for Zürich", "the warranty paperwork", "the corrupted backup"};
const std::vector<std::string> kPlaces = {"at the train station",     "in the shared kitchen",
                                          "on the third floor",       "during the morning stand-up",
                                          "behind the old warehouse", "in a very polite email",
                                          "on the customer portal",   "at the farmers' market",
                                          "in version 4.2.1",         "outside the stadium"};
const std::vector<std::string> kTimes = {"last night",
                                         "two days ago",
                                         "on Monday morning",
                                         "after the outage",
                                         "before lunch",
                                         "in early September",
                                         "for the fourth time",
                                         "within an hour",
                                         "while everyone was on holiday",
                                         "at 3 a.m."};
const std::vector<std::string> kLinks = {"because", "although",    "so",    "but",    "and then",
                                         "while",   "even though", "until", "unless", "after"};
const std::vector<std::string> kReplies = {"Thanks, that fixed it!",
                                           "Still waiting.",
                                           "Absolutely not.",
                                           "Works for me.",
                                           "Could you send the receipt?",
                                           "Five stars.",
                                           "Refund please.",
                                           "Same problem here.",
                                           "Ok.",
                                           "Which version?",
                                           "Brilliant, thank you so much!",
                                           "No idea, sorry."};

class TextMaker {
 public:
  explicit TextMaker(uint32_t seed) : random_(seed) {}

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random_); }
  double Unit() { return std::uniform_real_distribution<double>(0, 1)(random_); }
  const std::string& Pick(const std::vector<std::string>& list) {
    return list[Uniform(0, static_cast<int>(list.size()) - 1)];
  }

  // One sentence, from a two-word reply to a multi-clause statement of about 100 tokens.
  std::string Sentence() {
    if (Unit() < 0.15) return Pick(kReplies);
    std::string text = Clause();
    text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    const double r = Unit();
    const int clauses = r < 0.35 ? 0 : r < 0.65 ? 1 : r < 0.85 ? 2 : Uniform(3, 6);
    for (int i = 0; i < clauses; ++i) text += (i % 2 ? ", " : " ") + Pick(kLinks) + " " + Clause();
    text += Unit() < 0.1 ? "?" : ".";
    return text;
  }

  // 5% of texts are a paragraph of several sentences (up to the 256-token default window).
  std::string Text() {
    if (Unit() >= 0.05) return Sentence();
    std::string text = Sentence();
    for (int i = Uniform(3, 7); i > 0; --i) text += " " + Sentence();
    return text;
  }

 private:
  std::string Clause() {
    std::string clause = Pick(kOpeners) + " " + Pick(kVerbs) + " " + Pick(kObjects);
    if (Unit() < 0.5) clause += " " + Pick(kPlaces);
    if (Unit() < 0.4) clause += " " + Pick(kTimes);
    return clause;
  }

  std::mt19937 random_;
};

// ---------------------------------------------------------------------------------------------
// Requests and their checks

enum class Kind { kEncode, kAttentionMap, kTokenize };
constexpr Kind kKinds[] = {Kind::kEncode, Kind::kAttentionMap, Kind::kTokenize};
const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kEncode:
      return "Encode";
    case Kind::kAttentionMap:
      return "AttentionMap";
    case Kind::kTokenize:
      return "Tokenize";
  }
  return "?";
}

// Sent with every call; far beyond any latency a closed loop of 64 clients sees here, so a
// DEADLINE_EXCEEDED means the server stalled.
const std::chrono::seconds kRequestDeadline = ScaledSeconds(120);

// What one call returned: the gRPC status, or a response that does not answer the request.
struct CallResult {
  grpc::StatusCode code = grpc::OK;
  std::string error;  // empty when the call succeeded and the response checked out
};

CallResult CheckStatus(const grpc::Status& status) {
  if (status.ok()) return {};
  return {status.error_code(), StatusString(status)};
}
CallResult BadResponse(const std::string& what) { return {grpc::OK, "bad response: " + what}; }

// Each client's fixed probe sentence and its embedding, computed alone on the idle server
// before the load. About 40% of the Encode calls carry the probe at a random position:
// under load it must come back with the same embedding, whatever batch it was packed into (a
// mix-up between requests or sequences would return another sentence's embedding).
struct Probe {
  std::string text;
  std::vector<float> embedding;
};
// The engine's bound for a sequence packed with others vs alone (tests/unit/encoder_test.cc,
// PackedBatchEqualsEachSequenceAlone); another sentence's embedding is ~0.1 away or more.
constexpr double kProbeMaxAbs = 1e-5;

struct ProbeStats {
  int64_t checked = 0;
  double worst = 0;  // max abs difference to the serial embedding
};

CallResult CallEncode(pb::Encoder::Stub* stub, TextMaker& text, const Probe& probe,
                      ProbeStats* probes) {
  pb::EncodeRequest request;
  const int inputs = text.Uniform(1, 8);
  for (int i = 0; i < inputs; ++i) {
    if (text.Unit() < 0.1) {
      pb::TextPair* pair = request.add_inputs()->mutable_pair();
      pair->set_first(text.Sentence());
      pair->set_second(text.Sentence());
    } else {
      request.add_inputs()->set_text(text.Text());
    }
  }
  const double r = text.Unit();
  if (r < 0.1) request.set_pooling(pb::POOLING_CLS);
  if (r >= 0.1 && r < 0.15) request.set_pooling(pb::POOLING_MAX);
  int probe_index = -1;  // the probe has the model's default pooling
  if (r >= 0.15 && text.Unit() < 0.5) {
    probe_index = text.Uniform(0, inputs - 1);
    request.mutable_inputs(probe_index)->set_text(probe.text);
  }
  const bool token_embeddings = text.Unit() < 0.1;
  if (token_embeddings) {
    request.set_return_token_embeddings(true);
    request.set_output_dtype(text.Unit() < 0.5 ? pb::FLOAT16 : pb::FLOAT32);
  }
  if (text.Unit() < 0.05) request.add_hidden_layers(text.Uniform(0, 6));

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRequestDeadline);
  pb::EncodeResponse response;
  const CallResult result = CheckStatus(stub->Encode(&context, request, &response));
  if (result.code != grpc::OK) return result;
  if (response.results_size() != inputs) {
    return BadResponse("Encode: " + std::to_string(response.results_size()) + " results for " +
                       std::to_string(inputs) + " inputs");
  }
  for (const pb::EncodeResult& r : response.results()) {
    if (r.tokens_size() < 2 || r.embedding_size() != kHidden) {
      return BadResponse("Encode: " + std::to_string(r.tokens_size()) + " tokens, embedding of " +
                         std::to_string(r.embedding_size()));
    }
    const std::vector<int64_t> expected = {r.tokens_size(), kHidden};
    if (token_embeddings && Shape(r.token_embeddings()) != expected) {
      return BadResponse("Encode: token embeddings " + ShapeString(r.token_embeddings()));
    }
    if (r.hidden_states_size() != request.hidden_layers_size()) {
      return BadResponse("Encode: " + std::to_string(r.hidden_states_size()) + " hidden layers");
    }
  }
  if (probe_index >= 0) {
    const auto& got = response.results(probe_index).embedding();
    const double diff = MaxAbsDiff(std::vector<float>(got.begin(), got.end()), probe.embedding);
    ++probes->checked;
    probes->worst = std::max(probes->worst, diff);
    if (!(diff <= kProbeMaxAbs)) {
      return BadResponse("Encode: the probe at input " + std::to_string(probe_index) + " of " +
                         std::to_string(inputs) + " differs from its serial embedding by " +
                         std::to_string(diff));
    }
  }
  return {};
}

CallResult CallAttentionMap(pb::Encoder::Stub* stub, TextMaker& text) {
  pb::AttentionMapRequest request;
  request.add_inputs()->set_text(text.Sentence());
  std::set<int> layers, heads;
  for (int i = text.Uniform(1, 3); i > 0; --i) layers.insert(text.Uniform(0, kNumLayers - 1));
  for (int i = text.Uniform(1, 4); i > 0; --i) heads.insert(text.Uniform(0, kNumHeads - 1));
  for (int layer : layers) request.add_layers(layer);
  for (int head : heads) request.add_heads(head);
  const int top_k = text.Unit() < 0.2 ? 8 : 0;
  request.set_top_k(top_k);
  request.set_mean_over_heads(text.Unit() < 0.3);
  request.set_rollout(text.Unit() < 0.1);
  request.set_include_scores(top_k == 0 && text.Unit() < 0.1);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRequestDeadline);
  pb::AttentionMapResponse response;
  const CallResult result = CheckStatus(stub->AttentionMap(&context, request, &response));
  if (result.code != grpc::OK) return result;
  if (response.results_size() != 1) return BadResponse("AttentionMap: results != 1");
  const pb::AttentionResult& r = response.results(0);
  const int64_t T = r.tokens_size();
  const int64_t H = static_cast<int64_t>(heads.size());
  if (r.layers_size() != static_cast<int>(layers.size())) {
    return BadResponse("AttentionMap: " + std::to_string(r.layers_size()) + " layers for " +
                       std::to_string(layers.size()));
  }
  for (const pb::LayerAttention& layer : r.layers()) {
    if (layer.heads_size() != H) return BadResponse("AttentionMap: wrong head count");
    if (top_k > 0) {
      const int64_t k = std::min<int64_t>(top_k, T);
      if (Shape(layer.weights_top_k().values()) != std::vector<int64_t>{H, T, k} ||
          layer.weights_top_k().indices_size() != H * T * k) {
        return BadResponse("AttentionMap: top-k " + ShapeString(layer.weights_top_k().values()));
      }
    } else if (Shape(layer.weights()) != std::vector<int64_t>{H, T, T}) {
      return BadResponse("AttentionMap: weights " + ShapeString(layer.weights()));
    }
  }
  if (request.rollout() && Shape(r.rollout()) != std::vector<int64_t>{T, T}) {
    return BadResponse("AttentionMap: rollout " + ShapeString(r.rollout()));
  }
  return {};
}

CallResult CallTokenize(pb::Encoder::Stub* stub, TextMaker& text) {
  pb::TokenizeRequest request;
  const int inputs = text.Uniform(1, 8);
  for (int i = 0; i < inputs; ++i) request.add_inputs()->set_text(text.Text());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRequestDeadline);
  pb::TokenizeResponse response;
  const CallResult result = CheckStatus(stub->Tokenize(&context, request, &response));
  if (result.code != grpc::OK) return result;
  if (response.results_size() != inputs) return BadResponse("Tokenize: wrong result count");
  for (const pb::TokenizeResult& r : response.results()) {
    if (r.tokens_size() < 3) return BadResponse("Tokenize: fewer than 3 tokens");
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Clients

struct ClientStats {
  std::map<Kind, int64_t> sent;                      // every call, warm-up included
  std::map<std::string, int64_t> outcomes;           // "<method> <code>", warm-up included
  std::map<Kind, std::vector<double>> latencies_ms;  // OK calls started after the warm-up
  int64_t measured_ok = 0;
  std::map<std::string, int64_t> errors;  // by code name (BAD_RESPONSE for wrong shapes)
  std::string first_error;
  ProbeStats probes;
};

struct SoakPlan {
  double seconds = 60;
  double min_warmup_seconds = 30;
  Clock::time_point start;
  bool rejects_expected = false;  // --max-concurrent-requests below the client count
  int64_t max_calls_per_client = 0;
};

// The warm-up lasts at least `min_warmup_seconds` (30 s, or 10% of a long run), until every
// client has had kWarmupCalls calls answered and the server has run kWarmupBatches engine
// batches, but at most half the run. The server's RSS climbs, in steps of about 12 MiB (one
// [8192, 384] fp32 buffer), while it meets the largest packed batches of the mix; measured here
// over 60-s runs, its level moved by up to 9% after 15 s and by at most 3.5% after 30 s. The
// batcher merges nearly the whole queue into one batch, so on a loaded machine (~0.5 batches/s)
// 30 s hold only about 15 batches.
constexpr int64_t kWarmupCalls = 3;
constexpr double kWarmupBatches = 15;

// Shared between the clients and the sampler thread.
struct SoakProgress {
  std::atomic<bool> measuring{false};  // the warm-up is over
  std::vector<std::atomic<int64_t>> answered = std::vector<std::atomic<int64_t>>(kClients);
};

// Closed loop: the next call goes out as soon as the previous one is answered.
void RunClient(int id, const std::string& address, const SoakPlan& plan, const Probe* probe,
               SoakProgress* progress, ClientStats* stats) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a TCP connection of its own
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto stub = pb::Encoder::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  TextMaker text(1000 + id);
  const Clock::time_point end = plan.start + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(plan.seconds));
  for (int64_t calls = 0; calls < plan.max_calls_per_client && Clock::now() < end; ++calls) {
    const double r = text.Unit();
    const Kind kind = r < 0.60 ? Kind::kEncode : r < 0.85 ? Kind::kAttentionMap : Kind::kTokenize;
    const bool measured = progress->measuring;
    const Clock::time_point started = Clock::now();
    CallResult result;
    switch (kind) {
      case Kind::kEncode:
        result = CallEncode(stub.get(), text, *probe, &stats->probes);
        break;
      case Kind::kAttentionMap:
        result = CallAttentionMap(stub.get(), text);
        break;
      case Kind::kTokenize:
        result = CallTokenize(stub.get(), text);
        break;
    }
    const double ms = Seconds(Clock::now() - started) * 1000;
    ++stats->sent[kind];
    ++stats->outcomes[std::string(KindName(kind)) + " " + CodeName(result.code)];
    if (result.code == grpc::OK && result.error.empty()) {
      ++progress->answered[id];
      if (measured) {
        stats->latencies_ms[kind].push_back(ms);
        ++stats->measured_ok;
      }
      continue;
    }
    ++stats->errors[result.error.empty() || result.code != grpc::OK ? CodeName(result.code)
                                                                    : "BAD_RESPONSE"];
    if (stats->first_error.empty()) stats->first_error = KindName(kind) + (": " + result.error);
    // A deliberate reject asks for back-off; anything else is counted and the loop goes on.
    if (result.code == grpc::RESOURCE_EXHAUSTED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + (id % 8) * 5));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Server memory

// VmRSS of `pid` in KiB (0 if unreadable).
int64_t ResidentKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

struct RssSample {
  double t = 0;  // seconds since the load started
  int64_t kib = 0;
};

// The server's RSS level over [from, to]: the median of the samples taken then (the nearest
// sample if none was). A median, not one sample: while a batch is in flight RSS is up to ~15%
// above the level between batches, and a single sample lands on either by chance.
int64_t LevelKiB(const std::vector<RssSample>& samples, double from, double to) {
  std::vector<int64_t> values;
  for (const RssSample& s : samples) {
    if (s.t >= from && s.t <= to) values.push_back(s.kib);
  }
  if (values.empty()) {
    const RssSample* nearest = &samples.front();
    for (const RssSample& s : samples) {
      if (std::abs(s.t - from) < std::abs(nearest->t - from)) nearest = &s;
    }
    return nearest->kib;
  }
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

double MiB(int64_t kib) { return static_cast<double>(kib) / 1024.0; }

// ---------------------------------------------------------------------------------------------

TEST(SoakTest, MixedLoadFromSixtyFourClients) {
  ServerProcess& server = SharedServer();
  SoakPlan plan;
  plan.seconds = EnvDouble("ATTN_SOAK_SECONDS", 60);
  plan.min_warmup_seconds = std::min(
      EnvDouble("ATTN_SOAK_WARMUP_SECONDS", std::max(30.0, plan.seconds * 0.1)), plan.seconds / 2);
  plan.rejects_expected = MaxConcurrentRequests() < kClients;
  // A count bound on top of the time bound: 100 calls per second per client is more than this
  // server can answer.
  plan.max_calls_per_client = static_cast<int64_t>(plan.seconds * 100) + 100;
  const pid_t pid = server.process().pid();
  std::printf(
      "[soak] %d clients, %.0f s (warm-up >= %.0f s, %lld calls per client, %.0f engine "
      "batches), server pid %d --threads=%d --max-concurrent-requests=%d\n",
      kClients, plan.seconds, plan.min_warmup_seconds, static_cast<long long>(kWarmupCalls),
      kWarmupBatches, static_cast<int>(pid), ServerThreads(), MaxConcurrentRequests());
  std::fflush(stdout);

  // The probes' serial embeddings, one call each on the idle server.
  std::vector<Probe> probes(kClients);
  {
    auto stub = server.NewStub();
    for (int i = 0; i < kClients; ++i) {
      probes[i].text = "probe " + std::to_string(i) + ": the violin concerto was played twice";
      pb::EncodeRequest request;
      request.add_inputs()->set_text(probes[i].text);
      pb::EncodeResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kRequestDeadline);
      const grpc::Status status = stub->Encode(&context, request, &response);
      ASSERT_TRUE(status.ok()) << StatusString(status);
      ASSERT_EQ(response.results_size(), 1);
      probes[i].embedding.assign(response.results(0).embedding().begin(),
                                 response.results(0).embedding().end());
      ASSERT_EQ(probes[i].embedding.size(), static_cast<size_t>(kHidden));
    }
  }

  const Metrics before = ScrapeOrFail(server);
  const int64_t idle_kib = ResidentKiB(pid);
  ASSERT_GT(idle_kib, 0) << "cannot read VmRSS of pid " << pid;

  std::vector<ClientStats> stats(kClients);
  std::vector<RssSample> rss;
  std::atomic<bool> load_done{false};
  SoakProgress progress;
  size_t warmup_sample = 0;  // index into rss of the sample that ended the warm-up
  bool warmup_cut_short = false;
  double warmup_batches = 0;  // engine batches when the warm-up ended
  const double batches_before = before.Sum("attnserve_batch_tokens_count");
  // Engine batches run since the load started (0 if the scrape fails: the cap then ends it).
  auto batches_run = [&] {
    std::string body, error;
    Metrics now;
    if (!server.ScrapeMetrics(&body, &error) || !Metrics::Parse(body, &now, &error)) return 0.0;
    return now.Sum("attnserve_batch_tokens_count") - batches_before;
  };
  plan.start = Clock::now();
  std::thread sampler([&] {
    // Every second until the clients are done; the last sample closes the load phase.
    for (int tick = 0; !load_done; ++tick) {
      const double t = Seconds(Clock::now() - plan.start);
      rss.push_back({t, ResidentKiB(pid)});
      if (!progress.measuring && t >= plan.min_warmup_seconds) {
        int64_t fewest = INT64_MAX;
        for (const auto& n : progress.answered) fewest = std::min<int64_t>(fewest, n);
        warmup_batches = fewest < kWarmupCalls ? 0 : batches_run();
        warmup_cut_short = fewest < kWarmupCalls || warmup_batches < kWarmupBatches;
        if (!warmup_cut_short || t >= plan.seconds / 2) {
          progress.measuring = true;
          warmup_sample = rss.size() - 1;
        }
      }
      if (tick > 0 && tick % 60 == 0) {  // a sign of life on long runs
        int64_t answered = 0;
        for (const auto& n : progress.answered) answered += n;
        std::printf("[soak] t=%4d s: %lld calls answered, server RSS %.1f MiB\n", tick,
                    static_cast<long long>(answered), MiB(rss.back().kib));
        std::fflush(stdout);
      }
      const auto next = plan.start + std::chrono::seconds(tick + 1);
      while (!load_done && Clock::now() < next) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(RunClient, i, server.address(), std::cref(plan), &probes[i], &progress,
                         &stats[i]);
  }
  for (std::thread& t : clients) t.join();
  const double load_seconds = Seconds(Clock::now() - plan.start);
  load_done = true;
  sampler.join();
  rss.push_back({load_seconds, ResidentKiB(pid)});

  // Merge.
  std::map<Kind, int64_t> sent;
  std::map<std::string, int64_t> outcomes, errors;
  std::map<Kind, std::vector<double>> latencies;
  int64_t measured_ok = 0, slowest_client_ok = -1;
  std::string first_error;
  ProbeStats probe_stats;
  for (const ClientStats& s : stats) {
    probe_stats.checked += s.probes.checked;
    probe_stats.worst = std::max(probe_stats.worst, s.probes.worst);
    for (const auto& [kind, n] : s.sent) sent[kind] += n;
    for (const auto& [key, n] : s.outcomes) outcomes[key] += n;
    for (const auto& [code, n] : s.errors) errors[code] += n;
    for (const auto& [kind, values] : s.latencies_ms) {
      latencies[kind].insert(latencies[kind].end(), values.begin(), values.end());
    }
    measured_ok += s.measured_ok;
    if (slowest_client_ok < 0 || s.measured_ok < slowest_client_ok) {
      slowest_client_ok = s.measured_ok;
    }
    if (first_error.empty()) first_error = s.first_error;
  }
  ASSERT_TRUE(progress.measuring) << "the load ended during the warm-up";
  // RSS levels in three windows of the measured time (each 10 s or a tenth of it, whichever is
  // longer): right after the warm-up, in the middle, and at the end of the load.
  const double warmup_end = rss[warmup_sample].t;
  const double measured_seconds = std::max(plan.seconds - warmup_end, 1e-9);
  const double window = std::min(std::max(10.0, measured_seconds / 10), measured_seconds / 3);
  const double middle_t = warmup_end + (measured_seconds - window) / 2;
  const int64_t after_warmup_kib = LevelKiB(rss, warmup_end, warmup_end + window);
  const int64_t middle_kib = LevelKiB(rss, middle_t, middle_t + window);
  const int64_t end_kib = LevelKiB(rss, plan.seconds - window, plan.seconds);
  const int64_t idle_after_kib = rss.back().kib;
  int64_t max_kib = 0;
  for (const RssSample& s : rss) max_kib = std::max(max_kib, s.kib);
  const double growth = static_cast<double>(end_kib - after_warmup_kib) /
                        static_cast<double>(std::max<int64_t>(after_warmup_kib, 1));

  // Report.
  nlohmann::json report;
  report["clients"] = kClients;
  report["duration_s"] = plan.seconds;
  report["warmup_s"] = warmup_end;
  report["warmup_cut_short"] = warmup_cut_short;
  report["warmup_engine_batches"] = warmup_batches;
  report["load_s"] = load_seconds;
  report["server_flags"] = *SharedServerFlags();
  int64_t total = 0;
  for (Kind kind : kKinds) total += sent[kind];
  std::printf("[soak] %lld requests in %.1f s:", static_cast<long long>(total), load_seconds);
  for (Kind kind : kKinds) {
    report["requests"][KindName(kind)] = sent[kind];
    std::printf(" %s %lld", KindName(kind), static_cast<long long>(sent[kind]));
  }
  report["requests"]["total"] = total;
  report["errors"] = nlohmann::json::object();
  for (const auto& [code, n] : errors) report["errors"][code] = n;
  std::printf("\n[soak] errors: %s%s\n", errors.empty() ? "none" : report["errors"].dump().c_str(),
              first_error.empty() ? "" : (" (first: " + first_error + ")").c_str());
  report["throughput_rps"] = static_cast<double>(measured_ok) / measured_seconds;
  if (warmup_cut_short) {
    std::printf(
        "[soak] warm-up cut short at half the run: a client had < %lld calls answered or the "
        "server ran < %.0f batches\n",
        static_cast<long long>(kWarmupCalls), kWarmupBatches);
  }
  std::printf("[soak] after warm-up: %.1f OK requests/s; slowest client %lld OK requests\n",
              static_cast<double>(measured_ok) / measured_seconds,
              static_cast<long long>(slowest_client_ok));
  report["slowest_client_ok"] = slowest_client_ok;
  for (Kind kind : kKinds) {
    std::vector<double>& values = latencies[kind];
    std::sort(values.begin(), values.end());
    double sum = 0;
    for (double v : values) sum += v;
    const double mean = values.empty() ? 0 : sum / static_cast<double>(values.size());
    report["latency_ms"][KindName(kind)] = {{"count", values.size()},
                                            {"p50", Percentile(values, 0.50)},
                                            {"p99", Percentile(values, 0.99)},
                                            {"mean", mean},
                                            {"max", values.empty() ? 0 : values.back()}};
    std::printf("[soak] %-12s %7zu OK after warm-up  p50 %8.1f ms  p99 %8.1f ms  max %8.1f ms\n",
                KindName(kind), values.size(), Percentile(values, 0.50), Percentile(values, 0.99),
                values.empty() ? 0 : values.back());
  }
  report["rss_mib"] = {{"idle_before_load", MiB(idle_kib)},
                       {"window_s", window},
                       {"after_warmup", MiB(after_warmup_kib)},
                       {"middle", MiB(middle_kib)},
                       {"end", MiB(end_kib)},
                       {"max", MiB(max_kib)},
                       {"idle_after_load", MiB(idle_after_kib)},
                       {"growth_after_warmup_pct", growth * 100}};
  nlohmann::json samples = nlohmann::json::array();
  for (const RssSample& s : rss) samples.push_back({std::round(s.t * 10) / 10, s.kib});
  report["rss_samples_t_s_kib"] = samples;
  std::printf(
      "[soak] server RSS MiB (medians of %.0f-s windows): idle %.1f, after warm-up (t=%.0f s, "
      "%.0f batches) %.1f, middle (t=%.0f s) %.1f, end (t=%.0f s) %.1f; max %.1f, idle after "
      "the load %.1f; growth after warm-up %+.2f%%\n",
      window, MiB(idle_kib), warmup_end, warmup_batches, MiB(after_warmup_kib), middle_t,
      MiB(middle_kib), plan.seconds - window, MiB(end_kib), MiB(max_kib), MiB(idle_after_kib),
      growth * 100);

  // The server counted exactly what the clients sent (all calls are answered by now; the
  // counter may be bumped just after the response leaves, hence the short poll).
  auto server_count = [&](const Metrics& m, const std::string& method, const std::string& code) {
    const std::map<std::string, std::string> labels = {{"method", method}, {"code", code}};
    return m.Sum("attnserve_requests_total", labels) -
           before.Sum("attnserve_requests_total", labels);
  };
  auto counts_agree = [&](const Metrics& m) {
    for (const auto& [key, n] : outcomes) {
      const size_t space = key.find(' ');
      if (server_count(m, key.substr(0, space), key.substr(space + 1)) != n) return false;
    }
    return true;
  };
  Metrics after;
  WaitFor(
      [&] {
        after = ScrapeOrFail(server);
        return counts_agree(after);
      },
      ScaledSeconds(5));
  for (Kind kind : kKinds) {
    report["server_requests_total"][KindName(kind)] =
        after.Sum("attnserve_requests_total", {{"method", KindName(kind)}}) -
        before.Sum("attnserve_requests_total", {{"method", KindName(kind)}});
  }
  // What the engine did, from the server's own counters (whole load, warm-up included).
  auto delta = [&](const std::string& name) { return after.Sum(name) - before.Sum(name); };
  const double batches = delta("attnserve_batch_tokens_count");
  report["server_engine"] = {
      {"tokens", delta("attnserve_tokens_total")},
      {"tokens_per_s", delta("attnserve_tokens_total") / load_seconds},
      {"batches", batches},
      {"mean_batch_tokens", batches > 0 ? delta("attnserve_batch_tokens_sum") / batches : 0},
      {"mean_batch_inputs", batches > 0 ? delta("attnserve_batch_size_sum") / batches : 0}};
  std::printf(
      "[soak] server: %.0f tokens (%.0f tokens/s) in %.0f engine batches (mean %.0f "
      "tokens, %.1f inputs)\n",
      delta("attnserve_tokens_total"), delta("attnserve_tokens_total") / load_seconds, batches,
      report["server_engine"]["mean_batch_tokens"].get<double>(),
      report["server_engine"]["mean_batch_inputs"].get<double>());
  std::printf("[soak] probes: %lld checked, worst difference to the serial embedding %.3g\n",
              static_cast<long long>(probe_stats.checked), probe_stats.worst);
  report["probes"] = {{"checked", probe_stats.checked}, {"worst_max_abs", probe_stats.worst}};

  const char* report_path = std::getenv("ATTN_SOAK_REPORT");
  const std::string path =
      report_path != nullptr && *report_path != '\0' ? report_path : "reliability_soak_report.json";
  std::ofstream(path) << report.dump(2) << "\n";
  std::printf("[soak] report written to %s\n", path.c_str());
  std::fflush(stdout);

  // Assertions.
  EXPECT_GT(total, 0);
  // The probes ran (a mismatch is a BAD_RESPONSE error above).
  EXPECT_GE(probe_stats.checked, 16) << "too few probes: the mix sent almost none";
  for (const auto& [code, n] : errors) {
    if (code == "RESOURCE_EXHAUSTED" && plan.rejects_expected) continue;
    ADD_FAILURE() << n << " calls failed with " << code << " (first error: " << first_error << ")";
  }
  EXPECT_GT(slowest_client_ok, 0) << "a client had no OK call after the warm-up";
  EXPECT_LE(growth, 0.10) << "server RSS grew from " << MiB(after_warmup_kib)
                          << " MiB after the warm-up to " << MiB(end_kib) << " MiB at the end";
  for (const auto& [key, n] : outcomes) {
    const size_t space = key.find(' ');
    EXPECT_EQ(server_count(after, key.substr(0, space), key.substr(space + 1)), n)
        << "attnserve_requests_total{method,code} vs the clients' count for " << key;
  }
  EXPECT_TRUE(reliability::ExpectHealthy(server, "the soak"));
  // Nothing is waiting any more; the gauge drops just after the last response leaves.
  double queue_depth = -1;
  WaitFor(
      [&] {
        queue_depth = ScrapeOrFail(server).Sum("attnserve_queue_depth");
        return queue_depth == 0;
      },
      ScaledSeconds(10));
  EXPECT_EQ(queue_depth, 0) << "attnserve_queue_depth after the load";
  EXPECT_EQ(reliability::CrashLines(reliability::FullLog(server)), std::vector<std::string>{});
}

}  // namespace
}  // namespace attn::integration
