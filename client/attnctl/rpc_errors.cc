#include "client/attnctl/rpc_errors.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/attnctl/http_probe.h"
#include "client/client.h"

namespace attn::client::attnctl {
namespace {

// The number that follows `marker` in `text` (digits only); false if none does.
bool NumberAfter(absl::string_view text, absl::string_view marker, int64_t* value) {
  const size_t at = text.find(marker);
  if (at == absl::string_view::npos) return false;
  absl::string_view rest = text.substr(at + marker.size());
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  return digits > 0 && absl::SimpleAtoi(rest.substr(0, digits), value);
}

// Whether a secret was given by flag or environment variable.
bool SecretGiven(const std::string& flag_value, const char* variable) {
  const char* env = std::getenv(variable);
  return !flag_value.empty() || (env != nullptr && !absl::StripAsciiWhitespace(env).empty());
}

// What to do about an Encoder call's error, or nullptr.
std::string EncoderHint(const absl::Status& status) {
  const bool have_key = SecretGiven(absl::GetFlag(FLAGS_api_key_file), "ATTNSERVE_API_KEY");
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      return have_key ? "the server did not accept the API key's format"
                      : "this server requires an API key (attnserve --api-key-file): pass "
                        "--api-key-file PATH or set ATTNSERVE_API_KEY";
    case absl::StatusCode::kPermissionDenied:
      return "wrong API key: compare --api-key-file / $ATTNSERVE_API_KEY with the server's "
             "--api-key-file";
    case absl::StatusCode::kInvalidArgument:
      return OverLengthHint(status.message());
    default:
      return "";
  }
}

// What to do about a Trainer call's error, or "".
std::string TrainerHint(const absl::Status& status) {
  const bool have_token = SecretGiven(absl::GetFlag(FLAGS_token_file), "ATTNSERVE_TOKEN");
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      return have_token ? "the server did not accept the token's format"
                        : "the Trainer needs its token: pass --token-file PATH or set "
                          "ATTNSERVE_TOKEN";
    case absl::StatusCode::kPermissionDenied:
      return "wrong token: compare --token-file / $ATTNSERVE_TOKEN with the server's "
             "--trainer-token-file";
    case absl::StatusCode::kUnimplemented:
      return "this server has no Trainer service (start it with --trainer-token-file)";
    default:
      return "";
  }
}

// Prints the error in attnctl's terms and `hint`; returns kExitFailure.
int Report(const absl::Status& status, const std::string& target, const InputNamer& inputs,
           const std::string& hint) {
  const std::string code = absl::StatusCodeToString(status.code());
  // gRPC's words for a port that answers HTTP/1.x (attnserve's HTTP or metrics port): "Trying
  // to connect an http1.x server", or "Failed parsing HTTP/2" when it answered the preface.
  if (status.code() == absl::StatusCode::kUnavailable &&
      (absl::StrContains(status.message(), "http1.x") ||
       absl::StrContains(status.message(), "Failed parsing HTTP/2"))) {
    std::fprintf(stderr, "attnctl: cannot call %s (%s): %s\n", target.c_str(), code.c_str(),
                 ExplainHttpPort(target).c_str());
    return kExitFailure;
  }
  const std::string message = InAttnctlTerms(status.message(), inputs);
  if (IsUnreachable(status)) {
    std::fprintf(stderr, "attnctl: cannot reach %s (%s): %s\n", target.c_str(), code.c_str(),
                 message.c_str());
  } else {
    std::fprintf(stderr, "attnctl: %s: %s\n", code.c_str(), message.c_str());
  }
  if (!hint.empty()) std::fprintf(stderr, "attnctl: hint: %s\n", hint.c_str());
  return kExitFailure;
}

}  // namespace

std::string InAttnctlTerms(absl::string_view message, const InputNamer& inputs) {
  std::string out =
      absl::StrReplaceAll(message, {{"raise tokenization.max_length", "raise --max-length"},
                                    {"tokenization.max_length", "--max-length"},
                                    {"max_length", "--max-length"},
                                    {"and truncation is TRUNCATION_NONE", "with --truncation none"},
                                    {"TRUNCATION_NONE", "--truncation none"},
                                    {"TRUNCATION_RIGHT", "--truncation right"},
                                    {"TRUNCATION_LEFT", "--truncation left"},
                                    {"long_text LONG_TEXT_CHUNK", "--long-text chunk"}});
  // An over-long input: OverLengthHint says what helps, which the server's advice may not.
  if (!OverLengthHint(message).empty()) out = out.substr(0, out.find("; shorten it"));
  if (!inputs) return out;
  // "inputs[12]" -> what the command line calls input 12.
  std::string named;
  for (size_t at = 0;;) {
    const size_t open = out.find("inputs[", at);
    int64_t k = 0;
    if (open == std::string::npos || !NumberAfter(out.substr(open), "inputs[", &k)) {
      named += out.substr(at);
      return named;
    }
    const size_t close = out.find(']', open);
    named += out.substr(at, open - at) + inputs(static_cast<int>(k));
    at = close + 1;
  }
}

std::string OverLengthHint(absl::string_view message) {
  int64_t tokens = 0, limit = 0, positions = 0;
  if (!absl::StrContains(message, "TRUNCATION_NONE") || !NumberAfter(message, " has ", &tokens) ||
      !NumberAfter(message, "more than max_length ", &limit)) {
    return "";
  }
  const std::string cut =
      absl::StrCat("or allow truncation (--truncation right, the default) to embed its first ",
                   limit, " tokens");
  // The server offers a larger max_length only when the model's positions can hold the input.
  if (NumberAfter(message, "(this model takes up to ", &positions)) {
    return absl::StrCat("pass --max-length ", tokens, " or more (this model takes up to ",
                        positions, " tokens), ", cut);
  }
  // Long documents: windows of the model's length, pooled into one embedding, when this attnctl
  // offers it.
  const bool chunking = absl::FindCommandLineFlag("long_text") != nullptr;
  return absl::StrCat("no --max-length of this model fits the text: shorten or split it",
                      chunking ? ", embed all of it in windows with --long-text chunk" : "", ", ",
                      cut);
}

int RpcError(const absl::Status& status, const std::string& target, const InputNamer& inputs) {
  return Report(status, target, inputs, EncoderHint(status));
}

int TrainerRpcError(const absl::Status& status, const std::string& target) {
  return Report(status, target, nullptr, TrainerHint(status));
}

}  // namespace attn::client::attnctl
