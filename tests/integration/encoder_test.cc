// Encode, Tokenize and GetModelInfo of the real server against the golden fixtures
// (tests/golden: Hugging Face transformers + sentence-transformers on the same weights).
// Tolerances: tokens identical, hidden states <= 1e-4, pooled embedding within 2e-6 (max abs,
// the golden parity test's bound) and cosine >= 0.99999.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/precision.h"
#include "engine/safetensors.h"
#include "tests/integration/harness.h"

namespace attn::integration {

// The encoder binary's shared server runs with default flags.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

constexpr double kHiddenTolerance = 1e-4;
constexpr double kPooledMinCosine = 0.99999;
constexpr double kPooledMaxAbs = 2e-6;  // tests/golden/golden_parity_test.cc

class EncoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  static grpc::Status Encode(const pb::EncodeRequest& request, pb::EncodeResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    return stub_->Encode(&context, request, response);
  }

  static pb::Encoder::Stub* stub_;
};
pb::Encoder::Stub* EncoderTest::stub_ = nullptr;

// Golden cases sharing the default truncation (max_length 512, right), in fixture order.
std::vector<const GoldenCase*> RightTruncated512Cases() {
  std::vector<const GoldenCase*> cases;
  for (const GoldenCase& c : GoldenCases()) {
    if (c.spec["max_length"] == 512 && c.spec["truncation_side"] == "right") cases.push_back(&c);
  }
  return cases;
}

double Norm(const std::vector<float>& v) {
  double n = 0;
  for (float x : v) n += static_cast<double>(x) * x;
  return std::sqrt(n);
}

// Row t of a [T, hidden] tensor.
std::vector<float> Row(const std::vector<float>& values, int t) {
  return std::vector<float>(values.begin() + static_cast<size_t>(t) * kHidden,
                            values.begin() + static_cast<size_t>(t + 1) * kHidden);
}

void ExpectShape(const pb::Tensor& tensor, std::vector<int64_t> shape, const std::string& what) {
  EXPECT_EQ(Shape(tensor), shape) << what << " has shape " << ShapeString(tensor);
}

// Compares a returned [T, 384] hidden state to the fixture's rows of `layer`.
void ExpectHiddenMatchesGolden(const GoldenCase& c, int layer, const std::vector<float>& values) {
  ASSERT_EQ(values.size(), static_cast<size_t>(c.seq_len) * kHidden) << c.name;
  double max_error = 0;
  for (size_t r = 0; r < c.rows.size(); ++r) {
    for (int k = 0; k < kHidden; ++k) {
      const double error = std::fabs(values[static_cast<size_t>(c.rows[r]) * kHidden + k] -
                                     c.Hidden(layer, static_cast<int>(r), k));
      max_error = std::max(max_error, error);
    }
  }
  EXPECT_LE(max_error, kHiddenTolerance) << c.name << " layer " << layer;
}

TEST_F(EncoderTest, GetModelInfoDescribesMiniLM) {
  grpc::ClientContext context;
  pb::GetModelInfoRequest request;
  pb::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, request, &info);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(info.model_type(), "bert");
  EXPECT_EQ(info.hidden_size(), kHidden);
  EXPECT_EQ(info.num_layers(), kNumLayers);
  EXPECT_EQ(info.num_heads(), kNumHeads);
  EXPECT_EQ(info.head_dim(), kHeadDim);
  EXPECT_EQ(info.intermediate_size(), 1536);
  EXPECT_EQ(info.vocab_size(), kVocabSize);
  EXPECT_EQ(info.type_vocab_size(), 2);
  EXPECT_EQ(info.max_position_embeddings(), 512);
  EXPECT_EQ(info.default_max_length(), 256);
  EXPECT_EQ(info.default_pooling(), "mean");
  EXPECT_TRUE(info.default_normalize());
  EXPECT_EQ(info.precision(), "float32");
  EXPECT_EQ(info.version(), "base");
  EXPECT_NE(std::find(info.available_versions().begin(), info.available_versions().end(), "base"),
            info.available_versions().end());
  // model.safetensors holds 22,713,216 floats; 22,565,376 without the unused BERT pooler.
  EXPECT_TRUE(info.parameter_count() == 22713216 || info.parameter_count() == 22565376)
      << info.parameter_count();

  // Pinning the served version explicitly works too.
  grpc::ClientContext pinned_context;
  request.set_model_version("base");
  pb::ModelInfo pinned;
  ASSERT_TRUE(stub_->GetModelInfo(&pinned_context, request, &pinned).ok());
  EXPECT_EQ(pinned.version(), "base");
}

TEST_F(EncoderTest, TokenizeMatchesGolden) {
  for (const GoldenCase& c : GoldenCases()) {
    pb::TokenizeRequest request;
    *request.add_inputs() = GoldenInput(c);
    *request.mutable_tokenization() = GoldenTokenization(c);
    pb::TokenizeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->Tokenize(&context, request, &response);
    ASSERT_TRUE(status.ok()) << c.name << ": " << StatusString(status);
    ASSERT_EQ(response.results_size(), 1);
    ExpectTokensMatchGolden(c, response.results(0).tokens());
    const int untruncated = c.spec["untruncated_len"].get<int>();
    EXPECT_EQ(response.results(0).truncated(), untruncated > c.seq_len) << c.name;
    if (untruncated > c.seq_len) {
      EXPECT_EQ(response.results(0).untruncated_length(), untruncated) << c.name;
    }
    EXPECT_EQ(response.model_version(), "base");
    EXPECT_EQ(response.metadata().token_count(), c.seq_len) << c.name;
  }
}

// Several texts (and a pair, and a 762-token text truncated to 512) in one request: tokens,
// pooled embedding, every layer's hidden state, token and static embedding shapes.
TEST_F(EncoderTest, EncodeBatchMatchesGolden) {
  const std::vector<const GoldenCase*> cases = RightTruncated512Cases();
  ASSERT_GE(cases.size(), 10u);
  pb::EncodeRequest request;
  for (const GoldenCase* c : cases) *request.add_inputs() = GoldenInput(*c);
  *request.mutable_tokenization() = GoldenTokenization(*cases[0]);
  request.set_return_token_embeddings(true);
  request.set_return_static_embeddings(true);
  for (int layer = 0; layer <= kNumLayers; ++layer) request.add_hidden_layers(layer);
  pb::EncodeResponse response;
  const grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(cases.size()));
  EXPECT_EQ(response.model_version(), "base");
  int64_t total_tokens = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const GoldenCase& c = *cases[i];
    const pb::EncodeResult& result = response.results(static_cast<int>(i));
    SCOPED_TRACE("inputs[" + std::to_string(i) + "] = " + c.name);
    total_tokens += c.seq_len;
    ExpectTokensMatchGolden(c, result.tokens());
    const int untruncated = c.spec["untruncated_len"].get<int>();
    EXPECT_EQ(result.truncated(), untruncated > c.seq_len);
    if (untruncated > c.seq_len) {
      EXPECT_EQ(result.untruncated_length(), untruncated);
    }

    const std::vector<float> pooled(result.embedding().begin(), result.embedding().end());
    ASSERT_EQ(pooled.size(), static_cast<size_t>(kHidden));
    EXPECT_GE(Cosine(pooled, c.pooled), kPooledMinCosine);
    EXPECT_LE(MaxAbsDiff(pooled, c.pooled), kPooledMaxAbs);
    EXPECT_NEAR(Norm(pooled), 1.0, 1e-5) << "the model default normalises";

    ExpectShape(result.token_embeddings(), {c.seq_len, kHidden}, "token_embeddings");
    ExpectShape(result.static_embeddings(), {c.seq_len, kHidden}, "static_embeddings");
    ASSERT_EQ(result.hidden_states_size(), kNumLayers + 1);
    std::vector<float> last;
    for (int layer = 0; layer <= kNumLayers; ++layer) {
      const pb::LayerTensor& hidden = result.hidden_states(layer);
      EXPECT_EQ(hidden.layer(), layer);
      ExpectShape(hidden.tensor(), {c.seq_len, kHidden},
                  "hidden_states[" + std::to_string(layer) + "]");
      const std::vector<float> values = DecodeOrFail(hidden.tensor());
      ExpectHiddenMatchesGolden(c, layer, values);
      if (layer == kNumLayers) last = values;
    }
    // return_token_embeddings is the last layer's output.
    EXPECT_LE(MaxAbsDiff(DecodeOrFail(result.token_embeddings()), last), 1e-6);
  }
  EXPECT_EQ(response.metadata().token_count(), total_tokens);
  EXPECT_GE(response.metadata().batch_inputs(), static_cast<int>(cases.size()));
  EXPECT_GT(response.metadata().total_ms(), 0);
}

// What a plain client does: send only the text, all options default. Must equal
// SentenceTransformer(model).encode(text) for every case the fixtures took from it.
TEST_F(EncoderTest, PlainTextEqualsSentenceTransformers) {
  std::vector<const GoldenCase*> cases;
  pb::EncodeRequest request;
  for (const GoldenCase& c : GoldenCases()) {
    if (!c.sentence_transformers_pooled()) continue;
    cases.push_back(&c);
    request.add_inputs()->set_text(c.spec["text"].get<std::string>());
  }
  ASSERT_GE(cases.size(), 10u);
  pb::EncodeResponse response;
  const grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(cases.size()));
  for (size_t i = 0; i < cases.size(); ++i) {
    const pb::EncodeResult& result = response.results(static_cast<int>(i));
    const std::vector<float> pooled(result.embedding().begin(), result.embedding().end());
    EXPECT_GE(Cosine(pooled, cases[i]->pooled), kPooledMinCosine) << cases[i]->name;
    EXPECT_EQ(result.tokens_size(), cases[i]->seq_len) << cases[i]->name;
    // Nothing but the pooled embedding unless asked for.
    EXPECT_EQ(result.token_embeddings().data().size(), 0u);
    EXPECT_EQ(result.hidden_states_size(), 0);
  }
}

TEST_F(EncoderTest, LeftTruncationMatchesGolden) {
  const GoldenCase& c = Golden("left_truncated_32");
  pb::EncodeRequest request;
  *request.add_inputs() = GoldenInput(c);
  *request.mutable_tokenization() = GoldenTokenization(c);
  request.set_pooling(pb::POOLING_MEAN);
  request.set_normalize(true);
  request.add_hidden_layers(-1);
  pb::EncodeResponse response;
  const grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  const pb::EncodeResult& result = response.results(0);
  ExpectTokensMatchGolden(c, result.tokens());
  EXPECT_TRUE(result.truncated());
  EXPECT_EQ(result.untruncated_length(), c.spec["untruncated_len"].get<int>());
  const std::vector<float> pooled(result.embedding().begin(), result.embedding().end());
  EXPECT_GE(Cosine(pooled, c.pooled), kPooledMinCosine);
  ASSERT_EQ(result.hidden_states_size(), 1);
  ExpectHiddenMatchesGolden(c, kNumLayers, DecodeOrFail(result.hidden_states(0).tensor()));
}

// float16 / bfloat16 output equals float32 output within the format's precision, and the
// pooled embedding (always float32) is unaffected.
TEST_F(EncoderTest, HalfPrecisionOutputsMatchFloat32) {
  pb::EncodeRequest request;
  *request.add_inputs() = GoldenInput(Golden("long_english"));
  *request.add_inputs() = GoldenInput(Golden("text_pair"));
  request.set_return_token_embeddings(true);
  request.set_return_static_embeddings(true);
  request.add_hidden_layers(0);
  request.add_hidden_layers(3);
  request.add_hidden_layers(-1);

  auto run = [&](pb::DType dtype) {
    request.set_output_dtype(dtype);
    pb::EncodeResponse response;
    const grpc::Status status = Encode(request, &response);
    EXPECT_TRUE(status.ok()) << pb::DType_Name(dtype) << ": " << StatusString(status);
    return response;
  };
  const pb::EncodeResponse f32 = run(pb::FLOAT32);
  ASSERT_EQ(f32.results_size(), 2);

  struct Case {
    pb::DType dtype;
    double relative;  // round-to-nearest error is 2^-11 (fp16) / 2^-8 (bf16) relative
    double absolute;  // fp16 subnormals: absolute steps of 2^-24
  };
  for (const Case& format : {Case{pb::FLOAT16, 1e-3, 1e-7}, Case{pb::BFLOAT16, 8e-3, 0}}) {
    SCOPED_TRACE(pb::DType_Name(format.dtype));
    const pb::EncodeResponse low = run(format.dtype);
    ASSERT_EQ(low.results_size(), 2);
    for (int i = 0; i < 2; ++i) {
      const pb::EncodeResult& a = f32.results(i);
      const pb::EncodeResult& b = low.results(i);
      std::vector<std::pair<const pb::Tensor*, const pb::Tensor*>> pairs = {
          {&a.token_embeddings(), &b.token_embeddings()},
          {&a.static_embeddings(), &b.static_embeddings()}};
      ASSERT_EQ(b.hidden_states_size(), 3);
      for (int h = 0; h < 3; ++h) {
        EXPECT_EQ(b.hidden_states(h).layer(), a.hidden_states(h).layer());
        pairs.push_back({&a.hidden_states(h).tensor(), &b.hidden_states(h).tensor()});
      }
      for (size_t p = 0; p < pairs.size(); ++p) {
        EXPECT_EQ(pairs[p].second->dtype(), format.dtype) << "tensor " << p;
        EXPECT_EQ(Shape(*pairs[p].second), Shape(*pairs[p].first)) << "tensor " << p;
        EXPECT_EQ(pairs[p].second->data().size() * 2, pairs[p].first->data().size());
        const std::vector<float> reference = DecodeOrFail(*pairs[p].first);
        const std::vector<float> values = DecodeOrFail(*pairs[p].second);
        ASSERT_EQ(values.size(), reference.size());
        int bad = 0;
        double worst = 0;
        for (size_t k = 0; k < values.size(); ++k) {
          const double error = std::fabs(values[k] - reference[k]);
          const double allowed = format.relative * std::fabs(reference[k]) + format.absolute;
          if (!(error <= allowed)) {
            ++bad;
            worst = std::max(worst, error / std::max(std::fabs(reference[k]), 1e-30f));
          }
        }
        EXPECT_EQ(bad, 0) << "input " << i << " tensor " << p << ": " << bad
                          << " values off by more than the format's precision (worst relative "
                          << worst << ")";
      }
      const std::vector<float> pooled_a(a.embedding().begin(), a.embedding().end());
      const std::vector<float> pooled_b(b.embedding().begin(), b.embedding().end());
      EXPECT_LE(MaxAbsDiff(pooled_a, pooled_b), 1e-6) << "pooled embeddings are always float32";
    }
  }
}

TEST_F(EncoderTest, NegativeHiddenLayersCountFromTheEnd) {
  const GoldenCase& c = Golden("accents");
  pb::EncodeRequest request;
  *request.add_inputs() = GoldenInput(c);
  for (int layer : {-1, -7, 2, -3}) request.add_hidden_layers(layer);
  pb::EncodeResponse response;
  grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  const pb::EncodeResult& result = response.results(0);
  ASSERT_EQ(result.hidden_states_size(), 4);
  const std::vector<int> resolved = {6, 0, 2, 4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(result.hidden_states(i).layer(), resolved[i]) << "request order, negatives resolved";
    ExpectShape(result.hidden_states(i).tensor(), {c.seq_len, kHidden}, "hidden state");
    ExpectHiddenMatchesGolden(c, resolved[i], DecodeOrFail(result.hidden_states(i).tensor()));
  }

  // Same tensors as asking with non-negative indices.
  request.clear_hidden_layers();
  for (int layer : resolved) request.add_hidden_layers(layer);
  pb::EncodeResponse positive;
  status = Encode(request, &positive);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  for (int i = 0; i < 4; ++i) {
    EXPECT_LE(MaxAbsDiff(DecodeOrFail(result.hidden_states(i).tensor()),
                         DecodeOrFail(positive.results(0).hidden_states(i).tensor())),
              1e-6);
  }
}

// Static embeddings are word + position + segment rows of the model's own embedding tables.
TEST_F(EncoderTest, StaticEmbeddingsAreTableSums) {
  auto weights = SafetensorsFile::Open(TestModelDir() + "/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto word = (*weights)->ReadFloat32("embeddings.word_embeddings.weight");
  auto position = (*weights)->ReadFloat32("embeddings.position_embeddings.weight");
  auto segment = (*weights)->ReadFloat32("embeddings.token_type_embeddings.weight");
  ASSERT_TRUE(word.ok() && position.ok() && segment.ok());

  const GoldenCase& c = Golden("text_pair");
  pb::EncodeRequest request;
  *request.add_inputs() = GoldenInput(c);
  request.set_return_static_embeddings(true);
  request.set_pooling(pb::POOLING_NONE);
  pb::EncodeResponse response;
  const grpc::Status status = Encode(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  const pb::EncodeResult& result = response.results(0);
  EXPECT_EQ(result.embedding_size(), 0) << "POOLING_NONE returns no pooled embedding";
  ExpectShape(result.static_embeddings(), {c.seq_len, kHidden}, "static_embeddings");
  const std::vector<float> values = DecodeOrFail(result.static_embeddings());
  ASSERT_EQ(values.size(), static_cast<size_t>(c.seq_len) * kHidden);
  double max_error = 0;
  for (int t = 0; t < c.seq_len; ++t) {
    const int id = result.tokens(t).id();
    const int type = result.tokens(t).type_id();
    for (int k = 0; k < kHidden; ++k) {
      const float expected = word->data()[static_cast<size_t>(id) * kHidden + k] +
                             position->data()[static_cast<size_t>(t) * kHidden + k] +
                             segment->data()[static_cast<size_t>(type) * kHidden + k];
      max_error = std::max(max_error, std::fabs(static_cast<double>(expected) -
                                                values[static_cast<size_t>(t) * kHidden + k]));
    }
  }
  EXPECT_LE(max_error, 1e-5);
}

// CLS / mean / max pooling, with and without normalisation, agree with the token embeddings.
TEST_F(EncoderTest, PoolingModesAgreeWithTokenEmbeddings) {
  const GoldenCase& c = Golden("long_english");
  auto encode = [&](pb::Pooling pooling, bool normalize, std::vector<float>* tokens) {
    pb::EncodeRequest request;
    *request.add_inputs() = GoldenInput(c);
    request.set_pooling(pooling);
    request.set_normalize(normalize);
    request.set_return_token_embeddings(true);
    pb::EncodeResponse response;
    const grpc::Status status = Encode(request, &response);
    EXPECT_TRUE(status.ok()) << pb::Pooling_Name(pooling) << ": " << StatusString(status);
    if (response.results_size() != 1) return std::vector<float>{};
    if (tokens != nullptr) *tokens = DecodeOrFail(response.results(0).token_embeddings());
    return std::vector<float>(response.results(0).embedding().begin(),
                              response.results(0).embedding().end());
  };
  std::vector<float> tokens;
  const std::vector<float> cls = encode(pb::POOLING_CLS, false, &tokens);
  ASSERT_EQ(tokens.size(), static_cast<size_t>(c.seq_len) * kHidden);
  std::vector<float> mean(kHidden, 0), max(kHidden, -INFINITY);
  for (int t = 0; t < c.seq_len; ++t) {
    for (int k = 0; k < kHidden; ++k) {
      const float v = tokens[static_cast<size_t>(t) * kHidden + k];
      mean[k] += v / c.seq_len;
      max[k] = std::max(max[k], v);
    }
  }
  auto normalized = [](std::vector<float> v) {
    const double n = Norm(v);
    for (float& x : v) x = static_cast<float>(x / n);
    return v;
  };
  EXPECT_LE(MaxAbsDiff(cls, Row(tokens, 0)), 1e-5) << "CLS = first token";
  EXPECT_LE(MaxAbsDiff(encode(pb::POOLING_MEAN, false, nullptr), mean), 1e-5);
  EXPECT_LE(MaxAbsDiff(encode(pb::POOLING_MAX, false, nullptr), max), 1e-5);
  EXPECT_LE(MaxAbsDiff(encode(pb::POOLING_CLS, true, nullptr), normalized(Row(tokens, 0))), 1e-5);
  EXPECT_LE(MaxAbsDiff(encode(pb::POOLING_MEAN, true, nullptr), normalized(mean)), 1e-5);
  // The model default is normalised mean pooling (modules.json: Pooling(mean) -> Normalize).
  EXPECT_LE(MaxAbsDiff(encode(pb::POOLING_MODEL_DEFAULT, true, nullptr), normalized(mean)), 1e-5);
}

// Pre-tokenized ids (as given, no specials added) give the same result as the text.
TEST_F(EncoderTest, TokenIdsInputEqualsText) {
  for (const char* name : {"king_queen", "text_pair"}) {
    const GoldenCase& c = Golden(name);
    pb::EncodeRequest request;
    *request.add_inputs() = GoldenInput(c);
    pb::TokenIds* ids = request.add_inputs()->mutable_tokens();
    for (int id : c.spec["input_ids"].get<std::vector<int>>()) ids->add_ids(id);
    for (int type : c.spec["token_type_ids"].get<std::vector<int>>()) ids->add_type_ids(type);
    pb::EncodeResponse response;
    const grpc::Status status = Encode(request, &response);
    ASSERT_TRUE(status.ok()) << name << ": " << StatusString(status);
    ASSERT_EQ(response.results_size(), 2);
    const pb::EncodeResult& from_ids = response.results(1);
    ASSERT_EQ(from_ids.tokens_size(), c.seq_len) << name;
    for (int t = 0; t < c.seq_len; ++t) {
      EXPECT_EQ(from_ids.tokens(t).id(), c.spec["input_ids"][t].get<int>());
      EXPECT_EQ(from_ids.tokens(t).type_id(), c.spec["token_type_ids"][t].get<int>());
    }
    const std::vector<float> a(response.results(0).embedding().begin(),
                               response.results(0).embedding().end());
    const std::vector<float> b(from_ids.embedding().begin(), from_ids.embedding().end());
    EXPECT_GE(Cosine(b, c.pooled), kPooledMinCosine) << name;
    EXPECT_LE(MaxAbsDiff(a, b), 1e-5) << name;
  }
}

// --precision bf16 on the real server: served (GetModelInfo and attnserve_model_info say
// bfloat16) where the CPU has bf16 instructions; elsewhere refused at start with exit code 2 and
// a message naming the way out, unless --allow-slow-precision. Either way the pooled embeddings
// of the golden cases stay within cosine 0.999 of Hugging Face's.
TEST(PrecisionFlagTest, Bf16IsServedOrRefusedAsTheCpuAllows) {
  const bool native = CpuHasNativeBf16();
  std::string error;
  if (!native) {
    ServerProcess refused({"--precision=bf16"});
    ASSERT_TRUE(refused.Start(&error)) << error;
    int wait_status = 0;
    ASSERT_TRUE(refused.process().WaitExit(ScaledSeconds(60), &wait_status))
        << "the server did not refuse --precision bf16 on a CPU without bf16";
    EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 2)
        << refused.process().ExitDescription();
    const std::string log = refused.process().LogTail();
    EXPECT_NE(log.find("--allow-slow-precision"), std::string::npos) << log;
    EXPECT_NE(log.find("bfloat16"), std::string::npos) << log;
  }
  std::vector<std::string> flags = {"--precision=bf16"};
  if (!native) flags.push_back("--allow-slow-precision");
  ServerProcess server(flags);
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
  auto stub = server.NewStub();
  grpc::ClientContext info_context;
  pb::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&info_context, pb::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.precision(), "bfloat16");
  EXPECT_EQ(ScrapeOrFail(server).Sum("attnserve_model_info", {{"precision", "bfloat16"}}), 1);

  const std::vector<const GoldenCase*> cases = RightTruncated512Cases();
  pb::EncodeRequest request;
  for (const GoldenCase* c : cases) *request.add_inputs() = GoldenInput(*c);
  *request.mutable_tokenization() = GoldenTokenization(*cases[0]);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
  pb::EncodeResponse response;
  const grpc::Status status = stub->Encode(&context, request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(cases.size()));
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& embedding = response.results(static_cast<int>(i)).embedding();
    const std::vector<float> pooled(embedding.begin(), embedding.end());
    EXPECT_GE(Cosine(pooled, cases[i]->pooled), 0.999) << cases[i]->name;
  }
}

// --precision auto picks bfloat16 exactly where the CPU has it, and never needs the override.
TEST(PrecisionFlagTest, AutoPicksBf16OnlyWhereTheCpuHasIt) {
  ServerProcess server({"--precision=auto"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
  grpc::ClientContext context;
  pb::ModelInfo info;
  ASSERT_TRUE(server.NewStub()->GetModelInfo(&context, pb::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.precision(), CpuHasNativeBf16() ? "bfloat16" : "float32");
}

}  // namespace
}  // namespace attn::integration
