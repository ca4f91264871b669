// Losses: values against naive loops and hand-computed cases, gradients against central finite
// differences (the losses accumulate in double, so the difference quotient is exact to ~1e-7).
#include "engine/training/losses.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <vector>

#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

std::vector<float> RandomRows(int64_t rows, int64_t cols, std::mt19937& rng, bool normalize) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = dist(rng);
  if (normalize) {
    for (int64_t r = 0; r < rows; ++r) {
      double sq = 0.0;
      for (int64_t k = 0; k < cols; ++k) sq += double{x[r * cols + k]} * x[r * cols + k];
      for (int64_t k = 0; k < cols; ++k) x[r * cols + k] /= std::sqrt(sq);
    }
  }
  return x;
}

// Naive cosine: dot / (|a| |b|).
double NaiveCos(const float* a, const float* b, int64_t h) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t k = 0; k < h; ++k) {
    dot += double{a[k]} * b[k];
    na += double{a[k]} * a[k];
    nb += double{b[k]} * b[k];
  }
  return dot / (std::sqrt(na) * std::sqrt(nb));
}

double NaiveMnrl(const std::vector<float>& a, const std::vector<float>& c, int64_t n, int64_t h,
                 double scale) {
  const int64_t cn = static_cast<int64_t>(c.size()) / h;
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    double sum_exp = 0;
    for (int64_t j = 0; j < cn; ++j) sum_exp += std::exp(scale * NaiveCos(&a[i * h], &c[j * h], h));
    loss += -std::log(std::exp(scale * NaiveCos(&a[i * h], &c[i * h], h)) / sum_exp);
  }
  return loss / n;
}

// Central differences of `loss` w.r.t. every element of `x`, compared with `analytic`.
void ExpectMatchesFiniteDifferences(std::vector<float>* x, const std::vector<float>& analytic,
                                    const std::function<double()>& loss, const char* what,
                                    double tol = 2e-4) {
  ASSERT_EQ(x->size(), analytic.size());
  for (size_t e = 0; e < x->size(); ++e) {
    const float orig = (*x)[e];
    const float h = 1e-3f;
    (*x)[e] = orig + h;
    const float xp = (*x)[e];
    const double lp = loss();
    (*x)[e] = orig - h;
    const float xm = (*x)[e];
    const double lm = loss();
    (*x)[e] = orig;
    const double numeric = (lp - lm) / (double{xp} - xm);
    EXPECT_NEAR(analytic[e], numeric, tol * std::max(1.0, std::abs(numeric)))
        << what << "[" << e << "]";
  }
}

// ------------------------------------------------------------------------------------------
// MultipleNegativesRankingLoss

struct MnrlCase {
  int64_t n, h, blocks;  // candidates C = blocks * n
  bool normalize;
};

class MnrlTest : public ::testing::TestWithParam<MnrlCase> {};

TEST_P(MnrlTest, ValueMatchesNaiveAndGradientsMatchFiniteDifferences) {
  const MnrlCase p = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(p.n * 100 + p.h * 10 + p.blocks));
  const int64_t C = p.blocks * p.n;
  std::vector<float> a = RandomRows(p.n, p.h, rng, p.normalize);
  std::vector<float> c = RandomRows(C, p.h, rng, p.normalize);
  // Scale 20 saturates the softmax on random vectors; a smaller scale exercises the gradient
  // through every candidate, 20 the default path.
  for (double scale : {20.0, 2.0}) {
    MnrlOptions options{scale};
    std::vector<float> da(a.size()), dc(c.size());
    absl::StatusOr<double> loss = MultipleNegativesRankingLoss(a.data(), p.n, c.data(), C, p.h,
                                                               options, da.data(), dc.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, NaiveMnrl(a, c, p.n, p.h, scale), 1e-9 * std::max(1.0, *loss));

    std::vector<float> scratch_a(a.size()), scratch_c(c.size());
    auto eval = [&] {
      return *MultipleNegativesRankingLoss(a.data(), p.n, c.data(), C, p.h, options,
                                           scratch_a.data(), scratch_c.data());
    };
    ExpectMatchesFiniteDifferences(&a, da, eval, "d_anchors");
    ExpectMatchesFiniteDifferences(&c, dc, eval, "d_candidates");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MnrlTest,
                         ::testing::Values(MnrlCase{1, 3, 1, true},     // single pair
                                           MnrlCase{3, 5, 1, true},     // in-batch negatives
                                           MnrlCase{3, 5, 2, true},     // + hard negatives
                                           MnrlCase{4, 6, 2, false},    // un-normalised inputs
                                           MnrlCase{2, 4, 3, false}));  // two negative blocks

TEST(MnrlTest, HandComputedOrthonormalCase) {
  // anchors = candidates = e1, e2: scores [[20, 0], [0, 20]], loss = log(1 + e^-20).
  const std::vector<float> a = {1, 0, 0, 1};
  std::vector<float> da(4), dc(4);
  absl::StatusOr<double> loss =
      MultipleNegativesRankingLoss(a.data(), 2, a.data(), 2, 2, {}, da.data(), dc.data());
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, std::log1p(std::exp(-20.0)), 1e-15);
}

TEST(MnrlTest, HardNegativeRaisesTheLoss) {
  // A hard negative identical to the positive makes the positive at best a coin flip.
  const std::vector<float> a = {1, 0};
  const std::vector<float> pos_only = {1, 0};
  const std::vector<float> with_negative = {1, 0, 1, 0};
  std::vector<float> da(2), dc(4);
  const double base =
      *MultipleNegativesRankingLoss(a.data(), 1, pos_only.data(), 1, 2, {}, da.data(), dc.data());
  const double hard = *MultipleNegativesRankingLoss(a.data(), 1, with_negative.data(), 2, 2, {},
                                                    da.data(), dc.data());
  EXPECT_NEAR(base, 0.0, 1e-12);
  EXPECT_NEAR(hard, std::log(2.0), 1e-12);
}

TEST(MnrlTest, ScaleInvariantInInputNormsAndGradientIsTangent) {
  std::mt19937 rng(7);
  const int64_t n = 3, h = 4;
  std::vector<float> a = RandomRows(n, h, rng, true), c = RandomRows(2 * n, h, rng, true);
  std::vector<float> a3 = a;
  for (float& v : a3) v *= 3.0f;
  std::vector<float> da(a.size()), dc(c.size()), da3(a.size()), dc3(c.size());
  const double l1 =
      *MultipleNegativesRankingLoss(a.data(), n, c.data(), 2 * n, h, {}, da.data(), dc.data());
  const double l3 =
      *MultipleNegativesRankingLoss(a3.data(), n, c.data(), 2 * n, h, {}, da3.data(), dc3.data());
  EXPECT_NEAR(l1, l3, 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    double radial = 0.0;  // a normalised input's gradient has no component along the input
    for (int64_t k = 0; k < h; ++k) radial += double{da[i * h + k]} * a[i * h + k];
    EXPECT_NEAR(radial, 0.0, 1e-6);
    for (int64_t k = 0; k < h; ++k) EXPECT_NEAR(da3[i * h + k], da[i * h + k] / 3.0f, 1e-6);
  }
}

TEST(MnrlTest, RejectsBadShapes) {
  std::vector<float> x(12), g(12);
  absl::StatusOr<double> bad =
      MultipleNegativesRankingLoss(x.data(), 2, x.data(), 3, 2, {}, g.data(), g.data());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("C = 3"), std::string::npos) << bad.status();
  bad = MultipleNegativesRankingLoss(x.data(), 3, x.data(), 2, 2, {}, g.data(), g.data());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  bad = MultipleNegativesRankingLoss(x.data(), 0, x.data(), 0, 2, {}, g.data(), g.data());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  bad = MultipleNegativesRankingLoss(x.data(), 2, x.data(), 2, 2, {}, nullptr, g.data());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MnrlTest, NonFiniteEmbeddingGivesNonFiniteLoss) {
  std::vector<float> a = {1, 0, 0, 1}, da(4), dc(4);
  a[1] = std::nanf("");
  absl::StatusOr<double> loss =
      MultipleNegativesRankingLoss(a.data(), 2, a.data(), 2, 2, {}, da.data(), dc.data());
  ASSERT_TRUE(loss.ok());
  EXPECT_FALSE(std::isfinite(*loss));
}

// ------------------------------------------------------------------------------------------
// CosineSimilarityLoss

TEST(CosineSimilarityLossTest, HandComputed) {
  // cos((1,0),(1,1)) = 1/sqrt(2); cos((0,2),(0,-1)) = -1.
  const std::vector<float> u = {1, 0, 0, 2}, v = {1, 1, 0, -1};
  const std::vector<float> labels = {0.5f, 0.0f};
  std::vector<float> du(4), dv(4);
  absl::StatusOr<double> loss =
      CosineSimilarityLoss(u.data(), v.data(), 2, labels, du.data(), dv.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  const double d0 = 1.0 / std::sqrt(2.0) - 0.5;
  EXPECT_NEAR(*loss, (d0 * d0 + 1.0) / 2.0, 1e-7);
}

TEST(CosineSimilarityLossTest, ValueMatchesNaiveAndGradientsMatchFiniteDifferences) {
  std::mt19937 rng(11);
  for (bool normalize : {true, false}) {
    const int64_t n = 4, h = 5;
    std::vector<float> u = RandomRows(n, h, rng, normalize), v = RandomRows(n, h, rng, normalize);
    const std::vector<float> labels = {0.9f, -0.2f, 0.0f, 0.5f};
    std::vector<float> du(u.size()), dv(v.size());
    const double loss = *CosineSimilarityLoss(u.data(), v.data(), h, labels, du.data(), dv.data());
    double naive = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = NaiveCos(&u[i * h], &v[i * h], h) - labels[i];
      naive += d * d / n;
    }
    EXPECT_NEAR(loss, naive, 1e-12);
    std::vector<float> su(u.size()), sv(v.size());
    auto eval = [&] {
      return *CosineSimilarityLoss(u.data(), v.data(), h, labels, su.data(), sv.data());
    };
    ExpectMatchesFiniteDifferences(&u, du, eval, "d_u");
    ExpectMatchesFiniteDifferences(&v, dv, eval, "d_v");
  }
}

TEST(CosineSimilarityLossTest, RejectsNonFiniteLabelNamingTheIndex) {
  const std::vector<float> u = {1, 0, 0, 1, 1, 1};
  std::vector<float> g(6);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    const std::vector<float> labels = {0.5f, 0.5f, bad};
    absl::StatusOr<double> loss =
        CosineSimilarityLoss(u.data(), u.data(), 2, labels, g.data(), g.data());
    EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loss.status().message().find("label 2"), std::string::npos) << loss.status();
  }
  EXPECT_FALSE(CosineSimilarityLoss(u.data(), u.data(), 2, {}, g.data(), g.data()).ok());
}

TEST(CosineSimilarityLossTest, ZeroVectorUsesTheEpsClamp) {
  // A zero row is clamped (as torch), so the loss stays finite: cos = 0.
  const std::vector<float> u = {0, 0}, v = {1, 0};
  const std::vector<float> labels = {1.0f};
  std::vector<float> du(2), dv(2);
  const double loss = *CosineSimilarityLoss(u.data(), v.data(), 2, labels, du.data(), dv.data());
  EXPECT_DOUBLE_EQ(loss, 1.0);
  for (float g : du) EXPECT_TRUE(std::isfinite(g));
}

// ------------------------------------------------------------------------------------------
// ClassificationHead

TEST(ClassificationHeadTest, ValueMatchesNaiveAndGradientsMatchFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t n = 5, h = 4, k = 3;
  ClassificationHead head = MakeClassificationHead(k, h, HeadInit::kXavierUniform, 42);
  for (float& b : head.bias.values()) b = std::normal_distribution<float>(0, 0.5f)(rng);
  std::vector<float> pooled = RandomRows(n, h, rng, true);
  const std::vector<int64_t> labels = {0, 2, 1, 2, 0};
  std::vector<float> dpooled(pooled.size());
  ClassificationHead dhead;
  absl::StatusOr<double> loss =
      ClassificationHeadLoss(head, pooled.data(), labels, dpooled.data(), &dhead);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_EQ(dhead.weight.shape(), head.weight.shape());
  ASSERT_EQ(dhead.bias.shape(), head.bias.shape());

  std::vector<float> logits(n * k);
  ClassificationHeadForward(head, pooled.data(), n, logits.data());
  double naive = 0;
  for (int64_t i = 0; i < n; ++i) {
    double z[3], sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      z[c] = head.bias.data()[c];
      for (int64_t j = 0; j < h; ++j)
        z[c] += double{pooled[i * h + j]} * head.weight.data()[c * h + j];
      EXPECT_NEAR(logits[i * k + c], z[c], 1e-6);
      sum += std::exp(z[c]);
    }
    naive -= std::log(std::exp(z[labels[i]]) / sum) / n;
  }
  EXPECT_NEAR(*loss, naive, 1e-12);

  std::vector<float> sp(pooled.size());
  ClassificationHead sh;
  auto eval = [&] { return *ClassificationHeadLoss(head, pooled.data(), labels, sp.data(), &sh); };
  ExpectMatchesFiniteDifferences(&pooled, dpooled, eval, "d_pooled");
  std::vector<float> w(head.weight.values().begin(), head.weight.values().end());
  std::vector<float> dw(dhead.weight.values().begin(), dhead.weight.values().end());
  auto eval_w = [&] {
    std::copy(w.begin(), w.end(), head.weight.values().begin());
    return eval();
  };
  ExpectMatchesFiniteDifferences(&w, dw, eval_w, "d_weight");
  std::copy(w.begin(), w.end(), head.weight.values().begin());
  std::vector<float> b(head.bias.values().begin(), head.bias.values().end());
  std::vector<float> db(dhead.bias.values().begin(), dhead.bias.values().end());
  auto eval_b = [&] {
    std::copy(b.begin(), b.end(), head.bias.values().begin());
    return eval();
  };
  ExpectMatchesFiniteDifferences(&b, db, eval_b, "d_bias");
}

TEST(ClassificationHeadTest, ZeroHeadGivesLogK) {
  ClassificationHead head = ZerosLike(MakeClassificationHead(4, 3, HeadInit::kNormal, 1));
  const std::vector<float> pooled = {1, 2, 3, -1, 0, 1};
  std::vector<float> dp(6);
  ClassificationHead dh;
  const double loss = *ClassificationHeadLoss(head, pooled.data(), {1, 3}, dp.data(), &dh);
  EXPECT_NEAR(loss, std::log(4.0), 1e-12);
  // dbias = mean_i (1/K - onehot(label_i)).
  EXPECT_NEAR(dh.bias.data()[0], 0.25, 1e-7);
  EXPECT_NEAR(dh.bias.data()[1], 0.25 - 0.5, 1e-7);
  EXPECT_NEAR(dh.bias.data()[3], 0.25 - 0.5, 1e-7);
}

TEST(ClassificationHeadTest, RejectsOutOfRangeLabelsNamingTheIndex) {
  const ClassificationHead head = MakeClassificationHead(3, 2, HeadInit::kNormal, 5);
  const std::vector<float> pooled = {1, 0, 0, 1};
  std::vector<float> dp(4);
  ClassificationHead dh;
  for (int64_t bad : {int64_t{-1}, int64_t{3}, int64_t{1} << 40}) {
    absl::StatusOr<double> loss =
        ClassificationHeadLoss(head, pooled.data(), {0, bad}, dp.data(), &dh);
    EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loss.status().message().find("label 1"), std::string::npos) << loss.status();
    EXPECT_NE(loss.status().message().find("[0, 3)"), std::string::npos) << loss.status();
  }
  EXPECT_FALSE(ClassificationHeadLoss(head, pooled.data(), {}, dp.data(), &dh).ok());
  EXPECT_FALSE(
      ClassificationHeadLoss(ClassificationHead{}, pooled.data(), {0}, dp.data(), &dh).ok());
}

TEST(ClassificationHeadTest, InitIsSeededAndScaled) {
  const ClassificationHead a = MakeClassificationHead(8, 256, HeadInit::kXavierUniform, 9);
  const ClassificationHead b = MakeClassificationHead(8, 256, HeadInit::kXavierUniform, 9);
  const ClassificationHead c = MakeClassificationHead(8, 256, HeadInit::kXavierUniform, 10);
  EXPECT_EQ(a.weight.values(), b.weight.values());
  EXPECT_NE(a.weight.values(), c.weight.values());
  const float bound = std::sqrt(6.0f / (256 + 8));
  for (float w : a.weight.values()) EXPECT_LE(std::abs(w), bound);
  for (float x : a.bias.values()) EXPECT_EQ(x, 0.0f);

  const ClassificationHead n = MakeClassificationHead(8, 256, HeadInit::kNormal, 9, 0.02f);
  double sq = 0;
  for (float w : n.weight.values()) sq += double{w} * w;
  EXPECT_NEAR(std::sqrt(sq / n.weight.numel()), 0.02, 0.002);
}

// ------------------------------------------------------------------------------------------
// Parity with sentence-transformers: tests/golden/make_grad_golden.py records, per case, the
// normalised embeddings of MiniLM, the fp32 loss of sentence-transformers' own loss module and
// dLoss/d(normalised embedding) (through cos_sim's own normalisation, as here).

TEST(LossGoldenTest, MatchesSentenceTransformersOnMiniLmEmbeddings) {
  const std::string dir = ATTN_GOLDEN_DIR;
  std::ifstream json_file(dir + "/grad_cases.json");
  ASSERT_TRUE(json_file.good()) << "missing tests/golden/grad_cases.json";
  const nlohmann::json doc = nlohmann::json::parse(json_file, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "tests/golden/grad_cases.json is not valid JSON";
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> golden =
      SafetensorsFile::Open(dir + "/grad_golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto read = [&](const std::string& name) {
    absl::StatusOr<Tensor> t = (*golden)->ReadFloat32(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : Tensor();
  };
  int cases = 0;
  for (const nlohmann::json& c : doc.at("cases")) {
    const std::string name = c.at("name"), objective = c.at("objective");
    SCOPED_TRACE(name);
    const nlohmann::json& groups = c.at("groups");
    std::vector<Tensor> emb, d_emb_torch;
    for (const nlohmann::json& g : groups) {
      emb.push_back(read(name + ".emb." + g.at("name").get<std::string>()));
      d_emb_torch.push_back(read(name + ".d_emb." + g.at("name").get<std::string>()));
    }
    const int64_t H = emb[0].dim(1);
    std::vector<std::vector<float>> d_emb;  // ours, one per group
    double loss = 0.0;
    if (objective == "multiple_negatives_ranking") {
      // groups: anchors, then the candidate groups in order (positives, negatives).
      const int64_t N = emb[0].dim(0);
      std::vector<float> candidates;
      for (size_t g = 1; g < emb.size(); ++g) {
        candidates.insert(candidates.end(), emb[g].values().begin(), emb[g].values().end());
      }
      const int64_t C = static_cast<int64_t>(candidates.size()) / H;
      std::vector<float> da(N * H), dc(C * H);
      absl::StatusOr<double> l =
          MultipleNegativesRankingLoss(emb[0].data(), N, candidates.data(), C, H,
                                       {c.at("scale").get<double>()}, da.data(), dc.data());
      ASSERT_TRUE(l.ok()) << l.status();
      loss = *l;
      d_emb.push_back(da);
      for (size_t g = 1; g < emb.size(); ++g) {
        const auto begin = dc.begin() + (g - 1) * N * H;
        d_emb.emplace_back(begin, begin + N * H);
      }
    } else {
      ASSERT_EQ(objective, "cosine_similarity");
      const std::vector<float> labels = c.at("labels").get<std::vector<float>>();
      std::vector<float> du(emb[0].numel()), dv(emb[1].numel());
      absl::StatusOr<double> l =
          CosineSimilarityLoss(emb[0].data(), emb[1].data(), H, labels, du.data(), dv.data());
      ASSERT_TRUE(l.ok()) << l.status();
      loss = *l;
      d_emb = {du, dv};
    }
    // Torch's loss is fp32 (~1e-7 relative); ours is double from the same fp32 embeddings.
    const double torch_loss = read(name + ".loss").data()[0];
    EXPECT_NEAR(loss, torch_loss, 2e-6 * std::max(1.0, std::abs(torch_loss)));
    std::cout << name << ": loss " << loss << " vs torch " << torch_loss << "\n";
    for (size_t g = 0; g < emb.size(); ++g) {
      double max_abs = 0.0, worst = 0.0;
      for (int64_t k = 0; k < d_emb_torch[g].numel(); ++k) {
        max_abs = std::max(max_abs, std::abs(double{d_emb_torch[g].data()[k]}));
        worst = std::max(worst, std::abs(double{d_emb[g][k]} - d_emb_torch[g].data()[k]));
      }
      // fp32 torch vs double here: agreement to ~1e-5 of the largest gradient entry.
      EXPECT_LE(worst, 1e-5 * max_abs) << "group " << groups[g].at("name");
      std::cout << name << "/" << groups[g].at("name").get<std::string>()
                << ": max |d_emb diff| / max |d_emb| = " << worst / max_abs << "\n";
    }
    ++cases;
  }
  EXPECT_EQ(cases, 3);
}

}  // namespace
}  // namespace attn
