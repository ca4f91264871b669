#include "engine/encoder.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/ops/attention.h"
#include "engine/ops/embedding.h"
#include "engine/ops/layernorm.h"
#include "engine/ops/linear.h"
#include "engine/ops/pooling.h"

namespace attn {

const Tensor* ForwardResult::HiddenState(int layer) const {
  for (const auto& [index, tensor] : hidden_states) {
    if (index == layer) return &tensor;
  }
  return nullptr;
}

const LayerAttention* ForwardResult::Attention(int layer) const {
  for (const LayerAttention& a : attentions) {
    if (a.layer == layer) return &a;
  }
  return nullptr;
}

absl::Status ValidateEncoderInput(const BertConfig& config, const std::vector<SequenceInput>& batch,
                                  const ForwardOptions& options) {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch: no input sequences");
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& seq = batch[i];
    const size_t length = seq.token_ids.size();
    if (length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, ": no tokens"));
    }
    if (length > static_cast<size_t>(config.max_position_embeddings)) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, ": ", length,
                                                     " tokens, more than the model's ",
                                                     config.max_position_embeddings, " positions"));
    }
    if (!seq.type_ids.empty() && seq.type_ids.size() != length) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, ": ", seq.type_ids.size(),
                                                     " type ids for ", length, " tokens"));
    }
    for (size_t t = 0; t < length; ++t) {
      const int32_t id = seq.token_ids[t];
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("input ", i, ", token ", t, ": id ", id,
                                                       " outside the vocabulary [0, ",
                                                       config.vocab_size, ")"));
      }
      if (!seq.type_ids.empty()) {
        const int32_t type = seq.type_ids[t];
        if (type < 0 || type >= config.type_vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("input ", i, ", token ", t, ": type id ",
                                                         type, " outside [0, ",
                                                         config.type_vocab_size, ")"));
        }
      }
    }
  }
  std::set<int> seen;
  for (int layer : options.hidden_layers) {
    if (layer < 0 || layer > config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("hidden state layer ", layer, " outside [0, ",
                                                     config.num_hidden_layers,
                                                     "] (0 = embedding output)"));
    }
    if (!seen.insert(layer).second) {
      return absl::InvalidArgumentError(absl::StrCat("hidden state layer ", layer, " repeated"));
    }
  }
  seen.clear();
  for (int layer : options.attention_layers) {
    if (layer < 0 || layer >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention layer ", layer, " outside [0, ", config.num_hidden_layers, ")"));
    }
    if (!seen.insert(layer).second) {
      return absl::InvalidArgumentError(absl::StrCat("attention layer ", layer, " repeated"));
    }
  }
  return absl::OkStatus();
}

namespace {

bool Contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

void KeepHiddenState(const ForwardOptions& options, int layer, const Tensor& hidden,
                     ForwardResult* result) {
  if (Contains(options.hidden_layers, layer)) result->hidden_states.emplace_back(layer, hidden);
}

ForwardResult RunForward(const BertConfig& config, const BertWeights& weights,
                         const std::vector<SequenceInput>& batch, const ForwardOptions& options) {
  ExecContext ctx;
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  const int64_t heads = config.num_attention_heads, d = config.head_dim();
  const float eps = config.layer_norm_eps;
  const int64_t batch_size = static_cast<int64_t>(batch.size());

  ForwardResult result;
  result.seq_offsets.assign(batch_size + 1, 0);
  for (int64_t b = 0; b < batch_size; ++b) {
    result.seq_offsets[b + 1] = result.seq_offsets[b] + batch[b].token_ids.size();
  }
  const int64_t M = result.total_tokens();

  // Packed token ids, type ids and per-sequence positions: (M)
  std::vector<int32_t> token_ids, type_ids, positions;
  token_ids.reserve(M);
  type_ids.reserve(M);
  positions.reserve(M);
  for (const SequenceInput& seq : batch) {
    const int32_t length = static_cast<int32_t>(seq.token_ids.size());
    token_ids.insert(token_ids.end(), seq.token_ids.begin(), seq.token_ids.end());
    if (seq.type_ids.empty()) {
      type_ids.insert(type_ids.end(), length, 0);
    } else {
      type_ids.insert(type_ids.end(), seq.type_ids.begin(), seq.type_ids.end());
    }
    for (int32_t p = 0; p < length; ++p) positions.push_back(p);
  }

  // Embeddings: static (M, H), then hidden (M, H) = LayerNorm(static)
  Tensor static_embeddings({M, H});
  EmbeddingForward(weights.word_embeddings, weights.position_embeddings,
                   weights.token_type_embeddings, token_ids, type_ids, positions,
                   static_embeddings.data());
  Tensor hidden({M, H});
  LayerNormForward(ctx, static_embeddings.data(), M, weights.embedding_norm_gamma,
                   weights.embedding_norm_beta, eps, hidden.data());
  if (options.static_embeddings) result.static_embeddings = std::move(static_embeddings);
  KeepHiddenState(options, 0, hidden, &result);

  Tensor qkv({M, 3 * H});       // (M, 3H)
  Tensor context({M, H});       // (M, H)
  Tensor attn_out({M, H});      // (M, H)
  Tensor intermediate({M, I});  // (M, I)
  Tensor ffn_out({M, H});       // (M, H)
  // Per-sequence attention probabilities when nobody asked for them: (heads, T_max, T_max)
  int64_t max_len = 0;
  for (const SequenceInput& seq : batch) {
    max_len = std::max<int64_t>(max_len, seq.token_ids.size());
  }
  FloatBuffer probs_scratch(static_cast<size_t>(heads * max_len * max_len));

  for (int layer_index = 0; layer_index < config.num_hidden_layers; ++layer_index) {
    const LayerWeights& lw = weights.layers[layer_index];
    // qkv (M, 3H) = hidden · W_qkv^T + b_qkv
    LinearForward(ctx, hidden.data(), M, lw.qkv_weight, lw.qkv_bias, LinearEpilogue::kNone,
                  qkv.data());

    const bool keep_attention = Contains(options.attention_layers, layer_index);
    LayerAttention* layer_attention = nullptr;
    if (keep_attention) {
      result.attentions.push_back(LayerAttention{layer_index, {}});
      layer_attention = &result.attentions.back();
      layer_attention->sequences.resize(batch_size);
    }
    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t begin = result.seq_offsets[b];
      AttentionShape shape;
      shape.tokens = result.seq_offsets[b + 1] - begin;
      shape.heads = heads;
      shape.head_dim = d;
      shape.qkv_stride = 3 * H;
      shape.context_stride = H;
      const int64_t T = shape.tokens;
      const float* seq_qkv = qkv.data() + begin * 3 * H;
      float* probs = probs_scratch.data();
      float* scores = nullptr;
      if (keep_attention) {
        SequenceAttention& out = layer_attention->sequences[b];
        // probs are needed for the context anyway; keep them in the result when asked.
        if (options.attention_probs) {
          out.probs = Tensor({heads, T, T});
          probs = out.probs.data();
        }
        if (options.attention_scores) {
          out.scores = Tensor({heads, T, T});
          scores = out.scores.data();
        }
        if (options.attention_qkv) {
          out.query = Tensor({heads, T, d});
          out.key = Tensor({heads, T, d});
          out.value = Tensor({heads, T, d});
          ExtractHeads(shape, seq_qkv, 0, out.query.data());
          ExtractHeads(shape, seq_qkv, 1, out.key.data());
          ExtractHeads(shape, seq_qkv, 2, out.value.data());
        }
      }
      AttentionForward(ctx, shape, seq_qkv, scores, probs, context.data() + begin * H);
    }

    // attn_out (M, H) = LayerNorm(hidden + context · W_o^T + b_o)
    std::memcpy(ffn_out.data(), hidden.data(), sizeof(float) * M * H);
    LinearForward(ctx, context.data(), M, lw.attn_output_weight, lw.attn_output_bias,
                  LinearEpilogue::kAccumulate, ffn_out.data());
    LayerNormForward(ctx, ffn_out.data(), M, lw.attn_norm_gamma, lw.attn_norm_beta, eps,
                     attn_out.data());
    // intermediate (M, I) = gelu(attn_out · W_i^T + b_i)
    LinearForward(ctx, attn_out.data(), M, lw.ffn_in_weight, lw.ffn_in_bias, LinearEpilogue::kGelu,
                  intermediate.data());
    // hidden (M, H) = LayerNorm(attn_out + intermediate · W_f^T + b_f)
    std::memcpy(ffn_out.data(), attn_out.data(), sizeof(float) * M * H);
    LinearForward(ctx, intermediate.data(), M, lw.ffn_out_weight, lw.ffn_out_bias,
                  LinearEpilogue::kAccumulate, ffn_out.data());
    LayerNormForward(ctx, ffn_out.data(), M, lw.ffn_norm_gamma, lw.ffn_norm_beta, eps,
                     hidden.data());
    KeepHiddenState(options, layer_index + 1, hidden, &result);
  }

  if (options.pool) {
    result.pooled = Tensor({batch_size, H});
    PoolForward(hidden.data(), H, result.seq_offsets, options.pooling, result.pooled.data());
    if (options.normalize) L2NormalizeRows(result.pooled.data(), batch_size, H);
  }
  return result;
}

}  // namespace

absl::StatusOr<ForwardResult> EncoderForward(const BertConfig& config, const BertWeights& weights,
                                             const std::vector<SequenceInput>& batch,
                                             const ForwardOptions& options) {
  if (absl::Status status = ValidateEncoderInput(config, batch, options); !status.ok()) {
    return status;
  }
  try {
    return RunForward(config, weights, batch, options);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN error in the forward pass: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the forward pass");
  }
}

}  // namespace attn
