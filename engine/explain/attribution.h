// Why are two texts similar? Attributions of a bi-encoder's similarity score to the tokens of both
// texts, computed through the engine's own training forward and input backward (fp32, no
// dropout).
//
// Score. f(x) = normalize(pool(E(x))) with the model's default pooling (mean or CLS) and its
// sentence-transformers normalisation; s(a, b) = f(a) . f(b), which for a model that normalises
// (all-MiniLM-L6-v2) is the cosine. The attribution treats s as a dot product of f: exact for the
// normalised model, and for an un-normalised one it explains the dot product of the pooled
// embeddings (not their cosine).
//
// Attribution point. The hidden states entering encoder layer `layer` (HF's
// hidden_states[layer]); layer 0, the default, is the embedding module's output (word + position
// + type, after the embedding LayerNorm), which is where the method's reference implementation
// (Moeller et al., EMNLP 2023, "An Attribution Method for Siamese Encoders", Sec. 2-3; their
// code interpolates with a forward pre-hook on encoder layer `idx`) attributes. Any layer in
// [0, L] is allowed: layer L attributes at the last hidden states (only the pooling is left).
//
// Baseline r (per text, same length, attributed at the same layer):
//   kPadTokens (default, the method's reference): [CLS] [PAD] ... [PAD] [SEP] -- every
//     non-special token replaced by [PAD], special tokens and type ids kept -- run through the
//     model up to `layer`. For a single text this is the paper's reference input exactly.
//   kMaskTokens: the same with [MASK] instead of [PAD].
//   kZero: zero hidden states at `layer`. Converges slowly: its path crosses hidden states no
//     LayerNorm produces; on all-MiniLM-L6-v2 at layer 0 and 32 steps one pair's completeness
//     error was 0.53 (torch's identical sum too), against <= 0.01 for the token baselines.
//
// Path. x(alpha) = r + alpha (x - r) at alpha_k = k / m, k = 1..m (right Riemann sum, as the
// reference implementation). The m points of one text run as one packed batch through the
// training forward and the input backward -- split into several batches only when their saved
// activations would pass ~256 MB (long texts: ~6 points per batch at 256 tokens).
//
// Methods (H = hidden size, i a token of a, j a token of b, dx_i = x_i - r_i in R^H):
//   Integrated gradients, per token (b held at f(b), and symmetrically for b):
//     ig_a[i] = dx_i . (1/m) sum_k d s(x_a(alpha_k), b) / d x_i
//     sum_i ig_a[i] ~= s(a, b) - s(r_a, b)                            (completeness)
//   Gradient x input, per token: gxi_a[i] = x_i . d s(a, b) / d x_i (no completeness property).
//   Token-pair (the paper's integrated Jacobians, its Eq. for dot-product scores):
//     u_a[i] = (1/m) sum_k J_f(x_a(alpha_k))[:, i] dx_i    in R^D  (D = embedding size)
//     A[i, j] = u_a[i] . u_b[j]
//     sum_ij A[i, j] ~= s(a, b) - s(r_a, b) - s(a, r_b) + s(r_a, r_b)   (completeness)
//   u_a is computed in forward mode (one Jacobian-vector product per (alpha, token i), batched),
//   so the pairwise cost is about (m x T_a) + (m x T_b) sequence forwards: limited by
//   max_pairwise_tokens.
// completeness_error = |sum of the attributions - its right-hand side above|; it shrinks as the
// number of steps grows (the error of the Riemann sum), and is returned with every answer.
//
// Word level: word pieces summed into words (a word = a token without the "##" prefix and its
// "##" continuations), with the word's character span; rows/columns of A likewise.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"

namespace attn {

enum class AttributionBaseline { kPadTokens, kMaskTokens, kZero };
enum class AttributionMethod {
  kPairwise,             // token-pair matrix A (and the per-token views, which come with it)
  kIntegratedGradients,  // per-token integrated gradients (+ gradient x input)
  kGradientXInput,       // per-token gradient x input only (one forward + backward per text)
};

struct AttributionOptions {
  AttributionMethod method = AttributionMethod::kPairwise;
  int steps = 32;  // m, interpolation points per text
  int layer = 0;   // attribution point: hidden states entering this encoder layer, [0, L]
  AttributionBaseline baseline = AttributionBaseline::kPadTokens;
  bool word_level = false;  // also aggregate into words
  // Limits (InvalidArgument beyond them).
  int max_steps = 256;
  int max_tokens = 512;           // per text, special tokens included
  int max_pairwise_tokens = 128;  // per text, for kPairwise (cost grows as steps x tokens^2)
  // Yield point, called between units of work (a run of path points, each half of an encoder
  // layer of a batch of Jacobian-vector products: well under a second each); returning true
  // abandons the call with CANCELLED. A server checks the caller's deadline here and runs other
  // queued work on the same thread. May be empty.
  std::function<bool()> checkpoint;
};

// Tangent rows per batch of Jacobian-vector products (pairwise): ~12 MB of working memory at
// hidden size 384, and half an encoder layer of a batch (~2 GFLOP) is short enough that work
// queued behind a checkpoint does not wait long.
inline constexpr int64_t kJvpBatchRows = 1024;

struct WordSpan {
  std::string text;                      // the word pieces joined, "##" removed
  int32_t char_start = 0, char_end = 0;  // in the text the tokens came from ((0,0) for specials)
  int32_t first_token = 0, num_tokens = 0;
  int8_t sequence_index = -1;  // as Encoding::sequence_index (-1 special)
};

struct TextAttribution {
  std::vector<float> integrated_gradients;  // (T) empty for kGradientXInput
  std::vector<float> gradient_x_input;      // (T)
  float baseline_similarity = 0;            // s(r_this, other)
  std::vector<WordSpan> words;              // word_level only
  std::vector<float> word_integrated_gradients, word_gradient_x_input;  // (words)
};

struct AttributionResult {
  float similarity = 0;  // s(a, b)
  TextAttribution a, b;
  // kPairwise: (T_a, T_b) row-major, and the four terms of its completeness identity.
  std::vector<float> pair_matrix;
  int64_t rows = 0, cols = 0;
  float baselines_similarity = 0;       // s(r_a, r_b)
  std::vector<float> word_pair_matrix;  // (words_a, words_b), word_level only
  // |sum of attributions - target| for the method's identity (pairwise: the matrix; integrated
  // gradients: the larger of the two texts' errors); gradient x input has none (0).
  float completeness_error = 0;
  float attribution_sum = 0;      // sum of A, or of ig_a (the text with the larger error)
  float completeness_target = 0;  // the identity's right-hand side for attribution_sum
};

// a, b: encodings by the model's tokenizer (any length up to options.max_tokens; a pair encoding
// is allowed). pooling: the model's sentence config (mean or CLS; max is rejected).
absl::StatusOr<AttributionResult> ExplainSimilarity(const BertConfig& config,
                                                    const BertWeights& weights,
                                                    const SentenceEmbeddingConfig& pooling,
                                                    const WordPieceTokenizer& tokenizer,
                                                    const Encoding& a, const Encoding& b,
                                                    const AttributionOptions& options);

// What ExplainSimilarity will cost, in token-forward equivalents (one token through every
// encoder layer once), for admission control next to Encode's token counts: the end-point
// forwards, the path's forward + input backward (~3 forwards per path token) and, for kPairwise,
// one JVP row per (step, token, token) from the layer on (~1 forward each). tokens_a/b include
// special tokens.
int64_t AttributionCostTokens(const BertConfig& config, const AttributionOptions& options,
                              int64_t tokens_a, int64_t tokens_b);

// Word spans of an encoding (specials are words of their own); exposed for the word-level view
// and for tests.
std::vector<WordSpan> WordSpansOf(const Encoding& encoding);

}  // namespace attn
