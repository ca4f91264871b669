// attn-bench-engine: times the engine's forward on a fixed-shape batch (batch x seq_len tokens,
// random in-vocabulary ids), median of --runs after --warmup. A first figure; the full harness
// against peers comes with the performance work.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/cli_util.h"
#include "engine/model.h"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR, "Hugging Face model directory.");
ABSL_FLAG(int, batch, 32, "Sequences per forward.");
ABSL_FLAG(int, seq_len, 128, "Tokens per sequence, [CLS] and [SEP] included.");
ABSL_FLAG(int, runs, 5, "Timed runs; the median is reported.");
ABSL_FLAG(int, warmup, 2, "Untimed runs first (primitive creation, caches).");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the engine forward pass: attn-bench-engine --batch 32 --seq_len 128");
  attn::ShowProjectFlagsInHelp("attn-bench-engine 0.1.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  auto model = attn::Model::Load(absl::GetFlag(FLAGS_model_dir));
  if (!model.ok()) {
    std::fprintf(stderr, "cannot load model: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const int batch_size = absl::GetFlag(FLAGS_batch), seq_len = absl::GetFlag(FLAGS_seq_len);
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(1000, (*model)->config().vocab_size - 1);
  std::vector<attn::SequenceInput> batch(batch_size);
  for (attn::SequenceInput& seq : batch) {
    seq.token_ids.push_back((*model)->tokenizer().cls_id());
    for (int t = 0; t < seq_len - 2; ++t) seq.token_ids.push_back(token(rng));
    seq.token_ids.push_back((*model)->tokenizer().sep_id());
  }
  const attn::ForwardOptions options = (*model)->DefaultForwardOptions();
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
    if (!(*model)->Forward(batch, options).ok()) return 1;
  }
  std::vector<double> seconds;
  for (int i = 0; i < absl::GetFlag(FLAGS_runs); ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (!(*model)->Forward(batch, options).ok()) return 1;
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf(
      "{\"engine\": \"attnserve-fp32\", \"batch\": %d, \"seq_len\": %d, \"threads\": %d, "
      "\"median_ms\": %.2f, \"min_ms\": %.2f, \"tokens_per_s\": %.0f}\n",
      batch_size, seq_len, omp_get_max_threads(), median * 1e3, seconds.front() * 1e3,
      batch_size * seq_len / median);
  return 0;
}
