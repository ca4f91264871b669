// Attention-map pictures: labelled SVG heatmaps, small-multiple grids of heads, and a
// self-contained HTML page around them. Pure functions (no gRPC, no I/O); the output is a
// deterministic function of the inputs, so pictures can be diffed and tested as text.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attn::client {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};

// The sequential colour scale: t in [0, 1] from near-white (low) to dark blue (high), linear
// interpolation between ColorBrewer "Blues" anchors, whose lightness falls monotonically — so
// darker always means more attention. t is clamped; NaN maps to the NaN colour (grey).
Rgb ScaleColor(double t);
// The diverging scale for signed values: t = 0 red, 0.5 white, 1 blue (ColorBrewer RdBu).
Rgb DivergingColor(double t);
// "#rrggbb".
std::string ToHex(Rgb color);

// XML/HTML text and attribute escaping (& < > " '). Control characters that XML 1.0 cannot
// carry and invalid UTF-8 become U+FFFD, so any token text yields well-formed markup.
std::string XmlEscape(absl::string_view text);

struct HeatmapOptions {
  // Colour range. NaN = taken from the data (min / max of the finite values; for a grid, over
  // all heads, so panels are comparable).
  double vmin = std::numeric_limits<double>::quiet_NaN();
  double vmax = std::numeric_limits<double>::quiet_NaN();
  // Side of one cell in px; 0 = chosen from the sequence length (long sequences get smaller
  // cells; below 7 px only every n-th token is labelled, the tooltips name every token).
  int cell_size = 0;
  // Labels longer than this many characters are cut with "…".
  int max_label_chars = 16;
  // Per-cell tooltips are left out when a picture has more cells than this (each costs ~60
  // bytes; a 12-head grid of 256 tokens would otherwise be ~100 MB).
  int64_t max_tooltip_cells = 250000;
  std::string row_axis_label = "from (query token)";
  std::string col_axis_label = "to (key token)";
  // Shown next to the colour bar.
  std::string value_label = "attention weight";
  // Signed values: a range symmetric about 0 on the red-white-blue scale (DivergingColor).
  bool diverging = false;
};

// One T×T map: rows are the query ("from") tokens, columns the key ("to") tokens; `matrix` is
// row-major with matrix[i * T + j] = how much token i attends to token j. Each cell is a
// <rect class="cell"> with a <title> tooltip "from (i) → to (j): 0.123". Fails if
// matrix.size() != T * T or T == 0.
absl::StatusOr<std::string> RenderHeatmapSvg(const std::vector<std::string>& tokens,
                                             const std::vector<float>& matrix,
                                             absl::string_view title,
                                             const HeatmapOptions& options = {});

// A rows x cols map with its own row and column labels (RenderHeatmapSvg is the square case):
// the token-pair attribution matrix of Explain.
absl::StatusOr<std::string> RenderMatrixSvg(const std::vector<std::string>& row_tokens,
                                            const std::vector<std::string>& col_tokens,
                                            const std::vector<float>& matrix,
                                            absl::string_view title,
                                            const HeatmapOptions& options = {});

// A text as a wrapped strip of tokens, each on the diverging colour of its value (symmetric
// range), with a tooltip; fails unless there is one value per token.
absl::StatusOr<std::string> RenderTokenStripSvg(const std::vector<std::string>& tokens,
                                                const std::vector<float>& values,
                                                absl::string_view title, int max_width = 900);

// SVG documents of the functions here, one below the other, as one document.
std::string StackSvgs(const std::vector<std::string>& svgs, absl::string_view title);

// Small multiples: one panel per head (titled "head h"), all on one colour scale.
// `weights` is [heads.size(), T, T] row-major; `heads` are the head numbers of its slices.
absl::StatusOr<std::string> RenderHeadGridSvg(const std::vector<std::string>& tokens,
                                              const std::vector<int>& heads,
                                              const std::vector<float>& weights, int layer,
                                              const HeatmapOptions& options = {});

struct HtmlSection {
  std::string heading;  // plain text, escaped on output
  std::string text;     // plain text paragraph (optional), escaped on output
  std::string svg;      // an SVG document from the functions above, embedded as is
};

// A self-contained HTML page (inline SVG and CSS, no scripts, no external resources). `note`: how
// to read the pictures, shown under the subtitle (each kind of page says its own).
std::string RenderHtml(absl::string_view title, absl::string_view subtitle, absl::string_view note,
                       const std::vector<HtmlSection>& sections);

// The notes of the two pages attnctl draws.
inline constexpr char kAttentionPageNote[] =
    "Rows are the query token (attending from), columns the key token (attended to); darker is "
    "more attention. Hover a cell for its value.";
inline constexpr char kExplainPageNote[] =
    "Each token's contribution to the similarity of the two texts: blue raises the score, red "
    "lowers it. In the token-pair matrix, rows are the query's tokens and columns the pair's. "
    "Hover a token or cell for its value.";

}  // namespace attn::client
