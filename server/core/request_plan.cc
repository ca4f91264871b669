#include "server/core/request_plan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/core/input_errors.h"

namespace attn::server::core {

namespace {

absl::StatusOr<WireDType> ResolveDType(OutputDType dtype, const char* field) {
  switch (dtype) {
    case OutputDType::kUnspecified:
    case OutputDType::kFloat32:
      return WireDType::kFloat32;
    case OutputDType::kFloat16:
      return WireDType::kFloat16;
    case OutputDType::kBFloat16:
      return WireDType::kBFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ": unknown dtype ",
                                                     static_cast<int>(dtype),
                                                     "; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
}

// Resolves layer indices (negatives count from the end) and rejects out-of-range or repeated
// ones. Valid range is [0, count); `what` names the field.
absl::StatusOr<std::vector<int>> ResolveIndices(absl::Span<const int32_t> raw, int count,
                                                const std::string& what,
                                                const std::string& meaning) {
  std::vector<int> resolved;
  std::set<int> seen;
  for (int i = 0; i < static_cast<int>(raw.size()); ++i) {
    const int index = raw[i] < 0 ? raw[i] + count : raw[i];
    if (index < 0 || index >= count) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] = ", raw[i], " is outside [",
                                                     -count, ", ", count - 1, "]", meaning));
    }
    if (!seen.insert(index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] = ", raw[i], " repeats layer ", index));
    }
    resolved.push_back(index);
  }
  return resolved;
}

// The BM42 encoder of a model directory (its stop words and stemmer), made once per directory:
// fine-tuned versions share their base's tokenizer and stop words.
absl::StatusOr<std::shared_ptr<const Bm42Encoder>> Bm42For(const Model& model) {
  static absl::Mutex mutex(absl::kConstInit);
  static auto* encoders = new std::map<std::string, std::shared_ptr<const Bm42Encoder>>();
  absl::MutexLock lock(&mutex);
  auto it = encoders->find(model.model_dir());
  if (it != encoders->end()) return it->second;
  absl::StatusOr<std::unique_ptr<Bm42Encoder>> made =
      Bm42Encoder::Create(model.tokenizer(), model.model_dir());
  if (!made.ok()) return made.status();
  std::shared_ptr<const Bm42Encoder> shared = std::move(*made);
  encoders->emplace(model.model_dir(), shared);
  return shared;
}

// The checks of the input list as a whole; the truncation it asks for.
absl::StatusOr<TruncationOptions> CheckInputList(const Model& model, size_t count,
                                                 const TokenizationOptions& tokenization,
                                                 const RequestLimits& limits) {
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the request has no inputs; send 1 to ",
                                                   limits.max_inputs_per_request, " inputs"));
  }
  if (static_cast<int64_t>(count) > limits.max_inputs_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request has ", count, " inputs, more than the limit of ",
        limits.max_inputs_per_request, " (--max-inputs-per-request); split it into several calls"));
  }
  return ResolveTruncation(model, tokenization);
}

// How a plan treats long inputs: Encode's as it says; other calls truncate or refuse.
const LongTextPlan& LongTextOf(const EncodePlan& plan) { return plan.long_text; }
const LongTextPlan& LongTextOf(const AttentionPlan&) {
  static const LongTextPlan kNone;
  return kNone;
}

// Runs `check` on `plan` with lower-bound encodings (then clears them) when there is a check
// and the input list as a whole is valid (else tokenizing reports what is wrong).
template <typename Request, typename Plan>
absl::Status CheckLowerBound(const Model& model, const Request& request,
                             const RequestLimits& limits, const LowerBoundCheck<Plan>& check,
                             Plan* plan) {
  if (!check) return absl::OkStatus();
  absl::StatusOr<TruncationOptions> truncation =
      CheckInputList(model, request.inputs.size(), request.tokenization, limits);
  if (!truncation.ok()) return absl::OkStatus();
  // Without truncation a text longer than max_length is an INVALID_ARGUMENT naming it and its
  // exact length, which only tokenizing it gives: such a request skips the check.
  if (!truncation->enabled) {
    for (const Input& input : request.inputs) {
      if (MinTokensOf(input.text) + MinTokensOf(input.second) > truncation->max_length) {
        return absl::OkStatus();
      }
    }
  }
  plan->inputs.encodings =
      LowerBoundEncodings(model, request.inputs, request.tokenization, LongTextOf(*plan).chunk);
  absl::Status status = check(*plan);
  plan->inputs.encodings.clear();
  return status;
}

// The lower-bound check (if any), then tokenizing into plan->inputs.
template <typename Request, typename Plan>
absl::Status CheckThenTokenize(const Model& model, const Request& request,
                               const RequestLimits& limits, const LowerBoundCheck<Plan>& check,
                               Plan* plan) {
  if (absl::Status affordable = CheckLowerBound(model, request, limits, check, plan);
      !affordable.ok()) {
    return affordable;
  }
  absl::StatusOr<TokenizedInputs> inputs =
      TokenizeInputs(model, request.inputs, request.tokenization, limits, LongTextOf(*plan));
  if (!inputs.ok()) return inputs.status();
  plan->inputs = std::move(*inputs);
  return absl::OkStatus();
}

const char* KindName(const Input& input) {
  switch (input.kind) {
    case Input::Kind::kPair:
      return "pair";
    case Input::Kind::kTokens:
      return "token ids";
    default:
      return "text";
  }
}

// One input's encoding: texts and pairs bounded (kept tokens plus the look-ahead, or a whole
// chunked text within the call's chunk budget), token ids as given or, when they must be this
// tokenizer's output, checked and truncated like a text. *text_like: long-text rules apply.
absl::StatusOr<Encoding> EncodeInput(const Model& model, const Input& input, int index,
                                     const TruncationOptions& truncation,
                                     const LongTextPlan& long_text, int64_t chunk_budget,
                                     bool* text_like) {
  const WordPieceTokenizer& tokenizer = model.tokenizer();
  const std::string where = absl::StrCat("inputs[", index, "]");
  // Tokenized as if truncated, then refused if it was (TRUNCATION_NONE): counting past the
  // look-ahead would only say "too long" later and at the cost of the whole text.
  TruncationOptions bounded = truncation;
  bounded.enabled = true;
  bounded.look_ahead = kTokenizerLookAhead;
  *text_like = input.kind == Input::Kind::kText;
  switch (input.kind) {
    case Input::Kind::kText: {
      if (input.text.empty()) return absl::InvalidArgumentError(where + ": text is empty");
      if (!long_text.chunk) return tokenizer.Encode(input.text, bounded);
      if (chunk_budget < 1) return TooLongToChunkError(index, long_text.max_chunked_tokens);
      TruncationOptions whole;
      whole.max_length = static_cast<int>(std::min<int64_t>(chunk_budget + 2, INT32_MAX));
      whole.look_ahead = 0;
      absl::StatusOr<Encoding> encoding = tokenizer.Encode(input.text, whole);
      if (encoding.ok() && encoding->truncated) {
        return TooLongToChunkError(index, long_text.max_chunked_tokens);
      }
      return encoding;
    }
    case Input::Kind::kPair:
      if (input.text.empty()) return absl::InvalidArgumentError(where + ": pair.first is empty");
      if (input.second.empty()) {
        return absl::InvalidArgumentError(where + ": pair.second is empty");
      }
      if (long_text.chunk) {
        return absl::InvalidArgumentError(
            where +
            ": a pair cannot be chunked (long_text LONG_TEXT_CHUNK splits single texts); "
            "send pairs without long_text, or the two texts as inputs of their own");
      }
      return tokenizer.EncodePair(input.text, input.second, bounded);
    case Input::Kind::kTokens: {
      if (input.ids.empty()) return absl::InvalidArgumentError(where + ": tokens.ids is empty");
      if (!long_text.token_ids_from_tokenizer &&
          static_cast<int64_t>(input.ids.size()) > model.max_positions()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", input.ids.size(),
                                                       " token ids, more than the model's ",
                                                       model.max_positions(), " positions"));
      }
      if (!input.type_ids.empty() && input.type_ids.size() != input.ids.size()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", input.type_ids.size(),
                                                       " type_ids for ", input.ids.size(),
                                                       " ids; send none or one per id"));
      }
      // Ids that must be this tokenizer's output are checked for that first: ids of another
      // tokenizer fail it whatever their range, and the cause is what the caller needs to know.
      if (long_text.token_ids_from_tokenizer) {
        if (absl::Status own = CheckTokenizerOutput(tokenizer, input.ids, index); !own.ok()) {
          return own;
        }
      }
      absl::StatusOr<Encoding> encoding =
          tokenizer.FromIds(std::vector<int32_t>(input.ids.begin(), input.ids.end()),
                            std::vector<int32_t>(input.type_ids.begin(), input.type_ids.end()));
      if (!encoding.ok() || !long_text.token_ids_from_tokenizer) return encoding;
      *text_like = true;
      if (long_text.chunk && encoding->size() > chunk_budget + 2) {
        return TooLongToChunkError(index, long_text.max_chunked_tokens);
      }
      if (!long_text.chunk && truncation.enabled && encoding->size() > truncation.max_length) {
        return TruncateTokenizerOutput(*encoding, truncation);
      }
      return encoding;
    }
    case Input::Kind::kNotSet:
      break;
  }
  return absl::InvalidArgumentError(where + ": empty input; set text, pair or tokens");
}

}  // namespace

absl::StatusOr<TruncationOptions> ResolveTruncation(const Model& model,
                                                    const TokenizationOptions& options) {
  const int mode = static_cast<int>(options.truncation);
  if (mode < static_cast<int>(Truncation::kUnspecified) ||
      mode > static_cast<int>(Truncation::kNone)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenization.truncation: unknown value ", mode,
                     "; use TRUNCATION_RIGHT, TRUNCATION_LEFT or TRUNCATION_NONE"));
  }
  TruncationOptions truncation;
  truncation.enabled = options.truncation != Truncation::kNone;
  truncation.side =
      options.truncation == Truncation::kLeft ? TruncationSide::kLeft : TruncationSide::kRight;
  if (options.max_length < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenization.max_length is ", options.max_length, "; use 0 for the model default (",
        model.default_max_length(), ") or a positive length"));
  }
  if (options.max_length > model.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenization.max_length ", options.max_length,
                                                   " is more than the model's ",
                                                   model.max_positions(), " positions"));
  }
  truncation.max_length = options.max_length == 0 ? model.default_max_length() : options.max_length;
  return truncation;
}

absl::StatusOr<TokenizedInputs> TokenizeInputs(const Model& model, absl::Span<const Input> inputs,
                                               const TokenizationOptions& tokenization,
                                               const RequestLimits& limits,
                                               const LongTextPlan& long_text) {
  absl::StatusOr<TruncationOptions> truncation =
      CheckInputList(model, inputs.size(), tokenization, limits);
  if (!truncation.ok()) return truncation.status();
  const int limit = truncation->max_length;
  int64_t chunk_budget = long_text.max_chunked_tokens;

  TokenizedInputs out;
  out.sequences.reserve(inputs.size());
  out.encodings.reserve(inputs.size());
  out.windows.reserve(inputs.size());
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
    const Input& input = inputs[i];
    bool text_like = false;
    absl::StatusOr<Encoding> encoding =
        EncodeInput(model, input, i, *truncation, long_text, chunk_budget, &text_like);
    if (!encoding.ok()) {
      if (GetInputError(encoding.status()).has_value() || IsTooLarge(encoding.status()) ||
          absl::StartsWith(encoding.status().message(), "inputs[")) {
        return encoding.status();
      }
      return absl::Status(encoding.status().code(),
                          absl::StrCat("inputs[", i, "]: ", encoding.status().message()));
    }
    const bool over = encoding->truncated || encoding->size() > limit;
    if (!truncation->enabled && over && (input.kind != Input::Kind::kTokens || text_like)) {
      return TooLongError(model, i, *encoding, KindName(input), limit);
    }
    if (long_text.chunk && text_like) {
      chunk_budget -= encoding->size();
      std::vector<SequenceInput> windows =
          SplitIntoWindows(*encoding, limit, long_text.overlap, model.tokenizer().cls_id(),
                           model.tokenizer().sep_id());
      out.windows.push_back(static_cast<int>(windows.size()));
      for (SequenceInput& window : windows) {
        out.total_tokens += static_cast<int64_t>(window.token_ids.size());
        out.sequences.push_back(std::move(window));
      }
    } else {
      out.windows.push_back(1);
      out.total_tokens += encoding->size();
      out.sequences.push_back({encoding->ids, encoding->type_ids});
    }
    out.encodings.push_back(std::move(*encoding));
  }
  return out;
}

int64_t MinTokensOf(std::string_view text) {
  int64_t words = 0;
  bool counted = false;  // the current word holds an ASCII letter or digit
  for (const char c : text) {
    // ASCII whitespace only: other separators are UTF-8 bytes >= 0x80, inside a "word" here,
    // which can only merge words and lower the count.
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      counted = false;
      continue;
    }
    if (!counted && std::isalnum(static_cast<unsigned char>(c))) {
      ++words;
      counted = true;
    }
  }
  return words;
}

std::vector<Encoding> LowerBoundEncodings(const Model& model, absl::Span<const Input> inputs,
                                          const TokenizationOptions& tokenization, bool chunk) {
  absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(model, tokenization);
  std::vector<Encoding> encodings(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& input = inputs[i];
    int64_t tokens = 0;
    switch (input.kind) {
      case Input::Kind::kText:
        tokens = MinTokensOf(input.text);
        break;
      case Input::Kind::kPair:
        tokens = MinTokensOf(input.text) + MinTokensOf(input.second);
        break;
      case Input::Kind::kTokens:
        tokens = std::min<int64_t>(static_cast<int64_t>(input.ids.size()), model.max_positions());
        break;
      case Input::Kind::kNotSet:
        break;
    }
    // Capped also without truncation: a longer text is refused by tokenizing, with the
    // INVALID_ARGUMENT that names it, not here.
    if (input.kind != Input::Kind::kTokens && truncation.ok() &&
        !(chunk && input.kind == Input::Kind::kText)) {
      tokens = std::min<int64_t>(tokens, truncation->max_length);
    }
    Encoding& e = encodings[i];
    const size_t n = static_cast<size_t>(tokens);
    e.ids.assign(n, 0);
    e.type_ids.assign(n, 0);
    e.char_start.assign(n, 0);
    e.char_end.assign(n, 0);
    e.byte_start.assign(n, 0);
    e.byte_end.assign(n, 0);
    e.special_tokens_mask.assign(n, 0);
    e.sequence_index.assign(n, 0);
  }
  return encodings;
}

absl::StatusOr<EncodePlan> PrepareEncode(const Model& model, const EncodeRequest& request,
                                         const RequestLimits& limits,
                                         const LowerBoundCheck<EncodePlan>& check) {
  EncodePlan plan;
  const int num_layers = model.config().num_hidden_layers;
  switch (request.pooling) {
    case Pooling::kModelDefault:
      plan.pooling = model.sentence_config().pooling;
      break;
    case Pooling::kCls:
      plan.pooling = PoolingMode::kCls;
      break;
    case Pooling::kMean:
      plan.pooling = PoolingMode::kMean;
      break;
    case Pooling::kMax:
      plan.pooling = PoolingMode::kMax;
      break;
    case Pooling::kNone:
      plan.pooling = std::nullopt;
      break;
    case Pooling::kClsAttention:
      plan.cls_attention_pooling = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("pooling: unknown value ", static_cast<int>(request.pooling),
                       "; use POOLING_MODEL_DEFAULT, POOLING_CLS, POOLING_MEAN, "
                       "POOLING_MAX, POOLING_NONE or POOLING_CLS_ATTENTION"));
  }
  plan.normalize = request.normalize.value_or(model.sentence_config().normalize);
  if (request.dimensions.has_value()) {
    const int hidden = model.config().hidden_size;
    if (*request.dimensions < 1 || *request.dimensions > hidden) {
      return absl::InvalidArgumentError(absl::StrCat("dimensions: ", *request.dimensions,
                                                     " is out of range; this model's "
                                                     "embeddings have ",
                                                     hidden, " dimensions, so give 1 .. ", hidden,
                                                     " (or leave it unset for all of them)"));
    }
    if (request.pooling == Pooling::kNone) {
      return absl::InvalidArgumentError(
          "dimensions truncates the pooled embedding, but pooling is POOLING_NONE; choose a "
          "pooling or leave dimensions unset");
    }
    plan.dimensions = *request.dimensions;
  }
  plan.token_embeddings = request.token_embeddings;
  plan.static_embeddings = request.static_embeddings;
  absl::StatusOr<WireDType> dtype = ResolveDType(request.output_dtype, "output_dtype");
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;
  absl::StatusOr<std::vector<int>> layers =
      ResolveIndices(request.hidden_layers, num_layers + 1, "hidden_layers",
                     absl::StrCat(" (0 = embedding output, ", num_layers,
                                  " = last layer, negatives count from the end)"));
  if (!layers.ok()) return layers.status();
  plan.hidden_layers = *layers;

  plan.forward.pool = false;
  plan.forward.hidden_layers = plan.hidden_layers;
  // The last layer feeds pooling and token embeddings.
  if (std::find(plan.hidden_layers.begin(), plan.hidden_layers.end(), num_layers) ==
      plan.hidden_layers.end()) {
    plan.forward.hidden_layers.push_back(num_layers);
  }
  plan.forward.static_embeddings = plan.static_embeddings;
  plan.sparse = request.sparse;
  if (plan.sparse) {
    absl::StatusOr<std::shared_ptr<const Bm42Encoder>> bm42 = Bm42For(model);
    if (!bm42.ok()) return bm42.status();
    plan.bm42 = *std::move(bm42);
  }
  // Attention pooling and BM42 read the last layer's [CLS] attention row.
  if (plan.cls_attention_pooling || plan.sparse) {
    plan.forward.attention_layers = {num_layers - 1};
    plan.forward.attention_probs = true;
  }
  // Long texts (a truncation setting that is invalid is reported by tokenizing).
  if (absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(model, request.tokenization);
      truncation.ok()) {
    absl::StatusOr<LongTextPlan> long_text =
        ResolveLongText(model, request, truncation->max_length, limits.max_request_memory_bytes);
    if (!long_text.ok()) return long_text.status();
    plan.long_text = *long_text;
  }

  if (absl::Status tokenized = CheckThenTokenize(model, request, limits, check, &plan);
      !tokenized.ok()) {
    return tokenized;
  }
  return plan;
}

absl::StatusOr<AttentionPlan> PrepareAttention(const Model& model, const AttentionRequest& request,
                                               const RequestLimits& limits,
                                               const LowerBoundCheck<AttentionPlan>& check) {
  AttentionPlan plan;
  const int num_layers = model.config().num_hidden_layers;
  const int num_heads = model.config().num_attention_heads;
  absl::StatusOr<std::vector<int>> layers =
      ResolveIndices(request.layers, num_layers, "layers",
                     " (0-based encoder layers; negatives count from the end)");
  if (!layers.ok()) return layers.status();
  plan.layers = *layers;
  if (plan.layers.empty()) {
    for (int l = 0; l < num_layers; ++l) plan.layers.push_back(l);
  }
  std::set<int> seen_heads;
  for (int i = 0; i < static_cast<int>(request.heads.size()); ++i) {
    const int head = request.heads[i];
    if (head < 0 || head >= num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("heads[", i, "] = ", head, " is outside [0, ", num_heads - 1, "]"));
    }
    if (!seen_heads.insert(head).second) {
      return absl::InvalidArgumentError(absl::StrCat("heads[", i, "] = ", head, " is repeated"));
    }
    plan.heads.push_back(head);
  }
  if (plan.heads.empty()) {
    for (int h = 0; h < num_heads; ++h) plan.heads.push_back(h);
  }
  plan.weights = request.include_weights.value_or(true);
  plan.scores = request.include_scores;
  plan.qkv = request.include_qkv;
  plan.mean_over_heads = request.mean_over_heads;
  plan.rollout = request.rollout;
  if (request.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k is ", request.top_k, "; use 0 for dense maps or k > 0"));
  }
  plan.top_k = request.top_k;
  if (!plan.weights && !plan.scores && !plan.qkv && !plan.mean_over_heads && !plan.rollout) {
    return absl::InvalidArgumentError(
        "nothing to return: include_weights is false and no scores, qkv, mean_over_heads or "
        "rollout was requested");
  }
  absl::StatusOr<WireDType> dtype = ResolveDType(request.output_dtype, "output_dtype");
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;

  plan.forward.pool = false;
  plan.forward.attention_probs = true;
  plan.forward.attention_scores = plan.scores;
  plan.forward.attention_qkv = plan.qkv;
  if (plan.rollout) {
    for (int l = 0; l < num_layers; ++l) plan.forward.attention_layers.push_back(l);
  } else {
    plan.forward.attention_layers = plan.layers;
  }

  if (absl::Status tokenized = CheckThenTokenize(model, request, limits, check, &plan);
      !tokenized.ok()) {
    return tokenized;
  }
  return plan;
}

RequestCost EstimateCost(const Model& model, const EncodePlan& p, int64_t version_bytes) {
  EncodeCostQuery query;
  query.pooled = p.pooling.has_value() || p.cls_attention_pooling;
  query.token_embeddings = p.token_embeddings;
  query.hidden_layers = static_cast<int>(p.hidden_layers.size());
  query.keeps_last_layer = p.forward.hidden_layers.size() == p.hidden_layers.size();
  query.static_embeddings = p.static_embeddings;
  query.dtype = p.dtype;
  if (!p.inputs.windows.empty()) {  // tokenized (not the lower bound): windows may be chunks
    query.windows = &p.inputs.windows;
    query.forward_tokens = p.inputs.total_tokens;
  }
  RequestCost cost = EstimateEncodeCost(model.config(), model.tokenizer(), p.inputs.encodings,
                                        query, version_bytes);
  if (p.cls_attention_pooling || p.sparse) {
    // The last layer's (heads, T, T) probabilities per input; a sparse vector holds at most one
    // (index, value) per token: <= 5 + 4 wire bytes, 8 bytes in memory, both held twice.
    // Per sequence the engine runs: a chunked input's windows each have their own.
    const int64_t heads = model.config().num_attention_heads;
    const bool tokenized = !p.inputs.sequences.empty();
    const size_t count = tokenized ? p.inputs.sequences.size() : p.inputs.encodings.size();
    for (size_t i = 0; i < count; ++i) {
      const int64_t T = tokenized ? static_cast<int64_t>(p.inputs.sequences[i].token_ids.size())
                                  : p.inputs.encodings[i].size();
      cost.working_bytes += heads * T * T * 4 + 4 * T;
      if (p.sparse) {  // never chunked
        cost.response_bytes += 8 + 9 * T;
        cost.working_bytes += 2 * (8 + 9 * T) + 8 * T;
      }
    }
  }
  return cost;
}

RequestCost EstimateCost(const Model& model, const AttentionPlan& p, int64_t version_bytes) {
  AttentionCostQuery query;
  query.layers = p.layers;
  query.heads = p.heads;
  query.weights = p.weights;
  query.scores = p.scores;
  query.qkv = p.qkv;
  query.mean_over_heads = p.mean_over_heads;
  query.rollout = p.rollout;
  query.top_k = p.top_k;
  query.dtype = p.dtype;
  return EstimateAttentionCost(model.config(), model.tokenizer(), p.inputs.encodings, query,
                               version_bytes);
}

}  // namespace attn::server::core
