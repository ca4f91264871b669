// attnctl attention: the attention maps of one layer as top attended tokens per row, or as
// SVG/HTML pictures (one head, all heads, the mean over heads, or rollout).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/attnctl/command.h"
#include "client/attnctl/common.h"
#include "client/client.h"
#include "client/render.h"
#include "client/tensor_decode.h"

ABSL_FLAG(int, layer, -1, "encoder layer, 0-based; negative counts from the end (-1 = last)");
ABSL_FLAG(int, head, -1, "one head, 0-based; -1 = all heads");
ABSL_FLAG(std::string, svg, "",
          "write an SVG picture to this path (several inputs: PATH-0.svg, PATH-1.svg, ...)");
ABSL_FLAG(std::string, html, "",
          "write one self-contained HTML page with a picture per input to this path");
ABSL_FLAG(bool, rollout, false,
          "attention rollout (Abnar & Zuidema 2020) through all layers instead of a head");
ABSL_FLAG(bool, mean, false, "the mean over the layer's heads instead of a head");
ABSL_FLAG(int, top, 3, "attended tokens printed per row (text output)");

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// What `attention` shows: one head, the grid of all heads, the mean over heads, or rollout.
enum class View { kHead, kAllHeads, kMean, kRollout };

std::string PathForInput(const std::string& path, int index, int count) {
  if (count == 1) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return absl::StrCat(path, "-", index);
  }
  return absl::StrCat(path.substr(0, dot), "-", index, path.substr(dot));
}

// A [T, T] map, or [heads, T, T] maps with their head numbers.
struct Maps {
  std::vector<int> heads;  // empty for a single aggregate map
  std::vector<float> values;
  std::string description;
};

absl::StatusOr<Maps> ExtractMaps(const v1::AttentionResult& result, View view, int head) {
  const int64_t t = result.tokens_size();
  auto check = [t](const DecodedTensor& d, int rank, const char* what) -> absl::Status {
    const bool ok = d.rank() == rank && d.dim(rank - 1) == t && d.dim(rank - 2) == t;
    if (ok) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat("server sent %s of shape [%s] for %d tokens", what,
                                               absl::StrJoin(d.shape, ", "), t));
  };
  Maps maps;
  if (view == View::kRollout) {
    if (!result.has_rollout()) return absl::InternalError("server sent no rollout");
    auto d = DecodeTensor(result.rollout());
    if (!d.ok()) return d.status();
    if (auto s = check(*d, 2, "rollout"); !s.ok()) return s;
    maps.values = std::move(d->values);
    maps.description = "attention rollout through all layers";
    return maps;
  }
  if (result.layers_size() == 0) return absl::InternalError("server sent no layer");
  const v1::LayerAttention& layer = result.layers(0);
  if (view == View::kMean) {
    if (!layer.has_mean_weights()) return absl::InternalError("server sent no mean weights");
    auto d = DecodeTensor(layer.mean_weights());
    if (!d.ok()) return d.status();
    if (auto s = check(*d, 2, "mean weights"); !s.ok()) return s;
    maps.values = std::move(d->values);
    maps.description = absl::StrFormat("layer %d, mean over heads", layer.layer());
    return maps;
  }
  if (!layer.has_weights()) return absl::InternalError("server sent no attention weights");
  auto d = DecodeTensor(layer.weights());
  if (!d.ok()) return d.status();
  if (auto s = check(*d, 3, "weights"); !s.ok()) return s;
  if (d->dim(0) != layer.heads_size()) {
    return absl::InternalError(
        absl::StrFormat("server sent %d weight maps for %d heads", d->dim(0), layer.heads_size()));
  }
  if (view == View::kAllHeads) {
    maps.heads.assign(layer.heads().begin(), layer.heads().end());
    maps.values = std::move(d->values);
    maps.description = absl::StrFormat("layer %d, all %d heads", layer.layer(), layer.heads_size());
    return maps;
  }
  const auto it = std::find(layer.heads().begin(), layer.heads().end(), head);
  if (it == layer.heads().end()) {
    return absl::InternalError(absl::StrFormat("server sent no map for head %d", head));
  }
  const int64_t index = it - layer.heads().begin();
  maps.values.assign(d->values.begin() + index * t * t, d->values.begin() + (index + 1) * t * t);
  maps.description = absl::StrFormat("layer %d, head %d", layer.layer(), head);
  return maps;
}

// Per row: the `top` most attended columns of a [T, T] map.
void PrintTopAttended(const std::vector<std::string>& tokens, const float* map, int top) {
  const int t = static_cast<int>(tokens.size());
  int width = 0;
  for (const auto& token : tokens) width = std::max(width, DisplayWidth(token));
  const int k = std::min(top, t);
  std::vector<int> order(t);
  for (int i = 0; i < t; ++i) {
    const float* row = map + static_cast<size_t>(i) * t;
    for (int j = 0; j < t; ++j) order[j] = j;
    // Ties keep the earlier token first, so output is stable.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int a, int b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::string line = absl::StrFormat("  %3d %s ->", i, PadRight(tokens[i], width));
    for (int n = 0; n < k; ++n) {
      absl::StrAppendFormat(&line, "  %s(%d) %.3f", tokens[order[n]], order[n], row[order[n]]);
    }
    std::printf("%s\n", line.c_str());
  }
}

int RunAttention(const Command& command) {
  const int head = absl::GetFlag(FLAGS_head);
  const bool rollout = absl::GetFlag(FLAGS_rollout);
  const bool mean = absl::GetFlag(FLAGS_mean);
  const std::string svg_path = absl::GetFlag(FLAGS_svg);
  const std::string html_path = absl::GetFlag(FLAGS_html);
  const bool json = absl::GetFlag(FLAGS_json);
  const bool pictures = !svg_path.empty() || !html_path.empty();
  const int top = absl::GetFlag(FLAGS_top);
  if (head < -1) return UsageError("--head must be a head number >= 0", &command);
  if (rollout && mean) return UsageError("--rollout and --mean exclude each other", &command);
  if ((rollout || mean) && head >= 0) {
    return UsageError("--head picks one head; --rollout and --mean combine all heads", &command);
  }
  if (top < 1) return UsageError("--top must be >= 1", &command);

  // Text output without a head shows the mean over heads (12 full tables would be unreadable).
  View view = View::kAllHeads;
  if (rollout) {
    view = View::kRollout;
  } else if (mean || (head < 0 && !pictures && !json)) {
    view = View::kMean;
  } else if (head >= 0) {
    view = View::kHead;
  }

  int exit_code = kExitOk;
  std::unique_ptr<EncoderClient> client = MakeEncoderClient(&exit_code);
  if (client == nullptr) return exit_code;
  v1::AttentionMapRequest request;
  auto texts = FillSharedRequestFields(&request);
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  request.add_layers(absl::GetFlag(FLAGS_layer));
  if (head >= 0) request.add_heads(head);
  // Only ask for what is shown: per-head weights are [heads, T, T] per input.
  request.set_include_weights(view == View::kHead || view == View::kAllHeads);
  request.set_mean_over_heads(view == View::kMean);
  request.set_rollout(view == View::kRollout);

  auto response = client->AttentionMap(request);
  if (!response.ok()) return RpcError(response.status(), client->target(), NamesOf(*texts));
  if (json && !PrintJson(*response)) return kExitFailure;
  if (json && !pictures) return kExitOk;

  std::vector<HtmlSection> sections;
  const int count = response->results_size();
  for (int i = 0; i < count; ++i) {
    const v1::AttentionResult& result = response->results(i);
    std::vector<std::string> tokens;
    for (const v1::Token& t : result.tokens()) tokens.push_back(t.text());
    auto maps = ExtractMaps(result, view, head);
    if (!maps.ok()) {
      std::fprintf(stderr, "attnctl: input %d: %s\n", i,
                   std::string(maps.status().message()).c_str());
      return kExitFailure;
    }
    const std::string what = i < static_cast<int>(texts->size()) ? (*texts)[i].Describe() : "";
    if (!pictures) {
      std::printf("[%d] %s (%zu tokens%s): %s, top %d attended tokens per row\n", i, what.c_str(),
                  tokens.size(),
                  TruncationNote(result.truncated(), result.untruncated_length()).c_str(),
                  maps->description.c_str(), top);
      PrintTopAttended(tokens, maps->values.data(), top);
      continue;
    }
    absl::StatusOr<std::string> svg;
    if (view == View::kAllHeads) {
      const int layer = result.layers_size() > 0 ? result.layers(0).layer() : 0;
      svg = RenderHeadGridSvg(tokens, maps->heads, maps->values, layer);
    } else {
      HeatmapOptions options;
      if (view == View::kRollout) options.value_label = "rollout weight";
      svg = RenderHeatmapSvg(tokens, maps->values, maps->description, options);
    }
    if (!svg.ok()) {
      std::fprintf(stderr, "attnctl: input %d: %s\n", i,
                   std::string(svg.status().message()).c_str());
      return kExitFailure;
    }
    if (!svg_path.empty() && !WriteFile(PathForInput(svg_path, i, count), *svg)) {
      return kExitFailure;
    }
    sections.push_back(
        {absl::StrFormat("Input %d: %s", i, what),
         absl::StrFormat("%s; %d tokens%s.", maps->description, tokens.size(),
                         TruncationNote(result.truncated(), result.untruncated_length())),
         *std::move(svg)});
  }
  if (!pictures) PrintMetadata(response->model_version(), response->metadata());
  if (!html_path.empty()) {
    const std::string subtitle =
        absl::StrFormat("model version %s, server %s", response->model_version(), client->target());
    if (!WriteFile(html_path, RenderHtml("attnserve attention maps", subtitle, kAttentionPageNote,
                                         sections))) {
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace

Command AttentionCommand() {
  return {
      "attention",
      "attention maps of a layer: top attended tokens, or SVG/HTML pictures",
      "attnctl attention [--text TEXT [--pair TEXT] | < lines] [flags]",
      R"(Rows are query tokens (attending from), columns key tokens (attended to). Without --svg/--html
it prints, per row, the most attended tokens of the chosen map (default: the mean over heads
when no --head is given). With --svg/--html it draws the map: one head (--head), the mean over
heads (--mean), attention rollout through all layers (--rollout), or by default a grid with
every head of the layer.
)",
      {{"Flags",
        {{"layer", "N"},
         {"head", "H"},
         {"mean", ""},
         {"rollout", ""},
         {"svg", "PATH"},
         {"html", "PATH"},
         {"top", "K"},
         {"dtype", "D"}}},
       InputFlags(),
       EncoderCommonFlags()},
      R"(  attnctl attention --text "The cat sat on the mat." --head 3
  attnctl attention --text "The cat sat on the mat." --layer 0 --svg heads.svg
  attnctl attention --text "The bank of the river." --rollout --html rollout.html
)",
      RunAttention};
}

}  // namespace attn::client::attnctl
