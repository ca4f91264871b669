// The serving core's calls as plain C++: one request and one response struct per call. A front
// end (gRPC today) fills a request, calls ServingCore (serving_core.h) and writes the response in
// its own format. Requests are read only while the call's entry point runs, so they may view the
// front end's own storage (string_view, Span) instead of copying it. Enum values are the public
// API's numbers; an unknown number is rejected by the call, naming the field.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/explain/attribution.h"
#include "engine/explain/sparse_bm42.h"
#include "engine/half.h"
#include "engine/model.h"
#include "server/core/cost_model.h"
#include "server/core/serving_metrics.h"

namespace attn::server::core {

// One input: a text, a text pair or token ids.
struct Input {
  enum class Kind { kNotSet, kText, kPair, kTokens };
  Kind kind = Kind::kNotSet;
  std::string_view text;               // kText; kPair: the first text
  std::string_view second;             // kPair: the second text
  absl::Span<const int32_t> ids;       // kTokens
  absl::Span<const int32_t> type_ids;  // kTokens: empty = all 0, else one per id
};

enum class Truncation : int { kUnspecified = 0, kRight = 1, kLeft = 2, kNone = 3 };
// What Encode does with a text over max_length: as `Truncation` says, or split it into
// overlapping windows and pool them into one embedding (the proto's LongText).
enum class LongText : int { kUnspecified = 0, kChunk = 1 };

struct TokenizationOptions {
  Truncation truncation = Truncation::kUnspecified;  // unspecified = right
  int32_t max_length = 0;                            // 0 = the model's default
};

enum class Pooling : int {
  kModelDefault = 0,
  kCls = 1,
  kMean = 2,
  kMax = 3,
  kNone = 4,
  kClsAttention = 5,  // weighted by the last layer's [CLS] attention row, mean over heads
};
enum class OutputDType : int { kUnspecified = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

// Per-call control from the transport: when the caller gives up.
struct CallControl {
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  std::optional<std::chrono::system_clock::time_point> deadline;
  std::function<bool()> is_cancelled;  // may be empty

  // Why nobody waits for the answer any more ("deadline" or "cancelled"), or nullptr.
  const char* DropReason() const;
};

// Memory a call was admitted with (cost_model.h); given back to the budget when the last holder
// lets go of it, or at Release(). The transport holds it until the response is sent.
class Admission {
 public:
  Admission(MemoryBudget* budget, int64_t bytes, ServingMetrics* metrics);
  ~Admission() { Release(); }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  void Release();

 private:
  MemoryBudget* budget_;
  int64_t bytes_;
  ServingMetrics* metrics_;
};

struct Metadata {
  int64_t token_count = 0;
  double tokenization_ms = 0;
  double queue_ms = 0;
  double inference_ms = 0;
  double total_ms = 0;
  int32_t batch_inputs = 0;
};

// A (rows, cols) float matrix owned by the response that holds it (its `batch`).
struct MatrixView {
  int64_t rows = 0, cols = 0;
  const float* data = nullptr;
  int64_t size() const { return rows * cols; }
};

// ---- Encode ---------------------------------------------------------------------------------

struct EncodeRequest {
  std::string_view model;          // a served model's name (model_set.h); empty = the default
  std::string_view model_version;  // empty = the served version
  std::vector<Input> inputs;
  TokenizationOptions tokenization;
  Pooling pooling = Pooling::kModelDefault;
  std::optional<bool> normalize;  // unset = the model's default
  bool token_embeddings = false;
  absl::Span<const int32_t> hidden_layers;  // 0 = embedding output, L = last; negatives from end
  bool static_embeddings = false;
  OutputDType output_dtype = OutputDType::kUnspecified;
  bool sparse = false;  // BM42 sparse vector per input (engine/explain/sparse_bm42.h)
  // Matryoshka: the pooled embedding's first `dimensions` values, normalised again when
  // `normalize` is on; 1 .. hidden size, unset = all.
  std::optional<int32_t> dimensions;
  LongText long_text = LongText::kUnspecified;
  std::optional<int32_t> chunk_overlap;  // kChunk: tokens shared by consecutive windows
  // Token-id inputs must be this model's tokenizer output ([CLS] ... [SEP], as Tokenize gives
  // them) and follow the text rules (truncation, refusal, chunking), instead of being used as
  // given: what the OpenAI route asks, where ids from another tokenizer (tiktoken) arrive.
  bool token_ids_from_tokenizer = false;
};

struct EncodeResult {
  Encoding encoding;             // a chunked input's: the whole text's
  int chunks = 1;                // the windows it was encoded in (LongText::kChunk)
  std::vector<float> embedding;  // pooled (and normalised if asked); empty without pooling
  MatrixView token_embeddings;   // (T, H) last layer; empty unless asked
  std::vector<std::pair<int, MatrixView>> hidden_states;  // (layer, (T, H)), request order
  MatrixView static_embeddings;                           // (T, H); empty unless asked
  std::optional<SparseVector> sparse;                     // when asked
};

struct EncodeResponse {
  std::string model_version;
  std::shared_ptr<const Model> model;  // tokens' texts; keeps the vocabulary alive
  WireDType dtype = WireDType::kFloat32;
  std::vector<EncodeResult> results;  // one per input, in order
  Metadata metadata;
  std::shared_ptr<const void> batch;     // owns the memory the views point into
  std::shared_ptr<Admission> admission;  // hold until the response is sent
};

// ---- AttentionMap ---------------------------------------------------------------------------

struct AttentionRequest {
  std::string_view model;  // a served model's name (model_set.h); empty = the default
  std::string_view model_version;
  std::vector<Input> inputs;
  TokenizationOptions tokenization;
  absl::Span<const int32_t> layers;     // 0-based, negatives from the end; empty = all
  absl::Span<const int32_t> heads;      // empty = all
  std::optional<bool> include_weights;  // unset = true
  bool include_scores = false;
  bool include_qkv = false;
  bool mean_over_heads = false;
  bool rollout = false;
  int32_t top_k = 0;
  OutputDType output_dtype = OutputDType::kUnspecified;
};

struct LayerAttentionResult {
  int layer = 0;
  // The engine's (all heads, T, X) tensors, owned by the response's batch; the response's
  // `heads` selects what to return (encoded head by head, no copy). Null when not asked for.
  const Tensor* weights = nullptr;  // dense weights (unless top_k)
  const Tensor* scores = nullptr;
  const Tensor* query = nullptr;
  const Tensor* key = nullptr;
  const Tensor* value = nullptr;
  // Computed per request; empty when not asked for.
  Tensor top_k_values;  // (selected heads, T, k) when top_k > 0
  std::vector<int32_t> top_k_indices;
  Tensor mean_weights;  // (T, T)
};

struct AttentionResult {
  Encoding encoding;
  std::vector<LayerAttentionResult> layers;  // request order
  Tensor rollout;                            // (T, T) when asked
};

struct AttentionResponse {
  std::string model_version;
  std::shared_ptr<const Model> model;
  WireDType dtype = WireDType::kFloat32;
  std::vector<int> heads;  // the selected heads, request order
  std::vector<AttentionResult> results;
  Metadata metadata;
  std::shared_ptr<const void> batch;     // owns the maps the results point into
  std::shared_ptr<Admission> admission;  // hold until the response is sent
};

// ---- Explain --------------------------------------------------------------------------------

enum class ExplainMethod : int {
  kUnspecified = 0,  // pairwise
  kPairwise = 1,
  kIntegratedGradients = 2,
  kGradientXInput = 3,
};
enum class ExplainBaseline : int { kUnspecified = 0, kPadTokens = 1, kMaskTokens = 2, kZero = 3 };

struct ExplainRequest {
  std::string_view model;  // a served model's name (model_set.h); empty = the default
  std::string_view model_version;
  std::string_view query;                   // text a
  std::vector<std::string_view> documents;  // texts b, each explained against the query
  ExplainMethod method = ExplainMethod::kUnspecified;
  std::optional<int32_t> steps;  // unset = 32
  int32_t layer = 0;
  ExplainBaseline baseline = ExplainBaseline::kUnspecified;
  bool word_level = false;
};

struct ExplainResult {
  Encoding document;
  AttributionResult attribution;  // a = the query, b = the document
  double inference_ms = 0;
};

struct ExplainResponse {
  std::string model_version;
  std::shared_ptr<const Model> model;
  Encoding query;
  std::vector<ExplainResult> results;  // one per document, in order
  Metadata metadata;
  std::shared_ptr<Admission> admission;  // hold until the response is sent
};

// ---- Classify -------------------------------------------------------------------------------

struct ClassifyRequest {
  std::string_view model;          // a served model's name (model_set.h); empty = the default
  std::string_view model_version;  // must have a classification head
  std::vector<Input> inputs;       // texts (CLASSIFICATION head) or pairs (PAIR_CLASSIFICATION)
  TokenizationOptions tokenization;
  int32_t top_k = 0;  // 0 = every label; more than the labels = every label
};

struct LabelScore {
  int32_t label = 0;
  std::string name;  // the job's label name, or ""
  float probability = 0;
  float logit = 0;
};

struct ClassifyResponse {
  std::string model_version;
  std::vector<std::vector<LabelScore>> results;  // per input, most probable first
  Metadata metadata;
  std::shared_ptr<Admission> admission;  // hold until the response is sent
};

// ---- Rerank ---------------------------------------------------------------------------------

enum class RerankMethod : int { kUnspecified = 0, kCosine = 1, kCrossEncoder = 2 };

struct RerankRequest {
  std::string_view model;  // a served model's name (model_set.h); empty = the default
  std::string_view model_version;
  std::string_view query;
  std::vector<std::string_view> documents;
  int32_t top_n = 0;  // 0 = all
  RerankMethod method = RerankMethod::kUnspecified;
  TokenizationOptions tokenization;
  bool return_documents = false;
};

struct RerankResult {
  int32_t index = 0;  // into the request's documents
  float score = 0;
  std::string document;  // when asked
};

struct RerankResponse {
  std::string model_version;
  RerankMethod method = RerankMethod::kUnspecified;  // the one used
  std::vector<RerankResult> results;                 // best first
  Metadata metadata;
  std::shared_ptr<Admission> admission;  // hold until the response is sent
};

// ---- Tokenize -------------------------------------------------------------------------------

struct TokenizeRequest {
  std::string_view model;  // a served model's name (model_set.h); empty = the default
  std::string_view model_version;
  std::vector<Input> inputs;
  TokenizationOptions tokenization;
};

struct TokenizeResponse {
  std::string model_version;
  std::shared_ptr<const Model> model;
  std::vector<Encoding> results;
  Metadata metadata;  // token_count, tokenization_ms, total_ms
};

// ---- GetModelInfo ---------------------------------------------------------------------------

struct ModelInfoRequest {
  std::string_view model;  // a served model's name (model_set.h); empty = the default
  std::string_view model_version;
};

struct ModelInfo {
  std::string name;  // the served model's name (--model NAME=DIR)
  bool is_default = false;
  std::string architecture;
  std::string model_type;
  int hidden_size = 0, num_layers = 0, num_heads = 0, head_dim = 0, intermediate_size = 0;
  int vocab_size = 0, type_vocab_size = 0, max_position_embeddings = 0;
  int default_max_length = 0;
  std::string default_pooling;
  bool default_normalize = false;
  int64_t parameter_count = 0;
  std::string precision;
  std::string version;
  std::string version_origin;
  std::vector<std::string> available_versions;
  int max_inputs_per_request = 0;
};

}  // namespace attn::server::core
