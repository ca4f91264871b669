#include "client/attnctl/http_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace attn::client::attnctl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxBody = 64 << 10;

// Milliseconds left until `deadline` (at least 0), for poll().
int MillisecondsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Splits "host:port" / "[v6]:port" (after a dns:///, ipv4: or ipv6: scheme); false otherwise.
bool SplitTarget(std::string target, std::string* host, std::string* port) {
  absl::string_view t = target;
  if (!absl::ConsumePrefix(&t, "dns:///")) {
    if (!absl::ConsumePrefix(&t, "ipv4:")) absl::ConsumePrefix(&t, "ipv6:");
  }
  if (absl::StrContains(t, "://") || absl::StartsWith(t, "unix:")) return false;
  const size_t colon = t.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == t.size()) return false;
  absl::string_view h = t.substr(0, colon);
  if (absl::ConsumePrefix(&h, "[")) absl::ConsumeSuffix(&h, "]");
  *host = std::string(h.empty() ? "localhost" : h);
  *port = std::string(t.substr(colon + 1));
  return true;
}

// A connected socket to host:port (non-blocking), or -1.
int Connect(const std::string& host, const std::string& port, Clock::time_point deadline) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    if (errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof(error);
      if (poll(&p, 1, MillisecondsLeft(deadline)) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0) {
        break;
      }
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

// Sends `request` and reads the answer until the server closes, the deadline or kMaxBody.
bool Exchange(int fd, const std::string& request, Clock::time_point deadline, std::string* answer) {
  size_t sent = 0;
  while (sent < request.size()) {
    pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, MillisecondsLeft(deadline)) != 1) return false;
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  char buffer[4096];
  while (answer->size() < kMaxBody) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, MillisecondsLeft(deadline)) != 1) break;
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    answer->append(buffer, static_cast<size_t>(n));
  }
  return !answer->empty();
}

}  // namespace

std::optional<HttpAnswer> HttpProbe(const std::string& target, const std::string& path,
                                    std::chrono::milliseconds timeout) {
  std::string host, port;
  if (!SplitTarget(target, &host, &port)) return std::nullopt;
  const Clock::time_point deadline = Clock::now() + timeout;
  const int fd = Connect(host, port, deadline);
  if (fd < 0) return std::nullopt;
  std::string answer;
  const bool exchanged = Exchange(
      fd, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n"), deadline, &answer);
  close(fd);
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  absl::string_view view = answer;
  if (!exchanged || !absl::ConsumePrefix(&view, "HTTP/1.")) return std::nullopt;
  HttpAnswer parsed;
  const size_t space = view.find(' ');
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(view.substr(space + 1, 3), &parsed.status)) {
    return std::nullopt;
  }
  const size_t body = view.find("\r\n\r\n");
  if (body != absl::string_view::npos) parsed.body = std::string(view.substr(body + 4));
  return parsed;
}

std::string ExplainHttpPort(const std::string& target) {
  const std::chrono::milliseconds timeout(2000);
  std::string host, port;
  SplitTarget(target, &host, &port);
  if (std::optional<HttpAnswer> health = HttpProbe(target, "/health", timeout)) {
    const nlohmann::json json = nlohmann::json::parse(health->body, nullptr, false);
    if (json.is_object() && json.contains("grpc_port") && json["grpc_port"].is_number_integer()) {
      const int grpc_port = json["grpc_port"].get<int>();
      return absl::StrCat(target, " is attnserve's HTTP port (HTTP/JSON, /v1/embeddings); attnctl ",
                          "speaks gRPC, which this server serves on port ", grpc_port,
                          ": attnctl --server ", host, ":", grpc_port);
    }
  }
  if (std::optional<HttpAnswer> metrics = HttpProbe(target, "/metrics", timeout)) {
    if (metrics->status == 200 && absl::StrContains(metrics->body, "attnserve_")) {
      return absl::StrCat(target,
                          " is attnserve's metrics port (--metrics-port, Prometheus); attnctl "
                          "needs its gRPC port (attnserve --port, 50051 unless set)");
    }
  }
  return absl::StrCat(target,
                      " answers HTTP/1.x, not gRPC: attnctl needs attnserve's gRPC port "
                      "(attnserve --port, 50051 unless set), not its HTTP or metrics port");
}

}  // namespace attn::client::attnctl
