// Helpers shared by the reliability tests (hostile input, overload, security): health checks,
// raw-bytes calls through grpc::GenericStub, a protobuf wire-format writer for hand-made (and
// deliberately broken) messages, and a scan of the server log for signs of a crash.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tests/integration/harness.h"

namespace attn::reliability {

namespace pb = ::attnserve::v1;
using integration::ServerProcess;

// grpc.health.v1.Health/Check for `service`; "SERVING", "NOT_SERVING", ... or the RPC error.
std::string HealthOf(const std::shared_ptr<grpc::Channel>& channel, const std::string& service);

// The server process is alive, health says SERVING for "" and attnserve.v1.Encoder, and a real
// Encode answers OK. Adds gtest failures naming `after` otherwise; returns whether all held.
bool ExpectHealthy(ServerProcess& server, const std::string& after);

// Asserts the code and that the message contains every one of `parts`.
void ExpectStatus(const grpc::Status& status, grpc::StatusCode code,
                  const std::vector<std::string>& parts, const std::string& what);

// A unary call with hand-made request bytes, e.g. method "/attnserve.v1.Encoder/Encode".
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& request_bytes, std::string* response_bytes,
                          const std::vector<std::pair<std::string, std::string>>& metadata = {},
                          std::chrono::seconds timeout = std::chrono::seconds(60));

// A bidirectional-streaming call that writes `messages` (raw bytes each), half-closes, reads
// every answer into `responses` and returns the final status.
grpc::Status RawBidiCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                         const std::vector<std::string>& messages,
                         std::vector<std::string>* responses,
                         const std::vector<std::pair<std::string, std::string>>& metadata = {},
                         std::chrono::seconds timeout = std::chrono::seconds(120));

// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/), written by hand so a
// test can send what no generated serializer would.
namespace wire {
constexpr int kVarint = 0;
constexpr int kLengthDelimited = 2;
constexpr int kStartGroup = 3;
constexpr int kEndGroup = 4;
std::string Varint(uint64_t value);
std::string Tag(int field, int wire_type);
// A length-delimited field: tag, length, payload (a string, bytes or an embedded message).
std::string Field(int field, std::string_view payload);
std::string VarintField(int field, uint64_t value);
}  // namespace wire

// Lines of `log` that show a crash, a sanitizer report, an assertion or a fatal log
// (empty if none).
std::vector<std::string> CrashLines(const std::string& log);

// Peak resident set of process `pid` so far (VmHWM), in bytes; -1 if unreadable.
int64_t PeakRssBytes(pid_t pid);

// The whole log of a server process (not only the tail).
std::string FullLog(ServerProcess& server);

// A temp directory removed at destruction (unless ATTN_KEEP_TEST_DIRS is set).
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `contents` to path()/name and returns the full path.
  std::string WriteFile(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// Sum of attnserve_requests_total for `method` and the gRPC code name `code`.
double RequestCount(const ServerProcess& server, const std::string& method,
                    const std::string& code);

}  // namespace attn::reliability
