#include "server/http/http_server.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/log.h"

namespace attn::server::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr int kIoThreads = 2;                  // sockets and timers only: handlers run elsewhere
constexpr uint32_t kMaxHeadBytes = 16 * 1024;  // request line + headers
constexpr auto kCloseGrace = std::chrono::seconds(2);

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
}

// HttpRequest::client_gone for a connected socket: a descriptor of its own (dup), so the check
// stays safe whatever happens to the session's socket, and closed with the last copy of the
// function (the batcher may hold one after the reply).
std::function<bool()> ClientGoneCheck(int socket_fd) {
  const int fd = dup(socket_fd);
  if (fd < 0) return {};
  auto owned = std::shared_ptr<int>(new int(fd), [](int* p) {
    close(*p);
    delete p;
  });
  return [owned] {
    pollfd watch{};
    watch.fd = *owned;
    watch.events = POLLRDHUP;  // the peer's FIN, even with unread (pipelined) bytes before it
    return poll(&watch, 1, 0) > 0 && (watch.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  };
}

}  // namespace

struct HttpServer::State {
  HttpServerOptions options;
  Handler handler;
  TooLarge too_large;
  Refused refused;

  asio::io_context io;
  std::optional<asio::ssl::context> tls;
  // The acceptor's handlers and Stop's close run on one strand (the I/O threads are two).
  tcp::acceptor acceptor{asio::make_strand(io)};
  asio::thread_pool workers;
  // Keeps io.run() going while a call is with the workers and nothing waits on a socket (after
  // the acceptor closes, that is every connection): the reply is posted back to io.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  std::atomic<int> connections{0};
  // How to close each open connection (Stop closes the idle keep-alive ones so io.run() runs
  // out of work and every handler, each holding this State, is released).
  std::mutex sessions_mutex;
  std::map<uint64_t, std::function<void()>> session_closers;
  uint64_t next_session = 0;

  // Requests between a complete head + body and their response's last byte.
  std::mutex mutex;
  std::condition_variable idle;
  int in_flight = 0;

  explicit State(int threads) : workers(static_cast<size_t>(threads)) {}
  void Begin() {
    std::lock_guard<std::mutex> lock(mutex);
    ++in_flight;
  }
  void End() {
    std::lock_guard<std::mutex> lock(mutex);
    if (--in_flight == 0) idle.notify_all();
  }
};

namespace {

// One connection: reads a request head within the header timeout and its body, hands the
// request to the worker pool, writes the reply, and reads the next request (keep-alive).
template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(std::shared_ptr<HttpServer::State> state, Stream stream)
      : state_(std::move(state)), stream_(std::move(stream)), head_timer_(stream_.get_executor()) {}
  ~Session() {
    {
      std::lock_guard<std::mutex> lock(state_->sessions_mutex);
      state_->session_closers.erase(id_);
    }
    --state_->connections;
  }

  void Start() {
    {
      std::lock_guard<std::mutex> lock(state_->sessions_mutex);
      id_ = state_->next_session++;
      state_->session_closers[id_] = [weak = this->weak_from_this()] {
        if (auto self = weak.lock()) {
          asio::post(self->Tcp().get_executor(), [self] {
            self->head_timer_.cancel();
            self->Tcp().close();
          });
        }
      };
    }
    if constexpr (kTls) {
      Tcp().expires_after(Millis(state_->options.header_timeout_s));
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code error) {
                                if (error) return self->Tcp().close();  // not a TLS client
                                self->ReadHead();
                              });
    } else {
      ReadHead();
    }
  }

 private:
  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  void ReadHead() {
    parser_.emplace();
    parser_->header_limit(kMaxHeadBytes);
    parser_->body_limit(static_cast<uint64_t>(state_->options.max_body_bytes));
    // The head's deadline is a timer of our own rather than the stream's: the stream closes
    // the socket when its deadline passes, and the slow client should still get its 408. When
    // the timer fires it ends the read by shutting the socket's receiving side.
    Tcp().expires_never();
    head_timed_out_ = false;
    reading_head_ = true;
    head_timer_.expires_after(Millis(state_->options.header_timeout_s));
    head_timer_.async_wait([self = this->shared_from_this()](beast::error_code error) {
      // Cancelled, or expired just as the head arrived (its handler was queued already).
      if (error || !self->reading_head_) return;
      self->head_timed_out_ = true;
      beast::error_code ignored;
      self->Tcp().socket().shutdown(tcp::socket::shutdown_receive, ignored);
    });
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = this->shared_from_this()](beast::error_code error, size_t) {
                               self->reading_head_ = false;
                               self->head_timer_.cancel();
                               self->OnHead(error);
                             });
  }

  void OnHead(beast::error_code error) {
    const bool started = parser_->got_some() || buffer_.size() > 0;
    if (head_timed_out_) {
      // An idle kept-alive connection just closes; a head begun and not finished is a slow
      // client.
      if (!started) return Close();
      return Refuse(408,
                    absl::StrCat("the request head did not arrive within ",
                                 state_->options.header_timeout_s, " s (--http-header-timeout-s)"));
    }
    if (error == bhttp::error::body_limit) {  // its Content-Length is over the limit
      const auto length = parser_->content_length();
      return Reply(state_->too_large(length.has_value() ? static_cast<int64_t>(*length)
                                                        : state_->options.max_body_bytes + 1),
                   /*close=*/true);
    }
    if (error == bhttp::error::header_limit) {
      return Refuse(431, absl::StrCat("the request head is over ", kMaxHeadBytes, " bytes"));
    }
    if (error == bhttp::error::end_of_stream || error == asio::error::eof ||
        error == asio::ssl::error::stream_truncated || (error && !started)) {
      return Close();
    }
    if (error) return Refuse(400, absl::StrCat("malformed HTTP request: ", error.message()));
    const auto length = parser_->content_length();
    if (length.has_value() && *length > static_cast<uint64_t>(state_->options.max_body_bytes)) {
      // Refused before reading it; the connection closes, since the rest of the body would be
      // read as the next request otherwise.
      return Reply(state_->too_large(static_cast<int64_t>(*length)), /*close=*/true);
    }
    // The body's deadline is our own timer too, for the same reason: a stream deadline would
    // close the socket, and the client whose body stalled would never see its 408.
    body_timed_out_ = false;
    reading_body_ = true;
    head_timer_.expires_after(Millis(state_->options.body_timeout_s));
    head_timer_.async_wait([self = this->shared_from_this()](beast::error_code error) {
      if (error || !self->reading_body_) return;
      self->body_timed_out_ = true;
      beast::error_code ignored;
      self->Tcp().socket().shutdown(tcp::socket::shutdown_receive, ignored);
    });
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code error, size_t) {
                        self->reading_body_ = false;
                        self->head_timer_.cancel();
                        self->OnBody(error);
                      });
  }

  void OnBody(beast::error_code error) {
    if (body_timed_out_) {
      return Refuse(408,
                    absl::StrCat("the request body did not arrive within ",
                                 state_->options.body_timeout_s, " s (--http-body-timeout-s)"));
    }
    if (error == bhttp::error::body_limit) {
      return Reply(state_->too_large(state_->options.max_body_bytes + 1), /*close=*/true);
    }
    if (error == bhttp::error::partial_message || error == asio::error::eof ||
        error == asio::error::connection_reset) {
      return Close();  // the client went away mid-body: nobody to answer
    }
    if (error) return Refuse(400, absl::StrCat("malformed HTTP request body: ", error.message()));
    bhttp::request<bhttp::string_body> message = parser_->release();
    version_ = message.version();
    keep_alive_ = message.keep_alive();
    HttpRequest request;
    request.method = std::string(message.method_string());
    const std::string target(message.target());
    const size_t question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = target.substr(question + 1);
    if (auto it = message.find(bhttp::field::authorization); it != message.end()) {
      request.authorization = std::string(it->value());
    }
    // The Open Inference Protocol's binary tensors (server/oip/oip_rest.h).
    if (auto it = message.find("Inference-Header-Content-Length"); it != message.end()) {
      request.inference_header_length = std::string(it->value());
    }
    request.body = std::move(message.body());
    request.client_gone = ClientGoneCheck(Tcp().socket().native_handle());
    Tcp().expires_never();  // the call has its own deadline (--http-request-timeout-s)
    state_->Begin();
    asio::post(state_->workers, [self = this->shared_from_this(), request = std::move(request)] {
      HttpReply reply = self->state_->handler(request);
      asio::post(self->stream_.get_executor(), [self, reply = std::move(reply)]() mutable {
        self->Reply(std::move(reply), !self->keep_alive_, /*counted=*/true);
      });
    });
  }

  void Refuse(int status, const std::string& why) {
    Reply(state_->refused(status, why), /*close=*/true);
  }

  // `counted`: the reply of a request counted in State::in_flight.
  void Reply(HttpReply reply, bool close, bool counted = false) {
    auto response = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(reply.status), version_);
    response->set(bhttp::field::content_type, reply.content_type);
    for (const auto& [name, value] : reply.headers) response->set(name, value);
    response->body() = std::move(reply.body);
    response->keep_alive(!close);
    response->prepare_payload();
    Tcp().expires_after(Millis(state_->options.body_timeout_s));
    bhttp::async_write(stream_, *response,
                       [self = this->shared_from_this(), response, close, counted](
                           beast::error_code error, size_t) {
                         if (counted) self->state_->End();
                         if (error || close) return self->Close();
                         self->ReadHead();
                       });
  }

  void Close() {
    if constexpr (kTls) {
      Tcp().expires_after(kCloseGrace);
      stream_.async_shutdown(
          [self = this->shared_from_this()](beast::error_code) { self->Tcp().close(); });
    } else {
      // Half-close, then read what the client still sends for a moment before closing: closing
      // with unread bytes (an over-long body) resets the connection, and the client may lose
      // the reply it has not read yet.
      beast::error_code ignored;
      Tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Tcp().expires_after(kCloseGrace);
      Drain();
    }
  }

  void Drain() {
    Tcp().async_read_some(asio::buffer(drain_),
                          [self = this->shared_from_this()](beast::error_code error, size_t) {
                            if (error) return self->Tcp().close();
                            self->Drain();
                          });
  }

  std::shared_ptr<HttpServer::State> state_;
  uint64_t id_ = 0;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  asio::steady_timer head_timer_;
  bool head_timed_out_ = false;
  bool reading_head_ = false;
  bool body_timed_out_ = false;
  bool reading_body_ = false;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  char drain_[16 * 1024];
};

void Accept(const std::shared_ptr<HttpServer::State>& state) {
  state->acceptor.async_accept(
      asio::make_strand(state->io), [state](beast::error_code error, tcp::socket socket) {
        if (!state->acceptor.is_open()) return;  // stopping
        if (!error) {
          if (state->connections.load() >= state->options.max_connections) {
            Log(LogLevel::kDebug,
                "http: %d connections open (--http-max-connections); closing "
                "a new one",
                state->connections.load());
            beast::error_code ignored;
            socket.close(ignored);
          } else {
            ++state->connections;
            beast::tcp_stream stream(std::move(socket));
            if (state->tls.has_value()) {
              std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
                  state, beast::ssl_stream<beast::tcp_stream>(std::move(stream), *state->tls))
                  ->Start();
            } else {
              std::make_shared<Session<beast::tcp_stream>>(state, std::move(stream))->Start();
            }
          }
        }
        Accept(state);
      });
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, Handler handler, TooLarge too_large,
                       Refused refused)
    : state_(std::make_shared<State>(options.threads)) {
  state_->options = std::move(options);
  state_->handler = std::move(handler);
  state_->too_large = std::move(too_large);
  state_->refused = std::move(refused);
}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<int> HttpServer::Start() {
  const HttpServerOptions& options = state_->options;
  const std::string where = absl::StrCat(options.host, ":", options.port);
  try {
    if (!options.tls_cert.empty()) {
      // The same PEM files as gRPC's; TLS 1.2 at least.
      state_->tls.emplace(asio::ssl::context::tls_server);
      state_->tls->set_options(asio::ssl::context::default_workarounds |
                               asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                               asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      state_->tls->use_certificate_chain_file(options.tls_cert);
      state_->tls->use_private_key_file(options.tls_key, asio::ssl::context::pem);
    }
    tcp::resolver resolver(state_->io);
    const tcp::endpoint endpoint =
        resolver.resolve(options.host, std::to_string(options.port))->endpoint();
    state_->acceptor.open(endpoint.protocol());
    state_->acceptor.set_option(asio::socket_base::reuse_address(true));
    state_->acceptor.bind(endpoint);
    state_->acceptor.listen(asio::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on ", where, ": ", e.what(),
        options.tls_cert.empty() ? "" : " (or --tls-cert/--tls-key are not a PEM pair)"));
  }
  const int port = state_->acceptor.local_endpoint().port();
  Accept(state_);
  state_->work.emplace(state_->io.get_executor());
  for (int i = 0; i < kIoThreads; ++i) {
    state_->io_threads.emplace_back([state = state_] { state->io.run(); });
  }
  return port;
}

void HttpServer::Stop() {
  if (state_->io_threads.empty()) return;
  asio::post(state_->acceptor.get_executor(), [state = state_] {
    beast::error_code ignored;
    state->acceptor.close(ignored);
  });
  {
    // Each worker finishes the call it serves (bounded by the calls' deadline), and its reply
    // is written.
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->idle.wait(lock, [this] { return state_->in_flight == 0; });
  }
  // Close the idle connections, then let io.run() end once their handlers are done, so that none
  // is left holding State (a handler left in a stopped io_context would keep it alive forever).
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard<std::mutex> lock(state_->sessions_mutex);
    for (const auto& [id, close] : state_->session_closers) closers.push_back(close);
  }
  for (const std::function<void()>& close : closers) close();
  state_->work.reset();
  for (int i = 0; i < 100 && !state_->io.stopped(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  state_->io.stop();  // a no-op if it ran out of work; else the last resort
  for (std::thread& thread : state_->io_threads) thread.join();
  state_->io_threads.clear();
  state_->workers.join();
}

}  // namespace attn::server::http
