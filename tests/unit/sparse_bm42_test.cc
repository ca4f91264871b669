// BM42 pieces that need no reference model: murmur3 against the published MurmurHash3_x86_32
// test vectors, the index's sign handling, word merging, stop words, punctuation, max-combining.
#include "engine/explain/sparse_bm42.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "engine/model.h"

namespace attn {
namespace {

TEST(Murmur3Test, KnownVectors) {
  // SMHasher / Appleby's verification values for MurmurHash3_x86_32.
  EXPECT_EQ(static_cast<uint32_t>(Murmur3Hash32("", 0)), 0u);
  EXPECT_EQ(static_cast<uint32_t>(Murmur3Hash32("", 1)), 0x514E28B7u);
  EXPECT_EQ(static_cast<uint32_t>(Murmur3Hash32("", 0xffffffff)), 0x81F16F39u);
  EXPECT_EQ(static_cast<uint32_t>(Murmur3Hash32(std::string(4, '\0'), 0)), 0x2362F9DEu);
  EXPECT_EQ(static_cast<uint32_t>(Murmur3Hash32("Hello, world!", 0x9747b28c)), 0x24884CBAu);
  EXPECT_EQ(static_cast<uint32_t>(
                Murmur3Hash32("The quick brown fox jumps over the lazy dog", 0x9747b28c)),
            0x2FA826CDu);
}

TEST(Murmur3Test, IndexIsTheAbsoluteValueOfTheSignedHash) {
  for (const char* word : {"foo", "bar", "axolotl", "run", "caf\xc3\xa9"}) {
    const int64_t signed_hash = Murmur3Hash32(word);
    EXPECT_EQ(static_cast<int64_t>(Bm42Index(word)), signed_hash < 0 ? -signed_hash : signed_hash);
  }
}

class Bm42EncoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tokenizer = WordPieceTokenizer::FromModelDir(ATTN_TEST_MODEL_DIR);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = new WordPieceTokenizer(std::move(*tokenizer));
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  static WordPieceTokenizer* tokenizer_;
};
WordPieceTokenizer* Bm42EncoderTest::tokenizer_ = nullptr;

TEST_F(Bm42EncoderTest, MergesPiecesDropsStopWordsAndPunctuationStemsAndTakesTheMax) {
  auto bm42 = Bm42Encoder::Create(*tokenizer_, "/nonexistent");
  ASSERT_TRUE(bm42.ok()) << bm42.status();
  EXPECT_EQ((*bm42)->num_stop_words(), 179u);
  auto e = tokenizer_->Encode("The runners were running, photosynthesis runs!");
  ASSERT_TRUE(e.ok());
  std::vector<float> w(e->size());
  for (int t = 0; t < e->size(); ++t) w[t] = 0.01f * (t + 1);
  const auto words = (*bm42)->StemmedWords(*e, w);
  std::vector<std::string> stems;
  for (const auto& [stem, value] : words) stems.push_back(stem);
  // "the", "were" are stop words; "," and "!" punctuation; runners -> runner, running/runs -> run.
  EXPECT_EQ(stems, (std::vector<std::string>{"runner", "run", "photosynthesi", "run"}));
  // photosynthesis is several word pieces: its weight is their sum.
  float pieces = 0;
  for (int t = 0; t < e->size(); ++t) {
    if (e->char_start[t] >= 26 && e->char_end[t] <= 40 && e->char_end[t] > 0) pieces += w[t];
  }
  EXPECT_NEAR(words[2].second, pieces, 1e-6f);
  auto sparse = (*bm42)->Encode(*e, w);
  ASSERT_TRUE(sparse.ok());
  ASSERT_EQ(sparse->indices.size(), 3u);  // "run" twice -> one entry with the larger weight
  for (size_t k = 0; k < sparse->indices.size(); ++k) {
    if (sparse->indices[k] != Bm42Index("run")) continue;
    const float expected = std::sqrt(std::log1p(std::max(words[1].second, words[3].second)));
    EXPECT_NEAR(sparse->values[k], expected, 1e-6f);
  }
  EXPECT_FALSE((*bm42)->Encode(*e, std::vector<float>(3)).ok());
}

}  // namespace
}  // namespace attn
