// Classify and Rerank: an Encode of the inputs pinned to one version, then the version's
// classification head (or a cosine) per input on the batcher thread. A head reads what it was
// trained on (engine/training/trainer.cc): a text head the model's pooled embedding
// L2-normalised, whatever the model's default normalisation; a pair head the segment product
// of the jointly encoded pair's last layer (engine/ops/segment_product.h).
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/segment_product.h"
#include "server/core/serving_core.h"

namespace attn::server::core {

namespace {

// The Encode of `inputs` that the head (or the cosine) reads, pinned to `model`'s `version` so a
// change of the served default between the head's lookup and the engine run cannot mix versions.
EncodeRequest HeadInputEncode(const std::string& model, const std::string& version,
                              std::vector<Input> inputs, const TokenizationOptions& tokenization,
                              bool pair_head) {
  EncodeRequest encode;
  encode.token_embeddings = pair_head;
  encode.model = model;
  encode.model_version = version;
  encode.inputs = std::move(inputs);
  encode.tokenization = tokenization;
  encode.pooling = Pooling::kModelDefault;
  encode.normalize = true;
  return encode;
}

Input TextInput(std::string_view text) {
  Input input;
  input.kind = Input::Kind::kText;
  input.text = text;
  return input;
}

Input PairInput(std::string_view first, std::string_view second) {
  Input input;
  input.kind = Input::Kind::kPair;
  input.text = first;
  input.second = second;
  return input;
}

// logits (K) and probabilities (K) of one encoded input through `head`.
absl::Status HeadProbabilities(const VersionHead& head, const EncodeResult& result,
                               std::vector<float>* logits, std::vector<float>* probabilities) {
  const int64_t k = head.head.num_labels();
  logits->resize(k);
  probabilities->resize(k);
  const float* input = result.embedding.data();
  std::vector<float> feature;  // (H)
  if (head.pairs) {
    const MatrixView& tokens = result.token_embeddings;
    feature.resize(tokens.cols);
    if (absl::Status status =
            SegmentProductForward(tokens.data, tokens.cols, {0, tokens.rows},
                                  result.encoding.type_ids.data(), feature.data(), nullptr);
        !status.ok()) {
      // Truncation can cut the second text away entirely.
      return absl::InvalidArgumentError(absl::StrCat(
          status.message(), "; if the first text fills the maximum length, shorten it"));
    }
    input = feature.data();
  }
  ClassificationHeadForward(head.head, input, 1, logits->data());
  Softmax(logits->data(), k, probabilities->data());
  return absl::OkStatus();
}

}  // namespace

void ServingCore::Classify(const ClassifyRequest& request, const CallControl& control,
                           Done<ClassifyResponse> done) {
  auto answer = [&](absl::Status status) {
    done(UnlessDropped(control, std::move(status), "queue", metrics_));
  };
  absl::StatusOr<Resolved> resolved = Resolve(request.model, request.model_version);
  if (!resolved.ok()) return answer(resolved.status());
  const ServedModel& served = *resolved->served;
  const ModelVersion* const version = &resolved->version;
  absl::StatusOr<std::shared_ptr<const VersionHead>> head =
      heads_.Get(served.store, version->version, version->model->config().hidden_size);
  if (!head.ok()) return answer(head.status());
  if (request.top_k < 0) {
    return answer(absl::InvalidArgumentError(
        absl::StrCat("top_k is ", request.top_k, "; give 0 (every label) or a positive count")));
  }
  // A head reads what it was trained on: single texts, or pairs encoded together.
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const Input::Kind kind = request.inputs[i].kind;
    if ((*head)->pairs && kind == Input::Kind::kText) {
      return answer(absl::InvalidArgumentError(
          absl::StrCat("inputs[", i, "] is a single text but version ", version->version,
                       "'s head was trained on text pairs (pair_classification): send a pair")));
    }
    if (!(*head)->pairs && kind == Input::Kind::kPair) {
      return answer(absl::InvalidArgumentError(
          absl::StrCat("inputs[", i, "] is a text pair but version ", version->version,
                       "'s head was trained on single texts (classification): send a text")));
    }
  }
  const int64_t labels = (*head)->head.num_labels();
  const int64_t top_k = request.top_k == 0 ? labels : std::min<int64_t>(request.top_k, labels);
  Encode(HeadInputEncode(served.name, version->version, request.inputs, request.tokenization,
                         (*head)->pairs),
         control,
         [head = *head, top_k, done = std::move(done)](absl::StatusOr<EncodeResponse> encoded) {
           if (!encoded.ok()) return done(encoded.status());
           ClassifyResponse response;
           response.model_version = encoded->model_version;
           response.metadata = encoded->metadata;
           response.admission = encoded->admission;
           std::vector<float> logits, probabilities;
           std::vector<int32_t> order(head->head.num_labels());
           for (const EncodeResult& result : encoded->results) {
             if (absl::Status status = HeadProbabilities(*head, result, &logits, &probabilities);
                 !status.ok()) {
               return done(status);
             }
             for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int32_t>(k);
             // Most probable first; ties by label index, so answers are deterministic.
             std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
               return probabilities[a] > probabilities[b];
             });
             std::vector<LabelScore>& scores = response.results.emplace_back();
             for (int64_t rank = 0; rank < top_k; ++rank) {
               const int32_t label = order[rank];
               scores.push_back(
                   {label, head->label_names.empty() ? std::string() : head->label_names[label],
                    probabilities[label], logits[label]});
             }
           }
           done(std::move(response));
         });
}

void ServingCore::Rerank(const RerankRequest& request, const CallControl& control,
                         Done<RerankResponse> done) {
  auto answer = [&](absl::Status status) {
    done(UnlessDropped(control, std::move(status), "queue", metrics_));
  };
  absl::StatusOr<Resolved> resolved = Resolve(request.model, request.model_version);
  if (!resolved.ok()) return answer(resolved.status());
  const ServedModel& served = *resolved->served;
  const ModelVersion* const version = &resolved->version;
  const int max_documents = options_.limits.max_inputs_per_request - 1;  // the query takes one
  const size_t documents = request.documents.size();
  if (request.query.empty()) return answer(absl::InvalidArgumentError("query is empty"));
  if (documents == 0 || documents > static_cast<size_t>(max_documents)) {
    return answer(absl::InvalidArgumentError(
        absl::StrCat("the request has ", documents, " documents; send 1 to ", max_documents,
                     " (--max-inputs-per-request less one for the query) per call")));
  }
  for (size_t i = 0; i < documents; ++i) {
    if (request.documents[i].empty()) {
      return answer(absl::InvalidArgumentError(absl::StrCat("documents[", i, "] is empty")));
    }
  }
  if (request.top_n < 0) {
    return answer(absl::InvalidArgumentError(
        absl::StrCat("top_n is ", request.top_n, "; give 0 (all documents) or a positive count")));
  }
  RerankMethod method = request.method;
  std::shared_ptr<const VersionHead> head;
  switch (method) {
    case RerankMethod::kCosine:
      break;
    case RerankMethod::kUnspecified:
    case RerankMethod::kCrossEncoder: {
      absl::StatusOr<std::shared_ptr<const VersionHead>> found =
          heads_.Get(served.store, version->version, version->model->config().hidden_size);
      const bool cross_encoder = found.ok() && (*found)->pairs;
      if (method == RerankMethod::kUnspecified) {
        // A head that cannot be read is an error even here: silently falling back to cosine
        // would hide a damaged version.
        if (!found.ok() && !absl::IsFailedPrecondition(found.status())) {
          return answer(found.status());
        }
        method = cross_encoder ? RerankMethod::kCrossEncoder : RerankMethod::kCosine;
      } else if (!found.ok()) {
        return answer(found.status());
      } else if (!cross_encoder) {
        return answer(absl::FailedPreconditionError(absl::StrCat(
            "version ", version->version, "'s head was trained with the ", (*found)->objective,
            " objective, not pair_classification: it cannot score (query, document) pairs; use "
            "RERANK_COSINE or a version fine-tuned with PAIR_CLASSIFICATION")));
      }
      if (cross_encoder) head = *found;
      break;
    }
    default:
      return answer(absl::InvalidArgumentError(
          absl::StrCat("method: unknown value ", static_cast<int>(method))));
  }

  // Cosine: inputs[0] is the query, inputs[i + 1] documents[i]; cross-encoder: inputs[i] is the
  // pair (query, documents[i]).
  std::vector<Input> inputs;
  inputs.reserve(documents + 1);
  if (head == nullptr) {
    inputs.push_back(TextInput(request.query));
    for (std::string_view document : request.documents) {
      inputs.push_back(TextInput(document));
    }
  } else {
    for (std::string_view document : request.documents) {
      inputs.push_back(PairInput(request.query, document));
    }
  }
  std::vector<std::string> texts;  // kept for the response when asked
  if (request.return_documents) texts.assign(request.documents.begin(), request.documents.end());
  const int64_t top_n = request.top_n == 0 ? static_cast<int64_t>(documents)
                                           : std::min<int64_t>(request.top_n, documents);
  const bool pairs = head != nullptr;
  Encode(HeadInputEncode(served.name, version->version, std::move(inputs), request.tokenization,
                         pairs),
         control,
         [head, method, top_n, texts = std::move(texts), pairs,
          done = std::move(done)](absl::StatusOr<EncodeResponse> encoded) mutable {
           if (!encoded.ok()) {
             const absl::Status& status = encoded.status();
             if (!absl::IsInvalidArgument(status)) return done(status);
             // Encode names its inputs; say how they map to the query and documents.
             return done(absl::InvalidArgumentError(
                 absl::StrCat(status.message(),
                              pairs ? " (inputs[i] is the pair of the query and documents[i])"
                                    : " (inputs[0] is the query, inputs[i + 1] is documents[i])")));
           }
           RerankResponse response;
           response.model_version = encoded->model_version;
           response.method = method;
           response.metadata = encoded->metadata;
           response.admission = encoded->admission;
           const std::vector<EncodeResult>& results = encoded->results;
           std::vector<float> scores;
           if (pairs) {
             std::vector<float> logits, probabilities;
             for (const EncodeResult& result : results) {
               if (absl::Status status = HeadProbabilities(*head, result, &logits, &probabilities);
                   !status.ok()) {
                 return done(status);
               }
               scores.push_back(probabilities[1]);  // label 1 = relevant
             }
           } else {
             const std::vector<float>& query = results[0].embedding;
             for (size_t i = 1; i < results.size(); ++i) {
               double dot = 0;
               for (size_t j = 0; j < query.size(); ++j) dot += query[j] * results[i].embedding[j];
               scores.push_back(static_cast<float>(dot));
             }
           }
           std::vector<int32_t> order(scores.size());
           for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
           std::stable_sort(order.begin(), order.end(),
                            [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
           for (int64_t rank = 0; rank < top_n; ++rank) {
             RerankResult& result = response.results.emplace_back();
             result.index = order[rank];
             result.score = scores[order[rank]];
             if (!texts.empty()) result.document = std::move(texts[order[rank]]);
           }
           done(std::move(response));
         });
}

}  // namespace attn::server::core
