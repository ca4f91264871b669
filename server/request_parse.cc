#include "server/request_parse.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/wire_format_lite.h"

namespace attn::server {

namespace {

// Offset of the first byte of `text` that is not part of well-formed UTF-8 (no overlong forms,
// no surrogates, nothing above U+10FFFF: what protobuf accepts in proto3 strings), or npos.
size_t FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;   // overlong
      if (b == 0xED) high = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;   // overlong
      if (b == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + length > n || s[i + 1] < low || s[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

// Protobuf's default recursion limit: deeper nesting does not parse.
constexpr int kMaxNesting = 100;

// Walks the fields of one `type` message up to the stream's current limit, checking what the
// protobuf parser checks: well-formed tags, lengths and values, UTF-8 in proto3 string fields,
// nesting depth. `path` names the message ("" at the top, "inputs[0]", ...).
absl::Status WalkMessage(const google::protobuf::Descriptor& type,
                         google::protobuf::io::CodedInputStream* in, const std::string& path,
                         int depth) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::internal::WireFormatLite;
  auto malformed = [&path](int offset, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed protobuf at byte ", offset,
                     path.empty() ? "" : absl::StrCat(" (in ", path, ")"), ": ", why));
  };
  std::vector<int> occurrences(type.field_count(), 0);  // index of the next repeated element
  while (true) {
    const int offset = in->CurrentPosition();
    if (in->BytesUntilLimit() == 0) return absl::OkStatus();
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return malformed(offset, "a field tag that is zero, truncated or over-long");
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const int wire_type = WireFormatLite::GetTagWireType(tag);
    if (wire_type > WireFormatLite::WIRETYPE_FIXED32) {
      return malformed(offset, absl::StrCat("field ", number, " has wire type ", wire_type,
                                            ", which does not exist"));
    }
    if (wire_type == WireFormatLite::WIRETYPE_END_GROUP) {
      return malformed(
          offset, absl::StrCat("an end-group tag (field ", number, ") without a matching start"));
    }
    const FieldDescriptor* field = type.FindFieldByNumber(number);
    const bool checked = field != nullptr &&
                         wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
                         (field->type() == FieldDescriptor::TYPE_STRING ||
                          field->type() == FieldDescriptor::TYPE_MESSAGE);
    if (!checked) {
      // Unknown fields, scalars and bytes: only their framing can be wrong. Unknown groups nest,
      // and SkipField stops at the same recursion limit as the parser.
      if (!WireFormatLite::SkipField(in, tag)) {
        return malformed(
            offset, absl::StrCat(field != nullptr ? field->name() : absl::StrCat("field ", number),
                                 ": a truncated or malformed value, or groups "
                                 "nested more than ",
                                 kMaxNesting, " deep"));
      }
      continue;
    }
    std::string where = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->is_repeated()) absl::StrAppend(&where, "[", occurrences[field->index()]++, "]");
    uint32_t length = 0;
    if (!in->ReadVarint32(&length)) return malformed(offset, where + ": a malformed length");
    if (static_cast<int64_t>(length) > in->BytesUntilLimit()) {
      return malformed(offset, absl::StrCat(where, ": a length of ", length, " bytes, but only ",
                                            in->BytesUntilLimit(), " follow"));
    }
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!in->ReadString(&value, static_cast<int>(length))) {
        return malformed(offset, where + ": a truncated string");
      }
      const size_t bad = FirstInvalidUtf8(value);
      if (field->file()->syntax() == google::protobuf::FileDescriptor::SYNTAX_PROTO3 &&
          bad != std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s is not valid UTF-8 (byte 0x%02X at offset %d of the string); string fields "
            "carry UTF-8 text",
            where, static_cast<unsigned char>(value[bad]), bad));
      }
      continue;
    }
    if (depth + 1 >= kMaxNesting) {
      return malformed(offset, where + ": messages nested more than 100 deep");
    }
    const auto limit = in->PushLimit(static_cast<int>(length));
    if (absl::Status status = WalkMessage(*field->message_type(), in, where, depth + 1);
        !status.ok()) {
      return status;
    }
    in->PopLimit(limit);
  }
}

}  // namespace

absl::Status DescribeUnparsableMessage(const google::protobuf::Descriptor& type,
                                       google::protobuf::io::ZeroCopyInputStream* input,
                                       int64_t size) {
  google::protobuf::io::CodedInputStream in(input);
  in.SetRecursionLimit(kMaxNesting);
  if (size > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat("the message is ", size, " bytes long"));
  in.PushLimit(static_cast<int>(size));
  absl::Status status = WalkMessage(type, &in, "", 0);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", type.full_name(), ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status ParseRequestBytes(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  grpc::ByteBuffer parse_bytes(bytes);  // a reader consumes its buffer; copies share the slices
  grpc::ProtoBufferReader reader(&parse_bytes);
  bool parsed;
  {
    // The client gets the reason; protobuf's own log line per bad request would only let a
    // client fill the server log.
    google::protobuf::LogSilencer quiet;
    parsed = message->ParseFromZeroCopyStream(&reader);
  }
  if (parsed) return absl::OkStatus();
  const google::protobuf::Descriptor& type = *message->GetDescriptor();
  grpc::ByteBuffer diagnose_bytes(bytes);
  grpc::ProtoBufferReader diagnose(&diagnose_bytes);
  absl::Status problem = DescribeUnparsableMessage(type, &diagnose, bytes.Length());
  if (!problem.ok()) return problem;
  return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ", type.full_name(),
                                                 " (protobuf could not parse its ", bytes.Length(),
                                                 " bytes)"));
}

}  // namespace attn::server
