// The Prometheus endpoint under mixed traffic (issue 31, finding 11): gRPC Encode and
// AttentionMap, HTTP /v1/embeddings, a FineTune stream, WatchJob streams and refused calls run at
// once while the endpoint is scraped; every scrape must pass Debian's `promtool check metrics`
// and the checks promtool does not make:
// * only attnserve_* and the process_* family every client library exports (resident and
//   virtual memory, CPU seconds, open and max fds, start time), no NaN;
// * one set of label names per family (a family exported with and without `model` splits its
//   series in two for every query);
// * the process_* values agree with what the test reads from /proc/<pid> itself and with when it
//   started the server;
// * streams (FineTune, WatchJob) are timed in attnserve_stream_duration_seconds, not in the unary
//   calls' attnserve_request_duration_seconds;
// * HELP texts are for operators: no source file names.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"

namespace attn::integration {

constexpr char kToken[] = "metrics-test-token-4d1";
std::string g_work_dir;

std::optional<std::vector<std::string>> SharedServerFlags() {
  g_work_dir =
      std::filesystem::temp_directory_path() / ("attnserve-it-metrics-" + std::to_string(getpid()));
  std::filesystem::create_directories(g_work_dir);
  std::ofstream(g_work_dir + "/token") << kToken << "\n";
  return std::vector<std::string>{"--trainer_token_file=" + g_work_dir + "/token",
                                  "--model_store=" + g_work_dir + "/store", "--trainer_threads=1"};
}

namespace {

// Removes the work directory (token, model store) after the shared server has stopped: an
// environment registered before main() registers the server's is torn down after it.
class RemoveWorkDir : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!g_work_dir.empty()) RemoveTestDir(g_work_dir);
  }
};
::testing::Environment* const g_remove_work_dir =
    ::testing::AddGlobalTestEnvironment(new RemoveWorkDir);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One sample line of the text format: "name{labels} value".
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string value;
};

// The exposition's samples, HELP texts and TYPEs (a test's own small reader: the harness's
// Metrics keeps only parsed numbers, and this test must see "NaN" as written).
struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> help, type;
};

Exposition Read(const std::string& text) {
  Exposition out;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( \S+)?$)");
  const std::regex label(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?)re");
  for (const std::string& line :
       std::vector<std::string>(absl::StrSplit(text, '\n', absl::SkipEmpty()))) {
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE ")) {
      const std::vector<std::string> parts =
          absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      (line[2] == 'H' ? out.help : out.type)[parts[0]] = parts.size() > 1 ? parts[1] : "";
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    std::smatch match;
    EXPECT_TRUE(std::regex_match(line, match, sample)) << "not a sample line: " << line;
    if (match.empty()) continue;
    Sample s{match[1], {}, match[4]};
    const std::string labels = match[3];
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label);
         it != std::sregex_iterator(); ++it) {
      s.labels[(*it)[1]] = (*it)[2];
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

// The family a sample belongs to: histograms' series carry suffixes.
std::string FamilyOf(const std::string& name, const Exposition& exposition) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(name, suffix)) {
      const std::string base = name.substr(0, name.size() - std::strlen(suffix));
      if (exposition.type.count(base) > 0) return base;
    }
  }
  return name;
}

double Value(const Exposition& exposition, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  double sum = 0;
  for (const Sample& s : exposition.samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto it = s.labels.find(key);
      match &= it != s.labels.end() && it->second == value;
    }
    double v = 0;
    if (match && absl::SimpleAtod(s.value, &v)) sum += v;
  }
  return sum;
}

// Runs promtool on one scrape: its output ("" when clean) and exit code.
std::string Promtool(const std::string& promtool, const std::string& text, int* exit_code) {
  const std::string path = g_work_dir + "/scrape.txt";
  std::ofstream(path) << text;
  return RunCommand(promtool + " check metrics < " + path + " 2>&1", exit_code);
}

// Everything checked on one scrape; `label` says which one.
void CheckScrape(const std::string& promtool, const std::string& text, const std::string& label) {
  int exit_code = -1;
  const std::string lint = Promtool(promtool, text, &exit_code);
  EXPECT_EQ(exit_code, 0) << label << ": promtool check metrics:\n" << lint;
  EXPECT_EQ(lint, "") << label << ": promtool check metrics:\n" << lint;

  const Exposition exposition = Read(text);
  std::map<std::string, std::set<std::set<std::string>>> label_sets;
  for (const Sample& s : exposition.samples) {
    EXPECT_TRUE(absl::StartsWith(s.name, "attnserve_") || absl::StartsWith(s.name, "process_"))
        << label << ": an unprefixed series: " << s.name;
    EXPECT_EQ(s.value.find("NaN"), std::string::npos)
        << label << ": " << s.name << " is " << s.value;
    EXPECT_EQ(s.value.find("Nan"), std::string::npos)
        << label << ": " << s.name << " is " << s.value;
    std::set<std::string> names;
    for (const auto& [key, value] : s.labels) {
      if (key != "le" && key != "quantile") names.insert(key);  // histogram and summary series
    }
    label_sets[FamilyOf(s.name, exposition)].insert(names);
  }
  for (const auto& [family, sets] : label_sets) {
    std::string shown;
    for (const auto& names : sets) {
      shown += "{";
      for (const std::string& name : names) shown += name + ",";
      shown += "} ";
    }
    EXPECT_EQ(sets.size(), 1u) << label << ": " << family
                               << " is exported with different label names: " << shown;
  }
  const std::regex source_file(R"([A-Za-z0-9_/]+\.(cc|h|py|cpp)\b)");
  for (const auto& [family, help] : exposition.help) {
    EXPECT_FALSE(std::regex_search(help, source_file))
        << label << ": the HELP of " << family << " names a source file: " << help;
    EXPECT_FALSE(help.empty()) << label << ": " << family << " has no HELP";
  }
  for (const auto& [family, type] : exposition.type) {
    EXPECT_EQ(exposition.help.count(family), 1u) << label << ": " << family << " has no HELP";
  }
}

// Calls of every kind on three threads until Stop(): gRPC Encode (one refused in ten) and
// AttentionMap, HTTP /v1/embeddings (one malformed body in seven), WatchJob streams of jobs that
// do not exist (streams that end at once). Each call must get the answer it should.
class MixedTraffic {
 public:
  explicit MixedTraffic(ServerProcess& server) {
    threads_.emplace_back([this, &server] {
      auto stub = server.NewStub();
      for (int i = 0; !stop_; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
        pb::EncodeRequest request;
        request.add_inputs()->set_text(i % 10 == 9 ? ""
                                                   : "metrics under traffic " + std::to_string(i));
        pb::EncodeResponse response;
        failures_ += stub->Encode(&context, request, &response).ok() == (i % 10 == 9);
        grpc::ClientContext attention_context;
        pb::AttentionMapRequest attention;
        attention.add_inputs()->set_text("a short attention map");
        attention.add_layers(0);
        pb::AttentionMapResponse maps;
        failures_ += !stub->AttentionMap(&attention_context, attention, &maps).ok();
        calls_ += 2;
      }
    });
    threads_.emplace_back([this, &server] {
      for (int i = 0; !stop_; ++i) {
        HttpResponse response;
        std::string error;
        const bool bad = i % 7 == 6;
        HttpRequest(server.http_port(), "POST", "/v1/embeddings", {},
                    bad ? R"({"input": )" : R"({"input": ["over http", "two texts"]})", &response,
                    &error);
        failures_ += response.status != (bad ? 400 : 200);
        ++calls_;
      }
    });
    threads_.emplace_back([this, &server] {
      auto trainer = pb::Trainer::NewStub(server.NewChannel());
      for (int i = 0; !stop_; ++i) {
        grpc::ClientContext context;
        context.AddMetadata("authorization", std::string("Bearer ") + kToken);
        pb::WatchJobRequest request;
        request.set_job_id("job-20261201T000000Z-" + std::to_string(i));
        auto reader = trainer->WatchJob(&context, request);
        pb::JobEvent event;
        while (reader->Read(&event)) {
        }
        failures_ += reader->Finish().error_code() != grpc::StatusCode::NOT_FOUND;
        ++calls_;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~MixedTraffic() { Stop(); }

  void Stop() {
    stop_ = true;
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }
  int calls() const { return calls_; }
  int failures() const { return failures_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> calls_{0}, failures_{0};
  std::vector<std::thread> threads_;
};

// The process_* family against what the test reads about process `pid` itself, just before.
void CheckProcessFamily(const Exposition& exposition, pid_t pid, const std::string& status,
                        int open_fds) {
  double rss_kb = 0;
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(status, '\n'))) {
    if (absl::StartsWith(line, "VmRSS:")) {
      ASSERT_TRUE(
          absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &rss_kb))
          << line;
    }
  }
  const double rss = Value(exposition, "process_resident_memory_bytes");
  EXPECT_NEAR(rss, rss_kb * 1024, rss_kb * 1024 * 0.2) << "VmRSS " << rss_kb << " kB";
  EXPECT_GE(Value(exposition, "process_virtual_memory_bytes"), rss);
  // The count moves a little between the test's look and the scrape (the scrape's connection).
  EXPECT_GT(Value(exposition, "process_open_fds"), 0);
  EXPECT_NEAR(Value(exposition, "process_open_fds"), open_fds, 8);
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  EXPECT_EQ(Value(exposition, "process_max_fds"), static_cast<double>(limit.rlim_cur));
  const double started = Value(exposition, "process_start_time_seconds");
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(started, now - static_cast<double>(ScaledSeconds(600).count()))
      << "the server started in this test";
  EXPECT_LE(started, now);
  const double cpu = Value(exposition, "process_cpu_seconds_total");
  EXPECT_GT(cpu, 0.5) << "a fine-tuning step and dozens of calls took CPU time";
  EXPECT_LT(cpu, (now - started + 1) * std::thread::hardware_concurrency());
}

TEST(MetricsTest, EveryScrapeUnderMixedTrafficPassesPromtoolAndNamesProcessFamily) {
  std::string promtool;
  ASSERT_TRUE(FindOnPath("promtool", &promtool))
      << "`promtool` is not on PATH: run scripts/setup.sh (Debian's prometheus package ships it)";
  ServerProcess& server = SharedServer();
  const pid_t pid = server.process().pid();

  MixedTraffic traffic(server);
  // A FineTune stream while the traffic runs.
  auto trainer = pb::Trainer::NewStub(server.NewChannel());
  CommitOptions commit;
  commit.token = kToken;
  EXPECT_FALSE(CommitOneContrastiveStep(trainer.get(), commit).empty());
  for (int scrape = 0; scrape < 4; ++scrape) {
    std::string text, error;
    ASSERT_TRUE(server.ScrapeMetrics(&text, &error)) << error;
    CheckScrape(promtool, text, "scrape " + std::to_string(scrape) + " under traffic");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  traffic.Stop();
  EXPECT_EQ(traffic.failures(), 0) << "a call of the traffic got an unexpected answer";
  EXPECT_GT(traffic.calls(), 10);

  // The final scrape, next to what the test reads about the process itself.
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  int open_fds = 0;
  for ([[maybe_unused]] const auto& fd :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++open_fds;
  }
  std::string text, error;
  ASSERT_TRUE(server.ScrapeMetrics(&text, &error)) << error;
  CheckScrape(promtool, text, "the scrape after the traffic");
  const Exposition exposition = Read(text);
  CheckProcessFamily(exposition, pid, status, open_fds);

  // Streams have their own duration; unary calls keep theirs.
  for (const char* stream : {"FineTune", "WatchJob"}) {
    EXPECT_GE(Value(exposition, "attnserve_stream_duration_seconds_count", {{"method", stream}}), 1)
        << stream;
    EXPECT_EQ(Value(exposition, "attnserve_request_duration_seconds_count", {{"method", stream}}),
              0)
        << stream << " streams skew the unary calls' latency";
  }
  EXPECT_GE(Value(exposition, "attnserve_request_duration_seconds_count", {{"method", "Encode"}}),
            1);
  EXPECT_GE(Value(exposition, "attnserve_requests_total",
                  {{"method", "WatchJob"}, {"code", "NOT_FOUND"}}),
            1);
}

TEST(MetricsTest, TheMetricsPortAnswersOnlyGetMetrics) {
  ServerProcess& server = SharedServer();
  HttpResponse response;
  std::string error;
  ASSERT_TRUE(HttpGet(server.metrics_port(), "/metrics", &response, &error)) << error;
  EXPECT_EQ(response.status, 200);
  EXPECT_TRUE(absl::StrContains(response.headers, "text/plain; version=0.0.4")) << response.headers;
  ASSERT_TRUE(HttpGet(server.metrics_port(), "/other", &response, &error)) << error;
  EXPECT_EQ(response.status, 404);
}

}  // namespace
}  // namespace attn::integration
