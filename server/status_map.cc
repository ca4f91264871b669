#include "server/status_map.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/cost_model.h"
#include "server/core/input_errors.h"

namespace attn::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering (google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

HttpStatus ToHttpStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return {200, ""};
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return {400, "invalid_request_error"};
    // RFC 6750 and OpenAI answer a missing and a wrong bearer token alike with 401; the only
    // PERMISSION_DENIED this server gives is a wrong token.
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return {401, "authentication_error"};
    case absl::StatusCode::kNotFound:
      return {404, "not_found_error"};
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return {409, "conflict_error"};
    // A call over a per-call limit (IsTooLarge) cannot succeed by retrying: 413. Overload
    // (queue full, memory budget in use): retry later, 429.
    case absl::StatusCode::kResourceExhausted:
      if (IsTooLarge(status)) return {413, "invalid_request_error"};
      return {429, "rate_limit_error"};
    case absl::StatusCode::kCancelled:
      return {499, "cancelled"};  // nginx's "client closed request": nobody reads it
    case absl::StatusCode::kUnimplemented:
      return {501, "not_implemented_error"};
    case absl::StatusCode::kUnavailable:
      return {503, "service_unavailable_error"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "timeout_error"};
    default:  // kInternal, kUnknown, kDataLoss
      return {500, "server_error"};
  }
}

namespace {
// `status` with another message, its payloads (what kind of error it is) kept.
absl::Status Reworded(const absl::Status& status, const std::string& message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}
}  // namespace

EmbeddingsError ToEmbeddingsError(const absl::Status& status, bool single_input) {
  EmbeddingsError out{status, "", ""};
  const std::optional<core::InputError> input = core::GetInputError(status);
  const auto name = [single_input](int index) {
    return single_input ? std::string("input") : absl::StrCat("input[", index, "]");
  };
  if (input.has_value() && input->kind == core::InputError::Kind::kTooLong) {
    out.status = Reworded(
        status,
        absl::StrCat(name(input->index), " has ", input->tokens_at_least ? "at least " : "",
                     input->tokens, " tokens, more than this model's limit of ", input->limit,
                     " tokens; send \"truncate\": true to embed its first ", input->limit,
                     " tokens (with \"truncation_direction\": \"left\", its last), "
                     "\"long_text\": \"chunk\" to embed all of it in overlapping windows, or "
                     "shorten it"));
    out.param = "input";
    out.code = "context_length_exceeded";
    return out;
  }
  if (input.has_value() && input->kind == core::InputError::Kind::kForeignTokenIds) {
    out.status = Reworded(
        status,
        absl::StrCat(name(input->index),
                     " holds token ids that are not this model's tokenizer output: an array of "
                     "token ids must start with ",
                     input->cls_token, " (id ", input->cls_id, ") and end with ", input->sep_token,
                     " (id ", input->sep_id,
                     "), as POST /v1/tokenize returns it; ids of another tokenizer (tiktoken's "
                     "cl100k_base, say) would embed as unrelated words. LangChain's "
                     "OpenAIEmbeddings sends tiktoken ids unless it is created with "
                     "check_embedding_ctx_length=False, which sends the texts"));
    out.param = "input";
    out.code = "invalid_token_ids";
    return out;
  }
  // The core names the field first ("dimensions: ...", "inputs[3]: ...").
  absl::string_view message = status.message();
  if (absl::StartsWith(message, "inputs")) {
    message.remove_prefix(6);
    out.status = Reworded(status, single_input && absl::StartsWith(message, "[0]")
                                      ? "input" + std::string(message.substr(3))
                                      : "input" + std::string(message));
  }
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    out.param = absl::StartsWith(status.message(), "dimensions")      ? "dimensions"
                : absl::StartsWith(status.message(), "chunk_overlap") ? "chunk_overlap"
                                                                      : "input";
  }
  return out;
}

std::string_view GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN";
  }
}

}  // namespace attn::server
