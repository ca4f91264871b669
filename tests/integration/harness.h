// Integration test harness: runs the real `attnserve` (and `prometheus`) as child processes,
// talks to them over loopback, and decodes what comes back.
//
// Each test binary shares one server process through SharedServer(); a binary chooses that
// server's flags by defining SharedServerFlags() (see integration_main.cc).
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnserve/v1/encoder.grpc.pb.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/time_scale.h"

namespace attn::integration {

namespace pb = ::attnserve::v1;

// ---------------------------------------------------------------------------------------------
// Processes

// A child process whose stdout and stderr go to a log file in its own temp directory. The child
// gets SIGKILL if the test process dies, so a crashed test never leaves a server behind.
class Subprocess {
 public:
  // Creates the temp directory; `name` names it and the log file.
  explicit Subprocess(std::string name);
  ~Subprocess();  // Stop() if still running, then removes the temp directory.
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // argv[0] is the executable path (no PATH lookup).
  bool Start(const std::vector<std::string>& argv, std::string* error);
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // A fresh temp directory owned by this process object (for config, ready and log files).
  const std::string& dir() const { return dir_; }

  // True while the child has not exited (reaps it if it has).
  bool Running();
  // Waits up to `timeout` for the child to exit; true and the raw wait status if it did.
  bool WaitExit(std::chrono::duration<double> timeout, int* wait_status);
  void Signal(int signal);
  // SIGTERM, up to `grace` for an exit, then SIGKILL. Returns the wait status (or -1).
  int Stop(std::chrono::duration<double> grace = std::chrono::seconds(10));
  // The captured stdout + stderr (last `max_bytes`).
  std::string LogTail(size_t max_bytes = 16000) const;
  // Whether the child exited and how: "exited with code 0", "killed by signal 9", "running".
  std::string ExitDescription() const;

 private:
  std::string name_;
  std::string dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int wait_status_ = 0;
};

// Path of the attnserve binary: $ATTNSERVE_BINARY, else the one CMake built.
std::string AttnserveBinary();
// The model served by the tests: $ATTN_TEST_MODEL_DIR, else the configured default.
std::string TestModelDir();
// Time limits scaled by $ATTN_TEST_TIME_SCALE (tests/time_scale.h).
using ::attn::testing::ScaledMilliseconds;
using ::attn::testing::ScaledSeconds;

// Polls `condition` every 10 ms until it holds (true) or `timeout` passes (false): how a test
// waits for something to happen, instead of sleeping and hoping it did.
bool WaitFor(const std::function<bool()>& condition, std::chrono::duration<double> timeout);

// The real server: `attnserve --model_dir=... --host=127.0.0.1 --port=P --metrics_port=0
// --ready_file=...` plus extra flags.
class ServerProcess {
 public:
  // port 0 = let the server pick (the ready file says which).
  explicit ServerProcess(std::vector<std::string> extra_flags = {}, int port = 0);

  // fork/exec only; returns at once.
  bool Start(std::string* error);
  // Polls the ready file (and that the process is alive) until it holds complete JSON.
  bool WaitReady(std::chrono::duration<double> timeout, std::string* error);
  // Start() + WaitReady(); on failure `error` includes the server's log.
  bool StartAndWait(std::chrono::duration<double> timeout, std::string* error);

  bool ReadyFileExists() const;
  const std::string& ready_file() const { return ready_file_; }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // -1 when the server has no HTTP port
  pid_t ready_pid() const { return ready_pid_; }
  std::string address() const;
  // False when Start() failed before spawning (e.g. no attnserve binary): process() is invalid.
  bool spawned() const { return process_ != nullptr; }
  Subprocess& process() { return *process_; }

  // A new channel with no message size limits (the tests ask for large attention maps) and no
  // HTTP proxy (loopback only).
  std::shared_ptr<grpc::Channel> NewChannel() const;
  std::unique_ptr<pb::Encoder::Stub> NewStub() const;
  // GET /metrics.
  bool ScrapeMetrics(std::string* body, std::string* error) const;

 private:
  std::vector<std::string> extra_flags_;
  int requested_port_;
  std::unique_ptr<Subprocess> process_;
  std::string ready_file_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = -1;
  pid_t ready_pid_ = 0;
};

// Defined by each test binary: flags of its shared server, or nullopt for none.
std::optional<std::vector<std::string>> SharedServerFlags();
// The binary's shared server, started (and ready) before any test runs.
ServerProcess& SharedServer();

// A free TCP port on 127.0.0.1 (bound to port 0, then released: racy, but only for children
// that need the port on their command line).
int PickFreePort();

// One contrastive FineTune step on three pairs the model does not know, committed (staged, or
// served by default with `promote`) with `description`; `model` picks the served model ("" = the
// default). The new version's name ("" and a test failure when the job fails).
struct CommitOptions {
  std::string token;
  std::string model;
  double learning_rate = 5e-5;
  bool promote = false;
  std::string description = "integration test";
};
std::string CommitOneContrastiveStep(pb::Trainer::Stub* trainer, const CommitOptions& options);

// Whether a TCP connection to 127.0.0.1:port is accepted (a listener is open).
bool AcceptsConnections(int port);

// Whether an executable named `name` is on $PATH; its full path in *path.
bool FindOnPath(const std::string& name, std::string* path);

// Runs `command` with /bin/sh and returns what it wrote to stdout; `exit_code` gets its exit
// status (-1 when it did not exit normally).
std::string RunCommand(const std::string& command, int* exit_code);

// ---------------------------------------------------------------------------------------------
// HTTP and Prometheus text format

struct HttpResponse {
  int status = 0;
  std::string headers;  // the status line and header lines, as received
  std::string body;
};
// A minimal HTTP/1.0 GET over a POSIX socket (the server closes the connection at the end).
bool HttpGet(int port, const std::string& path, HttpResponse* response, std::string* error,
             std::chrono::duration<double> timeout = std::chrono::seconds(10));
// Sends `parts` (raw bytes: a request, or pieces of one) to 127.0.0.1:port, `pause` apart,
// stopping early if the server closes; then reads until the server closes the connection.
// False (with *error) only when the connection fails or the answer is not HTTP; *seconds is the
// whole exchange's time. For requests no client library would send (tests/reliability).
bool HttpExchange(int port, const std::vector<std::string>& parts, std::chrono::milliseconds pause,
                  HttpResponse* response, std::string* error,
                  std::chrono::duration<double> timeout = std::chrono::seconds(60),
                  double* seconds = nullptr);
// Any HTTP/1.0 request: `method` `path` with `headers` ("Name: value" lines) and `body`
// (Content-Length is added when the body is not empty or the method is POST).
bool HttpRequest(int port, const std::string& method, const std::string& path,
                 const std::vector<std::string>& headers, const std::string& body,
                 HttpResponse* response, std::string* error,
                 std::chrono::duration<double> timeout = std::chrono::seconds(60));

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parsed Prometheus text exposition (format 0.0.4); comment lines are skipped.
class Metrics {
 public:
  static bool Parse(const std::string& text, Metrics* metrics, std::string* error);

  // Sum of the samples named `name` whose labels include all of `labels`.
  double Sum(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // Whether any sample matches.
  bool Has(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  const std::vector<MetricSample>& samples() const { return samples_; }

 private:
  std::vector<MetricSample> samples_;
};

// Scrapes and parses, with gtest assertions on the way.
Metrics ScrapeOrFail(const ServerProcess& server);
// One metric's sum from a fresh scrape (no gtest assertions: NaN if the scrape failed), for
// WaitFor conditions such as "attnserve_queue_depth reached 2".
double ScrapeSum(const ServerProcess& server, const std::string& name,
                 const std::map<std::string, std::string>& labels = {});

// ---------------------------------------------------------------------------------------------
// Tensors and golden fixtures

// attnserve.v1.Tensor -> fp32 values; checks dtype and that data holds prod(shape) values.
bool DecodeTensor(const pb::Tensor& tensor, std::vector<float>* values, std::string* error);
// Same, as a gtest assertion helper: fails the test and returns {} on error.
std::vector<float> DecodeOrFail(const pb::Tensor& tensor);
// Independent reference conversions (not the server's code).
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

std::string ShapeString(const pb::Tensor& tensor);
std::vector<int64_t> Shape(const pb::Tensor& tensor);

// One case of tests/golden/minilm_cases.json with its tensors from minilm_golden.safetensors.
struct GoldenCase {
  nlohmann::json spec;
  std::string name;
  int seq_len = 0;
  std::vector<int> rows;      // token positions stored in the tensors below
  std::vector<float> hidden;  // [7, R, 384]
  std::vector<float> attn;    // [6, 12, R, seq_len]
  std::vector<float> pooled;  // [384]
  bool is_pair() const { return !spec["text_pair"].is_null(); }
  bool sentence_transformers_pooled() const {
    return spec["pooled_source"] == "sentence_transformers";
  }
  // attentions[layer][head][r][col], r an index into rows.
  float Attention(int layer, int head, int r, int col) const;
  float Hidden(int layer, int r, int k) const;
};
constexpr int kNumLayers = 6;
constexpr int kNumHeads = 12;
constexpr int kHidden = 384;
constexpr int kHeadDim = 32;
constexpr int kVocabSize = 30522;

// Loaded once per process.
const std::vector<GoldenCase>& GoldenCases();
const GoldenCase& Golden(const std::string& name);
// The request input and tokenization options that reproduce the case.
pb::Input GoldenInput(const GoldenCase& c);
pb::TokenizationOptions GoldenTokenization(const GoldenCase& c);

// Checks token ids, texts, type ids, char offsets and special flags against the fixture.
void ExpectTokensMatchGolden(const GoldenCase& c,
                             const google::protobuf::RepeatedPtrField<pb::Token>& tokens);

// Stops a server a test suite started itself (null or never spawned: nothing to do): expects a
// clean exit with status 0 and prints the server's log when the suite has a failure.
void StopOwnServer(ServerProcess* server);
// Removes a test's work directory, unless ATTN_KEEP_TEST_DIRS is set.
void RemoveTestDir(const std::string& dir);

double Cosine(const std::vector<float>& a, const std::vector<float>& b);
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// "INVALID_ARGUMENT: message" for assertion messages.
std::string StatusString(const grpc::Status& status);
const char* CodeName(grpc::StatusCode code);

// A text of roughly `tokens` WordPiece tokens (each word one token) for load tests.
std::string TextOfTokens(int tokens, int seed = 0);

// A TLS channel to the server on localhost:`port` trusting the PEM certificate `trusted_pem`
// (no HTTP proxy); `target_name_override` checks the certificate against another host name.
std::shared_ptr<grpc::Channel> TlsChannel(int port, const std::string& trusted_pem,
                                          const std::string& target_name_override = "");

}  // namespace attn::integration
