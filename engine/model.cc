#include "engine/model.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/log.h"

namespace attn {

absl::StatusOr<std::shared_ptr<const Model>> Model::Load(const std::string& model_dir,
                                                         const ModelOptions& options) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(model_dir, error)) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", model_dir, "' does not exist or is not a directory"));
  }
  auto model = std::shared_ptr<Model>(new Model());
  model->model_dir_ = model_dir;
  model->options_ = options;

  absl::StatusOr<BertConfig> config =
      LoadBertConfig((fs::path(model_dir) / "config.json").string());
  if (!config.ok()) return config.status();
  model->config_ = *config;

  absl::StatusOr<SentenceEmbeddingConfig> sentence = LoadSentenceEmbeddingConfig(model_dir);
  if (!sentence.ok()) return sentence.status();
  model->sentence_config_ = *sentence;

  absl::StatusOr<WordPieceTokenizer> tokenizer =
      WordPieceTokenizer::FromModelDir(model_dir, &model->config_.spec());
  if (!tokenizer.ok()) return tokenizer.status();
  if (tokenizer->vocab_size() > model->config_.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, ": tokenizer vocabulary has ", tokenizer->vocab_size(),
                     " tokens but config.json vocab_size is ", model->config_.vocab_size));
  }
  model->tokenizer_.emplace(std::move(*tokenizer));

  const std::string weights_path = (fs::path(model_dir) / "model.safetensors").string();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(weights_path);
  if (!file.ok()) return file.status();
  absl::StatusOr<BertWeights> weights = LoadBertWeights(**file, model->config_);
  if (!weights.ok()) return weights.status();
  model->weights_ = std::move(*weights);
  model->Prepare();

  Log(LogLevel::kInfo, "loaded %s: %s, %d layers, hidden %d, %d heads, %d parameters, %s",
      model_dir, model->config_.model_type, model->config_.num_hidden_layers,
      model->config_.hidden_size, model->config_.num_attention_heads,
      model->weights_.ParameterCount(), PrecisionName(model->options_.precision));
  return std::shared_ptr<const Model>(std::move(model));
}

Int8Linears DefaultInt8Linears() {
  Int8Linears linears;
  // The fused QKV projection, whose errors the attention scores multiply (Q K^T). With VNNI's
  // 255 input levels it is int8: on all-MiniLM-L6-v2 that lowers the min pooled cosine to fp32
  // on the benchmark's 256 sentences from 0.99746 to 0.99675 and makes the int8 forward at
  // 32 x 128 1.32x faster (in fp32 it took half the matmul time). Without VNNI (127 input
  // levels) it stays fp32: int8 there cost 0.9967 -> 0.9957 on precision_encoder_test's
  // mixed-length set, too thin a margin above the 0.995 bound for a smaller gain.
  linears.qkv = CpuHasInt8Vnni();
  return linears;
}

void Model::Prepare() {
  prepared_.emplace(InferenceWeights::Prepare(
      weights_, options_.precision, options_.int8_linears.value_or(DefaultInt8Linears())));
  if (!options_.warm_up) return;
  // Builds the primitives of the row counts (MatmulRows) of a short request and of a batch of
  // typical sentences, and oneDNN's JIT kernels; other batch sizes build theirs on first use.
  const auto start = std::chrono::steady_clock::now();
  ForwardOptions options = DefaultForwardOptions();
  for (const auto& [sequences, length] : {std::pair<int, int>{1, 16}, {4, 32}, {4, 128}}) {
    const int32_t id = std::min<int32_t>(1000, config_.vocab_size - 1);
    std::vector<SequenceInput> batch(sequences);
    for (SequenceInput& seq : batch) seq.token_ids.assign(std::min(length, max_positions()), id);
    absl::StatusOr<ForwardResult> result = Forward(batch, options);
    if (!result.ok()) {
      Log(LogLevel::kWarning, "warm-up forward failed: %s", result.status().ToString());
      return;
    }
  }
  Log(LogLevel::kDebug, "warm-up took %.1f ms",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

std::shared_ptr<const Model> Model::WithWeights(const Model& base, BertWeights weights) {
  auto model = std::shared_ptr<Model>(new Model());
  model->model_dir_ = base.model_dir_;
  model->config_ = base.config_;
  model->tokenizer_ = base.tokenizer_;
  model->sentence_config_ = base.sentence_config_;
  model->options_ = base.options_;
  model->options_.warm_up = false;  // the base already built the primitives
  model->weights_ = std::move(weights);
  model->Prepare();
  return model;
}

int Model::default_max_length() const {
  int length = sentence_config_.max_seq_length > 0 ? sentence_config_.max_seq_length
                                                   : tokenizer_->options().model_max_length;
  if (length <= 0) length = config_.max_sequence_length();
  return std::min(length, config_.max_sequence_length());
}

ForwardOptions Model::DefaultForwardOptions() const {
  ForwardOptions options;
  options.pool = true;
  options.pooling = sentence_config_.pooling;
  options.normalize = sentence_config_.normalize;
  return options;
}

absl::StatusOr<ForwardResult> Model::Forward(const std::vector<SequenceInput>& batch,
                                             const ForwardOptions& options) const {
  return EncoderForward(config_, *prepared_, batch, options);
}

}  // namespace attn
