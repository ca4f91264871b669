#include "engine/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/ops/pooling.h"
#include "engine/ops/segment_product.h"
#include "engine/training/encoder_training.h"
#include "engine/training/optimizer.h"

namespace attn {
namespace {

void Append(std::vector<SequenceInput>* out, const std::vector<SequenceInput>& more) {
  out->insert(out->end(), more.begin(), more.end());
}

// A fresh pair head ranks by cosine (MakePairHead) but the cosines of jointly encoded texts sit
// far from 0, so its logits start many nats away from the labels' frequencies (a loss of 10 at
// step 1 on the catalogue example) and the first steps only move the bias. Set the bias once, at
// the first step, from that batch: bias_k = log(smoothed frequency of k) - mean_b(W_k · f_b),
// so the head starts at the label prior on average and training shapes the ranking at once.
void CenterPairHead(const float* features, int64_t rows, const std::vector<int64_t>& labels,
                    ClassificationHead* head) {
  const int64_t K = head->num_labels();
  std::vector<float> logits(rows * K);
  std::fill(head->bias.values().begin(), head->bias.values().end(), 0.0f);
  ClassificationHeadForward(*head, features, rows, logits.data());
  for (int64_t k = 0; k < K; ++k) {
    double mean = 0.0;
    for (int64_t b = 0; b < rows; ++b) mean += logits[b * K + k];
    mean /= static_cast<double>(rows);
    const auto count = std::count(labels.begin(), labels.end(), k);
    const double frequency = (count + 1.0) / (static_cast<double>(labels.size()) + K);
    head->bias.data()[k] = static_cast<float>(std::log(frequency) - mean);
  }
}

}  // namespace

int64_t TrainingBatch::examples() const {
  return static_cast<int64_t>(anchors.size() + first.size() + inputs.size());
}

int64_t TrainingBatch::tokens() const {
  return CountTokens(anchors) + CountTokens(positives) + CountTokens(negatives) +
         CountTokens(first) + CountTokens(second) + CountTokens(inputs);
}

absl::Status ValidateTrainerOptions(const TrainerOptions& options) {
  auto invalid = [](const std::string& message) { return absl::InvalidArgumentError(message); };
  if (absl::Status adamw = ValidateAdamWOptions(options.adamw); !adamw.ok()) return adamw;
  if (HasClassificationHead(options.objective)) {
    if (options.num_labels < 2 || options.num_labels > kMaxLabels) {
      return invalid(absl::StrCat("num_labels is ", options.num_labels,
                                  "; the classification objective needs 2 to ", kMaxLabels,
                                  " classes"));
    }
  } else if (options.num_labels != 0) {
    return invalid(absl::StrCat("num_labels is ", options.num_labels,
                                "; only the classification objective has labels"));
  }
  if (options.trainable == TrainableSet::kHeadOnly && !HasClassificationHead(options.objective)) {
    return invalid(
        "training the head only needs the classification objective (the other objectives have "
        "no head)");
  }
  if (options.warmup_steps < 0 || options.total_steps < 0) {
    return invalid(absl::StrCat("warmup_steps (", options.warmup_steps, ") and total_steps (",
                                options.total_steps, ") must be >= 0"));
  }
  if (options.total_steps > 0 && options.warmup_steps > options.total_steps) {
    return invalid(absl::StrCat("warmup_steps (", options.warmup_steps,
                                ") is more than total_steps (", options.total_steps, ")"));
  }
  if (!std::isfinite(options.max_grad_norm) || options.max_grad_norm < 0) {
    return invalid(absl::StrCat("max_grad_norm is ", options.max_grad_norm,
                                "; it must be finite and >= 0 (0 = no clipping)"));
  }
  if (options.precision == Precision::kInt8) {
    return invalid("precision is int8; fine-tuning runs in float32 or bfloat16 (mixed precision)");
  }
  if (!std::isfinite(options.contrastive_scale) || !(options.contrastive_scale > 0)) {
    return invalid(absl::StrCat("contrastive_scale is ", options.contrastive_scale,
                                "; it must be finite and > 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTrainingBatch(const TrainingBatch& batch, const TrainerOptions& options) {
  auto invalid = [](const std::string& message) { return absl::InvalidArgumentError(message); };
  const int64_t examples = batch.examples();
  if (examples == 0) return invalid("0 examples; send at least 1 per batch");
  switch (options.objective) {
    case Objective::kContrastive:
      if (examples < 2) {
        return invalid(
            "1 example; the contrastive objective (multiple-negatives ranking loss) scores each "
            "anchor against the other pairs' positives as negatives, so a single pair has loss "
            "exactly 0 and teaches nothing: send at least 2 (anchor, positive) pairs per batch");
      }
      if (batch.positives.size() != batch.anchors.size()) {
        return invalid(absl::StrCat(batch.anchors.size(), " anchors but ", batch.positives.size(),
                                    " positives; send one positive per anchor"));
      }
      if (!batch.negatives.empty()) {
        if (batch.negatives.size() != batch.anchors.size()) {
          return invalid(absl::StrCat(batch.negatives.size(), " hard negatives for ",
                                      batch.anchors.size(),
                                      " anchors; send none or one per anchor"));
        }
        for (size_t i = 0; i < batch.negatives.size(); ++i) {
          if (batch.negatives[i].token_ids.empty()) {
            return invalid(absl::StrCat(
                "examples[", i,
                "] has no negative but others do; give a hard negative for every example of a "
                "batch or for none"));
          }
        }
      }
      break;
    case Objective::kCosineSimilarity:
      if (batch.second.size() != batch.first.size() || batch.scores.size() != batch.first.size()) {
        return invalid(absl::StrCat(batch.first.size(), " first texts, ", batch.second.size(),
                                    " second texts and ", batch.scores.size(),
                                    " scores; they must match"));
      }
      for (size_t i = 0; i < batch.scores.size(); ++i) {
        if (!std::isfinite(batch.scores[i]) || batch.scores[i] < -1.0f || batch.scores[i] > 1.0f) {
          return invalid(absl::StrCat("examples[", i, "].score is ", batch.scores[i],
                                      "; gold scores must be finite and in [-1, 1]"));
        }
      }
      break;
    case Objective::kClassification:
    case Objective::kPairClassification:
      if (batch.labels.size() != batch.inputs.size()) {
        return invalid(absl::StrCat(batch.inputs.size(), " inputs but ", batch.labels.size(),
                                    " labels; they must match"));
      }
      for (size_t i = 0; i < batch.labels.size(); ++i) {
        if (batch.labels[i] < 0 || batch.labels[i] >= options.num_labels) {
          return invalid(absl::StrCat("examples[", i, "].label is ", batch.labels[i],
                                      ", outside [0, ", options.num_labels, ") (num_labels)"));
        }
      }
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(std::shared_ptr<const Model> base,
                                                         const TrainerOptions& options) {
  if (base == nullptr) return absl::InvalidArgumentError("no base model");
  if (absl::Status valid = ValidateTrainerOptions(options); !valid.ok()) return valid;

  const ScopedHugePages huge_pages;  // the private weights, gradients and optimizer state
  auto trainer = std::unique_ptr<Trainer>(new Trainer());
  trainer->base_ = base;
  trainer->options_ = options;
  trainer->weights_ = base->weights();  // the private copy; serving keeps reading `base`
  trainer->grads_ = ZerosLike(trainer->weights_);
  ClassificationHead* head = nullptr;
  ClassificationHead* head_grads = nullptr;
  if (HasClassificationHead(options.objective)) {
    const int64_t hidden = base->config().hidden_size;
    trainer->head_ =
        options.objective == Objective::kPairClassification
            ? MakePairHead(options.num_labels, hidden)
            : MakeClassificationHead(options.num_labels, hidden, HeadInit::kNormal, options.seed);
    trainer->head_grads_ = ZerosLike(*trainer->head_);
    head = &*trainer->head_;
    head_grads = &*trainer->head_grads_;
  }
  absl::StatusOr<std::vector<ParamEntry>> params = CollectTrainableParameters(
      &trainer->weights_, &trainer->grads_, options.trainable, head, head_grads);
  if (!params.ok()) return params.status();
  for (ParamEntry& entry : *params) {
    // Rows of unused tokens have zero gradients: the norm and AdamW skip them exactly.
    if (entry.grad == &trainer->grads_.word_embeddings) {
      entry.nonzero_rows = &trainer->backward_.word_rows;
    }
  }
  absl::StatusOr<AdamW> optimizer = AdamW::Create(std::move(*params), options.adamw);
  if (!optimizer.ok()) return optimizer.status();
  trainer->optimizer_.emplace(std::move(*optimizer));
  if (options.telemetry_every > 0) {
    trainer->telemetry_.emplace(base->weights(), trainer->weights_, head,
                                trainer->optimizer_->params());
  }
  return trainer;
}

absl::StatusOr<StepResult> Trainer::Step(const TrainingBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  // Activations, backward buffers and AdamW moments are allocated at the first step and reused.
  const ScopedHugePages huge_pages;
  if (absl::Status valid = ValidateTrainingBatch(batch, options_); !valid.ok()) return valid;
  const BertConfig& config = base_->config();
  const int64_t H = config.hidden_size;

  // All sequences of the step in one packed batch, in objective order.
  std::vector<SequenceInput> sequences;
  Append(&sequences, batch.anchors);
  Append(&sequences, batch.positives);
  Append(&sequences, batch.negatives);
  Append(&sequences, batch.first);
  Append(&sequences, batch.second);
  Append(&sequences, batch.inputs);
  const int64_t B = static_cast<int64_t>(sequences.size());

  TrainingForwardOptions forward_options;
  if (options_.dropout) {
    forward_options.hidden_dropout = config.hidden_dropout_prob;
    forward_options.attention_dropout = config.attention_probs_dropout_prob;
  }
  forward_options.seed = options_.seed;
  forward_options.step = static_cast<uint64_t>(steps_);
  forward_options.matmul_inputs =
      options_.precision == Precision::kBf16 ? MatmulInputs::kBf16 : MatmulInputs::kFp32;
  if (absl::Status status =
          EncoderForwardTraining(config, weights_, sequences, forward_options, &forward_);
      !status.ok()) {
    return status;
  }
  const TrainingForward* forward = &forward_;

  // The head's or the loss's input, (B, H): a pair head reads the segment product of each
  // jointly encoded pair; every other objective the pooled embedding, L2-normalised.
  const bool pair_feature = options_.objective == Objective::kPairClassification;
  const PoolingMode pooling = base_->sentence_config().pooling;
  Tensor pooled({B, H});
  Tensor embedding({B, H});
  std::vector<int32_t> type_ids;  // (M) for the pair feature
  SegmentProductContext segments;
  if (pair_feature) {
    type_ids.reserve(forward->seq_offsets.back());
    for (const SequenceInput& sequence : sequences) {
      if (sequence.type_ids.empty()) {
        type_ids.insert(type_ids.end(), sequence.token_ids.size(), 0);
      } else {
        type_ids.insert(type_ids.end(), sequence.type_ids.begin(), sequence.type_ids.end());
      }
    }
    if (absl::Status status = SegmentProductForward(forward->output.data(), H, forward->seq_offsets,
                                                    type_ids.data(), embedding.data(), &segments);
        !status.ok()) {
      return status;
    }
  } else {
    PoolForward(forward->output.data(), H, forward->seq_offsets, pooling, pooled.data());
    embedding = pooled;
    L2NormalizeRows(embedding.data(), B, H);
  }

  if (pair_feature && steps_ == 0) CenterPairHead(embedding.data(), B, batch.labels, &*head_);

  // Loss and d_embedding (B, H).
  Tensor d_embedding({B, H});
  absl::StatusOr<double> loss;
  const bool train_encoder = options_.trainable != TrainableSet::kHeadOnly;
  switch (options_.objective) {
    case Objective::kContrastive: {
      const int64_t anchors = static_cast<int64_t>(batch.anchors.size());
      loss = MultipleNegativesRankingLoss(embedding.data(), anchors, embedding.data() + anchors * H,
                                          B - anchors, H, MnrlOptions{options_.contrastive_scale},
                                          d_embedding.data(), d_embedding.data() + anchors * H);
      break;
    }
    case Objective::kCosineSimilarity: {
      const int64_t pairs = static_cast<int64_t>(batch.first.size());
      loss = CosineSimilarityLoss(embedding.data(), embedding.data() + pairs * H, H, batch.scores,
                                  d_embedding.data(), d_embedding.data() + pairs * H);
      break;
    }
    case Objective::kClassification:
    case Objective::kPairClassification:
      loss = ClassificationHeadLoss(*head_, embedding.data(), batch.labels, d_embedding.data(),
                                    &*head_grads_);
      break;
  }
  if (!loss.ok()) return loss.status();
  if (!std::isfinite(*loss)) {
    return absl::OutOfRangeError(
        absl::StrCat("the loss is ", *loss, " at step ", steps_ + 1,
                     "; training diverged (lower the learning rate); the weights are unchanged"));
  }

  // Backward: (normalisation -> pooling | segment product) -> encoder.
  if (train_encoder) {
    Tensor d_output(forward->output.shape());
    if (pair_feature) {
      SegmentProductBackward(segments, H, forward->seq_offsets, type_ids.data(), d_embedding.data(),
                             d_output.data());
    } else {
      Tensor d_pooled({B, H});
      L2NormalizeBackward(pooled.data(), d_embedding.data(), B, H, d_pooled.data());
      PoolBackward(forward->output.data(), H, forward->seq_offsets, pooling, d_pooled.data(),
                   d_output.data());
    }
    const bool embedding_grads = options_.trainable == TrainableSet::kAll;
    if (absl::Status status = EncoderBackward(config, weights_, *forward, d_output.data(), &grads_,
                                              embedding_grads, &backward_);
        !status.ok()) {
      return status;
    }
  }

  const int64_t step = steps_ + 1;
  const bool telemetry_step =
      telemetry_.has_value() &&
      (step == 1 || step % options_.telemetry_every == 0 || step == options_.total_steps);
  if (telemetry_.has_value() && train_encoder && options_.trainable == TrainableSet::kAll) {
    telemetry_->MarkRows(backward_.word_rows);
  }

  StepResult result;
  float grad_scale = 1.0f;  // the clipping coefficient, applied as AdamW reads the gradients
  if (options_.max_grad_norm > 0) {
    absl::StatusOr<GradClip> clip = ComputeGradClip(optimizer_->params(), options_.max_grad_norm);
    if (!clip.ok()) {
      return absl::OutOfRangeError(absl::StrCat("gradient is not finite at step ", steps_ + 1, " (",
                                                clip.status().message(),
                                                "); the weights are unchanged"));
    }
    result.grad_norm = clip->norm;
    grad_scale = clip->coef;
  } else {
    result.grad_norm = GlobalGradNorm(optimizer_->params());
    if (!std::isfinite(result.grad_norm)) {
      return absl::OutOfRangeError(absl::StrCat("gradient norm is ", result.grad_norm, " at step ",
                                                steps_ + 1, "; the weights are unchanged"));
    }
  }
  if (options_.total_steps > 0) {
    result.learning_rate =
        LinearScheduleLr(options_.adamw.lr, steps_, options_.warmup_steps, options_.total_steps);
  } else {  // open-ended job: warm up, then hold the base rate
    result.learning_rate =
        steps_ < options_.warmup_steps
            ? options_.adamw.lr * static_cast<double>(steps_) / options_.warmup_steps
            : options_.adamw.lr;
  }
  if (absl::Status stepped = optimizer_->Step(result.learning_rate, grad_scale,
                                              telemetry_step ? telemetry_->row_sums() : nullptr);
      !stepped.ok()) {
    return stepped;
  }

  ++steps_;
  result.step = steps_;
  if (telemetry_step) result.telemetry = telemetry_->AfterUpdate(base_->tokenizer());
  result.loss = *loss;
  result.examples = batch.examples();
  result.tokens = batch.tokens();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::shared_ptr<const Model> Trainer::Snapshot() const {
  return Model::WithWeights(*base_, weights_);
}

}  // namespace attn
