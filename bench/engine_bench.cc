// attn-bench-engine: times the engine's forward pass (pooled, L2-normalised embeddings: what
// Encode returns by default), on a packed batch.
//
// One-shot: `attn-bench-engine --batch 32 --seq-len 128` times random in-vocabulary ids;
// `--inputs FILE --workload NAME` times a workload of the harness's inputs file. Median of
// --runs after --warmup, one JSON line.
//
// Worker (`--worker`, driven by bench/harness.py; protocol in bench/bench_worker.h). Commands:
//   {"cmd": "info"}                                  engine, precision, threads, oneDNN version
//   {"cmd": "tokenize", "texts": [...], "max_length": N}  -> {"ids": [[...], ...]}
//   {"cmd": "load", "inputs": PATH}                  -> {"workloads": [names]}
//   {"cmd": "run", "workload": NAME, "repeat": K}    -> {"seconds": [K wall times]}
//   {"cmd": "embed", "workload": NAME, "out": PATH}  writes the pooled embeddings as raw
//                                                    little-endian float32 rows -> {"rows", "dim"}
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_worker.h"
#include "engine/cli_util.h"
#include "engine/model.h"
#include "engine/precision.h"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR, "Hugging Face model directory.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, int8 (linear layers quantised at load), bf16 (every matmul on bfloat16 "
          "inputs; emulated on CPUs without avx512_bf16/AMX) or auto. Exits with code 3 and an "
          "\"unsupported\" JSON line when the engine cannot run that precision.");
ABSL_FLAG(int, batch, 32, "One-shot: sequences per forward (random ids).");
ABSL_FLAG(int, seq_len, 128, "One-shot: tokens per sequence, [CLS] and [SEP] included.");
ABSL_FLAG(std::string, inputs, "",
          "One-shot: the harness's inputs JSON; time --workload instead of random ids.");
ABSL_FLAG(std::string, workload, "", "One-shot: workload name in --inputs.");
ABSL_FLAG(int, runs, 5, "One-shot: timed runs; the median is reported.");
ABSL_FLAG(int, warmup, 2, "One-shot: untimed runs first (primitive creation, caches).");
ABSL_FLAG(int, threads, 0, "OpenMP threads; 0 = all cores.");
ABSL_FLAG(int, pause_ms, 0,
          "One-shot: sleep this long before each run, as the harness does between engines "
          "(thread pools go idle).");
ABSL_FLAG(int, evict_mb, 0,
          "One-shot: before each run, write a buffer of this many MB, as the other engines' "
          "runs between ours do in the harness (weights no longer in cache).");
ABSL_FLAG(bool, worker, false, "Serve the JSON-lines worker protocol on stdin/stdout.");

namespace {

constexpr int kExitUnsupported = 3;

using attn::bench::Workload;

// The engine under test at one precision. Forward() is what every timed run calls.
class EngineUnderTest {
 public:
  // An engine build without the requested precision answers Unimplemented (reported by the
  // harness as "n/a (not built)").
  static absl::StatusOr<EngineUnderTest> Create(const std::string& model_dir,
                                                const std::string& precision) {
    attn::ModelOptions options;
    if (!attn::ParsePrecision(precision, &options.precision)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision must be fp32, int8, bf16 or auto, not '", precision, "'"));
    }
    absl::StatusOr<std::shared_ptr<const attn::Model>> model =
        attn::Model::Load(model_dir, options);
    if (!model.ok()) return model.status();
    EngineUnderTest engine;
    engine.model_ = *std::move(model);
    engine.precision_ = precision;
    engine.options_ = engine.model_->DefaultForwardOptions();
    return engine;
  }

  absl::StatusOr<attn::ForwardResult> Forward(const std::vector<attn::SequenceInput>& batch) const {
    return model_->Forward(batch, options_);
  }
  absl::Status ForwardDiscarding(const std::vector<attn::SequenceInput>& batch) const {
    return Forward(batch).status();
  }

  const attn::Model& model() const { return *model_; }
  const std::string& precision() const { return precision_; }

 private:
  std::shared_ptr<const attn::Model> model_;
  std::string precision_;
  attn::ForwardOptions options_;
};

nlohmann::json Info(const EngineUnderTest& engine) {
  return {{"engine", "attnserve-" + engine.precision()},
          {"precision", engine.precision()},
          {"threads", omp_get_max_threads()},
          {"onednn", attn::bench::OneDnnVersion()}};
}

std::vector<attn::SequenceInput> RandomBatch(const attn::Model& model, int batch_size,
                                             int seq_len) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(1000, model.config().vocab_size - 1);
  std::vector<attn::SequenceInput> batch(batch_size);
  for (attn::SequenceInput& seq : batch) {
    seq.token_ids.push_back(model.tokenizer().cls_id());
    for (int t = 0; t < seq_len - 2; ++t) seq.token_ids.push_back(token(rng));
    seq.token_ids.push_back(model.tokenizer().sep_id());
  }
  return batch;
}

int64_t TokenCount(const std::vector<attn::SequenceInput>& batch) {
  int64_t tokens = 0;
  for (const attn::SequenceInput& seq : batch) tokens += seq.token_ids.size();
  return tokens;
}

// The worker's state: the engine and the workloads loaded so far.
class Worker {
 public:
  explicit Worker(EngineUnderTest engine) : engine_(std::move(engine)) {}

  absl::StatusOr<nlohmann::json> Handle(const nlohmann::json& command) {
    const std::string cmd = command.at("cmd").get<std::string>();
    if (cmd == "info") return Info(engine_);
    if (cmd == "tokenize") return Tokenize(command);
    if (cmd == "load") {
      absl::StatusOr<std::map<std::string, Workload>> loaded =
          attn::bench::LoadWorkloads(command.at("inputs").get<std::string>());
      if (!loaded.ok()) return loaded.status();
      workloads_ = *std::move(loaded);
      nlohmann::json names = nlohmann::json::array();
      for (const auto& [name, workload] : workloads_) names.push_back(name);
      return nlohmann::json{{"workloads", names}};
    }
    if (cmd == "run" || cmd == "embed") {
      const std::string name = command.at("workload").get<std::string>();
      auto it = workloads_.find(name);
      if (it == workloads_.end() || it->second.sequences.empty()) {
        return absl::NotFoundError(absl::StrCat("no inference workload '", name, "' loaded"));
      }
      return cmd == "run" ? Run(it->second.sequences, command.value("repeat", 1))
                          : Embed(it->second.sequences, command.at("out").get<std::string>());
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown command '", cmd, "'"));
  }

 private:
  absl::StatusOr<nlohmann::json> Tokenize(const nlohmann::json& command) const {
    attn::TruncationOptions truncation;
    truncation.max_length = command.value("max_length", engine_.model().max_positions());
    nlohmann::json ids = nlohmann::json::array();
    for (const nlohmann::json& text : command.at("texts")) {
      absl::StatusOr<attn::Encoding> encoding =
          engine_.model().tokenizer().Encode(text.get<std::string>(), truncation);
      if (!encoding.ok()) return encoding.status();
      ids.push_back(encoding->ids);
    }
    return nlohmann::json{{"ids", ids}};
  }

  absl::StatusOr<nlohmann::json> Run(const std::vector<attn::SequenceInput>& batch,
                                     int repeat) const {
    nlohmann::json seconds = nlohmann::json::array();
    for (int i = 0; i < repeat; ++i) {
      absl::StatusOr<double> elapsed =
          attn::bench::TimeOnce([&] { return engine_.ForwardDiscarding(batch); });
      if (!elapsed.ok()) return elapsed.status();
      seconds.push_back(*elapsed);
    }
    return nlohmann::json{{"seconds", seconds}};
  }

  absl::StatusOr<nlohmann::json> Embed(const std::vector<attn::SequenceInput>& batch,
                                       const std::string& path) const {
    absl::StatusOr<attn::ForwardResult> result = engine_.Forward(batch);
    if (!result.ok()) return result.status();
    const attn::Tensor& pooled = result->pooled;  // (B, H)
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(pooled.data()),
              static_cast<std::streamsize>(pooled.numel() * sizeof(float)));
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
    return nlohmann::json{{"rows", pooled.dim(0)}, {"dim", pooled.dim(1)}};
  }

  EngineUnderTest engine_;
  std::map<std::string, Workload> workloads_;
};

int OneShot(const EngineUnderTest& engine) {
  std::vector<attn::SequenceInput> batch;
  std::string shape;
  if (!absl::GetFlag(FLAGS_inputs).empty()) {
    absl::StatusOr<std::map<std::string, Workload>> workloads =
        attn::bench::LoadWorkloads(absl::GetFlag(FLAGS_inputs));
    if (!workloads.ok()) {
      std::fprintf(stderr, "%s\n", std::string(workloads.status().message()).c_str());
      return 1;
    }
    auto it = workloads->find(absl::GetFlag(FLAGS_workload));
    if (it == workloads->end() || it->second.sequences.empty()) {
      std::fprintf(stderr, "no inference workload '%s' in %s\n",
                   absl::GetFlag(FLAGS_workload).c_str(), absl::GetFlag(FLAGS_inputs).c_str());
      return 1;
    }
    batch = it->second.sequences;
    shape = absl::StrCat("\"workload\": \"", it->first, "\", \"batch\": ", batch.size());
  } else {
    const int batch_size = absl::GetFlag(FLAGS_batch), seq_len = absl::GetFlag(FLAGS_seq_len);
    if (batch_size < 1 || seq_len < 2) {
      std::fprintf(stderr, "need --batch >= 1 and --seq-len >= 2\n");
      return 1;
    }
    batch = RandomBatch(engine.model(), batch_size, seq_len);
    shape = absl::StrCat("\"batch\": ", batch_size, ", \"seq_len\": ", seq_len);
  }
  const int runs = absl::GetFlag(FLAGS_runs), warmup = absl::GetFlag(FLAGS_warmup);
  if (runs < 1 || warmup < 0) {
    std::fprintf(stderr, "need --runs >= 1 and --warmup >= 0\n");
    return 1;
  }
  std::vector<char> evict(static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_evict_mb))) << 20);
  std::vector<double> seconds;
  for (int i = 0; i < warmup + runs; ++i) {
    for (size_t b = 0; b < evict.size(); b += 64) ++evict[b];
    if (absl::GetFlag(FLAGS_pause_ms) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_pause_ms)));
    }
    absl::StatusOr<double> elapsed =
        attn::bench::TimeOnce([&] { return engine.ForwardDiscarding(batch); });
    if (!elapsed.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", std::string(elapsed.status().message()).c_str());
      return 1;
    }
    if (i >= warmup) seconds.push_back(*elapsed);
  }
  const double median = attn::bench::Median(seconds);
  std::printf(
      "{\"engine\": \"attnserve-%s\", %s, \"tokens\": %lld, \"threads\": %d, \"median_ms\": %.2f, "
      "\"min_ms\": %.2f, \"tokens_per_s\": %.0f}\n",
      engine.precision().c_str(), shape.c_str(), static_cast<long long>(TokenCount(batch)),
      omp_get_max_threads(), median * 1e3, *std::min_element(seconds.begin(), seconds.end()) * 1e3,
      TokenCount(batch) / median);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the engine forward pass: attn-bench-engine --batch 32 --seq-len 128 "
      "(or --worker for bench/harness.py)");
  attn::ShowProjectFlagsInHelp("attn-bench-engine 0.2.0");
  attn::AcceptDashedFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));

  absl::StatusOr<EngineUnderTest> engine =
      EngineUnderTest::Create(absl::GetFlag(FLAGS_model_dir), absl::GetFlag(FLAGS_precision));
  if (!engine.ok()) {
    const bool unsupported = absl::IsUnimplemented(engine.status());
    const std::string message(engine.status().message());
    if (absl::GetFlag(FLAGS_worker)) {
      std::printf("%s\n",
                  nlohmann::json{{"error", message}, {"unsupported", unsupported}}.dump().c_str());
    } else {
      std::fprintf(stderr, "attn-bench-engine: %s\n", message.c_str());
    }
    return unsupported ? kExitUnsupported : 1;
  }
  if (!absl::GetFlag(FLAGS_worker)) return OneShot(*engine);

  nlohmann::json ready = Info(*engine);
  ready["ready"] = true;
  Worker worker(*std::move(engine));
  return attn::bench::RunWorker(
      ready, [&worker](const nlohmann::json& command) { return worker.Handle(command); });
}
