// The gRPC plumbing of methods served from raw bytes, in one place. The services register their
// methods through these handlers instead of the generated typed ones, so that a request gRPC
// cannot decode (invalid UTF-8 in a string, malformed bytes) gets INVALID_ARGUMENT naming the
// field and the problem, not gRPC's bare UNIMPLEMENTED, and is counted in the metrics.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/core/calls.h"
#include "server/metrics.h"

namespace attn::server {

// One unary call's bookkeeping: finishes it once (with the response bytes when it succeeded),
// mapping the status in the one place (status_map.h), and records it in the metrics.
class UnaryCall {
 public:
  UnaryCall(const char* method, Metrics* metrics, grpc::CallbackServerContext* context);

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  std::chrono::steady_clock::time_point received() const { return received_; }
  // The serving core's view of the call: when it arrived, its deadline, whether the client
  // gave up.
  core::CallControl Control() const;
  // Keeps `resource` (the call's memory admission) until the response bytes are written.
  void Hold(std::shared_ptr<void> resource) { held_ = std::move(resource); }

  // Finishes the call with an error, or OK without a body. Call one Finish exactly once.
  grpc::ServerUnaryReactor* Finish(const absl::Status& status);
  // OK: serializes `response` into the call's response bytes first.
  grpc::ServerUnaryReactor* Finish(const absl::Status& status,
                                   const google::protobuf::Message& response);

 private:
  friend class RawMethods;
  // A refusal before the method's handler ran (see RawMethods::Unary's `answer_dropped`).
  grpc::ServerUnaryReactor* FinishEarly(const absl::Status& status);
  grpc::ServerUnaryReactor* FinishGrpc(const grpc::Status& status);

  const char* method_;
  Metrics* metrics_;
  grpc::CallbackServerContext* context_;
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* response_bytes_ = nullptr;
  bool answer_dropped_ = false;
  std::shared_ptr<void> held_;
  std::chrono::steady_clock::time_point received_ = std::chrono::steady_clock::now();
};

// Index of `method` in the service `service` of `file` (the generated services register their
// methods in the .proto's order).
int MethodIndex(const google::protobuf::FileDescriptor& file, const char* service,
                const char* method);

// Handlers for MarkMethodRawCallback (a protected member of every generated service).
class RawMethods {
 public:
  // Runs before parsing (authorization: a caller without the token learns nothing about its
  // bytes); not OK finishes the call with that status.
  using Precheck = std::function<absl::Status(const grpc::CallbackServerContext& context)>;

  // A unary method: checks the request size against `max_message_bytes`, runs `precheck` (may
  // be empty), parses a `Request` and calls `handle`, which must finish the call. With
  // `answer_dropped`, a call refused before `handle` whose client gave up is answered
  // DEADLINE_EXCEEDED or CANCELLED and counted as dropped (core::UnlessDropped).
  template <typename Request>
  static grpc::internal::MethodHandler* Unary(
      const char* method, Metrics* metrics, int64_t max_message_bytes, Precheck precheck,
      std::function<void(std::shared_ptr<UnaryCall>, grpc::CallbackServerContext*, Request)> handle,
      bool answer_dropped = false) {
    return UnaryBytes(method, metrics, max_message_bytes, std::move(precheck), answer_dropped,
                      [handle = std::move(handle)](std::shared_ptr<UnaryCall> call,
                                                   grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer& bytes) {
                        Request request;
                        if (absl::Status parsed = ParseOrLog(call->method_, bytes, &request);
                            !parsed.ok()) {
                          call->FinishEarly(parsed);
                          return;
                        }
                        handle(std::move(call), context, std::move(request));
                      });
  }

  // A bidirectional stream of raw bytes; `open` makes the reactor of each call.
  using BidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;
  static grpc::internal::MethodHandler* Bidi(
      std::function<BidiReactor*(grpc::CallbackServerContext*)> open);
  // A server-streaming method: `open` gets the request's raw bytes and makes the call's reactor.
  using WriteReactor = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  static grpc::internal::MethodHandler* ServerStream(
      std::function<WriteReactor*(grpc::CallbackServerContext*, const grpc::ByteBuffer*)> open);

 private:
  using BytesHandler = std::function<void(std::shared_ptr<UnaryCall>, grpc::CallbackServerContext*,
                                          const grpc::ByteBuffer&)>;
  static grpc::internal::MethodHandler* UnaryBytes(const char* method, Metrics* metrics,
                                                   int64_t max_message_bytes, Precheck precheck,
                                                   bool answer_dropped, BytesHandler handle);
  static absl::Status ParseOrLog(const char* method, const grpc::ByteBuffer& bytes,
                                 google::protobuf::Message* message);
};

// RESOURCE_EXHAUSTED naming the flag when a request or response is over --max-message-bytes
// (gRPC's own check says only that the size was exceeded).
absl::Status CheckRequestSize(int64_t bytes, int64_t limit);
absl::Status CheckResponseSize(const google::protobuf::Message& response, int64_t limit);

}  // namespace attn::server
