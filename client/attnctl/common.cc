#include "client/attnctl/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
#include "client/attnctl/command_line.h"
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
          "the input text; without --text, one text per line is read from stdin, each line one "
          "input of the batch (an empty line is an error: results are numbered by line)");
ABSL_FLAG(std::string, pair, "", "second text of a pair with --text: [CLS] text [SEP] pair [SEP]");
ABSL_FLAG(int, max_length, 0, "max tokens incl. [CLS]/[SEP]; 0 = the model's default");
ABSL_FLAG(std::string, truncation, "",
          "right (default: keep the beginning) | left | none (error if too long)");
// The Trainer's commands.
ABSL_FLAG(std::string, token_file, "",
          "file with the Trainer's bearer token (default: $ATTNSERVE_TOKEN)");
// The Encoder's commands.
ABSL_FLAG(std::string, api_key_file, "",
          "file with the API key of a server started with --api-key-file (default: "
          "$ATTNSERVE_API_KEY)");
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

FlagGroup EncoderCommonFlags(const std::vector<FlagUse>& overrides) {
  FlagGroup group = CommonFlags(overrides);
  group.flags.push_back({"api_key_file", "PATH"});
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

namespace {

// The longest secret sent: gRPC's metadata (8 KiB by default) holds it with room to spare.
constexpr size_t kMaxSecretBytes = 4096;

// A bearer secret from the file `path` (`what` names it: "token", "API key"), else from the
// environment variable `variable`, else "" (none). Surrounding whitespace is stripped; what is
// left must be visible ASCII: it travels in an HTTP/2 header.
absl::StatusOr<std::string> ReadSecret(const std::string& path, const char* variable,
                                       const std::string& what) {
  std::string secret;
  std::string source = absl::StrCat("$", variable);
  if (!path.empty()) {
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s file %s is a directory; give the file holding the %s", what, path, what));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrFormat("cannot read %s file %s: %s", what, path, std::strerror(errno)));
    }
    std::string contents(kMaxSecretBytes + 4096, '\0');
    in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
    contents.resize(static_cast<size_t>(in.gcount()));
    secret = std::string(absl::StripAsciiWhitespace(contents));
    if (secret.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s file %s is empty", what, path));
    }
    source = path;
  } else {
    const char* env = std::getenv(variable);
    secret = std::string(absl::StripAsciiWhitespace(env != nullptr ? env : ""));
  }
  if (secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s in %s is longer than %d bytes: not a key or token", what, source, kMaxSecretBytes));
  }
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(secret[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the %s in %s has a space, control or non-ASCII character at byte %d "
                          "(it travels in an HTTP/2 header: visible ASCII only)",
                          what, source, i));
    }
  }
  return secret;
}

}  // namespace

absl::StatusOr<std::string> LoadToken() {
  return ReadSecret(absl::GetFlag(FLAGS_token_file), "ATTNSERVE_TOKEN", "token");
}

absl::StatusOr<std::string> LoadApiKey() {
  return ReadSecret(absl::GetFlag(FLAGS_api_key_file), "ATTNSERVE_API_KEY", "API key");
}

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

std::unique_ptr<EncoderClient> MakeEncoderClient(int* exit_code) {
  auto key = LoadApiKey();
  if (!key.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(key.status().message()).c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  ClientOptions options = OptionsFromFlags();
  options.bearer_token = *key;
  return std::make_unique<EncoderClient>(ServerAddress(), options);
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

namespace {

// The offset of the first byte of `text` that is not well-formed UTF-8 (an overlong form, a
// surrogate, a code point past U+10FFFF, a cut sequence), or npos.
size_t InvalidUtf8At(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const int length = byte < 0x80   ? 1
                       : byte < 0xC2 ? 0
                       : byte < 0xE0 ? 2
                       : byte < 0xF0 ? 3
                       : byte < 0xF5 ? 4
                                     : 0;
    if (length == 0 || i + length > text.size()) return i;
    uint32_t code = length == 1 ? byte : byte & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return i;
    }
    i += length;
  }
  return absl::string_view::npos;
}

// An error naming `where` if `text` is not UTF-8 (the server refuses such text; attnctl says so
// before sending anything).
absl::Status CheckUtf8(absl::string_view text, const std::string& where) {
  const size_t bad = InvalidUtf8At(text);
  if (bad == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is not valid UTF-8 (byte 0x%02X at offset %d); texts must be UTF-8",
                      where, static_cast<unsigned char>(text[bad]), bad));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadInputLines(std::istream& in,
                                                        const std::string& source) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "line %d of %s is %s: every line is one input and results are numbered by line, so "
          "an empty line is refused rather than skipped; remove it (e.g. grep -v "
          "'^[[:space:]]*$')",
          lines.size() + 1, source, line.empty() ? "empty" : "blank"));
    }
    if (absl::Status utf8 =
            CheckUtf8(line, absl::StrFormat("line %d of %s", lines.size() + 1, source));
        !utf8.ok()) {
      return utf8;
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

absl::StatusOr<std::vector<InputText>> ReadInputs() {
  std::vector<InputText> inputs;
  const std::string text = absl::GetFlag(FLAGS_text);
  const std::string pair = absl::GetFlag(FLAGS_pair);
  if (FlagGiven("text") && text.empty()) {
    return absl::InvalidArgumentError(
        "--text is empty: give a non-empty text, or leave --text out and pipe one text per line");
  }
  if (FlagGiven("pair") && pair.empty()) {
    return absl::InvalidArgumentError("--pair is empty: give the pair's second text");
  }
  if (absl::Status utf8 = CheckUtf8(text, "--text"); !utf8.ok()) return utf8;
  if (absl::Status utf8 = CheckUtf8(pair, "--pair"); !utf8.ok()) return utf8;
  if (!text.empty()) {
    inputs.push_back({text, pair, !pair.empty()});
    return inputs;
  }
  if (!pair.empty()) return absl::InvalidArgumentError("--pair needs --text");
  // An interactive terminal would wait forever for a text nobody knows to type.
  if (isatty(STDIN_FILENO)) {
    return absl::InvalidArgumentError("no input: give --text TEXT or pipe one text per line");
  }
  absl::StatusOr<std::vector<std::string>> lines = ReadInputLines(std::cin, "stdin");
  if (!lines.ok()) return lines.status();
  for (std::string& line : *lines) {
    inputs.push_back({std::move(line), "", false, static_cast<int>(inputs.size()) + 1});
  }
  if (inputs.empty()) {
    return absl::InvalidArgumentError("no input: stdin had no text (one text per line)");
  }
  return inputs;
}

InputNamer NamesOf(const std::vector<InputText>& texts, int first) {
  return [&texts, first](int k) -> std::string {
    const int index = first + k;
    if (index < 0 || index >= static_cast<int>(texts.size())) return absl::StrCat("input ", index);
    const InputText& input = texts[index];
    if (input.line > 0) return absl::StrFormat("line %d of stdin", input.line);
    return input.is_pair ? "the pair --text/--pair" : "--text";
  };
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
