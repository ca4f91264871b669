#include "server/proto_convert.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

absl::Span<const int32_t> View(const google::protobuf::RepeatedField<int32_t>& field) {
  return absl::MakeConstSpan(field.data(), field.size());
}

std::vector<core::Input> ToCore(const google::protobuf::RepeatedPtrField<v1::Input>& inputs) {
  std::vector<core::Input> out(inputs.size());
  for (int i = 0; i < inputs.size(); ++i) {
    const v1::Input& input = inputs[i];
    core::Input& in = out[i];
    switch (input.kind_case()) {
      case v1::Input::kText:
        in.kind = core::Input::Kind::kText;
        in.text = input.text();
        break;
      case v1::Input::kPair:
        in.kind = core::Input::Kind::kPair;
        in.text = input.pair().first();
        in.second = input.pair().second();
        break;
      case v1::Input::kTokens:
        in.kind = core::Input::Kind::kTokens;
        in.ids = View(input.tokens().ids());
        in.type_ids = View(input.tokens().type_ids());
        break;
      case v1::Input::KIND_NOT_SET:
        break;
    }
  }
  return out;
}

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

void SetTensor(std::initializer_list<int64_t> shape, const float* data, WireDType dtype,
               v1::Tensor* out) {
  int64_t count = 1;
  for (int64_t d : shape) {
    out->add_shape(d);
    count *= d;
  }
  out->set_dtype(ToProtoDType(dtype));
  out->set_data(EncodeFloats(data, count, dtype));
}

void SetTensor(const core::MatrixView& view, WireDType dtype, v1::Tensor* out) {
  SetTensor({view.rows, view.cols}, view.data, dtype, out);
}

void SetTensor(const Tensor& tensor, WireDType dtype, v1::Tensor* out) {
  for (int64_t d : tensor.shape()) out->add_shape(d);
  out->set_dtype(ToProtoDType(dtype));
  out->set_data(EncodeFloats(tensor.data(), tensor.numel(), dtype));
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

void SetTokenList(const Model& model, const Encoding& encoding,
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

// Tokens and truncation info of one input, for any result message that has them.
template <typename Result>
void SetTokens(const Model& model, const Encoding& encoding, Result* result) {
  SetTokenList(model, encoding, result->mutable_tokens());
  result->set_truncated(encoding.truncated);
  result->set_untruncated_length(encoding.untruncated_length);
  result->set_untruncated_length_is_lower_bound(encoding.untruncated_length_is_lower_bound);
}

void SetMetadata(const core::Metadata& metadata, bool engine_call, v1::ResponseMetadata* out) {
  out->set_token_count(metadata.token_count);
  out->set_tokenization_ms(metadata.tokenization_ms);
  if (engine_call) {
    out->set_queue_ms(metadata.queue_ms);
    out->set_inference_ms(metadata.inference_ms);
    out->set_batch_inputs(metadata.batch_inputs);
  }
  out->set_total_ms(metadata.total_ms);
}

}  // namespace

core::TokenizationOptions ToCore(const v1::TokenizationOptions& options) {
  return {static_cast<core::Truncation>(options.truncation()), options.max_length()};
}

core::EncodeRequest ToCore(const v1::EncodeRequest& request) {
  core::EncodeRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.inputs = ToCore(request.inputs());
  out.tokenization = ToCore(request.tokenization());
  out.pooling = static_cast<core::Pooling>(request.pooling());
  if (request.has_normalize()) out.normalize = request.normalize();
  out.token_embeddings = request.return_token_embeddings();
  out.hidden_layers = View(request.hidden_layers());
  out.static_embeddings = request.return_static_embeddings();
  out.output_dtype = static_cast<core::OutputDType>(request.output_dtype());
  out.sparse = request.sparse();
  if (request.has_dimensions()) out.dimensions = request.dimensions();
  out.long_text = static_cast<core::LongText>(request.long_text());
  if (request.has_chunk_overlap()) out.chunk_overlap = request.chunk_overlap();
  return out;
}

core::AttentionRequest ToCore(const v1::AttentionMapRequest& request) {
  core::AttentionRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.inputs = ToCore(request.inputs());
  out.tokenization = ToCore(request.tokenization());
  out.layers = View(request.layers());
  out.heads = View(request.heads());
  if (request.has_include_weights()) out.include_weights = request.include_weights();
  out.include_scores = request.include_scores();
  out.include_qkv = request.include_qkv();
  out.mean_over_heads = request.mean_over_heads();
  out.rollout = request.rollout();
  out.top_k = request.top_k();
  out.output_dtype = static_cast<core::OutputDType>(request.output_dtype());
  return out;
}

core::TokenizeRequest ToCore(const v1::TokenizeRequest& request) {
  core::TokenizeRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.inputs = ToCore(request.inputs());
  out.tokenization = ToCore(request.tokenization());
  return out;
}

core::ExplainRequest ToCore(const v1::ExplainRequest& request) {
  core::ExplainRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.query = request.query();
  out.documents.assign(request.documents().begin(), request.documents().end());
  out.method = static_cast<core::ExplainMethod>(request.method());
  if (request.has_steps()) out.steps = request.steps();
  out.layer = request.layer();
  out.baseline = static_cast<core::ExplainBaseline>(request.baseline());
  out.word_level = request.word_level();
  return out;
}

core::ClassifyRequest ToCore(const v1::ClassifyRequest& request) {
  core::ClassifyRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.inputs = ToCore(request.inputs());
  out.tokenization = ToCore(request.tokenization());
  out.top_k = request.top_k();
  return out;
}

core::RerankRequest ToCore(const v1::RerankRequest& request) {
  core::RerankRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  out.query = request.query();
  out.documents.assign(request.documents().begin(), request.documents().end());
  out.top_n = request.top_n();
  out.method = static_cast<core::RerankMethod>(request.method());
  out.tokenization = ToCore(request.tokenization());
  out.return_documents = request.return_documents();
  return out;
}

core::ModelInfoRequest ToCore(const v1::GetModelInfoRequest& request) {
  core::ModelInfoRequest out;
  out.model = request.model();
  out.model_version = request.model_version();
  return out;
}

void ToProto(const core::EncodeResponse& response, v1::EncodeResponse* out) {
  const WireDType dtype = response.dtype;
  out->mutable_results()->Reserve(static_cast<int>(response.results.size()));
  for (const core::EncodeResult& result : response.results) {
    v1::EncodeResult* proto = out->add_results();
    SetTokens(*response.model, result.encoding, proto);
    proto->set_chunks(result.chunks);
    if (!result.embedding.empty()) {
      proto->mutable_embedding()->Add(result.embedding.begin(), result.embedding.end());
    }
    if (result.token_embeddings.data != nullptr) {
      SetTensor(result.token_embeddings, dtype, proto->mutable_token_embeddings());
    }
    for (const auto& [layer, view] : result.hidden_states) {
      v1::LayerTensor* layer_tensor = proto->add_hidden_states();
      layer_tensor->set_layer(layer);
      SetTensor(view, dtype, layer_tensor->mutable_tensor());
    }
    if (result.static_embeddings.data != nullptr) {
      SetTensor(result.static_embeddings, dtype, proto->mutable_static_embeddings());
    }
    if (result.sparse) {
      v1::SparseVector* sparse = proto->mutable_sparse();
      sparse->mutable_indices()->Add(result.sparse->indices.begin(), result.sparse->indices.end());
      sparse->mutable_values()->Add(result.sparse->values.begin(), result.sparse->values.end());
    }
  }
  out->set_model_version(response.model_version);
  SetMetadata(response.metadata, true, out->mutable_metadata());
}

void ToProto(const core::AttentionResponse& response, v1::AttentionMapResponse* out) {
  const WireDType dtype = response.dtype;
  auto present = [](const Tensor& tensor) { return tensor.rank() > 0; };
  for (const core::AttentionResult& result : response.results) {
    v1::AttentionResult* proto = out->add_results();
    SetTokens(*response.model, result.encoding, proto);
    for (const core::LayerAttentionResult& layer : result.layers) {
      v1::LayerAttention* layer_out = proto->add_layers();
      layer_out->set_layer(layer.layer);
      layer_out->mutable_heads()->Add(response.heads.begin(), response.heads.end());
      if (present(layer.top_k_values)) {
        v1::SparseRows* sparse = layer_out->mutable_weights_top_k();
        sparse->set_k(static_cast<int32_t>(layer.top_k_values.dim(-1)));
        SetTensor(layer.top_k_values, dtype, sparse->mutable_values());
        sparse->mutable_indices()->Add(layer.top_k_indices.begin(), layer.top_k_indices.end());
      } else if (layer.weights != nullptr) {
        SetHeads(*layer.weights, response.heads, dtype, layer_out->mutable_weights());
      }
      if (layer.scores != nullptr) {
        SetHeads(*layer.scores, response.heads, dtype, layer_out->mutable_scores());
      }
      if (layer.query != nullptr) {
        SetHeads(*layer.query, response.heads, dtype, layer_out->mutable_query());
        SetHeads(*layer.key, response.heads, dtype, layer_out->mutable_key());
        SetHeads(*layer.value, response.heads, dtype, layer_out->mutable_value());
      }
      if (present(layer.mean_weights)) {
        SetTensor(layer.mean_weights, dtype, layer_out->mutable_mean_weights());
      }
    }
    if (present(result.rollout)) SetTensor(result.rollout, dtype, proto->mutable_rollout());
  }
  out->set_model_version(response.model_version);
  SetMetadata(response.metadata, true, out->mutable_metadata());
}

namespace {

void SetTextAttributions(const TextAttribution& text, v1::TextAttributions* out) {
  out->mutable_integrated_gradients()->Add(text.integrated_gradients.begin(),
                                           text.integrated_gradients.end());
  out->mutable_gradient_x_input()->Add(text.gradient_x_input.begin(), text.gradient_x_input.end());
  out->set_baseline_similarity(text.baseline_similarity);
}

void SetWords(const TextAttribution& text, google::protobuf::RepeatedPtrField<v1::Word>* out) {
  for (size_t w = 0; w < text.words.size(); ++w) {
    const WordSpan& span = text.words[w];
    v1::Word* word = out->Add();
    word->set_text(span.text);
    word->set_char_start(span.char_start);
    word->set_char_end(span.char_end);
    word->set_first_token(span.first_token);
    word->set_num_tokens(span.num_tokens);
    if (w < text.word_integrated_gradients.size()) {
      word->set_integrated_gradients(text.word_integrated_gradients[w]);
    }
    if (w < text.word_gradient_x_input.size()) {
      word->set_gradient_x_input(text.word_gradient_x_input[w]);
    }
    word->set_special(span.sequence_index < 0);
  }
}

}  // namespace

void ToProto(const core::ExplainResponse& response, v1::ExplainResponse* out) {
  for (const core::ExplainResult& result : response.results) {
    const AttributionResult& a = result.attribution;
    v1::ExplainResult* proto = out->add_results();
    proto->set_similarity(a.similarity);
    SetTokenList(*response.model, response.query, proto->mutable_query_tokens());
    SetTokenList(*response.model, result.document, proto->mutable_document_tokens());
    SetTextAttributions(a.a, proto->mutable_query());
    SetTextAttributions(a.b, proto->mutable_document());
    if (!a.pair_matrix.empty()) {
      SetTensor({a.rows, a.cols}, a.pair_matrix.data(), WireDType::kFloat32,
                proto->mutable_pair_matrix());
    }
    proto->set_baselines_similarity(a.baselines_similarity);
    proto->set_completeness_error(a.completeness_error);
    proto->set_attribution_sum(a.attribution_sum);
    proto->set_completeness_target(a.completeness_target);
    SetWords(a.a, proto->mutable_query_words());
    SetWords(a.b, proto->mutable_document_words());
    if (!a.word_pair_matrix.empty()) {
      SetTensor({static_cast<int64_t>(a.a.words.size()), static_cast<int64_t>(a.b.words.size())},
                a.word_pair_matrix.data(), WireDType::kFloat32, proto->mutable_word_pair_matrix());
    }
    proto->set_inference_ms(result.inference_ms);
  }
  out->set_model_version(response.model_version);
  SetMetadata(response.metadata, true, out->mutable_metadata());
}

void ToProto(const core::ClassifyResponse& response, v1::ClassifyResponse* out) {
  out->mutable_results()->Reserve(static_cast<int>(response.results.size()));
  for (const std::vector<core::LabelScore>& scores : response.results) {
    v1::ClassifyResult* result = out->add_results();
    for (const core::LabelScore& score : scores) {
      v1::LabelScore* label = result->add_labels();
      label->set_label(score.label);
      label->set_name(score.name);
      label->set_probability(score.probability);
      label->set_logit(score.logit);
    }
  }
  out->set_model_version(response.model_version);
  SetMetadata(response.metadata, true, out->mutable_metadata());
}

void ToProto(const core::RerankResponse& response, v1::RerankResponse* out) {
  out->mutable_results()->Reserve(static_cast<int>(response.results.size()));
  for (const core::RerankResult& result : response.results) {
    v1::RerankResult* proto = out->add_results();
    proto->set_index(result.index);
    proto->set_score(result.score);
    proto->set_document(result.document);
  }
  out->set_method(static_cast<v1::RerankMethod>(response.method));
  out->set_model_version(response.model_version);
  SetMetadata(response.metadata, true, out->mutable_metadata());
}

void ToProto(const core::TokenizeResponse& response, v1::TokenizeResponse* out) {
  out->set_model_version(response.model_version);
  for (const Encoding& encoding : response.results) {
    SetTokens(*response.model, encoding, out->add_results());
  }
  SetMetadata(response.metadata, false, out->mutable_metadata());
}

void ToProto(const core::ModelInfo& info, v1::ModelInfo* out) {
  out->set_name(info.name);
  out->set_is_default(info.is_default);
  out->set_architecture(info.architecture);
  out->set_model_type(info.model_type);
  out->set_hidden_size(info.hidden_size);
  out->set_num_layers(info.num_layers);
  out->set_num_heads(info.num_heads);
  out->set_head_dim(info.head_dim);
  out->set_intermediate_size(info.intermediate_size);
  out->set_vocab_size(info.vocab_size);
  out->set_type_vocab_size(info.type_vocab_size);
  out->set_max_position_embeddings(info.max_position_embeddings);
  out->set_default_max_length(info.default_max_length);
  out->set_default_pooling(info.default_pooling);
  out->set_default_normalize(info.default_normalize);
  out->set_parameter_count(info.parameter_count);
  out->set_precision(info.precision);
  out->set_version(info.version);
  out->set_version_origin(info.version_origin);
  for (const std::string& name : info.available_versions) out->add_available_versions(name);
  out->set_max_inputs_per_request(info.max_inputs_per_request);
}

}  // namespace attn::server
