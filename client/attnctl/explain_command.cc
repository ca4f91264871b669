// attnctl explain: why two texts are similar (the Explain RPC), as text, JSON, or a picture: both
// texts with each token coloured by its contribution and the token-pair matrix as a labelled
// heatmap (the attention renderer, client/render.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"
#include "client/render.h"
#include "client/tensor_decode.h"

ABSL_DECLARE_FLAG(std::string, svg);   // attention_command.cc
ABSL_DECLARE_FLAG(std::string, html);  // attention_command.cc

ABSL_FLAG(std::string, method, "pairwise",
          "pairwise (token-pair matrix, texts <= 128 tokens) | ig (integrated gradients per "
          "token) | gxi (gradient x input per token)");
ABSL_FLAG(int, steps, 32, "interpolation steps of the integrated path, 1..256");
ABSL_FLAG(int, at_layer, 0,
          "attribute at the hidden states entering this encoder layer: 0 = the input "
          "embeddings, 6 = the last hidden states (MiniLM)");
ABSL_FLAG(std::string, baseline, "pad", "pad | mask | zero: what the texts are compared with");
ABSL_FLAG(bool, words, false, "aggregate word pieces into words");

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

std::vector<std::string> TokenTexts(const google::protobuf::RepeatedPtrField<v1::Token>& tokens) {
  std::vector<std::string> out;
  for (const v1::Token& t : tokens) out.push_back(t.text());
  return out;
}

std::vector<std::string> WordTexts(const google::protobuf::RepeatedPtrField<v1::Word>& words) {
  std::vector<std::string> out;
  for (const v1::Word& w : words) out.push_back(w.text());
  return out;
}

// Per-token (or per-word) values of one text: integrated gradients when computed, else
// gradient x input.
std::vector<float> TokenValues(const v1::TextAttributions& a) {
  const auto& field =
      a.integrated_gradients_size() > 0 ? a.integrated_gradients() : a.gradient_x_input();
  return {field.begin(), field.end()};
}

std::vector<float> WordValues(const google::protobuf::RepeatedPtrField<v1::Word>& words,
                              bool integrated) {
  std::vector<float> out;
  for (const v1::Word& w : words) {
    out.push_back(integrated ? w.integrated_gradients() : w.gradient_x_input());
  }
  return out;
}

int RunExplain(const Command& command) {
  const std::string query = absl::GetFlag(FLAGS_text), document = absl::GetFlag(FLAGS_pair);
  if (query.empty() || document.empty()) {
    return UsageError("explain needs --text (the query) and --pair (the text to compare it with)",
                      &command);
  }
  v1::ExplainRequest request;
  request.set_query(query);
  request.add_documents(document);
  const std::string method = absl::AsciiStrToLower(absl::GetFlag(FLAGS_method));
  if (method == "pairwise") {
    request.set_method(v1::ATTRIBUTION_PAIRWISE);
  } else if (method == "ig") {
    request.set_method(v1::ATTRIBUTION_INTEGRATED_GRADIENTS);
  } else if (method == "gxi") {
    request.set_method(v1::ATTRIBUTION_GRADIENT_X_INPUT);
  } else {
    return UsageError(absl::StrCat("--method must be pairwise, ig or gxi, not '", method, "'"),
                      &command);
  }
  const std::string baseline = absl::AsciiStrToLower(absl::GetFlag(FLAGS_baseline));
  if (baseline == "pad") {
    request.set_baseline(v1::BASELINE_PAD_TOKENS);
  } else if (baseline == "mask") {
    request.set_baseline(v1::BASELINE_MASK_TOKENS);
  } else if (baseline == "zero") {
    request.set_baseline(v1::BASELINE_ZERO);
  } else {
    return UsageError(absl::StrCat("--baseline must be pad, mask or zero, not '", baseline, "'"),
                      &command);
  }
  request.set_steps(absl::GetFlag(FLAGS_steps));  // the server checks the range
  request.set_layer(absl::GetFlag(FLAGS_at_layer));
  const bool words = absl::GetFlag(FLAGS_words);
  request.set_word_level(words);
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_model_version(absl::GetFlag(FLAGS_model_version));

  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->Explain(request);
  if (!response.ok()) return RpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  if (response->results_size() != 1) {
    std::fprintf(stderr, "attnctl: the server returned %d results for one document\n",
                 response->results_size());
    return kExitFailure;
  }
  const v1::ExplainResult& r = response->results(0);
  const bool integrated = r.query().integrated_gradients_size() > 0;
  const std::string title =
      absl::StrFormat("similarity %.4f, completeness error %.2g (%s, %d steps)", r.similarity(),
                      r.completeness_error(), method, request.steps());

  // Tokens or words, and their values.
  const std::vector<std::string> q_labels =
      words ? WordTexts(r.query_words()) : TokenTexts(r.query_tokens());
  const std::vector<std::string> d_labels =
      words ? WordTexts(r.document_words()) : TokenTexts(r.document_tokens());
  const std::vector<float> q_values =
      words ? WordValues(r.query_words(), integrated) : TokenValues(r.query());
  const std::vector<float> d_values =
      words ? WordValues(r.document_words(), integrated) : TokenValues(r.document());
  const v1::Tensor& matrix_proto = words ? r.word_pair_matrix() : r.pair_matrix();
  std::vector<float> matrix;
  if (matrix_proto.shape_size() == 2) {
    auto decoded = DecodeTensor(matrix_proto);
    if (!decoded.ok()) {
      std::fprintf(stderr, "attnctl: bad pair matrix from server: %s\n",
                   std::string(decoded.status().message()).c_str());
      return kExitFailure;
    }
    matrix = decoded->values;
  }

  std::printf("%s\n", title.c_str());
  const char* what = integrated ? "integrated gradients" : "gradient x input";
  for (const auto& [name, labels, values] :
       {std::tuple{"query", &q_labels, &q_values}, std::tuple{"pair", &d_labels, &d_values}}) {
    std::printf("%s (%s per %s):\n", name, what, words ? "word" : "token");
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < labels->size(); ++i) {
      rows.push_back({(*labels)[i], absl::StrFormat("%+.4f", (*values)[i])});
    }
    PrintTable({"token", "value"}, rows, "    ");
  }
  if (!matrix.empty()) {
    // The largest pair cells.
    std::vector<size_t> order(matrix.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    const size_t top = std::min<size_t>(5, order.size());
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](size_t x, size_t y) { return matrix[x] > matrix[y]; });
    std::printf("largest pair contributions (sum %.4f, target %.4f):\n", r.attribution_sum(),
                r.completeness_target());
    for (size_t k = 0; k < top; ++k) {
      const size_t i = order[k] / d_labels.size(), j = order[k] % d_labels.size();
      std::printf("    %s \u2194 %s  %+.4f\n", q_labels[i].c_str(), d_labels[j].c_str(),
                  matrix[order[k]]);
    }
  }
  PrintMetadata(response->model_version(), response->metadata());

  const std::string svg_path = absl::GetFlag(FLAGS_svg), html_path = absl::GetFlag(FLAGS_html);
  if (svg_path.empty() && html_path.empty()) return kExitOk;
  std::vector<HtmlSection> sections;
  for (const auto& [name, labels, values] :
       {std::tuple{"query", &q_labels, &q_values}, std::tuple{"pair", &d_labels, &d_values}}) {
    auto strip = RenderTokenStripSvg(
        *labels, *values, absl::StrFormat("%s: %s per %s", name, what, words ? "word" : "token"));
    if (!strip.ok()) return RpcError(strip.status(), client->target());
    sections.push_back({name, "", *strip});
  }
  if (!matrix.empty()) {
    HeatmapOptions options;
    options.diverging = true;
    options.row_axis_label = "query";
    options.col_axis_label = "pair";
    options.value_label = "contribution to the score";
    auto heatmap = RenderMatrixSvg(q_labels, d_labels, matrix, "token-pair attributions", options);
    if (!heatmap.ok()) return RpcError(heatmap.status(), client->target());
    sections.push_back({"token pairs", "", *heatmap});
  }
  bool ok = true;
  if (!svg_path.empty()) {
    std::vector<std::string> parts;
    for (const HtmlSection& s : sections) parts.push_back(s.svg);
    // The title on its own strip above the parts.
    auto header = RenderTokenStripSvg({absl::StrFormat("%.4f", r.similarity())}, {r.similarity()},
                                      title, 200);
    if (header.ok()) parts.insert(parts.begin(), *header);
    ok &= WriteFile(svg_path, StackSvgs(parts, title));
  }
  if (!html_path.empty()) {
    ok &= WriteFile(html_path, RenderHtml("attnserve: why are these texts similar?", title,
                                          kExplainPageNote, sections));
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

Command ExplainCommand() {
  return {
      "explain",
      "why two texts are similar: token and token-pair attributions of their similarity",
      "attnctl explain --text QUERY --pair TEXT [--svg out.svg | --html out.html] [flags]",
      R"(Calls Explain: the similarity of the two texts' embeddings decomposed into contributions of
their tokens (integrated gradients, or gradient x input) and, with --method pairwise, of every
token pair (integrated Jacobians, Moeller et al. 2023). Prints the per-token values, the five
largest pair cells and the completeness error (how exactly the contributions add up to the
score); --svg/--html draw both texts coloured by contribution (blue raises, red lowers the
score) and the pair matrix as a heatmap. Pairwise with 32 steps takes seconds to minutes.
)",
      {{"Flags",
        {{"text", "QUERY", "the first text"},
         {"pair", "TEXT", "the text to compare it with"},
         {"method", "M"},
         {"steps", "N"},
         {"at_layer", "L"},
         {"baseline", "B"},
         {"words", ""},
         {"svg", "PATH", "write the picture as SVG"},
         {"html", "PATH", "write the picture as a self-contained HTML page"},
         {"model", "NAME", "explain with this served model (default: the server's default)"},
         {"model_version", "V", "explain with this version (default: the one served)"}}},
       EncoderCommonFlags()},
      R"(  attnctl explain --text "A man is playing a guitar." --pair "Someone plays the guitar on stage." --svg why.svg
  attnctl explain --text "cheap flights" --pair "low-cost airline tickets" --method ig --words
  attnctl explain --text "query" --pair "document" --steps 8 --json
)",
      RunExplain};
}

}  // namespace attn::client::attnctl
