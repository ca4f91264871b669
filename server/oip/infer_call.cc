#include "server/oip/infer_call.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "engine/quote.h"
#include "server/oip/infer_outputs.h"

namespace attn::server::oip {
namespace {

constexpr std::string_view kRequestParameters[] = {
    "pooling", "normalize", "layers", "dimensions", "truncation", "max_length", "timeout"};

// The request's parameters, read and checked.
struct InferOptions {
  core::Pooling pooling = core::Pooling::kModelDefault;
  std::optional<bool> normalize;
  std::vector<int32_t> layers = {-1};
  std::optional<int32_t> dimensions;
  core::Truncation truncation = core::Truncation::kNone;
  int32_t max_length = 0;
  std::optional<int64_t> timeout_us;
};

std::string_view TypeName(const ParameterValue& value) {
  switch (value.index()) {
    case 0:
      return "a bool";
    case 1:
    case 2:
      return "an integer";
    case 3:
      return "a double";
    default:
      return "a string";
  }
}

absl::Status WrongType(const Parameter& p, std::string_view wanted) {
  return absl::InvalidArgumentError(absl::StrCat("parameter '", AbslView(p.name), "' must be ",
                                                 AbslView(wanted), ", not ",
                                                 AbslView(TypeName(p.value))));
}

// An integer parameter (int64 or uint64) within [lo, hi].
absl::StatusOr<int64_t> IntegerOf(const Parameter& p, int64_t lo, int64_t hi) {
  int64_t value = 0;
  if (const auto* i = std::get_if<int64_t>(&p.value)) {
    value = *i;
  } else if (const auto* u = std::get_if<uint64_t>(&p.value)) {
    if (*u > static_cast<uint64_t>(hi))
      value = hi + 1;
    else
      value = static_cast<int64_t>(*u);
  } else {
    return WrongType(p, "an integer");
  }
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", AbslView(p.name), "' is ", value, "; give ", lo, " .. ", hi));
  }
  return value;
}

absl::StatusOr<std::string_view> StringOf(const Parameter& p) {
  if (const auto* s = std::get_if<std::string>(&p.value)) return std::string_view(*s);
  return WrongType(p, "a string");
}

absl::StatusOr<core::Pooling> PoolingOf(const Parameter& p) {
  absl::StatusOr<std::string_view> name = StringOf(p);
  if (!name.ok()) return name.status();
  static constexpr std::pair<std::string_view, core::Pooling> kNames[] = {
      {"cls", core::Pooling::kCls},
      {"mean", core::Pooling::kMean},
      {"max", core::Pooling::kMax},
      {"none", core::Pooling::kNone},
      {"cls_attention", core::Pooling::kClsAttention}};
  for (const auto& [known, pooling] : kNames) {
    if (*name == known) return pooling;
  }
  return absl::InvalidArgumentError(absl::StrCat("parameter 'pooling' is ", QuoteInput(*name),
                                                 "; give cls, mean, max, none or cls_attention "
                                                 "(or leave it out for the model's own)"));
}

absl::StatusOr<core::Truncation> TruncationOf(const Parameter& p) {
  absl::StatusOr<std::string_view> name = StringOf(p);
  if (!name.ok()) return name.status();
  if (*name == "none") return core::Truncation::kNone;
  if (*name == "right") return core::Truncation::kRight;
  if (*name == "left") return core::Truncation::kLeft;
  return absl::InvalidArgumentError(absl::StrCat("parameter 'truncation' is ", QuoteInput(*name),
                                                 "; give none (refuse over-long inputs, the "
                                                 "default), right or left"));
}

// "layers": one integer or a comma-separated list of them.
absl::StatusOr<std::vector<int32_t>> LayersOf(const Parameter& p) {
  if (!std::holds_alternative<std::string>(p.value)) {
    absl::StatusOr<int64_t> one = IntegerOf(p, -4096, 4096);
    if (!one.ok()) return one.status();
    return std::vector<int32_t>{static_cast<int32_t>(*one)};
  }
  std::vector<int32_t> layers;
  for (absl::string_view part : absl::StrSplit(std::get<std::string>(p.value), ',')) {
    int32_t layer = 0;
    if (!absl::SimpleAtoi(part, &layer) || layers.size() >= 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter 'layers' is ", QuoteInput(std::get<std::string>(p.value)),
          "; give an integer or a comma-separated list of them, e.g. \"0,-1\" (at most 256)"));
    }
    layers.push_back(layer);
  }
  return layers;
}

bool Contains(absl::Span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

absl::Status UnknownParameter(std::string_view where, std::string_view name,
                              absl::Span<const std::string_view> known) {
  std::vector<std::string> names(known.begin(), known.end());
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", AbslView(where), " parameter ", QuoteInput(name),
                   "; this server knows ", names.empty() ? "none" : absl::StrJoin(names, ", ")));
}

absl::StatusOr<InferOptions> ReadOptions(const InferRequest& request) {
  InferOptions options;
  std::vector<std::string_view> known(std::begin(kRequestParameters), std::end(kRequestParameters));
  known.insert(known.end(), request.transport_request_parameters.begin(),
               request.transport_request_parameters.end());
  for (const Parameter& p : request.parameters) {
    absl::Status status;
    if (p.name == "pooling") {
      absl::StatusOr<core::Pooling> pooling = PoolingOf(p);
      if (pooling.ok()) options.pooling = *pooling;
      status = pooling.status();
    } else if (p.name == "normalize") {
      if (const auto* b = std::get_if<bool>(&p.value))
        options.normalize = *b;
      else
        status = WrongType(p, "a bool");
    } else if (p.name == "layers") {
      absl::StatusOr<std::vector<int32_t>> layers = LayersOf(p);
      if (layers.ok()) options.layers = *std::move(layers);
      status = layers.status();
    } else if (p.name == "dimensions") {
      absl::StatusOr<int64_t> dimensions = IntegerOf(p, 1, 1 << 20);
      if (dimensions.ok()) options.dimensions = static_cast<int32_t>(*dimensions);
      status = dimensions.status();
    } else if (p.name == "truncation") {
      absl::StatusOr<core::Truncation> truncation = TruncationOf(p);
      if (truncation.ok()) options.truncation = *truncation;
      status = truncation.status();
    } else if (p.name == "max_length") {
      absl::StatusOr<int64_t> length = IntegerOf(p, 1, 1 << 20);
      if (length.ok()) options.max_length = static_cast<int32_t>(*length);
      status = length.status();
    } else if (p.name == "timeout") {
      absl::StatusOr<int64_t> timeout = IntegerOf(p, 1, std::numeric_limits<int64_t>::max() / 2);
      if (timeout.ok()) options.timeout_us = *timeout;
      status = timeout.status();
    } else if (!Contains(request.transport_request_parameters, p.name)) {
      status = UnknownParameter("request", p.name, known);
    }
    if (!status.ok()) return status;
  }
  if (options.dimensions.has_value() && options.pooling == core::Pooling::kNone) {
    return absl::InvalidArgumentError(
        "parameter 'dimensions' cuts the pooled EMBEDDING, but 'pooling' is none; choose a "
        "pooling or leave 'dimensions' out");
  }
  return options;
}

}  // namespace

absl::StatusOr<std::vector<std::string_view>> SplitBytesElements(std::string_view raw,
                                                                 int64_t count,
                                                                 std::string_view tensor) {
  std::vector<std::string_view> elements;
  elements.reserve(static_cast<size_t>(std::min<int64_t>(count, raw.size() / 4)));
  size_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (raw.size() - at < 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(AbslView(tensor), ": its shape says ", count,
                       " elements, but the raw contents (", raw.size(), " bytes) end after ", i,
                       "; each BYTES element is a 4-byte little-endian length and "
                       "that many bytes"));
    }
    uint32_t length = 0;
    for (int b = 3; b >= 0; --b) length = (length << 8) | static_cast<uint8_t>(raw[at + b]);
    at += 4;
    if (length > raw.size() - at) {
      return absl::InvalidArgumentError(
          absl::StrCat(AbslView(tensor), "[", i, "]: its length prefix says ", length,
                       " bytes, but only ", raw.size() - at, " bytes of the raw contents remain"));
    }
    elements.push_back(raw.substr(at, length));
    at += length;
  }
  if (at != raw.size()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(tensor), ": the raw contents hold ",
                                                   raw.size() - at, " bytes more than the shape's ",
                                                   count, " elements"));
  }
  return elements;
}

namespace {

// What the request's input tensors hold, as the core's inputs view it.
struct InputData {
  std::vector<std::string_view> texts;
  std::vector<std::vector<int32_t>> ids, type_ids;
  std::string_view tensor;  // "TEXT" or "INPUT_IDS", for messages
};

absl::Status Invalid(std::string_view tensor, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("input ", AbslView(tensor), ": ", what));
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The element count of `shape` when each dimension is >= 0 and the product stays below 2^40.
absl::StatusOr<int64_t> ElementCount(const InputTensor& t) {
  int64_t count = 1;
  for (int64_t d : t.shape) {
    if (d < 0)
      return Invalid(t.name, absl::StrCat("shape ", ShapeText(t.shape),
                                          " has a negative "
                                          "dimension; give the actual sizes"));
    if (d != 0 && count > (int64_t{1} << 40) / d) {
      return Invalid(t.name, absl::StrCat("shape ", ShapeText(t.shape), " is far too large"));
    }
    count *= d;
  }
  return count;
}

absl::Status CheckDatatype(const InputTensor& t, std::string_view wanted, std::string_view what) {
  if (t.datatype == wanted) return absl::OkStatus();
  return Invalid(t.name, absl::StrCat("datatype ", QuoteInput(t.datatype), "; this model takes ",
                                      AbslView(wanted), " (", AbslView(what), ")"));
}

absl::StatusOr<std::vector<std::string_view>> ReadTexts(const InputTensor& t) {
  if (absl::Status ok = CheckDatatype(t, "BYTES", "one UTF-8 text per element"); !ok.ok())
    return ok;
  if (t.shape.empty() || t.shape.size() > 2 || (t.shape.size() == 2 && t.shape[1] != 1)) {
    return Invalid(t.name, absl::StrCat("shape ", ShapeText(t.shape),
                                        "; this model takes [N] (or [N, 1]): one text per row"));
  }
  absl::StatusOr<int64_t> count = ElementCount(t);
  if (!count.ok()) return count.status();
  if (t.raw.has_value())
    return SplitBytesElements(*t.raw, *count, absl::StrCat("input ", AbslView(t.name)));
  if (static_cast<int64_t>(t.bytes_contents.size()) != *count ||
      (t.has_typed_contents && t.typed_field != "bytes_contents")) {
    return Invalid(
        t.name, absl::StrCat("its shape ", ShapeText(t.shape), " says ", *count, " elements, but ",
                             t.typed_field.empty() || t.typed_field == "bytes_contents"
                                 ? absl::StrCat(t.bytes_contents.size(), " came")
                                 : absl::StrCat("they came in ", AbslView(t.typed_field),
                                                ", not bytes_contents")));
  }
  return t.bytes_contents;
}

// An INT64 [N, T] tensor's rows.
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadIntRows(const InputTensor& t) {
  if (absl::Status ok = CheckDatatype(t, "INT64", "token ids, one row per input"); !ok.ok())
    return ok;
  if (t.shape.size() != 2) {
    return Invalid(t.name, absl::StrCat("shape ", ShapeText(t.shape),
                                        "; this model takes [N, T]: one row of T per input"));
  }
  absl::StatusOr<int64_t> count = ElementCount(t);
  if (!count.ok()) return count.status();
  std::vector<int64_t> values;
  if (t.raw.has_value()) {
    if (static_cast<int64_t>(t.raw->size()) != *count * 8) {
      return Invalid(
          t.name,
          absl::StrCat("its shape ", ShapeText(t.shape), " says ", *count, " INT64 elements (",
                       *count * 8, " bytes), but the raw contents are ", t.raw->size(), " bytes"));
    }
    values.resize(static_cast<size_t>(*count));
    std::memcpy(values.data(), t.raw->data(), t.raw->size());  // little-endian host (x86-64)
  } else {
    if (static_cast<int64_t>(t.int64_contents.size()) != *count ||
        (t.has_typed_contents && t.typed_field != "int64_contents")) {
      return Invalid(
          t.name,
          absl::StrCat("its shape ", ShapeText(t.shape), " says ", *count, " elements, but ",
                       t.typed_field.empty() || t.typed_field == "int64_contents"
                           ? absl::StrCat(t.int64_contents.size(), " came")
                           : absl::StrCat("they came in ", AbslView(t.typed_field),
                                          ", not int64_contents")));
    }
    values = t.int64_contents;
  }
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(t.shape[0]));
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].assign(values.begin() + r * t.shape[1], values.begin() + (r + 1) * t.shape[1]);
  }
  return rows;
}

absl::Status ReadTokenInputs(const InputTensor& ids_tensor, const InputTensor* mask,
                             const InputTensor* types, InputData* data) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> ids = ReadIntRows(ids_tensor);
  if (!ids.ok()) return ids.status();
  std::vector<std::vector<int64_t>> mask_rows, type_rows;
  for (const auto& [tensor, rows] : {std::pair{mask, &mask_rows}, std::pair{types, &type_rows}}) {
    if (tensor == nullptr) continue;
    absl::StatusOr<std::vector<std::vector<int64_t>>> read = ReadIntRows(*tensor);
    if (!read.ok()) return read.status();
    if (tensor->shape != ids_tensor.shape) {
      return Invalid(tensor->name,
                     absl::StrCat("shape ", ShapeText(tensor->shape), " differs from INPUT_IDS' ",
                                  ShapeText(ids_tensor.shape)));
    }
    *rows = *std::move(read);
  }
  for (size_t r = 0; r < ids->size(); ++r) {
    size_t length = (*ids)[r].size();
    if (!mask_rows.empty()) {
      const std::vector<int64_t>& m = mask_rows[r];
      length = std::find(m.begin(), m.end(), 0) - m.begin();
      for (size_t j = 0; j < m.size(); ++j) {
        if ((j < length && m[j] != 1) || (j >= length && m[j] != 0)) {
          return Invalid("ATTENTION_MASK", absl::StrCat("row ", r, " is not ones then zeros (",
                                                        m[j], " at position ", j, ")"));
        }
      }
    }
    std::vector<int32_t> row, type_row;
    for (size_t j = 0; j < length; ++j) {
      const int64_t id = (*ids)[r][j];
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat("INPUT_IDS[", r, "][", j, "] is ", id, ", not a token id of this model"));
      }
      row.push_back(static_cast<int32_t>(id));
      if (!type_rows.empty()) {
        const int64_t type = type_rows[r][j];
        if (type < 0 || type > 255) {
          return absl::InvalidArgumentError(
              absl::StrCat("TOKEN_TYPE_IDS[", r, "][", j, "] is ", type, ", not a segment id"));
        }
        type_row.push_back(static_cast<int32_t>(type));
      }
    }
    data->ids.push_back(std::move(row));
    data->type_ids.push_back(std::move(type_row));
  }
  data->tensor = "INPUT_IDS";
  return absl::OkStatus();
}

absl::Status CheckInputParameters(const InputTensor& t, const InferRequest& request) {
  for (const Parameter& p : t.parameters) {
    if (Contains(request.transport_input_parameters, p.name)) continue;
    if (p.name == "content_type") {  // KServe's codec hint: a text tensor says "str"
      absl::StatusOr<std::string_view> type = StringOf(p);
      if (type.ok() && (*type == "str" || *type == "bytes") && t.name == "TEXT") continue;
      return Invalid(t.name,
                     "parameter 'content_type' must be \"str\" (a TEXT tensor of UTF-8 "
                     "texts)");
    }
    std::vector<std::string_view> known = {"content_type"};
    known.insert(known.end(), request.transport_input_parameters.begin(),
                 request.transport_input_parameters.end());
    return UnknownParameter(absl::StrCat("input ", AbslView(t.name)), p.name, known);
  }
  return absl::OkStatus();
}

absl::StatusOr<InputData> ReadInputs(const InferRequest& request) {
  static constexpr std::string_view kInputs[] = {"TEXT", "INPUT_IDS", "ATTENTION_MASK",
                                                 "TOKEN_TYPE_IDS"};
  const InputTensor* by_name[4] = {};
  for (const InputTensor& t : request.inputs) {
    const auto* known = std::find(std::begin(kInputs), std::end(kInputs), t.name);
    if (known == std::end(kInputs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown input ", QuoteInput(t.name),
                       "; this model takes TEXT (BYTES "
                       "[-1]) or INPUT_IDS (INT64 [-1, -1]) with ATTENTION_MASK and "
                       "TOKEN_TYPE_IDS"));
    }
    const InputTensor*& slot = by_name[known - std::begin(kInputs)];
    if (slot != nullptr) return Invalid(t.name, "given twice");
    slot = &t;
    if (absl::Status ok = CheckInputParameters(t, request); !ok.ok()) return ok;
  }
  InputData data;
  if ((by_name[0] == nullptr) == (by_name[1] == nullptr)) {
    return absl::InvalidArgumentError(
        by_name[0] == nullptr
            ? "no input: send TEXT (BYTES [-1], one text per element) or INPUT_IDS (INT64 [-1, -1])"
            : "both TEXT and INPUT_IDS: send one of them");
  }
  if (by_name[0] != nullptr) {
    if (by_name[2] != nullptr || by_name[3] != nullptr) {
      return absl::InvalidArgumentError(
          "ATTENTION_MASK and TOKEN_TYPE_IDS go with INPUT_IDS, not with TEXT");
    }
    absl::StatusOr<std::vector<std::string_view>> texts = ReadTexts(*by_name[0]);
    if (!texts.ok()) return texts.status();
    data.texts = *std::move(texts);
    data.tensor = "TEXT";
    return data;
  }
  if (absl::Status read = ReadTokenInputs(*by_name[1], by_name[2], by_name[3], &data); !read.ok())
    return read;
  return data;
}

absl::StatusOr<std::vector<std::string_view>> ReadOutputs(const InferRequest& request) {
  std::vector<std::string_view> names;
  for (const RequestedOutput& output : request.outputs) {
    if (!IsOutputName(output.name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown output ", QuoteInput(output.name),
                                                     "; this model gives ", OutputNames()));
    }
    if (Contains(names, output.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("output ", AbslView(output.name), " asked twice"));
    }
    for (const Parameter& p : output.parameters) {
      if (!Contains(request.transport_output_parameters, p.name)) {
        return UnknownParameter(absl::StrCat("output ", AbslView(output.name)), p.name,
                                request.transport_output_parameters);
      }
    }
    names.push_back(output.name);
  }
  if (names.empty()) names.push_back("EMBEDDING");
  return names;
}

// The core's "inputs[3]: ..." in the request's terms ("TEXT[3]: ...").
absl::Status InRequestTerms(const absl::Status& status, std::string_view tensor) {
  absl::string_view message = status.message();
  std::string rewritten;
  if (absl::ConsumePrefix(&message, "inputs[")) {
    rewritten = absl::StrCat(AbslView(tensor), "[", message);
  } else if (absl::ConsumePrefix(&message, "hidden_layers")) {
    rewritten = absl::StrCat("parameter 'layers' (for TOKEN_EMBEDDINGS: hidden states)", message);
  } else if (absl::ConsumePrefix(&message, "layers")) {
    rewritten = absl::StrCat("parameter 'layers' (for ATTENTION)", message);
  } else {
    return status;
  }
  absl::Status out(status.code(), rewritten);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace

void Inferrer::Infer(const InferRequest& request, core::CallControl control,
                     std::function<void(absl::StatusOr<InferResponse>)> done) const {
  absl::StatusOr<const ServedModel*> served = core_->models().Find(request.model);
  if (!served.ok()) return done(served.status());
  absl::StatusOr<InferOptions> options = ReadOptions(request);
  if (!options.ok()) return done(options.status());
  absl::StatusOr<InputData> data = ReadInputs(request);
  if (!data.ok()) return done(data.status());
  absl::StatusOr<std::vector<std::string_view>> outputs = ReadOutputs(request);
  if (!outputs.ok()) return done(outputs.status());
  if (options->timeout_us.has_value()) {
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::microseconds(*options->timeout_us);
    if (!control.deadline.has_value() || deadline < *control.deadline) control.deadline = deadline;
  }

  // One version for both core calls (a promotion between them must not mix two versions).
  absl::StatusOr<core::ServingCore::Resolved> resolved =
      core_->Resolve((*served)->name, request.version);
  if (!resolved.ok()) return done(resolved.status());

  OutputPlan plan;
  plan.names.assign(outputs->begin(), outputs->end());
  plan.layers = options->layers;
  auto wants = [&](std::string_view name) { return Contains(*outputs, name); };
  if (wants("EMBEDDING") && options->pooling == core::Pooling::kNone) {
    return done(absl::InvalidArgumentError(
        "output EMBEDDING is the pooled embedding, but 'pooling' is none; choose a pooling, or "
        "ask for TOKEN_EMBEDDINGS instead"));
  }
  const bool attention = wants("ATTENTION");
  const bool encode = !attention || wants("EMBEDDING") || wants("TOKEN_EMBEDDINGS") ||
                      wants("SPARSE_INDICES") || wants("SPARSE_VALUES") || wants("SPARSE_OFFSETS");

  std::vector<core::Input> inputs;
  const size_t count = data->tensor == "TEXT" ? data->texts.size() : data->ids.size();
  for (size_t i = 0; i < count; ++i) {
    core::Input input;
    if (data->tensor == "TEXT") {
      input.kind = core::Input::Kind::kText;
      input.text = data->texts[i];
    } else {
      input.kind = core::Input::Kind::kTokens;
      input.ids = data->ids[i];
      input.type_ids = data->type_ids[i];
    }
    inputs.push_back(input);
  }
  const core::TokenizationOptions tokenization{options->truncation, options->max_length};

  auto join = std::make_shared<InferJoin>((encode ? 1 : 0) + (attention ? 1 : 0));
  join->plan = std::move(plan);
  join->model = (*served)->name;
  join->version = resolved->version.version;
  join->tensor = std::string(data->tensor);
  join->limits = limits_;
  join->memory_budget = memory_budget_;
  join->done = std::move(done);
  if (encode) {
    core::EncodeRequest e;
    e.model = join->model;
    e.model_version = join->version;
    e.inputs = inputs;
    e.tokenization = tokenization;
    e.pooling = options->pooling;
    e.normalize = options->normalize;
    e.dimensions = options->dimensions;
    e.sparse = wants("SPARSE_INDICES") || wants("SPARSE_VALUES") || wants("SPARSE_OFFSETS");
    if (wants("TOKEN_EMBEDDINGS")) e.hidden_layers = join->plan.layers;
    core_->Encode(e, control, [join](absl::StatusOr<core::EncodeResponse> response) {
      if (!response.ok()) return join->Fail(InRequestTerms(response.status(), join->tensor));
      join->SetEncode(*std::move(response));
    });
  }
  if (attention) {
    core::AttentionRequest a;
    a.model = join->model;
    a.model_version = join->version;
    a.inputs = inputs;
    a.tokenization = tokenization;
    a.layers = join->plan.layers;
    core_->AttentionMap(a, control, [join](absl::StatusOr<core::AttentionResponse> response) {
      if (!response.ok()) return join->Fail(InRequestTerms(response.status(), join->tensor));
      join->SetAttention(*std::move(response));
    });
  }
}

}  // namespace attn::server::oip
