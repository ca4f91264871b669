#include "server/core/version_compare.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model_store.h"
#include "engine/quote.h"
#include "server/core/batcher.h"
#include "server/core/serving_core.h"
#include "server/core/version_tasks.h"

namespace attn::server::core {

namespace {

using Clock = std::chrono::steady_clock;

// Tokenizes `texts` named `field` with the model's default truncation.
absl::StatusOr<std::vector<SequenceInput>> TokenizeTexts(const Model& model,
                                                         const std::vector<std::string>& texts,
                                                         const char* field,
                                                         std::vector<Encoding>* encodings) {
  TruncationOptions truncation;
  truncation.max_length = model.default_max_length();
  std::vector<SequenceInput> sequences;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] is empty"));
    }
    if (texts[i].size() > kMaxProbeBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] has ", texts[i].size(),
                                                     " bytes; the limit is ", kMaxProbeBytes));
    }
    absl::StatusOr<Encoding> encoding = model.tokenizer().Encode(texts[i], truncation);
    if (!encoding.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", encoding.status().message()));
    }
    sequences.push_back({encoding->ids, encoding->type_ids});
    if (encodings != nullptr) encodings->push_back(*std::move(encoding));
  }
  return sequences;
}

// Code points in UTF-8 text (bytes that do not continue a character).
size_t CountChars(const std::string& text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

}  // namespace

const std::vector<std::string>& DefaultProbes() {
  static const std::vector<std::string>* const probes = new std::vector<std::string>{
#include "server/core/default_probes.inc"
  };
  return *probes;
}

void CompareVersions(const ModelSet& models, const CompareVersionsRequest& request,
                     const CallControl& control,
                     std::function<void(absl::StatusOr<CompareVersionsResponse>)> done) {
  const auto start = Clock::now();
  if (request.probes.size() > static_cast<size_t>(kMaxProbes) ||
      (!request.probes.empty() && request.probes.size() < static_cast<size_t>(kMinProbes))) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "the request has ", request.probes.size(), " probes; give ", kMinProbes, " to ", kMaxProbes,
        " probe texts, or none for the built-in ", DefaultProbes().size())));
  }
  if (request.top_heads < 0) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("top_heads is ", request.top_heads, "; give 0 (10) or a positive count")));
  }
  absl::StatusOr<const ServedModel*> served_a = models.Find(request.model);
  if (!served_a.ok()) return done(served_a.status());
  absl::StatusOr<const ServedModel*> served_b =
      request.model_b.empty() ? served_a : models.Find(request.model_b);
  if (!served_b.ok()) return done(served_b.status());
  absl::StatusOr<ModelVersion> version_a = FindVersion(**served_a, request.version_a, "version_a");
  if (!version_a.ok()) return done(version_a.status());
  absl::StatusOr<ModelVersion> version_b = FindVersion(**served_b, request.version_b, "version_b");
  if (!version_b.ok()) return done(version_b.status());
  std::shared_ptr<const Model> a = version_a->model, b = version_b->model;
  if (absl::Status comparable = CheckComparable(*a, *b); !comparable.ok()) {
    return done(absl::FailedPreconditionError(absl::StrCat(
        "model ", (*served_a)->name, " version ", version_a->version, " vs model ",
        (*served_b)->name, " version ", version_b->version, ": ", comparable.message())));
  }
  const int64_t hidden = a->config().hidden_size;
  absl::StatusOr<std::optional<VersionHead>> head_a = StoredHead(**served_a, *version_a, hidden);
  if (!head_a.ok()) return done(head_a.status());
  absl::StatusOr<std::optional<VersionHead>> head_b = StoredHead(**served_b, *version_b, hidden);
  if (!head_b.ok()) return done(head_b.status());
  const bool default_probes = request.probes.empty();
  absl::StatusOr<std::vector<SequenceInput>> probes =
      TokenizeTexts(*a, default_probes ? DefaultProbes() : request.probes, "probes", nullptr);
  if (!probes.ok()) return done(probes.status());
  auto response = std::make_shared<CompareVersionsResponse>();
  response->model = (*served_a)->name;
  response->version_a = version_a->version;
  response->version_b = version_b->version;
  response->default_probes = default_probes;
  const int top_heads = request.top_heads == 0 ? 10 : request.top_heads;
  // Two forwards with every attention map per probe, and the weights read once.
  const int64_t tokens = 2 * CountTokens(*probes);
  SubmitTask<CompareVersionsResponse>(
      **served_a, a, tokens, control,
      [a, b, probes = *std::move(probes), top_heads, start, head_a = *std::move(head_a),
       head_b = *std::move(head_b)](const std::function<bool()>& yield,
                                    CompareVersionsResponse* out) -> absl::Status {
        out->weights = CompareWeights(a->config(), a->weights(), b->weights());
        if (head_a && head_b) AddHeadChange(head_a->head, head_b->head, &out->weights);
        absl::StatusOr<ProbeComparison> compared = CompareOnProbes(*a, *b, probes, yield);
        if (!compared.ok()) return compared.status();
        out->probes = *std::move(compared);
        std::vector<int>& order = out->most_changed_heads;
        order.resize(out->probes.attention_js.size());
        std::iota(order.begin(), order.end(), 0);
        const std::vector<double>& js = out->probes.attention_js;
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return js[x] > js[y]; });
        order.resize(std::min<size_t>(order.size(), top_heads));
        out->verdict = DecideReindex(out->probes);
        out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
        return absl::OkStatus();
      },
      [response, done = std::move(done)](absl::StatusOr<CompareVersionsResponse> result) {
        if (!result.ok()) return done(result.status());
        result->model = response->model;
        result->version_a = response->version_a;
        result->version_b = response->version_b;
        result->default_probes = response->default_probes;
        done(std::move(result));
      });
}

void Neighbors(const ModelSet& models, const NeighborsRequest& request, const CallControl& control,
               std::function<void(absl::StatusOr<NeighborsResponse>)> done) {
  const bool has_word = !request.word.empty();
  if (has_word == request.token_id.has_value()) {
    return done(
        absl::InvalidArgumentError("give either a word or a token_id (exactly one of them)"));
  }
  if (has_word && CountChars(request.word) > kMaxWordChars) {
    return done(absl::InvalidArgumentError(absl::StrCat("word has ", CountChars(request.word),
                                                        " characters; the limit is ", kMaxWordChars,
                                                        " (", QuoteInput(request.word), ")")));
  }
  if (request.top_k < 0 || request.top_k > kMaxNeighbours) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "top_k is ", request.top_k, "; give 0 (10) to ", kMaxNeighbours, " neighbours")));
  }
  if (request.sentences.size() == 1 || request.sentences.size() > kMaxSentences) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("the request has ", request.sentences.size(), " sentences; give 2 to ",
                     kMaxSentences, " (or none for static neighbours only)")));
  }
  absl::StatusOr<const ServedModel*> served = models.Find(request.model);
  if (!served.ok()) return done(served.status());
  if (!request.version.empty()) {
    if (absl::Status valid = ValidateVersionName(request.version); !valid.ok()) {
      return done(absl::InvalidArgumentError(absl::StrCat("version: ", valid.message())));
    }
  }
  absl::StatusOr<ModelVersion> version = (*served)->registry->Get(request.version);
  if (!version.ok()) return done(version.status());
  std::shared_ptr<const Model> model = version->model;
  const int num_layers = model->config().num_hidden_layers;
  const int layer = request.layer.value_or(num_layers);
  if (layer < 0 || layer > num_layers) {
    return done(absl::InvalidArgumentError(absl::StrCat("layer is ", layer,
                                                        "; use 0 (the embedding output) to ",
                                                        num_layers, " (the last layer)")));
  }
  auto response = std::make_shared<NeighborsResponse>();
  response->model_version = version->version;
  response->layer = layer;
  const WordPieceTokenizer& tokenizer = model->tokenizer();
  if (has_word) {
    absl::StatusOr<Encoding> encoding = tokenizer.Encode(request.word);
    if (!encoding.ok()) {
      return done(absl::InvalidArgumentError(absl::StrCat("word: ", encoding.status().message())));
    }
    for (size_t i = 0; i < encoding->ids.size(); ++i) {
      if (encoding->special_tokens_mask[i]) continue;
      response->word_ids.push_back(encoding->ids[i]);
    }
    if (response->word_ids.empty()) {
      return done(absl::InvalidArgumentError(
          absl::StrCat("word ", QuoteInput(request.word),
                       " has no tokens (only spaces or control characters)")));
    }
  } else {
    const int32_t id = *request.token_id;
    if (id < 0 || id >= model->config().vocab_size) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          "token_id is ", id, "; the vocabulary has ids 0 to ", model->config().vocab_size - 1)));
    }
    response->word_ids.push_back(id);
  }
  for (int32_t id : response->word_ids) response->word_tokens.push_back(tokenizer.IdToToken(id));
  absl::StatusOr<std::vector<SequenceInput>> sentences =
      TokenizeTexts(*model, request.sentences, "sentences", nullptr);
  if (!sentences.ok()) return done(sentences.status());
  std::vector<int64_t> starts;
  for (size_t i = 0; i < sentences->size(); ++i) {
    const int64_t start = FindSubsequence((*sentences)[i].token_ids, response->word_ids);
    if (start < 0) {
      return done(absl::InvalidArgumentError(
          absl::StrCat("sentences[", i, "] does not contain the word's tokens [",
                       absl::StrJoin(response->word_tokens, " "), "] (",
                       QuoteInput(request.sentences[i]), ")")));
    }
    starts.push_back(start);
  }
  const int top_k = request.top_k == 0 ? 10 : request.top_k;
  SubmitTask<NeighborsResponse>(
      **served, model, CountTokens(*sentences) + 1, control,
      [model, response, sentences = *std::move(sentences), starts, layer, top_k](
          const std::function<bool()>&, NeighborsResponse* out) -> absl::Status {
        *out = *response;
        out->neighbours = StaticNeighbours(model->weights().word_embeddings, out->word_ids, top_k);
        for (const TokenNeighbour& neighbour : out->neighbours) {
          out->neighbour_tokens.push_back(model->tokenizer().IdToToken(neighbour.id));
        }
        if (!sentences.empty()) {
          absl::StatusOr<ContextualSimilarity> contextual = ContextualNeighbours(
              *model, sentences, starts, static_cast<int64_t>(out->word_ids.size()), layer);
          if (!contextual.ok()) return contextual.status();
          out->contextual_cosine = std::move(contextual->cosine);
        }
        return absl::OkStatus();
      },
      std::move(done));
}

}  // namespace attn::server::core
