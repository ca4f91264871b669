// Attention-map rendering (client/render.h) and tensor decoding (client/tensor_decode.h):
// structure, escaping, colour order and determinism of the SVG/HTML output; FLOAT16/BFLOAT16 bit
// patterns and size validation of decoded tensors.
#include "client/render.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tensor_decode.h"
#include "gtest/gtest.h"

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;

// ---------------------------------------------------------------------------------------------
// A tiny XML well-formedness checker: balanced and properly nested tags, quoted attributes, no
// raw '<' or stray '&' in text or attribute values. Enough to catch broken escaping or a
// missing close tag; not a full XML parser.

bool ValidEntityAt(const std::string& s, size_t i) {
  for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
    if (s.compare(i, std::strlen(e), e) == 0) return true;
  }
  if (s.compare(i, 2, "&#") == 0) return s.find(';', i) != std::string::npos;
  return false;
}

// Returns "" if well-formed, else a description of the first problem.
std::string CheckWellFormed(const std::string& doc) {
  std::vector<std::string> stack;
  size_t i = 0;
  while (i < doc.size()) {
    if (doc[i] == '&') {
      if (!ValidEntityAt(doc, i)) return absl::StrCat("bad entity at ", i);
      ++i;
      continue;
    }
    if (doc[i] != '<') {
      if (doc[i] == '>') return absl::StrCat("raw '>' in text at ", i);
      ++i;
      continue;
    }
    if (doc.compare(i, 4, "<!--") == 0) {
      const size_t end = doc.find("-->", i);
      if (end == std::string::npos) return "unterminated comment";
      i = end + 3;
      continue;
    }
    if (doc.compare(i, 2, "<!") == 0 || doc.compare(i, 2, "<?") == 0) {  // DOCTYPE, XML decl
      const size_t end = doc.find('>', i);
      if (end == std::string::npos) return "unterminated declaration";
      i = end + 1;
      continue;
    }
    const bool closing = doc.compare(i, 2, "</") == 0;
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < doc.size() && (std::isalnum(static_cast<unsigned char>(doc[j])) || doc[j] == '-' ||
                              doc[j] == ':' || doc[j] == '_')) {
      ++j;
    }
    const std::string name = doc.substr(name_start, j - name_start);
    if (name.empty()) return absl::StrCat("tag without name at ", i);
    // Attributes: name="value" pairs.
    bool self_closing = false;
    while (true) {
      while (j < doc.size() && std::isspace(static_cast<unsigned char>(doc[j]))) ++j;
      if (j >= doc.size()) return absl::StrCat("unterminated tag <", name);
      if (doc[j] == '>') {
        ++j;
        break;
      }
      if (doc.compare(j, 2, "/>") == 0) {
        if (closing) return absl::StrCat("</", name, "/>");
        self_closing = true;
        j += 2;
        break;
      }
      if (closing) return absl::StrCat("attributes in closing tag </", name);
      const size_t attr_start = j;
      while (j < doc.size() && doc[j] != '=' && doc[j] != '>' &&
             !std::isspace(static_cast<unsigned char>(doc[j]))) {
        ++j;
      }
      if (j == attr_start || j >= doc.size() || doc[j] != '=' || j + 1 >= doc.size() ||
          doc[j + 1] != '"') {
        return absl::StrCat("unquoted or malformed attribute in <", name, "> at ", attr_start);
      }
      j += 2;
      while (j < doc.size() && doc[j] != '"') {
        if (doc[j] == '<') return absl::StrCat("raw '<' in attribute of <", name, ">");
        if (doc[j] == '&' && !ValidEntityAt(doc, j)) {
          return absl::StrCat("bad entity in attribute of <", name, ">");
        }
        ++j;
      }
      if (j >= doc.size()) return "unterminated attribute value";
      ++j;
    }
    if (closing) {
      if (stack.empty() || stack.back() != name) {
        return absl::StrCat("</", name, "> does not match <", stack.empty() ? "" : stack.back(),
                            ">");
      }
      stack.pop_back();
    } else if (!self_closing) {
      stack.push_back(name);
    }
    i = j;
  }
  if (!stack.empty()) return absl::StrCat("unclosed <", stack.back(), ">");
  return "";
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// Fill colours of the cells, in document (row-major) order.
std::vector<std::string> CellFills(const std::string& svg) {
  std::vector<std::string> fills;
  for (size_t pos = svg.find("class=\"cell\""); pos != std::string::npos;
       pos = svg.find("class=\"cell\"", pos + 1)) {
    const size_t f = svg.find("fill=\"#", pos);
    fills.push_back(svg.substr(f + 6, 7));
  }
  return fills;
}

double Luminance(const std::string& hex) {
  const int r = std::stoi(hex.substr(1, 2), nullptr, 16);
  const int g = std::stoi(hex.substr(3, 2), nullptr, 16);
  const int b = std::stoi(hex.substr(5, 2), nullptr, 16);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

std::vector<std::string> Tokens(int n) {
  std::vector<std::string> tokens = {"[CLS]"};
  for (int i = 1; i + 1 < n; ++i) tokens.push_back(absl::StrCat("tok", i));
  if (n > 1) tokens.push_back("[SEP]");
  return tokens;
}

// A T×T row-stochastic-ish map with distinct values.
std::vector<float> Ramp(int t, float scale = 1.0f) {
  std::vector<float> m(static_cast<size_t>(t) * t);
  for (size_t k = 0; k < m.size(); ++k) m[k] = scale * static_cast<float>(k) / m.size();
  return m;
}

// [2, T, T]: the same map twice.
std::vector<float> TwoHeads(const std::vector<float>& map) {
  std::vector<float> both = map;
  both.insert(both.end(), map.begin(), map.end());
  return both;
}

// ---------------------------------------------------------------------------------------------
// Heatmap

TEST(RenderHeatmap, WellFormedWithOneRectPerCell) {
  const std::vector<std::string> tokens = {"[CLS]", "the", "cat", "sat", "[SEP]"};
  auto svg = RenderHeatmapSvg(tokens, Ramp(5), "layer 5, head 3");
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckWellFormed(*svg), "");
  EXPECT_TRUE(absl::StartsWith(*svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(Count(*svg, "class=\"cell\""), 25);
  EXPECT_EQ(Count(*svg, "<title>"), 26);  // document title + one tooltip per cell
  EXPECT_TRUE(absl::StrContains(*svg, "layer 5, head 3"));
  // Special tokens are shown as they are, on both axes.
  EXPECT_EQ(Count(*svg, ">[CLS]</text>"), 2);
  EXPECT_EQ(Count(*svg, ">[SEP]</text>"), 2);
  EXPECT_TRUE(absl::StrContains(*svg, "from (query token)"));
  EXPECT_TRUE(absl::StrContains(*svg, "to (key token)"));
}

TEST(RenderHeatmap, TooltipNamesFromAndToTokens) {
  const std::vector<std::string> tokens = {"[CLS]", "hi", "[SEP]"};
  std::vector<float> m(9, 0.0f);
  m[0 * 3 + 1] = 0.123f;
  auto svg = RenderHeatmapSvg(tokens, m, "t");
  ASSERT_TRUE(svg.ok());
  EXPECT_TRUE(absl::StrContains(*svg, "<title>[CLS] (0) \u2192 hi (1): 0.123</title>"));
  EXPECT_TRUE(absl::StrContains(*svg, "<title>hi (1) \u2192 [CLS] (0): 0.000</title>"));
}

TEST(RenderHeatmap, EscapesLabelsEverywhere) {
  const std::vector<std::string> tokens = {
      "[CLS]", "<b>&", "\"q\"", "it's", "\xF0\x9F\x98\x80", "a\x01z", "bad\xFFutf8", "[SEP]"};
  auto svg = RenderHeatmapSvg(tokens, Ramp(8), "title <with> & \"quotes\"");
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(CheckWellFormed(*svg), "");
  EXPECT_FALSE(absl::StrContains(*svg, "<b>"));
  EXPECT_FALSE(absl::StrContains(*svg, "<b>&"));
  EXPECT_TRUE(absl::StrContains(*svg, "&lt;b&gt;&amp;"));
  EXPECT_TRUE(absl::StrContains(*svg, "&quot;q&quot;"));
  EXPECT_TRUE(absl::StrContains(*svg, "it&apos;s"));
  EXPECT_TRUE(absl::StrContains(*svg, "title &lt;with&gt; &amp; &quot;quotes&quot;"));
  EXPECT_TRUE(absl::StrContains(*svg, "\xF0\x9F\x98\x80"));  // emoji kept as UTF-8
  // Control characters and invalid UTF-8 cannot appear in XML: replaced by U+FFFD.
  EXPECT_FALSE(absl::StrContains(*svg, "\x01"));
  EXPECT_FALSE(absl::StrContains(*svg, "\xFF"));
  EXPECT_TRUE(absl::StrContains(*svg, "a\xEF\xBF\xBDz"));
}

TEST(RenderHeatmap, XmlEscape) {
  EXPECT_EQ(XmlEscape("<b>&\"'"), "&lt;b&gt;&amp;&quot;&apos;");
  EXPECT_EQ(XmlEscape("plain [CLS] ##ing"), "plain [CLS] ##ing");
  EXPECT_EQ(XmlEscape("tab\tnl\n"), "tab\tnl\n");
  EXPECT_EQ(XmlEscape("\xC3\xA9t\xC3\xA9"), "\xC3\xA9t\xC3\xA9");  // été
  EXPECT_EQ(XmlEscape("\xC3"), "\xEF\xBF\xBD");                    // truncated sequence
  EXPECT_EQ(XmlEscape("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // overlong '/'
  EXPECT_EQ(XmlEscape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(RenderHeatmap, ColourScaleGetsDarkerWithValue) {
  double previous = Luminance(ToHex(ScaleColor(0.0)));
  for (int k = 1; k <= 200; ++k) {
    const double l = Luminance(ToHex(ScaleColor(k / 200.0)));
    EXPECT_LE(l, previous) << "t=" << k / 200.0;
    previous = l;
  }
  EXPECT_GT(Luminance(ToHex(ScaleColor(0.0))), 240);  // near white
  EXPECT_LT(Luminance(ToHex(ScaleColor(1.0))), 60);   // dark blue
  EXPECT_EQ(ScaleColor(-3.0), ScaleColor(0.0));       // clamped
  EXPECT_EQ(ScaleColor(7.0), ScaleColor(1.0));
}

TEST(RenderHeatmap, CellColoursAreMonotonicInValue) {
  // Values increase in row-major order, so cell fills must get darker in document order, and
  // strictly darker from the lowest to the highest.
  const int t = 6;
  auto svg = RenderHeatmapSvg(Tokens(t), Ramp(t), "ramp");
  ASSERT_TRUE(svg.ok());
  const std::vector<std::string> fills = CellFills(*svg);
  ASSERT_EQ(fills.size(), 36u);
  for (size_t k = 1; k < fills.size(); ++k) {
    EXPECT_LE(Luminance(fills[k]), Luminance(fills[k - 1])) << "cell " << k;
  }
  EXPECT_GT(Luminance(fills.front()), Luminance(fills.back()) + 150);
  EXPECT_TRUE(absl::StrContains(*svg, "min 0.000"));
  EXPECT_TRUE(absl::StrContains(*svg, "max 0.972"));  // 35/36
}

TEST(RenderHeatmap, FixedRangeAndSpecialValues) {
  const std::vector<std::string> tokens = {"a", "b"};
  HeatmapOptions options;
  options.vmin = 0.0;
  options.vmax = 1.0;
  auto svg = RenderHeatmapSvg(tokens, {0.0f, 1.0f, 0.5f, std::nanf("")}, "fixed", options);
  ASSERT_TRUE(svg.ok());
  const std::vector<std::string> fills = CellFills(*svg);
  ASSERT_EQ(fills.size(), 4u);
  EXPECT_EQ(fills[0], ToHex(ScaleColor(0.0)));
  EXPECT_EQ(fills[1], ToHex(ScaleColor(1.0)));
  EXPECT_EQ(fills[2], ToHex(ScaleColor(0.5)));
  EXPECT_EQ(fills[3], ToHex(ScaleColor(std::nan(""))));  // grey, not a scale colour
  EXPECT_TRUE(absl::StrContains(*svg, "b (1) \u2192 b (1): nan"));
  // A constant map has no range: every cell gets the same colour, nothing divides by zero.
  auto flat = RenderHeatmapSvg(tokens, {0.25f, 0.25f, 0.25f, 0.25f}, "flat");
  ASSERT_TRUE(flat.ok());
  const std::vector<std::string> flat_fills = CellFills(*flat);
  EXPECT_EQ(flat_fills, std::vector<std::string>(4, flat_fills[0]));
}

TEST(RenderHeatmap, IsDeterministic) {
  const auto tokens = Tokens(12);
  auto a = RenderHeatmapSvg(tokens, Ramp(12), "same");
  auto b = RenderHeatmapSvg(tokens, Ramp(12), "same");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(RenderHeatmap, LongSequencesGetSmallerCellsAndRotatedLabels) {
  auto cell_width = [](const std::string& svg) {
    const size_t pos = svg.find("class=\"cell\"");
    const size_t w = svg.find("width=\"", pos) + 7;
    return std::stoi(svg.substr(w, svg.find('"', w) - w));
  };
  auto short_svg = RenderHeatmapSvg(Tokens(5), Ramp(5), "short");
  auto long_svg = RenderHeatmapSvg(Tokens(60), Ramp(60), "long");
  auto huge_svg = RenderHeatmapSvg(Tokens(300), Ramp(300), "huge");
  ASSERT_TRUE(short_svg.ok() && long_svg.ok() && huge_svg.ok());
  EXPECT_GT(cell_width(*short_svg), cell_width(*long_svg));
  EXPECT_GT(cell_width(*long_svg), cell_width(*huge_svg));
  EXPECT_EQ(Count(*long_svg, "class=\"cell\""), 60 * 60);
  // Column labels wider than a cell are rotated.
  EXPECT_TRUE(absl::StrContains(*long_svg, "rotate(-90)\">tok1</text>"));
  EXPECT_EQ(CheckWellFormed(*long_svg), "");
  // Cells too small for one label each: every n-th token is labelled, and the axes say so;
  // tooltips still name every token.
  EXPECT_EQ(cell_width(*huge_svg), 3);
  EXPECT_TRUE(absl::StrContains(*huge_svg, ">tok3</text>"));
  EXPECT_FALSE(absl::StrContains(*huge_svg, ">tok4</text>"));
  EXPECT_TRUE(absl::StrContains(*huge_svg, "(labels every 3 tokens)"));
  EXPECT_FALSE(absl::StrContains(*long_svg, "labels every"));
  EXPECT_TRUE(absl::StrContains(*huge_svg, "tok7 (7) \u2192 tok9 (9)"));
  EXPECT_EQ(CheckWellFormed(*huge_svg), "");
}

TEST(RenderHeatmap, TooltipsAreDroppedForHugePictures) {
  HeatmapOptions options;
  options.max_tooltip_cells = 15;
  auto small = RenderHeatmapSvg(Tokens(3), Ramp(3), "small", options);
  auto big = RenderHeatmapSvg(Tokens(4), Ramp(4), "big", options);
  ASSERT_TRUE(small.ok() && big.ok());
  EXPECT_EQ(Count(*small, "<title>"), 1 + 9);
  EXPECT_EQ(Count(*big, "<title>"), 1);
  EXPECT_EQ(Count(*big, "class=\"cell\""), 16);
  EXPECT_EQ(CheckWellFormed(*big), "");
  auto grid = RenderHeadGridSvg(Tokens(3), {0, 1}, TwoHeads(Ramp(3)), 0, options);
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(Count(*grid, "<title>"), 1);  // 18 cells > 15
}

TEST(RenderHeatmap, LongLabelsAreCut) {
  const std::vector<std::string> tokens = {"[CLS]", "supercalifragilisticexpialidocious", "[SEP]"};
  auto svg = RenderHeatmapSvg(tokens, Ramp(3), "cut");
  ASSERT_TRUE(svg.ok());
  EXPECT_TRUE(absl::StrContains(*svg, ">supercalifragil\u2026</text>"));
  // The tooltip keeps the whole token.
  EXPECT_TRUE(absl::StrContains(*svg, "supercalifragilisticexpialidocious (1)"));
}

TEST(RenderHeatmap, RejectsWrongSizes) {
  EXPECT_FALSE(RenderHeatmapSvg({}, {}, "empty").ok());
  EXPECT_FALSE(RenderHeatmapSvg({"a", "b"}, {1, 2, 3}, "short").ok());
  EXPECT_FALSE(RenderHeatmapSvg({"a"}, {1, 2}, "long").ok());
}

// ---------------------------------------------------------------------------------------------
// Head grid

TEST(RenderHeadGrid, OnePanelPerHeadOnOneScale) {
  const int t = 7;
  const std::vector<int> heads = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<float> weights;
  for (size_t h = 0; h < heads.size(); ++h) {
    const auto m = Ramp(t, static_cast<float>(h + 1) / heads.size());
    weights.insert(weights.end(), m.begin(), m.end());
  }
  auto svg = RenderHeadGridSvg(Tokens(t), heads, weights, 4);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckWellFormed(*svg), "");
  EXPECT_EQ(Count(*svg, "class=\"panel\""), 12);
  EXPECT_EQ(Count(*svg, "class=\"cell\""), 12 * t * t);
  for (int h : heads) EXPECT_TRUE(absl::StrContains(*svg, absl::StrCat(">head ", h, "</text>")));
  EXPECT_TRUE(absl::StrContains(*svg, "layer 4"));
  EXPECT_TRUE(absl::StrContains(*svg, "head 11: [CLS] (0) \u2192 tok1 (1)"));
  EXPECT_EQ(Count(*svg, "class=\"colorbar\""), 1);
  // One colour scale: the last cell of head 11 (the global max) is the darkest colour.
  const std::vector<std::string> fills = CellFills(*svg);
  EXPECT_EQ(fills.back(), ToHex(ScaleColor(1.0)));
  EXPECT_NE(fills[t * t - 1], ToHex(ScaleColor(1.0)));
  // Deterministic.
  EXPECT_EQ(*svg, *RenderHeadGridSvg(Tokens(t), heads, weights, 4));
}

TEST(RenderHeadGrid, SubsetOfHeadsAndSizeChecks) {
  auto svg = RenderHeadGridSvg(Tokens(3), {2, 7}, Ramp(3) /* 9 values */, 0);
  EXPECT_FALSE(svg.ok());
  svg = RenderHeadGridSvg(Tokens(3), {2, 7}, TwoHeads(Ramp(3)), 0);
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(Count(*svg, "class=\"panel\""), 2);
  EXPECT_TRUE(absl::StrContains(*svg, ">head 7</text>"));
  EXPECT_FALSE(RenderHeadGridSvg(Tokens(3), {}, {}, 0).ok());
}

// ---------------------------------------------------------------------------------------------
// HTML

TEST(RenderHtml, SelfContainedPage) {
  auto svg = RenderHeatmapSvg({"[CLS]", "<x>", "[SEP]"}, Ramp(3), "layer 0, head 0");
  ASSERT_TRUE(svg.ok());
  const std::string html = RenderHtml("maps & <things>", "model v1", "rows & columns",
                                      {{"Input 0: \"<x>\"", "3 tokens", *svg}});
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>"));
  EXPECT_EQ(CheckWellFormed(html), "");
  EXPECT_TRUE(absl::StrContains(html, "<title>maps &amp; &lt;things&gt;</title>"));
  EXPECT_TRUE(absl::StrContains(html, "Input 0: &quot;&lt;x&gt;&quot;"));
  EXPECT_TRUE(absl::StrContains(html, "<p class=\"note\">rows &amp; columns</p>"));
  EXPECT_TRUE(absl::StrContains(html, *svg));
  EXPECT_TRUE(absl::StrContains(html, "<meta charset=\"utf-8\"/>"));
  // No scripts and nothing fetched from elsewhere.
  EXPECT_FALSE(absl::StrContains(html, "<script"));
  EXPECT_FALSE(absl::StrContains(html, "src="));
  EXPECT_FALSE(absl::StrContains(html, "href="));
  EXPECT_FALSE(absl::StrContains(html, "url("));
  EXPECT_FALSE(absl::StrContains(html, "@import"));
}

// ---------------------------------------------------------------------------------------------
// Tensor decoding

v1::Tensor MakeTensor(std::vector<int64_t> shape, v1::DType dtype, const std::string& bytes) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(dtype);
  t.set_data(bytes);
  return t;
}

std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string out;
  for (uint16_t v : values) {
    out.push_back(static_cast<char>(v & 0xFF));  // little-endian
    out.push_back(static_cast<char>(v >> 8));
  }
  return out;
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string out;
  for (float f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
  }
  return out;
}

TEST(DecodeTensor, Float16BitPatterns) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC100), -2.5f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);                      // largest finite
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));         // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));         // smallest normal
  EXPECT_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));  // signalling payload stays NaN
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

TEST(DecodeTensor, Float16AllPatternsMatchReference) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const int sign = (bits >> 15) ? -1 : 1;
    const int exponent = (bits >> 10) & 0x1F;
    const int mantissa = bits & 0x3FF;
    const float got = HalfToFloat(static_cast<uint16_t>(bits));
    if (exponent == 31) {
      if (mantissa == 0) {
        EXPECT_EQ(got, sign * std::numeric_limits<float>::infinity());
      } else {
        EXPECT_TRUE(std::isnan(got)) << bits;
      }
      continue;
    }
    const double want = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                      : sign * std::ldexp(1024 + mantissa, exponent - 25);
    ASSERT_EQ(got, static_cast<float>(want)) << "bits 0x" << std::hex << bits;
  }
}

TEST(DecodeTensor, BFloat16BitPatterns) {
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC020), -2.5f);
  EXPECT_EQ(BFloat16ToFloat(0x477F), 65280.0f);  // 65504 rounds to 65536 or 65280 in bf16
  EXPECT_EQ(BFloat16ToFloat(0x4780), 65536.0f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(BFloat16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(BFloat16ToFloat(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7FC0)));
}

TEST(DecodeTensor, DecodesEveryDtype) {
  const std::vector<float> f32 = {1.0f, -2.5f, 65504.0f, 0.0f, 3.25f, -0.5f};
  for (v1::DType dtype : {v1::FLOAT32, v1::DTYPE_UNSPECIFIED}) {
    auto d = DecodeTensor(MakeTensor({2, 3}, dtype, F32Bytes(f32)));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(d->values, f32);
  }
  auto h = DecodeTensor(
      MakeTensor({2, 3}, v1::FLOAT16, U16Bytes({0x3C00, 0xC100, 0x7BFF, 0x0001, 0x7C00, 0x7E00})));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->values[0], 1.0f);
  EXPECT_EQ(h->values[1], -2.5f);
  EXPECT_EQ(h->values[2], 65504.0f);
  EXPECT_EQ(h->values[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h->values[4]));
  EXPECT_TRUE(std::isnan(h->values[5]));
  auto b = DecodeTensor(MakeTensor({3}, v1::BFLOAT16, U16Bytes({0x3F80, 0xC020, 0x7F80})));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->values, (std::vector<float>{1.0f, -2.5f, std::numeric_limits<float>::infinity()}));
}

TEST(DecodeTensor, EdgeShapes) {
  auto scalar = DecodeTensor(MakeTensor({}, v1::FLOAT32, F32Bytes({7.0f})));
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->values, std::vector<float>{7.0f});
  auto empty = DecodeTensor(MakeTensor({4, 0, 3}, v1::FLOAT16, ""));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
}

TEST(DecodeTensor, ValidatesSizes) {
  auto short_data = DecodeTensor(MakeTensor({2, 3}, v1::FLOAT32, std::string(20, '\0')));
  ASSERT_FALSE(short_data.ok());
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_data.status().message(), "needs 24 bytes, got 20"))
      << short_data.status();
  EXPECT_FALSE(DecodeTensor(MakeTensor({2, 3}, v1::FLOAT32, std::string(28, '\0'))).ok());
  // Half precision is 2 bytes per value: 12 bytes of float16 are [2, 3], not [3, 4].
  EXPECT_TRUE(DecodeTensor(MakeTensor({2, 3}, v1::FLOAT16, std::string(12, '\0'))).ok());
  EXPECT_FALSE(DecodeTensor(MakeTensor({3, 4}, v1::BFLOAT16, std::string(12, '\0'))).ok());
  EXPECT_FALSE(DecodeTensor(MakeTensor({2, 3}, v1::FLOAT16, std::string(13, '\0'))).ok());
  EXPECT_FALSE(DecodeTensor(MakeTensor({-2, 3}, v1::FLOAT32, std::string(24, '\0'))).ok());
  // A scalar needs one value; an absent tensor (no shape, no data) is not one.
  EXPECT_FALSE(DecodeTensor(v1::Tensor()).ok());
  // Shapes whose product overflows int64 fail cleanly instead of allocating.
  const int64_t big = int64_t{1} << 40;
  auto overflow = DecodeTensor(MakeTensor({big, big, big}, v1::FLOAT32, std::string(8, '\0')));
  ASSERT_FALSE(overflow.ok());
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  // Unknown dtype numbers (from a newer server) are rejected.
  EXPECT_FALSE(DecodeTensor(MakeTensor({1}, static_cast<v1::DType>(9), std::string(4, '\0'))).ok());
}

}  // namespace
}  // namespace attn::client

// ---------------------------------------------------------------------------------------------
// Explain pictures: rectangular pair matrices, signed values, token strips

namespace attn::client {
namespace {

TEST(RenderMatrix, RectangularWithTheirOwnRowAndColumnLabels) {
  const std::vector<std::string> rows = {"[CLS]", "guitar", "[SEP]"};
  const std::vector<std::string> cols = {"[CLS]", "someone", "plays", "guitar", "[SEP]"};
  std::vector<float> m(rows.size() * cols.size(), 0.0f);
  m[1 * cols.size() + 3] = 0.42f;
  m[1 * cols.size() + 1] = -0.1f;
  HeatmapOptions options;
  options.diverging = true;
  auto svg = RenderMatrixSvg(rows, cols, m, "pairs", options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(CheckWellFormed(*svg), "");
  EXPECT_EQ(Count(*svg, "class=\"cell\""), 15);
  EXPECT_TRUE(absl::StrContains(*svg, "<title>guitar (1) \u2192 guitar (3): 0.420</title>"));
  EXPECT_TRUE(absl::StrContains(*svg, "<title>guitar (1) \u2192 someone (1): -0.100</title>"));
  // Diverging: 0 is white-ish, the largest |value| sets both ends (+-0.42).
  EXPECT_TRUE(absl::StrContains(*svg, ToHex(DivergingColor(0.5))));
  EXPECT_TRUE(absl::StrContains(*svg, "min -0.420"));
  EXPECT_TRUE(absl::StrContains(*svg, "max 0.420"));
  EXPECT_FALSE(RenderMatrixSvg(rows, cols, std::vector<float>(14), "x").ok());
}

TEST(RenderMatrix, DivergingScaleRunsRedWhiteBlue) {
  const Rgb red = DivergingColor(0.0), mid = DivergingColor(0.5), blue = DivergingColor(1.0);
  EXPECT_GT(red.r, red.b);
  EXPECT_GT(blue.b, blue.r);
  EXPECT_GT(std::min({mid.r, mid.g, mid.b}), 0xf0);
}

TEST(RenderTokenStrip, OneBoxPerTokenAndStacksIntoOneDocument) {
  auto strip = RenderTokenStripSvg({"[CLS]", "a", "<b>", "[SEP]"}, {0, 0.5f, -0.25f, 0}, "query");
  ASSERT_TRUE(strip.ok()) << strip.status();
  EXPECT_EQ(CheckWellFormed(*strip), "");
  EXPECT_EQ(Count(*strip, "class=\"token\""), 4);
  EXPECT_TRUE(absl::StrContains(*strip, "&lt;b&gt; (2): -0.250"));
  EXPECT_FALSE(RenderTokenStripSvg({"a"}, {}, "x").ok());
  const std::string both = StackSvgs({*strip, *strip}, "both");
  EXPECT_EQ(CheckWellFormed(both), "");
  EXPECT_EQ(Count(both, "class=\"token\""), 8);
}

}  // namespace
}  // namespace attn::client
