// One example of fine-tuning data as the core receives it: what a training batch and an
// evaluation set are made of.
#pragma once

#include <cstdint>
#include <string>

namespace attn::server::core {

// Which fields an objective (or evaluation task) uses: contrastive anchor/positive[/negative],
// cosine similarity first/second/score, classification text/label, pair classification
// first/second/label. Setting another one is an error.
struct TrainingExample {
  std::string anchor, positive, negative;
  std::string first, second;
  float score = 0;
  std::string text;
  int32_t label = 0;
};

}  // namespace attn::server::core
