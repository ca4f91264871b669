// attnctl's version analysis commands (Trainer service): diff (CompareVersions) and neighbors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"
#include "client/render.h"

ABSL_DECLARE_FLAG(std::string, svg);  // attention_command.cc
ABSL_DECLARE_FLAG(int, layer);        // attention_command.cc
ABSL_DECLARE_FLAG(int, top_k);        // classify_commands.cc
ABSL_FLAG(std::string, from, "", "version A of the comparison (\"base\" or a committed version)");
ABSL_FLAG(std::string, to, "", "version B of the comparison");
ABSL_FLAG(std::string, probe, "",
          "probe texts, one per line (11 to 1000); default: the server's built-in 200");
ABSL_FLAG(std::string, word, "", "the word whose neighbours to show");
ABSL_FLAG(std::string, in, "",
          "a sentence containing the word (repeat --in; at least 2): contextual cosines");

namespace attn::client::attnctl {

namespace {

namespace v1 = ::attnserve::v1;

// The heat strip's columns: the weight of each matrix (a LayerNorm's gamma).
const std::vector<std::string>& StripColumns() {
  static const std::vector<std::string> columns = {"word_embeddings",
                                                   "position_embeddings",
                                                   "token_type_embeddings",
                                                   "embedding_norm",
                                                   "query",
                                                   "key",
                                                   "value",
                                                   "attention_output",
                                                   "attention_norm",
                                                   "ffn_in",
                                                   "ffn_out",
                                                   "ffn_norm"};
  return columns;
}

// Rows "embeddings", "layer 0", ...; NaN where a row has no such matrix (grey).
void StripMatrix(const v1::CompareVersionsResponse& response, std::vector<std::string>* rows,
                 std::vector<float>* values) {
  int layers = 0;
  for (const v1::MatrixChange& m : response.matrices()) layers = std::max(layers, m.layer() + 1);
  rows->push_back("embeddings");
  for (int l = 0; l < layers; ++l) rows->push_back(absl::StrFormat("layer %d", l));
  const size_t cols = StripColumns().size();
  values->assign(rows->size() * cols, std::numeric_limits<float>::quiet_NaN());
  for (const v1::MatrixChange& m : response.matrices()) {
    if (m.part() != "weight") continue;
    const auto col = std::find(StripColumns().begin(), StripColumns().end(), m.matrix());
    if (col == StripColumns().end()) continue;
    (*values)[(m.layer() + 1) * cols + (col - StripColumns().begin())] =
        static_cast<float>(m.relative_change());
  }
}

void PrintDiff(const v1::CompareVersionsResponse& r) {
  std::printf("model %s: %s -> %s\n\n", r.model().c_str(), r.version_a().c_str(),
              r.version_b().c_str());
  std::printf("relative weight change ||W_B - W_A|| / ||W_A|| (weights; biases in --json)\n");
  std::vector<std::string> rows_names;
  std::vector<float> values;
  StripMatrix(r, &rows_names, &values);
  std::vector<std::string> header = {""};
  const std::vector<std::string> short_names = {"word",    "pos",    "type",    "emb_ln",
                                                "W_Q",     "W_K",    "W_V",     "W_O",
                                                "attn_ln", "ffn_in", "ffn_out", "ffn_ln"};
  for (const std::string& name : short_names) header.push_back(name);
  std::vector<std::vector<std::string>> rows;
  const size_t cols = StripColumns().size();
  for (size_t i = 0; i < rows_names.size(); ++i) {
    std::vector<std::string> row = {rows_names[i]};
    for (size_t c = 0; c < cols; ++c) {
      const float v = values[i * cols + c];
      row.push_back(std::isnan(v) ? "" : absl::StrFormat("%.2e", v));
    }
    rows.push_back(std::move(row));
  }
  PrintTable(header, rows, "", {});
  std::printf("\nheads whose attention moved most (mean Jensen-Shannon divergence on %d probes)\n",
              r.drift().probes());
  rows.clear();
  for (const v1::HeadChange& h : r.most_changed_heads()) {
    rows.push_back(
        {absl::StrFormat("%d", h.layer()), absl::StrFormat("%d", h.head()),
         absl::StrFormat("%.2e", h.attention_js()), absl::StrFormat("%.2e", h.query_change()),
         absl::StrFormat("%.2e", h.key_change()), absl::StrFormat("%.2e", h.value_change())});
  }
  PrintTable({"layer", "head", "JS", "dW_Q", "dW_K", "dW_V"}, rows, "", {});
  const v1::EmbeddingDrift& d = r.drift();
  std::printf(
      "\nembedding drift on %d %s probes: cosine mean %.4f, min %.4f (probe %d); Spearman of "
      "pairwise similarities %.4f; top-%d neighbour overlap %.3f\n",
      d.probes(), r.default_probes() ? "built-in" : "given", d.mean_cosine(), d.min_cosine(),
      d.min_cosine_probe(), d.spearman(), d.neighbours_k(), d.neighbour_overlap());
  std::printf("\nverdict: %s\n", r.verdict().c_str());
}

absl::StatusOr<std::string> DiffSvg(const v1::CompareVersionsResponse& r) {
  std::vector<std::string> rows;
  std::vector<float> values;
  StripMatrix(r, &rows, &values);
  HeatmapOptions strip;
  strip.vmin = 0;
  strip.row_axis_label = "";
  strip.col_axis_label = "matrix (weight)";
  strip.value_label = "||W_B - W_A|| / ||W_A||";
  strip.max_label_chars = 22;
  absl::StatusOr<std::string> strip_svg = RenderMatrixSvg(
      rows, StripColumns(), values,
      absl::StrFormat("relative weight change, %s -> %s", r.version_a(), r.version_b()), strip);
  if (!strip_svg.ok()) return strip_svg.status();
  int layers = 0, heads = 0;
  for (const v1::HeadChange& h : r.heads()) {
    layers = std::max(layers, h.layer() + 1);
    heads = std::max(heads, h.head() + 1);
  }
  std::vector<std::string> layer_names, head_names;
  for (int l = 0; l < layers; ++l) layer_names.push_back(absl::StrFormat("layer %d", l));
  for (int h = 0; h < heads; ++h) head_names.push_back(absl::StrFormat("head %d", h));
  std::vector<float> js(static_cast<size_t>(layers) * heads, 0.0f);
  for (const v1::HeadChange& h : r.heads()) {
    js[h.layer() * heads + h.head()] = static_cast<float>(h.attention_js());
  }
  HeatmapOptions grid;
  grid.vmin = 0;
  grid.row_axis_label = "";
  grid.col_axis_label = "head";
  grid.value_label = "mean JS divergence";
  absl::StatusOr<std::string> grid_svg = RenderMatrixSvg(
      layer_names, head_names, js,
      absl::StrFormat("attention change per head on %d probes", r.drift().probes()), grid);
  if (!grid_svg.ok()) return grid_svg.status();
  return StackSvgs({*strip_svg, *grid_svg},
                   absl::StrFormat("%s -> %s: %s", r.version_a(), r.version_b(), r.verdict()));
}

int RunDiff(const Command& command) {
  v1::CompareVersionsRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_version_a(absl::GetFlag(FLAGS_from));
  request.set_version_b(absl::GetFlag(FLAGS_to));
  if (request.version_a().empty() || request.version_b().empty()) {
    return UsageError("diff needs --from A and --to B (see 'attnctl versions')", &command);
  }
  if (const std::string path = absl::GetFlag(FLAGS_probe); !path.empty()) {
    std::ifstream in(path);
    if (!in) return UsageError("cannot read --probe " + path, &command);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) request.add_probes(line);
    }
  }
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->CompareVersions(request);
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (const std::string svg_path = absl::GetFlag(FLAGS_svg); !svg_path.empty()) {
    absl::StatusOr<std::string> svg = DiffSvg(*response);
    if (!svg.ok() || !WriteFile(svg_path, *svg)) {
      std::fprintf(stderr, "attnctl: cannot write %s\n", svg_path.c_str());
      return kExitFailure;
    }
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  PrintDiff(*response);
  return kExitOk;
}

int RunNeighbors(const Command& command) {
  v1::NeighborsRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_version(absl::GetFlag(FLAGS_model_version));
  request.set_word(absl::GetFlag(FLAGS_word));
  if (request.word().empty()) return UsageError("neighbors needs --word WORD", &command);
  request.set_top_k(absl::GetFlag(FLAGS_top_k));
  if (const std::string in = absl::GetFlag(FLAGS_in); !in.empty()) {
    for (absl::string_view sentence : absl::StrSplit(in, kRepeatedFlagSeparator)) {
      request.add_sentences(std::string(sentence));
    }
  }
  if (const int layer = absl::GetFlag(FLAGS_layer); layer >= 0) request.set_layer(layer);
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->Neighbors(request);
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  std::vector<std::string> pieces(response->word_tokens().begin(), response->word_tokens().end());
  std::printf("version %s: '%s' = [%s]\n\nstatic neighbours (word-embedding table, cosine)\n",
              response->model_version().c_str(), request.word().c_str(),
              absl::StrJoin(pieces, " ").c_str());
  std::vector<std::vector<std::string>> rows;
  for (const v1::TokenNeighbor& n : response->static_neighbors()) {
    rows.push_back(
        {n.token(), absl::StrFormat("%d", n.token_id()), absl::StrFormat("%.4f", n.cosine())});
  }
  PrintTable({"token", "id", "cosine"}, rows, "");
  const int s = request.sentences_size();
  if (s > 0) {
    std::printf("\ncontextual cosine at layer %d (mean over the word's sub-tokens)\n",
                response->layer());
    std::vector<std::string> header = {""};
    for (int j = 0; j < s; ++j) header.push_back(absl::StrFormat("[%d]", j));
    rows.clear();
    for (int i = 0; i < s; ++i) {
      std::vector<std::string> row = {absl::StrFormat("[%d]", i)};
      for (int j = 0; j < s; ++j) {
        row.push_back(absl::StrFormat("%.3f", response->contextual_cosine(i * s + j)));
      }
      rows.push_back(std::move(row));
    }
    PrintTable(header, rows, "", {});
    for (int i = 0; i < s; ++i) {
      std::printf("  [%d] %s\n", i, ShortText(request.sentences(i), 70).c_str());
    }
  }
  return kExitOk;
}

}  // namespace

CommandGroup CompareCommands() {
  const FlagUse token_file{"token_file", "PATH"};
  const FlagUse model{"model", "NAME", "the served model (default: the server's default one)"};
  FlagUse in{"in", "SENTENCE"};
  in.repeatable = true;
  CommandGroup group{"What fine-tuning changed (Trainer service, read-only)", {}};
  group.commands.push_back(
      {"diff",
       "compare two versions: weights, attention, embedding drift, re-index verdict",
       "attnctl diff --from A --to B [--probe FILE] [--svg out.svg] [flags]",
       R"(Prints the relative change ||W_B - W_A|| / ||W_A|| of every weight matrix per layer, the heads
whose attention moved most on the probe texts (mean Jensen-Shannon divergence), the drift of the
pooled embeddings (cosine of A's and B's vector of the same text, Spearman correlation of the
pairwise similarities, top-10 neighbour overlap) and the verdict: whether vectors computed with
A can stay in an index queried with B. --svg draws the layers x matrices heat strip and the
layers x heads grid of attention change.
)",
       {{"Flags",
         {{"from", "A"},
          {"to", "B"},
          {"probe", "FILE"},
          {"svg", "PATH", "write the heat strip and the head grid as one SVG"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl diff --from base --to ft-000001-20261125T065759Z\n"
       "  attnctl diff --from base --to ft-000001-20261125T065759Z --svg diff.svg\n",
       RunDiff});
  group.commands.push_back(
      {"neighbors",
       "a word's nearest tokens in the embedding table, and its contextual cosines",
       "attnctl neighbors --word WORD [--in SENTENCE --in SENTENCE ...] [--layer N] [flags]",
       R"(Static: the vocabulary tokens whose rows of the word-embedding table are closest (cosine) to
the word's (the mean of its sub-tokens' rows). Contextual, with --in: the word's hidden state at
--layer (0 = embedding output, default the last layer) in each sentence, and the cosine between
sentences: the same word in different senses moves apart.
)",
       {{"Flags",
         {{"word", "WORD"},
          in,
          {"layer", "N", "hidden layer of the contextual vectors: 0..L (default: the last)"},
          {"top_k", "K", "static neighbours to print (0 = 10, at most 100)"},
          {"model_version", "V", "the version (default: the served one)", "version"},
          model,
          token_file}},
        CommonFlags()},
       "  attnctl neighbors --word king\n"
       "  attnctl neighbors --word bank --in \"the bank of the river\" --in \"the bank lends\"\n",
       RunNeighbors});
  return group;
}

}  // namespace attn::client::attnctl
