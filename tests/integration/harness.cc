#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/safetensors.h"

namespace attn::integration {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path, bool* ok = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (ok != nullptr) *ok = in.good();
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Subprocess

Subprocess::Subprocess(std::string name) : name_(std::move(name)) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                        "/attnserve-it-" + name_ + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) != nullptr) dir_ = buffer.data();
  log_path_ = dir_ + "/" + name_ + ".log";
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && Running()) Stop(std::chrono::seconds(5));
  if (!dir_.empty() && std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

bool Subprocess::Start(const std::vector<std::string>& argv, std::string* error) {
  if (dir_.empty()) {
    *error = "could not create a temp directory for " + name_;
    return false;
  }
  // Everything the child needs is prepared before fork(): between fork and exec only
  // async-signal-safe calls are allowed (gRPC threads may hold locks).
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    *error = Errno("open " + log_path_);
    return false;
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    *error = Errno("fork");
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return false;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(args[0], args.data());
    const char message[] = "exec failed: ";
    (void)!write(2, message, sizeof(message) - 1);
    (void)!write(2, args[0], strlen(args[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  close(log_fd);
  if (null_fd >= 0) close(null_fd);
  pid_ = pid;
  exited_ = false;
  return true;
}

bool Subprocess::Running() {
  if (pid_ <= 0 || exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    wait_status_ = status;
    return false;
  }
  return true;
}

bool Subprocess::WaitExit(std::chrono::duration<double> timeout, int* wait_status) {
  const auto deadline = Clock::now() + timeout;
  while (Running()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (wait_status != nullptr) *wait_status = wait_status_;
  return exited_;
}

void Subprocess::Signal(int signal) {
  if (Running()) kill(pid_, signal);
}

int Subprocess::Stop(std::chrono::duration<double> grace) {
  if (pid_ <= 0) return -1;
  if (Running()) {
    kill(pid_, SIGTERM);
    if (!WaitExit(grace, nullptr)) {
      kill(pid_, SIGKILL);
      int status = 0;
      if (waitpid(pid_, &status, 0) == pid_) {
        exited_ = true;
        wait_status_ = status;
      }
    }
  }
  return exited_ ? wait_status_ : -1;
}

std::string Subprocess::LogTail(size_t max_bytes) const {
  std::string log = ReadFile(log_path_);
  if (log.size() > max_bytes) log = "[...]\n" + log.substr(log.size() - max_bytes);
  return log;
}

std::string Subprocess::ExitDescription() const {
  if (!exited_) return "running";
  if (WIFEXITED(wait_status_))
    return "exited with code " + std::to_string(WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    return "killed by signal " + std::to_string(WTERMSIG(wait_status_)) + " (" +
           strsignal(WTERMSIG(wait_status_)) + ")";
  }
  return "wait status " + std::to_string(wait_status_);
}

// ---------------------------------------------------------------------------------------------
// ServerProcess

std::string AttnserveBinary() {
  const char* env = std::getenv("ATTNSERVE_BINARY");
  return env != nullptr && *env != '\0' ? env : ATTNSERVE_BINARY;
}

std::string TestModelDir() {
  const char* env = std::getenv("ATTN_TEST_MODEL_DIR");
  return env != nullptr && *env != '\0' ? env : ATTN_TEST_MODEL_DIR;
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::duration<double> timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ServerProcess::ServerProcess(std::vector<std::string> extra_flags, int port)
    : extra_flags_(std::move(extra_flags)), requested_port_(port) {}

bool ServerProcess::Start(std::string* error) {
  const std::string binary = AttnserveBinary();
  if (access(binary.c_str(), X_OK) != 0) {
    *error = "attnserve binary not found or not executable: " + binary +
             " (build target attnserve, or set ATTNSERVE_BINARY)";
    return false;
  }
  process_ = std::make_unique<Subprocess>("attnserve");
  ready_file_ = process_->dir() + "/ready.json";
  std::vector<std::string> argv = {binary,
                                   "--model_dir=" + TestModelDir(),
                                   "--host=127.0.0.1",
                                   "--port=" + std::to_string(requested_port_),
                                   "--metrics_port=0",
                                   "--http_port=0",
                                   "--ready_file=" + ready_file_};
  argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
  return process_->Start(argv, error);
}

bool ServerProcess::ReadyFileExists() const {
  struct stat st;
  return !ready_file_.empty() && stat(ready_file_.c_str(), &st) == 0;
}

bool ServerProcess::WaitReady(std::chrono::duration<double> timeout, std::string* error) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (ReadyFileExists()) {
      const std::string text = ReadFile(ready_file_);
      // The contract is an atomic write (temp + rename): a partial file is a failure.
      const nlohmann::json ready = nlohmann::json::parse(text, nullptr, false);
      if (ready.is_discarded() || !ready.is_object()) {
        *error = "ready file " + ready_file_ +
                 " is not complete JSON (not written atomically?): '" + text + "'";
        return false;
      }
      if (!ready.contains("grpc_port") || !ready["grpc_port"].is_number_integer() ||
          !ready.contains("metrics_port") || !ready["metrics_port"].is_number_integer() ||
          !ready.contains("pid") || !ready["pid"].is_number_integer()) {
        *error = "ready file lacks integer grpc_port/metrics_port/pid: " + text;
        return false;
      }
      grpc_port_ = ready["grpc_port"].get<int>();
      metrics_port_ = ready["metrics_port"].get<int>();
      if (ready.contains("http_port") && ready["http_port"].is_number_integer()) {
        http_port_ = ready["http_port"].get<int>();
      }
      ready_pid_ = ready["pid"].get<int>();
      if (grpc_port_ <= 0 || (requested_port_ != 0 && grpc_port_ != requested_port_)) {
        *error = "ready file grpc_port " + std::to_string(grpc_port_) + " but requested port " +
                 std::to_string(requested_port_);
        return false;
      }
      if (metrics_port_ <= 0) {
        *error = "ready file metrics_port " + std::to_string(metrics_port_) + " (not a port)";
        return false;
      }
      if (ready_pid_ != process_->pid()) {
        *error = "ready file pid " + std::to_string(ready_pid_) + " but the child is " +
                 std::to_string(process_->pid());
        return false;
      }
      return true;
    }
    if (!process_->Running()) {
      *error = "attnserve " + process_->ExitDescription() + " before writing the ready file";
      return false;
    }
    if (Clock::now() >= deadline) {
      *error = "no ready file after " + std::to_string(timeout.count()) + " s";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool ServerProcess::StartAndWait(std::chrono::duration<double> timeout, std::string* error) {
  if (!Start(error)) return false;
  if (WaitReady(timeout, error)) return true;
  *error += "\n--- attnserve log ---\n" + process_->LogTail() + "\n--- end of log ---";
  return false;
}

std::string ServerProcess::address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }

std::shared_ptr<grpc::Channel> ServerProcess::NewChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<pb::Encoder::Stub> ServerProcess::NewStub() const {
  return pb::Encoder::NewStub(NewChannel());
}

bool ServerProcess::ScrapeMetrics(std::string* body, std::string* error) const {
  HttpResponse response;
  if (!HttpGet(metrics_port_, "/metrics", &response, error)) return false;
  if (response.status != 200) {
    *error = "GET /metrics: HTTP " + std::to_string(response.status) + ": " + response.body;
    return false;
  }
  *body = std::move(response.body);
  return true;
}

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool AcceptsConnections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return connected;
}

std::string RunCommand(const std::string& command, int* exit_code) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  *exit_code = -1;
  if (pipe == nullptr) return output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

bool FindOnPath(const std::string& name, std::string* path) {
  const char* env = std::getenv("PATH");
  std::stringstream dirs(env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) {
      *path = candidate;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// HTTP, Prometheus text

bool HttpGet(int port, const std::string& path, HttpResponse* response, std::string* error,
             std::chrono::duration<double> timeout) {
  return HttpRequest(port, "GET", path, {}, "", response, error, timeout);
}

bool HttpRequest(int port, const std::string& method, const std::string& path,
                 const std::vector<std::string>& headers, const std::string& body,
                 HttpResponse* response, std::string* error,
                 std::chrono::duration<double> timeout) {
  std::string request =
      method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n";
  for (const std::string& header : headers) request += header + "\r\n";
  if (!body.empty() || method == "POST") {
    request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  request += "\r\n" + body;
  return HttpExchange(port, {request}, std::chrono::milliseconds(0), response, error, timeout);
}

bool HttpExchange(int port, const std::vector<std::string>& parts, std::chrono::milliseconds pause,
                  HttpResponse* response, std::string* error, std::chrono::duration<double> timeout,
                  double* seconds) {
  const auto start = Clock::now();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = Errno("socket");
    return false;
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count());
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() - tv.tv_sec) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = Errno("connect 127.0.0.1:" + std::to_string(port));
    close(fd);
    return false;
  }
  bool closed_early = false;
  for (const std::string& part : parts) {
    size_t sent = 0;
    while (sent < part.size() && !closed_early) {
      const ssize_t n = send(fd, part.data() + sent, part.size() - sent, MSG_NOSIGNAL);
      // The server may answer and close before everything is sent (a refused body): read then.
      if (n <= 0) closed_early = true;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if (closed_early) break;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  std::string raw;
  char buffer[65536];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (!raw.empty() || closed_early) break;  // a reset after the answer
      *error = Errno("recv from 127.0.0.1:" + std::to_string(port));
      close(fd);
      return false;
    }
    raw.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (seconds != nullptr) *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const size_t header_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 5, "HTTP/") != 0 || header_end == std::string::npos) {
    *error = "malformed HTTP response: '" + raw.substr(0, 200) + "'";
    return false;
  }
  const size_t space = raw.find(' ');
  response->status = std::atoi(raw.c_str() + space + 1);
  response->headers = raw.substr(0, header_end);
  response->body = raw.substr(header_end + 4);
  return true;
}

bool Metrics::Parse(const std::string& text, Metrics* metrics, std::string* error) {
  metrics->samples_.clear();
  std::stringstream lines(text);
  std::string line;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] == '#') continue;
    auto fail = [&](const std::string& why) {
      *error = "metrics line " + std::to_string(line_number) + ": " + why + ": '" + line + "'";
      return false;
    };
    MetricSample sample;
    const size_t name_end = line.find_first_of("{ \t", i);
    if (name_end == std::string::npos) return fail("no value");
    sample.name = line.substr(i, name_end - i);
    i = name_end;
    if (line[i] == '{') {
      ++i;
      while (true) {
        while (i < line.size() && (line[i] == ',' || line[i] == ' ')) ++i;
        if (i >= line.size()) return fail("unterminated labels");
        if (line[i] == '}') {
          ++i;
          break;
        }
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          return fail("bad label");
        }
        const std::string key = line.substr(i, eq - i);
        std::string value;
        i = eq + 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value.push_back(line[i] == 'n' ? '\n' : line[i]);
          } else {
            value.push_back(line[i]);
          }
          ++i;
        }
        if (i >= line.size()) return fail("unterminated label value");
        ++i;  // closing quote
        sample.labels[key] = value;
      }
    }
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t value_end = line.find_first_of(" \t", i);
    const std::string value =
        line.substr(i, value_end == std::string::npos ? value_end : value_end - i);
    char* end = nullptr;
    sample.value = std::strtod(value.c_str(), &end);
    if (value.empty() || end == nullptr || *end != '\0') return fail("bad value '" + value + "'");
    metrics->samples_.push_back(std::move(sample));
  }
  return true;
}

namespace {
bool LabelsMatch(const MetricSample& sample, const std::map<std::string, std::string>& labels) {
  for (const auto& [key, value] : labels) {
    auto it = sample.labels.find(key);
    if (it == sample.labels.end() || it->second != value) return false;
  }
  return true;
}
}  // namespace

double Metrics::Sum(const std::string& name,
                    const std::map<std::string, std::string>& labels) const {
  double sum = 0;
  for (const MetricSample& sample : samples_) {
    if (sample.name == name && LabelsMatch(sample, labels)) sum += sample.value;
  }
  return sum;
}

bool Metrics::Has(const std::string& name, const std::map<std::string, std::string>& labels) const {
  for (const MetricSample& sample : samples_) {
    if (sample.name == name && LabelsMatch(sample, labels)) return true;
  }
  return false;
}

Metrics ScrapeOrFail(const ServerProcess& server) {
  Metrics metrics;
  std::string body, error;
  if (!server.ScrapeMetrics(&body, &error)) {
    ADD_FAILURE() << "scrape failed: " << error;
    return metrics;
  }
  if (!Metrics::Parse(body, &metrics, &error)) ADD_FAILURE() << error;
  return metrics;
}

double ScrapeSum(const ServerProcess& server, const std::string& name,
                 const std::map<std::string, std::string>& labels) {
  Metrics metrics;
  std::string body, error;
  if (!server.ScrapeMetrics(&body, &error) || !Metrics::Parse(body, &metrics, &error)) {
    return std::nan("");
  }
  return metrics.Sum(name, labels);
}

// ---------------------------------------------------------------------------------------------
// Tensors

float HalfToFloat(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

std::vector<int64_t> Shape(const pb::Tensor& tensor) {
  return std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
}

std::string ShapeString(const pb::Tensor& tensor) {
  std::string s = "[";
  for (int i = 0; i < tensor.shape_size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(tensor.shape(i));
  }
  return s + "]";
}

bool DecodeTensor(const pb::Tensor& tensor, std::vector<float>* values, std::string* error) {
  int64_t count = 1;
  for (int64_t dim : tensor.shape()) {
    if (dim < 0) {
      *error = "negative dimension in shape " + ShapeString(tensor);
      return false;
    }
    count *= dim;
  }
  if (tensor.shape_size() == 0) count = 0;
  const std::string& data = tensor.data();
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  const int size = tensor.dtype() == pb::FLOAT16 || tensor.dtype() == pb::BFLOAT16 ? 2 : 4;
  if (static_cast<int64_t>(data.size()) != count * size) {
    *error = "tensor " + ShapeString(tensor) + " of dtype " + pb::DType_Name(tensor.dtype()) +
             " has " + std::to_string(data.size()) + " data bytes, expected " +
             std::to_string(count * size);
    return false;
  }
  values->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* p = bytes + i * size;
    if (size == 4) {
      const uint32_t word = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                            static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
      std::memcpy(&(*values)[i], &word, 4);
    } else {
      const uint16_t half = static_cast<uint16_t>(p[0] | p[1] << 8);
      (*values)[i] = tensor.dtype() == pb::FLOAT16 ? HalfToFloat(half) : BFloat16ToFloat(half);
    }
  }
  return true;
}

std::vector<float> DecodeOrFail(const pb::Tensor& tensor) {
  std::vector<float> values;
  std::string error;
  if (!DecodeTensor(tensor, &values, &error)) {
    ADD_FAILURE() << error;
    return {};
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Golden fixtures

float GoldenCase::Attention(int layer, int head, int r, int col) const {
  const size_t rows_count = rows.size();
  return attn[((static_cast<size_t>(layer) * kNumHeads + head) * rows_count + r) * seq_len + col];
}

float GoldenCase::Hidden(int layer, int r, int k) const {
  return hidden[(static_cast<size_t>(layer) * rows.size() + r) * kHidden + k];
}

const std::vector<GoldenCase>& GoldenCases() {
  static const std::vector<GoldenCase>* cases = [] {
    auto* out = new std::vector<GoldenCase>();
    const std::string dir = ATTN_GOLDEN_DIR;
    std::ifstream json_file(dir + "/minilm_cases.json");
    if (!json_file.good()) {
      ADD_FAILURE() << "missing " << dir << "/minilm_cases.json";
      return out;
    }
    const nlohmann::json all = nlohmann::json::parse(json_file);
    auto tensors = SafetensorsFile::Open(dir + "/minilm_golden.safetensors");
    if (!tensors.ok()) {
      ADD_FAILURE() << tensors.status();
      return out;
    }
    auto read = [&](const std::string& name, std::vector<float>* values) {
      auto tensor = (*tensors)->ReadFloat32(name);
      if (!tensor.ok()) {
        ADD_FAILURE() << tensor.status();
        return;
      }
      values->assign(tensor->values().begin(), tensor->values().end());
    };
    for (const nlohmann::json& spec : all["cases"]) {
      GoldenCase c;
      c.spec = spec;
      c.name = spec["name"].get<std::string>();
      c.seq_len = spec["seq_len"].get<int>();
      c.rows = spec["rows"].get<std::vector<int>>();
      read(c.name + ".hidden_states", &c.hidden);
      read(c.name + ".attentions", &c.attn);
      read(c.name + ".pooled", &c.pooled);
      out->push_back(std::move(c));
    }
    return out;
  }();
  return *cases;
}

const GoldenCase& Golden(const std::string& name) {
  for (const GoldenCase& c : GoldenCases()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no golden case " << name;
  static const GoldenCase empty;
  return empty;
}

pb::Input GoldenInput(const GoldenCase& c) {
  pb::Input input;
  if (c.is_pair()) {
    input.mutable_pair()->set_first(c.spec["text"].get<std::string>());
    input.mutable_pair()->set_second(c.spec["text_pair"].get<std::string>());
  } else {
    input.set_text(c.spec["text"].get<std::string>());
  }
  return input;
}

pb::TokenizationOptions GoldenTokenization(const GoldenCase& c) {
  pb::TokenizationOptions options;
  options.set_max_length(c.spec["max_length"].get<int>());
  options.set_truncation(c.spec["truncation_side"] == "left" ? pb::TRUNCATION_LEFT
                                                             : pb::TRUNCATION_RIGHT);
  return options;
}

namespace {
// Byte offset of each code point of UTF-8 `text`, plus the total size at the end.
std::vector<int> CodePointByteOffsets(const std::string& text) {
  std::vector<int> offsets;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<uint8_t>(text[i]) & 0xC0) != 0x80) offsets.push_back(static_cast<int>(i));
  }
  offsets.push_back(static_cast<int>(text.size()));
  return offsets;
}
}  // namespace

void ExpectTokensMatchGolden(const GoldenCase& c,
                             const google::protobuf::RepeatedPtrField<pb::Token>& tokens) {
  const auto ids = c.spec["input_ids"].get<std::vector<int>>();
  const auto type_ids = c.spec["token_type_ids"].get<std::vector<int>>();
  const auto texts = c.spec["tokens"].get<std::vector<std::string>>();
  const auto offsets = c.spec["offsets"].get<std::vector<std::vector<int>>>();
  ASSERT_EQ(tokens.size(), static_cast<int>(ids.size())) << c.name;
  const std::vector<int> first_bytes = CodePointByteOffsets(c.spec["text"].get<std::string>());
  const std::vector<int> second_bytes =
      c.is_pair() ? CodePointByteOffsets(c.spec["text_pair"].get<std::string>())
                  : std::vector<int>{0};
  for (int i = 0; i < tokens.size(); ++i) {
    const pb::Token& token = tokens[i];
    SCOPED_TRACE(c.name + " token " + std::to_string(i) + " '" + texts[i] + "'");
    EXPECT_EQ(token.id(), ids[i]);
    EXPECT_EQ(token.text(), texts[i]);
    EXPECT_EQ(token.type_id(), type_ids[i]);
    EXPECT_EQ(token.char_start(), offsets[i][0]);
    EXPECT_EQ(token.char_end(), offsets[i][1]);
    const bool special = texts[i] == "[CLS]" || texts[i] == "[SEP]";
    EXPECT_EQ(token.special(), special);
    EXPECT_EQ(token.source(), special ? -1 : type_ids[i]);
    if (!special) {
      const std::vector<int>& bytes = type_ids[i] == 1 ? second_bytes : first_bytes;
      if (offsets[i][1] < static_cast<int>(bytes.size())) {
        EXPECT_EQ(token.byte_start(), bytes[offsets[i][0]]);
        EXPECT_EQ(token.byte_end(), bytes[offsets[i][1]]);
      }
    } else {
      EXPECT_EQ(token.char_start(), 0);
      EXPECT_EQ(token.char_end(), 0);
    }
  }
}

void StopOwnServer(ServerProcess* server) {
  if (server == nullptr || !server->spawned()) return;
  const int status = server->process().Stop(ScaledSeconds(35));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << server->process().ExitDescription();
  if (::testing::Test::HasFailure()) {
    std::printf("--- attnserve log ---\n%s\n--- end ---\n", server->process().LogTail().c_str());
  }
}

void RemoveTestDir(const std::string& dir) {
  if (std::getenv("ATTN_KEEP_TEST_DIRS") != nullptr) return;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 0;
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double max = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= max)) max = d;  // NaN propagates
  }
  return max;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::UNKNOWN:
      return "UNKNOWN";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "?";
  }
}

std::string StatusString(const grpc::Status& status) {
  return std::string(CodeName(status.error_code())) + ": " + status.error_message();
}

std::string TextOfTokens(int tokens, int seed) {
  // Common lower-case words, each a single WordPiece token of the uncased BERT vocabulary, so
  // the text is exactly `tokens` tokens with [CLS] and [SEP].
  static const char* const kWords[] = {"the",   "cat",   "sat",  "on",    "mat",  "and",
                                       "dog",   "ran",   "to",   "house", "city", "water",
                                       "light", "green", "tree", "river", "road", "small"};
  constexpr int kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::string text;
  for (int i = 0; i < tokens - 2; ++i) {
    if (i > 0) text += ' ';
    text += kWords[(i * 7 + seed * 5 + i / kCount) % kCount];
  }
  return text;
}

std::shared_ptr<grpc::Channel> TlsChannel(int port, const std::string& trusted_pem,
                                          const std::string& target_name_override) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = trusted_pem;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  if (!target_name_override.empty()) args.SetSslTargetNameOverride(target_name_override);
  return grpc::CreateCustomChannel("localhost:" + std::to_string(port), grpc::SslCredentials(ssl),
                                   args);
}

std::string CommitOneContrastiveStep(pb::Trainer::Stub* trainer, const CommitOptions& options) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + options.token);
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  auto stream = trainer->FineTune(&context);
  pb::FineTuneRequest config;
  config.mutable_config()->set_objective(pb::CONTRASTIVE);
  config.mutable_config()->set_learning_rate(options.learning_rate);
  config.mutable_config()->set_disable_dropout(true);
  config.mutable_config()->set_seed(3);
  config.mutable_config()->set_model(options.model);
  EXPECT_TRUE(stream->Write(config));
  pb::FineTuneRequest batch;
  for (const auto& [anchor, positive] :
       std::vector<std::pair<std::string, std::string>>{{"a red bicycle", "the tuesday meeting"},
                                                        {"fresh bread", "a broken umbrella"},
                                                        {"the violin concerto", "tax forms"}}) {
    pb::TrainingExample* example = batch.mutable_batch()->add_examples();
    example->set_anchor(anchor);
    example->set_positive(positive);
  }
  pb::FineTuneProgress progress;
  EXPECT_TRUE(stream->Write(batch) && stream->Read(&progress));
  pb::FineTuneRequest commit;
  commit.mutable_commit()->set_description(options.description);
  commit.mutable_commit()->set_promote(options.promote);
  EXPECT_TRUE(stream->Write(commit) && stream->Read(&progress));
  stream->WritesDone();
  pb::FineTuneProgress ignored;
  while (stream->Read(&ignored)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusString(status);
  EXPECT_FALSE(progress.committed_version().empty());
  EXPECT_EQ(progress.promoted(), options.promote) << progress.promotion();
  return progress.committed_version();
}

}  // namespace attn::integration
