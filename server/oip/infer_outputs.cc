#include "server/oip/infer_outputs.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn::server::oip {
namespace {

constexpr std::string_view kOutputs[] = {"EMBEDDING",      "TOKEN_EMBEDDINGS", "TOKEN_COUNT",
                                         "ATTENTION",      "SPARSE_INDICES",   "SPARSE_VALUES",
                                         "SPARSE_OFFSETS", "TRUNCATED"};

template <typename T>
void Append(std::string* raw, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian host (x86-64)
  raw->append(bytes, sizeof(T));
}

// The sizes the outputs take: padded as sent, and packed as the core admitted them.
struct OutputSizes {
  int64_t padded = 0;
  int64_t packed = 0;
};

}  // namespace

bool IsOutputName(std::string_view name) {
  return std::find(std::begin(kOutputs), std::end(kOutputs), name) != std::end(kOutputs);
}

std::string OutputNames() {
  std::string names;
  for (std::string_view name : kOutputs)
    absl::StrAppend(&names, names.empty() ? "" : ", ", AbslView(name));
  return names;
}

ModelSignature SignatureOf(const core::ModelInfo& info) {
  const int64_t hidden = info.hidden_size, heads = info.num_heads;
  ModelSignature s;
  s.inputs = {{"TEXT", "BYTES", {-1}, true},
              {"INPUT_IDS", "INT64", {-1, -1}, true},
              {"ATTENTION_MASK", "INT64", {-1, -1}, true},
              {"TOKEN_TYPE_IDS", "INT64", {-1, -1}, true}};
  s.outputs = {{"EMBEDDING", "FP32", {-1, hidden}, false},
               {"TOKEN_EMBEDDINGS", "FP32", {-1, -1, -1, hidden}, true},
               {"TOKEN_COUNT", "INT64", {-1}, true},
               {"ATTENTION", "FP32", {-1, -1, heads, -1, -1}, true},
               {"SPARSE_INDICES", "INT64", {-1}, true},
               {"SPARSE_VALUES", "FP32", {-1}, true},
               {"SPARSE_OFFSETS", "INT64", {-1}, true},
               {"TRUNCATED", "BOOL", {-1}, true}};
  return s;
}

void InferJoin::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mutex_);
    if (failure_.ok()) failure_ = std::move(status);
  }
  Arrived();
}

void InferJoin::SetEncode(core::EncodeResponse response) {
  {
    absl::MutexLock lock(&mutex_);
    encode_ = std::move(response);
  }
  Arrived();
}

void InferJoin::SetAttention(core::AttentionResponse response) {
  {
    absl::MutexLock lock(&mutex_);
    attention_ = std::move(response);
  }
  Arrived();
}

void InferJoin::Arrived() {
  absl::StatusOr<InferResponse> result = absl::InternalError("no answer");
  {
    absl::MutexLock lock(&mutex_);
    if (--remaining_ > 0) return;
    if (!failure_.ok()) {
      result = failure_;
    } else {
      result = BuildResponse(plan, encode_, attention_, limits, memory_budget);
      if (result.ok()) {
        result->model = model;
        result->version = encode_.has_value() ? encode_->model_version : attention_->model_version;
      }
    }
    // What the outputs were copied from is not needed any more; the admissions are held by the
    // response.
    encode_.reset();
    attention_.reset();
  }
  done(std::move(result));
}

namespace {

// Each input's encoding, from whichever call answered.
std::vector<const Encoding*> EncodingsOf(const std::optional<core::EncodeResponse>& encode,
                                         const std::optional<core::AttentionResponse>& attention) {
  std::vector<const Encoding*> encodings;
  if (encode.has_value()) {
    for (const core::EncodeResult& r : encode->results) encodings.push_back(&r.encoding);
  } else {
    for (const core::AttentionResult& r : attention->results) encodings.push_back(&r.encoding);
  }
  return encodings;
}

OutputSizes SizeOf(std::string_view name, const std::optional<core::EncodeResponse>& encode,
                   const std::optional<core::AttentionResponse>& attention,
                   const std::vector<const Encoding*>& encodings, int64_t longest) {
  const int64_t n = static_cast<int64_t>(encodings.size());
  OutputSizes size;
  if (name == "EMBEDDING") {
    size.padded = n * (n > 0 ? static_cast<int64_t>(encode->results[0].embedding.size()) : 0) * 4;
  } else if (name == "TOKEN_EMBEDDINGS") {
    for (const core::EncodeResult& r : encode->results) {
      for (const auto& [layer, view] : r.hidden_states) {
        size.packed += view.size() * 4;
        size.padded += longest * view.cols * 4;
      }
    }
  } else if (name == "ATTENTION") {
    for (const core::AttentionResult& r : attention->results) {
      const int64_t t = r.encoding.size();
      const int64_t per_map = static_cast<int64_t>(attention->heads.size()) * 4;
      size.packed += static_cast<int64_t>(r.layers.size()) * per_map * t * t;
      size.padded += static_cast<int64_t>(r.layers.size()) * per_map * longest * longest;
    }
  } else if (name == "SPARSE_INDICES" || name == "SPARSE_VALUES") {
    for (const core::EncodeResult& r : encode->results) {
      size.padded +=
          static_cast<int64_t>(r.sparse->indices.size()) * (name == "SPARSE_VALUES" ? 4 : 8);
    }
  } else if (name == "SPARSE_OFFSETS") {
    size.padded = (n + 1) * 8;
  } else if (name == "TOKEN_COUNT") {
    size.padded = n * 8;
  } else {  // TRUNCATED
    size.padded = n;
  }
  if (size.packed == 0) size.packed = size.padded;
  return size;
}

void FillTokenEmbeddings(const core::EncodeResponse& encode, int64_t longest, OutputTensor* out) {
  const int64_t n = static_cast<int64_t>(encode.results.size());
  const int64_t layers = n > 0 ? static_cast<int64_t>(encode.results[0].hidden_states.size()) : 0;
  const int64_t hidden = layers > 0 ? encode.results[0].hidden_states[0].second.cols : 0;
  out->shape = {n, layers, longest, hidden};
  out->raw.assign(static_cast<size_t>(n * layers * longest * hidden * 4), '\0');
  char* at = out->raw.data();
  for (const core::EncodeResult& r : encode.results) {
    for (const auto& [layer, view] : r.hidden_states) {
      std::memcpy(at, view.data, static_cast<size_t>(view.size() * 4));
      at += longest * hidden * 4;
    }
  }
}

void FillAttention(const core::AttentionResponse& attention, int64_t longest, OutputTensor* out) {
  const int64_t n = static_cast<int64_t>(attention.results.size());
  const int64_t layers = n > 0 ? static_cast<int64_t>(attention.results[0].layers.size()) : 0;
  const int64_t heads = static_cast<int64_t>(attention.heads.size());
  out->shape = {n, layers, heads, longest, longest};
  out->raw.assign(static_cast<size_t>(n * layers * heads * longest * longest * 4), '\0');
  float* base = reinterpret_cast<float*>(out->raw.data());
  for (int64_t i = 0; i < n; ++i) {
    const core::AttentionResult& r = attention.results[i];
    const int64_t t = r.encoding.size();
    for (int64_t l = 0; l < layers; ++l) {
      const Tensor& weights = *r.layers[l].weights;  // (all heads, T, T)
      for (int64_t h = 0; h < heads; ++h) {
        const float* map = weights.data() + attention.heads[h] * t * t;
        float* to = base + (((i * layers + l) * heads + h) * longest) * longest;
        for (int64_t q = 0; q < t; ++q) std::memcpy(to + q * longest, map + q * t, t * 4);
      }
    }
  }
}

OutputTensor Fill(std::string_view name, const std::optional<core::EncodeResponse>& encode,
                  const std::optional<core::AttentionResponse>& attention,
                  const std::vector<const Encoding*>& encodings, int64_t longest) {
  const int64_t n = static_cast<int64_t>(encodings.size());
  OutputTensor out;
  out.name = std::string(name);
  out.datatype = "FP32";
  if (name == "EMBEDDING") {
    const int64_t d = n > 0 ? static_cast<int64_t>(encode->results[0].embedding.size()) : 0;
    out.shape = {n, d};
    for (const core::EncodeResult& r : encode->results) {
      out.raw.append(reinterpret_cast<const char*>(r.embedding.data()), r.embedding.size() * 4);
    }
  } else if (name == "TOKEN_EMBEDDINGS") {
    FillTokenEmbeddings(*encode, longest, &out);
  } else if (name == "ATTENTION") {
    FillAttention(*attention, longest, &out);
  } else if (name == "SPARSE_INDICES" || name == "SPARSE_VALUES" || name == "SPARSE_OFFSETS") {
    out.datatype = name == "SPARSE_VALUES" ? "FP32" : "INT64";
    int64_t total = 0;
    if (name == "SPARSE_OFFSETS") Append<int64_t>(&out.raw, 0);
    for (const core::EncodeResult& r : encode->results) {
      total += static_cast<int64_t>(r.sparse->indices.size());
      if (name == "SPARSE_OFFSETS") Append<int64_t>(&out.raw, total);
      for (size_t k = 0; name != "SPARSE_OFFSETS" && k < r.sparse->indices.size(); ++k) {
        if (name == "SPARSE_VALUES")
          Append<float>(&out.raw, r.sparse->values[k]);
        else
          Append<int64_t>(&out.raw, r.sparse->indices[k]);
      }
    }
    out.shape = {name == "SPARSE_OFFSETS" ? n + 1 : total};
  } else if (name == "TOKEN_COUNT") {
    out.datatype = "INT64";
    out.shape = {n};
    for (const Encoding* e : encodings) Append<int64_t>(&out.raw, e->size());
  } else {  // TRUNCATED
    out.datatype = "BOOL";
    out.shape = {n};
    for (const Encoding* e : encodings) out.raw.push_back(e->truncated ? 1 : 0);
  }
  return out;
}

}  // namespace

absl::StatusOr<InferResponse> BuildResponse(const OutputPlan& plan,
                                            const std::optional<core::EncodeResponse>& encode,
                                            const std::optional<core::AttentionResponse>& attention,
                                            const InferLimits& limits,
                                            MemoryBudget* memory_budget) {
  const std::vector<const Encoding*> encodings = EncodingsOf(encode, attention);
  int64_t longest = 0;
  for (const Encoding* e : encodings) longest = std::max<int64_t>(longest, e->size());
  OutputSizes total;
  for (const std::string& name : plan.names) {
    const OutputSizes size = SizeOf(name, encode, attention, encodings, longest);
    total.padded += size.padded;
    total.packed += size.packed;
  }
  if (total.padded > limits.max_message_bytes) {
    return TooLargeError(absl::StrCat(
        "the outputs would be ", total.padded,
        " bytes (TOKEN_EMBEDDINGS and ATTENTION are padded "
        "to the longest input, ",
        longest, " tokens), more than the ", limits.max_message_bytes,
        "-byte limit (--max-message-bytes); send inputs of similar length together, fewer inputs "
        "or layers, or raise --max-message-bytes on the server"));
  }
  InferResponse response;
  // The padding is memory the core did not admit: the outputs and their copy on the wire.
  const int64_t extra = 2 * (total.padded - total.packed);
  if (extra > 0) {
    if (extra > limits.max_request_memory_bytes) {
      return TooLargeError(absl::StrCat(
          "padding TOKEN_EMBEDDINGS/ATTENTION to the longest input (", longest, " tokens) takes ",
          extra, " bytes more, over the ", limits.max_request_memory_bytes,
          "-byte limit of one call (--max-request-memory-bytes); send inputs of similar length "
          "together"));
    }
    if (absl::Status admitted = memory_budget->Acquire(extra); !admitted.ok()) return admitted;
    response.held.push_back(std::shared_ptr<void>(
        nullptr, [memory_budget, extra](void*) { memory_budget->Release(extra); }));
  }
  if (encode.has_value()) response.held.push_back(encode->admission);
  if (attention.has_value()) response.held.push_back(attention->admission);
  for (const std::string& name : plan.names) {
    response.outputs.push_back(Fill(name, encode, attention, encodings, longest));
  }
  return response;
}

}  // namespace attn::server::oip
