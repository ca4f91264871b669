// attn-embed: embeds each line of stdin with a model directory and prints one JSON object per
// line (JSON Lines). A debugging tool for the engine alone, before/without the server.
//
//   echo "The king spoke to the queen." | attn-embed
#include <omp.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/cli_util.h"
#include "engine/log.h"
#include "engine/model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, ATTN_DEFAULT_MODEL_DIR,
          "Hugging Face model directory (config.json, model.safetensors, vocab.txt, ...).");
ABSL_FLAG(std::string, pooling, "default",
          "Sentence pooling: default (the model's 1_Pooling config), cls, mean or max.");
ABSL_FLAG(std::string, normalize, "default",
          "L2-normalise the pooled embedding: default (the model's modules.json), true, false.");
ABSL_FLAG(int, max_length, 0,
          "Truncate each line to this many tokens including [CLS]/[SEP]; 0 = the model's "
          "default (sentence-transformers max_seq_length, else 512).");
ABSL_FLAG(int, batch_size, 32, "Lines encoded together in one packed forward pass.");
ABSL_FLAG(int, threads, 0, "OpenMP threads for oneDNN; 0 = all cores.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32; int8 (linear layers quantised at load: faster, pooled cosine to fp32 "
          ">= 0.995); bf16 (every matmul on bfloat16 inputs, fp32 accumulation: fast on CPUs "
          "with avx512_bf16/AMX, emulated elsewhere; cosine >= 0.999); auto (bf16 where "
          "native, else fp32).");
ABSL_FLAG(bool, tokens, false, "Also print each line's tokens and ids.");
ABSL_FLAG(std::string, log_level, "warning", "Log level: debug, info, warning, error.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "attn-embed: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  attn::StartProgram(
      argc, argv, "attn-embed",
      "Embeds each line of stdin and prints one JSON object per line:\n"
      "  {\"index\": 0, \"text\": \"...\", \"num_tokens\": 9, \"embedding\": [384 floats]}\n"
      "Example: echo \"The king spoke to the queen.\" | attn-embed");

  attn::LogLevel level;
  if (!attn::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return Fail("--log_level must be debug, info, warning or error");
  }
  attn::SetLogLevel(level);
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  if (batch_size <= 0) return Fail("--batch_size must be positive");

  attn::ModelOptions model_options;
  if (!attn::ParsePrecision(absl::GetFlag(FLAGS_precision), &model_options.precision)) {
    return Fail("--precision must be fp32, int8, bf16 or auto");
  }
  model_options.warm_up = false;  // one pass over stdin: nothing to gain from warming up
  auto model = attn::Model::Load(absl::GetFlag(FLAGS_model_dir), model_options);
  if (!model.ok()) {
    return Fail(absl::StrCat("cannot load model: ", model.status().message(),
                             "\n(run scripts/setup.sh to install the default model, or pass "
                             "--model_dir)"));
  }
  attn::ForwardOptions options = (*model)->DefaultForwardOptions();
  const std::string pooling = absl::GetFlag(FLAGS_pooling);
  if (pooling == "cls")
    options.pooling = attn::PoolingMode::kCls;
  else if (pooling == "mean")
    options.pooling = attn::PoolingMode::kMean;
  else if (pooling == "max")
    options.pooling = attn::PoolingMode::kMax;
  else if (pooling != "default")
    return Fail("--pooling must be default, cls, mean or max");
  const std::string normalize = absl::GetFlag(FLAGS_normalize);
  if (normalize == "true")
    options.normalize = true;
  else if (normalize == "false")
    options.normalize = false;
  else if (normalize != "default")
    return Fail("--normalize must be default, true or false");

  const int max_length = absl::GetFlag(FLAGS_max_length);
  if (max_length < 0 || max_length > (*model)->max_positions()) {
    return Fail(absl::StrCat("--max_length must be in [0, ", (*model)->max_positions(), "]"));
  }
  attn::TruncationOptions truncation;
  truncation.max_length = max_length > 0 ? max_length : (*model)->default_max_length();
  const attn::Model& m = **model;

  int64_t index = 0;
  std::vector<std::string> lines;
  auto flush = [&]() -> bool {
    if (lines.empty()) return true;
    std::vector<attn::SequenceInput> batch(lines.size());
    std::vector<attn::Encoding> encodings(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      auto encoding = m.tokenizer().Encode(lines[i], truncation);
      if (!encoding.ok()) {
        std::fprintf(stderr, "attn-embed: line %lld: %s\n", static_cast<long long>(index + i + 1),
                     std::string(encoding.status().message()).c_str());
        return false;
      }
      batch[i] = {encoding->ids, encoding->type_ids};
      encodings[i] = std::move(*encoding);
    }
    auto result = m.Forward(batch, options);
    if (!result.ok()) {
      std::fprintf(stderr, "attn-embed: %s\n", std::string(result.status().message()).c_str());
      return false;
    }
    const int64_t hidden = m.config().hidden_size;
    for (size_t i = 0; i < lines.size(); ++i) {
      nlohmann::ordered_json out;  // keeps the documented key order
      out["index"] = index++;
      out["text"] = lines[i];
      out["num_tokens"] = encodings[i].size();
      if (encodings[i].truncated) out["truncated_from"] = encodings[i].untruncated_length;
      if (absl::GetFlag(FLAGS_tokens)) {
        out["tokens"] = encodings[i].tokens;
        out["ids"] = encodings[i].ids;
      }
      const float* row = result->pooled.data() + i * hidden;
      out["embedding"] = std::vector<float>(row, row + hidden);
      std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                << "\n";
    }
    std::cout.flush();
    lines.clear();
    return true;
  };

  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    if (static_cast<int>(lines.size()) == batch_size && !flush()) return 1;
  }
  return flush() ? 0 : 1;
}
