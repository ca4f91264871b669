// attn-bench-explain: what an explanation costs, as a multiple of one forward of the same texts.
//
// Times, interleaved run by run (median of --runs after --warmup):
//   forward   one Model::Forward of the two texts as one batch (the model's pooling), what
//             Encode does for them;
//   <method>  ExplainSimilarity(a, b) for each --methods entry (pairwise, integrated_gradients,
//             gradient_x_input) at --steps.
// Texts: two random in-vocabulary sequences of exactly --tokens tokens ([CLS]/[SEP] included).
// Prints one JSON line: {"tokens":..,"steps":..,"forward_ms":..,"<method>_ms":..,
// "<method>_ratio":..}. A measuring tool, not a test: nothing is asserted.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "engine/cli_util.h"
#include "engine/explain/attribution.h"
#include "engine/model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR, "Hugging Face model directory.");
ABSL_FLAG(int, tokens, 32, "Tokens per text, [CLS] and [SEP] included.");
ABSL_FLAG(int, steps, 32, "Integrated-gradient steps.");
ABSL_FLAG(std::string, methods, "pairwise,integrated_gradients,gradient_x_input",
          "Comma-separated attribution methods to time.");
ABSL_FLAG(int, runs, 3, "Timed runs per item; the median is reported.");
ABSL_FLAG(int, warmup, 1, "Untimed runs per item first.");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");

namespace {

attn::Encoding RandomText(const attn::Model& model, int tokens, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(2000, model.config().vocab_size - 1);
  std::vector<int32_t> ids = {model.tokenizer().cls_id()};
  for (int t = 0; t < tokens - 2; ++t) ids.push_back(token(rng));
  ids.push_back(model.tokenizer().sep_id());
  attn::Encoding e = *model.tokenizer().FromIds(ids);
  // FromIds marks nothing special; the baseline keeps [CLS]/[SEP] as the tokenizer's own would.
  e.special_tokens_mask.assign(ids.size(), 0);
  e.special_tokens_mask.front() = e.special_tokens_mask.back() = 1;
  return e;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  attn::StartProgram(argc, argv, "attn-bench-explain",
                     "Times ExplainSimilarity against one forward of the same texts.");
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  auto model = attn::Model::Load(absl::GetFlag(FLAGS_model_dir));
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const attn::Model& m = **model;
  std::mt19937 rng(7);
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const attn::Encoding a = RandomText(m, tokens, rng), b = RandomText(m, tokens, rng);
  std::map<std::string, attn::AttributionMethod> known = {
      {"pairwise", attn::AttributionMethod::kPairwise},
      {"integrated_gradients", attn::AttributionMethod::kIntegratedGradients},
      {"gradient_x_input", attn::AttributionMethod::kGradientXInput}};
  std::vector<std::string> methods = absl::StrSplit(absl::GetFlag(FLAGS_methods), ',');
  for (const std::string& name : methods) {
    if (!known.count(name)) {
      std::fprintf(stderr, "unknown method '%s'\n", name.c_str());
      return 1;
    }
  }
  using Clock = std::chrono::steady_clock;
  auto time_ms = [](auto&& fn) {
    const auto start = Clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  std::map<std::string, std::vector<double>> times;
  const std::vector<attn::SequenceInput> batch = {{a.ids, a.type_ids}, {b.ids, b.type_ids}};
  const int warmup = absl::GetFlag(FLAGS_warmup), runs = absl::GetFlag(FLAGS_runs);
  float completeness = 0;
  for (int run = 0; run < warmup + runs; ++run) {
    const double forward_ms = time_ms([&] { (void)m.Forward(batch, m.DefaultForwardOptions()); });
    if (run >= warmup) times["forward"].push_back(forward_ms);
    for (const std::string& name : methods) {
      attn::AttributionOptions options;
      options.method = known[name];
      options.steps = absl::GetFlag(FLAGS_steps);
      const double ms = time_ms([&] {
        auto r = attn::ExplainSimilarity(m.config(), m.weights(), m.sentence_config(),
                                         m.tokenizer(), a, b, options);
        if (!r.ok()) {
          std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(r.status().message()).c_str());
          std::exit(1);
        }
        if (name == "pairwise") completeness = r->completeness_error;
      });
      if (run >= warmup) times[name].push_back(ms);
    }
  }
  nlohmann::json out = {{"tokens", tokens},
                        {"steps", absl::GetFlag(FLAGS_steps)},
                        {"threads", omp_get_max_threads()},
                        {"runs", runs}};
  const double forward = Median(times["forward"]);
  out["forward_ms"] = forward;
  for (const std::string& name : methods) {
    const double ms = Median(times[name]);
    out[name + "_ms"] = ms;
    out[name + "_ratio"] = ms / forward;
  }
  if (times.count("pairwise")) out["pairwise_completeness_error"] = completeness;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
