#include "server/core/explain.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/long_text.h"

namespace attn::server::core {

namespace {

constexpr int kDefaultSteps = 32;

const char* MethodName(AttributionMethod method) {
  switch (method) {
    case AttributionMethod::kPairwise:
      return "ATTRIBUTION_PAIRWISE";
    case AttributionMethod::kIntegratedGradients:
      return "ATTRIBUTION_INTEGRATED_GRADIENTS";
    case AttributionMethod::kGradientXInput:
      return "ATTRIBUTION_GRADIENT_X_INPUT";
  }
  return "";
}

}  // namespace

absl::StatusOr<ExplainPlan> PrepareExplain(const Model& model, const ExplainRequest& request,
                                           const RequestLimits& limits,
                                           const LowerBoundCheck<ExplainPlan>& /*check*/) {
  ExplainPlan plan;
  AttributionOptions& options = plan.options;
  switch (request.method) {
    case ExplainMethod::kUnspecified:
    case ExplainMethod::kPairwise:
      options.method = AttributionMethod::kPairwise;
      break;
    case ExplainMethod::kIntegratedGradients:
      options.method = AttributionMethod::kIntegratedGradients;
      break;
    case ExplainMethod::kGradientXInput:
      options.method = AttributionMethod::kGradientXInput;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("method: unknown value ", static_cast<int>(request.method),
                       "; use ATTRIBUTION_PAIRWISE, ATTRIBUTION_INTEGRATED_GRADIENTS or "
                       "ATTRIBUTION_GRADIENT_X_INPUT"));
  }
  switch (request.baseline) {
    case ExplainBaseline::kUnspecified:
    case ExplainBaseline::kPadTokens:
      options.baseline = AttributionBaseline::kPadTokens;
      break;
    case ExplainBaseline::kMaskTokens:
      options.baseline = AttributionBaseline::kMaskTokens;
      break;
    case ExplainBaseline::kZero:
      options.baseline = AttributionBaseline::kZero;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("baseline: unknown value ", static_cast<int>(request.baseline),
                       "; use BASELINE_PAD_TOKENS, BASELINE_MASK_TOKENS or BASELINE_ZERO"));
  }
  options.steps = request.steps.value_or(kDefaultSteps);
  if (options.steps < 1 || options.steps > options.max_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps is ", options.steps, "; use 1 to ", options.max_steps,
                     " interpolation steps (unset = ", kDefaultSteps, ")"));
  }
  const int num_layers = model.config().num_hidden_layers;
  if (request.layer < 0 || request.layer > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer is ", request.layer, "; use 0 to ",
                                                   num_layers, " (0 = the input embeddings, ",
                                                   num_layers, " = the last hidden states)"));
  }
  options.layer = request.layer;
  options.word_level = request.word_level;
  if (model.sentence_config().pooling == PoolingMode::kMax) {
    return absl::FailedPreconditionError(
        "Explain needs a model that pools with mean or CLS; this one pools with max");
  }

  if (request.documents.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request has no documents; send 1 to ", limits.max_explain_documents));
  }
  if (static_cast<int64_t>(request.documents.size()) > limits.max_explain_documents) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request has ", request.documents.size(), " documents, more than the limit of ",
        limits.max_explain_documents, " (--max-explain-documents); split it into several calls"));
  }
  const bool pairwise = options.method == AttributionMethod::kPairwise;
  const int token_limit = std::min(
      {pairwise ? options.max_pairwise_tokens : options.max_tokens, model.max_positions()});
  // Tokenized up to the limit and the look-ahead only (long_text.h); a longer text is refused
  // below, with its length or, past the look-ahead, a lower bound of it.
  TruncationOptions bounded;
  bounded.max_length = token_limit;
  bounded.look_ahead = kTokenizerLookAhead;
  auto tokenize = [&](std::string_view text, const std::string& where) -> absl::Status {
    if (text.empty()) return absl::InvalidArgumentError(where + " is empty");
    absl::StatusOr<Encoding> encoding = model.tokenizer().Encode(text, bounded);
    if (!encoding.ok()) {
      return absl::Status(encoding.status().code(),
                          absl::StrCat(where, ": ", encoding.status().message()));
    }
    if (std::count(encoding->special_tokens_mask.begin(), encoding->special_tokens_mask.end(), 0) ==
        0) {
      return absl::InvalidArgumentError(
          where +
          " has no tokens besides [CLS]/[SEP] (only spaces or control characters): "
          "nothing to attribute");
    }
    if (encoding->truncated) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has ", encoding->untruncated_length_is_lower_bound ? "at least " : "",
          encoding->untruncated_length, " tokens, more than the limit of ", token_limit, " for ",
          MethodName(options.method),
          pairwise ? " (its cost grows as steps x tokens^2; ATTRIBUTION_INTEGRATED_GRADIENTS "
                     "takes up to " +
                         std::to_string(std::min(options.max_tokens, model.max_positions())) + ")"
                   : "",
          "; Explain does not truncate: shorten the text"));
    }
    plan.inputs.total_tokens += encoding->size();
    plan.inputs.encodings.push_back(std::move(*encoding));
    return absl::OkStatus();
  };
  if (absl::Status status = tokenize(request.query, "query"); !status.ok()) return status;
  for (size_t i = 0; i < request.documents.size(); ++i) {
    if (absl::Status status = tokenize(request.documents[i], absl::StrCat("documents[", i, "]"));
        !status.ok()) {
      return status;
    }
  }
  const int64_t query_tokens = plan.inputs.encodings[0].size();
  for (size_t i = 1; i < plan.inputs.encodings.size(); ++i) {
    plan.cost_tokens += AttributionCostTokens(model.config(), options, query_tokens,
                                              plan.inputs.encodings[i].size());
  }
  return plan;
}

RequestCost EstimateCost(const Model& model, const ExplainPlan& plan, int64_t version_bytes) {
  const BertConfig& c = model.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, heads = c.num_attention_heads;
  const int64_t layers = std::max(1, c.num_hidden_layers - plan.options.layer);
  const bool pairwise = plan.options.method == AttributionMethod::kPairwise;
  const bool gxi_only = plan.options.method == AttributionMethod::kGradientXInput;
  const int64_t m = gxi_only ? 1 : plan.options.steps;
  const int64_t Ta = plan.inputs.encodings[0].size();
  // Response: generous per-token and per-word figures (a Token and a Word message with their
  // texts are under 64 bytes each; floats 5 bytes packed), the pair matrices in fp32.
  auto text_bytes = [](int64_t T) { return T * (64 + 64 + 4 * 5); };
  RequestCost cost;
  cost.response_bytes = 256 + version_bytes + text_bytes(Ta);
  int64_t largest_working = 0;
  for (size_t i = 1; i < plan.inputs.encodings.size(); ++i) {
    const int64_t Tb = plan.inputs.encodings[i].size();
    const int64_t matrix = pairwise ? 2 * Ta * Tb * 4 + 32 : 0;  // tokens and words
    cost.response_bytes += 128 + text_bytes(Ta) + text_bytes(Tb) + matrix;
    // One text's run of path points at a time: the training forward's saved activations (as
    // the engine's PointsPerRun caps them at 256 MB), its gradient, and the JVP batch.
    const int64_t T = std::max(Ta, Tb);
    const int64_t per_point = layers * T * 4 * (8 * H + 2 * I + heads * T);
    const int64_t points =
        std::min<int64_t>(m + 2, std::max<int64_t>(1, (int64_t{256} << 20) / per_point));
    int64_t working = points * per_point + 2 * points * T * H * 4 + 6 * T * H * 4;
    if (pairwise) working += kJvpBatchRows * (3 * H + 2 * H + I) * 4 + heads * T * T * 4;
    largest_working = std::max(largest_working, working);
  }
  // The documents run one after the other; the response is built, then serialised.
  cost.working_bytes = largest_working + 3 * cost.response_bytes;
  return cost;
}

absl::Status RunExplain(const Model& model, ExplainPlan* plan, const std::function<bool()>& yield) {
  using Clock = std::chrono::steady_clock;
  AttributionOptions options = plan->options;
  options.checkpoint = yield;
  const Encoding& query = plan->inputs.encodings[0];
  plan->results.clear();
  for (size_t i = 1; i < plan->inputs.encodings.size(); ++i) {
    const auto start = Clock::now();
    absl::StatusOr<AttributionResult> attribution =
        ExplainSimilarity(model.config(), model.weights(), model.sentence_config(),
                          model.tokenizer(), query, plan->inputs.encodings[i], options);
    if (!attribution.ok()) {
      if (attribution.status().code() == absl::StatusCode::kCancelled) {
        return attribution.status();
      }
      return absl::Status(attribution.status().code(),
                          absl::StrCat("documents[", i - 1, "]: ", attribution.status().message()));
    }
    ExplainResult result;
    result.document = plan->inputs.encodings[i];
    result.attribution = std::move(*attribution);
    result.inference_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    plan->results.push_back(std::move(result));
  }
  return absl::OkStatus();
}

}  // namespace attn::server::core
