// attnctl's inspect commands: tokenize, models, info, health (encode: encode_command.cc,
// attention: attention_command.cc), all on the Encoder and Health services.
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

ABSL_FLAG(std::string, service, "",
          "service to check (default \"\": the server as a whole; for example "
          "attnserve.v1.Encoder)");

namespace attn::client::attnctl {

Command EncodeCommand();     // encode_command.cc
Command AttentionCommand();  // attention_command.cc
Command ExplainCommand();    // explain_command.cc
Command ClassifyCommand();   // classify_commands.cc
Command RerankCommand();     // classify_commands.cc

namespace {

namespace v1 = ::attnserve::v1;

// tokenize

int RunTokenize(const Command& command) {
  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  v1::TokenizeRequest request;
  auto texts = ReadInputs();
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  FillInputs(*texts, request.mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  *request.mutable_tokenization() = *tokenization;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_model_version(absl::GetFlag(FLAGS_model_version));

  auto response = client->Tokenize(request);
  if (!response.ok()) return RpcError(response.status(), client->target(), NamesOf(*texts));
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
  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->ListModels();
  if (!response.ok()) return RpcError(response.status(), client->target());
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
  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  v1::GetModelInfoRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_model_version(absl::GetFlag(FLAGS_model_version));
  auto info = client->GetModelInfo(request);
  if (!info.ok()) return RpcError(info.status(), client->target());
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
  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto status = client->Health(absl::GetFlag(FLAGS_service));
  if (!status.ok()) {
    if (status.status().code() == absl::StatusCode::kNotFound) {
      // The protocol's answer for a service name the server does not know.
      std::printf("SERVICE_UNKNOWN\n");
      std::fprintf(stderr, "attnctl: NOT_FOUND: %s\n",
                   std::string(status.status().message()).c_str());
      return kExitFailure;
    }
    return RpcError(status.status(), client->target());
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
  group.commands.push_back(EncodeCommand());
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
       {InputFlags(), EncoderCommonFlags()},
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
        EncoderCommonFlags()},
       "  attnctl info\n  attnctl info --model mpnet\n  attnctl info --json\n",
       RunInfo});
  group.commands.push_back(
      {"models",
       "the served models (attnserve --model NAME=DIR), the default first",
       "attnctl models [flags]",
       "Prints a table: name, '*' for the default model, type, layers, hidden size, precision, "
       "the served version and how many versions there are.\n",
       {EncoderCommonFlags()},
       "  attnctl models\n  attnctl models --json\n",
       RunModels});
  group.commands.push_back(
      {"health",
       "grpc.health.v1 check; exits 0 only if SERVING (for Docker HEALTHCHECK)",
       "attnctl health [--service NAME] [flags]",
       R"(Prints SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN and exits 0 only for SERVING, so it can
be a Docker HEALTHCHECK or a Kubernetes exec probe.
)",
       {{"Flags", {{"service", "NAME"}}}, EncoderCommonFlags()},
       R"(  attnctl health
  HEALTHCHECK CMD ["attnctl", "health", "--timeout-ms", "2000"]
)",
       RunHealth});
  return group;
}

}  // namespace attn::client::attnctl
