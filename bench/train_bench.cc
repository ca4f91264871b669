// attn-bench-train: times one fine-tuning step (training forward, mean pooling + L2
// normalisation, MultipleNegativesRankingLoss at scale 20, the whole backward, clipping at global
// norm 1.0 and AdamW over every parameter). Dropout is off so the step is deterministic; the
// same step as bench/peer_torch.py's train worker.
//
// One-shot: `attn-bench-train --pairs 16 --seq-len 64` on random in-vocabulary ids (each
// sequence exactly --seq-len tokens with [CLS]/[SEP]); median of --runs after --warmup, one JSON
// line.
//
// Worker (`--worker`, driven by bench/harness.py; protocol in bench/bench_worker.h). Commands:
//   {"cmd": "info"}, {"cmd": "load", "inputs": PATH}
//   {"cmd": "run", "workload": NAME, "repeat": K}  K steps on the workload's anchors/positives
//                                                 -> {"seconds": [...], "loss": last loss}
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_worker.h"
#include "engine/cli_util.h"
#include "engine/model.h"
#include "engine/precision.h"
#include "engine/training/trainer.h"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR, "Hugging Face model directory.");
ABSL_FLAG(int, pairs, 16, "One-shot: (anchor, positive) pairs per step.");
ABSL_FLAG(int, seq_len, 64, "One-shot: tokens per sequence, [CLS] and [SEP] included.");
ABSL_FLAG(int, runs, 5, "One-shot: timed steps; the median is reported.");
ABSL_FLAG(int, warmup, 2, "One-shot: untimed steps first (primitive creation, optimiser state).");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");
ABSL_FLAG(int, telemetry_every, 0,
          "Training telemetry every N steps (TrainerOptions::telemetry_every); 0 = off.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, or bf16 for mixed precision (TrainerOptions::precision: the matmuls on bfloat16 "
          "inputs, fp32 master weights and AdamW).");
ABSL_FLAG(bool, worker, false, "Serve the JSON-lines worker protocol on stdin/stdout.");

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

// sentence-transformers' fine-tuning defaults for MNRL with AdamW, every parameter trained.
attn::TrainerOptions BenchTrainerOptions(attn::Precision precision) {
  attn::TrainerOptions options;
  options.objective = attn::Objective::kContrastive;
  options.adamw.lr = 2e-5;
  options.adamw.eps = 1e-6;
  options.adamw.weight_decay = 0.01;  // biases and LayerNorms excluded by the trainer
  options.max_grad_norm = 1.0;
  options.trainable = attn::TrainableSet::kAll;
  options.dropout = false;
  options.contrastive_scale = 20.0;
  options.telemetry_every = absl::GetFlag(FLAGS_telemetry_every);
  options.precision = precision;
  return options;
}

class Worker {
 public:
  Worker(std::shared_ptr<const attn::Model> model, std::unique_ptr<attn::Trainer> trainer)
      : model_(std::move(model)), trainer_(std::move(trainer)) {}

  static nlohmann::json Info() {
    return {{"engine", "attnserve-train"},
            {"precision", absl::GetFlag(FLAGS_precision)},
            {"threads", omp_get_max_threads()},
            {"onednn", attn::bench::OneDnnVersion()}};
  }

  absl::StatusOr<nlohmann::json> Handle(const nlohmann::json& command) {
    const std::string cmd = command.at("cmd").get<std::string>();
    if (cmd == "info") return Info();
    if (cmd == "load") {
      absl::StatusOr<std::map<std::string, attn::bench::Workload>> loaded =
          attn::bench::LoadWorkloads(command.at("inputs").get<std::string>());
      if (!loaded.ok()) return loaded.status();
      workloads_ = *std::move(loaded);
      nlohmann::json names = nlohmann::json::array();
      for (const auto& [name, workload] : workloads_) names.push_back(name);
      return nlohmann::json{{"workloads", names}};
    }
    if (cmd == "run") {
      const std::string name = command.at("workload").get<std::string>();
      auto it = workloads_.find(name);
      if (it == workloads_.end() || it->second.anchors.empty()) {
        return absl::NotFoundError(absl::StrCat("no fine-tuning workload '", name, "' loaded"));
      }
      attn::TrainingBatch batch;
      batch.anchors = it->second.anchors;
      batch.positives = it->second.positives;
      nlohmann::json seconds = nlohmann::json::array();
      double loss = 0;
      for (int i = 0, repeat = command.value("repeat", 1); i < repeat; ++i) {
        absl::StatusOr<attn::StepResult> result;
        absl::StatusOr<double> elapsed = attn::bench::TimeOnce([&] {
          result = trainer_->Step(batch);
          return result.status();
        });
        if (!elapsed.ok()) return elapsed.status();
        seconds.push_back(*elapsed);
        loss = result->loss;
      }
      return nlohmann::json{{"seconds", seconds}, {"loss", loss}};
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown command '", cmd, "'"));
  }

 private:
  std::shared_ptr<const attn::Model> model_;
  std::unique_ptr<attn::Trainer> trainer_;
  std::map<std::string, attn::bench::Workload> workloads_;
};

int OneShot(const attn::Model& model, attn::Trainer& trainer) {
  const int pairs = absl::GetFlag(FLAGS_pairs), seq_len = absl::GetFlag(FLAGS_seq_len);
  const int runs = absl::GetFlag(FLAGS_runs), warmup = absl::GetFlag(FLAGS_warmup);
  if (pairs < 1 || seq_len < 2 || runs < 1 || warmup < 0) {
    std::fprintf(stderr, "need --pairs >= 1, --seq-len >= 2, --runs >= 1, --warmup >= 0\n");
    return 1;
  }
  // The same batch every step: the timing is of the step, not of the data.
  std::mt19937 rng(42);
  attn::TrainingBatch batch;
  for (int i = 0; i < pairs; ++i) {
    batch.anchors.push_back(RandomSequence(model, seq_len, rng));
    batch.positives.push_back(RandomSequence(model, seq_len, rng));
  }
  std::vector<double> seconds;
  double final_loss = 0;
  for (int i = 0; i < warmup + runs; ++i) {
    absl::StatusOr<attn::StepResult> result;
    absl::StatusOr<double> elapsed = attn::bench::TimeOnce([&] {
      result = trainer.Step(batch);
      return result.status();
    });
    if (!elapsed.ok()) return Fail("step failed", elapsed.status());
    if (i >= warmup) seconds.push_back(*elapsed);
    final_loss = result->loss;
  }
  const double median = attn::bench::Median(seconds);
  std::printf(
      "{\"engine\": \"attnserve-train\", \"pairs\": %d, \"seq_len\": %d, \"threads\": %d, "
      "\"median_ms\": %.2f, \"min_ms\": %.2f, \"examples_per_s\": %.1f, \"final_loss\": %.6f}\n",
      pairs, seq_len, omp_get_max_threads(), median * 1e3,
      *std::min_element(seconds.begin(), seconds.end()) * 1e3, pairs / median, final_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times one fine-tuning step (MNRL, AdamW, all parameters): attn-bench-train --pairs 16 "
      "--seq-len 64 (or --worker for bench/harness.py)");
  attn::ShowProjectFlagsInHelp("attn-bench-train 0.2.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));

  absl::StatusOr<std::shared_ptr<const attn::Model>> model =
      attn::Model::Load(absl::GetFlag(FLAGS_model_dir));
  if (!model.ok()) return Fail("cannot load model", model.status());
  attn::Precision precision;
  if (!attn::ParsePrecision(absl::GetFlag(FLAGS_precision), &precision)) {
    return Fail("bad --precision",
                absl::InvalidArgumentError(
                    absl::StrCat("'", absl::GetFlag(FLAGS_precision), "' is not fp32 or bf16")));
  }
  absl::StatusOr<std::unique_ptr<attn::Trainer>> trainer =
      attn::Trainer::Create(*model, BenchTrainerOptions(precision));
  if (!trainer.ok()) return Fail("cannot create trainer", trainer.status());
  if (!absl::GetFlag(FLAGS_worker)) return OneShot(**model, **trainer);

  nlohmann::json ready = Worker::Info();
  ready["ready"] = true;
  Worker worker(*model, *std::move(trainer));
  return attn::bench::RunWorker(
      ready, [&worker](const nlohmann::json& command) { return worker.Handle(command); });
}
