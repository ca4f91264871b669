// attnctl's inspect commands: encode, tokenize, info, health (attention: attention_command.cc),
// all on the Encoder and Health services.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"
#include "client/tensor_decode.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, pooling, "default",
          "cls | mean | max | none | cls_attention (weighted by the last layer's [CLS] attention) "
          "| default = the model's pooling (mean for MiniLM)");
ABSL_FLAG(bool, sparse, false,
          "also return each input's BM42 sparse vector (fastembed-compatible indices and values)");
ABSL_FLAG(std::string, normalize, "default",
          "L2-normalise the pooled embedding: true | false | default = as the model does (true "
          "for MiniLM)");
ABSL_FLAG(std::vector<std::string>, layers, {},
          "also return per-token hidden states of these layers: 0 = embedding output, i = encoder "
          "layer i, negative counts from the end (-1 = last)");
ABSL_FLAG(bool, jsonl, false,
          "print one JSON line per input ({\"index\": i, ...its EncodeResult}), for files of "
          "any size");
ABSL_FLAG(std::string, long_text, "truncate",
          "an input over --max-length tokens: truncate (keep --max-length tokens, as --truncation "
          "says), refuse (an error naming it), or chunk (embed all of it: windows of --max-length "
          "tokens overlapping by --chunk-overlap, pooled into one embedding)");
ABSL_FLAG(int, chunk_overlap, -1,
          "with --long-text chunk: tokens consecutive windows share; -1 = the server's default "
          "(--max-length / 8)");
ABSL_FLAG(std::string, service, "",
          "service to check (default \"\": the server as a whole; for example "
          "attnserve.v1.Encoder)");

namespace attn::client::attnctl {

Command AttentionCommand();  // attention_command.cc
Command ExplainCommand();    // explain_command.cc
Command ClassifyCommand();   // classify_commands.cc
Command RerankCommand();     // classify_commands.cc

namespace {

namespace v1 = ::attnserve::v1;

std::string FormatFloats(const float* values, int n) {
  std::vector<std::string> parts;
  for (int i = 0; i < n; ++i) parts.push_back(absl::StrFormat("%+.4f", values[i]));
  return absl::StrJoin(parts, " ");
}

// encode

// One line per result: {"index": first_index + i, ...the EncodeResult as proto JSON}.
bool PrintJsonLines(const v1::EncodeResponse& response, int first_index) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  for (int i = 0; i < response.results_size(); ++i) {
    std::string json;
    if (auto printed =
            google::protobuf::util::MessageToJsonString(response.results(i), &json, options);
        !printed.ok()) {
      std::fprintf(stderr, "attnctl: cannot print JSON: %s\n", printed.ToString().c_str());
      return false;
    }
    // The result's JSON is an object: open it with the index.
    std::printf("{\"index\":%d%s%s\n", first_index + i, json.size() > 2 ? "," : "",
                json.c_str() + 1);
  }
  return true;
}

// The human-readable lines of input `index` (`what`: its text, shortened); false if a tensor
// from the server cannot be decoded.
bool PrintEncodeResult(int index, const std::string& what, const v1::EncodeResult& r) {
  bool ok = true;
  std::string note = TruncationNote(r.truncated(), r.untruncated_length());
  if (r.truncated() && r.untruncated_length_is_lower_bound()) {
    note = absl::StrFormat(", truncated from at least %d", r.untruncated_length());
  }
  if (r.chunks() > 1) note = absl::StrFormat(", embedded in %d overlapping windows", r.chunks());
  std::printf("[%d] %s (%d tokens%s)\n", index, what.c_str(), r.tokens_size(), note.c_str());
  if (r.embedding_size() > 0) {
    double sq = 0;
    for (float v : r.embedding()) sq += static_cast<double>(v) * v;
    const int n = std::min(8, r.embedding_size());
    std::printf("    embedding [%d] norm %.4f: %s%s\n", r.embedding_size(), std::sqrt(sq),
                FormatFloats(r.embedding().data(), n).c_str(),
                r.embedding_size() > n ? " ..." : "");
  }
  for (const v1::LayerTensor& layer : r.hidden_states()) {
    auto tensor = DecodeTensor(layer.tensor());
    if (!tensor.ok()) {
      std::fprintf(stderr, "attnctl: input %d layer %d: bad tensor from server: %s\n", index,
                   layer.layer(), std::string(tensor.status().message()).c_str());
      ok = false;
      continue;
    }
    const std::string shape = absl::StrJoin(tensor->shape, " x ");
    const int n = static_cast<int>(
        std::min<int64_t>(8, tensor->rank() == 2 ? tensor->dim(1) : tensor->size()));
    std::printf("    layer %d [%s] %s, [CLS] row: %s%s\n", layer.layer(), shape.c_str(),
                v1::DType_Name(layer.tensor().dtype()).c_str(),
                FormatFloats(tensor->values.data(), n).c_str(), tensor->size() > n ? " ..." : "");
  }
  if (r.has_sparse()) {
    std::vector<std::string> entries;
    for (int k = 0; k < r.sparse().indices_size(); ++k) {
      entries.push_back(absl::StrFormat("%u:%.4f", r.sparse().indices(k), r.sparse().values(k)));
    }
    std::printf("    sparse (BM42) %d entries: %s\n", r.sparse().indices_size(),
                absl::StrJoin(entries, " ").c_str());
  }
  return ok;
}

int RunEncode(const Command& command) {
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  v1::EncodeRequest request;
  auto texts = FillSharedRequestFields(&request);
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);

  const std::string pooling = absl::AsciiStrToLower(absl::GetFlag(FLAGS_pooling));
  if (pooling == "default") {
    request.set_pooling(v1::POOLING_MODEL_DEFAULT);
  } else if (pooling == "cls") {
    request.set_pooling(v1::POOLING_CLS);
  } else if (pooling == "mean") {
    request.set_pooling(v1::POOLING_MEAN);
  } else if (pooling == "max") {
    request.set_pooling(v1::POOLING_MAX);
  } else if (pooling == "none") {
    request.set_pooling(v1::POOLING_NONE);
  } else if (pooling == "cls_attention") {
    request.set_pooling(v1::POOLING_CLS_ATTENTION);
  } else {
    return UsageError(absl::StrCat("--pooling must be cls, mean, max, none, cls_attention or "
                                   "default, not '",
                                   pooling, "'"),
                      &command);
  }
  request.set_sparse(absl::GetFlag(FLAGS_sparse));
  const std::string long_text = absl::AsciiStrToLower(absl::GetFlag(FLAGS_long_text));
  const int chunk_overlap = absl::GetFlag(FLAGS_chunk_overlap);
  if (long_text == "chunk") {
    request.set_long_text(v1::LONG_TEXT_CHUNK);
    if (chunk_overlap >= 0) request.set_chunk_overlap(chunk_overlap);
  } else if (long_text == "refuse") {
    if (!absl::GetFlag(FLAGS_truncation).empty()) {
      return UsageError(
          "--long-text refuse and --truncation both say what to do with a long "
          "input: give one of them",
          &command);
    }
    request.mutable_tokenization()->set_truncation(v1::TRUNCATION_NONE);
  } else if (long_text != "truncate") {
    return UsageError(
        absl::StrCat("--long-text must be truncate, refuse or chunk, not '", long_text, "'"),
        &command);
  }
  if (chunk_overlap != -1 && long_text != "chunk") {
    return UsageError("--chunk-overlap goes with --long-text chunk", &command);
  }
  const std::string normalize = absl::AsciiStrToLower(absl::GetFlag(FLAGS_normalize));
  if (normalize == "true") {
    request.set_normalize(true);
  } else if (normalize == "false") {
    request.set_normalize(false);
  } else if (normalize != "default") {
    return UsageError(
        absl::StrCat("--normalize must be true, false or default, not '", normalize, "'"),
        &command);
  }
  for (const std::string& s : absl::GetFlag(FLAGS_layers)) {
    int layer = 0;
    if (!absl::SimpleAtoi(s, &layer)) {
      return UsageError(absl::StrCat("--layers takes integers like 0,-1, not '", s, "'"), &command);
    }
    request.add_hidden_layers(layer);
  }

  const bool json = absl::GetFlag(FLAGS_json), jsonl = absl::GetFlag(FLAGS_jsonl);
  if (json && jsonl) {
    return UsageError("--json prints a line per response, --jsonl a line per input: pick one",
                      &command);
  }

  // More inputs than the server takes in one request: several calls, in order, each as large
  // as the server allows (GetModelInfo says how large).
  const int total = request.inputs_size();
  int per_call = std::max(total, 1);
  if (total > 1) {
    v1::GetModelInfoRequest info_request;
    info_request.set_model(request.model());
    info_request.set_model_version(request.model_version());
    auto info = client.GetModelInfo(info_request);
    if (!info.ok()) return RpcError(info.status(), client.target());
    if (info->max_inputs_per_request() > 0) {
      per_call = std::min(per_call, info->max_inputs_per_request());
    }
  }
  v1::EncodeRequest part = request;
  int status = kExitOk;
  int begin = 0;
  do {  // once even without inputs: the server says what is missing
    const int end = std::min(total, begin + per_call);
    part.mutable_inputs()->Clear();
    for (int i = begin; i < end; ++i) *part.add_inputs() = request.inputs(i);
    auto response = client.Encode(part);
    if (!response.ok()) {
      if (begin > 0) {
        std::fprintf(stderr, "attnctl: inputs 0 to %d were printed; input %d and later were not\n",
                     begin - 1, begin);
      }
      return RpcError(response.status(), client.target());
    }
    if (json) {
      if (!PrintJson(*response)) return kExitFailure;
    } else if (jsonl) {
      if (!PrintJsonLines(*response, begin)) return kExitFailure;
    } else {
      for (int i = 0; i < response->results_size(); ++i) {
        const int index = begin + i;
        const std::string what =
            index < static_cast<int>(texts->size()) ? (*texts)[index].Describe() : "";
        if (!PrintEncodeResult(index, what, response->results(i))) status = kExitFailure;
      }
      PrintMetadata(response->model_version(), response->metadata());
    }
    begin = end;
  } while (begin < total);
  return status;
}

// tokenize

int RunTokenize(const Command& command) {
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  v1::TokenizeRequest request;
  auto texts = ReadInputs();
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  FillInputs(*texts, request.mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  *request.mutable_tokenization() = *tokenization;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_model_version(absl::GetFlag(FLAGS_model_version));

  auto response = client.Tokenize(request);
  if (!response.ok()) return RpcError(response.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;

  for (int i = 0; i < response->results_size(); ++i) {
    const v1::TokenizeResult& r = response->results(i);
    const InputText* input = i < static_cast<int>(texts->size()) ? &(*texts)[i] : nullptr;
    std::printf("[%d] %s (%d tokens%s)\n", i, input ? input->Describe().c_str() : "",
                r.tokens_size(), TruncationNote(r.truncated(), r.untruncated_length()).c_str());
    const std::vector<std::string> header = {"#", "token", "id", "type", "chars", "text"};
    std::vector<std::vector<std::string>> rows;
    for (int k = 0; k < r.tokens_size(); ++k) {
      const v1::Token& t = r.tokens(k);
      std::string span = "-";
      std::string covered;
      if (!t.special()) {
        span = absl::StrFormat("%d-%d", t.char_start(), t.char_end());
        if (input != nullptr) {
          const std::string& source = t.source() == 1 ? input->second : input->first;
          covered = absl::StrCat("\"", CodePointSlice(source, t.char_start(), t.char_end()), "\"");
        }
      }
      rows.push_back({absl::StrCat(k), t.text(), absl::StrCat(t.id()), absl::StrCat(t.type_id()),
                      span, covered});
    }
    PrintTable(header, rows, "   ");
  }
  PrintMetadata(response->model_version(), response->metadata());
  return kExitOk;
}

// models

int RunModels(const Command&) {
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  auto response = client.ListModels();
  if (!response.ok()) return RpcError(response.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  const std::vector<std::string> header = {"",       "model",     "type",    "layers",
                                           "hidden", "precision", "version", "versions"};
  std::vector<std::vector<std::string>> rows;
  for (const v1::ModelInfo& info : response->models()) {
    rows.push_back({info.is_default() ? "*" : "", info.name(), info.model_type(),
                    absl::StrCat(info.num_layers()), absl::StrCat(info.hidden_size()),
                    info.precision(), info.version(),
                    absl::StrCat(info.available_versions_size())});
  }
  PrintTable(header, rows, "  ");
  return kExitOk;
}

// info

int RunInfo(const Command&) {
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  v1::GetModelInfoRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_model_version(absl::GetFlag(FLAGS_model_version));
  auto info = client.GetModelInfo(request);
  if (!info.ok()) return RpcError(info.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*info) ? kExitOk : kExitFailure;

  // Walk the message by reflection so new ModelInfo fields show up without touching this.
  const google::protobuf::Descriptor* d = info->GetDescriptor();
  const google::protobuf::Reflection* r = info->GetReflection();
  using FD = google::protobuf::FieldDescriptor;
  std::vector<std::pair<std::string, std::string>> lines;
  size_t key_width = 0;
  for (int f = 0; f < d->field_count(); ++f) {
    const FD* field = d->field(f);
    std::vector<std::string> values;
    const int n = field->is_repeated() ? r->FieldSize(*info, field) : 1;
    for (int k = 0; k < n; ++k) {
      const bool rep = field->is_repeated();
      switch (field->cpp_type()) {
        case FD::CPPTYPE_STRING:
          values.push_back(rep ? r->GetRepeatedString(*info, field, k)
                               : r->GetString(*info, field));
          break;
        case FD::CPPTYPE_INT32:
          values.push_back(
              absl::StrCat(rep ? r->GetRepeatedInt32(*info, field, k) : r->GetInt32(*info, field)));
          break;
        case FD::CPPTYPE_INT64:
          values.push_back(
              absl::StrCat(rep ? r->GetRepeatedInt64(*info, field, k) : r->GetInt64(*info, field)));
          break;
        case FD::CPPTYPE_BOOL:
          values.push_back((rep ? r->GetRepeatedBool(*info, field, k) : r->GetBool(*info, field))
                               ? "true"
                               : "false");
          break;
        case FD::CPPTYPE_ENUM:
          values.push_back(rep ? r->GetRepeatedEnum(*info, field, k)->name()
                               : r->GetEnum(*info, field)->name());
          break;
        default:
          values.push_back("(not shown; use --json)");
      }
    }
    lines.emplace_back(field->name(), absl::StrJoin(values, ", "));
    key_width = std::max(key_width, field->name().size());
  }
  for (const auto& [key, value] : lines) {
    std::printf("%s %s\n", PadRight(key + ":", static_cast<int>(key_width) + 1).c_str(),
                value.c_str());
  }
  return kExitOk;
}

// health

int RunHealth(const Command&) {
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  auto status = client.Health(absl::GetFlag(FLAGS_service));
  if (!status.ok()) {
    if (status.status().code() == absl::StatusCode::kNotFound) {
      // The protocol's answer for a service name the server does not know.
      std::printf("SERVICE_UNKNOWN\n");
      std::fprintf(stderr, "attnctl: NOT_FOUND: %s\n",
                   std::string(status.status().message()).c_str());
      return kExitFailure;
    }
    return RpcError(status.status(), client.target());
  }
  if (absl::GetFlag(FLAGS_json)) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(*status);
    if (!PrintJson(response)) return kExitFailure;
  } else {
    std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status).c_str());
  }
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitFailure;
}

}  // namespace

CommandGroup InspectCommands() {
  CommandGroup group{"Commands", {}};
  group.commands.push_back(
      {"encode",
       "sentence embeddings (and hidden states of chosen layers) of texts",
       "attnctl encode [--text TEXT [--pair TEXT] | < lines] [flags]",
       R"(Prints per input its token count, the embedding's L2 norm and first 8 dimensions, and for each
--layers entry the hidden-state shape and the first 8 values of the [CLS] row. More inputs than
the server takes per request (its --max-inputs-per-request) are sent in several calls, in order.
)",
       {{"Flags",
         {{"pooling", "P"},
          {"normalize", "B"},
          {"long_text", "MODE"},
          {"chunk_overlap", "N"},
          {"layers", "L,L,..."},
          {"dtype", "D"},
          {"sparse", ""},
          {"jsonl", ""}}},
        InputFlags(),
        CommonFlags()},
       R"EX(  attnctl encode --text "The cat sat on the mat."
  attnctl encode --text "A man is eating." --pair "Someone eats." --pooling cls
  attnctl encode --text "hello" --layers 0,-1 --dtype bfloat16
  attnctl encode --text "red kettle, 1.7 litres" --sparse
  attnctl encode --long-text chunk --text "$(cat chapter.txt)"
  attnctl encode --jsonl < sentences.txt > embeddings.jsonl
)EX",
       RunEncode});
  group.commands.push_back(AttentionCommand());
  group.commands.push_back(ExplainCommand());
  group.commands.push_back(ClassifyCommand());
  group.commands.push_back(RerankCommand());
  group.commands.push_back(
      {"tokenize",
       "tokens, ids, segment ids and character offsets",
       "attnctl tokenize [--text TEXT [--pair TEXT] | < lines] [flags]",
       R"(Prints a table per input: position, token, vocabulary id, segment (type) id, the token's
[start, end) character offsets into its text and the text they cover.
)",
       {InputFlags(), CommonFlags()},
       R"(  attnctl tokenize --text "Tokenization isn't trivial."
  attnctl tokenize --text "How old are you?" --pair "I am 6." --max-length 8
)",
       RunTokenize});
  group.commands.push_back(
      {"info",
       "the served model: architecture, sizes, defaults, versions",
       "attnctl info [flags]",
       "Prints the model's architecture, sizes, defaults and versions as \"key: value\" lines.\n",
       {{"Flags",
         {{"model", "NAME", "describe this served model (default: the server's default one)"},
          {"model_version", "V", "describe this version (default: the one being served)"}}},
        CommonFlags()},
       "  attnctl info\n  attnctl info --model mpnet\n  attnctl info --json\n",
       RunInfo});
  group.commands.push_back(
      {"models",
       "the served models (attnserve --model NAME=DIR), the default first",
       "attnctl models [flags]",
       "Prints a table: name, '*' for the default model, type, layers, hidden size, precision, "
       "the served version and how many versions there are.\n",
       {CommonFlags()},
       "  attnctl models\n  attnctl models --json\n",
       RunModels});
  group.commands.push_back(
      {"health",
       "grpc.health.v1 check; exits 0 only if SERVING (for Docker HEALTHCHECK)",
       "attnctl health [--service NAME] [flags]",
       R"(Prints SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN and exits 0 only for SERVING, so it can
be a Docker HEALTHCHECK or a Kubernetes exec probe.
)",
       {{"Flags", {{"service", "NAME"}}}, CommonFlags()},
       R"(  attnctl health
  HEALTHCHECK CMD ["attnctl", "health", "--timeout-ms", "2000"]
)",
       RunHealth});
  return group;
}

}  // namespace attn::client::attnctl
