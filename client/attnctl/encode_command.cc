// attnctl encode: sentence embeddings (and hidden states, sparse vectors) of texts, sent in calls
// of at most the server's inputs per request; --jsonl prints one line per input that names the
// input it belongs to (its index, its line of stdin and its text).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
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
#include "nlohmann/json.hpp"

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
          "print one JSON line per input: {\"index\": i, \"line\": its line of stdin, \"text\": "
          "..., then its EncodeResult}, for files of any size");
ABSL_FLAG(std::string, long_text, "truncate",
          "an input over --max-length tokens: truncate (keep --max-length tokens, as --truncation "
          "says), refuse (an error naming it), or chunk (embed all of it: windows of --max-length "
          "tokens overlapping by --chunk-overlap, pooled into one embedding)");
ABSL_FLAG(int, chunk_overlap, -1,
          "with --long-text chunk: tokens consecutive windows share; -1 = the server's default "
          "(--max-length / 8)");

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

std::string FormatFloats(const float* values, int n) {
  std::vector<std::string> parts;
  for (int i = 0; i < n; ++i) parts.push_back(absl::StrFormat("%+.4f", values[i]));
  return absl::StrJoin(parts, " ");
}

// A JSON string of `text` (bytes that are not UTF-8 replaced: the server refuses such inputs, so
// none reach here).
std::string JsonString(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// {"index": i, "line": L (stdin only), "text": ..., "pair": ... (pairs only), ...the
// EncodeResult as proto JSON}: every line says which input it is, so no consumer maps a vector to
// the wrong text.
bool PrintJsonLine(int index, const InputText& input, const v1::EncodeResult& result) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  if (auto printed = google::protobuf::util::MessageToJsonString(result, &json, options);
      !printed.ok()) {
    std::fprintf(stderr, "attnctl: cannot print JSON: %s\n", printed.ToString().c_str());
    return false;
  }
  std::string head = absl::StrCat("{\"index\":", index);
  if (input.line > 0) absl::StrAppend(&head, ",\"line\":", input.line);
  absl::StrAppend(&head, ",\"text\":", JsonString(input.first));
  if (input.is_pair) absl::StrAppend(&head, ",\"pair\":", JsonString(input.second));
  // The result's JSON is an object: continue it after the head.
  std::printf("%s%s\n", head.c_str(), json.size() > 2 ? ("," + json.substr(1)).c_str() : "}");
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

// --long-text and --chunk-overlap into `request`; a usage error's message.
absl::Status SetLongTextOptions(v1::EncodeRequest* request) {
  const std::string long_text = absl::AsciiStrToLower(absl::GetFlag(FLAGS_long_text));
  const int chunk_overlap = absl::GetFlag(FLAGS_chunk_overlap);
  if (long_text == "chunk") {
    request->set_long_text(v1::LONG_TEXT_CHUNK);
    if (chunk_overlap >= 0) request->set_chunk_overlap(chunk_overlap);
  } else if (long_text == "refuse") {
    if (!absl::GetFlag(FLAGS_truncation).empty()) {
      return absl::InvalidArgumentError(
          "--long-text refuse and --truncation both say what to do with a long input: give one "
          "of them");
    }
    request->mutable_tokenization()->set_truncation(v1::TRUNCATION_NONE);
  } else if (long_text != "truncate") {
    return absl::InvalidArgumentError(
        absl::StrCat("--long-text must be truncate, refuse or chunk, not '", long_text, "'"));
  }
  if (chunk_overlap != -1 && long_text != "chunk") {
    return absl::InvalidArgumentError("--chunk-overlap goes with --long-text chunk");
  }
  return absl::OkStatus();
}

// --pooling, --normalize, --layers, --sparse and the long-text flags into `request`; a usage
// error's message.
absl::Status SetEncodeOptions(v1::EncodeRequest* request) {
  const std::string pooling = absl::AsciiStrToLower(absl::GetFlag(FLAGS_pooling));
  const std::vector<std::pair<const char*, v1::Pooling>> poolings = {
      {"default", v1::POOLING_MODEL_DEFAULT},
      {"cls", v1::POOLING_CLS},
      {"mean", v1::POOLING_MEAN},
      {"max", v1::POOLING_MAX},
      {"none", v1::POOLING_NONE},
      {"cls_attention", v1::POOLING_CLS_ATTENTION}};
  auto found = std::find_if(poolings.begin(), poolings.end(),
                            [&](const auto& p) { return pooling == p.first; });
  if (found == poolings.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pooling must be cls, mean, max, none, cls_attention or default, not '", pooling, "'"));
  }
  request->set_pooling(found->second);
  request->set_sparse(absl::GetFlag(FLAGS_sparse));
  if (absl::Status long_text = SetLongTextOptions(request); !long_text.ok()) return long_text;
  const std::string normalize = absl::AsciiStrToLower(absl::GetFlag(FLAGS_normalize));
  if (normalize == "true" || normalize == "false") {
    request->set_normalize(normalize == "true");
  } else if (normalize != "default") {
    return absl::InvalidArgumentError(
        absl::StrCat("--normalize must be true, false or default, not '", normalize, "'"));
  }
  for (const std::string& s : absl::GetFlag(FLAGS_layers)) {
    int layer = 0;
    if (!absl::SimpleAtoi(s, &layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--layers takes integers like 0,-1, not '", s, "'"));
    }
    request->add_hidden_layers(layer);
  }
  return absl::OkStatus();
}

// How many inputs one call may carry: all of them, unless the server takes fewer per request
// (GetModelInfo says how many); 0 after printing why it could not ask.
int InputsPerCall(EncoderClient* client, const v1::EncodeRequest& request) {
  const int total = request.inputs_size();
  if (total <= 1) return 1;
  v1::GetModelInfoRequest info_request;
  info_request.set_model(request.model());
  info_request.set_model_version(request.model_version());
  auto info = client->GetModelInfo(info_request);
  if (!info.ok()) {
    RpcError(info.status(), client->target());
    return 0;
  }
  const int limit = info->max_inputs_per_request();
  return limit > 0 ? std::min(total, limit) : total;
}

// Prints the results of inputs [begin, begin + results) as --json, --jsonl or text.
bool PrintResults(const v1::EncodeResponse& response, int begin,
                  const std::vector<InputText>& texts) {
  if (absl::GetFlag(FLAGS_json)) return PrintJson(response);
  bool ok = true;
  for (int i = 0; i < response.results_size(); ++i) {
    const int index = begin + i;
    if (index >= static_cast<int>(texts.size())) return false;  // more results than inputs
    if (absl::GetFlag(FLAGS_jsonl)) {
      if (!PrintJsonLine(index, texts[index], response.results(i))) return false;
    } else {
      ok = PrintEncodeResult(index, texts[index].Describe(), response.results(i)) && ok;
    }
  }
  if (!absl::GetFlag(FLAGS_jsonl)) PrintMetadata(response.model_version(), response.metadata());
  return ok;
}

int RunEncode(const Command& command) {
  v1::EncodeRequest request;
  auto texts = FillSharedRequestFields(&request);
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  if (absl::Status options = SetEncodeOptions(&request); !options.ok()) {
    return UsageError(std::string(options.message()), &command);
  }
  if (absl::GetFlag(FLAGS_json) && absl::GetFlag(FLAGS_jsonl)) {
    return UsageError("--json prints a line per response, --jsonl a line per input: pick one",
                      &command);
  }
  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  // More inputs than the server takes in one request: several calls, in order.
  const int total = request.inputs_size();
  const int per_call = InputsPerCall(client.get(), request);
  if (per_call == 0) return kExitFailure;
  v1::EncodeRequest part = request;
  for (int begin = 0; begin < total; begin += per_call) {
    const int end = std::min(total, begin + per_call);
    part.mutable_inputs()->Clear();
    for (int i = begin; i < end; ++i) *part.add_inputs() = request.inputs(i);
    auto response = client->Encode(part);
    if (!response.ok()) {
      if (begin > 0) {
        const bool lines = (*texts)[begin].line > 0;  // input i is line i+1 of stdin
        std::fprintf(stderr,
                     "attnctl: inputs 0 to %d%s were printed; input %d%s and later were not\n",
                     begin - 1, lines ? absl::StrCat(" (lines 1 to ", begin, ")").c_str() : "",
                     begin, lines ? absl::StrCat(" (line ", begin + 1, ")").c_str() : "");
      }
      return RpcError(response.status(), client->target(), NamesOf(*texts, begin));
    }
    if (!PrintResults(*response, begin, *texts)) exit_code = kExitFailure;
  }
  return exit_code;
}

}  // namespace

Command EncodeCommand() {
  return {
      "encode",
      "sentence embeddings (and hidden states of chosen layers) of texts",
      "attnctl encode [--text TEXT [--pair TEXT] | < lines] [flags]",
      R"(Prints per input its token count, the embedding's L2 norm and first 8 dimensions, and for each
--layers entry the hidden-state shape and the first 8 values of the [CLS] row. More inputs than
the server takes per request (its --max-inputs-per-request) are sent in several calls, in order.
From stdin every line is one input, so input i is line i+1: an empty line is an error that
names it, never skipped. --jsonl lines carry "index", "line" and "text", so each vector maps
back to its input.
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
       EncoderCommonFlags()},
      R"EX(  attnctl encode --text "The cat sat on the mat."
  attnctl encode --text "A man is eating." --pair "Someone eats." --pooling cls
  attnctl encode --text "hello" --layers 0,-1 --dtype bfloat16
  attnctl encode --text "red kettle, 1.7 litres" --sparse
  attnctl encode --long-text chunk --text "$(cat chapter.txt)"
  attnctl encode --jsonl < sentences.txt > embeddings.jsonl
)EX",
      RunEncode};
}

}  // namespace attn::client::attnctl
