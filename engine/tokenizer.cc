#include "engine/tokenizer.h"

#include <sys/stat.h>
#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/json_file.h"
#include "engine/tokenizer_text.h"
#include "nlohmann/json.hpp"

// File-local; undefined at the end so it cannot clash with a shared macro.
#define TOK_RETURN_IF_ERROR(expr)      \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

namespace attn {

namespace tokenizer_internal {

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------

namespace {

// The multi-byte code point whose lead byte is s[i] (>= 0x80), strictly decoded (no overlong
// forms, no surrogates, nothing above U+10FFFF): Hugging Face only ever sees valid Python str,
// so anything else is the caller's error, not something to repair. False with *why otherwise.
bool DecodeMultiByte(const unsigned char* s, size_t n, size_t i, char32_t* cp, size_t* len,
                     std::string* why) {
  const unsigned char b = s[i];
  if (b >= 0xC2 && b <= 0xDF) {
    *len = 2;
    *cp = b & 0x1F;
  } else if ((b & 0xF0) == 0xE0) {
    *len = 3;
    *cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    *len = 4;
    *cp = b & 0x07;
  } else if (b < 0xC0) {
    *why = absl::StrFormat("unexpected continuation byte 0x%02X", b);
    return false;
  } else if (b <= 0xC1) {
    *why = absl::StrFormat("overlong encoding (lead byte 0x%02X)", b);
    return false;
  } else {
    *why = absl::StrFormat("byte 0x%02X never appears in UTF-8", b);
    return false;
  }
  for (size_t k = 1; k < *len; ++k) {
    if (i + k >= n || (s[i + k] & 0xC0) != 0x80) {
      *why = absl::StrFormat("truncated %d-byte sequence", *len);
      return false;
    }
    *cp = (*cp << 6) | (s[i + k] & 0x3F);
  }
  if ((*len == 3 && *cp < 0x800) || (*len == 4 && *cp < 0x10000)) {
    *why = absl::StrFormat("overlong encoding of U+%04X", static_cast<uint32_t>(*cp));
    return false;
  }
  if (*cp >= 0xD800 && *cp <= 0xDFFF) {
    *why = absl::StrFormat("UTF-16 surrogate U+%04X", static_cast<uint32_t>(*cp));
    return false;
  }
  if (*cp > 0x10FFFF) {
    *why = absl::StrFormat("code point U+%X above U+10FFFF", static_cast<uint32_t>(*cp));
    return false;
  }
  return true;
}

// Calls on_code_point(cp, byte offset) for every code point of `text`, or fails naming the
// first byte that is not UTF-8.
template <typename OnCodePoint>
absl::Status ForEachCodePoint(std::string_view text, std::string_view what,
                              OnCodePoint on_code_point) {
  if (text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() - 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: too long (%d bytes)", what, text.size()));
  }
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  std::string why;
  while (i < n) {
    if (s[i] < 0x80) {
      on_code_point(s[i], i);
      ++i;
      continue;
    }
    char32_t cp;
    size_t len;
    if (!DecodeMultiByte(s, n, i, &cp, &len, &why)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: invalid UTF-8 at byte offset %d: %s", what, i, why));
    }
    on_code_point(cp, i);
    i += len;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeUtf8(std::string_view text, std::string_view what, std::vector<char32_t>* cps,
                        std::vector<int32_t>* starts) {
  cps->clear();
  starts->clear();
  cps->reserve(text.size());
  starts->reserve(text.size() + 1);
  absl::Status status = ForEachCodePoint(text, what, [&](char32_t cp, size_t at) {
    cps->push_back(cp);
    starts->push_back(static_cast<int32_t>(at));
  });
  starts->push_back(static_cast<int32_t>(text.size()));
  return status;
}

absl::Status ValidateUtf8(std::string_view text, std::string_view what, int64_t* code_points) {
  int64_t count = 0;
  absl::Status status = ForEachCodePoint(text, what, [&count](char32_t, size_t) { ++count; });
  *code_points = count;
  return status;
}

char32_t CodePointAt(std::string_view text, size_t i, int* len) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char b = s[i];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  *len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (*len == 2 ? 0x1F : *len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < *len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  return cp;
}

size_t PreviousCodePoint(std::string_view text, size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80);
  return i;
}

int64_t CountCodePoints(std::string_view text, size_t begin, size_t end) {
  int64_t count = 0;
  for (size_t i = begin; i < end; ++i) {
    count += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  }
  return count;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// ---------------------------------------------------------------------------------------------
// Character classes, as the tokenizers crate defines them
// ---------------------------------------------------------------------------------------------

namespace {

// Code point ranges, inclusive, sorted.
struct CpRange {
  char32_t lo, hi;
};

template <size_t N>
bool InRanges(const CpRange (&ranges)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (c < ranges[mid].lo) {
      hi = mid;
    } else if (c > ranges[mid].hi) {
      lo = mid + 1;
    } else {
      return true;
    }
  }
  return false;
}

// The tokenizers crate classifies characters with the unicode_categories crate, whose tables
// are Unicode 9.0; utf8proc's categories (Unicode 15) differ on several hundred code points
// (e.g. U+09FD is Po only since Unicode 10, U+166D stopped being Po in 12, U+0890 became Cf in
// 14). To match Hugging Face exactly these three classes are the crate's own, probed code point
// by code point: tests/golden/make_tokenizer_cases.py --emit-cpp-tables prints them (and the
// crate's non-starters, for NFD's canonical ordering, below).
// Cc, Cf, Co (is_other), minus \t \n \r.
constexpr CpRange kControlRanges[] = {
    {0x1, 0x8},         {0xB, 0xC},         {0xE, 0x1F},        {0x7F, 0x9F},
    {0xAD, 0xAD},       {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},
    {0x70F, 0x70F},     {0x180E, 0x180E},   {0x200B, 0x200F},   {0x202A, 0x202E},
    {0x2060, 0x2064},   {0x2066, 0x206F},   {0xE000, 0xF8FF},   {0xFEFF, 0xFEFF},
    {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
    {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD},
};

// Mn (and code points whose NFD is only Mn).
constexpr CpRange kNonspacingMarkRanges[] = {
    {0x300, 0x36F},     {0x483, 0x487},     {0x591, 0x5BD},     {0x5BF, 0x5BF},
    {0x5C1, 0x5C2},     {0x5C4, 0x5C5},     {0x5C7, 0x5C7},     {0x610, 0x61A},
    {0x64B, 0x65F},     {0x670, 0x670},     {0x6D6, 0x6DC},     {0x6DF, 0x6E4},
    {0x6E7, 0x6E8},     {0x6EA, 0x6ED},     {0x711, 0x711},     {0x730, 0x74A},
    {0x7A6, 0x7B0},     {0x7EB, 0x7F3},     {0x816, 0x819},     {0x81B, 0x823},
    {0x825, 0x827},     {0x829, 0x82D},     {0x859, 0x85B},     {0x8E3, 0x902},
    {0x93A, 0x93A},     {0x93C, 0x93C},     {0x941, 0x948},     {0x94D, 0x94D},
    {0x951, 0x957},     {0x962, 0x963},     {0x981, 0x981},     {0x9BC, 0x9BC},
    {0x9C1, 0x9C4},     {0x9CD, 0x9CD},     {0x9E2, 0x9E3},     {0xA01, 0xA02},
    {0xA3C, 0xA3C},     {0xA41, 0xA42},     {0xA47, 0xA48},     {0xA4B, 0xA4D},
    {0xA51, 0xA51},     {0xA70, 0xA71},     {0xA75, 0xA75},     {0xA81, 0xA82},
    {0xABC, 0xABC},     {0xAC1, 0xAC5},     {0xAC7, 0xAC8},     {0xACD, 0xACD},
    {0xAE2, 0xAE3},     {0xB01, 0xB01},     {0xB3C, 0xB3C},     {0xB3F, 0xB3F},
    {0xB41, 0xB44},     {0xB4D, 0xB4D},     {0xB56, 0xB56},     {0xB62, 0xB63},
    {0xB82, 0xB82},     {0xBC0, 0xBC0},     {0xBCD, 0xBCD},     {0xC00, 0xC00},
    {0xC3E, 0xC40},     {0xC46, 0xC48},     {0xC4A, 0xC4D},     {0xC55, 0xC56},
    {0xC62, 0xC63},     {0xC81, 0xC81},     {0xCBC, 0xCBC},     {0xCBF, 0xCBF},
    {0xCC6, 0xCC6},     {0xCCC, 0xCCD},     {0xCE2, 0xCE3},     {0xD01, 0xD01},
    {0xD41, 0xD44},     {0xD4D, 0xD4D},     {0xD62, 0xD63},     {0xDCA, 0xDCA},
    {0xDD2, 0xDD4},     {0xDD6, 0xDD6},     {0xE31, 0xE31},     {0xE34, 0xE3A},
    {0xE47, 0xE4E},     {0xEB1, 0xEB1},     {0xEB4, 0xEB9},     {0xEBB, 0xEBC},
    {0xEC8, 0xECD},     {0xF18, 0xF19},     {0xF35, 0xF35},     {0xF37, 0xF37},
    {0xF39, 0xF39},     {0xF71, 0xF7E},     {0xF80, 0xF84},     {0xF86, 0xF87},
    {0xF8D, 0xF97},     {0xF99, 0xFBC},     {0xFC6, 0xFC6},     {0x102D, 0x1030},
    {0x1032, 0x1037},   {0x1039, 0x103A},   {0x103D, 0x103E},   {0x1058, 0x1059},
    {0x105E, 0x1060},   {0x1071, 0x1074},   {0x1082, 0x1082},   {0x1085, 0x1086},
    {0x108D, 0x108D},   {0x109D, 0x109D},   {0x135D, 0x135F},   {0x1712, 0x1714},
    {0x1732, 0x1734},   {0x1752, 0x1753},   {0x1772, 0x1773},   {0x17B4, 0x17B5},
    {0x17B7, 0x17BD},   {0x17C6, 0x17C6},   {0x17C9, 0x17D3},   {0x17DD, 0x17DD},
    {0x180B, 0x180D},   {0x18A9, 0x18A9},   {0x1920, 0x1922},   {0x1927, 0x1928},
    {0x1932, 0x1932},   {0x1939, 0x193B},   {0x1A17, 0x1A18},   {0x1A1B, 0x1A1B},
    {0x1A56, 0x1A56},   {0x1A58, 0x1A5E},   {0x1A60, 0x1A60},   {0x1A62, 0x1A62},
    {0x1A65, 0x1A6C},   {0x1A73, 0x1A7C},   {0x1A7F, 0x1A7F},   {0x1AB0, 0x1ABD},
    {0x1B00, 0x1B03},   {0x1B34, 0x1B34},   {0x1B36, 0x1B3A},   {0x1B3C, 0x1B3C},
    {0x1B42, 0x1B42},   {0x1B6B, 0x1B73},   {0x1B80, 0x1B81},   {0x1BA2, 0x1BA5},
    {0x1BA8, 0x1BA9},   {0x1BAB, 0x1BAD},   {0x1BE6, 0x1BE6},   {0x1BE8, 0x1BE9},
    {0x1BED, 0x1BED},   {0x1BEF, 0x1BF1},   {0x1C2C, 0x1C33},   {0x1C36, 0x1C37},
    {0x1CD0, 0x1CD2},   {0x1CD4, 0x1CE0},   {0x1CE2, 0x1CE8},   {0x1CED, 0x1CED},
    {0x1CF4, 0x1CF4},   {0x1CF8, 0x1CF9},   {0x1DC0, 0x1DF5},   {0x1DFC, 0x1DFF},
    {0x20D0, 0x20DC},   {0x20E1, 0x20E1},   {0x20E5, 0x20F0},   {0x2CEF, 0x2CF1},
    {0x2D7F, 0x2D7F},   {0x2DE0, 0x2DFF},   {0x302A, 0x302D},   {0x3099, 0x309A},
    {0xA66F, 0xA66F},   {0xA674, 0xA67D},   {0xA69E, 0xA69F},   {0xA6F0, 0xA6F1},
    {0xA802, 0xA802},   {0xA806, 0xA806},   {0xA80B, 0xA80B},   {0xA825, 0xA826},
    {0xA8C4, 0xA8C4},   {0xA8E0, 0xA8F1},   {0xA926, 0xA92D},   {0xA947, 0xA951},
    {0xA980, 0xA982},   {0xA9B3, 0xA9B3},   {0xA9B6, 0xA9B9},   {0xA9BC, 0xA9BC},
    {0xA9E5, 0xA9E5},   {0xAA29, 0xAA2E},   {0xAA31, 0xAA32},   {0xAA35, 0xAA36},
    {0xAA43, 0xAA43},   {0xAA4C, 0xAA4C},   {0xAA7C, 0xAA7C},   {0xAAB0, 0xAAB0},
    {0xAAB2, 0xAAB4},   {0xAAB7, 0xAAB8},   {0xAABE, 0xAABF},   {0xAAC1, 0xAAC1},
    {0xAAEC, 0xAAED},   {0xAAF6, 0xAAF6},   {0xABE5, 0xABE5},   {0xABE8, 0xABE8},
    {0xABED, 0xABED},   {0xFB1E, 0xFB1E},   {0xFE00, 0xFE0F},   {0xFE20, 0xFE2F},
    {0x101FD, 0x101FD}, {0x102E0, 0x102E0}, {0x10376, 0x1037A}, {0x10A01, 0x10A03},
    {0x10A05, 0x10A06}, {0x10A0C, 0x10A0F}, {0x10A38, 0x10A3A}, {0x10A3F, 0x10A3F},
    {0x10AE5, 0x10AE6}, {0x11001, 0x11001}, {0x11038, 0x11046}, {0x1107F, 0x11081},
    {0x110B3, 0x110B6}, {0x110B9, 0x110BA}, {0x11100, 0x11102}, {0x11127, 0x1112B},
    {0x1112D, 0x11134}, {0x11173, 0x11173}, {0x11180, 0x11181}, {0x111B6, 0x111BE},
    {0x111CA, 0x111CC}, {0x1122F, 0x11231}, {0x11234, 0x11234}, {0x11236, 0x11237},
    {0x112DF, 0x112DF}, {0x112E3, 0x112EA}, {0x11300, 0x11301}, {0x1133C, 0x1133C},
    {0x11340, 0x11340}, {0x11366, 0x1136C}, {0x11370, 0x11374}, {0x114B3, 0x114B8},
    {0x114BA, 0x114BA}, {0x114BF, 0x114C0}, {0x114C2, 0x114C3}, {0x115B2, 0x115B5},
    {0x115BC, 0x115BD}, {0x115BF, 0x115C0}, {0x115DC, 0x115DD}, {0x11633, 0x1163A},
    {0x1163D, 0x1163D}, {0x1163F, 0x11640}, {0x116AB, 0x116AB}, {0x116AD, 0x116AD},
    {0x116B0, 0x116B5}, {0x116B7, 0x116B7}, {0x1171D, 0x1171F}, {0x11722, 0x11725},
    {0x11727, 0x1172B}, {0x16AF0, 0x16AF4}, {0x16B30, 0x16B36}, {0x16F8F, 0x16F92},
    {0x1BC9D, 0x1BC9E}, {0x1D167, 0x1D169}, {0x1D17B, 0x1D182}, {0x1D185, 0x1D18B},
    {0x1D1AA, 0x1D1AD}, {0x1D242, 0x1D244}, {0x1DA00, 0x1DA36}, {0x1DA3B, 0x1DA6C},
    {0x1DA75, 0x1DA75}, {0x1DA84, 0x1DA84}, {0x1DA9B, 0x1DA9F}, {0x1DAA1, 0x1DAAF},
    {0x1E8D0, 0x1E8D6}, {0xE0100, 0xE01EF},
};

// P* at or above U+0080 (ASCII is handled separately).
constexpr CpRange kPunctuationRanges[] = {
    {0xA1, 0xA1},       {0xA7, 0xA7},       {0xAB, 0xAB},       {0xB6, 0xB7},
    {0xBB, 0xBB},       {0xBF, 0xBF},       {0x37E, 0x37E},     {0x387, 0x387},
    {0x55A, 0x55F},     {0x589, 0x58A},     {0x5BE, 0x5BE},     {0x5C0, 0x5C0},
    {0x5C3, 0x5C3},     {0x5C6, 0x5C6},     {0x5F3, 0x5F4},     {0x609, 0x60A},
    {0x60C, 0x60D},     {0x61B, 0x61B},     {0x61E, 0x61F},     {0x66A, 0x66D},
    {0x6D4, 0x6D4},     {0x700, 0x70D},     {0x7F7, 0x7F9},     {0x830, 0x83E},
    {0x85E, 0x85E},     {0x964, 0x965},     {0x970, 0x970},     {0xAF0, 0xAF0},
    {0xDF4, 0xDF4},     {0xE4F, 0xE4F},     {0xE5A, 0xE5B},     {0xF04, 0xF12},
    {0xF14, 0xF14},     {0xF3A, 0xF3D},     {0xF85, 0xF85},     {0xFD0, 0xFD4},
    {0xFD9, 0xFDA},     {0x104A, 0x104F},   {0x10FB, 0x10FB},   {0x1360, 0x1368},
    {0x1400, 0x1400},   {0x166D, 0x166E},   {0x169B, 0x169C},   {0x16EB, 0x16ED},
    {0x1735, 0x1736},   {0x17D4, 0x17D6},   {0x17D8, 0x17DA},   {0x1800, 0x180A},
    {0x1944, 0x1945},   {0x1A1E, 0x1A1F},   {0x1AA0, 0x1AA6},   {0x1AA8, 0x1AAD},
    {0x1B5A, 0x1B60},   {0x1BFC, 0x1BFF},   {0x1C3B, 0x1C3F},   {0x1C7E, 0x1C7F},
    {0x1CC0, 0x1CC7},   {0x1CD3, 0x1CD3},   {0x2010, 0x2027},   {0x2030, 0x2043},
    {0x2045, 0x2051},   {0x2053, 0x205E},   {0x207D, 0x207E},   {0x208D, 0x208E},
    {0x2308, 0x230B},   {0x2329, 0x232A},   {0x2768, 0x2775},   {0x27C5, 0x27C6},
    {0x27E6, 0x27EF},   {0x2983, 0x2998},   {0x29D8, 0x29DB},   {0x29FC, 0x29FD},
    {0x2CF9, 0x2CFC},   {0x2CFE, 0x2CFF},   {0x2D70, 0x2D70},   {0x2E00, 0x2E2E},
    {0x2E30, 0x2E42},   {0x3001, 0x3003},   {0x3008, 0x3011},   {0x3014, 0x301F},
    {0x3030, 0x3030},   {0x303D, 0x303D},   {0x30A0, 0x30A0},   {0x30FB, 0x30FB},
    {0xA4FE, 0xA4FF},   {0xA60D, 0xA60F},   {0xA673, 0xA673},   {0xA67E, 0xA67E},
    {0xA6F2, 0xA6F7},   {0xA874, 0xA877},   {0xA8CE, 0xA8CF},   {0xA8F8, 0xA8FA},
    {0xA8FC, 0xA8FC},   {0xA92E, 0xA92F},   {0xA95F, 0xA95F},   {0xA9C1, 0xA9CD},
    {0xA9DE, 0xA9DF},   {0xAA5C, 0xAA5F},   {0xAADE, 0xAADF},   {0xAAF0, 0xAAF1},
    {0xABEB, 0xABEB},   {0xFD3E, 0xFD3F},   {0xFE10, 0xFE19},   {0xFE30, 0xFE52},
    {0xFE54, 0xFE61},   {0xFE63, 0xFE63},   {0xFE68, 0xFE68},   {0xFE6A, 0xFE6B},
    {0xFF01, 0xFF03},   {0xFF05, 0xFF0A},   {0xFF0C, 0xFF0F},   {0xFF1A, 0xFF1B},
    {0xFF1F, 0xFF20},   {0xFF3B, 0xFF3D},   {0xFF3F, 0xFF3F},   {0xFF5B, 0xFF5B},
    {0xFF5D, 0xFF5D},   {0xFF5F, 0xFF65},   {0x10100, 0x10102}, {0x1039F, 0x1039F},
    {0x103D0, 0x103D0}, {0x1056F, 0x1056F}, {0x10857, 0x10857}, {0x1091F, 0x1091F},
    {0x1093F, 0x1093F}, {0x10A50, 0x10A58}, {0x10A7F, 0x10A7F}, {0x10AF0, 0x10AF6},
    {0x10B39, 0x10B3F}, {0x10B99, 0x10B9C}, {0x11047, 0x1104D}, {0x110BB, 0x110BC},
    {0x110BE, 0x110C1}, {0x11140, 0x11143}, {0x11174, 0x11175}, {0x111C5, 0x111C9},
    {0x111CD, 0x111CD}, {0x111DB, 0x111DB}, {0x111DD, 0x111DF}, {0x11238, 0x1123D},
    {0x112A9, 0x112A9}, {0x114C6, 0x114C6}, {0x115C1, 0x115D7}, {0x11641, 0x11643},
    {0x1173C, 0x1173E}, {0x12470, 0x12474}, {0x16A6E, 0x16A6F}, {0x16AF5, 0x16AF5},
    {0x16B37, 0x16B3B}, {0x16B44, 0x16B44}, {0x1BC9F, 0x1BC9F}, {0x1DA87, 0x1DA8B},
};

// Combining class > 0; the value itself comes from utf8proc.
constexpr CpRange kNonStarterRanges[] = {
    {0x300, 0x33F},     {0x342, 0x342},     {0x345, 0x34E},     {0x350, 0x36F},
    {0x483, 0x487},     {0x591, 0x5BD},     {0x5BF, 0x5BF},     {0x5C1, 0x5C2},
    {0x5C4, 0x5C5},     {0x5C7, 0x5C7},     {0x610, 0x61A},     {0x64B, 0x65F},
    {0x670, 0x670},     {0x6D6, 0x6DC},     {0x6DF, 0x6E4},     {0x6E7, 0x6E8},
    {0x6EA, 0x6ED},     {0x711, 0x711},     {0x730, 0x74A},     {0x7EB, 0x7F3},
    {0x816, 0x819},     {0x81B, 0x823},     {0x825, 0x827},     {0x829, 0x82D},
    {0x859, 0x85B},     {0x8D4, 0x8E1},     {0x8E3, 0x8FF},     {0x93C, 0x93C},
    {0x94D, 0x94D},     {0x951, 0x954},     {0x9BC, 0x9BC},     {0x9CD, 0x9CD},
    {0xA3C, 0xA3C},     {0xA4D, 0xA4D},     {0xABC, 0xABC},     {0xACD, 0xACD},
    {0xB3C, 0xB3C},     {0xB4D, 0xB4D},     {0xBCD, 0xBCD},     {0xC4D, 0xC4D},
    {0xC55, 0xC56},     {0xCBC, 0xCBC},     {0xCCD, 0xCCD},     {0xD4D, 0xD4D},
    {0xDCA, 0xDCA},     {0xE38, 0xE3A},     {0xE48, 0xE4B},     {0xEB8, 0xEB9},
    {0xEC8, 0xECB},     {0xF18, 0xF19},     {0xF35, 0xF35},     {0xF37, 0xF37},
    {0xF39, 0xF39},     {0xF71, 0xF72},     {0xF74, 0xF74},     {0xF7A, 0xF7D},
    {0xF80, 0xF80},     {0xF82, 0xF84},     {0xF86, 0xF87},     {0xFC6, 0xFC6},
    {0x1037, 0x1037},   {0x1039, 0x103A},   {0x108D, 0x108D},   {0x135D, 0x135F},
    {0x1714, 0x1714},   {0x1734, 0x1734},   {0x17D2, 0x17D2},   {0x17DD, 0x17DD},
    {0x18A9, 0x18A9},   {0x1939, 0x193B},   {0x1A17, 0x1A18},   {0x1A60, 0x1A60},
    {0x1A75, 0x1A7C},   {0x1A7F, 0x1A7F},   {0x1AB0, 0x1ABD},   {0x1B34, 0x1B34},
    {0x1B44, 0x1B44},   {0x1B6B, 0x1B73},   {0x1BAA, 0x1BAB},   {0x1BE6, 0x1BE6},
    {0x1BF2, 0x1BF3},   {0x1C37, 0x1C37},   {0x1CD0, 0x1CD2},   {0x1CD4, 0x1CE0},
    {0x1CE2, 0x1CE8},   {0x1CED, 0x1CED},   {0x1CF4, 0x1CF4},   {0x1CF8, 0x1CF9},
    {0x1DC0, 0x1DF5},   {0x1DFB, 0x1DFF},   {0x20D0, 0x20DC},   {0x20E1, 0x20E1},
    {0x20E5, 0x20F0},   {0x2CEF, 0x2CF1},   {0x2D7F, 0x2D7F},   {0x2DE0, 0x2DFF},
    {0x302A, 0x302F},   {0x3099, 0x309A},   {0xA66F, 0xA66F},   {0xA674, 0xA67D},
    {0xA69E, 0xA69F},   {0xA6F0, 0xA6F1},   {0xA806, 0xA806},   {0xA8C4, 0xA8C4},
    {0xA8E0, 0xA8F1},   {0xA92B, 0xA92D},   {0xA953, 0xA953},   {0xA9B3, 0xA9B3},
    {0xA9C0, 0xA9C0},   {0xAAB0, 0xAAB0},   {0xAAB2, 0xAAB4},   {0xAAB7, 0xAAB8},
    {0xAABE, 0xAABF},   {0xAAC1, 0xAAC1},   {0xAAF6, 0xAAF6},   {0xABED, 0xABED},
    {0xFB1E, 0xFB1E},   {0xFE20, 0xFE2F},   {0x101FD, 0x101FD}, {0x102E0, 0x102E0},
    {0x10376, 0x1037A}, {0x10A0D, 0x10A0D}, {0x10A0F, 0x10A0F}, {0x10A38, 0x10A3A},
    {0x10A3F, 0x10A3F}, {0x10AE5, 0x10AE6}, {0x11046, 0x11046}, {0x1107F, 0x1107F},
    {0x110B9, 0x110BA}, {0x11100, 0x11102}, {0x11133, 0x11134}, {0x11173, 0x11173},
    {0x111C0, 0x111C0}, {0x111CA, 0x111CA}, {0x11235, 0x11236}, {0x112E9, 0x112EA},
    {0x1133C, 0x1133C}, {0x1134D, 0x1134D}, {0x11366, 0x1136C}, {0x11370, 0x11374},
    {0x11442, 0x11442}, {0x11446, 0x11446}, {0x114C2, 0x114C3}, {0x115BF, 0x115C0},
    {0x1163F, 0x1163F}, {0x116B6, 0x116B7}, {0x1172B, 0x1172B}, {0x11C3F, 0x11C3F},
    {0x16AF0, 0x16AF4}, {0x16B30, 0x16B36}, {0x1BC9E, 0x1BC9E}, {0x1D165, 0x1D169},
    {0x1D16D, 0x1D172}, {0x1D17B, 0x1D182}, {0x1D185, 0x1D18B}, {0x1D1AA, 0x1D1AD},
    {0x1D242, 0x1D244}, {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021},
    {0x1E023, 0x1E024}, {0x1E026, 0x1E02A}, {0x1E8D0, 0x1E8D6}, {0x1E944, 0x1E94A},
};

}  // namespace

// Rust's char::is_whitespace (the White_Space property), used by BertNormalizer and
// BertPreTokenizer alike. The property is small and stable, so it is spelled out.
bool IsWhitespace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// BERT's "control": the crate's is_other (Cc, Cf, Co; not Cn or Cs), except \t \n \r, which
// count as whitespace (the table leaves them out).
bool IsControl(char32_t c) {
  if (c < 0x80) return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
  return InRanges(kControlRanges, c);
}

// The CJK ideograph blocks BERT pads with spaces (not kana, not hangul).
bool IsChineseChar(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~) or any P* category.
bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  }
  return InRanges(kPunctuationRanges, c);
}

namespace {
bool IsNonspacingMark(char32_t c) { return c >= 0x300 && InRanges(kNonspacingMarkRanges, c); }
}  // namespace

// Canonical combining class as the crate's NFD sees it: zero for marks its (pre-Unicode 13)
// data does not know, such as U+1DFA or U+1715, which utf8proc gives a class.
int CombiningClass(char32_t c) {
  if (c < 0x300 || !InRanges(kNonStarterRanges, c)) return 0;
  return utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
}

namespace {

// Canonical decomposition of one code point (NFD without the reordering step, which is done
// over the whole run afterwards). Returns the number of code points written to out.
constexpr int kMaxDecomposition = 8;
int Decompose(char32_t c, char32_t* out) {
  // The crate's NFD data predates Unicode 13, which gave U+11938 (DIVES AKURU VOWEL SIGN O) a
  // canonical decomposition; utf8proc has it.
  if (c < 0xC0 || c == 0x11938) {
    out[0] = c;
    return 1;
  }
  utf8proc_int32_t buf[kMaxDecomposition];
  int last_boundclass = 0;
  const utf8proc_ssize_t n =
      utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, kMaxDecomposition,
                              UTF8PROC_DECOMPOSE, &last_boundclass);
  if (n <= 0 || n > kMaxDecomposition) {  // cannot happen for valid code points
    out[0] = c;
    return 1;
  }
  for (utf8proc_ssize_t k = 0; k < n; ++k) out[k] = static_cast<char32_t>(buf[k]);
  return static_cast<int>(n);
}

// Lowercase pairs Rust's standard library (Unicode 17 in the tokenizers 0.23 wheels) knows and
// utf8proc 2.8 (Unicode 15) does not: {first upper, last upper, lowercase of first}.
struct CaseRange {
  char32_t lo, hi, lower_lo;
};
constexpr CaseRange kExtraLowercase[] = {
    {0x1C89, 0x1C89, 0x1C8A},    {0xA7CB, 0xA7CB, 0x0264}, {0xA7CC, 0xA7CC, 0xA7CD},
    {0xA7CE, 0xA7CE, 0xA7CF},    {0xA7D2, 0xA7D2, 0xA7D3}, {0xA7D4, 0xA7D4, 0xA7D5},
    {0xA7DA, 0xA7DA, 0xA7DB},    {0xA7DC, 0xA7DC, 0x019B}, {0x10D50, 0x10D65, 0x10D70},
    {0x16EA0, 0x16EB8, 0x16EBB},
};

// Rust's char::to_lowercase: the simple mapping, except U+0130 whose full lowercase is two code
// points. Returns the number written to out (1 or 2).
int Lowercase(char32_t c, char32_t* out) {
  if (c < 0x80) {
    out[0] = (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return 1;
  }
  if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
    out[0] = 'i';
    out[1] = 0x307;
    return 2;
  }
  out[0] = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  if (out[0] == c && c >= 0x1C89) {
    for (const CaseRange& r : kExtraLowercase) {
      if (c >= r.lo && c <= r.hi) out[0] = r.lower_lo + (c - r.lo);
    }
  }
  return 1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Normalization with alignment to the original text
// ---------------------------------------------------------------------------------------------

// NormChar (tokenizer_text.h): Hugging Face keeps the same per-char alignment; a token's offsets
// span its first and last char's origins. `first` is the crate's change 0; the rest of a
// decomposition is "inserted" and shares the alignment of the last source char consumed.

int NormalizeOne(const TokenizerOptions& options, char32_t c, char32_t* out) {
  if (options.clean_text) {
    if (c == 0 || c == 0xFFFD || IsControl(c)) return 0;
    if (IsWhitespace(c)) c = ' ';
  }
  char32_t buf[kMaxDecomposition];
  if (options.strip_accents) {
    // A single character's decomposition is in canonical order already.
    const int n = Decompose(c, buf);
    int w = 0;
    for (int k = 0; k < n; ++k) {
      if (IsNonspacingMark(buf[k])) continue;
      char32_t lower[2];
      if (options.lowercase) Lowercase(buf[k], lower);
      out[w++] = options.lowercase ? lower[0] : buf[k];
    }
    return w;
  }
  if (options.lowercase) return Lowercase(c, out);
  out[0] = c;
  return 1;
}

// BertNormalizer over original code points [begin, end), in the crate's order: clean text, pad
// CJK, strip accents (NFD, drop Mn), lowercase.
void Normalize(const TokenizerOptions& options, const std::vector<char32_t>& cps, int32_t begin,
               int32_t end, std::vector<NormChar>* out) {
  out->clear();
  char32_t buf[kMaxDecomposition];
  bool has_nonstarter = false;
  for (int32_t i = begin; i < end; ++i) {
    char32_t c = cps[i];
    if (options.clean_text) {
      if (c == 0 || c == 0xFFFD || IsControl(c)) continue;
      if (IsWhitespace(c)) c = ' ';
    }
    const bool pad = options.tokenize_chinese_chars && IsChineseChar(c);
    // The padding spaces only split words; their alignment never reaches a token.
    if (pad) out->push_back({' ', i, true});
    if (options.strip_accents) {
      const int n = Decompose(c, buf);
      for (int k = 0; k < n; ++k) {
        has_nonstarter = has_nonstarter || buf[k] >= 0x300;
        out->push_back({buf[k], i, k == 0});
      }
    } else if (options.lowercase) {
      const int n = Lowercase(c, buf);
      for (int k = 0; k < n; ++k) out->push_back({buf[k], i, k == 0});
    } else {
      out->push_back({c, i, true});
    }
    if (pad) out->push_back({' ', i, true});
  }
  if (!options.strip_accents) return;

  // NFD's canonical ordering: stable sort of each run of non-starters by combining class. It
  // only matters for the few combining marks that are not Mn (and so survive the filter), and
  // for their offsets. The crate's NFD sorts (code point, change) pairs, then hands out
  // alignments in order: each "first" item takes the next source char's, the others repeat
  // the last one taken. So "a" U+0301 U+1D16D -> "a" U+1D16D U+0301 maps U+1D16D to U+0301's
  // position, while for U+0130 U+1D16D (I U+0307 U+1D16D -> I U+1D16D U+0307) it keeps its own.
  if (has_nonstarter) {
    const size_t n = out->size();
    std::vector<NormChar> run;
    std::vector<int32_t> sources;
    size_t k = 0;
    while (k < n) {
      if (CombiningClass((*out)[k].cp) == 0) {
        ++k;
        continue;
      }
      size_t run_end = k;
      while (run_end < n && CombiningClass((*out)[run_end].cp) != 0) ++run_end;
      if (run_end - k > 1) {
        run.assign(out->begin() + k, out->begin() + run_end);
        sources.clear();
        for (const NormChar& nc : run) {
          if (nc.first) sources.push_back(nc.orig);
        }
        std::stable_sort(run.begin(), run.end(), [](const NormChar& a, const NormChar& b) {
          return CombiningClass(a.cp) < CombiningClass(b.cp);
        });
        size_t next_source = 0;
        int32_t last = k > 0 ? (*out)[k - 1].orig : run[0].orig;
        for (NormChar& nc : run) {
          if (nc.first) last = sources[next_source++];
          nc.orig = last;
        }
        std::copy(run.begin(), run.end(), out->begin() + k);
      }
      k = run_end;
    }
  }
  // Drop Mn, then lowercase. After NFD nothing lowercases to two code points (U+0130 has
  // decomposed), so this compacts in place.
  size_t w = 0;
  for (size_t k = 0; k < out->size(); ++k) {
    NormChar nc = (*out)[k];
    if (IsNonspacingMark(nc.cp)) continue;
    if (options.lowercase) {
      Lowercase(nc.cp, buf);
      nc.cp = buf[0];
    }
    (*out)[w++] = nc;
  }
  out->resize(w);
}

}  // namespace tokenizer_internal

using namespace tokenizer_internal;  // NOLINT: this file is their home

namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Config files
// ---------------------------------------------------------------------------------------------

absl::Status Invalid(std::string_view source, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", source, message));
}

// Absent or null leaves *out untouched; any other non-boolean is an error naming the field.
absl::Status ReadBool(const Json& obj, const char* key, const std::string& source, bool* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return Invalid(source, absl::StrFormat("field '%s' must be true or false, found %s", key,
                                           it->type_name()));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// strip_accents: true/false, or null meaning "follow lowercase" (nullopt). Absent: untouched.
absl::Status ReadStripAccents(const Json& obj, const std::string& source,
                              std::optional<bool>* out) {
  const auto it = obj.find("strip_accents");
  if (it == obj.end()) return absl::OkStatus();
  if (it->is_null()) {
    out->reset();
    return absl::OkStatus();
  }
  if (!it->is_boolean()) {
    return Invalid(source, absl::StrFormat("field 'strip_accents' must be true, false or null, "
                                           "found %s",
                                           it->type_name()));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// A special token is written either as a string or as an AddedToken object {"content": ...}.
absl::Status ReadTokenString(const Json& obj, const char* key, const std::string& source,
                             std::string* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      *out = content->get<std::string>();
      return absl::OkStatus();
    }
  }
  return Invalid(source,
                 absl::StrFormat("field '%s' must be a string or {\"content\": string}", key));
}

absl::Status ReadNonNegativeInt(const Json& obj, const char* key, const std::string& source,
                                int* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return Invalid(source,
                   absl::StrFormat("field '%s' must be a number, found %s", key, it->type_name()));
  }
  // transformers writes "no limit" as a huge number (int(1e30)); clamp rather than overflow.
  const double v = it->get<double>();
  if (v < 0) return Invalid(source, absl::StrFormat("field '%s' must not be negative", key));
  *out = v >= static_cast<double>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                   : static_cast<int>(v);
  return absl::OkStatus();
}

// transformers' load_vocab strips only the line break ("\n", or "\r\n" through Python's
// universal newlines), so a token may keep other trailing whitespace.
std::string_view StripLineBreak(std::string_view s) {
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

// Settings from tokenizer.json: the normalizer, the WordPiece model's options, and the added
// tokens; anything this tokenizer cannot run is an error naming it.
struct AddedToken {
  std::string content;
  int32_t id;
  bool normalized;  // matched in the normalized text
};

absl::Status ApplyTokenizerJsonUnchecked(const Json& tj, const std::string& path,
                                         TokenizerOptions* options,
                                         std::optional<bool>* strip_accents,
                                         std::vector<AddedToken>* extra_added) {
  const auto normalizer = tj.find("normalizer");
  if (normalizer != tj.end() && !normalizer->is_null()) {
    const std::string type = normalizer->value("type", "");
    if (type != "BertNormalizer") {
      return Invalid(path, absl::StrFormat("normalizer type '%s' is not supported (only "
                                           "BertNormalizer)",
                                           type));
    }
    TOK_RETURN_IF_ERROR(ReadBool(*normalizer, "clean_text", path, &options->clean_text));
    TOK_RETURN_IF_ERROR(
        ReadBool(*normalizer, "handle_chinese_chars", path, &options->tokenize_chinese_chars));
    TOK_RETURN_IF_ERROR(ReadBool(*normalizer, "lowercase", path, &options->lowercase));
    TOK_RETURN_IF_ERROR(ReadStripAccents(*normalizer, path, strip_accents));
  } else if (normalizer != tj.end()) {
    // An explicit null normalizer: the text goes to the pre-tokenizer untouched.
    options->clean_text = options->tokenize_chinese_chars = options->lowercase = false;
    *strip_accents = false;
  }
  const auto pre = tj.find("pre_tokenizer");
  if (pre != tj.end() && !pre->is_null() && pre->value("type", "") != "BertPreTokenizer") {
    return Invalid(path, absl::StrFormat("pre_tokenizer type '%s' is not supported (only "
                                         "BertPreTokenizer)",
                                         pre->value("type", "")));
  }
  const auto post = tj.find("post_processor");
  if (post != tj.end() && !post->is_null()) {
    const std::string type = post->value("type", "");
    if (type != "TemplateProcessing" && type != "BertProcessing" && type != "RobertaProcessing") {
      return Invalid(path, absl::StrFormat("post_processor type '%s' is not supported "
                                           "(only TemplateProcessing/BertProcessing/"
                                           "RobertaProcessing)",
                                           type));
    }
    options->post_processor = type;
  }
  const auto model = tj.find("model");
  if (model != tj.end() && !model->is_null()) {
    if (!model->is_object() || model->value("type", "WordPiece") != "WordPiece") {
      return Invalid(path, absl::StrFormat("field 'model.type' is %s, which is not supported "
                                           "(only WordPiece)",
                                           model->is_object() ? model->value("type", "")
                                                              : std::string("not an object")));
    }
    TOK_RETURN_IF_ERROR(ReadTokenString(*model, "unk_token", path, &options->unk_token));
    TOK_RETURN_IF_ERROR(ReadTokenString(*model, "continuing_subword_prefix", path,
                                        &options->continuing_subword_prefix));
    TOK_RETURN_IF_ERROR(ReadNonNegativeInt(*model, "max_input_chars_per_word", path,
                                           &options->max_input_chars_per_word));
  }
  const auto added = tj.find("added_tokens");
  if (added != tj.end() && !added->is_null()) {
    if (!added->is_array()) return Invalid(path, "added_tokens must be an array");
    for (const Json& t : *added) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
          !t.contains("id") || !t["id"].is_number_integer()) {
        return Invalid(path, "added_tokens entries need a string 'content' and an 'id'");
      }
      const std::string content = t["content"].get<std::string>();
      // single_word changes what matches and would silently tokenize differently. lstrip /
      // rstrip make the token swallow the whitespace beside it, which BertPreTokenizer drops
      // anyway (and the offsets exclude it: MPNet's "<mask>", tests/golden/mpnet_cases.json).
      if (t.value("single_word", false)) {
        return Invalid(path, absl::StrFormat("added token '%s' sets single_word=true, which is "
                                             "not supported",
                                             content));
      }
      extra_added->push_back({content, t["id"].get<int32_t>(), t.value("normalized", false)});
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyTokenizerJson(const Json& tj, const std::string& path, TokenizerOptions* options,
                                std::optional<bool>* strip_accents,
                                std::vector<AddedToken>* extra_added) {
  // nlohmann throws on a field of an unexpected type (e.g. a string where an object belongs).
  try {
    return ApplyTokenizerJsonUnchecked(tj, path, options, strip_accents, extra_added);
  } catch (const Json::exception& e) {
    return Invalid(path, absl::StrCat("unexpected structure: ", e.what()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------

absl::StatusOr<WordPieceTokenizer> WordPieceTokenizer::FromVocab(std::vector<std::string> vocab,
                                                                 TokenizerOptions options) {
  if (vocab.empty()) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (vocab.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("tokenizer vocabulary is too large");
  }
  if (options.max_input_chars_per_word < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_input_chars_per_word must not be negative, got %d", options.max_input_chars_per_word));
  }
  if (options.model_max_length <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model_max_length must be positive, got %d", options.model_max_length));
  }
  WordPieceTokenizer tok;
  tok.vocab_ = std::move(vocab);
  tok.options_ = std::move(options);
  tok.token_to_id_.reserve(tok.vocab_.size());
  for (size_t i = 0; i < tok.vocab_.size(); ++i) {
    // A repeated line maps to its last id, as the tokenizers crate's HashMap insert does.
    tok.token_to_id_[tok.vocab_[i]] = static_cast<int32_t>(i);
    tok.max_token_bytes_ = std::max(tok.max_token_bytes_, static_cast<int>(tok.vocab_[i].size()));
  }
  struct Special {
    const char* name;
    const std::string* token;
    int32_t* id;
  };
  int32_t mask_id = -1;
  const Special specials[] = {
      {"unk_token", &tok.options_.unk_token, &tok.unk_id_},
      {"cls_token", &tok.options_.cls_token, &tok.cls_id_},
      {"sep_token", &tok.options_.sep_token, &tok.sep_id_},
      {"pad_token", &tok.options_.pad_token, &tok.pad_id_},
      {"mask_token", &tok.options_.mask_token, &mask_id},
  };
  for (const Special& s : specials) {
    if (s.token->empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("special token %s is empty", s.name));
    }
    *s.id = tok.TokenToId(*s.token);
    if (*s.id < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("special token '%s' (%s) is not in the vocabulary", *s.token, s.name));
    }
    const auto dup =
        std::find_if(tok.added_tokens_.begin(), tok.added_tokens_.end(),
                     [&](const std::pair<std::string, int32_t>& t) { return t.first == *s.token; });
    if (dup == tok.added_tokens_.end()) tok.added_tokens_.emplace_back(*s.token, *s.id);
  }
  std::stable_sort(tok.added_tokens_.begin(), tok.added_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return tok;
}

absl::StatusOr<WordPieceTokenizer> WordPieceTokenizer::FromModelDir(
    const std::string& model_dir, const ArchitectureSpec* family) {
  struct stat st;
  if (::stat(model_dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("tokenizer: model directory '%s' does not exist: %s",
                                               model_dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer: '%s' is not a directory", model_dir));
  }

  TokenizerOptions options;
  std::optional<bool> strip_accents;  // nullopt: follow lowercase
  std::vector<std::string> vocab;
  // tokenizer.json's added tokens, checked against the vocab once it is known.
  std::vector<AddedToken> extra_added;

  // tokenizer.json first: its normalizer and model settings are the base that
  // tokenizer_config.json overrides (transformers passes the latter as constructor arguments,
  // and BertTokenizerFast rebuilds the normalizer when they differ).
  const std::string json_path = JoinPath(model_dir, "tokenizer.json");
  absl::StatusOr<std::optional<std::string>> json_text = ReadFileIfExists(json_path);
  if (!json_text.ok()) return json_text.status();
  std::optional<Json> tokenizer_json;
  if (json_text->has_value()) {
    absl::StatusOr<Json> parsed = ParseJsonObject(**json_text, json_path);
    if (!parsed.ok()) return parsed.status();
    tokenizer_json = std::move(*parsed);
    TOK_RETURN_IF_ERROR(
        ApplyTokenizerJson(*tokenizer_json, json_path, &options, &strip_accents, &extra_added));
  }
  if (family != nullptr) {
    const std::string allowed = std::string("|") + family->tokenizer_post_processors + "|";
    if (!options.post_processor.empty() &&
        allowed.find("|" + options.post_processor + "|") == std::string::npos) {
      return Invalid(json_path,
                     absl::StrFormat("field 'post_processor.type' is '%s', a tokenizer of another "
                                     "model family; model_type '%s' needs %s",
                                     options.post_processor, family->model_type,
                                     family->tokenizer_post_processors));
    }
    options.pair_separators = family->pair_separators;
    options.second_type_id = family->token_type_embeddings ? 1 : 0;
  } else if (options.post_processor == "RobertaProcessing") {
    options.pair_separators = 2;
    options.second_type_id = 0;
  }

  const std::string config_path = JoinPath(model_dir, "tokenizer_config.json");
  absl::StatusOr<std::optional<std::string>> config_text = ReadFileIfExists(config_path);
  if (!config_text.ok()) return config_text.status();
  if (config_text->has_value()) {
    absl::StatusOr<Json> parsed = ParseJsonObject(**config_text, config_path);
    if (!parsed.ok()) return parsed.status();
    const Json& cfg = *parsed;
    TOK_RETURN_IF_ERROR(ReadBool(cfg, "do_lower_case", config_path, &options.lowercase));
    TOK_RETURN_IF_ERROR(
        ReadBool(cfg, "tokenize_chinese_chars", config_path, &options.tokenize_chinese_chars));
    TOK_RETURN_IF_ERROR(ReadStripAccents(cfg, config_path, &strip_accents));
    TOK_RETURN_IF_ERROR(
        ReadNonNegativeInt(cfg, "model_max_length", config_path, &options.model_max_length));
    TOK_RETURN_IF_ERROR(ReadTokenString(cfg, "unk_token", config_path, &options.unk_token));
    TOK_RETURN_IF_ERROR(ReadTokenString(cfg, "cls_token", config_path, &options.cls_token));
    TOK_RETURN_IF_ERROR(ReadTokenString(cfg, "sep_token", config_path, &options.sep_token));
    TOK_RETURN_IF_ERROR(ReadTokenString(cfg, "pad_token", config_path, &options.pad_token));
    TOK_RETURN_IF_ERROR(ReadTokenString(cfg, "mask_token", config_path, &options.mask_token));
  }
  options.strip_accents = strip_accents.value_or(options.lowercase);

  // vocab.txt: one token per line, id = line number. Fallback: tokenizer.json's model.vocab
  // {token: id}.
  const std::string vocab_path = JoinPath(model_dir, "vocab.txt");
  absl::StatusOr<std::optional<std::string>> vocab_text = ReadFileIfExists(vocab_path);
  if (!vocab_text.ok()) return vocab_text.status();
  std::string vocab_source = vocab_path;
  if (vocab_text->has_value()) {
    std::string_view rest = **vocab_text;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view line = rest.substr(0, nl);
      vocab.emplace_back(StripLineBreak(line));
      if (nl == std::string_view::npos) break;
      rest.remove_prefix(nl + 1);
    }
  } else {
    const Json* model = nullptr;
    if (tokenizer_json.has_value()) {
      const auto it = tokenizer_json->find("model");
      if (it != tokenizer_json->end() && it->is_object()) model = &*it;
    }
    const auto vocab_it = model != nullptr ? model->find("vocab") : Json::const_iterator();
    if (model == nullptr || vocab_it == model->end() || !vocab_it->is_object()) {
      return absl::NotFoundError(absl::StrFormat(
          "%s: not found, and no tokenizer.json with a WordPiece model.vocab in '%s'", vocab_path,
          model_dir));
    }
    vocab_source = json_path;
    const size_t n = vocab_it->size();
    vocab.assign(n, std::string());
    std::vector<bool> seen(n, false);
    for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
          it->get<int64_t>() >= static_cast<int64_t>(n) || seen[it->get<int64_t>()]) {
        return Invalid(json_path, absl::StrFormat("model.vocab: token '%s' has id %s; ids must be "
                                                  "0..%d, each used once",
                                                  it.key(), it->dump(), n - 1));
      }
      seen[it->get<int64_t>()] = true;
      vocab[it->get<int64_t>()] = it.key();
    }
  }

  absl::StatusOr<WordPieceTokenizer> tok = FromVocab(std::move(vocab), std::move(options));
  if (!tok.ok()) return Invalid(vocab_source, std::string(tok.status().message()));
  for (const AddedToken& added : extra_added) {
    const std::string& content = added.content;
    const int32_t id = added.id;
    if (id < 0 || id >= tok->vocab_size() || tok->vocab_[id] != content) {
      return Invalid(json_path,
                     absl::StrFormat("added token '%s' has id %d, which is not that token in the "
                                     "vocabulary (added tokens beyond the vocab are not supported)",
                                     content, id));
    }
    // Compared through a plain reference: lambdas capturing structured bindings are C++20
    // (clang 14, which builds the fuzzers, rejects them).
    const std::string& wanted = content;
    const bool known = std::any_of(tok->added_tokens_.begin(), tok->added_tokens_.end(),
                                   [&](const auto& t) { return t.first == wanted; });
    if (known || content.empty()) continue;
    if (added.normalized) {
      // Matched in the normalized text, so compared as the normalizer's output of the content.
      std::vector<char32_t> cps;
      std::vector<int32_t> starts;
      TOK_RETURN_IF_ERROR(DecodeUtf8(content, json_path, &cps, &starts));
      std::vector<NormChar> norm;
      Normalize(tok->options_, cps, 0, static_cast<int32_t>(cps.size()), &norm);
      std::u32string normalized;
      for (const NormChar& c : norm) normalized.push_back(c.cp);
      if (!normalized.empty()) tok->normalized_added_tokens_.emplace_back(normalized, id);
    } else {
      tok->added_tokens_.emplace_back(content, id);
    }
  }
  std::stable_sort(tok->normalized_added_tokens_.begin(), tok->normalized_added_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::stable_sort(tok->added_tokens_.begin(), tok->added_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return tok;
}

int32_t WordPieceTokenizer::TokenToId(std::string_view token) const {
  const auto it = token_to_id_.find(std::string(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

absl::Status WordPieceTokenizer::TokenizeText(std::string_view text, std::string_view what,
                                              std::vector<Piece>* pieces) const {
  pieces->clear();
  std::vector<char32_t> cps;
  std::vector<int32_t> starts;  // byte offset of each code point, plus the end
  TOK_RETURN_IF_ERROR(DecodeUtf8(text, what, &cps, &starts));
  const int32_t n = static_cast<int32_t>(cps.size());

  std::vector<NormChar> norm;
  std::string word;                // UTF-8 of the current word
  std::vector<int32_t> word_byte;  // byte offset in `word` of each of its chars, plus the end
  std::string candidate;
  const std::string& prefix = options_.continuing_subword_prefix;

  auto add_piece = [&](int32_t id, int32_t first_char, int32_t last_char_end) {
    pieces->push_back({id, first_char, last_char_end, starts[first_char], starts[last_char_end]});
  };

  // Greedy longest-match-first WordPiece over norm[a, b); a word with no complete segmentation,
  // or longer than max_input_chars_per_word normalized chars, becomes one [UNK].
  auto word_piece = [&](size_t a, size_t b) {
    const int32_t word_start = norm[a].orig, word_end = norm[b - 1].orig + 1;
    const size_t len = b - a;
    if (len > static_cast<size_t>(options_.max_input_chars_per_word)) {
      add_piece(unk_id_, word_start, word_end);
      return;
    }
    word.clear();
    word_byte.clear();
    for (size_t k = a; k < b; ++k) {
      word_byte.push_back(static_cast<int32_t>(word.size()));
      AppendUtf8(norm[k].cp, &word);
    }
    word_byte.push_back(static_cast<int32_t>(word.size()));
    const size_t first_piece = pieces->size();
    size_t start = 0;
    while (start < len) {
      const size_t prefix_len = start > 0 ? prefix.size() : 0;
      size_t end = len;
      // Candidates longer than any vocab entry cannot match; skip their lookups.
      while (end > start && prefix_len + (word_byte[end] - word_byte[start]) >
                                static_cast<size_t>(max_token_bytes_)) {
        --end;
      }
      int32_t found = -1;
      for (; end > start; --end) {
        candidate.assign(prefix.data(), prefix_len);
        candidate.append(word, word_byte[start], word_byte[end] - word_byte[start]);
        const auto it = token_to_id_.find(candidate);
        if (it != token_to_id_.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) {
        pieces->resize(first_piece);
        add_piece(unk_id_, word_start, word_end);
        return;
      }
      add_piece(found, norm[a + start].orig, norm[a + end - 1].orig + 1);
      start = end;
    }
  };

  // Normalize original code points [begin, end), split on whitespace (dropped) and punctuation
  // (kept as one-char words), and WordPiece each word.
  auto tokenize_segment = [&](int32_t begin, int32_t end) {
    if (begin >= end) return;
    Normalize(options_, cps, begin, end, &norm);
    size_t word_begin = 0;
    bool in_word = false;
    for (size_t k = 0; k < norm.size(); ++k) {
      // A normalized added token: leftmost, then longest.
      bool matched = false;
      for (const auto& [token, id] : normalized_added_tokens_) {
        if (norm.size() - k < token.size()) continue;
        size_t m = 0;
        while (m < token.size() && norm[k + m].cp == token[m]) ++m;
        if (m != token.size()) continue;
        if (in_word) word_piece(word_begin, k);
        in_word = false;
        add_piece(id, norm[k].orig, norm[k + m - 1].orig + 1);
        k += m - 1;
        matched = true;
        break;
      }
      if (matched) continue;
      const char32_t c = norm[k].cp;
      const bool space = IsWhitespace(c);
      const bool punct = !space && IsPunctuation(c);
      if (space || punct) {
        if (in_word) word_piece(word_begin, k);
        in_word = false;
        if (punct) word_piece(k, k + 1);
      } else if (!in_word) {
        word_begin = k;
        in_word = true;
      }
    }
    if (in_word) word_piece(word_begin, norm.size());
  };

  // Added tokens (e.g. "[SEP]" typed in the text) match verbatim, leftmost then longest, before
  // any normalization, as Hugging Face's AddedVocabulary does for normalized=false tokens.
  bool first_byte[256] = {};
  for (const auto& t : added_tokens_) first_byte[static_cast<unsigned char>(t.first[0])] = true;
  int32_t segment_begin = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!first_byte[static_cast<unsigned char>(text[starts[i]])]) continue;
    const std::string_view rest = text.substr(starts[i]);
    for (const auto& [token, id] : added_tokens_) {
      if (rest.size() < token.size() || rest.compare(0, token.size(), token) != 0) continue;
      tokenize_segment(segment_begin, i);
      int32_t j = i;
      const int32_t token_end_byte = starts[i] + static_cast<int32_t>(token.size());
      while (starts[j] < token_end_byte) ++j;
      add_piece(id, i, j);
      segment_begin = j;
      i = j - 1;
      break;
    }
  }
  tokenize_segment(segment_begin, n);
  return absl::OkStatus();
}

absl::StatusOr<Encoding> WordPieceTokenizer::Assemble(const TextPieces& a, const TextPieces* b,
                                                      const TruncationOptions& truncation) const {
  const int num_special = b != nullptr ? 2 + options_.pair_separators : 2;
  const int64_t na = a.count, nb = b != nullptr ? b->count : 0;
  int64_t keep_a = na, keep_b = nb;
  if (truncation.enabled) {
    const int64_t budget = truncation.max_length - num_special;  // checked >= 0 before
    if (na + nb > budget) {
      if (b == nullptr) {
        keep_a = budget;
      } else {
        // The tokenizers crate's LongestFirst: the shorter text keeps its length if the longer
        // can absorb the cut; otherwise the shorter gets budget/2 and the longer the rest. Not
        // a one-token-at-a-time loop: (5, 5) into 7 gives (3, 4).
        int64_t n1 = na, n2 = nb;
        const bool swap = n1 > n2;
        if (swap) std::swap(n1, n2);
        n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
        if (n1 + n2 > budget) {
          n1 = budget / 2;
          n2 = n1 + budget % 2;
        }
        if (swap) std::swap(n1, n2);
        keep_a = std::min(na, n1);
        keep_b = std::min(nb, n2);
      }
    }
  }

  Encoding enc;
  const size_t total = static_cast<size_t>(keep_a + keep_b + num_special);
  enc.ids.reserve(total);
  enc.type_ids.reserve(total);
  enc.tokens.reserve(total);
  enc.char_start.reserve(total);
  enc.char_end.reserve(total);
  enc.byte_start.reserve(total);
  enc.byte_end.reserve(total);
  enc.special_tokens_mask.reserve(total);
  enc.sequence_index.reserve(total);
  auto push_special = [&](int32_t id, int32_t type_id) {
    enc.ids.push_back(id);
    enc.type_ids.push_back(type_id);
    enc.tokens.push_back(vocab_[id]);
    enc.char_start.push_back(0);
    enc.char_end.push_back(0);
    enc.byte_start.push_back(0);
    enc.byte_end.push_back(0);
    enc.special_tokens_mask.push_back(1);
    enc.sequence_index.push_back(-1);
  };
  // The kept pieces are the first (right truncation) or the last (left) of those stored.
  auto push_text = [&](const std::vector<Piece>& pieces, int64_t keep, int32_t type_id,
                       int8_t sequence) {
    const size_t first =
        truncation.side == TruncationSide::kLeft ? pieces.size() - static_cast<size_t>(keep) : 0;
    for (size_t k = first; k < first + static_cast<size_t>(keep); ++k) {
      const Piece& p = pieces[k];
      enc.ids.push_back(p.id);
      enc.type_ids.push_back(type_id);
      enc.tokens.push_back(vocab_[p.id]);
      enc.char_start.push_back(p.char_start);
      enc.char_end.push_back(p.char_end);
      enc.byte_start.push_back(p.byte_start);
      enc.byte_end.push_back(p.byte_end);
      // A special token typed in the text is not marked special (as in Hugging Face).
      enc.special_tokens_mask.push_back(0);
      enc.sequence_index.push_back(sequence);
    }
  };
  // [CLS] a [SEP] ([SEP]...) b [SEP]: the separators between the texts belong to the first.
  const int32_t second = options_.second_type_id;
  push_special(cls_id_, 0);
  push_text(a.pieces, keep_a, 0, 0);
  push_special(sep_id_, 0);
  if (b != nullptr) {
    for (int k = 1; k < options_.pair_separators; ++k) push_special(sep_id_, 0);
    push_text(b->pieces, keep_b, second, 1);
    push_special(sep_id_, second);
  }
  enc.untruncated_length = static_cast<int>(
      std::min<int64_t>(na + nb + num_special, std::numeric_limits<int32_t>::max()));
  enc.untruncated_length_is_lower_bound = !a.complete || (b != nullptr && !b->complete);
  enc.truncated = keep_a != na || keep_b != nb;
  return enc;
}

absl::Status WordPieceTokenizer::TokenizeForEncoding(std::string_view text, std::string_view what,
                                                     const TruncationOptions& truncation,
                                                     int num_special, TextPieces* out) const {
  constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
  int64_t keep = kAll, count_limit = kAll;
  if (truncation.enabled) {
    // A text never keeps more than the whole budget (a pair's other text may take some).
    keep = std::max(0, truncation.max_length - num_special);
    // At least one token past those kept: whether the text was truncated is always known.
    if (truncation.look_ahead >= 0) count_limit = keep + std::max(1, truncation.look_ahead);
  }
  return TokenizeBounded(text, what, truncation.side, keep, count_limit, out);
}

namespace {
// Hugging Face silently skips truncation here (an unsigned underflow); refused instead.
absl::Status CheckRoomForSpecialTokens(const TruncationOptions& truncation, int num_special,
                                       bool pair) {
  if (!truncation.enabled || truncation.max_length >= num_special) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("max_length %d is shorter than the %d special tokens of a %s",
                      truncation.max_length, num_special, pair ? "pair" : "text"));
}
}  // namespace

absl::StatusOr<Encoding> WordPieceTokenizer::Encode(std::string_view text,
                                                    const TruncationOptions& truncation) const {
  TextPieces a;
  TOK_RETURN_IF_ERROR(TokenizeForEncoding(text, "text", truncation, 2, &a));
  TOK_RETURN_IF_ERROR(CheckRoomForSpecialTokens(truncation, 2, false));
  return Assemble(a, nullptr, truncation);
}

absl::StatusOr<Encoding> WordPieceTokenizer::EncodePair(std::string_view text_a,
                                                        std::string_view text_b,
                                                        const TruncationOptions& truncation) const {
  const int num_special = 2 + options_.pair_separators;
  TextPieces a, b;
  TOK_RETURN_IF_ERROR(TokenizeForEncoding(text_a, "text_a", truncation, num_special, &a));
  TOK_RETURN_IF_ERROR(TokenizeForEncoding(text_b, "text_b", truncation, num_special, &b));
  TOK_RETURN_IF_ERROR(CheckRoomForSpecialTokens(truncation, num_special, true));
  // Both texts over the budget: it is split in halves and an odd token goes to the longer one,
  // so the lengths must be known exactly (counted, not stored: memory stays bounded).
  const int64_t budget = truncation.max_length - num_special;
  if (truncation.enabled && budget % 2 == 1 && a.count > budget && b.count > budget &&
      (!a.complete || !b.complete)) {
    TruncationOptions count_all = truncation;
    count_all.look_ahead = -1;
    if (!a.complete) {
      TOK_RETURN_IF_ERROR(TokenizeForEncoding(text_a, "text_a", count_all, num_special, &a));
    }
    if (!b.complete) {
      TOK_RETURN_IF_ERROR(TokenizeForEncoding(text_b, "text_b", count_all, num_special, &b));
    }
  }
  return Assemble(a, &b, truncation);
}

absl::StatusOr<Encoding> WordPieceTokenizer::FromIds(const std::vector<int32_t>& ids,
                                                     const std::vector<int32_t>& type_ids) const {
  if (!type_ids.empty() && type_ids.size() != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("type_ids has %d entries but ids has %d", type_ids.size(), ids.size()));
  }
  const int32_t mask_id = TokenToId(options_.mask_token);
  Encoding enc;
  enc.ids = ids;
  enc.type_ids = type_ids.empty() ? std::vector<int32_t>(ids.size(), 0) : type_ids;
  const size_t n = ids.size();
  enc.tokens.reserve(n);
  enc.special_tokens_mask.reserve(n);
  enc.sequence_index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d at position %d is out of range [0, %d)", id, i, vocab_size()));
    }
    const int32_t type_id = enc.type_ids[i];
    if (type_id != 0 && type_id != 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("type id %d at position %d must be 0 or 1", type_id, i));
    }
    const bool special =
        id == cls_id_ || id == sep_id_ || id == pad_id_ || id == unk_id_ || id == mask_id;
    enc.tokens.push_back(vocab_[id]);
    enc.special_tokens_mask.push_back(special ? 1 : 0);
    enc.sequence_index.push_back(special && id != unk_id_ ? -1 : static_cast<int8_t>(type_id));
  }
  // No text behind these tokens: all offsets are (0, 0), as for special tokens.
  enc.char_start.assign(n, 0);
  enc.char_end.assign(n, 0);
  enc.byte_start.assign(n, 0);
  enc.byte_end.assign(n, 0);
  enc.untruncated_length = static_cast<int>(n);
  return enc;
}

}  // namespace attn

#undef TOK_RETURN_IF_ERROR
