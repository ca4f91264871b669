#include "server/core/results.h"

#include <algorithm>
#include <cstring>

#include "engine/attention_analysis.h"
#include "engine/explain/sparse_bm42.h"
#include "engine/log.h"
#include "engine/ops/pooling.h"
#include "server/core/long_text.h"

namespace attn::server::core {

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

}  // namespace

namespace {

// The pooled embedding of one sequence, before Matryoshka truncation and normalisation.
void PoolSequence(const EncodePlan& plan, const SequenceView& view, int64_t H, int last_layer,
                  const std::vector<float>& cls_attention, float* out) {
  const float* last_hidden = view.hidden(last_layer, H);
  if (plan.cls_attention_pooling) {
    AttentionWeightedPool(last_hidden, view.length(), H, cls_attention, out);
  } else {
    PoolForward(last_hidden, H, {0, view.length()}, *plan.pooling, out);
  }
}

}  // namespace

void BuildEncodeResults(const Model& model, EncodePlan& plan, const JobOutput& output,
                        std::vector<EncodeResult>* results) {
  const int64_t H = model.config().hidden_size;
  const int last_layer = model.config().num_hidden_layers;
  const size_t inputs = plan.inputs.encodings.size();
  results->resize(inputs);
  size_t first_sequence = 0;  // of input i
  for (size_t i = 0; i < inputs; ++i) {
    const int windows = plan.inputs.windows.empty() ? 1 : plan.inputs.windows[i];
    const SequenceView& view = output.sequences[first_sequence];
    const int64_t T = view.length();
    EncodeResult& result = (*results)[i];
    result.encoding = std::move(plan.inputs.encodings[i]);
    result.chunks = windows;
    const float* last_hidden = view.hidden(last_layer, H);
    std::vector<float> cls_attention;  // (T) the BM42 weights
    auto cls_attention_of = [&](const SequenceView& v) {
      return plan.cls_attention_pooling || plan.sparse
                 ? ClsAttentionOverHeads(v.attention(last_layer - 1).probs)
                 : std::vector<float>();
    };
    cls_attention = cls_attention_of(view);
    if (plan.pooling || plan.cls_attention_pooling) {
      result.embedding.resize(H);
      if (windows == 1) {
        PoolSequence(plan, view, H, last_layer, cls_attention, result.embedding.data());
      } else {
        // LONG_TEXT_CHUNK: each window pooled, then their mean weighted by window length.
        std::vector<float> pooled(static_cast<size_t>(windows * H));
        std::vector<int64_t> lengths(windows);
        for (int k = 0; k < windows; ++k) {
          const SequenceView& window = output.sequences[first_sequence + k];
          PoolSequence(plan, window, H, last_layer, cls_attention_of(window),
                       pooled.data() + k * H);
          lengths[k] = window.length();
        }
        WeightedMeanOfWindows(pooled, lengths, H, result.embedding.data());
      }
      // Matryoshka: truncate first, then normalise what is kept (a unit vector's prefix is not
      // unit length).
      if (plan.dimensions > 0) result.embedding.resize(plan.dimensions);
      if (plan.normalize) {
        L2NormalizeRows(result.embedding.data(), 1, static_cast<int64_t>(result.embedding.size()));
      }
    }
    first_sequence += windows;
    if (windows > 1) continue;  // chunked: a pooled embedding only (long_text.h)
    if (plan.sparse) {
      absl::StatusOr<SparseVector> sparse = plan.bm42->Encode(result.encoding, cls_attention);
      if (sparse.ok()) {
        result.sparse = std::move(*sparse);
      } else {  // only on a length mismatch, which the forward rules out; logged, answered empty
        Log(LogLevel::kError, "BM42 sparse vector failed: %s", sparse.status().ToString());
        result.sparse.emplace();
      }
    }
    if (plan.token_embeddings) result.token_embeddings = {T, H, last_hidden};
    result.hidden_states.reserve(plan.hidden_layers.size());
    for (int layer : plan.hidden_layers) {
      result.hidden_states.push_back({layer, {T, H, view.hidden(layer, H)}});
    }
    if (plan.static_embeddings) {
      result.static_embeddings = {T, H,
                                  view.result->static_embeddings.data() + view.row_begin() * H};
    }
  }
}

void BuildAttentionResults(const Model& model, AttentionPlan& plan, const JobOutput& output,
                           std::vector<AttentionResult>* results) {
  const int num_layers = model.config().num_hidden_layers;
  results->resize(output.sequences.size());
  for (size_t i = 0; i < output.sequences.size(); ++i) {
    const SequenceView& view = output.sequences[i];
    AttentionResult& result = (*results)[i];
    result.encoding = std::move(plan.inputs.encodings[i]);
    result.layers.resize(plan.layers.size());
    for (size_t l = 0; l < plan.layers.size(); ++l) {
      const int layer = plan.layers[l];
      const SequenceAttention& attention = view.attention(layer);
      LayerAttentionResult& out = result.layers[l];
      out.layer = layer;
      if (plan.weights) {
        if (plan.top_k > 0) {
          // Top-k reads whole heads: a copy only when some heads are left out.
          const bool all_heads =
              static_cast<int64_t>(plan.heads.size()) == attention.probs.dim(0) &&
              std::is_sorted(plan.heads.begin(), plan.heads.end());
          TopKRowsResult top = all_heads
                                   ? TopKRows(attention.probs, plan.top_k)
                                   : TopKRows(SelectHeads(attention.probs, plan.heads), plan.top_k);
          out.top_k_values = std::move(top.values);
          out.top_k_indices = std::move(top.indices);
        } else {
          out.weights = &attention.probs;
        }
      }
      if (plan.scores) out.scores = &attention.scores;
      if (plan.qkv) {
        out.query = &attention.query;
        out.key = &attention.key;
        out.value = &attention.value;
      }
      if (plan.mean_over_heads) out.mean_weights = MeanOverHeads(attention.probs);
    }
    if (plan.rollout) {
      std::vector<Tensor> means;
      for (int layer = 0; layer < num_layers; ++layer) {
        means.push_back(MeanOverHeads(view.attention(layer).probs));
      }
      result.rollout = AttentionRollout(means);
    }
  }
}

}  // namespace attn::server::core
