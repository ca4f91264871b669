#include "tests/reliability/reliability_util.h"

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "grpc/health/v1/health.grpc.pb.h"

namespace attn::reliability {

using integration::StatusString;

std::string HealthOf(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + testing::ScaledSeconds(10));
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return "RPC error " + StatusString(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

bool ExpectHealthy(ServerProcess& server, const std::string& after) {
  if (!server.process().Running()) {
    ADD_FAILURE() << "attnserve is not running after " << after << ": "
                  << server.process().ExitDescription() << "\n--- log ---\n"
                  << server.process().LogTail();
    return false;
  }
  bool healthy = true;
  const std::shared_ptr<grpc::Channel> channel = server.NewChannel();
  for (const std::string service : {"", "attnserve.v1.Encoder"}) {
    const std::string health = HealthOf(channel, service);
    if (health != "SERVING") {
      ADD_FAILURE() << "health of '" << service << "' after " << after << ": " << health;
      healthy = false;
    }
  }
  auto stub = pb::Encoder::NewStub(channel);
  pb::EncodeRequest request;
  request.add_inputs()->set_text("still serving after a hostile request");
  pb::EncodeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + testing::ScaledSeconds(60));
  const grpc::Status status = stub->Encode(&context, request, &response);
  if (!status.ok() || response.results_size() != 1 || response.results(0).embedding_size() == 0) {
    ADD_FAILURE() << "Encode after " << after << ": " << StatusString(status);
    healthy = false;
  }
  return healthy;
}

void ExpectStatus(const grpc::Status& status, grpc::StatusCode code,
                  const std::vector<std::string>& parts, const std::string& what) {
  EXPECT_EQ(status.error_code(), code)
      << what << ": expected " << integration::CodeName(code) << ", got " << StatusString(status);
  for (const std::string& part : parts) {
    EXPECT_NE(status.error_message().find(part), std::string::npos)
        << what << ": the message should mention '" << part << "': " << StatusString(status);
  }
}

namespace {

void AddMetadata(grpc::ClientContext* context,
                 const std::vector<std::pair<std::string, std::string>>& metadata) {
  for (const auto& [key, value] : metadata) context->AddMetadata(key, value);
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

}  // namespace

grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& request_bytes, std::string* response_bytes,
                          const std::vector<std::pair<std::string, std::string>>& metadata,
                          std::chrono::seconds timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  AddMetadata(&context, metadata);
  const grpc::ByteBuffer request = ToByteBuffer(request_bytes);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  const grpc::Status status = done.get_future().get();
  if (response_bytes != nullptr) *response_bytes = status.ok() ? FromByteBuffer(response) : "";
  return status;
}

grpc::Status RawBidiCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                         const std::vector<std::string>& messages,
                         std::vector<std::string>* responses,
                         const std::vector<std::pair<std::string, std::string>>& metadata,
                         std::chrono::seconds timeout) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  AddMetadata(&context, metadata);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &queue);
  // One operation at a time: start it, then wait for its tag.
  auto wait = [&queue](void* expected) {
    void* tag = nullptr;
    bool ok = false;
    while (queue.Next(&tag, &ok)) {
      if (tag == expected) return ok;
    }
    return false;
  };
  int tag = 0;
  call->StartCall(&tag);
  bool open = wait(&tag);
  for (const std::string& message : messages) {
    if (!open) break;
    call->Write(ToByteBuffer(message), &tag);
    open = wait(&tag);
  }
  if (open) {
    call->WritesDone(&tag);
    wait(&tag);
  }
  while (true) {
    grpc::ByteBuffer buffer;
    call->Read(&buffer, &tag);
    if (!wait(&tag)) break;
    if (responses != nullptr) responses->push_back(FromByteBuffer(buffer));
  }
  grpc::Status status;
  call->Finish(&status, &tag);
  wait(&tag);
  queue.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (queue.Next(&ignored_tag, &ignored_ok)) {
  }
  return status;
}

namespace wire {

std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

std::string Tag(int field, int wire_type) {
  return Varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

std::string Field(int field, std::string_view payload) {
  return Tag(field, kLengthDelimited) + Varint(payload.size()) + std::string(payload);
}

std::string VarintField(int field, uint64_t value) { return Tag(field, kVarint) + Varint(value); }

}  // namespace wire

std::vector<std::string> CrashLines(const std::string& log) {
  // What a crashing or sanitized process prints: sanitizer reports, UBSan's "runtime error",
  // libstdc++'s std::terminate, failed assertions (assert, GPR_ASSERT, absl/protobuf CHECK) and
  // fatal logs; "crash" also catches a crash handler's banner.
  static const char* const kMarkers[] = {"Sanitizer",
                                         "runtime error:",
                                         "terminate called",
                                         "std::terminate",
                                         "Assertion",
                                         "assertion failed",
                                         "Check failed",
                                         "CHECK failed",
                                         "FATAL",
                                         "Segmentation fault",
                                         "SIGSEGV",
                                         "SIGABRT",
                                         "SIGBUS",
                                         "core dumped",
                                         "abort()",
                                         "Aborted",
                                         "stack trace",
                                         "crash"};
  // The server's own report of a previous run's crash (stale checkpoint temp dirs) is not one.
  static const char* const kBenign[] = {"left by a crash"};
  std::vector<std::string> found;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (std::any_of(std::begin(kBenign), std::end(kBenign), [&line](const char* benign) {
          return line.find(benign) != std::string::npos;
        })) {
      continue;
    }
    for (const char* marker : kMarkers) {
      if (line.find(marker) != std::string::npos) {
        found.push_back(line);
        break;
      }
    }
  }
  return found;
}

std::string FullLog(ServerProcess& server) {
  return server.process().LogTail(std::numeric_limits<size_t>::max());
}

TempDir::TempDir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                        "/attnserve-rel-" + name + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) != nullptr) path_ = buffer.data();
}

TempDir::~TempDir() {
  if (!path_.empty() && std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
}

std::string TempDir::WriteFile(const std::string& name, const std::string& contents) const {
  const std::string path = path_ + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return path;
}

int64_t PeakRssBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

double RequestCount(const ServerProcess& server, const std::string& method,
                    const std::string& code) {
  return integration::ScrapeOrFail(server).Sum("attnserve_requests_total",
                                               {{"method", method}, {"code", code}});
}

}  // namespace attn::reliability
