// attnctl classify and rerank: what a fine-tuned version's head says about texts (Classify), and
// documents ordered by their score against a query (Rerank).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"

ABSL_FLAG(int, top_k, 0, "labels printed per input, most probable first; 0 = all");
ABSL_FLAG(std::string, query, "", "the query documents are scored against");
ABSL_FLAG(std::string, documents, "",
          "file with one document per line (document i is line i+1; an empty line is an "
          "error); default: stdin");
ABSL_FLAG(int, top_n, 0, "documents returned, best first; 0 = all");
ABSL_FLAG(std::string, rerank_method, "auto",
          "auto (the version's pair head if it has one, else cosine) | cosine | cross-encoder");

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

int RunClassify(const Command& command) {
  v1::ClassifyRequest request;
  auto texts = ReadInputs();
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  FillInputs(*texts, request.mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  *request.mutable_tokenization() = *tokenization;
  request.set_model_version(absl::GetFlag(FLAGS_model_version));
  request.set_top_k(absl::GetFlag(FLAGS_top_k));

  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->Classify(request);
  if (!response.ok()) return RpcError(response.status(), client->target(), NamesOf(*texts));
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  for (int i = 0; i < response->results_size(); ++i) {
    const InputText* input = i < static_cast<int>(texts->size()) ? &(*texts)[i] : nullptr;
    std::printf("[%d] %s\n", i, input ? input->Describe().c_str() : "");
    std::vector<std::vector<std::string>> rows;
    for (const v1::LabelScore& label : response->results(i).labels()) {
      rows.push_back({absl::StrCat(label.label()), label.name().empty() ? "-" : label.name(),
                      absl::StrFormat("%.4f", label.probability())});
    }
    PrintTable({"label", "name", "probability"}, rows, "    ");
  }
  PrintMetadata(response->model_version(), response->metadata());
  return kExitOk;
}

int RunRerank(const Command& command) {
  v1::RerankRequest request;
  request.set_query(absl::GetFlag(FLAGS_query));
  if (request.query().empty()) return UsageError("rerank needs --query", &command);
  std::vector<std::string> documents;
  const std::string path = absl::GetFlag(FLAGS_documents);
  std::ifstream file;
  if (!path.empty()) {
    file.open(path);
    if (!file) return UsageError(absl::StrCat("cannot read --documents ", path), &command);
  } else if (::isatty(STDIN_FILENO)) {
    return UsageError("rerank reads the documents one per line from --documents FILE or stdin",
                      &command);
  }
  // Document i is line i+1: its index in the answer names its line.
  absl::StatusOr<std::vector<std::string>> lines =
      ReadInputLines(path.empty() ? std::cin : file, path.empty() ? "stdin" : path);
  if (!lines.ok()) return UsageError(std::string(lines.status().message()), &command);
  documents = *std::move(lines);
  if (documents.empty()) return UsageError("no documents (no lines)", &command);
  for (const std::string& document : documents) request.add_documents(document);
  request.set_top_n(absl::GetFlag(FLAGS_top_n));
  const std::string method = absl::AsciiStrToLower(absl::GetFlag(FLAGS_rerank_method));
  if (method == "auto") {
    request.set_method(v1::RERANK_METHOD_UNSPECIFIED);
  } else if (method == "cosine") {
    request.set_method(v1::RERANK_COSINE);
  } else if (method == "cross-encoder") {
    request.set_method(v1::RERANK_CROSS_ENCODER);
  } else {
    return UsageError(
        absl::StrCat("--rerank-method must be auto, cosine or cross-encoder, not '", method, "'"),
        &command);
  }
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  *request.mutable_tokenization() = *tokenization;
  request.set_model_version(absl::GetFlag(FLAGS_model_version));

  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->Rerank(request);
  if (!response.ok()) return RpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  std::printf(
      "query: %s (%s)\n", ShortText(request.query()).c_str(),
      response->method() == v1::RERANK_CROSS_ENCODER ? "cross-encoder probability" : "cosine");
  std::vector<std::vector<std::string>> rows;
  for (int rank = 0; rank < response->results_size(); ++rank) {
    const v1::RerankResult& r = response->results(rank);
    rows.push_back({absl::StrCat(rank + 1), absl::StrFormat("%.4f", r.score()),
                    absl::StrCat(r.index()), ShortText(documents.at(r.index()))});
  }
  PrintTable({"rank", "score", "doc", "text"}, rows, "    ");
  PrintMetadata(response->model_version(), response->metadata());
  return kExitOk;
}

}  // namespace

Command ClassifyCommand() {
  return {"classify",
          "labels and probabilities from a fine-tuned version's classification head",
          "attnctl classify --model-version V [--text TEXT [--pair TEXT] | < lines] [flags]",
          R"(Calls Classify: the version's head (trained by `attnctl finetune --objective
classification`, or pair_classification for text pairs) over each input's pooled embedding.
Prints the labels with their names (if the job gave --label-names) and probabilities.
)",
          {{"Flags", {{"top_k", "K"}}}, InputFlags(), EncoderCommonFlags()},
          R"(  attnctl classify --model-version ft-000002-20261125T031117Z --text "Vornak Zelto"
  attnctl classify --model-version ft-000003-... --text "a red kettle" --pair "Vornak Zelto"
  attnctl classify --model-version ft-000002-... --top-k 1 < texts.txt
)",
          RunClassify};
}

Command RerankCommand() {
  return {
      "rerank",
      "documents ordered by their score against a query (cosine or cross-encoder)",
      "attnctl rerank --query TEXT [--documents FILE | < documents] [flags]",
      R"(Calls Rerank: the cosine of the query's and each document's embedding, or, for a version
fine-tuned with --objective pair_classification, its head's probability that the pair is
relevant. Prints the documents best first.
)",
      {{"Flags",
        {{"query", "TEXT"},
         {"documents", "FILE"},
         {"top_n", "N"},
         {"rerank_method", "M"},
         {"model_version", "V", "rerank with this version (default: the one served)"},
         {"max_length", "N"},
         {"truncation", "SIDE"}}},
       EncoderCommonFlags()},
      R"(  printf 'Vornak Zelto\nQuellix Prynn\n' | attnctl rerank --query "a red kettle"
  attnctl rerank --query "cheap flights" --documents documents.txt --top-n 3
)",
      RunRerank};
}

}  // namespace attn::client::attnctl
