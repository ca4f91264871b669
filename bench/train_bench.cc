// attn-bench-train: times one fine-tuning step (training forward, mean pooling + L2
// normalisation, MultipleNegativesRankingLoss at scale 20, the whole backward, clipping at global
// norm 1.0 and AdamW over every parameter) on a fixed batch of --pairs (anchor, positive) pairs,
// each sequence exactly --seq_len tokens ([CLS] + random in-vocabulary ids + [SEP]). Dropout is
// off so the step is deterministic. Median of --runs after --warmup; one JSON line, the same
// fields as bench/peer_torch_train.py prints, so the two can be interleaved.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/cli_util.h"
#include "engine/model.h"
#include "engine/training/trainer.h"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR, "Hugging Face model directory.");
ABSL_FLAG(int, pairs, 16, "(anchor, positive) pairs per step.");
ABSL_FLAG(int, seq_len, 64, "Tokens per sequence, [CLS] and [SEP] included.");
ABSL_FLAG(int, runs, 5, "Timed steps; the median is reported.");
ABSL_FLAG(int, warmup, 2, "Untimed steps first (primitive creation, optimiser state).");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");

namespace {

// [CLS] + (seq_len - 2) ids drawn from `rng` + [SEP].
attn::SequenceInput RandomSequence(const attn::Model& model, int seq_len, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(1000, model.config().vocab_size - 1);
  attn::SequenceInput seq;
  seq.token_ids.reserve(seq_len);
  seq.token_ids.push_back(model.tokenizer().cls_id());
  for (int t = 0; t < seq_len - 2; ++t) seq.token_ids.push_back(token(rng));
  seq.token_ids.push_back(model.tokenizer().sep_id());
  return seq;
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times one fine-tuning step (MNRL, AdamW, all parameters): attn-bench-train --pairs 16 "
      "--seq_len 64");
  attn::ShowProjectFlagsInHelp("attn-bench-train 0.1.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const int pairs = absl::GetFlag(FLAGS_pairs), seq_len = absl::GetFlag(FLAGS_seq_len);
  const int runs = absl::GetFlag(FLAGS_runs), warmup = absl::GetFlag(FLAGS_warmup);
  if (pairs < 1 || seq_len < 2 || runs < 1 || warmup < 0) {
    std::fprintf(stderr, "need --pairs >= 1, --seq_len >= 2, --runs >= 1, --warmup >= 0\n");
    return 1;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));

  absl::StatusOr<std::shared_ptr<const attn::Model>> model =
      attn::Model::Load(absl::GetFlag(FLAGS_model_dir));
  if (!model.ok()) return Fail("cannot load model", model.status());

  // The same batch every step: the timing is of the step, not of the data.
  std::mt19937 rng(42);
  attn::TrainingBatch batch;
  for (int i = 0; i < pairs; ++i) {
    batch.anchors.push_back(RandomSequence(**model, seq_len, rng));
    batch.positives.push_back(RandomSequence(**model, seq_len, rng));
  }

  attn::TrainerOptions options;
  options.objective = attn::Objective::kContrastive;
  options.adamw.lr = 2e-5;
  options.adamw.eps = 1e-6;
  options.adamw.weight_decay = 0.01;  // biases and LayerNorms excluded by the trainer
  options.max_grad_norm = 1.0;
  options.trainable = attn::TrainableSet::kAll;
  options.dropout = false;
  options.mnrl_scale = 20.0;
  absl::StatusOr<std::unique_ptr<attn::Trainer>> trainer = attn::Trainer::Create(*model, options);
  if (!trainer.ok()) return Fail("cannot create trainer", trainer.status());

  for (int i = 0; i < warmup; ++i) {
    absl::StatusOr<attn::StepResult> result = (*trainer)->Step(batch);
    if (!result.ok()) return Fail("warm-up step failed", result.status());
  }
  std::vector<double> seconds;
  double final_loss = 0;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<attn::StepResult> result = (*trainer)->Step(batch);
    const auto stop = std::chrono::steady_clock::now();
    if (!result.ok()) return Fail("step failed", result.status());
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
    final_loss = result->loss;
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();  // median as Python's statistics.median
  const double median = (seconds[(n - 1) / 2] + seconds[n / 2]) / 2;
  std::printf(
      "{\"engine\": \"attnserve-fp32-train\", \"pairs\": %d, \"seq_len\": %d, \"threads\": %d, "
      "\"median_ms\": %.2f, \"min_ms\": %.2f, \"examples_per_s\": %.1f, \"final_loss\": %.6f}\n",
      pairs, seq_len, omp_get_max_threads(), median * 1e3, seconds.front() * 1e3, pairs / median,
      final_loss);
  return 0;
}
