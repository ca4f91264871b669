// The one place where engine/internal statuses become transport statuses: gRPC codes, and HTTP
// statuses with OpenAI's error type for the HTTP front end (server/http/).
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace attn::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...: the label used in metrics.
std::string_view GrpcCodeName(grpc::StatusCode code);

// How a status travels over HTTP: the status code and the OpenAI error `type`
// ({"error": {"message", "type", "param", "code"}}).
struct HttpStatus {
  int code = 200;
  std::string_view type;  // "invalid_request_error", "authentication_error", ...
};
HttpStatus ToHttpStatus(const absl::Status& status);
// The Open Inference Protocol (server/oip/) uses the same two: gRPC codes from ToGrpcStatus, and
// REST statuses from ToHttpStatus with the protocol's {"error": "<message>"} body instead of
// OpenAI's (oip::OipErrorReply).

// An error of POST /v1/embeddings said in its clients' vocabulary (OpenAI's API, LangChain): the
// core's inputs[i] named input[i] (`input` when the request sent one), an over-long input as 400
// context_length_exceeded with the route's ways out ("truncate", "long_text"), token ids of
// another tokenizer as 400 invalid_token_ids naming LangChain's check_embedding_ctx_length;
// `param` and `code` for OpenAI's error object ("" = null). The HTTP status is ToHttpStatus's.
struct EmbeddingsError {
  absl::Status status;
  std::string param;
  std::string code;
};
EmbeddingsError ToEmbeddingsError(const absl::Status& status, bool single_input);

}  // namespace attn::server
