// Fuzz target: the config.json loader (ParseBertConfig) and the sentence-transformers pooling
// config (ParsePoolingConfig). Any text must give an error or a config the engine can size its
// tensors from: positive sizes, hidden_size divisible by the heads, finite epsilon.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/model_config.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto config = attn::ParseBertConfig(text);
  if (config.ok()) {
    FUZZ_CHECK(config->model_type == "bert", "model_type '%s'", config->model_type.c_str());
    FUZZ_CHECK(config->vocab_size > 0 && config->hidden_size > 0 && config->num_hidden_layers > 0 &&
                   config->num_attention_heads > 0 && config->intermediate_size > 0 &&
                   config->max_position_embeddings > 0 && config->type_vocab_size > 0,
               "accepted a non-positive size");
    FUZZ_CHECK(config->hidden_size % config->num_attention_heads == 0 && config->head_dim() > 0,
               "hidden_size %d not divisible by %d heads", config->hidden_size,
               config->num_attention_heads);
    FUZZ_CHECK(std::isfinite(config->layer_norm_eps) && config->layer_norm_eps > 0,
               "layer_norm_eps %g", config->layer_norm_eps);
    FUZZ_CHECK(config->pad_token_id >= 0 && config->pad_token_id < config->vocab_size,
               "pad_token_id %d outside the vocab of %d", config->pad_token_id, config->vocab_size);
    for (float p : {config->hidden_dropout_prob, config->attention_probs_dropout_prob}) {
      FUZZ_CHECK(p >= 0 && p < 1, "dropout probability %g", p);
    }
  }

  auto pooling = attn::ParsePoolingConfig(text);
  if (pooling.ok()) (void)attn::PoolingModeName(*pooling);
  return 0;
}
