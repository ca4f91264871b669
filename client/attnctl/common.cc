#include "client/attnctl/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/attnctl/command.h"
#include "google/protobuf/util/json_util.h"

// Flags every command takes.
ABSL_FLAG(std::string, server, "",
          "server address (default: $ATTNSERVE_ADDR, else localhost:50051)");
ABSL_FLAG(int, timeout_ms, 30000, "per-call deadline in milliseconds; 0 = none");
ABSL_FLAG(bool, wait_for_ready, false,
          "wait (up to the deadline) for the server to come up instead of failing fast");
ABSL_FLAG(bool, json, false, "print the response as JSON, one line per response");
// Inputs (encode, attention, tokenize); --model-version also for info, --max-length and
// --truncation also for finetune.
ABSL_FLAG(std::string, model_version, "", "use this model version (default: the one being served)");
ABSL_FLAG(std::string, model, "",
          "the served model to use, by name (attnserve --model NAME=DIR; 'attnctl models' lists "
          "them); default: the server's default model");
ABSL_FLAG(std::string, text, "",
          "the input text; without --text, one text per line is read from stdin (empty lines "
          "skipped), each line one input of the batch");
ABSL_FLAG(std::string, pair, "", "second text of a pair with --text: [CLS] text [SEP] pair [SEP]");
ABSL_FLAG(int, max_length, 0, "max tokens incl. [CLS]/[SEP]; 0 = the model's default");
ABSL_FLAG(std::string, truncation, "",
          "right (default: keep the beginning) | left | none (error if too long)");
// The Trainer's commands.
ABSL_FLAG(std::string, token_file, "",
          "file with the Trainer's bearer token (default: $ATTNSERVE_TOKEN)");
// encode and attention.
ABSL_FLAG(std::string, dtype, "float32", "wire dtype of tensors: float32 | float16 | bfloat16");

namespace attn::client::attnctl {

namespace v1 = ::attnserve::v1;

FlagGroup CommonFlags(const std::vector<FlagUse>& overrides) {
  FlagGroup group{
      "Common flags",
      {{"server", "HOST:PORT"}, {"timeout_ms", "N"}, {"wait_for_ready", ""}, {"json", ""}}};
  for (const FlagUse& o : overrides) {
    for (FlagUse& use : group.flags) {
      if (use.name == o.name) use = o;
    }
  }
  return group;
}

FlagGroup InputFlags() {
  return {"Inputs",
          {{"text", "TEXT"},
           {"pair", "TEXT"},
           {"max_length", "N"},
           {"truncation", "MODE"},
           {"model", "NAME"},
           {"model_version", "V"}}};
}

// The bearer token: --token-file (whitespace around it stripped), else $ATTNSERVE_TOKEN, else
// none (the server then answers UNAUTHENTICATED, and TrainerRpcError says how to pass one).
absl::StatusOr<std::string> LoadToken() {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrFormat("cannot read token file %s: %s", path, std::strerror(errno)));
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string token(absl::StripAsciiWhitespace(buffer.str()));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("token file %s is empty", path));
    }
    return token;
  }
  const char* env = std::getenv("ATTNSERVE_TOKEN");
  return std::string(absl::StripAsciiWhitespace(env != nullptr ? env : ""));
}

// RpcError plus what to do about the errors specific to the Trainer.
int TrainerRpcError(const absl::Status& status, const std::string& target) {
  RpcError(status, target);
  const char* env = std::getenv("ATTNSERVE_TOKEN");
  const bool have_token = !absl::GetFlag(FLAGS_token_file).empty() ||
                          (env != nullptr && !absl::StripAsciiWhitespace(env).empty());
  const char* hint = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      hint = have_token ? "the server did not accept the token's format"
                        : "the Trainer needs its token: pass --token-file PATH or set "
                          "ATTNSERVE_TOKEN";
      break;
    case absl::StatusCode::kPermissionDenied:
      hint =
          "wrong token: compare --token-file / $ATTNSERVE_TOKEN with the server's "
          "--trainer-token-file";
      break;
    case absl::StatusCode::kUnimplemented:
      hint = "this server has no Trainer service (start it with --trainer-token-file)";
      break;
    default:
      break;
  }
  if (hint != nullptr) std::fprintf(stderr, "attnctl: hint: %s\n", hint);
  return kExitFailure;
}

// A TrainerClient for the command line's server, options and token; nullptr after printing
// the error (exit code in *exit_code).
std::unique_ptr<TrainerClient> MakeTrainerClient(int* exit_code) {
  auto token = LoadToken();
  if (!token.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(token.status().message()).c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  ClientOptions options = OptionsFromFlags();
  options.bearer_token = *token;
  return std::make_unique<TrainerClient>(ServerAddress(), options);
}

std::string ServerAddress() {
  std::string server = absl::GetFlag(FLAGS_server);
  if (!server.empty()) return server;
  const char* env = std::getenv("ATTNSERVE_ADDR");
  if (env != nullptr && *env != '\0') return env;
  return "localhost:50051";
}

ClientOptions OptionsFromFlags() {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(std::max(0, absl::GetFlag(FLAGS_timeout_ms)));
  options.wait_for_ready = absl::GetFlag(FLAGS_wait_for_ready);
  return options;
}

int RpcError(const absl::Status& status, const std::string& target) {
  const std::string code = absl::StatusCodeToString(status.code());
  if (IsUnreachable(status)) {
    std::fprintf(stderr, "attnctl: cannot reach %s (%s): %s\n", target.c_str(), code.c_str(),
                 std::string(status.message()).c_str());
  } else {
    std::fprintf(stderr, "attnctl: %s: %s\n", code.c_str(), std::string(status.message()).c_str());
  }
  return kExitFailure;
}

bool PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    std::fprintf(stderr, "attnctl: cannot print JSON: %s\n", status.ToString().c_str());
    return false;
  }
  std::printf("%s\n", json.c_str());
  return true;
}

int DisplayWidth(absl::string_view s) {
  int n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string PadRight(absl::string_view s, int width) {
  std::string out(s);
  out.append(std::max(0, width - DisplayWidth(s)), ' ');
  return out;
}

std::string CodePointSlice(absl::string_view s, int begin, int end) {
  std::string out;
  int cp = -1;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++cp;
    if (cp >= end) break;
    if (cp >= begin) out.push_back(c);
  }
  return out;
}

std::string ShortText(absl::string_view text, int max_chars) {
  std::string flat;
  for (char c : text) flat.push_back(c == '\n' || c == '\t' || c == '\r' ? ' ' : c);
  if (DisplayWidth(flat) <= max_chars) return flat;
  return CodePointSlice(flat, 0, max_chars - 1) + "\u2026";
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows, const std::string& indent,
                const std::vector<int>& gaps) {
  std::vector<int> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    widths[c] = DisplayWidth(header[c]);
    for (const auto& row : rows) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      const int gap = c < gaps.size() ? gaps[c] : 2;
      line += c + 1 < row.size() ? PadRight(row[c], widths[c] + gap) : row[c];
    }
    std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(line)).c_str());
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

std::string InputText::Describe() const {
  if (!is_pair) return absl::StrCat("\"", ShortText(first), "\"");
  return absl::StrCat("\"", ShortText(first, 40), "\" + \"", ShortText(second, 40), "\"");
}

absl::StatusOr<std::vector<InputText>> ReadInputs() {
  std::vector<InputText> inputs;
  const std::string text = absl::GetFlag(FLAGS_text);
  const std::string pair = absl::GetFlag(FLAGS_pair);
  if (!text.empty()) {
    inputs.push_back({text, pair, !pair.empty()});
    return inputs;
  }
  if (!pair.empty()) return absl::InvalidArgumentError("--pair needs --text");
  // An interactive terminal would wait forever for a text nobody knows to type.
  if (isatty(STDIN_FILENO)) {
    return absl::InvalidArgumentError("no input: give --text TEXT or pipe one text per line");
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    inputs.push_back({line, "", false});
  }
  if (inputs.empty()) {
    return absl::InvalidArgumentError("no input: stdin had no text (one text per line)");
  }
  return inputs;
}

void FillInputs(const std::vector<InputText>& texts,
                google::protobuf::RepeatedPtrField<v1::Input>* inputs) {
  for (const InputText& t : texts) {
    v1::Input* input = inputs->Add();
    if (t.is_pair) {
      input->mutable_pair()->set_first(t.first);
      input->mutable_pair()->set_second(t.second);
    } else {
      input->set_text(t.first);
    }
  }
}

absl::StatusOr<v1::TokenizationOptions> TokenizationFromFlags() {
  v1::TokenizationOptions options;
  const int max_length = absl::GetFlag(FLAGS_max_length);
  if (max_length < 0) return absl::InvalidArgumentError("--max-length must be >= 0");
  options.set_max_length(max_length);
  const std::string mode = absl::AsciiStrToLower(absl::GetFlag(FLAGS_truncation));
  if (mode.empty()) {
    options.set_truncation(v1::TRUNCATION_UNSPECIFIED);
  } else if (mode == "right") {
    options.set_truncation(v1::TRUNCATION_RIGHT);
  } else if (mode == "left") {
    options.set_truncation(v1::TRUNCATION_LEFT);
  } else if (mode == "none") {
    options.set_truncation(v1::TRUNCATION_NONE);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--truncation must be right, left or none, not '", mode, "'"));
  }
  return options;
}

absl::StatusOr<v1::DType> DTypeFromFlag() {
  const std::string d = absl::AsciiStrToLower(absl::GetFlag(FLAGS_dtype));
  if (d == "float32" || d == "fp32" || d == "f32") return v1::FLOAT32;
  if (d == "float16" || d == "fp16" || d == "f16" || d == "half") return v1::FLOAT16;
  if (d == "bfloat16" || d == "bf16") return v1::BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be float32, float16 or bfloat16, not '", d, "'"));
}

std::string TruncationNote(bool truncated, int untruncated_length) {
  if (!truncated) return "";
  return absl::StrFormat(", truncated from %d", untruncated_length);
}

void PrintMetadata(const std::string& version, const v1::ResponseMetadata& m) {
  std::printf(
      "model %s: %lld tokens, %.2f ms total (tokenize %.2f, queue %.2f, inference %.2f; batch "
      "of %d inputs)\n",
      version.c_str(), static_cast<long long>(m.token_count()), m.total_ms(), m.tokenization_ms(),
      m.queue_ms(), m.inference_ms(), m.batch_inputs());
}

// Writes `content` to `path`; on failure says so on stderr.
bool WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) {
    std::fprintf(stderr, "attnctl: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(stderr, "wrote %s (%zu bytes)\n", path.c_str(), content.size());
  return true;
}

int PrintDataError(const absl::Status& status, const std::string& command) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(status.message()).c_str());
    return kExitFailure;
  }
  // One problem per line, each "file:line: what".
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(line).c_str());
  }
  std::fprintf(stderr, "Run 'attnctl %s --help' for the data format.\n", command.c_str());
  return kExitUsage;
}

std::string DescribeEvaluationSet(const attnserve::v1::EvaluationSet& set) {
  switch (set.task()) {
    case attnserve::v1::EVALUATION_RETRIEVAL:
      return absl::StrFormat("retrieval: %d queries over %d items", set.queries_size(),
                             set.corpus_size());
    case attnserve::v1::EVALUATION_COSINE_SIMILARITY:
      return absl::StrFormat("cosine similarity: %d pairs", set.examples_size());
    case attnserve::v1::EVALUATION_CLASSIFICATION:
      return absl::StrFormat("classification: %d examples", set.examples_size());
    case attnserve::v1::EVALUATION_PAIR_CLASSIFICATION:
      return absl::StrFormat("pair classification: %d pairs", set.examples_size());
    default:
      return "no task";
  }
}

std::string FormatMetrics(const attnserve::v1::EvaluationResult& result) {
  std::vector<std::string> parts;
  for (const attnserve::v1::EvaluationMetric& m : result.metrics()) {
    parts.push_back(absl::StrFormat("%s %.4f", m.name(), m.value()));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace attn::client::attnctl
