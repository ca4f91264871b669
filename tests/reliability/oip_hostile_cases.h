// The Open Inference Protocol's hostile catalogue (oip_hostile_test.cc): the case type, the
// request builders and senders the case tables share, and the case groups defined in
// oip_hostile_cases.cc (datatypes and shapes, raw contents, huge inputs).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"

namespace attn::integration::oip_hostile {

inline constexpr int kMaxMessageBytes = 4 << 20;  // a 3 MB BYTES element fits, a 5 MB one not
inline constexpr char kModel[] = "all-MiniLM-L6-v2";

using Request = inference::ModelInferRequest;

struct Answer {
  int code = -1;  // the gRPC code or the HTTP status
  std::string message;
};

struct OipCase {
  std::string name;  // [A-Za-z0-9_], the gtest parameter name
  std::string what;  // one line: what is sent
  std::function<Answer()> send;
  int code;                        // the gRPC code (grpc::StatusCode) or HTTP status it must get
  std::vector<std::string> parts;  // words the message must contain
  std::string sent;                // a long piece of the input the message must not repeat
};

inline std::ostream& operator<<(std::ostream& out, const OipCase& c) { return out << c.name; }

inline constexpr int kInvalid = static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT);
inline constexpr int kNotFound = static_cast<int>(grpc::StatusCode::NOT_FOUND);
inline constexpr int kExhausted = static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED);

std::string LittleEndian32(uint32_t value);
// One element of Triton's raw BYTES: its length (4 bytes, little-endian), then its bytes.
std::string BytesElement(const std::string& text);
Request TextRequest(const std::vector<std::string>& texts);
Request IdsRequest(std::vector<int64_t> shape, std::vector<int64_t> ids);
// ModelInfer over gRPC, and a REST call, to the shared server.
Answer Grpc(const Request& request);
Answer Rest(const std::string& method, const std::string& path, const std::string& body,
            std::vector<std::string> headers = {});
// The request with `mutate` applied (copies: each case builds its own).
std::function<Answer()> Infer(Request request, std::function<void(Request*)> mutate = nullptr);
void SetParameter(google::protobuf::Map<std::string, inference::InferParameter>* map,
                  const std::string& name, const std::string& value);

std::vector<OipCase> DatatypeAndShapeCases();
std::vector<OipCase> RawContentCases();
std::vector<OipCase> HugeCases();

}  // namespace attn::integration::oip_hostile
