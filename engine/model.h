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
#include "engine/inference_weights.h"
#include "engine/model_config.h"
#include "engine/precision.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"

namespace attn {

// How a model is prepared for serving.
struct ModelOptions {
  // Numeric precision of Forward(): fp32, or int8 linear layers quantised at load.
  Precision precision = Precision::kFp32;
  // Under kInt8, the linear layers that are quantised; unset: DefaultInt8Linears(), the
  // engine's choice for this CPU.
  std::optional<Int8Linears> int8_linears;
  // Run a few small forwards at load so oneDNN primitives and JIT kernels exist before the
  // first request (which would otherwise pay for building them).
  bool warm_up = true;
};

// The int8 linear layers of a model whose ModelOptions does not choose them (see model.cc).
Int8Linears DefaultInt8Linears();

class Model {
 public:
  // Reads config.json, model.safetensors, the tokenizer files and the optional
  // sentence-transformers files in `model_dir`, then prepares the weights for `options`.
  // Errors name the file and the problem.
  static absl::StatusOr<std::shared_ptr<const Model>> Load(const std::string& model_dir,
                                                           const ModelOptions& options = {});

  // A model with `base`'s config, tokenizer, pooling and options but other weights (a
  // fine-tuned version), prepared (packed or quantised) like the base. The weights must have
  // the base's shapes.
  static std::shared_ptr<const Model> WithWeights(const Model& base, BertWeights weights);

  Model(const Model&) = delete;  // prepared_ points into weights_
  Model& operator=(const Model&) = delete;

  const std::string& model_dir() const { return model_dir_; }
  const BertConfig& config() const { return config_; }
  const BertWeights& weights() const { return weights_; }
  const ModelOptions& options() const { return options_; }
  Precision precision() const { return options_.precision; }
  const WordPieceTokenizer& tokenizer() const { return *tokenizer_; }
  const SentenceEmbeddingConfig& sentence_config() const { return sentence_config_; }

  // Truncation length used when a caller does not give one: sentence-transformers'
  // max_seq_length if the model has one (what it was trained with), else the tokenizer's
  // model_max_length; never above the position table.
  int default_max_length() const;
  // The longest sequence the position table allows (special tokens included; MPNet's positions
  // start at pad_token_id + 1, so 512 of its 514).
  int max_positions() const { return config_.max_sequence_length(); }

  // ForwardOptions with the model's default pooling and normalisation.
  ForwardOptions DefaultForwardOptions() const;

  // The encoder forward at the model's precision.
  absl::StatusOr<ForwardResult> Forward(const std::vector<SequenceInput>& batch,
                                        const ForwardOptions& options) const;

 private:
  Model() = default;
  // Packs or quantises weights_ into prepared_, then warms up if the options say so.
  void Prepare();

  std::string model_dir_;
  ModelOptions options_;
  BertConfig config_;
  BertWeights weights_;
  std::optional<InferenceWeights> prepared_;  // reads weights_ in place
  std::optional<WordPieceTokenizer> tokenizer_;
  SentenceEmbeddingConfig sentence_config_;
};

}  // namespace attn
