#include "engine/inference_weights.h"

namespace attn {

namespace {

PreparedLinear PrepareLinear(const Tensor& weight, const Tensor& bias, Precision precision,
                             bool pack) {
  if (precision == Precision::kInt8) return PreparedLinear::Int8Outliers(weight, bias);
  if (precision == Precision::kBf16) return PreparedLinear::Bf16(weight, bias);
  return pack ? PreparedLinear::Fp32Packed(weight, bias) : PreparedLinear::Fp32View(weight, bias);
}

InferenceLayer PrepareLayer(const LayerWeights& lw, Precision precision, bool pack,
                            const Int8Linears& int8) {
  // Int8Linears picks the int8 layers; bf16 and fp32 apply to all.
  auto at = [&](bool quantise) {
    return precision != Precision::kInt8 || quantise ? precision : Precision::kFp32;
  };
  InferenceLayer layer;
  layer.qkv = PrepareLinear(lw.qkv_weight, lw.qkv_bias, at(int8.qkv), pack);
  layer.attn_output =
      PrepareLinear(lw.attn_output_weight, lw.attn_output_bias, at(int8.attn_output), pack);
  layer.ffn_in = PrepareLinear(lw.ffn_in_weight, lw.ffn_in_bias, at(int8.ffn_in), pack);
  layer.ffn_out = PrepareLinear(lw.ffn_out_weight, lw.ffn_out_bias, at(int8.ffn_out), pack);
  return layer;
}

}  // namespace

InferenceWeights InferenceWeights::View(const BertWeights& weights) {
  InferenceWeights result;
  result.weights_ = &weights;
  result.precision_ = Precision::kFp32;
  for (const LayerWeights& lw : weights.layers) {
    result.layers_.push_back(PrepareLayer(lw, Precision::kFp32, /*pack=*/false, {}));
  }
  return result;
}

InferenceWeights InferenceWeights::Prepare(const BertWeights& weights, Precision precision,
                                           const Int8Linears& int8_linears) {
  InferenceWeights result;
  result.weights_ = &weights;
  result.precision_ = precision;
  for (const LayerWeights& lw : weights.layers) {
    result.layers_.push_back(PrepareLayer(lw, precision, /*pack=*/true, int8_linears));
  }
  return result;
}

}  // namespace attn
