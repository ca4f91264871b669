#include "server/core/long_text.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/cost_model.h"
#include "server/core/input_errors.h"

namespace attn::server::core {

namespace {

const char* TruncationName(Truncation truncation) {
  switch (truncation) {
    case Truncation::kRight:
      return "TRUNCATION_RIGHT";
    case Truncation::kLeft:
      return "TRUNCATION_LEFT";
    case Truncation::kNone:
      return "TRUNCATION_NONE";
    default:
      return "set";
  }
}

// What the output fields a chunked call cannot return are called, or nullptr.
const char* PerTokenOutput(const EncodeRequest& request) {
  if (request.token_embeddings) return "return_token_embeddings";
  if (!request.hidden_layers.empty()) return "hidden_layers";
  if (request.static_embeddings) return "return_static_embeddings";
  if (request.sparse) return "sparse";
  return nullptr;
}

}  // namespace

absl::StatusOr<LongTextPlan> ResolveLongText(const Model& model, const EncodeRequest& request,
                                             int max_length, int64_t max_request_memory_bytes) {
  LongTextPlan plan;
  plan.token_ids_from_tokenizer = request.token_ids_from_tokenizer;
  const int mode = static_cast<int>(request.long_text);
  if (mode != static_cast<int>(LongText::kUnspecified) &&
      mode != static_cast<int>(LongText::kChunk)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "long_text: unknown value ", mode,
        "; use LONG_TEXT_UNSPECIFIED (truncate or refuse, as tokenization.truncation says) or "
        "LONG_TEXT_CHUNK"));
  }
  plan.chunk = request.long_text == LongText::kChunk;
  if (!plan.chunk) {
    if (request.chunk_overlap.has_value()) {
      return absl::InvalidArgumentError(
          "chunk_overlap is set, but long_text is not LONG_TEXT_CHUNK; set long_text to "
          "LONG_TEXT_CHUNK or leave chunk_overlap unset");
    }
    return plan;
  }
  if (request.pooling == Pooling::kNone) {
    return absl::InvalidArgumentError(
        "long_text LONG_TEXT_CHUNK pools each window and averages the windows, but pooling is "
        "POOLING_NONE; choose a pooling or leave it unset");
  }
  if (const char* field = PerTokenOutput(request)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "long_text LONG_TEXT_CHUNK returns one pooled embedding per input; ", field,
        " is not available with it (ask for it without long_text, on texts within max_length)"));
  }
  if (request.tokenization.truncation != Truncation::kUnspecified) {
    return absl::InvalidArgumentError(absl::StrCat(
        "long_text LONG_TEXT_CHUNK embeds whole texts, but tokenization.truncation is ",
        TruncationName(request.tokenization.truncation), "; leave it unset"));
  }
  const int width = max_length - 2;  // [CLS] and [SEP] (<s> and </s>) take two
  if (width < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "long_text LONG_TEXT_CHUNK needs windows with room for text, but tokenization.max_length ",
        max_length, " leaves none besides the 2 special tokens; give 3 or more (0 = ",
        model.default_max_length(), ")"));
  }
  plan.overlap = request.chunk_overlap.value_or(max_length / 8);
  if (plan.overlap < 0 || plan.overlap >= width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_overlap ", plan.overlap, " is out of range: a window of max_length ", max_length,
        " holds ", width, " text tokens, so consecutive windows can share 0 .. ", width - 1,
        " of them (unset = ", max_length / 8, ")"));
  }
  // A lower bound of a pooled Encode's working memory per token (cost_model.h): the last
  // layer's hidden state, the token copies and the Token message held for the response.
  const int64_t per_token = 4 * model.config().hidden_size + 160;
  plan.max_chunked_tokens = std::max<int64_t>(1, max_request_memory_bytes / per_token);
  return plan;
}

std::vector<SequenceInput> SplitIntoWindows(const Encoding& encoding, int max_length, int overlap,
                                            int32_t cls_id, int32_t sep_id) {
  if (encoding.size() <= max_length) return {{encoding.ids, encoding.type_ids}};
  const int64_t n = encoding.size() - 2;  // the text's tokens, between [CLS] and [SEP]
  const int64_t width = max_length - 2, stride = width - overlap;
  std::vector<SequenceInput> windows;
  windows.reserve(static_cast<size_t>((n - width + stride - 1) / stride + 1));
  for (int64_t start = 0;; start += stride) {
    const int64_t end = std::min(n, start + width);
    SequenceInput window;
    window.token_ids.reserve(static_cast<size_t>(end - start + 2));
    window.token_ids.push_back(cls_id);
    window.token_ids.insert(window.token_ids.end(), encoding.ids.begin() + 1 + start,
                            encoding.ids.begin() + 1 + end);
    window.token_ids.push_back(sep_id);
    windows.push_back(std::move(window));
    if (end >= n) break;
  }
  return windows;
}

absl::Status CheckTokenizerOutput(const WordPieceTokenizer& tokenizer,
                                  absl::Span<const int32_t> ids, int index) {
  const int32_t cls = tokenizer.cls_id(), sep = tokenizer.sep_id();
  if (ids.size() >= 2 && ids.front() == cls && ids.back() == sep) return absl::OkStatus();
  InputError error;
  error.kind = InputError::Kind::kForeignTokenIds;
  error.index = index;
  error.cls_token = tokenizer.IdToToken(cls);
  error.sep_token = tokenizer.IdToToken(sep);
  error.cls_id = cls;
  error.sep_id = sep;
  return WithInputError(
      absl::InvalidArgumentError(absl::StrCat(
          "inputs[", index, "]: token ids that are not this model's tokenizer output: they must ",
          "start with ", error.cls_token, " (id ", cls, ") and end with ", error.sep_token, " (id ",
          sep, "), as Tokenize returns them; these ",
          ids.empty() ? std::string("are empty")
                      : absl::StrCat("start with ", ids.front(), " and end with ", ids.back()))),
      error);
}

Encoding TruncateTokenizerOutput(const Encoding& encoding, const TruncationOptions& truncation) {
  const int n = encoding.size();
  const int keep = truncation.max_length - 2;
  const int first = truncation.side == TruncationSide::kLeft ? n - 1 - keep : 1;
  std::vector<int> rows = {0};
  for (int k = first; k < first + keep; ++k) rows.push_back(k);
  rows.push_back(n - 1);
  auto pick = [&rows](const auto& all) {
    std::decay_t<decltype(all)> out;
    out.reserve(rows.size());
    for (int row : rows) out.push_back(all[row]);
    return out;
  };
  Encoding out;
  out.ids = pick(encoding.ids);
  out.type_ids = pick(encoding.type_ids);
  out.tokens = pick(encoding.tokens);
  out.char_start = pick(encoding.char_start);
  out.char_end = pick(encoding.char_end);
  out.byte_start = pick(encoding.byte_start);
  out.byte_end = pick(encoding.byte_end);
  out.special_tokens_mask = pick(encoding.special_tokens_mask);
  out.sequence_index = pick(encoding.sequence_index);
  out.truncated = true;
  out.untruncated_length = n;
  return out;
}

absl::Status TooLongError(const Model& model, int index, const Encoding& encoding, const char* what,
                          int limit) {
  InputError error;
  error.kind = InputError::Kind::kTooLong;
  error.index = index;
  error.tokens = encoding.untruncated_length;
  error.tokens_at_least = encoding.untruncated_length_is_lower_bound;
  error.limit = limit;
  const bool text = std::string_view(what) != "pair";
  std::string message = absl::StrCat(
      "inputs[", index, "]: ", what, " has ", error.tokens_at_least ? "at least " : "",
      error.tokens, " tokens, more than max_length ", limit,
      " and truncation is TRUNCATION_NONE; shorten it, allow truncation (TRUNCATION_RIGHT keeps "
      "the beginning, TRUNCATION_LEFT the end)",
      text ? ", embed all of it with long_text LONG_TEXT_CHUNK" : "");
  if (!error.tokens_at_least && error.tokens <= model.max_positions()) {
    absl::StrAppend(&message, " or raise tokenization.max_length to ", error.tokens,
                    " (this model takes up to ", model.max_positions(), ")");
  }
  return WithInputError(absl::InvalidArgumentError(message), error);
}

absl::Status TooLongToChunkError(int index, int64_t max_tokens) {
  return TooLargeError(absl::StrCat(
      "inputs[", index, "]: chunked, the inputs up to this one have more than ", max_tokens,
      " tokens together, more than one call may encode within --max-request-memory-bytes; "
      "split the text over several calls"));
}

void WeightedMeanOfWindows(const std::vector<float>& window_embeddings,
                           const std::vector<int64_t>& window_tokens, int64_t hidden, float* out) {
  std::vector<double> sum(static_cast<size_t>(hidden), 0.0);
  double weights = 0;
  for (size_t k = 0; k < window_tokens.size(); ++k) {
    const double weight = static_cast<double>(window_tokens[k]);
    const float* e = window_embeddings.data() + k * hidden;
    for (int64_t h = 0; h < hidden; ++h) sum[h] += weight * e[h];
    weights += weight;
  }
  for (int64_t h = 0; h < hidden; ++h) out[h] = static_cast<float>(sum[h] / weights);
}

}  // namespace attn::server::core
