#include "server/core/cost_model.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attn::server {

namespace {

// --- Protocol Buffers wire sizes (field numbers < 16: one tag byte) ---

int64_t VarintBytes(uint64_t value) {
  int64_t bytes = 1;
  while (value >= 128) {
    value >>= 7;
    ++bytes;
  }
  return bytes;
}

// An int32 field (negatives take 10 bytes); 0 when the value is 0 (proto3 omits it).
int64_t Int32Field(int32_t value) {
  if (value == 0) return 0;
  return 1 + (value < 0 ? 10 : VarintBytes(static_cast<uint32_t>(value)));
}

// A length-delimited field (message, string, bytes, packed) with `payload` bytes.
int64_t Delimited(int64_t payload) { return 1 + VarintBytes(payload) + payload; }

// attnserve.v1.Tensor payload: packed shape, dtype, data.
int64_t TensorPayload(const std::vector<int64_t>& shape, WireDType dtype) {
  int64_t shape_bytes = 0, count = 1;
  for (int64_t d : shape) {
    shape_bytes += VarintBytes(d);
    count *= d;
  }
  const int64_t data = count * WireDTypeSize(dtype);
  return Delimited(shape_bytes) + 2 + (data > 0 ? Delimited(data) : 0);
}

int64_t TensorField(const std::vector<int64_t>& shape, WireDType dtype) {
  return Delimited(TensorPayload(shape, dtype));
}

// The repeated Token messages of one input, its truncated/untruncated_length fields (and its
// lower-bound flag) and, for Encode, its `chunks`.
int64_t TokensAndInputFields(const WordPieceTokenizer& tokenizer, const Encoding& e,
                             int32_t chunks = 0) {
  int64_t bytes = 0;
  for (int t = 0; t < e.size(); ++t) {
    const int64_t text = static_cast<int64_t>(tokenizer.IdToToken(e.ids[t]).size());
    const int64_t token = Int32Field(e.ids[t]) + (text > 0 ? Delimited(text) : 0) +
                          Int32Field(e.char_start[t]) + Int32Field(e.char_end[t]) +
                          Int32Field(e.byte_start[t]) + Int32Field(e.byte_end[t]) +
                          Int32Field(e.type_ids[t]) + (e.special_tokens_mask[t] ? 2 : 0) +
                          Int32Field(e.sequence_index[t]);
    bytes += Delimited(token);
  }
  return bytes + (e.truncated ? 2 : 0) + Int32Field(e.untruncated_length) +
         (e.untruncated_length_is_lower_bound ? 2 : 0) + Int32Field(chunks);
}

// Response envelope: model_version and metadata (token count, five doubles, batch inputs).
int64_t EnvelopeBytes(int64_t model_version_bytes, int64_t total_tokens, int64_t inputs) {
  const int64_t metadata = 1 + VarintBytes(total_tokens) + 5 * 9 + 1 + VarintBytes(inputs);
  return (model_version_bytes > 0 ? Delimited(model_version_bytes) : 0) + Delimited(metadata);
}

// Memory of a response message beyond its wire bytes, per token (a Token message, its text
// string and the repeated field's pointer, with allocator headers) and per tensor message.
constexpr int64_t kTokenInMemoryBytes = 128;
constexpr int64_t kTensorInMemoryBytes = 256;
// Per token: the batcher's copy of the ids and type ids, and the batch's concatenation of them.
constexpr int64_t kTokenCopyBytes = 16;
constexpr int64_t kInputCopyBytes = 128;

struct Totals {
  int64_t tokens = 0, max_length = 0, token_wire = 0, tensors = 0;
  int64_t response = 0, forward = 0, transient = 0;
  // What the core's results (server/core/results.h) hold until the response message is built
  // from them: pooled embeddings, top-k values and indices, means over heads, rollouts.
  int64_t held = 0;
};

RequestCost Finish(const Totals& t, int64_t inputs) {
  RequestCost cost;
  cost.response_bytes = t.response;
  const int64_t in_memory_response =
      t.response + t.tokens * kTokenInMemoryBytes + t.tensors * kTensorInMemoryBytes;
  cost.working_bytes = t.tokens * kTokenCopyBytes + inputs * kInputCopyBytes + t.forward +
                       in_memory_response + t.response + t.transient + t.held;
  return cost;
}

}  // namespace

RequestCost EstimateEncodeCost(const BertConfig& config, const WordPieceTokenizer& tokenizer,
                               const std::vector<Encoding>& inputs, const EncodeCostQuery& query,
                               int64_t model_version_bytes) {
  const int64_t H = config.hidden_size;
  Totals t;
  const int64_t per_token_tensors =
      (query.token_embeddings ? 1 : 0) + query.hidden_layers + (query.static_embeddings ? 1 : 0);
  int64_t windows = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Encoding& e = inputs[i];
    const int64_t T = e.size();
    const int chunks = query.windows != nullptr ? (*query.windows)[i] : 1;
    windows += chunks;
    t.tokens += T;
    t.max_length = std::max(t.max_length, T);
    int64_t result = TokensAndInputFields(tokenizer, e, chunks);
    if (query.pooled) result += Delimited(4 * H);
    if (query.token_embeddings) result += TensorField({T, H}, query.dtype);
    // LayerTensor {layer, tensor}; layer 0 is omitted on the wire, others take 2 bytes.
    result += query.hidden_layers * Delimited(2 + TensorField({T, H}, query.dtype));
    if (query.static_embeddings) result += TensorField({T, H}, query.dtype);
    t.response += Delimited(result);
    t.tensors += per_token_tensors;
  }
  t.response += EnvelopeBytes(model_version_bytes, t.tokens, inputs.size());
  // The engine keeps the requested hidden layers plus the last one (pooling reads it).
  const int64_t kept_layers = query.hidden_layers + (query.keeps_last_layer ? 0 : 1);
  const int64_t forward_tokens = query.forward_tokens >= 0 ? query.forward_tokens : t.tokens;
  t.forward = (kept_layers + (query.static_embeddings ? 1 : 0)) * forward_tokens * H * 4;
  // A pooled embedding per window (a chunked input's are averaged into one afterwards).
  if (query.pooled) t.held = windows * 4 * H;
  RequestCost cost = Finish(t, inputs.size());
  // The engine's copies of the windows' ids (the inputs' own are counted in Finish).
  cost.working_bytes += std::max<int64_t>(0, forward_tokens - t.tokens) * kTokenCopyBytes;
  return cost;
}

RequestCost EstimateAttentionCost(const BertConfig& config, const WordPieceTokenizer& tokenizer,
                                  const std::vector<Encoding>& inputs,
                                  const AttentionCostQuery& query, int64_t model_version_bytes) {
  const int64_t heads = config.num_attention_heads, d = config.head_dim();
  const int64_t L = config.num_hidden_layers;
  const int64_t S = static_cast<int64_t>(query.heads.size());
  const int64_t kept_layers = query.rollout ? L : static_cast<int64_t>(query.layers.size());
  int64_t heads_field = 0;
  for (int h : query.heads) heads_field += VarintBytes(h);
  heads_field = Delimited(heads_field);
  Totals t;
  for (const Encoding& e : inputs) {
    const int64_t T = e.size();
    t.tokens += T;
    t.max_length = std::max(t.max_length, T);
    int64_t result = TokensAndInputFields(tokenizer, e);
    int64_t layer_tensors = 0;
    for (int layer : query.layers) {
      int64_t part = Int32Field(layer) + heads_field;
      if (query.weights && query.top_k > 0) {
        const int64_t k = std::min<int64_t>(query.top_k, T);
        // Column indices are varints: 1 byte below 128, 2 above (T <= 16384); expected share
        // of the larger ones as if the selected columns were spread evenly.
        const int64_t count = S * T * k;
        const int64_t indices = count + count * std::max<int64_t>(0, T - 128) / T;
        part +=
            Delimited(Int32Field(static_cast<int32_t>(k)) + TensorField({S, T, k}, query.dtype) +
                      (count > 0 ? Delimited(indices) : 0));
        ++layer_tensors;
        t.held += count * 8;  // fp32 values and int32 indices
      } else if (query.weights) {
        part += TensorField({S, T, T}, query.dtype);
        ++layer_tensors;
      }
      if (query.scores) {
        part += TensorField({S, T, T}, query.dtype);
        ++layer_tensors;
      }
      if (query.qkv) {
        part += 3 * TensorField({S, T, d}, query.dtype);
        layer_tensors += 3;
      }
      if (query.mean_over_heads) {
        part += TensorField({T, T}, query.dtype);
        ++layer_tensors;
        t.held += T * T * 4;
      }
      result += Delimited(part);
    }
    if (query.rollout) {
      result += TensorField({T, T}, query.dtype);
      t.held += T * T * 4;
    }
    t.response += Delimited(result);
    t.tensors += layer_tensors + (query.rollout ? 1 : 0);
    // The engine keeps every head of each kept layer: probabilities always, scores and Q K V
    // when asked.
    t.forward += kept_layers * heads *
                 (T * T * 4 * (query.scores ? 2 : 1) + (query.qkv ? 3 * T * d * 4 : 0));
    // Largest temporary of this input's response build.
    int64_t transient = 0;
    if (query.rollout) transient = (L + 3) * T * T * 8;  // per-layer means + double products
    if (query.weights && query.top_k > 0) {
      // A copy of the selected heads when some are left out (the values and indices are held).
      transient = std::max(transient, S < heads ? S * T * T * 4 : 0);
    }
    t.transient = std::max(t.transient, transient);
  }
  t.response += EnvelopeBytes(model_version_bytes, t.tokens, inputs.size());
  return Finish(t, inputs.size());
}

double ModelTokenCost(const BertConfig& config) {
  const double hidden = config.hidden_size;
  return config.num_hidden_layers *
         (4 * hidden * hidden + 2 * hidden * static_cast<double>(config.intermediate_size));
}

int64_t EngineWorkspaceBytes(const BertConfig& config, int64_t max_batch_tokens) {
  // engine/encoder.cc ForwardWorkspace: embeddings, hidden, context, linear_out, attn_out (M, H),
  // qkv (M, 3H), intermediate (M, I); int8 inputs and s32 accumulators fit the same again.
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  return max_batch_tokens * (8 * H + I) * 4;
}

namespace {

// A cgroup memory limit file's value; -1 if absent or unlimited ("max", or v1's huge value).
int64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    const long long value = std::stoll(text);
    return value <= 0 || value >= (1ll << 60) ? -1 : value;
  } catch (...) {
    return -1;
  }
}

}  // namespace

int64_t MemoryLimitBytes() {
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  int64_t limit = physical;
  auto take = [&limit](int64_t value) {
    if (value > 0) limit = std::min(limit, value);
  };
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1, possibly with other controllers).
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool v2 = controllers.empty();
    if (!v2 && !absl::StrContains(absl::StrCat(",", controllers, ","), ",memory,")) continue;
    // The limit of this cgroup and of every ancestor applies.
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    std::string path = line.substr(second + 1);
    while (true) {
      take(ReadLimit(absl::StrCat(root, path == "/" ? "" : path, file)));
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
    }
  }
  return limit;
}

int64_t DefaultMemoryBudgetBytes() { return MemoryLimitBytes() / 2; }

namespace {
constexpr char kTooLargeUrl[] = "type.attnserve.dev/too-large";
}  // namespace

absl::Status TooLargeError(const std::string& message) {
  absl::Status status = absl::ResourceExhaustedError(message);
  status.SetPayload(kTooLargeUrl, absl::Cord("1"));
  return status;
}

bool IsTooLarge(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kTooLargeUrl).has_value();
}

absl::Status CheckRequestCost(const RequestCost& cost, int64_t max_message_bytes,
                              int64_t max_request_memory_bytes, std::string* limit_name,
                              bool lower_bound) {
  constexpr const char* kWhatToChange =
      "ask for fewer inputs, layers or heads (or shorter inputs), use top_k instead of dense "
      "weights, or output_dtype FLOAT16";
  const char* about = lower_bound ? "at least" : "about";
  if (cost.response_bytes > max_message_bytes) {
    *limit_name = "message";
    return TooLargeError(absl::StrCat(
        "the response would be ", about, " ", cost.response_bytes, " bytes, more than the ",
        max_message_bytes, "-byte limit (--max-message-bytes); ", kWhatToChange,
        ", or raise --max-message-bytes on the server and the client's maximum receive size"));
  }
  if (cost.working_bytes > max_request_memory_bytes) {
    *limit_name = "request";
    return TooLargeError(
        absl::StrCat("serving this request would take ", about, " ", cost.working_bytes,
                     " bytes of memory, more than the ", max_request_memory_bytes,
                     "-byte limit per request (--max-request-memory-bytes); ", kWhatToChange,
                     " (rollout keeps every layer's attention), or split it into several calls"));
  }
  return absl::OkStatus();
}

int64_t MemoryBudget::budget() const {
  absl::MutexLock lock(&mutex_);
  return budget_;
}

void MemoryBudget::Reserve(int64_t bytes) {
  absl::MutexLock lock(&mutex_);
  budget_ = std::max<int64_t>(0, budget_ - bytes);
}

int64_t MemoryBudget::in_flight() const {
  absl::MutexLock lock(&mutex_);
  return in_flight_;
}

absl::Status MemoryBudget::Refusal(int64_t bytes, bool lower_bound) const {
  const bool light = bytes <= budget_ / 16;
  const int64_t available = light ? budget_ : budget_ - budget_ / 4;
  const char* about = lower_bound ? "at least" : "about";
  if (bytes > available) {
    return TooLargeError(absl::StrCat(
        "serving this request would take ", about, " ", bytes, " bytes of memory, more than the ",
        available, " bytes one call may use of the server's ", budget_,
        "-byte budget (--memory-budget-bytes); ask for fewer inputs, layers or heads, use top_k "
        "or output_dtype FLOAT16, or split it into several calls"));
  }
  if (in_flight_ + bytes <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "server busy: this request needs ", about, " ", bytes, " bytes of working memory and ",
      in_flight_, " of the ", budget_, "-byte budget (--memory-budget-bytes",
      light ? "" : "; heavy calls may use three quarters of it",
      ") are in use by other calls; retry with back-off or ask for less"));
}

absl::Status MemoryBudget::Acquire(int64_t bytes) {
  absl::MutexLock lock(&mutex_);
  absl::Status refusal = Refusal(bytes, /*lower_bound=*/false);
  if (refusal.ok()) in_flight_ += bytes;
  return refusal;
}

absl::Status MemoryBudget::CheckFits(int64_t lower_bound_bytes) const {
  absl::MutexLock lock(&mutex_);
  return Refusal(lower_bound_bytes, /*lower_bound=*/true);
}

void MemoryBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mutex_);
  in_flight_ -= bytes;
}

}  // namespace attn::server
