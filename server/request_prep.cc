#include "server/request_prep.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/wire_format_lite.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::StatusOr<WireDType> ResolveDType(int dtype, const char* field) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return WireDType::kFloat32;
    case v1::FLOAT16:
      return WireDType::kFloat16;
    case v1::BFLOAT16:
      return WireDType::kBFloat16;
    default:
      return Invalid(
          absl::StrCat(field, ": unknown dtype ", dtype, "; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
}

// Resolves layer indices (negatives count from the end) and rejects out-of-range or repeated
// ones. Valid range is [0, count); `what` names the field.
absl::StatusOr<std::vector<int>> ResolveIndices(const google::protobuf::RepeatedField<int32_t>& raw,
                                                int count, const std::string& what,
                                                const std::string& meaning) {
  std::vector<int> resolved;
  std::set<int> seen;
  for (int i = 0; i < raw.size(); ++i) {
    const int index = raw[i] < 0 ? raw[i] + count : raw[i];
    if (index < 0 || index >= count) {
      return Invalid(absl::StrCat(what, "[", i, "] = ", raw[i], " is outside [", -count, ", ",
                                  count - 1, "]", meaning));
    }
    if (!seen.insert(index).second) {
      return Invalid(absl::StrCat(what, "[", i, "] = ", raw[i], " repeats layer ", index));
    }
    resolved.push_back(index);
  }
  return resolved;
}

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
    return Invalid(absl::StrCat("malformed protobuf at byte ", offset,
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
        return Invalid(absl::StrFormat(
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
  if (size > INT32_MAX) return Invalid(absl::StrCat("the message is ", size, " bytes long"));
  in.PushLimit(static_cast<int>(size));
  absl::Status status = WalkMessage(type, &in, "", 0);
  if (!status.ok()) {
    return Invalid(
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
  return Invalid(absl::StrCat("the request is not a valid ", type.full_name(),
                              " (protobuf could not parse its ", bytes.Length(), " bytes)"));
}

absl::StatusOr<TruncationOptions> ResolveTruncation(const Model& model,
                                                    const v1::TokenizationOptions& options) {
  if (!v1::Truncation_IsValid(options.truncation())) {
    return Invalid(absl::StrCat("tokenization.truncation: unknown value ", options.truncation(),
                                "; use TRUNCATION_RIGHT, TRUNCATION_LEFT or TRUNCATION_NONE"));
  }
  TruncationOptions truncation;
  truncation.enabled = options.truncation() != v1::TRUNCATION_NONE;
  truncation.side =
      options.truncation() == v1::TRUNCATION_LEFT ? TruncationSide::kLeft : TruncationSide::kRight;
  if (options.max_length() < 0) {
    return Invalid(absl::StrCat("tokenization.max_length is ", options.max_length(),
                                "; use 0 for the model default (", model.default_max_length(),
                                ") or a positive length"));
  }
  if (options.max_length() > model.max_positions()) {
    return Invalid(absl::StrCat("tokenization.max_length ", options.max_length(),
                                " is more than the model's ", model.max_positions(), " positions"));
  }
  truncation.max_length =
      options.max_length() == 0 ? model.default_max_length() : options.max_length();
  return truncation;
}

absl::StatusOr<TokenizedInputs> TokenizeInputs(
    const Model& model, const google::protobuf::RepeatedPtrField<v1::Input>& inputs,
    const v1::TokenizationOptions& tokenization, const RequestLimits& limits) {
  if (inputs.empty()) {
    return Invalid(absl::StrCat("the request has no inputs; send 1 to ",
                                limits.max_inputs_per_request, " inputs"));
  }
  if (inputs.size() > limits.max_inputs_per_request) {
    return Invalid(absl::StrCat("the request has ", inputs.size(),
                                " inputs, more than the limit of ", limits.max_inputs_per_request,
                                " (--max-inputs-per-request); split it into several calls"));
  }
  absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(model, tokenization);
  if (!truncation.ok()) return truncation.status();
  const int limit = truncation->max_length;

  TokenizedInputs out;
  out.sequences.reserve(inputs.size());
  out.encodings.reserve(inputs.size());
  for (int i = 0; i < inputs.size(); ++i) {
    const v1::Input& input = inputs[i];
    const std::string where = absl::StrCat("inputs[", i, "]");
    absl::StatusOr<Encoding> encoding;
    switch (input.kind_case()) {
      case v1::Input::kText:
        if (input.text().empty()) return Invalid(where + ": text is empty");
        encoding = model.tokenizer().Encode(input.text(), *truncation);
        break;
      case v1::Input::kPair:
        if (input.pair().first().empty()) return Invalid(where + ": pair.first is empty");
        if (input.pair().second().empty()) return Invalid(where + ": pair.second is empty");
        encoding =
            model.tokenizer().EncodePair(input.pair().first(), input.pair().second(), *truncation);
        break;
      case v1::Input::kTokens: {
        const v1::TokenIds& tokens = input.tokens();
        if (tokens.ids().empty()) return Invalid(where + ": tokens.ids is empty");
        if (tokens.ids().size() > model.max_positions()) {
          return Invalid(absl::StrCat(where, ": ", tokens.ids().size(),
                                      " token ids, more than the model's ", model.max_positions(),
                                      " positions"));
        }
        if (!tokens.type_ids().empty() && tokens.type_ids().size() != tokens.ids().size()) {
          return Invalid(absl::StrCat(where, ": ", tokens.type_ids().size(), " type_ids for ",
                                      tokens.ids().size(), " ids; send none or one per id"));
        }
        encoding = model.tokenizer().FromIds(
            std::vector<int32_t>(tokens.ids().begin(), tokens.ids().end()),
            std::vector<int32_t>(tokens.type_ids().begin(), tokens.type_ids().end()));
        break;
      }
      case v1::Input::KIND_NOT_SET:
        return Invalid(where + ": empty input; set text, pair or tokens");
    }
    if (!encoding.ok()) {
      return absl::Status(encoding.status().code(),
                          absl::StrCat(where, ": ", encoding.status().message()));
    }
    if (input.kind_case() != v1::Input::kTokens && !truncation->enabled &&
        encoding->size() > limit) {
      return Invalid(absl::StrCat(where, ": ",
                                  input.kind_case() == v1::Input::kPair ? "pair" : "text", " has ",
                                  encoding->size(), " tokens, more than max_length ", limit,
                                  " and truncation is TRUNCATION_NONE; shorten it, raise "
                                  "tokenization.max_length (up to ",
                                  model.max_positions(), ") or allow truncation"));
    }
    out.total_tokens += encoding->size();
    out.sequences.push_back({encoding->ids, encoding->type_ids});
    out.encodings.push_back(std::move(*encoding));
  }
  return out;
}

absl::StatusOr<EncodePlan> PrepareEncode(const Model& model, const v1::EncodeRequest& request,
                                         const RequestLimits& limits) {
  EncodePlan plan;
  const int num_layers = model.config().num_hidden_layers;
  switch (request.pooling()) {
    case v1::POOLING_MODEL_DEFAULT:
      plan.pooling = model.sentence_config().pooling;
      break;
    case v1::POOLING_CLS:
      plan.pooling = PoolingMode::kCls;
      break;
    case v1::POOLING_MEAN:
      plan.pooling = PoolingMode::kMean;
      break;
    case v1::POOLING_MAX:
      plan.pooling = PoolingMode::kMax;
      break;
    case v1::POOLING_NONE:
      plan.pooling = std::nullopt;
      break;
    default:
      return Invalid(absl::StrCat("pooling: unknown value ", request.pooling(),
                                  "; use POOLING_MODEL_DEFAULT, POOLING_CLS, POOLING_MEAN, "
                                  "POOLING_MAX or POOLING_NONE"));
  }
  plan.normalize =
      request.has_normalize() ? request.normalize() : model.sentence_config().normalize;
  plan.token_embeddings = request.return_token_embeddings();
  plan.static_embeddings = request.return_static_embeddings();
  absl::StatusOr<WireDType> dtype = ResolveDType(request.output_dtype(), "output_dtype");
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;
  absl::StatusOr<std::vector<int>> layers =
      ResolveIndices(request.hidden_layers(), num_layers + 1, "hidden_layers",
                     absl::StrCat(" (0 = embedding output, ", num_layers,
                                  " = last layer, negatives count from the end)"));
  if (!layers.ok()) return layers.status();
  plan.hidden_layers = *layers;

  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(model, request.inputs(), request.tokenization(), limits);
  if (!inputs.ok()) return inputs.status();
  plan.inputs = std::move(*inputs);

  plan.forward.pool = false;
  plan.forward.hidden_layers = plan.hidden_layers;
  // The last layer feeds pooling and token embeddings.
  if (std::find(plan.hidden_layers.begin(), plan.hidden_layers.end(), num_layers) ==
      plan.hidden_layers.end()) {
    plan.forward.hidden_layers.push_back(num_layers);
  }
  plan.forward.static_embeddings = plan.static_embeddings;
  return plan;
}

absl::StatusOr<AttentionPlan> PrepareAttention(const Model& model,
                                               const v1::AttentionMapRequest& request,
                                               const RequestLimits& limits) {
  AttentionPlan plan;
  const int num_layers = model.config().num_hidden_layers;
  const int num_heads = model.config().num_attention_heads;
  absl::StatusOr<std::vector<int>> layers =
      ResolveIndices(request.layers(), num_layers, "layers",
                     " (0-based encoder layers; negatives count from the end)");
  if (!layers.ok()) return layers.status();
  plan.layers = *layers;
  if (plan.layers.empty()) {
    for (int l = 0; l < num_layers; ++l) plan.layers.push_back(l);
  }
  std::set<int> seen_heads;
  for (int i = 0; i < request.heads_size(); ++i) {
    const int head = request.heads(i);
    if (head < 0 || head >= num_heads) {
      return Invalid(
          absl::StrCat("heads[", i, "] = ", head, " is outside [0, ", num_heads - 1, "]"));
    }
    if (!seen_heads.insert(head).second) {
      return Invalid(absl::StrCat("heads[", i, "] = ", head, " is repeated"));
    }
    plan.heads.push_back(head);
  }
  if (plan.heads.empty()) {
    for (int h = 0; h < num_heads; ++h) plan.heads.push_back(h);
  }
  plan.weights = request.has_include_weights() ? request.include_weights() : true;
  plan.scores = request.include_scores();
  plan.qkv = request.include_qkv();
  plan.mean_over_heads = request.mean_over_heads();
  plan.rollout = request.rollout();
  if (request.top_k() < 0) {
    return Invalid(absl::StrCat("top_k is ", request.top_k(), "; use 0 for dense maps or k > 0"));
  }
  plan.top_k = request.top_k();
  if (!plan.weights && !plan.scores && !plan.qkv && !plan.mean_over_heads && !plan.rollout) {
    return Invalid(
        "nothing to return: include_weights is false and no scores, qkv, mean_over_heads or "
        "rollout was requested");
  }
  absl::StatusOr<WireDType> dtype = ResolveDType(request.output_dtype(), "output_dtype");
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;

  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(model, request.inputs(), request.tokenization(), limits);
  if (!inputs.ok()) return inputs.status();
  plan.inputs = std::move(*inputs);

  plan.forward.pool = false;
  plan.forward.attention_probs = true;
  plan.forward.attention_scores = plan.scores;
  plan.forward.attention_qkv = plan.qkv;
  if (plan.rollout) {
    for (int l = 0; l < num_layers; ++l) plan.forward.attention_layers.push_back(l);
  } else {
    plan.forward.attention_layers = plan.layers;
  }
  return plan;
}

RequestCost EstimateCost(const Model& model, const EncodePlan& p, int64_t version_bytes) {
  EncodeCostQuery query;
  query.pooled = p.pooling.has_value();
  query.token_embeddings = p.token_embeddings;
  query.hidden_layers = static_cast<int>(p.hidden_layers.size());
  query.keeps_last_layer = p.forward.hidden_layers.size() == p.hidden_layers.size();
  query.static_embeddings = p.static_embeddings;
  query.dtype = p.dtype;
  return EstimateEncodeCost(model.config(), model.tokenizer(), p.inputs.encodings, query,
                            version_bytes);
}

RequestCost EstimateCost(const Model& model, const AttentionPlan& p, int64_t version_bytes) {
  AttentionCostQuery query;
  query.layers = p.layers;
  query.heads = p.heads;
  query.weights = p.weights;
  query.scores = p.scores;
  query.qkv = p.qkv;
  query.mean_over_heads = p.mean_over_heads;
  query.rollout = p.rollout;
  query.top_k = p.top_k;
  query.dtype = p.dtype;
  return EstimateAttentionCost(model.config(), model.tokenizer(), p.inputs.encodings, query,
                               version_bytes);
}

}  // namespace attn::server
