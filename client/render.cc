#include "client/render.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace attn::client {
namespace {

// ColorBrewer "Blues" (9 classes): every channel is non-increasing along the list, so the
// interpolated ramp gets monotonically darker.
constexpr Rgb kAnchors[] = {{0xf7, 0xfb, 0xff}, {0xde, 0xeb, 0xf7}, {0xc6, 0xdb, 0xef},
                            {0x9e, 0xca, 0xe1}, {0x6b, 0xae, 0xd6}, {0x42, 0x92, 0xc6},
                            {0x21, 0x71, 0xb5}, {0x08, 0x51, 0x9c}, {0x08, 0x30, 0x6b}};
constexpr int kNumAnchors = sizeof(kAnchors) / sizeof(kAnchors[0]);
constexpr Rgb kNanColor = {0xc8, 0xc8, 0xc8};
// ColorBrewer "RdBu" (9 classes) from red (negative) through white (0) to blue (positive).
constexpr Rgb kDivergingAnchors[] = {{0xb2, 0x18, 0x2b}, {0xd6, 0x60, 0x4d}, {0xf4, 0xa5, 0x82},
                                     {0xfd, 0xdb, 0xc7}, {0xf7, 0xf7, 0xf7}, {0xd1, 0xe5, 0xf0},
                                     {0x92, 0xc5, 0xde}, {0x43, 0x93, 0xc3}, {0x21, 0x66, 0xac}};

// Linear interpolation along `anchors` at t in [0, 1] (clamped; NaN = the NaN colour).
template <size_t N>
Rgb Interpolate(const Rgb (&anchors)[N], double t) {
  if (std::isnan(t)) return kNanColor;
  const double pos = std::clamp(t, 0.0, 1.0) * (N - 1);
  const int i = std::min(static_cast<int>(pos), static_cast<int>(N) - 2);
  const double f = pos - i;
  const Rgb& a = anchors[i];
  const Rgb& b = anchors[i + 1];
  auto mix = [f](uint8_t x, uint8_t y) {
    return static_cast<uint8_t>(std::lround(x + (static_cast<double>(y) - x) * f));
  };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

constexpr int kMargin = 16;
constexpr int kTitleFont = 15;
constexpr int kTitleHeight = 30;
constexpr int kAxisTitleSize = 18;
constexpr int kBarWidth = 14;
constexpr int kBarSteps = 64;
constexpr int kBarTextWidth = 110;
// Average glyph advance of a sans-serif font, in ems: used to size label gutters.
constexpr double kCharWidthEm = 0.58;

// Decodes UTF-8 into code points; every invalid or truncated sequence becomes U+FFFD.
std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool ok = i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (!ok || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out.push_back(0xFFFD);
      ++i;  // resynchronise on the next byte
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EscapeCodePoints(const std::u32string& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) {
    switch (cp) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default: {
        // The XML 1.0 Char production.
        const bool xml_char = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                              (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
        AppendUtf8(xml_char ? cp : 0xFFFD, &out);
      }
    }
  }
  return out;
}

// Display width in "narrow character" units: East Asian and emoji glyphs count double.
double WidthUnits(const std::u32string& cps) {
  double units = 0;
  for (char32_t cp : cps) units += cp >= 0x1100 ? 2.0 : 1.0;
  return units;
}

// A label cut to max_chars code points ("…" marks the cut), escaped.
std::string LabelText(const std::string& token, int max_chars, double* width_units) {
  std::u32string cps = DecodeUtf8(token);
  if (max_chars > 1 && static_cast<int>(cps.size()) > max_chars) {
    cps.resize(max_chars - 1);
    cps.push_back(U'\u2026');
  }
  *width_units = WidthUnits(cps);
  return EscapeCodePoints(cps);
}

// Coordinates: integers print without a fraction, halves with one digit.
std::string Num(double v) {
  if (v == std::floor(v)) return absl::StrFormat("%d", static_cast<int64_t>(v));
  return absl::StrFormat("%.1f", v);
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e5)) return absl::StrFormat("%.2e", v);
  return absl::StrFormat("%.3f", v);
}

struct Range {
  double lo = 0, hi = 1;
  double Normalize(double v) const {
    if (std::isnan(v)) return v;
    if (!(hi > lo)) return 0.5;  // constant map: one mid colour
    return (v - lo) / (hi - lo);
  }
};

Range DataRange(const std::vector<float>& values, const HeatmapOptions& options) {
  double lo = INFINITY, hi = -INFINITY;
  for (float v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, static_cast<double>(v));
    hi = std::max(hi, static_cast<double>(v));
  }
  if (lo > hi) lo = 0, hi = 1;  // no finite value at all
  if (options.diverging) {      // symmetric about 0, so white is 0
    const double a = std::max({std::fabs(lo), std::fabs(hi), 1e-12});
    lo = -a, hi = a;
  }
  Range r;
  r.lo = std::isnan(options.vmin) ? lo : options.vmin;
  r.hi = std::isnan(options.vmax) ? hi : options.vmax;
  return r;
}

// Token labels of one sequence, prepared once: escaped full text for tooltips, escaped cut text
// for axes, and the widest label for the gutter size.
struct Labels {
  std::vector<std::string> full;
  std::vector<std::string> shown;
  double max_units = 0;
};

Labels PrepareLabels(const std::vector<std::string>& tokens, int max_chars) {
  Labels labels;
  for (const std::string& token : tokens) {
    double units = 0;
    labels.shown.push_back(LabelText(token, max_chars, &units));
    labels.max_units = std::max(labels.max_units, units);
    labels.full.push_back(XmlEscape(token));
  }
  return labels;
}

// Label geometry for a given cell size.
struct LabelLayout {
  // Every stride-th token is labelled: cells narrower than a readable line of text (long
  // sequences) share one label among several; the tooltips still name every token.
  int stride = 1;
  bool rotate_columns = false;
  int font = 10;
  int row_label_width = 0;   // gutter left of the matrix
  int col_label_height = 0;  // band below the matrix
};

LabelLayout LayoutLabels(const Labels& labels, int cell, int max_font) {
  constexpr int kMinLine = 7;  // px: the smallest font still worth printing
  LabelLayout l;
  l.stride = cell >= kMinLine ? 1 : (kMinLine + cell - 1) / cell;
  const int spacing = cell * l.stride;
  l.font = std::clamp(static_cast<int>(spacing * 0.75), kMinLine, max_font);
  const int text_width = static_cast<int>(std::ceil(labels.max_units * kCharWidthEm * l.font));
  l.row_label_width = text_width + 6;
  l.rotate_columns = text_width > spacing - 2;
  l.col_label_height = l.rotate_columns ? text_width + 6 : l.font + 6;
  return l;
}

// Axis titles say when not every token has a label.
HeatmapOptions WithStrideNote(HeatmapOptions options, const LabelLayout& l) {
  if (l.stride > 1) {
    const std::string note = absl::StrFormat(" (labels every %d tokens)", l.stride);
    options.row_axis_label += note;
    options.col_axis_label += note;
  }
  return options;
}

void AppendSvgOpen(int width, int height, absl::string_view title, std::string* out) {
  absl::StrAppend(
      out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height,
      "\" viewBox=\"0 0 ", width, " ", height,
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">\n", "<title>",
      XmlEscape(title), "</title>\n", "<rect x=\"0\" y=\"0\" width=\"", width, "\" height=\"",
      height, "\" fill=\"#ffffff\"/>\n");
}

void AppendTitle(int x, absl::string_view title, std::string* out) {
  absl::StrAppend(out, "<text class=\"title\" x=\"", x, "\" y=\"", kMargin + kTitleFont,
                  "\" font-size=\"", kTitleFont, "\" font-weight=\"bold\">", XmlEscape(title),
                  "</text>\n");
}

Rgb CellColor(double t, bool diverging) { return diverging ? DivergingColor(t) : ScaleColor(t); }

// The rows x columns cells of one map with top-left corner (x0, y0). `tooltip_prefix` is
// prepended to every tooltip (the head, in grids); without tooltips each cell is a bare <rect/>.
void AppendCells(int x0, int y0, int cell, const Labels& rows, const Labels& cols, const float* m,
                 const Range& range, bool diverging, bool tooltips,
                 absl::string_view tooltip_prefix, std::string* out) {
  const int r = static_cast<int>(rows.full.size()), c = static_cast<int>(cols.full.size());
  absl::StrAppend(out, "<g class=\"cells\" shape-rendering=\"crispEdges\">\n");
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < c; ++j) {
      const double v = m[static_cast<size_t>(i) * c + j];
      absl::StrAppend(out, "<rect class=\"cell\" x=\"", x0 + j * cell, "\" y=\"", y0 + i * cell,
                      "\" width=\"", cell, "\" height=\"", cell, "\" fill=\"",
                      ToHex(CellColor(range.Normalize(v), diverging)));
      if (tooltips) {
        absl::StrAppend(out, "\"><title>", tooltip_prefix, rows.full[i], " (", i, ") \u2192 ",
                        cols.full[j], " (", j, "): ", FormatValue(v), "</title></rect>\n");
      } else {
        absl::StrAppend(out, "\"/>\n");
      }
    }
  }
  absl::StrAppend(out, "</g>\n<rect x=\"", x0, "\" y=\"", y0, "\" width=\"", c * cell,
                  "\" height=\"", r * cell, "\" fill=\"none\" stroke=\"#888888\"/>\n");
}

void AppendRowLabels(int x0, int y0, int cell, const Labels& labels, const LabelLayout& l,
                     std::string* out) {
  absl::StrAppend(out, "<g class=\"row-labels\" font-size=\"", l.font,
                  "\" text-anchor=\"end\" dominant-baseline=\"central\">\n");
  for (size_t i = 0; i < labels.shown.size(); i += l.stride) {
    absl::StrAppend(out, "<text x=\"", x0 - 4, "\" y=\"", Num(y0 + i * cell + cell / 2.0), "\">",
                    labels.shown[i], "</text>\n");
  }
  absl::StrAppend(out, "</g>\n");
}

// Column labels in the band below the matrix whose bottom edge is y_bottom; rotated to read
// upwards when they are wider than a cell.
void AppendColumnLabels(int x0, int y_bottom, int cell, const Labels& labels, const LabelLayout& l,
                        std::string* out) {
  if (l.rotate_columns) {
    absl::StrAppend(out, "<g class=\"col-labels\" font-size=\"", l.font,
                    "\" text-anchor=\"end\" dominant-baseline=\"central\">\n");
    for (size_t j = 0; j < labels.shown.size(); j += l.stride) {
      absl::StrAppend(out, "<text transform=\"translate(", Num(x0 + j * cell + cell / 2.0), " ",
                      y_bottom + 4, ") rotate(-90)\">", labels.shown[j], "</text>\n");
    }
  } else {
    absl::StrAppend(out, "<g class=\"col-labels\" font-size=\"", l.font,
                    "\" text-anchor=\"middle\">\n");
    for (size_t j = 0; j < labels.shown.size(); j += l.stride) {
      absl::StrAppend(out, "<text x=\"", Num(x0 + j * cell + cell / 2.0), "\" y=\"",
                      y_bottom + 2 + l.font, "\">", labels.shown[j], "</text>\n");
    }
  }
  absl::StrAppend(out, "</g>\n");
}

// Vertical colour bar (high at the top) with the range's numbers.
void AppendColorBar(int x, int y, int height, const Range& range, absl::string_view value_label,
                    bool diverging, std::string* out) {
  absl::StrAppend(out, "<g class=\"colorbar\">\n");
  for (int k = 0; k < kBarSteps; ++k) {
    const int top = y + (k * height) / kBarSteps;
    const int bottom = y + ((k + 1) * height) / kBarSteps;
    const double t = 1.0 - (k + 0.5) / kBarSteps;
    absl::StrAppend(out, "<rect x=\"", x, "\" y=\"", top, "\" width=\"", kBarWidth, "\" height=\"",
                    bottom - top, "\" fill=\"", ToHex(CellColor(t, diverging)), "\"/>\n");
  }
  absl::StrAppend(out, "<rect x=\"", x, "\" y=\"", y, "\" width=\"", kBarWidth, "\" height=\"",
                  height, "\" fill=\"none\" stroke=\"#888888\"/>\n");
  absl::StrAppend(out, "<text class=\"vmax\" x=\"", x + kBarWidth + 4, "\" y=\"", y + 9, "\">max ",
                  FormatValue(range.hi), "</text>\n");
  absl::StrAppend(out, "<text class=\"vmin\" x=\"", x + kBarWidth + 4, "\" y=\"", y + height,
                  "\">min ", FormatValue(range.lo), "</text>\n");
  absl::StrAppend(out, "<text x=\"", x, "\" y=\"", y + height + 16, "\">", XmlEscape(value_label),
                  "</text>\n</g>\n");
}

void AppendAxisTitles(int x_center, int y_col_title, int x_row_title, int y_center,
                      const HeatmapOptions& options, std::string* out) {
  absl::StrAppend(out, "<text class=\"axis-title\" x=\"", x_center, "\" y=\"", y_col_title,
                  "\" text-anchor=\"middle\">", XmlEscape(options.col_axis_label),
                  " \u2192</text>\n");
  absl::StrAppend(out, "<text class=\"axis-title\" transform=\"translate(", x_row_title, " ",
                  y_center, ") rotate(-90)\" text-anchor=\"middle\">\u2190 ",
                  XmlEscape(options.row_axis_label), "</text>\n");
}

int TitleWidth(absl::string_view title) {
  return static_cast<int>(std::ceil(WidthUnits(DecodeUtf8(title)) * kCharWidthEm * kTitleFont));
}

}  // namespace

Rgb ScaleColor(double t) { return Interpolate(kAnchors, t); }

Rgb DivergingColor(double t) { return Interpolate(kDivergingAnchors, t); }

std::string ToHex(Rgb c) { return absl::StrFormat("#%02x%02x%02x", c.r, c.g, c.b); }

std::string XmlEscape(absl::string_view text) { return EscapeCodePoints(DecodeUtf8(text)); }

absl::StatusOr<std::string> RenderHeatmapSvg(const std::vector<std::string>& tokens,
                                             const std::vector<float>& matrix,
                                             absl::string_view title,
                                             const HeatmapOptions& options) {
  const size_t t = tokens.size();
  if (t > 0 && matrix.size() != t * t) {
    return absl::InvalidArgumentError(
        absl::StrFormat("heatmap of %d tokens needs %d values, got %d", t, t * t, matrix.size()));
  }
  return RenderMatrixSvg(tokens, tokens, matrix, title, options);
}

absl::StatusOr<std::string> RenderMatrixSvg(const std::vector<std::string>& row_tokens,
                                            const std::vector<std::string>& col_tokens,
                                            const std::vector<float>& matrix,
                                            absl::string_view title,
                                            const HeatmapOptions& options) {
  const int rows = static_cast<int>(row_tokens.size()), cols = static_cast<int>(col_tokens.size());
  if (rows == 0 || cols == 0) return absl::InvalidArgumentError("heatmap needs at least one token");
  if (matrix.size() != static_cast<size_t>(rows) * cols) {
    return absl::InvalidArgumentError(
        absl::StrFormat("heatmap of %d x %d tokens needs %d values, got %d", rows, cols,
                        rows * cols, matrix.size()));
  }
  const int cell =
      options.cell_size > 0 ? options.cell_size : std::clamp(640 / std::max(rows, cols), 3, 28);
  const Labels row_labels = PrepareLabels(row_tokens, options.max_label_chars);
  const Labels col_labels = PrepareLabels(col_tokens, options.max_label_chars);
  const LabelLayout rl = LayoutLabels(row_labels, cell, 12);
  const LabelLayout cl = LayoutLabels(col_labels, cell, 12);
  const Range range = DataRange(matrix, options);

  const int width_px = cols * cell, height_px = rows * cell;
  const int x0 = kMargin + kAxisTitleSize + rl.row_label_width;
  const int y0 = kMargin + kTitleHeight;
  const int bar_x = x0 + width_px + 24;
  const int bar_height = std::clamp(height_px, 120, 320);
  const int width =
      std::max(bar_x + kBarWidth + kBarTextWidth, kMargin + TitleWidth(title)) + kMargin;
  const int height =
      std::max(y0 + height_px + cl.col_label_height + kAxisTitleSize + 4, y0 + bar_height + 20) +
      kMargin;

  std::string out;
  out.reserve(static_cast<size_t>(rows) * cols * 160 + 4096);
  AppendSvgOpen(width, height, title, &out);
  AppendTitle(kMargin, title, &out);
  const bool tooltips = static_cast<int64_t>(rows) * cols <= options.max_tooltip_cells;
  AppendCells(x0, y0, cell, row_labels, col_labels, matrix.data(), range, options.diverging,
              tooltips, "", &out);
  AppendRowLabels(x0, y0, cell, row_labels, rl, &out);
  AppendColumnLabels(x0, y0 + height_px, cell, col_labels, cl, &out);
  HeatmapOptions axes = WithStrideNote(options, rl);
  axes.col_axis_label = WithStrideNote(options, cl).col_axis_label;
  AppendAxisTitles(x0 + width_px / 2, y0 + height_px + cl.col_label_height + kAxisTitleSize - 2,
                   kMargin + 12, y0 + height_px / 2, axes, &out);
  AppendColorBar(bar_x, y0, bar_height, range, options.value_label, options.diverging, &out);
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

absl::StatusOr<std::string> RenderTokenStripSvg(const std::vector<std::string>& tokens,
                                                const std::vector<float>& values,
                                                absl::string_view title, int max_width) {
  if (tokens.size() != values.size() || tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token strip needs one value per token, got %d tokens and %d values",
                        tokens.size(), values.size()));
  }
  HeatmapOptions options;
  options.diverging = true;
  const Range range = DataRange(values, options);
  constexpr int kFont = 13, kRow = 24, kPad = 4, kGap = 3;
  std::string cells;
  int x = kMargin, y = kMargin + kTitleHeight, widest = kMargin + TitleWidth(title);
  for (size_t i = 0; i < tokens.size(); ++i) {
    double units = 0;
    const std::string label = LabelText(tokens[i], 24, &units);
    const int w = static_cast<int>(std::ceil(units * kCharWidthEm * kFont)) + 2 * kPad;
    if (x > kMargin && x + w > max_width - kMargin) x = kMargin, y += kRow + kGap;
    absl::StrAppend(&cells, "<g class=\"token\"><rect x=\"", x, "\" y=\"", y, "\" width=\"", w,
                    "\" height=\"", kRow, "\" rx=\"3\" fill=\"",
                    ToHex(DivergingColor(range.Normalize(values[i]))),
                    "\" stroke=\"#bbbbbb\"><title>", XmlEscape(tokens[i]), " (", i,
                    "): ", FormatValue(values[i]), "</title></rect><text x=\"", x + kPad, "\" y=\"",
                    y + kRow - 7, "\" font-size=\"", kFont, "\">", label, "</text></g>\n");
    x += w + kGap;
    widest = std::max(widest, x);
  }
  const int width = widest + kMargin, height = y + kRow + kMargin + 14;
  std::string out;
  AppendSvgOpen(width, height, title, &out);
  AppendTitle(kMargin, title, &out);
  absl::StrAppend(&out, cells, "<text x=\"", kMargin, "\" y=\"", height - kMargin + 4,
                  "\" fill=\"#555555\">red lowers, blue raises the score (scale \u00b1",
                  FormatValue(range.hi), ")</text>\n</svg>\n");
  return out;
}

std::string StackSvgs(const std::vector<std::string>& svgs, absl::string_view title) {
  // Each part is one of ours: its root element starts with width="W" height="H".
  auto attribute = [](const std::string& svg, absl::string_view name) {
    const size_t at = svg.find(absl::StrCat(" ", name, "=\""));
    return at == std::string::npos ? 0 : std::atoi(svg.c_str() + at + name.size() + 3);
  };
  int width = 0, height = 0;
  std::string body;
  for (const std::string& svg : svgs) {
    const int w = attribute(svg, "width"), h = attribute(svg, "height");
    // A nested <svg> is positioned by its own x/y attributes.
    absl::StrAppend(&body, "<svg x=\"0\" y=\"", height, "\"", svg.substr(4));
    width = std::max(width, w);
    height += h;
  }
  std::string out;
  AppendSvgOpen(width, height, title, &out);
  absl::StrAppend(&out, body, "</svg>\n");
  return out;
}

absl::StatusOr<std::string> RenderHeadGridSvg(const std::vector<std::string>& tokens,
                                              const std::vector<int>& heads,
                                              const std::vector<float>& weights, int layer,
                                              const HeatmapOptions& options) {
  const int t = static_cast<int>(tokens.size());
  const int h = static_cast<int>(heads.size());
  if (t == 0 || h == 0) return absl::InvalidArgumentError("head grid needs tokens and heads");
  const size_t per_head = static_cast<size_t>(t) * t;
  if (weights.size() != per_head * h) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head grid of %d heads x %d tokens needs %d values, got %d", h, t,
                        per_head * h, weights.size()));
  }
  const int cell = options.cell_size > 0 ? options.cell_size : std::clamp(240 / t, 2, 16);
  const Labels labels = PrepareLabels(tokens, options.max_label_chars);
  const LabelLayout l = LayoutLabels(labels, cell, 10);
  const Range range = DataRange(weights, options);  // one scale for all panels

  const int columns = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(h))));
  const int rows = (h + columns - 1) / columns;
  const int side = t * cell;
  const int panel_title = 18;
  const int gap = 18;
  const int x_base = kMargin + kAxisTitleSize + l.row_label_width;
  const int y_base = kMargin + kTitleHeight;
  const int grid_w = columns * side + (columns - 1) * gap;
  const int grid_h = rows * (panel_title + side) + (rows - 1) * gap;
  const int bar_x = x_base + grid_w + 24;
  const int bar_height = std::clamp(grid_h - panel_title, 120, 320);
  const std::string title = absl::StrFormat("layer %d: attention weights by head", layer);
  const int width =
      std::max(bar_x + kBarWidth + kBarTextWidth, kMargin + TitleWidth(title)) + kMargin;
  const int height = std::max(y_base + grid_h + l.col_label_height + kAxisTitleSize + 4,
                              y_base + panel_title + bar_height + 20) +
                     kMargin;

  const bool tooltips = static_cast<int64_t>(per_head * h) <= options.max_tooltip_cells;
  std::string out;
  out.reserve(per_head * h * 170 + 8192);
  AppendSvgOpen(width, height, title, &out);
  AppendTitle(kMargin, title, &out);
  for (int p = 0; p < h; ++p) {
    const int r = p / columns;
    const int k = p % columns;
    const int px = x_base + k * (side + gap);
    const int py = y_base + r * (panel_title + side + gap) + panel_title;
    absl::StrAppend(&out, "<g class=\"panel\">\n<text class=\"panel-title\" x=\"",
                    Num(px + side / 2.0), "\" y=\"", py - 5,
                    "\" text-anchor=\"middle\" font-weight=\"bold\">head ", heads[p], "</text>\n");
    AppendCells(px, py, cell, labels, labels, weights.data() + per_head * p, range,
                options.diverging, tooltips, absl::StrCat("head ", heads[p], ": "), &out);
    // Row labels on the left column of panels, column labels under panels with none below.
    if (k == 0) AppendRowLabels(px, py, cell, labels, l, &out);
    if (p + columns >= h) AppendColumnLabels(px, py + side, cell, labels, l, &out);
    absl::StrAppend(&out, "</g>\n");
  }
  AppendAxisTitles(x_base + grid_w / 2, y_base + grid_h + l.col_label_height + kAxisTitleSize - 2,
                   kMargin + 12, y_base + grid_h / 2, WithStrideNote(options, l), &out);
  AppendColorBar(bar_x, y_base + panel_title, bar_height, range, options.value_label,
                 options.diverging, &out);
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

std::string RenderHtml(absl::string_view title, absl::string_view subtitle, absl::string_view note,
                       const std::vector<HtmlSection>& sections) {
  std::string out;
  absl::StrAppend(&out,
                  "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
                  "<title>",
                  XmlEscape(title),
                  "</title>\n<style>\n"
                  "body { font-family: \"DejaVu Sans\", Helvetica, Arial, sans-serif; "
                  "margin: 24px; color: #222222; background: #ffffff; }\n"
                  "h1 { font-size: 20px; margin: 0 0 4px 0; }\n"
                  "h2 { font-size: 16px; margin: 28px 0 4px 0; }\n"
                  "p { margin: 4px 0 10px 0; }\n"
                  ".subtitle, .note { color: #555555; }\n"
                  ".figure { overflow-x: auto; }\n"
                  "</style>\n</head>\n<body>\n<h1>",
                  XmlEscape(title), "</h1>\n");
  if (!subtitle.empty()) {
    absl::StrAppend(&out, "<p class=\"subtitle\">", XmlEscape(subtitle), "</p>\n");
  }
  if (!note.empty()) absl::StrAppend(&out, "<p class=\"note\">", XmlEscape(note), "</p>\n");
  for (const HtmlSection& section : sections) {
    absl::StrAppend(&out, "<section>\n<h2>", XmlEscape(section.heading), "</h2>\n");
    if (!section.text.empty()) absl::StrAppend(&out, "<p>", XmlEscape(section.text), "</p>\n");
    absl::StrAppend(&out, "<div class=\"figure\">\n", section.svg, "</div>\n</section>\n");
  }
  absl::StrAppend(&out, "</body>\n</html>\n");
  return out;
}

}  // namespace attn::client
