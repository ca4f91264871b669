// The cost model (server/core/cost_model.h) against what serving a request really takes, on a
// sweep of Encode and AttentionMap shapes with the real model.
//
// Each request goes the server's way: PrepareEncode/PrepareAttention, the Batcher (the engine
// forward), the server's response builders, and gRPC's serialisation into a ByteBuffer.
//   response bytes: the serialised ByteBuffer's length (== ByteSizeLong), against the estimate
//   working memory: the high-water mark of live heap bytes above the level before the request
//     was submitted. This binary counts every malloc/calloc/realloc/memalign/free of the
//     process (it interposes them and tracks malloc_usable_size), so the figure is what was
//     really allocated, in every thread (OpenMP workers included), not a sum of tensor sizes.
// Each shape is served twice and the second call measured: the first one grows the engine's
// per-thread workspace and oneDNN's primitive cache for that shape, which live as long as the
// server (the workspace is reserved from the budget once, see EngineWorkspaceBytes).
// Both figures must agree with the estimate within 10%.
#include "server/core/cost_model.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "server/core/batcher.h"
#include "server/core/request_plan.h"
#include "server/core/results.h"
#include "server/metrics.h"
#include "server/proto_convert.h"

// GCC says __SANITIZE_*__; clang 14 only answers __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTN_SANITIZER_MALLOC 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(ATTN_SANITIZER_MALLOC)
#define ATTN_COUNTING_MALLOC 0  // the sanitizers own malloc
#else
#define ATTN_COUNTING_MALLOC 1
#endif

#if ATTN_COUNTING_MALLOC
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void Allocated(void* p) {
  if (p == nullptr) return;
  const int64_t live = g_live.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
}
void Freed(void* p) {
  if (p != nullptr) g_live.fetch_sub(malloc_usable_size(p));
}
}  // namespace

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  Allocated(p);
  return p;
}
void free(void* p) {
  Freed(p);
  __libc_free(p);
}
void* calloc(size_t count, size_t n) {
  void* p = __libc_calloc(count, n);
  Allocated(p);
  return p;
}
void* realloc(void* old, size_t n) {
  Freed(old);
  void* p = __libc_realloc(old, n);
  Allocated(p != nullptr ? p : (n == 0 ? nullptr : old));
  return p;
}
void* memalign(size_t alignment, size_t n) {
  void* p = __libc_memalign(alignment, n);
  Allocated(p);
  return p;
}
void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }
int posix_memalign(void** out, size_t alignment, size_t n) {
  *out = memalign(alignment, n);
  return *out == nullptr ? 12 /* ENOMEM */ : 0;
}
void* valloc(size_t n) { return memalign(4096, n); }
}
#endif

namespace attn::server {
namespace {

namespace v1 = attnserve::v1;
using core::AttentionPlan;
using core::EncodePlan;
using core::EstimateCost;

// The server's response build: the core's per-sequence results (server/core/results.h), then
// the protobuf message (server/proto_convert.h).
std::shared_ptr<const Model> TestModel();

template <typename CoreResponse, typename Plan, typename Proto, typename BuildCore>
void BuildProto(const Model& model, Plan& plan, JobOutput& output, Proto* proto,
                BuildCore build_core) {
  CoreResponse response;
  response.model = TestModel();
  response.dtype = plan.dtype;
  if constexpr (std::is_same_v<CoreResponse, core::AttentionResponse>) response.heads = plan.heads;
  build_core(model, plan, output, &response.results);
  response.model_version = "base";
  ToProto(response, proto);
}

void BuildEncodeResults(const Model& model, EncodePlan& plan, JobOutput& output,
                        v1::EncodeResponse* proto) {
  BuildProto<core::EncodeResponse>(model, plan, output, proto, core::BuildEncodeResults);
}

void BuildAttentionResults(const Model& model, AttentionPlan& plan, JobOutput& output,
                           v1::AttentionMapResponse* proto) {
  BuildProto<core::AttentionResponse>(model, plan, output, proto, core::BuildAttentionResults);
}

#if ATTN_COUNTING_MALLOC
int64_t LiveBytes() { return g_live.load(); }
void ResetPeak() { g_peak.store(g_live.load()); }
int64_t PeakBytes() { return g_peak.load(); }
#else
int64_t LiveBytes() { return 0; }
void ResetPeak() {}
int64_t PeakBytes() { return 0; }
#endif

std::shared_ptr<const Model> TestModel() {
  static std::shared_ptr<const Model> model = [] {
    auto loaded = Model::Load(ATTN_TEST_MODEL_DIR, ModelOptions{});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : nullptr;
  }();
  return model;
}

// A text of about `tokens` WordPiece tokens ([CLS] and [SEP] included).
std::string Text(int tokens, int seed) {
  static const char* kWords[] = {"river", "stone", "light", "market", "garden", "window",
                                 "music", "paper", "cloud", "table",  "winter", "engine"};
  std::string text;
  for (int i = 0; i < tokens - 2; ++i) {
    if (i > 0) text += ' ';
    text += kWords[(i * 7 + seed * 13) % 12];
  }
  return text;
}

template <typename Request>
void AddInputs(Request* request, int inputs, int tokens) {
  for (int i = 0; i < inputs; ++i) request->add_inputs()->set_text(Text(tokens, i));
  request->mutable_tokenization()->set_max_length(512);
}

struct Measured {
  RequestCost estimate;
  int64_t response_bytes = 0;
  int64_t working_bytes = 0;
};

// Serves one planned request as the server does and measures it (see the file comment).
template <typename Plan, typename Response>
Measured Serve(Batcher* batcher, Plan plan,
               void (*build)(const Model&, Plan&, JobOutput&, Response*)) {
  const std::shared_ptr<const Model> model = TestModel();
  Measured m;
  m.estimate = EstimateCost(*model, plan, 4);  // version "base"
  Response response;
  grpc::ByteBuffer bytes;
  // The previous call's batch may still be being freed on the batcher thread: wait until the
  // heap level holds still.
  int64_t before = LiveBytes();
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int64_t now = LiveBytes();
    if (now == before) break;
    before = now;
  }
  ResetPeak();
  auto job = std::make_shared<Job>();
  job->model = model;
  job->sequences = plan.inputs.sequences;
  job->forward = plan.forward;
  std::promise<void> done;
  job->done = [&](absl::Status status, JobOutput output) {
    EXPECT_TRUE(status.ok()) << status;
    response.set_model_version("base");
    build(*model, plan, output, &response);
    bool own_buffer = false;
    EXPECT_TRUE(grpc::SerializationTraits<Response>::Serialize(response, &bytes, &own_buffer).ok());
    m.working_bytes = PeakBytes() - before;
    done.set_value();
  };
  EXPECT_TRUE(batcher->Submit(std::move(job)).ok());
  done.get_future().wait();
  m.response_bytes = static_cast<int64_t>(bytes.Length());
  return m;
}

// The cost of a planned request estimated before tokenizing (from the lower-bound encodings
// the server checks first, request_plan.h) and after.
struct Bounds {
  RequestCost lower, estimate;
};

template <typename Plan, typename Request, typename Prepare>
Bounds EstimateBounds(const Request& request, Prepare prepare) {
  Bounds bounds;
  const core::LowerBoundCheck<Plan> check = [&](const Plan& lower_bound) {
    bounds.lower = core::EstimateCost(*TestModel(), lower_bound, 4);
    return absl::OkStatus();
  };
  absl::StatusOr<Plan> plan = prepare(*TestModel(), ToCore(request), {256}, check);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) bounds.estimate = core::EstimateCost(*TestModel(), *plan, 4);
  return bounds;
}

struct Shape {
  std::string name;
  std::function<Measured(Batcher*)> serve;
  std::function<Bounds()> bounds;
};

Shape EncodeShape(std::string name, int inputs, int tokens,
                  const std::function<void(v1::EncodeRequest*)>& options) {
  return {name + " " + std::to_string(inputs) + "x" + std::to_string(tokens),
          [=](Batcher* batcher) {
            v1::EncodeRequest request;
            AddInputs(&request, inputs, tokens);
            options(&request);
            absl::StatusOr<EncodePlan> plan =
                core::PrepareEncode(*TestModel(), ToCore(request), {256});
            EXPECT_TRUE(plan.ok()) << plan.status();
            return Serve<EncodePlan, v1::EncodeResponse>(batcher, *plan, BuildEncodeResults);
          },
          [=] {
            v1::EncodeRequest request;
            AddInputs(&request, inputs, tokens);
            options(&request);
            return EstimateBounds<EncodePlan>(request, core::PrepareEncode);
          }};
}

Shape AttentionShape(std::string name, int inputs, int tokens,
                     const std::function<void(v1::AttentionMapRequest*)>& options) {
  return {name + " " + std::to_string(inputs) + "x" + std::to_string(tokens),
          [=](Batcher* batcher) {
            v1::AttentionMapRequest request;
            AddInputs(&request, inputs, tokens);
            options(&request);
            absl::StatusOr<AttentionPlan> plan =
                core::PrepareAttention(*TestModel(), ToCore(request), {256});
            EXPECT_TRUE(plan.ok()) << plan.status();
            return Serve<AttentionPlan, v1::AttentionMapResponse>(batcher, *plan,
                                                                  BuildAttentionResults);
          },
          [=] {
            v1::AttentionMapRequest request;
            AddInputs(&request, inputs, tokens);
            options(&request);
            return EstimateBounds<AttentionPlan>(request, core::PrepareAttention);
          }};
}

std::vector<Shape> Sweep() {
  std::vector<Shape> shapes;
  for (auto [inputs, tokens] : {std::pair{1, 16}, {8, 128}, {16, 256}}) {
    shapes.push_back(EncodeShape("pooled", inputs, tokens, [](v1::EncodeRequest*) {}));
    shapes.push_back(
        EncodeShape("pooled+token_embeddings", inputs, tokens,
                    [](v1::EncodeRequest* r) { r->set_return_token_embeddings(true); }));
    shapes.push_back(
        EncodeShape("all hidden layers fp16", inputs, tokens, [](v1::EncodeRequest* r) {
          for (int l = 0; l <= 6; ++l) r->add_hidden_layers(l);
          r->set_output_dtype(v1::FLOAT16);
        }));
    shapes.push_back(
        EncodeShape("static+token bf16, no pooling", inputs, tokens, [](v1::EncodeRequest* r) {
          r->set_pooling(v1::POOLING_NONE);
          r->set_return_static_embeddings(true);
          r->set_return_token_embeddings(true);
          r->set_output_dtype(v1::BFLOAT16);
        }));
    shapes.push_back(EncodeShape("hidden layers 0,3", inputs, tokens, [](v1::EncodeRequest* r) {
      r->add_hidden_layers(0);
      r->add_hidden_layers(3);
    }));
  }
  for (auto [inputs, tokens] : {std::pair{1, 32}, {2, 128}, {2, 256}}) {
    shapes.push_back(AttentionShape("weights", inputs, tokens, [](v1::AttentionMapRequest*) {}));
    shapes.push_back(AttentionShape("weights fp16 layers 0,5 heads 0,5,11", inputs, tokens,
                                    [](v1::AttentionMapRequest* r) {
                                      r->add_layers(0);
                                      r->add_layers(5);
                                      for (int h : {0, 5, 11}) r->add_heads(h);
                                      r->set_output_dtype(v1::FLOAT16);
                                    }));
    shapes.push_back(AttentionShape("scores+qkv", inputs, tokens, [](v1::AttentionMapRequest* r) {
      r->set_include_scores(true);
      r->set_include_qkv(true);
    }));
    shapes.push_back(
        AttentionShape("mean over heads only", inputs, tokens, [](v1::AttentionMapRequest* r) {
          r->set_include_weights(false);
          r->set_mean_over_heads(true);
        }));
    shapes.push_back(
        AttentionShape("rollout only, layer 5", inputs, tokens, [](v1::AttentionMapRequest* r) {
          r->add_layers(5);
          r->set_include_weights(false);
          r->set_rollout(true);
        }));
    shapes.push_back(AttentionShape("top_k 5", inputs, tokens,
                                    [](v1::AttentionMapRequest* r) { r->set_top_k(5); }));
    shapes.push_back(
        AttentionShape("top_k 8 heads 1,2 fp16", inputs, tokens, [](v1::AttentionMapRequest* r) {
          r->set_top_k(8);
          r->add_heads(1);
          r->add_heads(2);
          r->set_output_dtype(v1::FLOAT16);
        }));
  }
  return shapes;
}

// Sanitizer builds own malloc, so there is nothing to count: the sweep exists only in
// ordinary builds (a skip would be reported as a failure by the test policy).
#if ATTN_COUNTING_MALLOC
TEST(CostModelTest, EstimatesAgreeWithMeasuredWithinTenPercent) {
  ASSERT_NE(TestModel(), nullptr);
  Metrics metrics;
  Batcher batcher({8192, 256, 0}, metrics.ForModel("test"));
  std::printf("%-44s %12s %12s %7s %12s %12s %7s\n", "shape", "resp est", "resp actual", "ratio",
              "mem est", "mem actual", "ratio");
  for (const Shape& shape : Sweep()) {
    shape.serve(&batcher);  // warm-up: workspace and primitive cache for this shape
    const Measured m = shape.serve(&batcher);
    const double response_ratio =
        static_cast<double>(m.estimate.response_bytes) / static_cast<double>(m.response_bytes);
    const double memory_ratio =
        static_cast<double>(m.estimate.working_bytes) / static_cast<double>(m.working_bytes);
    std::printf("%-44s %12ld %12ld %7.3f %12ld %12ld %7.3f\n", shape.name.c_str(),
                static_cast<long>(m.estimate.response_bytes), static_cast<long>(m.response_bytes),
                response_ratio, static_cast<long>(m.estimate.working_bytes),
                static_cast<long>(m.working_bytes), memory_ratio);
    EXPECT_NEAR(response_ratio, 1.0, 0.10) << shape.name << ": response bytes";
    EXPECT_NEAR(memory_ratio, 1.0, 0.10) << shape.name << ": working memory";
  }
}
#endif  // ATTN_COUNTING_MALLOC

// The cost from the lower-bound encodings (checked before tokenizing) never exceeds the
// estimate from the tokens, or a call the server can afford would be refused; and on ordinary
// English text it is close enough to refuse the calls far over a limit without tokenizing.
TEST(CostModelTest, LowerBoundBeforeTokenizingIsBelowTheEstimateAndUseful) {
  ASSERT_NE(TestModel(), nullptr);
  double lowest = 1;
  for (const Shape& shape : Sweep()) {
    const Bounds b = shape.bounds();
    lowest = std::min(lowest, static_cast<double>(b.lower.working_bytes) /
                                  static_cast<double>(b.estimate.working_bytes));
    EXPECT_LE(b.lower.response_bytes, b.estimate.response_bytes) << shape.name;
    EXPECT_LE(b.lower.working_bytes, b.estimate.working_bytes) << shape.name;
    EXPECT_GT(b.lower.working_bytes, b.estimate.working_bytes / 2) << shape.name;
  }
  std::printf("lower bound / estimate of working memory: at least %.3f\n", lowest);
}

// MinTokensOf is a lower bound of what the tokenizer makes of texts built to break it: words
// that normalisation empties (combining marks, zero-width and control characters), CJK
// (one token per character), punctuation runs, over-long words, non-ASCII spaces.
TEST(CostModelTest, MinTokensOfNeverExceedsTheTokenizersCount) {
  ASSERT_NE(TestModel(), nullptr);
  const std::vector<std::string> texts = {
      "plain words here",
      "\u0301\u0301 \u200b\u200b a\u0301 \u0007\u0008 b",
      "\u4e2d\u6587 \u5b57",
      "!!! ... ,,, x",
      std::string(300, 'a') + " " + std::string(5, 'b'),
      "a\u00a0b\u2003c d",
      "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m",
      "[CLS] [SEP] [MASK] word",
      "\t\n\r\v\f",
      "",
  };
  TruncationOptions no_truncation;
  no_truncation.enabled = false;
  for (const std::string& text : texts) {
    absl::StatusOr<Encoding> encoding = TestModel()->tokenizer().Encode(text, no_truncation);
    ASSERT_TRUE(encoding.ok()) << encoding.status();
    EXPECT_LE(core::MinTokensOf(text), encoding->size() - 2) << text;
  }
  EXPECT_EQ(core::MinTokensOf("one two  three\tfour\nfive"), 5);
}

// The refusal messages name the figure, the limit, the flag and what to change.
TEST(CostModelTest, RefusalsNameFigureLimitAndRemedy) {
  std::string limit;
  absl::Status status = CheckRequestCost({2'000'000, 10}, 1'000'000, 100, &limit);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(limit, "message");
  for (const char* part : {"2000000", "1000000", "--max-message-bytes", "top_k", "FLOAT16"}) {
    EXPECT_NE(status.message().find(part), std::string::npos) << part << ": " << status;
  }
  status = CheckRequestCost({10, 5'000}, 1'000'000, 1'000, &limit);
  EXPECT_EQ(limit, "request");
  for (const char* part : {"5000", "1000", "--max-request-memory-bytes", "fewer inputs"}) {
    EXPECT_NE(status.message().find(part), std::string::npos) << part << ": " << status;
  }
  EXPECT_TRUE(CheckRequestCost({10, 10}, 100, 100, &limit).ok());
}

// Light calls may use the whole budget, heavy ones three quarters; what does not fit is refused
// at once and fits again once released.
TEST(CostModelTest, BudgetKeepsRoomForLightCalls) {
  MemoryBudget budget(1600);
  EXPECT_TRUE(budget.Acquire(600).ok());  // heavy (> 100)
  EXPECT_TRUE(budget.Acquire(600).ok());  // 1200 = three quarters
  EXPECT_EQ(budget.Acquire(200).code(), absl::StatusCode::kResourceExhausted);  // heavy, no room
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(budget.Acquire(100).ok()) << i;       // light: the rest
  EXPECT_EQ(budget.Acquire(1).code(), absl::StatusCode::kResourceExhausted) << "over budget";
  EXPECT_EQ(budget.in_flight(), 1600);
  budget.Release(600);
  EXPECT_TRUE(budget.Acquire(200).ok());
  EXPECT_EQ(budget.Acquire(1300).code(), absl::StatusCode::kResourceExhausted)
      << "more than a call may ever take";
  budget.Reserve(600);
  EXPECT_EQ(budget.budget(), 1000);
}

// The cgroup limit, when there is one, bounds the physical memory figure.
TEST(CostModelTest, MemoryLimitIsPositiveAndAtMostPhysical) {
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  EXPECT_GT(MemoryLimitBytes(), 0);
  EXPECT_LE(MemoryLimitBytes(), physical);
  EXPECT_EQ(DefaultMemoryBudgetBytes(), MemoryLimitBytes() / 2);
}
}  // namespace
}  // namespace attn::server
