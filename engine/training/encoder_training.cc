#include "engine/training/encoder_training.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/dnnl_context.h"
#include "engine/ops/dropout.h"
#include "engine/ops/embedding.h"
#include "engine/ops/fused_attention.h"
#include "engine/ops/gelu.h"
#include "engine/ops/layernorm.h"
#include "engine/ops/linear.h"
#include "engine/ops/relative_position_bias.h"

namespace attn {
namespace {

// Dropout sites get disjoint RNG counter ranges: site id in the top bits, element index below.
enum DropoutSite : uint64_t {
  kEmbeddings = 0,
  kAttentionProbs = 1,
  kAttentionDense = 2,
  kFfnDense = 3
};

uint64_t DropoutOffset(int layer, DropoutSite site) {
  return (static_cast<uint64_t>(layer + 1) * 8 + site) << 40;
}

uint64_t StepSeed(const TrainingForwardOptions& options) {
  // Different steps draw different masks; splitmix-style mixing keeps nearby seeds apart.
  uint64_t z = options.seed + 0x9E3779B97F4A7C15ull * (options.step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// y = dropout(x) in place when p > 0, keeping the mask; nothing when p == 0.
void MaybeDropout(float* data, int64_t n, float p, uint64_t seed, uint64_t offset,
                  std::vector<uint8_t>* mask) {
  if (p <= 0.0f) return;
  mask->resize(n);
  DropoutForward(data, n, p, seed, offset, data, mask->data());
}

// d (n) in place through the dropout with `mask` (no-op when the site had no dropout).
void MaybeDropoutBackward(float* d, int64_t n, float p, const std::vector<uint8_t>& mask) {
  if (mask.empty()) return;
  DropoutBackward(d, mask.data(), n, p, d);
}

void AddInto(float* target, const float* source, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) target[i] += source[i];
}

int64_t LongestSequence(const std::vector<int64_t>& seq_offsets) {
  int64_t longest = 1;
  for (size_t b = 0; b + 1 < seq_offsets.size(); ++b) {
    longest = std::max(longest, seq_offsets[b + 1] - seq_offsets[b]);
  }
  return longest;
}

PackedAttentionShape PackedShapeOf(const BertConfig& config) {
  PackedAttentionShape shape;
  shape.heads = config.num_attention_heads;
  shape.head_dim = config.head_dim();
  return shape;
}

// Pointers into the layer's per-sequence attention buffers (the backward only reads them).
PackedAttentionSaved SavedAttention(LayerActivations& a) {
  PackedAttentionSaved saved;
  for (Tensor& probs : a.probs) saved.probs.push_back(probs.data());
  for (Tensor& dropped : a.probs_dropped) saved.probs_dropped.push_back(dropped.data());
  for (std::vector<uint8_t>& mask : a.probs_masks) saved.masks.push_back(mask.data());
  return saved;
}
// The backward only reads through the pointers (mutable because the forward fills them).
PackedAttentionSaved SavedAttention(const LayerActivations& a) {
  return SavedAttention(const_cast<LayerActivations&>(a));
}

// *t shaped `shape`, keeping its buffer when the element count matches: the contents are then
// stale, so only for outputs whose every element is written.
void ShapeForOutput(Tensor* t, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  if (t->numel() == n) {
    t->Reshape(std::move(shape));
  } else {
    *t = Tensor(std::move(shape));
  }
}

// Layers [first_layer, L) of the training forward; f.layers[first_layer].input holds their input.
void RunTrainingLayers(const BertConfig& config, const BertWeights& weights, int first_layer,
                       const TrainingForwardOptions& options, ExecContext* context,
                       TrainingForward* out) {
  ExecContext& ctx = *context;
  TrainingForward& f = *out;
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  const int64_t heads = config.num_attention_heads;
  const float eps = config.layer_norm_eps;
  const uint64_t seed = StepSeed(options);
  const int64_t B = static_cast<int64_t>(f.seq_offsets.size()) - 1;
  const int L = config.num_hidden_layers;
  const int64_t M = f.total_tokens();
  auto layer_input = [&](int l) -> Tensor& { return l < L ? f.layers[l].input : f.output; };
  // MPNet: the relative position bias of the longest sequence, shared by every layer.
  PackedAttentionShape attention_shape = PackedShapeOf(config);
  std::optional<RelativePositionBias> relative_bias;
  if (config.spec().relative_attention_bias) {
    relative_bias = RelativePositionBiasForward(weights.relative_attention_bias,
                                                LongestSequence(f.seq_offsets));
    attention_shape.relative_bias = &*relative_bias;
  }
  for (int l = first_layer; l < L; ++l) {
    const LayerWeights& w = weights.layers[l];
    LayerActivations& a = f.layers[l];
    // qkv (M, 3H) = x · W_qkv^T + b_qkv
    ShapeForOutput(&a.qkv, {M, 3 * H});
    LinearForward(ctx, a.input.data(), M, w.qkv_weight, w.qkv_bias, LinearEpilogue::kNone,
                  a.qkv.data(), options.matmul_inputs);
    // per sequence: probs = softmax(Q K^T / sqrt(d) (+ bias)); context = dropout(probs) · V
    ShapeForOutput(&a.context, {M, H});
    a.probs.resize(B);
    const bool attention_dropout = options.attention_dropout > 0.0f;
    a.probs_dropped.resize(attention_dropout ? B : 0);
    a.probs_masks.resize(attention_dropout ? B : 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T = f.seq_offsets[b + 1] - f.seq_offsets[b];
      ShapeForOutput(&a.probs[b], {heads, T, T});
      if (attention_dropout) {
        ShapeForOutput(&a.probs_dropped[b], {heads, T, T});
        a.probs_masks[b].resize(heads * T * T);
      }
    }
    // Sequence b draws counters from DropoutOffset(l, kAttentionProbs) + sum of the earlier
    // sequences' heads*T*T (see PackedAttentionForwardTraining).
    PackedAttentionForwardTraining(
        attention_shape, a.qkv.data(), f.seq_offsets, options.attention_dropout, seed,
        DropoutOffset(l, kAttentionProbs), SavedAttention(a), a.context.data());
    // attn_sum (M, H) = x + dropout(context · W_o^T + b_o); attn_out = LayerNorm(attn_sum)
    ShapeForOutput(&a.attn_sum, {M, H});
    LinearForward(ctx, a.context.data(), M, w.attn_output_weight, w.attn_output_bias,
                  LinearEpilogue::kNone, a.attn_sum.data(), options.matmul_inputs);
    a.attn_dense_mask.clear();
    MaybeDropout(a.attn_sum.data(), M * H, options.hidden_dropout, seed,
                 DropoutOffset(l, kAttentionDense), &a.attn_dense_mask);
    AddInto(a.attn_sum.data(), a.input.data(), M * H);
    a.attn_mean.resize(M);
    a.attn_variance.resize(M);
    ShapeForOutput(&a.attn_out, {M, H});
    LayerNormForwardTraining(ctx, a.attn_sum.data(), M, w.attn_norm_gamma, w.attn_norm_beta, eps,
                             a.attn_out.data(), a.attn_mean.data(), a.attn_variance.data());
    // ffn_pre (M, I) = attn_out · W_i^T + b_i; ffn_act = gelu(ffn_pre)
    ShapeForOutput(&a.ffn_pre, {M, I});
    LinearForward(ctx, a.attn_out.data(), M, w.ffn_in_weight, w.ffn_in_bias, LinearEpilogue::kNone,
                  a.ffn_pre.data(), options.matmul_inputs);
    ShapeForOutput(&a.ffn_act, {M, I});
    GeluForward(ctx, a.ffn_pre.data(), M * I, a.ffn_act.data());
    // ffn_sum (M, H) = attn_out + dropout(ffn_act · W_f^T + b_f); output = LayerNorm(ffn_sum)
    ShapeForOutput(&a.ffn_sum, {M, H});
    LinearForward(ctx, a.ffn_act.data(), M, w.ffn_out_weight, w.ffn_out_bias, LinearEpilogue::kNone,
                  a.ffn_sum.data(), options.matmul_inputs);
    a.ffn_dense_mask.clear();
    MaybeDropout(a.ffn_sum.data(), M * H, options.hidden_dropout, seed, DropoutOffset(l, kFfnDense),
                 &a.ffn_dense_mask);
    AddInto(a.ffn_sum.data(), a.attn_out.data(), M * H);
    a.ffn_mean.resize(M);
    a.ffn_variance.resize(M);
    Tensor& output = layer_input(l + 1);
    ShapeForOutput(&output, {M, H});
    LayerNormForwardTraining(ctx, a.ffn_sum.data(), M, w.ffn_norm_gamma, w.ffn_norm_beta, eps,
                             output.data(), a.ffn_mean.data(), a.ffn_variance.data());
  }
}

// Fills *f, reusing its buffers (every one is fully overwritten).
void RunTrainingForward(const BertConfig& config, const BertWeights& weights,
                        const std::vector<SequenceInput>& batch,
                        const TrainingForwardOptions& options, TrainingForward* out) {
  ExecContext ctx;
  TrainingForward& f = *out;
  const int64_t H = config.hidden_size;
  const float eps = config.layer_norm_eps;
  const uint64_t seed = StepSeed(options);
  const int64_t B = static_cast<int64_t>(batch.size());
  const int L = config.num_hidden_layers;

  f.options = options;
  f.first_layer = 0;
  f.seq_offsets.assign(B + 1, 0);
  f.token_ids.clear();
  f.type_ids.clear();
  f.positions.clear();
  for (int64_t b = 0; b < B; ++b) {
    const SequenceInput& seq = batch[b];
    const int32_t length = static_cast<int32_t>(seq.token_ids.size());
    f.seq_offsets[b + 1] = f.seq_offsets[b] + length;
    f.token_ids.insert(f.token_ids.end(), seq.token_ids.begin(), seq.token_ids.end());
    if (seq.type_ids.empty()) {
      f.type_ids.insert(f.type_ids.end(), length, 0);
    } else {
      f.type_ids.insert(f.type_ids.end(), seq.type_ids.begin(), seq.type_ids.end());
    }
    AppendPositionIds(config, seq.token_ids, &f.positions);
  }
  const int64_t M = f.total_tokens();
  f.layers.resize(L);
  // Layer l's input is layer l-1's output: each LayerNorm writes straight into the next input.
  auto layer_input = [&](int l) -> Tensor& { return l < L ? f.layers[l].input : f.output; };

  // static (M, H); hidden (M, H) = dropout(LayerNorm(static))
  ShapeForOutput(&f.static_embeddings, {M, H});
  EmbeddingForward(weights.word_embeddings, weights.position_embeddings,
                   weights.token_type_embeddings, f.token_ids, f.type_ids, f.positions,
                   f.static_embeddings.data());
  f.emb_mean.resize(M);
  f.emb_variance.resize(M);
  Tensor& emb = layer_input(0);
  ShapeForOutput(&emb, {M, H});
  LayerNormForwardTraining(ctx, f.static_embeddings.data(), M, weights.embedding_norm_gamma,
                           weights.embedding_norm_beta, eps, emb.data(), f.emb_mean.data(),
                           f.emb_variance.data());
  f.emb_mask.clear();
  MaybeDropout(emb.data(), M * H, options.hidden_dropout, seed, DropoutOffset(-1, kEmbeddings),
               &f.emb_mask);

  RunTrainingLayers(config, weights, 0, options, &ctx, &f);
}

}  // namespace

absl::StatusOr<TrainingForward> EncoderForwardTraining(const BertConfig& config,
                                                       const BertWeights& weights,
                                                       const std::vector<SequenceInput>& batch,
                                                       const TrainingForwardOptions& options) {
  TrainingForward forward;
  if (absl::Status status = EncoderForwardTraining(config, weights, batch, options, &forward);
      !status.ok()) {
    return status;
  }
  return forward;
}

absl::Status EncoderForwardTraining(const BertConfig& config, const BertWeights& weights,
                                    const std::vector<SequenceInput>& batch,
                                    const TrainingForwardOptions& options,
                                    TrainingForward* forward) {
  if (absl::Status status = ValidateEncoderInput(config, batch, ForwardOptions{}); !status.ok()) {
    return status;
  }
  for (float p : {options.hidden_dropout, options.attention_dropout}) {
    if (!(p >= 0.0f && p < 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("dropout probability ", p, " outside [0, 1)"));
    }
  }
  try {
    RunTrainingForward(config, weights, batch, options, forward);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN error in the training forward: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the training forward");
  }
  return absl::OkStatus();
}

absl::Status EncoderForwardTrainingFromHidden(const BertConfig& config, const BertWeights& weights,
                                              const std::vector<int64_t>& seq_offsets,
                                              int first_layer, const float* hidden,
                                              const TrainingForwardOptions& options,
                                              TrainingForward* forward) {
  const int L = config.num_hidden_layers;
  if (first_layer < 0 || first_layer > L) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", first_layer, " out of range [0, ", L, "]"));
  }
  if (seq_offsets.empty() || seq_offsets.front() != 0 ||
      !std::is_sorted(seq_offsets.begin(), seq_offsets.end())) {
    return absl::InvalidArgumentError("sequence offsets must start at 0 and not decrease");
  }
  TrainingForward& f = *forward;
  f = TrainingForward();
  f.options = options;
  f.first_layer = first_layer;
  f.seq_offsets = seq_offsets;
  const int64_t M = f.total_tokens(), H = config.hidden_size;
  f.layers.resize(L);
  Tensor& input = first_layer < L ? f.layers[first_layer].input : f.output;
  input = Tensor({M, H});
  std::copy_n(hidden, M * H, input.data());
  try {
    ExecContext ctx;
    RunTrainingLayers(config, weights, first_layer, options, &ctx, &f);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN error in the training forward: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the training forward");
  }
  return absl::OkStatus();
}

BertWeights ZerosLike(const BertWeights& weights) {
  BertWeights zeros;
  // An absent tensor (MPNet's token types, BERT's relative bias) stays absent: Tensor({}) would
  // be one element, and EngineTensors() would then pair gradients with the wrong parameters.
  auto like = [](const Tensor& t) { return t.numel() == 0 ? Tensor() : Tensor(t.shape()); };
  zeros.word_embeddings = like(weights.word_embeddings);
  zeros.position_embeddings = like(weights.position_embeddings);
  zeros.token_type_embeddings = like(weights.token_type_embeddings);
  zeros.embedding_norm_gamma = like(weights.embedding_norm_gamma);
  zeros.embedding_norm_beta = like(weights.embedding_norm_beta);
  zeros.relative_attention_bias = like(weights.relative_attention_bias);
  for (const LayerWeights& w : weights.layers) {
    LayerWeights z;
    z.qkv_weight = like(w.qkv_weight);
    z.qkv_bias = like(w.qkv_bias);
    z.attn_output_weight = like(w.attn_output_weight);
    z.attn_output_bias = like(w.attn_output_bias);
    z.attn_norm_gamma = like(w.attn_norm_gamma);
    z.attn_norm_beta = like(w.attn_norm_beta);
    z.ffn_in_weight = like(w.ffn_in_weight);
    z.ffn_in_bias = like(w.ffn_in_bias);
    z.ffn_out_weight = like(w.ffn_out_weight);
    z.ffn_out_bias = like(w.ffn_out_bias);
    z.ffn_norm_gamma = like(w.ffn_norm_gamma);
    z.ffn_norm_beta = like(w.ffn_norm_beta);
    zeros.layers.push_back(std::move(z));
  }
  return zeros;
}

namespace {

// grads->word_embeddings (+)= the scatter of d_static; zeroes the rows the previous call left
// non-zero first (the whole table when that is unknown) and records this call's rows.
void WordEmbeddingBackward(const TrainingForward& f, const float* d_static, int64_t H,
                           Tensor* dword, BackwardWorkspace* ws) {
  if (ws->word_rows_valid) {
    for (const int32_t row : ws->word_rows) std::fill_n(dword->data() + row * H, H, 0.0f);
  } else {
    std::fill(dword->values().begin(), dword->values().end(), 0.0f);
  }
  ws->word_rows.assign(f.token_ids.begin(), f.token_ids.end());
  std::sort(ws->word_rows.begin(), ws->word_rows.end());
  ws->word_rows.erase(std::unique(ws->word_rows.begin(), ws->word_rows.end()), ws->word_rows.end());
  ws->word_rows_valid = true;
  EmbeddingBackward(d_static, H, f.token_ids, f.type_ids, f.positions, dword, nullptr, nullptr);
}

void RunBackward(const BertConfig& config, const BertWeights& weights, const TrainingForward& f,
                 const float* d_output, BertWeights* grads, bool compute_embedding_grads,
                 BackwardWorkspace* ws) {
  if (ws->context == nullptr) ws->context = std::make_unique<ExecContext>();
  ExecContext& ctx = *ws->context;
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  const float eps = config.layer_norm_eps;
  const float p_hidden = f.options.hidden_dropout;
  const float p_attention = f.options.attention_dropout;
  const int64_t M = f.total_tokens();

  // Every buffer is fully written before it is read.
  Tensor& d_hidden = ws->d_hidden;  // gradient w.r.t. the current layer's output
  Tensor& d_sum = ws->d_sum;
  Tensor& d_attn_out = ws->d_attn_out;
  Tensor& d_context = ws->d_context;
  Tensor& d_input = ws->d_input;
  Tensor& d_ffn_act = ws->d_ffn_act;
  Tensor& d_ffn_pre = ws->d_ffn_pre;
  Tensor& d_qkv = ws->d_qkv;
  for (Tensor* t : {&d_hidden, &d_sum, &d_attn_out, &d_context, &d_input}) {
    ShapeForOutput(t, {M, H});
  }
  ShapeForOutput(&d_ffn_act, {M, I});
  ShapeForOutput(&d_ffn_pre, {M, I});
  ShapeForOutput(&d_qkv, {M, 3 * H});
  std::memcpy(d_hidden.data(), d_output, sizeof(float) * M * H);

  // MPNet: the bias gradient (heads, 2L-1), summed over layers (one table serves them all),
  // scattered into the table's buckets at the end. The bias values themselves are not needed.
  PackedAttentionShape attention_shape = PackedShapeOf(config);
  RelativePositionBias bias_shape;  // max_tokens only
  std::vector<float> d_relative(0);
  if (config.spec().relative_attention_bias) {
    bias_shape.heads = config.num_attention_heads;
    bias_shape.max_tokens = LongestSequence(f.seq_offsets);
    attention_shape.relative_bias = &bias_shape;
    if (grads != nullptr)
      d_relative.assign(bias_shape.heads * (2 * bias_shape.max_tokens - 1), 0.0f);
  }
  // grads == nullptr: input gradients only, down to the layer the forward started from.
  LayerWeights no_grads;
  const int last_layer = grads == nullptr ? f.first_layer : 0;
  for (int l = config.num_hidden_layers - 1; l >= last_layer; --l) {
    const LayerWeights& w = weights.layers[l];
    LayerWeights& g = grads != nullptr ? grads->layers[l] : no_grads;
    const auto param = [&](Tensor& t) { return grads != nullptr ? &t : nullptr; };
    const LayerActivations& a = f.layers[l];
    // output = LayerNorm(ffn_sum): d_sum (M, H)
    LayerNormBackward(ctx, a.ffn_sum.data(), M, w.ffn_norm_gamma, a.ffn_mean.data(),
                      a.ffn_variance.data(), eps, d_hidden.data(), d_sum.data(),
                      param(g.ffn_norm_gamma), param(g.ffn_norm_beta), /*accumulate=*/false);
    // ffn_sum = attn_out + dropout(ffn_act · W_f^T + b_f): the residual passes d_sum on to
    // attn_out; the dense branch gets it through the dropout mask.
    std::memcpy(d_attn_out.data(), d_sum.data(), sizeof(float) * M * H);
    MaybeDropoutBackward(d_sum.data(), M * H, p_hidden, a.ffn_dense_mask);
    LinearBackward(ctx, a.ffn_act.data(), M, w.ffn_out_weight, d_sum.data(), d_ffn_act.data(),
                   param(g.ffn_out_weight), param(g.ffn_out_bias), /*accumulate=*/false,
                   f.options.matmul_inputs);
    // ffn_act = gelu(ffn_pre)
    GeluBackward(ctx, a.ffn_pre.data(), d_ffn_act.data(), M * I, d_ffn_pre.data());
    // ffn_pre = attn_out · W_i^T + b_i  (adds to the residual gradient of attn_out)
    LinearBackward(ctx, a.attn_out.data(), M, w.ffn_in_weight, d_ffn_pre.data(), d_input.data(),
                   param(g.ffn_in_weight), param(g.ffn_in_bias), /*accumulate=*/false,
                   f.options.matmul_inputs);
    AddInto(d_attn_out.data(), d_input.data(), M * H);
    // attn_out = LayerNorm(attn_sum)
    LayerNormBackward(ctx, a.attn_sum.data(), M, w.attn_norm_gamma, a.attn_mean.data(),
                      a.attn_variance.data(), eps, d_attn_out.data(), d_sum.data(),
                      param(g.attn_norm_gamma), param(g.attn_norm_beta), /*accumulate=*/false);
    // attn_sum = x + dropout(context · W_o^T + b_o): residual to x, dense branch to context.
    std::memcpy(d_hidden.data(), d_sum.data(), sizeof(float) * M * H);
    MaybeDropoutBackward(d_sum.data(), M * H, p_hidden, a.attn_dense_mask);
    LinearBackward(ctx, a.context.data(), M, w.attn_output_weight, d_sum.data(), d_context.data(),
                   param(g.attn_output_weight), param(g.attn_output_bias), /*accumulate=*/false,
                   f.options.matmul_inputs);
    // context = dropout(softmax(Q K^T / sqrt(d) (+ bias))) · V, per sequence -> d_qkv (M, 3H)
    // (and d_relative += dS per relative position)
    PackedAttentionBackward(attention_shape, a.qkv.data(), f.seq_offsets, SavedAttention(a),
                            p_attention, d_context.data(), d_qkv.data(),
                            d_relative.empty() ? nullptr : d_relative.data());
    // qkv = x · W_qkv^T + b_qkv  (adds to the residual gradient of x)
    LinearBackward(ctx, a.input.data(), M, w.qkv_weight, d_qkv.data(), d_input.data(),
                   param(g.qkv_weight), param(g.qkv_bias), /*accumulate=*/false,
                   f.options.matmul_inputs);
    AddInto(d_hidden.data(), d_input.data(), M * H);  // d_hidden is now d(layer input)
  }

  if (grads == nullptr) return;  // d_hidden: the gradient w.r.t. layer last_layer's input
  if (!d_relative.empty()) {
    // bias[h][r] = table[bucket(r)][h]
    std::fill(grads->relative_attention_bias.values().begin(),
              grads->relative_attention_bias.values().end(), 0.0f);
    RelativePositionBiasBackward(d_relative.data(), bias_shape.heads, bias_shape.max_tokens,
                                 &grads->relative_attention_bias);
  }
  // emb = dropout(LayerNorm(static))
  MaybeDropoutBackward(d_hidden.data(), M * H, p_hidden, f.emb_mask);
  LayerNormBackward(ctx, f.static_embeddings.data(), M, weights.embedding_norm_gamma,
                    f.emb_mean.data(), f.emb_variance.data(), eps, d_hidden.data(), d_sum.data(),
                    &grads->embedding_norm_gamma, &grads->embedding_norm_beta,
                    /*accumulate=*/false);
  if (compute_embedding_grads) {
    // static = word[id] + position[pos] + type[type]: scatter-add into the tables.
    WordEmbeddingBackward(f, d_sum.data(), H, &grads->word_embeddings, ws);
    std::fill(grads->position_embeddings.values().begin(),
              grads->position_embeddings.values().end(), 0.f);
    std::fill(grads->token_type_embeddings.values().begin(),
              grads->token_type_embeddings.values().end(), 0.f);
    Tensor* dtype = grads->token_type_embeddings.numel() > 0 ? &grads->token_type_embeddings
                                                             : nullptr;  // MPNet: no types
    EmbeddingBackward(d_sum.data(), H, f.token_ids, f.type_ids, f.positions, nullptr,
                      &grads->position_embeddings, dtype);
  }
}

}  // namespace

absl::Status EncoderBackward(const BertConfig& config, const BertWeights& weights,
                             const TrainingForward& forward, const float* d_output,
                             BertWeights* grads, bool compute_embedding_grads) {
  BackwardWorkspace workspace;
  return EncoderBackward(config, weights, forward, d_output, grads, compute_embedding_grads,
                         &workspace);
}

absl::Status EncoderBackward(const BertConfig& config, const BertWeights& weights,
                             const TrainingForward& forward, const float* d_output,
                             BertWeights* grads, bool compute_embedding_grads,
                             BackwardWorkspace* workspace) {
  if (grads->layers.size() != weights.layers.size()) {
    return absl::InvalidArgumentError("gradient buffers are not shaped like the weights");
  }
  try {
    RunBackward(config, weights, forward, d_output, grads, compute_embedding_grads, workspace);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN error in the backward pass: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the backward pass");
  }
  return absl::OkStatus();
}

absl::Status EncoderInputBackward(const BertConfig& config, const BertWeights& weights,
                                  const TrainingForward& forward, const float* d_output,
                                  float* d_input, BackwardWorkspace* workspace) {
  try {
    RunBackward(config, weights, forward, d_output, /*grads=*/nullptr,
                /*compute_embedding_grads=*/false, workspace);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN error in the backward pass: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the backward pass");
  }
  std::copy_n(workspace->d_hidden.data(), forward.total_tokens() * config.hidden_size, d_input);
  return absl::OkStatus();
}

}  // namespace attn
