#include "engine/explain/sparse_bm42.h"

#include <libstemmer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace attn {
namespace {

// NLTK's English stop words (179), the list fastembed's English models ship as stopwords.txt.
constexpr const char* kEnglishStopWords[] = {
    "i",         "me",        "my",         "myself",  "we",      "our",     "ours",
    "ourselves", "you",       "you're",     "you've",  "you'll",  "you'd",   "your",
    "yours",     "yourself",  "yourselves", "he",      "him",     "his",     "himself",
    "she",       "she's",     "her",        "hers",    "herself", "it",      "it's",
    "its",       "itself",    "they",       "them",    "their",   "theirs",  "themselves",
    "what",      "which",     "who",        "whom",    "this",    "that",    "that'll",
    "these",     "those",     "am",         "is",      "are",     "was",     "were",
    "be",        "been",      "being",      "have",    "has",     "had",     "having",
    "do",        "does",      "did",        "doing",   "a",       "an",      "the",
    "and",       "but",       "if",         "or",      "because", "as",      "until",
    "while",     "of",        "at",         "by",      "for",     "with",    "about",
    "against",   "between",   "into",       "through", "during",  "before",  "after",
    "above",     "below",     "to",         "from",    "up",      "down",    "in",
    "out",       "on",        "off",        "over",    "under",   "again",   "further",
    "then",      "once",      "here",       "there",   "when",    "where",   "why",
    "how",       "all",       "any",        "both",    "each",    "few",     "more",
    "most",      "other",     "some",       "such",    "no",      "nor",     "not",
    "only",      "own",       "same",       "so",      "than",    "too",     "very",
    "s",         "t",         "can",        "will",    "just",    "don",     "don't",
    "should",    "should've", "now",        "d",       "ll",      "m",       "o",
    "re",        "ve",        "y",          "ain",     "aren",    "aren't",  "couldn",
    "couldn't",  "didn",      "didn't",     "doesn",   "doesn't", "hadn",    "hadn't",
    "hasn",      "hasn't",    "haven",      "haven't", "isn",     "isn't",   "ma",
    "mightn",    "mightn't",  "mustn",      "mustn't", "needn",   "needn't", "shan",
    "shan't",    "shouldn",   "shouldn't",  "wasn",    "wasn't",  "weren",   "weren't",
    "won",       "won't",     "wouldn",     "wouldn't"};

// Python's string.punctuation.
constexpr std::string_view kPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

uint32_t Rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

}  // namespace

int32_t Murmur3Hash32(std::string_view bytes, uint32_t seed) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t len = bytes.size();
  constexpr uint32_t c1 = 0xcc9e2d51, c2 = 0x1b873593;
  uint32_t h = seed;
  const size_t blocks = len / 4;
  for (size_t b = 0; b < blocks; ++b) {
    // little-endian 4-byte block
    uint32_t k = static_cast<uint32_t>(data[4 * b]) | static_cast<uint32_t>(data[4 * b + 1]) << 8 |
                 static_cast<uint32_t>(data[4 * b + 2]) << 16 |
                 static_cast<uint32_t>(data[4 * b + 3]) << 24;
    k *= c1;
    k = Rotl32(k, 15);
    k *= c2;
    h ^= k;
    h = Rotl32(h, 13);
    h = h * 5 + 0xe6546b64;
  }
  const uint8_t* tail = data + 4 * blocks;
  uint32_t k = 0;
  switch (len & 3) {
    case 3:
      k ^= static_cast<uint32_t>(tail[2]) << 16;
      [[fallthrough]];
    case 2:
      k ^= static_cast<uint32_t>(tail[1]) << 8;
      [[fallthrough]];
    case 1:
      k ^= tail[0];
      k *= c1;
      k = Rotl32(k, 15);
      k *= c2;
      h ^= k;
  }
  h ^= static_cast<uint32_t>(len);
  h ^= h >> 16;  // fmix32
  h *= 0x85ebca6b;
  h ^= h >> 13;
  h *= 0xc2b2ae35;
  h ^= h >> 16;
  return static_cast<int32_t>(h);
}

uint32_t Bm42Index(std::string_view word) {
  const int64_t hash = Murmur3Hash32(word);
  return static_cast<uint32_t>(hash < 0 ? -hash : hash);
}

std::vector<float> ClsAttentionOverHeads(const Tensor& probs) {
  const int64_t heads = probs.dim(0), T = probs.dim(1);
  std::vector<float> w(T, 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    const float* row = probs.data() + h * T * T;  // query 0 = [CLS]
    for (int64_t t = 0; t < T; ++t) w[t] += row[t];
  }
  for (float& v : w) v /= static_cast<float>(heads);
  return w;
}

void AttentionWeightedPool(const float* hidden, int64_t tokens, int64_t hidden_size,
                           absl::Span<const float> weights, float* pooled) {
  std::fill_n(pooled, hidden_size, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < hidden_size; ++c) pooled[c] += weights[t] * hidden[t * hidden_size + c];
  }
}

absl::StatusOr<std::unique_ptr<Bm42Encoder>> Bm42Encoder::Create(
    const WordPieceTokenizer& tokenizer, const std::string& model_dir) {
  std::unique_ptr<Bm42Encoder> encoder(new Bm42Encoder());
  const TokenizerOptions& o = tokenizer.options();
  encoder->special_tokens_ = {o.cls_token, o.sep_token, o.pad_token, o.unk_token, o.mask_token};
  std::ifstream file(model_dir + "/stopwords.txt");
  if (file.good()) {
    std::string line;
    while (std::getline(file, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      encoder->stop_words_.insert(line);  // fastembed keeps every line, even an empty one
    }
  } else {
    for (const char* word : kEnglishStopWords) encoder->stop_words_.insert(word);
  }
  absl::MutexLock lock(&encoder->mutex_);
  encoder->stemmer_ = sb_stemmer_new("english", "UTF_8");
  if (encoder->stemmer_ == nullptr) {
    return absl::InternalError("libstemmer has no English stemmer");
  }
  return encoder;
}

Bm42Encoder::~Bm42Encoder() {
  absl::MutexLock lock(&mutex_);
  if (stemmer_ != nullptr) sb_stemmer_delete(stemmer_);
}

std::string Bm42Encoder::Stem(std::string_view word) const {
  absl::MutexLock lock(&mutex_);
  const sb_symbol* stemmed = sb_stemmer_stem(
      stemmer_, reinterpret_cast<const sb_symbol*>(word.data()), static_cast<int>(word.size()));
  if (stemmed == nullptr) return std::string(word);  // out of memory in libstemmer
  return std::string(reinterpret_cast<const char*>(stemmed), sb_stemmer_length(stemmer_));
}

std::vector<std::pair<std::string, float>> Bm42Encoder::StemmedWords(
    const Encoding& encoding, absl::Span<const float> w) const {
  // Step 2: merge word pieces.
  std::vector<std::pair<std::string, float>> words;
  std::string current;
  float weight = 0;
  for (int t = 0; t < encoding.size(); ++t) {
    const std::string& token = encoding.tokens[t];
    if (special_tokens_.count(token)) continue;  // skipped; the current word goes on
    if (token.rfind("##", 0) == 0) {
      current += token.substr(2);
      weight += w[t];
      continue;
    }
    if (!current.empty()) words.emplace_back(std::move(current), weight);
    current = token;
    weight = w[t];
  }
  if (!current.empty()) words.emplace_back(std::move(current), weight);
  // Steps 3-4: drop stop words and punctuation, stem the rest.
  std::vector<std::pair<std::string, float>> kept;
  for (auto& [word, value] : words) {
    if (stop_words_.count(word)) continue;
    if (word.size() == 1 && kPunctuation.find(word[0]) != std::string_view::npos) continue;
    kept.emplace_back(Stem(word), value);
  }
  return kept;
}

absl::StatusOr<SparseVector> Bm42Encoder::Encode(const Encoding& encoding,
                                                 absl::Span<const float> cls_attention,
                                                 const Bm42Options& options) const {
  if (static_cast<int64_t>(cls_attention.size()) != encoding.size() ||
      static_cast<int64_t>(encoding.tokens.size()) != encoding.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BM42: ", cls_attention.size(), " attention weights for ", encoding.size(), " tokens"));
  }
  // Step 5: max weight per stem, in first-occurrence order.
  std::vector<std::pair<std::string, float>> stems;
  std::unordered_map<std::string, size_t> position;
  for (auto& [stem, value] : StemmedWords(encoding, cls_attention)) {
    auto [it, inserted] = position.emplace(stem, stems.size());
    if (inserted) {
      stems.emplace_back(stem, std::max(0.0f, value));  // fastembed: max(get(token, 0), w)
    } else {
      stems[it->second].second = std::max(stems[it->second].second, value);
    }
  }
  // Steps 6-7: hash to indices (a later stem overwrites an earlier one on a collision).
  std::map<uint32_t, float> by_index;
  for (const auto& [stem, value] : stems) {
    by_index[Bm42Index(stem)] =
        static_cast<float>(std::pow(std::log1p(static_cast<double>(value)), options.alpha));
  }
  SparseVector out;
  for (const auto& [index, value] : by_index) {
    out.indices.push_back(index);
    out.values.push_back(value);
  }
  return out;
}

}  // namespace attn
