// A loaded model: config, weights, tokenizer and sentence-embedding settings from one Hugging
// Face directory. Immutable once loaded (share as shared_ptr<const Model>); Forward() may be
// called from many threads at once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"

namespace attn {

class Model {
 public:
  // Reads config.json, model.safetensors, the tokenizer files and the optional
  // sentence-transformers files in `model_dir`. Errors name the file and the problem.
  static absl::StatusOr<std::shared_ptr<const Model>> Load(const std::string& model_dir);

  // A model with `base`'s config, tokenizer and pooling but other weights (a fine-tuned
  // version). The weights must have the base's shapes.
  static std::shared_ptr<const Model> WithWeights(const Model& base, BertWeights weights);

  const std::string& model_dir() const { return model_dir_; }
  const BertConfig& config() const { return config_; }
  const BertWeights& weights() const { return weights_; }
  const WordPieceTokenizer& tokenizer() const { return *tokenizer_; }
  const SentenceEmbeddingConfig& sentence_config() const { return sentence_config_; }

  // Truncation length used when a caller does not give one: sentence-transformers'
  // max_seq_length if the model has one (what it was trained with), else the tokenizer's
  // model_max_length; never above the position table.
  int default_max_length() const;
  // The longest sequence the position table allows.
  int max_positions() const { return config_.max_position_embeddings; }

  // ForwardOptions with the model's default pooling and normalisation.
  ForwardOptions DefaultForwardOptions() const;

  absl::StatusOr<ForwardResult> Forward(const std::vector<SequenceInput>& batch,
                                        const ForwardOptions& options) const;

 private:
  Model() = default;

  std::string model_dir_;
  BertConfig config_;
  BertWeights weights_;
  std::optional<WordPieceTokenizer> tokenizer_;
  SentenceEmbeddingConfig sentence_config_;
};

// Tokenized + encoded texts with the model's default settings: the convenience path used by
// the CLI and tests.
struct EmbeddedText {
  Encoding encoding;
  std::vector<float> embedding;  // (H)
};
absl::StatusOr<std::vector<EmbeddedText>> EmbedTexts(const Model& model,
                                                     const std::vector<std::string>& texts,
                                                     const ForwardOptions& options);

}  // namespace attn
