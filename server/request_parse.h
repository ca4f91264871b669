// Request bytes -> protobuf message, with a reason the client can act on when they do not parse.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/message.h"

namespace attn::server {

// Why `size` bytes from `input` are not a valid `type` message, as INVALID_ARGUMENT naming the
// field path and the problem ("inputs[1].text is not valid UTF-8 ..." or "malformed protobuf at
// byte 12: ..."); OK if no problem is found. Called after protobuf refused a request (it says
// only that it failed), so the client learns what to fix instead of getting a bare error.
absl::Status DescribeUnparsableMessage(const google::protobuf::Descriptor& type,
                                       google::protobuf::io::ZeroCopyInputStream* input,
                                       int64_t size);

// Parses a request's bytes into `message`; INVALID_ARGUMENT naming the problem if they do not
// parse (services take raw bytes so that a request gRPC cannot decode gets this, not gRPC's bare
// UNIMPLEMENTED).
absl::Status ParseRequestBytes(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);

}  // namespace attn::server
