// What attnctl's commands share: the common and input flags, the connection (server address,
// options), error and JSON output, text alignment helpers and reading inputs.
#pragma once

#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/encoder.pb.h"
#include "attnserve/v1/trainer.pb.h"
#include "client/attnctl/rpc_errors.h"
#include "client/client.h"
#include "google/protobuf/message.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(int, timeout_ms);
ABSL_DECLARE_FLAG(bool, wait_for_ready);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, model_version);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, text);
ABSL_DECLARE_FLAG(std::string, pair);
ABSL_DECLARE_FLAG(int, max_length);
ABSL_DECLARE_FLAG(std::string, truncation);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, api_key_file);

namespace attn::client::attnctl {

// --server, else $ATTNSERVE_ADDR, else localhost:50051.
std::string ServerAddress();
// --timeout-ms and --wait-for-ready.
ClientOptions OptionsFromFlags();

// The bearer token: --token-file (whitespace around it stripped), else $ATTNSERVE_TOKEN, else
// none (the server then answers UNAUTHENTICATED, and TrainerRpcError says how to pass one).
absl::StatusOr<std::string> LoadToken();
// A TrainerClient for the command line's server, options and token; nullptr after printing
// the error (exit code in *exit_code).
std::unique_ptr<TrainerClient> MakeTrainerClient(int* exit_code);

// The API key of a server started with --api-key-file: --api-key-file PATH (whitespace around
// it stripped), else $ATTNSERVE_API_KEY, else none (the server then answers UNAUTHENTICATED,
// and RpcError says how to pass one). A key is visible ASCII, at most 4096 bytes.
absl::StatusOr<std::string> LoadApiKey();
// An EncoderClient for the command line's server, options and API key; nullptr after printing
// the error (exit code in *exit_code).
std::unique_ptr<EncoderClient> MakeEncoderClient(int* exit_code);

// One line of JSON on stdout (proto field names, default values included); false after
// printing why it could not.
bool PrintJson(const google::protobuf::Message& message);

// Number of code points: a good enough display width for aligning columns.
int DisplayWidth(absl::string_view s);
std::string PadRight(absl::string_view s, int width);
// Code points [begin, end) of a UTF-8 string (offsets as the server reports them).
std::string CodePointSlice(absl::string_view s, int begin, int end);
// A one-line, length-limited rendering of an input text for headings.
std::string ShortText(absl::string_view text, int max_chars = 60);
// Writes `content` to `path` ("wrote PATH (N bytes)" on stderr); false, with the reason on
// stderr, when it cannot.
bool WriteFile(const std::string& path, const std::string& content);
// Prints `rows` under `header` in aligned columns (`gaps[c]` spaces after column c, default 2),
// each line prefixed by `indent`, trailing blanks stripped.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows, const std::string& indent,
                const std::vector<int>& gaps = {});

// The texts of one input, for printing (token offsets index into them).
struct InputText {
  std::string first;
  std::string second;  // empty unless a pair
  bool is_pair = false;
  int line = 0;  // its line of stdin (1-based); 0 for --text
  std::string Describe() const;
};

// The lines of `in`, each one input (`source` names it in errors: "stdin", "--documents
// FILE"); a trailing '\r' is dropped. An empty line, or one of blanks only, is an error naming
// it: skipping it would shift the index of every later line, and so map results to the wrong
// lines.
absl::StatusOr<std::vector<std::string>> ReadInputLines(std::istream& in,
                                                        const std::string& source);
// --text [--pair], else one text per line of stdin (not a terminal; see ReadInputLines). An
// empty --text or --pair is an error.
absl::StatusOr<std::vector<InputText>> ReadInputs();
// Names input k of a call whose inputs start at texts[first], for RpcError: "line L of stdin",
// "--text" (or "the pair --text/--pair"), "input N".
InputNamer NamesOf(const std::vector<InputText>& texts, int first = 0);
void FillInputs(const std::vector<InputText>& texts,
                google::protobuf::RepeatedPtrField<attnserve::v1::Input>* inputs);
// --max-length and --truncation.
absl::StatusOr<attnserve::v1::TokenizationOptions> TokenizationFromFlags();
// --dtype (encode, attention).
absl::StatusOr<attnserve::v1::DType> DTypeFromFlag();

// The fields EncodeRequest and AttentionMapRequest share, from the inputs and flags; returns the
// inputs (their descriptions label the output).
template <typename Request>
absl::StatusOr<std::vector<InputText>> FillSharedRequestFields(Request* request) {
  auto texts = ReadInputs();
  if (!texts.ok()) return texts.status();
  FillInputs(*texts, request->mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return tokenization.status();
  *request->mutable_tokenization() = *tokenization;
  auto dtype = DTypeFromFlag();
  if (!dtype.ok()) return dtype.status();
  request->set_output_dtype(*dtype);
  request->set_model(absl::GetFlag(FLAGS_model));
  request->set_model_version(absl::GetFlag(FLAGS_model_version));
  return texts;
}

// ", truncated from N" when the server truncated an input, else "".
std::string TruncationNote(bool truncated, int untruncated_length);
// "model V: N tokens, X ms total (tokenize ..., queue ..., inference ...; batch of N inputs)".
void PrintMetadata(const std::string& version, const attnserve::v1::ResponseMetadata& m);

// A data file's problems on stderr ("attnctl: file:line: what", one per line, and where the
// format is explained: 'attnctl <command> --help'); returns the exit code (usage for bad data,
// failure when the file could not be read).
int PrintDataError(const absl::Status& status, const std::string& command);
// "retrieval: 60 queries over 100 items", "classification: 40 examples".
std::string DescribeEvaluationSet(const attnserve::v1::EvaluationSet& set);
// "mrr@10 0.9500, recall@1 0.9000, ...".
std::string FormatMetrics(const attnserve::v1::EvaluationResult& result);

}  // namespace attn::client::attnctl
