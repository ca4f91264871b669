// The HTTP/1.1 listener of the HTTP front end: transport only (sockets, TLS, limits, worker
// pool); what a request means is up to the handler (http_routes.h).
//
// Built on Boost.Beast (Debian's libboost-dev, header-only). The candidates were civetweb
// (already linked through prometheus-cpp's exposer), cpp-httplib 0.11 and Beast:
// * civetweb 1.15 as Debian 12 builds it loads OpenSSL at run time and looks up
//   SSL_get_peer_certificate, which OpenSSL 3 no longer exports: every HTTPS connection
//   crashes the process (calls a null pointer after the handshake), so --tls-cert cannot cover
//   it;
// * cpp-httplib 0.11 times out each socket read rather than the whole request head, so a
//   client trickling one header byte at a time (slow-loris) holds a worker thread for hours;
// * Beast's asynchronous streams carry a deadline per operation (the whole head must arrive
//   within --http-header-timeout-s, or the client gets 408 and the connection closes), its
//   parser has head and body limits (431, 413 before the body is read), TLS is Asio's over the
//   system OpenSSL, and waiting connections cost no thread: a few I/O threads serve every
//   socket while a bounded pool (--http-threads) runs the handlers, with at most
//   --http-max-connections connections open.
// A client that closes its connection while its call waits or runs is noticed through the
// socket: HttpRequest::client_gone polls it for the peer's FIN (POLLRDHUP), which the batcher
// asks before it computes the call and between layers, so the work is dropped, not done.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace attn::server::http {

struct HttpRequest {
  std::string method;                        // "GET", "POST", ...
  std::string path;                          // without the query string
  std::string query;                         // after '?', "" when none
  std::optional<std::string> authorization;  // the Authorization header, when sent
  // The Open Inference Protocol's Inference-Header-Content-Length header, when sent: the JSON
  // part's length in a body with binary tensors after it (server/oip/oip_rest.h).
  std::optional<std::string> inference_header_length;
  std::string body;
  // True once the client has closed its connection (or it failed): nobody waits for the reply.
  // A client that only shuts down its sending side after the request counts as gone too (HTTP
  // clients do not: curl, Python's, Beast keep the connection open for the reply). Safe to
  // call from any thread, for as long as it is kept (it holds its own descriptor of the
  // socket). Empty when the listener cannot tell.
  std::function<bool()> client_gone;
};

struct HttpReply {
  int status = 200;
  // The canonical status behind the reply ("OK", "INVALID_ARGUMENT", ...): the metrics' code.
  std::string_view code_name = "OK";
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

struct HttpServerOptions {
  std::string host;
  int port = 0;                   // 0 = pick a free port
  int threads = 16;               // handler threads (each waits for its core call)
  int max_connections = 1024;     // open connections; more are closed at once
  double header_timeout_s = 10;   // a request head must arrive within it (else 408)
  double body_timeout_s = 60;     // its body must arrive, and the reply be taken, within it
  int64_t max_body_bytes = 0;     // a larger body gets 413 without being read
  std::string tls_cert, tls_key;  // PEM files; empty = plain HTTP
};

class HttpServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;
  // The reply for a body over max_body_bytes (413), given its declared or read length.
  using TooLarge = std::function<HttpReply(int64_t bytes)>;
  // The reply for a request the listener refuses itself (`http_status` 400, 408 or 431; `why`
  // says what was wrong): a head that timed out, is malformed or too large.
  using Refused = std::function<HttpReply(int http_status, const std::string& why)>;

  HttpServer(HttpServerOptions options, Handler handler, TooLarge too_large, Refused refused);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens and starts the threads; the port listened on (the chosen one for port 0).
  absl::StatusOr<int> Start();
  // Stops accepting and waits until the requests being handled are answered.
  void Stop();

  struct State;  // Asio objects, sessions (http_server.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace attn::server::http
