// Validation and tokenization of the core's calls: turns a request into what the engine must
// compute, or an INVALID_ARGUMENT status whose message names the field, the input index and the
// limit. Pure functions of (model, request, limits), so they are easy to test and fuzz.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/explain/sparse_bm42.h"
#include "engine/half.h"
#include "engine/model.h"
#include "server/core/calls.h"
#include "server/core/cost_model.h"
#include "server/core/long_text.h"

namespace attn::server::core {

struct RequestLimits {
  int max_inputs_per_request = 0;  // set from ServerOptions (server/options.h)
  int max_explain_documents = 0;
  int64_t max_request_memory_bytes = 0;  // bounds what chunking tokenizes (long_text.h)
};

// Inputs tokenized and ready for the engine.
struct TokenizedInputs {
  std::vector<SequenceInput> sequences;  // what the engine runs: one per input, or its windows
  std::vector<Encoding> encodings;       // one per input (a chunked input's whole text)
  std::vector<int> windows;              // sequences per input, in order
  int64_t total_tokens = 0;              // of the sequences
};

// Tokenization options -> the tokenizer's truncation settings for `model` (0 = the model's
// default length); INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<TruncationOptions> ResolveTruncation(const Model& model,
                                                    const TokenizationOptions& options);

// Texts are tokenized only up to what is kept plus kTokenizerLookAhead tokens (all of it when
// chunking), so memory does not grow with the text; an input over max_length is truncated,
// refused (TRUNCATION_NONE: INVALID_ARGUMENT carrying InputError::kTooLong) or split into
// windows (long_text.chunk).
absl::StatusOr<TokenizedInputs> TokenizeInputs(const Model& model, absl::Span<const Input> inputs,
                                               const TokenizationOptions& tokenization,
                                               const RequestLimits& limits,
                                               const LongTextPlan& long_text = {});

// A lower bound of the tokens `text` takes, cheap enough to compute before tokenizing: each
// whitespace-separated word holding an ASCII letter or digit yields at least one token (a word
// of other characters may vanish in normalisation: accents, control and zero-width characters).
int64_t MinTokensOf(std::string_view text);

// Encodings no larger than the ones tokenizing `inputs` gives, by the cost model's measure
// (cost_model.h): MinTokensOf tokens each (capped at max_length; token ids
// given directly count as they are), all of them token 0 with zero offsets. Invalid inputs
// count 0 tokens (tokenizing reports them). For refusing unaffordable calls before the work.
// With `chunk`, texts are not capped at max_length (a chunked text is encoded whole).
std::vector<Encoding> LowerBoundEncodings(const Model& model, absl::Span<const Input> inputs,
                                          const TokenizationOptions& tokenization,
                                          bool chunk = false);

// Called by PrepareEncode/PrepareAttention before tokenizing, with the plan's encodings set to
// LowerBoundEncodings: a status other than OK refuses the call without tokenizing it (a
// request of 256 paragraphs far over the memory limit costs a word count, not a tokenization).
template <typename Plan>
using LowerBoundCheck = std::function<absl::Status(const Plan& lower_bound)>;

struct EncodePlan {
  TokenizedInputs inputs;
  std::optional<PoolingMode> pooling;       // nullopt = no pooling (or cls_attention_pooling)
  bool cls_attention_pooling = false;       // Pooling::kClsAttention
  bool sparse = false;                      // BM42 sparse vectors
  std::shared_ptr<const Bm42Encoder> bm42;  // set when sparse
  bool normalize = false;
  int dimensions = 0;  // pooled embedding truncated to this many values (Matryoshka); 0 = all
  bool token_embeddings = false;
  std::vector<int> hidden_layers;  // resolved (0..L), request order
  bool static_embeddings = false;
  WireDType dtype = WireDType::kFloat32;
  ForwardOptions forward;  // what the engine must keep (pooling is done per request)
  LongTextPlan long_text;
};

absl::StatusOr<EncodePlan> PrepareEncode(const Model& model, const EncodeRequest& request,
                                         const RequestLimits& limits,
                                         const LowerBoundCheck<EncodePlan>& check = nullptr);

struct AttentionPlan {
  TokenizedInputs inputs;
  std::vector<int> layers;  // resolved 0-based layers, request order
  std::vector<int> heads;   // selected heads, request order
  bool weights = true;
  bool scores = false;
  bool qkv = false;
  bool mean_over_heads = false;
  bool rollout = false;
  int top_k = 0;
  WireDType dtype = WireDType::kFloat32;
  ForwardOptions forward;
};

absl::StatusOr<AttentionPlan> PrepareAttention(
    const Model& model, const AttentionRequest& request, const RequestLimits& limits,
    const LowerBoundCheck<AttentionPlan>& check = nullptr);

// What answering the plan will cost (cost_model.h); `version_bytes`: the length of the model
// version name the response carries.
RequestCost EstimateCost(const Model& model, const EncodePlan& plan, int64_t version_bytes);
RequestCost EstimateCost(const Model& model, const AttentionPlan& plan, int64_t version_bytes);

}  // namespace attn::server::core
