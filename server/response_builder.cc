#include "server/response_builder.h"

#include <cstring>

#include "engine/attention_analysis.h"
#include "engine/ops/pooling.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

v1::DType ToProtoDType(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFloat16:
      return v1::FLOAT16;
    case WireDType::kBFloat16:
      return v1::BFLOAT16;
    default:
      return v1::FLOAT32;
  }
}

void SetTensor(const std::vector<int64_t>& shape, const float* data, WireDType dtype,
               v1::Tensor* out) {
  int64_t count = 1;
  for (int64_t d : shape) {
    out->add_shape(d);
    count *= d;
  }
  out->set_dtype(ToProtoDType(dtype));
  out->set_data(EncodeFloats(data, count, dtype));
}

void SetTensor(const Tensor& tensor, WireDType dtype, v1::Tensor* out) {
  SetTensor(tensor.shape(), tensor.data(), dtype, out);
}

}  // namespace

void FillTokens(const Model& model, const Encoding& encoding,
                google::protobuf::RepeatedPtrField<v1::Token>* tokens) {
  tokens->Reserve(encoding.size());
  for (int t = 0; t < encoding.size(); ++t) {
    v1::Token* token = tokens->Add();
    token->set_id(encoding.ids[t]);
    token->set_text(model.tokenizer().IdToToken(encoding.ids[t]));
    token->set_char_start(encoding.char_start[t]);
    token->set_char_end(encoding.char_end[t]);
    token->set_byte_start(encoding.byte_start[t]);
    token->set_byte_end(encoding.byte_end[t]);
    token->set_type_id(encoding.type_ids[t]);
    token->set_special(encoding.special_tokens_mask[t] != 0);
    token->set_source(encoding.sequence_index[t]);
  }
}

namespace {

// Selected heads of a (heads, T, X) tensor -> (selected, T, X).
Tensor SelectHeads(const Tensor& full, const std::vector<int>& heads) {
  const int64_t per_head = full.numel() / full.dim(0);
  Tensor out({static_cast<int64_t>(heads.size()), full.dim(1), full.dim(2)});
  for (size_t i = 0; i < heads.size(); ++i) {
    std::memcpy(out.data() + i * per_head, full.data() + heads[i] * per_head,
                sizeof(float) * per_head);
  }
  return out;
}

// Selected heads of a (heads, T, X) tensor as a (selected, T, X) message, each head encoded in
// place from the engine's fp32 output.
void SetHeads(const Tensor& full, const std::vector<int>& heads, WireDType dtype, v1::Tensor* out) {
  const int64_t per_head = full.numel() / full.dim(0);
  out->add_shape(static_cast<int64_t>(heads.size()));
  out->add_shape(full.dim(1));
  out->add_shape(full.dim(2));
  out->set_dtype(ToProtoDType(dtype));
  const int64_t head_bytes = per_head * WireDTypeSize(dtype);
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(head_bytes) * heads.size());
  for (size_t i = 0; i < heads.size(); ++i) {
    EncodeFloatsTo(full.data() + heads[i] * per_head, per_head, dtype,
                   data->data() + i * head_bytes);
  }
}

}  // namespace

void BuildEncodeResults(const Model& model, const EncodePlan& p, const JobOutput& output,
                        v1::EncodeResponse* response) {
  const int64_t H = model.config().hidden_size;
  const int last_layer = model.config().num_hidden_layers;
  for (size_t i = 0; i < output.sequences.size(); ++i) {
    const SequenceView& view = output.sequences[i];
    const int64_t T = view.length();
    v1::EncodeResult* result = response->add_results();
    FillInputResult(model, p.inputs.encodings[i], result);
    const float* last_hidden = view.hidden(last_layer, H);
    if (p.pooling) {
      std::vector<float> pooled(H);
      PoolForward(last_hidden, H, {0, T}, *p.pooling, pooled.data());
      if (p.normalize) L2NormalizeRows(pooled.data(), 1, H);
      result->mutable_embedding()->Add(pooled.begin(), pooled.end());
    }
    if (p.token_embeddings) {
      SetTensor({T, H}, last_hidden, p.dtype, result->mutable_token_embeddings());
    }
    for (int layer : p.hidden_layers) {
      v1::LayerTensor* layer_tensor = result->add_hidden_states();
      layer_tensor->set_layer(layer);
      SetTensor({T, H}, view.hidden(layer, H), p.dtype, layer_tensor->mutable_tensor());
    }
    if (p.static_embeddings) {
      SetTensor({T, H}, view.result->static_embeddings.data() + view.row_begin() * H, p.dtype,
                result->mutable_static_embeddings());
    }
  }
}

void BuildAttentionResults(const Model& model, const AttentionPlan& p, const JobOutput& output,
                           v1::AttentionMapResponse* response) {
  const int num_layers = model.config().num_hidden_layers;
  for (size_t i = 0; i < output.sequences.size(); ++i) {
    const SequenceView& view = output.sequences[i];
    v1::AttentionResult* result = response->add_results();
    FillInputResult(model, p.inputs.encodings[i], result);
    for (int layer : p.layers) {
      const SequenceAttention& attention = view.attention(layer);
      v1::LayerAttention* out = result->add_layers();
      out->set_layer(layer);
      out->mutable_heads()->Add(p.heads.begin(), p.heads.end());
      if (p.weights) {
        if (p.top_k > 0) {
          // Top-k reads whole heads: a copy only when some heads are left out.
          const bool all_heads = static_cast<int64_t>(p.heads.size()) == attention.probs.dim(0);
          TopKRowsResult top = all_heads ? TopKRows(attention.probs, p.top_k)
                                         : TopKRows(SelectHeads(attention.probs, p.heads), p.top_k);
          v1::SparseRows* sparse = out->mutable_weights_top_k();
          sparse->set_k(static_cast<int32_t>(top.values.dim(-1)));
          SetTensor(top.values, p.dtype, sparse->mutable_values());
          sparse->mutable_indices()->Add(top.indices.begin(), top.indices.end());
        } else {
          SetHeads(attention.probs, p.heads, p.dtype, out->mutable_weights());
        }
      }
      if (p.scores) {
        SetHeads(attention.scores, p.heads, p.dtype, out->mutable_scores());
      }
      if (p.qkv) {
        SetHeads(attention.query, p.heads, p.dtype, out->mutable_query());
        SetHeads(attention.key, p.heads, p.dtype, out->mutable_key());
        SetHeads(attention.value, p.heads, p.dtype, out->mutable_value());
      }
      if (p.mean_over_heads) {
        SetTensor(MeanOverHeads(attention.probs), p.dtype, out->mutable_mean_weights());
      }
    }
    if (p.rollout) {
      std::vector<Tensor> means;
      for (int layer = 0; layer < num_layers; ++layer) {
        means.push_back(MeanOverHeads(view.attention(layer).probs));
      }
      SetTensor(AttentionRollout(means), p.dtype, result->mutable_rollout());
    }
  }
}

}  // namespace attn::server
