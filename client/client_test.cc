// EncoderClient, TrainerClient and attnctl against in-process fake Encoder and Trainer servers
// (real gRPC over loopback, real grpc++ built-in health service): status mapping, deadlines,
// unreachable servers, the grpc.health.v1 wire contract, the bearer token, the FineTune stream
// protocol, fine-tuning data files, and every attnctl command's request building, output and
// exit codes. The real server's behaviour is covered by tests/integration.
#include "client/client.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/tensor_decode.h"
#include "client/training_data.h"
#include "engine/training/epoch_order.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tests/time_scale.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined by the build"
#endif

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;

constexpr int kLayers = 6;
constexpr int kHeads = 12;
constexpr int kHidden = 8;  // hidden-state width of the fake (the pooled embedding has 384)

// Float -> half by search: fine for a test that encodes a few exactly representable values.
uint16_t ExactHalf(float f) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    if (HalfToFloat(static_cast<uint16_t>(bits)) == f) return static_cast<uint16_t>(bits);
  }
  ADD_FAILURE() << f << " is not a half";
  return 0;
}

v1::Tensor EncodeTensor(const std::vector<int64_t>& shape, const std::vector<float>& values,
                        v1::DType dtype) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(dtype == v1::DTYPE_UNSPECIFIED ? v1::FLOAT32 : dtype);
  std::string bytes;
  for (float f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (t.dtype() == v1::FLOAT32) {
      for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
    } else {
      const uint16_t h = t.dtype() == v1::BFLOAT16 ? static_cast<uint16_t>(u >> 16) : ExactHalf(f);
      bytes.push_back(static_cast<char>(h & 0xFF));
      bytes.push_back(static_cast<char>(h >> 8));
    }
  }
  t.set_data(bytes);
  return t;
}

// Whitespace tokenizer with [CLS]/[SEP] and ASCII char offsets: enough structure to check the
// client's handling of tokens, pairs and offsets.
void AppendWords(const std::string& text, int source,
                 google::protobuf::RepeatedPtrField<v1::Token>* out) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    const size_t start = i;
    while (i < text.size() && text[i] != ' ') ++i;
    if (i == start) break;
    v1::Token* t = out->Add();
    t->set_text(absl::AsciiStrToLower(text.substr(start, i - start)));
    t->set_id(1000 + static_cast<int>(t->text().size()));
    t->set_char_start(static_cast<int>(start));
    t->set_char_end(static_cast<int>(i));
    t->set_byte_start(static_cast<int>(start));
    t->set_byte_end(static_cast<int>(i));
    t->set_type_id(source);
    t->set_source(source);
  }
}

void AppendSpecial(const char* text, int id, int type_id,
                   google::protobuf::RepeatedPtrField<v1::Token>* out) {
  v1::Token* t = out->Add();
  t->set_text(text);
  t->set_id(id);
  t->set_type_id(type_id);
  t->set_special(true);
  t->set_source(-1);
}

google::protobuf::RepeatedPtrField<v1::Token> FakeTokenize(const v1::Input& input) {
  google::protobuf::RepeatedPtrField<v1::Token> tokens;
  AppendSpecial("[CLS]", 101, 0, &tokens);
  if (input.has_pair()) {
    AppendWords(input.pair().first(), 0, &tokens);
    AppendSpecial("[SEP]", 102, 0, &tokens);
    AppendWords(input.pair().second(), 1, &tokens);
    AppendSpecial("[SEP]", 102, 1, &tokens);
  } else {
    AppendWords(input.text(), 0, &tokens);
    AppendSpecial("[SEP]", 102, 0, &tokens);
  }
  return tokens;
}

class FakeEncoder final : public v1::Encoder::Service {
 public:
  // Every RPC fails with this status when it is not OK.
  void FailWith(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(status);
    fail_times_ = -1;
  }
  // The next `times` RPCs fail with `status`, the ones after succeed.
  void FailTimes(grpc::Status status, int times) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(status);
    fail_times_ = times;
  }
  // RPCs received (each retry attempt counts).
  int attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }
  void SetDelay(std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_ = delay;
  }
  v1::EncodeRequest last_encode() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_encode_;
  }
  v1::ExplainRequest last_explain() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_explain_;
  }
  v1::RerankRequest last_rerank() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_rerank_;
  }
  int encode_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return encode_calls_;
  }
  static constexpr int kMaxInputsPerRequest = 3;
  v1::AttentionMapRequest last_attention() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_attention_;
  }
  v1::TokenizeRequest last_tokenize() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_tokenize_;
  }

  grpc::Status Encode(grpc::ServerContext*, const v1::EncodeRequest* request,
                      v1::EncodeResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_encode_ = *request;
      ++encode_calls_;
    }
    for (const v1::Input& input : request->inputs()) {
      v1::EncodeResult* r = response->add_results();
      *r->mutable_tokens() = FakeTokenize(input);
      const int t = r->tokens_size();
      if (request->pooling() != v1::POOLING_NONE) {
        // A unit vector: 384 equal components.
        for (int k = 0; k < 384; ++k) r->add_embedding((k % 2 ? -1.0f : 1.0f) / std::sqrt(384.0f));
      }
      for (int layer : request->hidden_layers()) {
        const int resolved = layer < 0 ? kLayers + 1 + layer : layer;
        std::vector<float> values;
        for (int i = 0; i < t * kHidden; ++i) values.push_back(0.25f * (i % 16) - 1.0f);
        v1::LayerTensor* lt = r->add_hidden_states();
        lt->set_layer(resolved);
        *lt->mutable_tensor() = EncodeTensor({t, kHidden}, values, request->output_dtype());
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status AttentionMap(grpc::ServerContext*, const v1::AttentionMapRequest* request,
                            v1::AttentionMapResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_attention_ = *request;
    }
    std::vector<int> heads(request->heads().begin(), request->heads().end());
    if (heads.empty()) {
      for (int h = 0; h < kHeads; ++h) heads.push_back(h);
    }
    for (const v1::Input& input : request->inputs()) {
      v1::AttentionResult* r = response->add_results();
      *r->mutable_tokens() = FakeTokenize(input);
      const int t = r->tokens_size();
      // Head h's row i puts 0.5 on token (i + h) % T, the rest spread evenly.
      auto weight = [t](int h, int i, int j) { return j == (i + h) % t ? 0.5f : 0.5f / (t - 1); };
      for (int layer : request->layers()) {
        v1::LayerAttention* la = r->add_layers();
        la->set_layer(layer < 0 ? kLayers + layer : layer);
        std::vector<float> w, mean(static_cast<size_t>(t) * t, 0.0f);
        for (int h : heads) {
          la->add_heads(h);
          for (int i = 0; i < t; ++i) {
            for (int j = 0; j < t; ++j) w.push_back(weight(h, i, j));
          }
        }
        for (int h = 0; h < kHeads; ++h) {
          for (int i = 0; i < t; ++i) {
            for (int j = 0; j < t; ++j) mean[i * t + j] += weight(h, i, j) / kHeads;
          }
        }
        if (!request->has_include_weights() || request->include_weights()) {
          *la->mutable_weights() =
              EncodeTensor({static_cast<int64_t>(heads.size()), t, t}, w, request->output_dtype());
        }
        if (request->mean_over_heads()) {
          *la->mutable_mean_weights() = EncodeTensor({t, t}, mean, v1::FLOAT32);
        }
      }
      if (request->rollout()) {
        std::vector<float> rollout(static_cast<size_t>(t) * t, 0.0f);
        for (int i = 0; i < t; ++i) {
          for (int j = 0; j <= i; ++j) rollout[i * t + j] = 1.0f / (i + 1);
        }
        *r->mutable_rollout() = EncodeTensor({t, t}, rollout, v1::FLOAT32);
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_tokenize_ = *request;
    }
    for (const v1::Input& input : request->inputs()) {
      *response->add_results()->mutable_tokens() = FakeTokenize(input);
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  // One result per document: integrated gradients 0.1 x (token index) per text (or gradient x
  // input 0.05 x index for ATTRIBUTION_GRADIENT_X_INPUT), and for pairwise a matrix whose largest
  // cell pairs the query's and the document's second tokens.
  grpc::Status Explain(grpc::ServerContext*, const v1::ExplainRequest* request,
                       v1::ExplainResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_explain_ = *request;
    }
    v1::Input query;
    query.set_text(request->query());
    for (const std::string& document : request->documents()) {
      v1::ExplainResult* r = response->add_results();
      v1::Input input;
      input.set_text(document);
      *r->mutable_query_tokens() = FakeTokenize(query);
      *r->mutable_document_tokens() = FakeTokenize(input);
      const int tq = r->query_tokens_size(), td = r->document_tokens_size();
      const bool gxi = request->method() == v1::ATTRIBUTION_GRADIENT_X_INPUT;
      for (int i = 0; i < tq; ++i) {
        if (gxi) {
          r->mutable_query()->add_gradient_x_input(0.05f * i);
        } else {
          r->mutable_query()->add_integrated_gradients(0.1f * i);
        }
      }
      for (int j = 0; j < td; ++j) {
        if (gxi) {
          r->mutable_document()->add_gradient_x_input(0.05f * j);
        } else {
          r->mutable_document()->add_integrated_gradients(0.1f * j);
        }
      }
      r->set_similarity(0.75f);
      r->set_completeness_error(0.002f);
      if (request->method() == v1::ATTRIBUTION_PAIRWISE ||
          request->method() == v1::ATTRIBUTION_METHOD_UNSPECIFIED) {
        std::vector<float> cells(tq * td, 0.01f);
        cells[1 * td + 1] = 0.5f;
        *r->mutable_pair_matrix() = EncodeTensor({tq, td}, cells, v1::FLOAT32);
        r->set_attribution_sum(0.74f);
        r->set_completeness_target(0.742f);
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->documents_size() + 1);
    return grpc::Status::OK;
  }

  // Two labels per input, "spam" first; documents scored 1 / (1 + index), so the last comes
  // last.
  grpc::Status Classify(grpc::ServerContext*, const v1::ClassifyRequest* request,
                        v1::ClassifyResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    for (int i = 0; i < request->inputs_size(); ++i) {
      v1::ClassifyResult* result = response->add_results();
      for (const auto& [label, name, p] : {std::tuple{1, "spam", 0.75f}, {0, "ham", 0.25f}}) {
        v1::LabelScore* score = result->add_labels();
        score->set_label(label);
        score->set_name(name);
        score->set_probability(p);
      }
    }
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->inputs_size());
    return grpc::Status::OK;
  }

  grpc::Status Rerank(grpc::ServerContext*, const v1::RerankRequest* request,
                      v1::RerankResponse* response) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_rerank_ = *request;
    }
    const int n = request->top_n() > 0 ? std::min(request->top_n(), request->documents_size())
                                       : request->documents_size();
    for (int i = 0; i < n; ++i) {
      v1::RerankResult* result = response->add_results();
      result->set_index(i);
      result->set_score(1.0f / (1 + i));
    }
    response->set_method(request->method() == v1::RERANK_CROSS_ENCODER ? v1::RERANK_CROSS_ENCODER
                                                                       : v1::RERANK_COSINE);
    FillMetadata(request->model_version(), response->mutable_model_version(),
                 response->mutable_metadata(), request->documents_size() + 1);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* info) override {
    if (grpc::Status s = Prologue(); !s.ok()) return s;
    if (!request->model_version().empty() && request->model_version() != "v1" &&
        request->model_version() != "v2") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("unknown model version '", request->model_version(), "'"));
    }
    info->set_architecture("BertModel");
    info->set_model_type("bert");
    info->set_hidden_size(384);
    info->set_num_layers(kLayers);
    info->set_num_heads(kHeads);
    info->set_head_dim(32);
    info->set_intermediate_size(1536);
    info->set_vocab_size(30522);
    info->set_type_vocab_size(2);
    info->set_max_position_embeddings(512);
    info->set_default_max_length(256);
    info->set_default_pooling("mean");
    info->set_default_normalize(true);
    info->set_parameter_count(22713216);
    info->set_precision("float32");
    info->set_version(request->model_version().empty() ? "v1" : request->model_version());
    info->set_version_origin("/models/all-MiniLM-L6-v2");
    info->add_available_versions("v1");
    info->set_max_inputs_per_request(kMaxInputsPerRequest);
    info->add_available_versions("v2");
    return grpc::Status::OK;
  }

 private:
  grpc::Status Prologue() {
    std::chrono::milliseconds delay;
    grpc::Status fail;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++attempts_;
      delay = delay_;
      if (fail_times_ != 0) fail = fail_;
      if (fail_times_ > 0) --fail_times_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    return fail;
  }

  static void FillMetadata(const std::string& requested_version, std::string* version,
                           v1::ResponseMetadata* metadata, int inputs) {
    *version = requested_version.empty() ? "v1" : requested_version;
    metadata->set_total_ms(1.5);
    metadata->set_inference_ms(1.0);
    metadata->set_batch_inputs(inputs);
  }

  std::mutex mu_;
  grpc::Status fail_;
  int fail_times_ = -1;  // -1: every RPC
  int attempts_ = 0;
  std::chrono::milliseconds delay_{0};
  v1::EncodeRequest last_encode_;
  int encode_calls_ = 0;
  v1::ExplainRequest last_explain_;
  v1::RerankRequest last_rerank_;
  v1::AttentionMapRequest last_attention_;
  v1::TokenizeRequest last_tokenize_;
};

constexpr char kToken[] = "s3cret-token";

// The Trainer as the real server speaks it (see server/trainer_service.cc): bearer token first;
// config, then one progress message per batch; commit or abort ends with a final message and
// OK; a half-close without either is CANCELLED. Records what the client sent.
class FakeTrainer final : public v1::Trainer::Service {
 public:
  struct Job {
    std::string authorization;  // the metadata as received ("" = none)
    v1::FineTuneConfig config;
    std::vector<v1::TrainingBatch> batches;
    bool committed = false;
    bool aborted = false;
    v1::CommitRequest commit;
    bool ended = false;
    grpc::Status status;
  };

  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
    promoted_.clear();
    unavailable_left_ = 0;
    list_calls_ = 0;
    fail_at_batch_ = 0;
    step_delay_ = std::chrono::milliseconds(0);
    serving_ = "ft-000002-20261122T041900Z";
    versions_ = {{"base", "loaded from /models/all-MiniLM-L6-v2", "2026-11-22T04:00:00Z", ""},
                 {"ft-000001-20261122T041000Z", "fine-tuned from base (contrastive, 12 steps)",
                  "2026-11-22T04:10:00Z", ""},
                 {"ft-000002-20261122T041900Z",
                  "fine-tuned from ft-000001-20261122T041000Z (classification, 40 steps)",
                  "2026-11-22T04:19:00Z", "support intents"}};
  }
  // ListVersions and Promote answer UNAVAILABLE the next `times` times (a draining replica).
  void AnswerUnavailable(int times) {
    std::lock_guard<std::mutex> lock(mu_);
    unavailable_left_ = times;
  }
  int list_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return list_calls_;
  }
  // Batch n (1-based) fails with INVALID_ARGUMENT.
  void FailAtBatch(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_at_batch_ = n;
  }
  void SetStepDelay(std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    step_delay_ = delay;
  }
  std::vector<Job> jobs() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Job> jobs;
    for (const auto& job : jobs_) jobs.push_back(*job);
    return jobs;
  }
  size_t batches_received() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.empty() ? 0 : jobs_.back()->batches.size();
  }
  // Waits until the last job has ended (the handler returned); false after `timeout`.
  bool WaitForJobEnd(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!jobs_.empty() && jobs_.back()->ended) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  grpc::Status FineTune(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::FineTuneProgress, v1::FineTuneRequest>* stream) override {
    // Shared, so a Reset() while a handler still runs (a cancelled client) is harmless.
    auto job = std::make_shared<Job>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
    }
    grpc::Status status = RunJob(context, stream, job.get());
    std::lock_guard<std::mutex> lock(mu_);
    job->ended = true;
    job->status = status;
    return status;
  }

  grpc::Status ListVersions(grpc::ServerContext* context, const v1::ListVersionsRequest*,
                            v1::ListVersionsResponse* response) override {
    if (grpc::Status s = Authorize(*context, nullptr); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    ++list_calls_;
    if (unavailable_left_ > 0) {
      --unavailable_left_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining");
    }
    Fill(response);
    return grpc::Status::OK;
  }

  grpc::Status Rollback(grpc::ServerContext* context, const v1::RollbackRequest* request,
                        v1::ListVersionsResponse* response) override {
    if (grpc::Status s = Authorize(*context, nullptr); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    size_t current = 0;
    while (current < versions_.size() && versions_[current].version != serving_) ++current;
    if (request->version().empty()) {
      if (current == 0) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no version before " + serving_);
      }
      serving_ = versions_[current - 1].version;
    } else {
      if (!Known(request->version())) return UnknownVersion(request->version());
      serving_ = request->version();
    }
    Fill(response);
    return grpc::Status::OK;
  }

  grpc::Status SetServingVersion(grpc::ServerContext* context,
                                 const v1::SetServingVersionRequest* request,
                                 v1::ListVersionsResponse* response) override {
    return Serve(*context, request->version(), response);
  }

  grpc::Status Promote(grpc::ServerContext* context, const v1::PromoteRequest* request,
                       v1::ListVersionsResponse* response) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      promoted_.push_back(request->version());
      if (unavailable_left_ > 0) {
        --unavailable_left_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining");
      }
    }
    return Serve(*context, request->version(), response);
  }

  std::vector<std::string> promoted() {
    std::lock_guard<std::mutex> lock(mu_);
    return promoted_;
  }

  grpc::Status Serve(const grpc::ServerContext& context, const std::string& version,
                     v1::ListVersionsResponse* response) {
    if (grpc::Status s = Authorize(context, nullptr); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    if (!Known(version)) return UnknownVersion(version);
    serving_ = version;
    Fill(response);
    return grpc::Status::OK;
  }

 private:
  struct Version {
    std::string version, origin, created, description;
  };

  grpc::Status Authorize(const grpc::ServerContext& context, std::string* seen) {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing metadata 'authorization: Bearer <token>'");
    }
    const std::string value(it->second.data(), it->second.size());
    if (seen != nullptr) *seen = value;
    if (value != absl::StrCat("Bearer ", kToken)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong trainer token");
    }
    return grpc::Status::OK;
  }

  grpc::Status RunJob(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::FineTuneProgress, v1::FineTuneRequest>* stream,
                      Job* job) {
    std::string authorization;
    grpc::Status auth = Authorize(*context, &authorization);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->authorization = authorization;
    }
    if (!auth.ok()) return auth;
    v1::FineTuneRequest request;
    if (!stream->Read(&request)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended before a config");
    }
    if (!request.has_config()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message must be a config");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->config = request.config();
    }
    const double lr = request.config().learning_rate();
    const int64_t total = request.config().total_steps();
    int64_t step = 0, seen = 0;
    v1::FineTuneProgress progress;
    auto fill = [&] {
      progress.Clear();
      progress.set_job_id("job-7");
      progress.set_step(step);
      progress.set_loss(step > 0 ? 2.0 / step : 0);
      progress.set_learning_rate(total > 0 ? lr * (total - step) / total : lr);
      progress.set_examples_per_second(100);
      progress.set_examples_seen(seen);
      if (step == 1) progress.set_base_version("base");
    };
    while (stream->Read(&request)) {
      if (context->IsCancelled()) break;
      std::chrono::milliseconds delay;
      int fail_at;
      {
        std::lock_guard<std::mutex> lock(mu_);
        delay = step_delay_;
        fail_at = fail_at_batch_;
      }
      switch (request.message_case()) {
        case v1::FineTuneRequest::kBatch: {
          {
            std::lock_guard<std::mutex> lock(mu_);
            job->batches.push_back(request.batch());
          }
          if (fail_at == step + 1) {
            return grpc::Status(
                grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("job job-7 stopped at batch ", step + 1, ": text too long"));
          }
          if (delay.count() > 0) std::this_thread::sleep_for(delay);
          ++step;
          seen += request.batch().examples_size();
          fill();
          if (!stream->Write(progress)) {
            return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
          }
          break;
        }
        case v1::FineTuneRequest::kCommit: {
          std::lock_guard<std::mutex> lock(mu_);
          job->committed = true;
          job->commit = request.commit();
          fill();
          progress.set_committed_version("ft-000003-20261122T050000Z");
          versions_.push_back({"ft-000003-20261122T050000Z",
                               "fine-tuned from base (contrastive, 3 steps)",
                               "2026-11-22T05:00:00Z", request.commit().description()});
          if (request.commit().promote()) {
            serving_ = "ft-000003-20261122T050000Z";
            progress.set_promoted(true);
            progress.set_promotion("promoted: the job asked for it");
          } else {
            progress.set_promotion("staged: promotion not requested");
          }
          stream->Write(progress);
          return grpc::Status::OK;
        }
        case v1::FineTuneRequest::kAbort: {
          {
            std::lock_guard<std::mutex> lock(mu_);
            job->aborted = true;
          }
          fill();
          stream->Write(progress);
          return grpc::Status::OK;
        }
        default:
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unexpected message");
      }
    }
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the stream ended without commit; job job-7 discarded");
  }

  bool Known(const std::string& version) const {
    for (const Version& v : versions_) {
      if (v.version == version) return true;
    }
    return false;
  }
  static grpc::Status UnknownVersion(const std::string& version) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown model version '", version, "'"));
  }
  void Fill(v1::ListVersionsResponse* response) const {
    for (const Version& v : versions_) {
      v1::VersionInfo* info = response->add_versions();
      info->set_version(v.version);
      info->set_origin(v.origin);
      info->set_created_utc(v.created);
      info->set_description(v.description);
      info->set_serving(v.version == serving_);
    }
    response->set_serving_version(serving_);
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<Job>> jobs_;
  int fail_at_batch_ = 0;
  std::chrono::milliseconds step_delay_{0};
  std::string serving_;
  std::vector<Version> versions_;
  std::vector<std::string> promoted_;  // Promote calls' versions
  int unavailable_left_ = 0;
  int list_calls_ = 0;
};

// One fake server for the whole binary (cheap, but tests share it: each resets what it sets).
class ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    grpc::EnableDefaultHealthCheckService(true);
    service_ = new FakeEncoder;
    trainer_ = new FakeTrainer;
    trainer_->Reset();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_);
    builder.RegisterService(trainer_);
    server_ = builder.BuildAndStart().release();
    // Checked in SetUp: a failed assertion here would only mark every test skipped.
    if (server_ != nullptr) {
      server_->GetHealthCheckService()->SetServingStatus("attnserve.v1.Encoder", true);
    }
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) server_->Shutdown();
    delete server_;
    delete service_;
    delete trainer_;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "the fake server did not start";
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (server_ == nullptr) return;
    service_->FailWith(grpc::Status::OK);
    service_->SetDelay(std::chrono::milliseconds(0));
    server_->GetHealthCheckService()->SetServingStatus(true);
    trainer_->Reset();
  }

  static std::string Target() { return absl::StrCat("127.0.0.1:", port_); }

  static FakeEncoder* service_;
  static FakeTrainer* trainer_;
  static grpc::Server* server_;
  static int port_;
};

FakeEncoder* ClientTest::service_ = nullptr;
FakeTrainer* ClientTest::trainer_ = nullptr;
grpc::Server* ClientTest::server_ = nullptr;
int ClientTest::port_ = 0;

v1::EncodeRequest OneText(const std::string& text) {
  v1::EncodeRequest request;
  request.add_inputs()->set_text(text);
  return request;
}

// ---------------------------------------------------------------------------------------------
// Library

TEST_F(ClientTest, EncodeRoundTrip) {
  EncoderClient client(Target());
  auto response = client.Encode(OneText("the cat sat"));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->results_size(), 1);
  EXPECT_EQ(response->results(0).tokens_size(), 5);
  EXPECT_EQ(response->results(0).embedding_size(), 384);
  EXPECT_EQ(response->model_version(), "v1");
}

TEST_F(ClientTest, ServerErrorKeepsCodeAndMessage) {
  service_->FailWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "inputs[0]: 600 tokens exceed max_length 512"));
  EncoderClient client(Target());
  auto response = client.Encode(OneText("x"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(), "inputs[0]: 600 tokens exceed max_length 512");
  EXPECT_FALSE(IsUnreachable(response.status()));
}

TEST_F(ClientTest, UnavailableFromServerIsNotUnreachable) {
  service_->FailWith(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
  EncoderClient client(Target());
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(info.status().message(), "draining");
  EXPECT_FALSE(IsUnreachable(info.status()));
}

// The retry policy (client.cc, issue 35): behind a load balancer a replica that dies or drains
// answers UNAVAILABLE; a call that only reads is sent again (5 attempts at most), only on
// UNAVAILABLE, and a call that changes state never.
TEST_F(ClientTest, ReadsAreRetriedOnUnavailable) {
  EncoderClient client(Target());
  const int before = service_->attempts();
  service_->FailTimes(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"), 2);
  auto response = client.Encode(OneText("the cat sat"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(service_->attempts() - before, 3);

  const int before_give_up = service_->attempts();
  service_->FailTimes(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"), 100);
  EXPECT_EQ(client.Encode(OneText("x")).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_->attempts() - before_give_up, 5);

  const int before_internal = service_->attempts();
  service_->FailTimes(grpc::Status(grpc::StatusCode::INTERNAL, "bug"), 100);
  EXPECT_EQ(client.Encode(OneText("x")).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(service_->attempts() - before_internal, 1);
}

TEST_F(ClientTest, DeadlineExceeded) {
  service_->SetDelay(std::chrono::milliseconds(500));
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(100);
  EncoderClient client(Target(), options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(IsUnreachable(info.status()));
}

TEST_F(ClientTest, ConnectionRefusedIsUnreachable) {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(5000);
  EncoderClient client("127.0.0.1:1", options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsUnreachable(info.status())) << info.status();
  auto health = client.Health();
  ASSERT_FALSE(health.ok());
  EXPECT_TRUE(IsUnreachable(health.status()));
}

TEST_F(ClientTest, WaitForReadyOnDeadServerEndsAtDeadlineAsUnreachable) {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(300);
  options.wait_for_ready = true;
  EncoderClient client("127.0.0.1:1", options);
  auto info = client.GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(IsUnreachable(info.status()));
}

TEST_F(ClientTest, ResponseLargerThanLimit) {
  ClientOptions options;
  options.max_receive_message_bytes = 512;
  EncoderClient client(Target(), options);
  auto response = client.Encode(OneText("a b c"));  // 384 floats > 512 bytes
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
}

// The copy of health.proto in client/proto must match grpc++'s built-in service on the wire.
TEST_F(ClientTest, HealthAgainstBuiltInHealthService) {
  EncoderClient client(Target());
  auto overall = client.Health();
  ASSERT_TRUE(overall.ok()) << overall.status();
  EXPECT_EQ(*overall, grpc::health::v1::HealthCheckResponse::SERVING);
  auto encoder = client.Health("attnserve.v1.Encoder");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_EQ(*encoder, grpc::health::v1::HealthCheckResponse::SERVING);
  auto unknown = client.Health("no.such.Service");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  server_->GetHealthCheckService()->SetServingStatus(false);
  auto down = client.Health();
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(*down, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

// ---------------------------------------------------------------------------------------------
// attnctl

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/attnctl_test_", getpid(), "_", name);
}

// Runs attnctl with `args`, `stdin_text` on stdin, ATTNSERVE_ADDR and ATTNSERVE_TOKEN unset
// unless `env` ("NAME=value") sets them.
CliResult RunCli(const std::vector<std::string>& args, const std::string& stdin_text = "",
                 const std::string& env = "") {
  const std::string in_path = TempPath("stdin");
  const std::string err_path = TempPath("stderr");
  {
    std::ofstream in(in_path, std::ios::binary);
    in << stdin_text;
  }
  std::string command = absl::StrCat(
      "env -u ATTNSERVE_ADDR -u ATTNSERVE_TOKEN -u ATTNSERVE_API_KEY ", env, " ", ATTNCTL_BINARY);
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  absl::StrAppend(&command, " <", in_path, " 2>", err_path);
  CliResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  std::remove(in_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

#define EXPECT_EXIT_CODE(result, code) \
  EXPECT_EQ((result).exit_code, code) << "stdout:\n" << (result).out << "stderr:\n" << (result).err

TEST(AttnctlUsage, HelpAndUsageErrors) {
  CliResult r = RunCli({});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "Commands:"));

  r = RunCli({"--help"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "Usage: attnctl <command> [flags]"));
  for (const char* cmd : {"encode", "attention", "tokenize", "info", "health"}) {
    EXPECT_TRUE(absl::StrContains(r.out, cmd)) << cmd;
  }
  r = RunCli({"help", "attention"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--rollout"));
  r = RunCli({"encode", "--help"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--pooling"));
  EXPECT_TRUE(absl::StrContains(r.out, "--server"));
  r = RunCli({"health", "-h"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "HEALTHCHECK"));

  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"--json"}, "missing command"},
      {{"encode", "--no-such-flag"}, "unknown flag --no_such_flag"},
      {{"info", "--pooling", "cls"}, "--pooling does not apply to 'info'"},
      {{"health", "--text", "x"}, "--text does not apply to 'health'"},
      {{"info", "--rollout"}, "--rollout does not apply to 'info'"},
      {{"tokenize", "--nomean", "--text", "a"}, "--mean does not apply to 'tokenize'"},
      {{"encode", "--timeout-ms", "soon"}, "invalid value 'soon' for --timeout_ms"},
      {{"encode", "--text"}, "--text needs a value"},
      {{"encode", "--text", "a", "stray"}, "unexpected argument 'stray'"},
      {{"encode", "--pooling", "median", "--text", "a"}, "--pooling must be"},
      {{"encode", "--normalize", "maybe", "--text", "a"}, "--normalize must be"},
      {{"encode", "--layers", "0,last", "--text", "a"}, "--layers takes integers"},
      {{"encode", "--dtype", "int8", "--text", "a"}, "--dtype must be"},
      {{"tokenize", "--truncation", "middle", "--text", "a"}, "--truncation must be"},
      {{"tokenize", "--max-length", "-4", "--text", "a"}, "--max-length must be >= 0"},
      {{"tokenize", "--pair", "b"}, "--pair needs --text"},
      {{"tokenize"}, "no input"},
      {{"attention", "--rollout", "--mean", "--text", "a"}, "exclude each other"},
      {{"attention", "--head", "2", "--mean", "--text", "a"}, "--head picks one head"},
      {{"attention", "--head", "-3", "--text", "a"}, "--head must be"},
  };
  for (const Case& c : cases) {
    r = RunCli(c.args);
    EXPECT_EXIT_CODE(r, 2) << absl::StrJoin(c.args, " ");
    EXPECT_TRUE(absl::StrContains(r.err, c.message))
        << absl::StrJoin(c.args, " ") << " -> " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(AttnctlUsage, UnreachableServer) {
  for (const char* cmd : {"info", "health"}) {
    CliResult r = RunCli({cmd, "--server", "localhost:1", "--timeout-ms", "5000"});
    EXPECT_EXIT_CODE(r, 1);
    EXPECT_TRUE(absl::StartsWith(r.err, "attnctl: cannot reach localhost:1 (UNAVAILABLE): "))
        << r.err;
  }
  // Without --server: $ATTNSERVE_ADDR.
  CliResult r = RunCli({"encode", "--text", "hi"}, "", "ATTNSERVE_ADDR=localhost:1");
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot reach localhost:1 (UNAVAILABLE)")) << r.err;
  r = RunCli({"--server=localhost:1", "health", "--wait-for-ready", "--timeout_ms=300"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot reach localhost:1 (DEADLINE_EXCEEDED)")) << r.err;
}

TEST_F(ClientTest, CliInfo) {
  CliResult r = RunCli({"info", "--server", Target()});
  EXPECT_EXIT_CODE(r, 0);
  // Aligned "key: value" lines in proto field order.
  EXPECT_TRUE(absl::StartsWith(r.out, "architecture:            BertModel\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\nnum_heads:               12\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\ndefault_normalize:       true\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\navailable_versions:      v1, v2\n")) << r.out;

  r = RunCli({"info", "--server", Target(), "--model-version", "v9"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: NOT_FOUND: unknown model version 'v9'\n");

  r = RunCli({"info", "--server", Target(), "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"architecture\":\"BertModel\"")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"num_layers\":6")) << r.out;
}

TEST_F(ClientTest, CliHealth) {
  CliResult r = RunCli({"health", "--server", Target()});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(r.out, "SERVING\n");
  r = RunCli({"health", "--server", Target(), "--service", "attnserve.v1.Encoder", "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(r.out, "{\"status\":\"SERVING\"}\n");
  r = RunCli({"health", "--server", Target(), "--service", "nope"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
  server_->GetHealthCheckService()->SetServingStatus(false);
  r = RunCli({"health", "--server", Target()});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.out, "NOT_SERVING\n");
}

TEST_F(ClientTest, CliEncode) {
  CliResult r = RunCli({"encode", "--server", Target(), "--text", "The cat sat", "--pooling", "cls",
                        "--normalize", "false", "--layers", "0,-1", "--dtype", "bfloat16",
                        "--max-length", "16", "--truncation", "left", "--model-version", "v2"});
  EXPECT_EXIT_CODE(r, 0);
  const v1::EncodeRequest req = service_->last_encode();
  ASSERT_EQ(req.inputs_size(), 1);
  EXPECT_EQ(req.inputs(0).text(), "The cat sat");
  EXPECT_EQ(req.pooling(), v1::POOLING_CLS);
  ASSERT_TRUE(req.has_normalize());
  EXPECT_FALSE(req.normalize());
  EXPECT_EQ(std::vector<int>(req.hidden_layers().begin(), req.hidden_layers().end()),
            (std::vector<int>{0, -1}));
  EXPECT_EQ(req.output_dtype(), v1::BFLOAT16);
  EXPECT_EQ(req.tokenization().max_length(), 16);
  EXPECT_EQ(req.tokenization().truncation(), v1::TRUNCATION_LEFT);
  EXPECT_EQ(req.model_version(), "v2");
  EXPECT_TRUE(absl::StrContains(r.out, "[0] \"The cat sat\" (5 tokens)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "embedding [384] norm 1.0000: +0.0510 -0.0510")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 0 [5 x 8] BFLOAT16, [CLS] row: -1.0000 -0.7500"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 6 [5 x 8]")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "model v2:")) << r.out;

  // Defaults: model pooling, normalize unset, float32; stdin gives one input per line (an
  // empty line is an error naming it: every line is one input).
  r = RunCli({"encode", "--server", Target()}, "first line\n\nsecond line\r\n");
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "line 2 of stdin is empty")) << r.err;
  r = RunCli({"encode", "--server", Target(), "--dtype", "float16", "--layers", "-1"},
             "first line\nsecond line\r\n");
  EXPECT_EXIT_CODE(r, 0);
  const v1::EncodeRequest req2 = service_->last_encode();
  ASSERT_EQ(req2.inputs_size(), 2);
  EXPECT_EQ(req2.inputs(1).text(), "second line");
  EXPECT_EQ(req2.pooling(), v1::POOLING_MODEL_DEFAULT);
  EXPECT_FALSE(req2.has_normalize());
  EXPECT_TRUE(absl::StrContains(r.out, "[1] \"second line\" (4 tokens)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "layer 6 [4 x 8] FLOAT16, [CLS] row: -1.0000 -0.7500"))
      << r.out;

  r = RunCli({"encode", "--server", Target(), "--json", "--text", "a", "--pair", "b"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(service_->last_encode().inputs(0).has_pair());
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"results\":[{\"tokens\":[{\"id\":101,\"text\":\"[CLS]\""))
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);

  service_->FailWith(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full (64)"));
  r = RunCli({"encode", "--server", Target(), "--text", "a"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: RESOURCE_EXHAUSTED: queue full (64)\n");
}

TEST_F(ClientTest, CliEncodeSplitsInputsOverTheServersLimitAndPrintsJsonLines) {
  // 7 inputs, the server takes 3 per request (GetModelInfo): calls of 3, 3 and 1, in order.
  const int before = service_->encode_calls();
  CliResult r = RunCli({"encode", "--server", Target(), "--jsonl"}, "s0\ns1\ns2\ns3\ns4\ns5\ns6\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(service_->encode_calls() - before, 3);
  ASSERT_EQ(service_->last_encode().inputs_size(), 1);
  EXPECT_EQ(service_->last_encode().inputs(0).text(), "s6");
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << r.out;
  for (int i = 0; i < 7; ++i) {
    EXPECT_TRUE(absl::StartsWith(lines[i], absl::StrCat("{\"index\":", i, ",\"line\":", i + 1,
                                                        ",\"text\":\"s", i, "\",\"tokens\":[")))
        << lines[i];
    EXPECT_TRUE(absl::StrContains(lines[i], "\"embedding\":[")) << lines[i];
  }
  // The human-readable form numbers the inputs across calls.
  r = RunCli({"encode", "--server", Target()}, "s0\ns1\ns2\ns3\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "[3] \"s3\"")) << r.out;
  r = RunCli({"encode", "--server", Target(), "--json", "--jsonl", "--text", "a"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "pick one")) << r.err;
}

TEST_F(ClientTest, CliClassifyAndRerank) {
  CliResult r = RunCli({"classify", "--server", Target(), "--model-version", "v2", "--top-k", "1"},
                       "buy now\nhello mum\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out,
                               "[0] \"buy now\"\n    label  name  probability\n"
                               "    1      spam  0.7500\n"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "[1] \"hello mum\"")) << r.out;

  r = RunCli({"rerank", "--server", Target(), "--query", "kettle", "--top-n", "2",
              "--rerank-method", "cross-encoder"},
             "red kettle\nblue lamp\ngreen tent\n");
  EXPECT_EXIT_CODE(r, 0);
  const v1::RerankRequest request = service_->last_rerank();
  EXPECT_EQ(request.query(), "kettle");
  ASSERT_EQ(request.documents_size(), 3) << "document i is line i+1";
  EXPECT_EQ(request.documents(2), "green tent");
  EXPECT_EQ(request.top_n(), 2);
  EXPECT_EQ(request.method(), v1::RERANK_CROSS_ENCODER);
  EXPECT_TRUE(absl::StartsWith(r.out,
                               "query: kettle (cross-encoder probability)\n"
                               "    rank  score   doc  text\n"
                               "    1     1.0000  0    red kettle\n"
                               "    2     0.5000  1    blue lamp\n"))
      << r.out;
  r = RunCli({"rerank", "--server", Target(), "--query", "kettle", "--json"}, "a\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"results\":[{\"index\":0,\"score\":1,")) << r.out;
}

TEST_F(ClientTest, CliExplain) {
  const std::string svg = ::testing::TempDir() + "/attnctl_explain_test.svg";
  std::remove(svg.c_str());
  CliResult r =
      RunCli({"explain", "--server", Target(), "--text", "king spoke", "--pair", "queen spoke",
              "--steps", "8", "--at-layer", "2", "--baseline", "mask", "--svg", svg});
  EXPECT_EXIT_CODE(r, 0);
  const v1::ExplainRequest request = service_->last_explain();
  EXPECT_EQ(request.query(), "king spoke");
  ASSERT_EQ(request.documents_size(), 1);
  EXPECT_EQ(request.documents(0), "queen spoke");
  EXPECT_EQ(request.method(), v1::ATTRIBUTION_PAIRWISE);  // the default
  EXPECT_EQ(request.steps(), 8);
  EXPECT_EQ(request.layer(), 2);
  EXPECT_EQ(request.baseline(), v1::BASELINE_MASK_TOKENS);
  EXPECT_FALSE(request.word_level());
  EXPECT_TRUE(absl::StartsWith(r.out,
                               "similarity 0.7500, completeness error 0.002 (pairwise, 8 "
                               "steps)\n"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "query (integrated gradients per token):")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out,
                                "largest pair contributions (sum 0.7400, target 0.7420):\n"
                                "    king \u2194 queen  +0.5000\n"))
      << r.out;
  std::ifstream picture(svg);
  std::stringstream content;
  content << picture.rdbuf();
  EXPECT_TRUE(absl::StrContains(content.str(), "<svg")) << "no SVG written to " << svg;
  EXPECT_TRUE(absl::StrContains(content.str(), "token-pair attributions"));

  // The HTML page says how to read an explanation, not an attention map (issue 31: it carried
  // the attention page's caption, "darker is more attention").
  const std::string html = ::testing::TempDir() + "/attnctl_explain_test.html";
  r = RunCli({"explain", "--server", Target(), "--text", "king spoke", "--pair", "queen spoke",
              "--html", html});
  EXPECT_EXIT_CODE(r, 0);
  std::ifstream page_file(html);
  std::stringstream page;
  page << page_file.rdbuf();
  EXPECT_TRUE(absl::StrContains(page.str(), "<h1>attnserve: why are these texts similar?</h1>"))
      << page.str().substr(0, 2000);
  EXPECT_FALSE(absl::StrContains(page.str(), "more attention")) << page.str().substr(0, 2000);
  EXPECT_FALSE(absl::StrContains(page.str(), "attending from")) << page.str().substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(page.str(), "contribution to the similarity"))
      << page.str().substr(0, 2000);
  std::remove(html.c_str());

  // Per-token only: no matrix, gradient x input, words asked for.
  r = RunCli({"explain", "--server", Target(), "--text", "a", "--pair", "b", "--method", "gxi",
              "--words"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(service_->last_explain().method(), v1::ATTRIBUTION_GRADIENT_X_INPUT);
  EXPECT_TRUE(service_->last_explain().word_level());
  EXPECT_FALSE(absl::StrContains(r.out, "largest pair")) << r.out;

  r = RunCli({"explain", "--server", Target(), "--text", "a", "--pair", "b", "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"results\":[{\"similarity\":0.75")) << r.out;

  // Usage errors before any call, server errors passed through.
  r = RunCli({"explain", "--server", Target(), "--text", "a"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "explain needs --text (the query) and --pair")) << r.err;
  r = RunCli({"explain", "--server", Target(), "--text", "a", "--pair", "b", "--method", "shap"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--method must be pairwise, ig or gxi, not 'shap'"))
      << r.err;
  service_->FailWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "steps is 0; use 1 to 256"));
  r = RunCli({"explain", "--server", Target(), "--text", "a", "--pair", "b", "--steps", "0"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: INVALID_ARGUMENT: steps is 0; use 1 to 256\n");
}

TEST_F(ClientTest, CliTokenize) {
  // A value that starts with '-' and contains dashes keeps its dashes (only names are rewritten).
  CliResult r =
      RunCli({"tokenize", "--server", Target(), "--text", "-a-b Hello", "--pair", "Bye now"});
  EXPECT_EXIT_CODE(r, 0);
  const v1::TokenizeRequest req = service_->last_tokenize();
  ASSERT_EQ(req.inputs_size(), 1);
  EXPECT_EQ(req.inputs(0).pair().first(), "-a-b Hello");
  EXPECT_EQ(req.inputs(0).pair().second(), "Bye now");
  const std::string expected =
      "[0] \"-a-b Hello\" + \"Bye now\" (7 tokens)\n"
      "   #  token  id    type  chars  text\n"
      "   0  [CLS]  101   0     -\n"
      "   1  -a-b   1004  0     0-4    \"-a-b\"\n"
      "   2  hello  1005  0     5-10   \"Hello\"\n"
      "   3  [SEP]  102   0     -\n"
      "   4  bye    1003  1     0-3    \"Bye\"\n"
      "   5  now    1003  1     4-7    \"now\"\n"
      "   6  [SEP]  102   1     -\n";
  EXPECT_TRUE(absl::StartsWith(r.out, expected)) << r.out;
}

TEST_F(ClientTest, CliAttentionText) {
  CliResult r = RunCli({"attention", "--server", Target(), "--text", "a b c"});
  EXPECT_EXIT_CODE(r, 0);
  v1::AttentionMapRequest req = service_->last_attention();
  EXPECT_EQ(std::vector<int>(req.layers().begin(), req.layers().end()), std::vector<int>{-1});
  EXPECT_TRUE(req.heads().empty());
  EXPECT_TRUE(req.has_include_weights());
  EXPECT_FALSE(req.include_weights());  // text without --head shows the mean only
  EXPECT_TRUE(req.mean_over_heads());
  EXPECT_TRUE(absl::StrContains(r.out, "layer 5, mean over heads, top 3 attended tokens per row"))
      << r.out;

  r = RunCli({"attention", "--server", Target(), "--text", "a b c", "--layer", "2", "--head", "1",
              "--top", "2"});
  EXPECT_EXIT_CODE(r, 0);
  req = service_->last_attention();
  EXPECT_EQ(std::vector<int>(req.heads().begin(), req.heads().end()), std::vector<int>{1});
  EXPECT_TRUE(req.include_weights());
  EXPECT_FALSE(req.mean_over_heads());
  // Head 1 puts 0.5 on the next token.
  EXPECT_TRUE(absl::StrContains(r.out, "layer 2, head 1, top 2 attended tokens per row")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "    0 [CLS] ->  a(1) 0.500  [CLS](0) 0.125\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "    4 [SEP] ->  [CLS](0) 0.500  a(1) 0.125\n")) << r.out;
}

TEST_F(ClientTest, CliAttentionPictures) {
  const std::string svg = TempPath("grid.svg");
  const std::string html = TempPath("page.html");
  CliResult r = RunCli({"attention", "--server", Target(), "--text", "the <b> & cat", "--svg", svg,
                        "--html", html, "--dtype", "bfloat16"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat("wrote ", svg))) << r.err;
  const std::string grid = ReadFile(svg);
  EXPECT_TRUE(absl::StartsWith(grid, "<svg"));
  int panels = 0;
  for (size_t p = grid.find("class=\"panel\""); p != std::string::npos;
       p = grid.find("class=\"panel\"", p + 1)) {
    ++panels;
  }
  EXPECT_EQ(panels, kHeads);
  EXPECT_TRUE(absl::StrContains(grid, "&lt;b&gt;"));
  const std::string page = ReadFile(html);
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::StrContains(page, "Input 0: &quot;the &lt;b&gt; &amp; cat&quot;")) << page;
  std::remove(svg.c_str());
  std::remove(html.c_str());

  // Rollout for two inputs from stdin: one SVG per input.
  const std::string base = TempPath("rollout.svg");
  r = RunCli({"attention", "--server", Target(), "--rollout", "--svg", base}, "one two\nthree\n");
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(service_->last_attention().rollout());
  EXPECT_FALSE(service_->last_attention().include_weights());
  const std::string first = base.substr(0, base.size() - 4) + "-0.svg";
  const std::string second = base.substr(0, base.size() - 4) + "-1.svg";
  EXPECT_TRUE(absl::StrContains(ReadFile(first), "attention rollout through all layers"));
  EXPECT_TRUE(absl::StrContains(ReadFile(second), "three (1)"));
  std::remove(first.c_str());
  std::remove(second.c_str());

  // Unwritable path: exit 1 with the OS error.
  r = RunCli({"attention", "--server", Target(), "--text", "a", "--head", "0", "--svg",
              "/nonexistent-dir/x.svg"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot write /nonexistent-dir/x.svg")) << r.err;
}

// ---------------------------------------------------------------------------------------------
// Trainer: library

v1::TrainingExample Pair(const std::string& anchor, const std::string& positive) {
  v1::TrainingExample e;
  e.set_anchor(anchor);
  e.set_positive(positive);
  return e;
}

ClientOptions WithToken(const std::string& token) {
  ClientOptions options;
  options.bearer_token = token;
  return options;
}

// The Trainer's side of the retry policy (ReadsAreRetriedOnUnavailable above).
TEST_F(ClientTest, TrainerQueriesAreRetriedAndChangesAreNot) {
  TrainerClient client(Target(), WithToken(kToken));
  trainer_->AnswerUnavailable(2);
  auto versions = client.ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(trainer_->list_calls(), 3);
  trainer_->AnswerUnavailable(100);
  EXPECT_EQ(client.Promote("ft-000001-20261122T041000Z").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(trainer_->promoted().size(), 1u);
}

TEST_F(ClientTest, FineTuneSessionCommit) {
  TrainerClient client(Target(), WithToken(kToken));
  std::unique_ptr<FineTuneSession> session = client.FineTune();
  v1::FineTuneConfig config;
  config.set_objective(v1::CONTRASTIVE);
  config.set_total_steps(2);
  config.set_learning_rate(1e-4);
  ASSERT_TRUE(session->Start(config).ok());
  ASSERT_TRUE(session->SendBatch({Pair("a", "b"), Pair("c", "d")}));
  v1::FineTuneProgress progress;
  ASSERT_TRUE(session->Read(&progress));
  EXPECT_EQ(progress.step(), 1);
  EXPECT_EQ(progress.base_version(), "base");
  EXPECT_EQ(progress.job_id(), "job-7");
  v1::TrainingBatch batch;
  *batch.add_examples() = Pair("e", "f");
  ASSERT_TRUE(session->SendBatch(batch));
  ASSERT_TRUE(session->Read(&progress));
  EXPECT_EQ(progress.step(), 2);
  ASSERT_TRUE(session->Commit("first try"));  // staged
  EXPECT_TRUE(session->half_closed());
  EXPECT_FALSE(session->SendBatch(batch));  // nothing goes out after the commit
  ASSERT_TRUE(session->Read(&progress));
  EXPECT_EQ(progress.committed_version(), "ft-000003-20261122T050000Z");
  EXPECT_FALSE(session->Read(&progress));
  EXPECT_TRUE(session->Finish().ok());
  EXPECT_TRUE(session->Finish().ok());  // idempotent

  const auto jobs = trainer_->jobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].authorization, "Bearer s3cret-token");
  EXPECT_EQ(jobs[0].config.objective(), v1::CONTRASTIVE);
  EXPECT_EQ(jobs[0].config.total_steps(), 2);
  ASSERT_EQ(jobs[0].batches.size(), 2u);
  EXPECT_EQ(jobs[0].batches[0].examples_size(), 2);
  EXPECT_EQ(jobs[0].batches[0].examples(1).positive(), "d");
  EXPECT_TRUE(jobs[0].committed);
  EXPECT_EQ(jobs[0].commit.description(), "first try");
  EXPECT_FALSE(jobs[0].commit.promote());

  auto versions = client.ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->versions_size(), 4);
  EXPECT_EQ(versions->serving_version(), "ft-000002-20261122T041900Z");  // staged
}

TEST_F(ClientTest, FineTuneSessionAbortErrorsAndCancel) {
  TrainerClient client(Target(), WithToken(kToken));
  v1::FineTuneConfig config;
  config.set_objective(v1::CONTRASTIVE);
  v1::FineTuneProgress progress;

  // Abort: a final message, then OK.
  auto session = client.FineTune();
  EXPECT_EQ(session->Finish().code(), absl::StatusCode::kFailedPrecondition);  // not started
  ASSERT_TRUE(session->Start(config).ok());
  EXPECT_EQ(session->Start(config).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(session->SendBatch({Pair("a", "b")}));
  ASSERT_TRUE(session->Abort());
  int messages = 0;
  while (session->Read(&progress)) ++messages;
  EXPECT_EQ(messages, 2);
  EXPECT_TRUE(session->Finish().ok());
  EXPECT_TRUE(trainer_->jobs().back().aborted);

  // The server stops the job at batch 2: the status says why.
  trainer_->FailAtBatch(2);
  session = client.FineTune();
  ASSERT_TRUE(session->Start(config).ok());
  session->SendBatch({Pair("a", "b")});
  session->SendBatch({Pair("c", "d")});
  ASSERT_TRUE(session->Read(&progress));
  EXPECT_EQ(progress.step(), 1);
  EXPECT_FALSE(session->Read(&progress));
  absl::Status status = session->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "job job-7 stopped at batch 2: text too long");
  EXPECT_FALSE(IsUnreachable(status));
  trainer_->FailAtBatch(0);

  // Cancel() from another thread ends a stream that waits for a slow step: cancelled once the
  // server holds the batch (and sleeps the step delay), it must end well before the step would.
  const auto step_delay = testing::ScaledMilliseconds(2000);
  trainer_->SetStepDelay(step_delay);
  // Start() may return before the server has registered the new job, so until then
  // batches_received() still reads the previous job: wait for the new job itself.
  const size_t jobs_before = trainer_->jobs().size();
  session = client.FineTune();
  ASSERT_TRUE(session->Start(config).ok());
  ASSERT_TRUE(session->SendBatch({Pair("a", "b")}));
  const auto start = std::chrono::steady_clock::now();
  std::thread canceller([&] {
    while ((trainer_->jobs().size() <= jobs_before || trainer_->batches_received() < 1) &&
           std::chrono::steady_clock::now() - start < step_delay) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    session->Cancel();
  });
  EXPECT_FALSE(session->Read(&progress));
  canceller.join();
  EXPECT_GE(trainer_->batches_received(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, step_delay * 3 / 4);
  EXPECT_EQ(session->Finish().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(trainer_->WaitForJobEnd(testing::ScaledMilliseconds(5000)));

  // Dropping a running session cancels it: the server's job ends.
  trainer_->SetStepDelay(std::chrono::milliseconds(0));
  session = client.FineTune();
  ASSERT_TRUE(session->Start(config).ok());
  ASSERT_TRUE(session->SendBatch({Pair("a", "b")}));
  ASSERT_TRUE(session->Read(&progress));
  session.reset();
  EXPECT_TRUE(trainer_->WaitForJobEnd(testing::ScaledMilliseconds(5000)));
  EXPECT_FALSE(trainer_->jobs().back().status.ok());
}

TEST_F(ClientTest, TrainerTokenMetadata) {
  v1::FineTuneConfig config;
  config.set_objective(v1::CONTRASTIVE);
  v1::FineTuneProgress progress;
  struct Case {
    std::string token;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{"", absl::StatusCode::kUnauthenticated},
                        Case{"wrong", absl::StatusCode::kPermissionDenied}}) {
    TrainerClient client(Target(), WithToken(c.token));
    auto versions = client.ListVersions();
    EXPECT_EQ(versions.status().code(), c.code) << c.token;
    EXPECT_EQ(client.Rollback().status().code(), c.code);
    EXPECT_EQ(client.SetServingVersion("base").status().code(), c.code);
    auto session = client.FineTune();
    absl::Status status = session->Start(config);
    if (status.ok()) {  // the config may be sent before the server's answer arrives
      EXPECT_FALSE(session->Read(&progress));
      status = session->Finish();
    }
    EXPECT_EQ(status.code(), c.code) << status;
  }
  EXPECT_EQ(trainer_->jobs().back().authorization, "Bearer wrong");
  // The Encoder ignores the token; EncoderClient sends it too when set.
  EncoderClient encoder(Target(), WithToken(kToken));
  EXPECT_TRUE(encoder.Encode(OneText("a")).ok());
}

TEST_F(ClientTest, TrainerVersionCalls) {
  TrainerClient client(Target(), WithToken(kToken));
  auto rolled = client.Rollback();
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_EQ(rolled->serving_version(), "ft-000001-20261122T041000Z");
  EXPECT_TRUE(rolled->versions(1).serving());
  auto set = client.SetServingVersion("ft-000002-20261122T041900Z");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->serving_version(), "ft-000002-20261122T041900Z");
  auto pinned = client.Rollback("base");
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(pinned->serving_version(), "base");
  EXPECT_EQ(client.Rollback().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.SetServingVersion("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, TrainerUnreachable) {
  ClientOptions options = WithToken(kToken);
  options.timeout = std::chrono::milliseconds(5000);
  TrainerClient client("127.0.0.1:1", options);
  auto versions = client.ListVersions();
  EXPECT_TRUE(IsUnreachable(versions.status())) << versions.status();
  auto session = client.FineTune();
  v1::FineTuneConfig config;
  absl::Status status = session->Start(config);
  if (status.ok()) status = session->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsUnreachable(status)) << status;

  // wait_for_ready: the connection wait is bounded by the timeout.
  options.timeout = std::chrono::milliseconds(300);
  options.wait_for_ready = true;
  TrainerClient waiting("127.0.0.1:1", options);
  session = waiting.FineTune();
  status = session->Start(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(IsUnreachable(status));
}

// ---------------------------------------------------------------------------------------------
// Training data files

absl::StatusOr<TrainingData> Parse(const std::string& text, v1::Objective objective,
                                   DataLimits limits = {}) {
  return ParseTrainingData(text, objective, "d.jsonl", limits);
}

TEST(TrainingData, ContrastiveLinesBlankLinesCrLfAndBom) {
  auto data = Parse(
      "\xEF\xBB\xBF{\"anchor\": \"a\", \"positive\": \"b\", \"id\": 1}\r\n\n   \n"
      "{\"anchor\": \"caf\xC3\xA9\", \"positive\": \"d\"}",
      v1::CONTRASTIVE);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->examples.size(), 2u);
  EXPECT_EQ(data->examples[1].anchor(), "caf\xC3\xA9");
  EXPECT_FALSE(data->has_negatives);
  data = Parse(
      "{\"anchor\": \"a\", \"positive\": \"b\", \"negative\": \"n\"}\n"
      "{\"anchor\": \"c\", \"positive\": \"d\", \"negative\": \"m\"}\n",
      v1::CONTRASTIVE);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->has_negatives);
  EXPECT_EQ(data->examples[1].negative(), "m");
}

TEST(TrainingData, DataOfAnotherObjectiveIsSaidOnce) {
  // Every line written for cosine similarity, read as contrastive: one message, not 40.
  std::string cosine;
  for (int i = 0; i < 40; ++i) cosine += "{\"first\": \"a\", \"second\": \"b\", \"score\": 0.5}\n";
  absl::StatusOr<TrainingData> data = Parse(cosine, v1::CONTRASTIVE);
  ASSERT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data.status().message(),
            "d.jsonl: this looks like cosine data: 40 of 40 lines (the first is line 1) have the "
            "fields {\"first\": \"...\", \"second\": \"...\", \"score\": 0.8}, not those of "
            "--objective contrastive, {\"anchor\": \"...\", \"positive\": \"...\", \"negative\": "
            "\"...\" (optional)}; pass --objective cosine");
  // A few stray lines of another objective among good ones: said once, with the other errors.
  data = Parse(
      "{\"text\": \"a\", \"label\": 1}\n"
      "{\"anchor\": \"a\", \"positive\": \"b\"}\n"
      "{\"text\": \"c\", \"label\": 0}\n"
      "{\"text\": 5, \"label\": 0}\n",
      v1::CLASSIFICATION);
  ASSERT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> lines = absl::StrSplit(data.status().message(), '\n');
  ASSERT_EQ(lines.size(), 2u) << data.status().message();
  EXPECT_TRUE(absl::StartsWith(lines[0],
                               "d.jsonl: this looks like contrastive data: 1 of 4 lines (the "
                               "first is line 2)"))
      << lines[0];
  EXPECT_TRUE(absl::EndsWith(lines[0], "; pass --objective contrastive or fix those lines"))
      << lines[0];
  EXPECT_EQ(lines[1], "d.jsonl:4: \"text\" must be a string, not a number");
}

TEST(TrainingData, ErrorsNameTheLine) {
  auto data = Parse(
      "{\"anchor\": \"a\", \"positive\": \"b\"}\n"
      "\n"
      "{\"anchor\": \"a\", \"positive\": 3}\n"
      "{\"anchor\": \"a\"\n"
      "{\"anchor\": \"a\", \"positive\": \"b\", \"negative\": \"c\"}\n"
      "[1, 2]\n"
      "{\"positive\": \"b\"}\n"
      "{\"anchor\": \" \", \"positive\": \"b\", \"negative\": null}\n"
      "{\"anchor\": \"bad \xFF utf8\", \"positive\": \"b\"}\n",
      v1::CONTRASTIVE);
  ASSERT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> lines = absl::StrSplit(data.status().message(), '\n');
  ASSERT_EQ(lines.size(), 7u) << data.status().message();
  EXPECT_EQ(lines[0], "d.jsonl:3: \"positive\" must be a string, not a number");
  EXPECT_TRUE(absl::StartsWith(lines[1], "d.jsonl:4: bad JSON at column 15: ")) << lines[1];
  EXPECT_EQ(lines[2],
            "d.jsonl:5: has a \"negative\" but line 1 does not: give a negative on every line or "
            "on none");
  EXPECT_TRUE(absl::StartsWith(lines[3], "d.jsonl:6: expected a JSON object like {\"anchor\""))
      << lines[3];
  EXPECT_EQ(lines[4], "d.jsonl:7: missing field \"anchor\"");
  EXPECT_EQ(lines[5], "d.jsonl:8: \"anchor\" is empty");
  EXPECT_TRUE(absl::StartsWith(lines[6], "d.jsonl:9: bad JSON")) << lines[6];

  // At most max_errors, then a count.
  std::string many;
  for (int i = 0; i < 25; ++i) many += "{}\n";
  DataLimits limits;
  limits.max_errors = 3;
  data = Parse(many, v1::CONTRASTIVE, limits);
  const std::vector<std::string> capped = absl::StrSplit(data.status().message(), '\n');
  ASSERT_EQ(capped.size(), 4u);
  EXPECT_EQ(capped[0], "d.jsonl:1: missing field \"anchor\"; missing field \"positive\"");
  EXPECT_EQ(capped[3], "d.jsonl: ... and 22 more problems");

  data = Parse("\n\n", v1::CONTRASTIVE);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(data.status().message(), "d.jsonl: no examples")) << data.status();
}

TEST(TrainingData, CosineScores) {
  auto data = Parse(
      "{\"first\": \"a\", \"second\": \"b\", \"score\": 0.8}\n"
      "{\"first\": \"a\", \"second\": \"b\", \"score\": -1}\n",
      v1::COSINE_SIMILARITY);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FLOAT_EQ(data->examples[0].score(), 0.8f);
  EXPECT_FLOAT_EQ(data->examples[1].score(), -1.0f);
  data = Parse(
      "{\"first\": \"a\", \"second\": \"b\", \"score\": NaN}\n"
      "{\"first\": \"a\", \"second\": \"b\", \"score\": -Infinity}\n"
      "{\"first\": \"a\", \"second\": \"b\", \"score\": \"0.5\"}\n"
      "{\"first\": \"a\", \"second\": \"b\", \"score\": 4}\n"
      "{\"first\": \"a\", \"second\": \"b\"}\n"
      "{\"first\": \"NaN\", \"second\": \"b\", \"score\": 0.5}\n",
      v1::COSINE_SIMILARITY);
  const std::vector<std::string> lines = absl::StrSplit(data.status().message(), '\n');
  ASSERT_EQ(lines.size(), 5u) << data.status().message();
  EXPECT_EQ(lines[0], "d.jsonl:1: \"score\" is NaN, not a finite number (JSON has no NaN)");
  EXPECT_EQ(lines[1],
            "d.jsonl:2: \"score\" is -Infinity, not a finite number (JSON has no -Infinity)");
  EXPECT_EQ(lines[2], "d.jsonl:3: \"score\" must be a number, not a string");
  EXPECT_TRUE(absl::StartsWith(lines[3], "d.jsonl:4: \"score\" 4 is outside [-1, 1]")) << lines[3];
  EXPECT_EQ(lines[4], "d.jsonl:5: missing field \"score\"");
}

TEST(TrainingData, ClassificationLabels) {
  auto data = Parse("{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\", \"label\": 3}\n",
                    v1::CLASSIFICATION);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->max_label, 3);
  EXPECT_EQ(data->examples[1].label(), 3);
  DataLimits limits;
  limits.num_labels = 3;
  data = Parse(
      "{\"text\": \"a\", \"label\": -1}\n"
      "{\"text\": \"a\", \"label\": 1.5}\n"
      "{\"text\": \"a\", \"label\": \"2\"}\n"
      "{\"text\": \"a\", \"label\": 3}\n"
      "{\"text\": \"a\", \"label\": 2}\n"
      "{\"label\": 1}\n",
      v1::CLASSIFICATION, limits);
  const std::vector<std::string> lines = absl::StrSplit(data.status().message(), '\n');
  ASSERT_EQ(lines.size(), 5u) << data.status().message();
  EXPECT_EQ(lines[0], "d.jsonl:1: \"label\" is negative (-1)");
  EXPECT_EQ(lines[1], "d.jsonl:2: \"label\" must be an integer class index, not a fraction");
  EXPECT_EQ(lines[2], "d.jsonl:3: \"label\" must be an integer class index, not a string");
  EXPECT_EQ(lines[3], "d.jsonl:4: \"label\" 3 is not below --num-labels 3");
  EXPECT_EQ(lines[4], "d.jsonl:6: missing field \"text\"");
}

TEST(TrainingData, EpochOrderAndSteps) {
  EXPECT_EQ(StepsPerEpoch(10, 4), 3);
  EXPECT_EQ(StepsPerEpoch(8, 4), 2);
  EXPECT_EQ(StepsPerEpoch(3, 16), 1);
  const std::vector<size_t> a = EpochOrder(100, 7, 0);
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(a, EpochOrder(100, 7, 0));  // reproducible
  EXPECT_NE(a, EpochOrder(100, 7, 1));  // a new order every epoch
  EXPECT_NE(a, EpochOrder(100, 8, 0));  // and per seed
  EXPECT_TRUE(EpochOrder(0, 1, 0).empty());
  EXPECT_EQ(EpochOrder(1, 1, 3), std::vector<size_t>{0});
  // The Python client's epoch_order pins the same lists (client/python/tests/test_finetune.py):
  // both send the same batches for the same data and seed.
  EXPECT_EQ(EpochOrder(12, 7, 0), (std::vector<size_t>{1, 0, 8, 4, 5, 2, 3, 6, 11, 7, 10, 9}));
  EXPECT_EQ(EpochOrder(12, 7, 1), (std::vector<size_t>{1, 4, 10, 6, 5, 0, 8, 11, 2, 7, 9, 3}));
  EXPECT_EQ(EpochOrder(10, ~uint64_t{0}, 3), (std::vector<size_t>{8, 0, 3, 4, 9, 1, 5, 6, 2, 7}));
  // Batches: the last one smaller; a contrastive batch of one pair borrows one from the batch
  // before it, keeping the step count.
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(attn::EpochBatches(10, 4), (Ranges{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(attn::EpochBatches(9, 4), (Ranges{{0, 4}, {4, 8}, {8, 9}}));
  EXPECT_EQ(attn::EpochBatches(9, 4, 2), (Ranges{{0, 4}, {4, 7}, {7, 9}}));
  EXPECT_EQ(attn::EpochBatches(17, 16, 2), (Ranges{{0, 15}, {15, 17}}));
  EXPECT_EQ(attn::EpochBatches(3, 2, 2), (Ranges{{0, 2}, {2, 3}}));  // nothing to borrow
  EXPECT_EQ(attn::EpochBatches(1, 4, 2), (Ranges{{0, 1}}));
  EXPECT_TRUE(attn::EndsWithALonePair(7, 2));
  EXPECT_FALSE(attn::EndsWithALonePair(7, 3));
  EXPECT_FALSE(attn::EndsWithALonePair(8, 2));
  for (size_t n = 1; n < 40; ++n) {
    for (int b = 1; b < 9; ++b) {
      const Ranges batches = attn::EpochBatches(n, b, 2);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), StepsPerEpoch(n, b)) << n << " " << b;
      EXPECT_EQ(batches.back().second, n);
      for (const auto& [begin, end] : batches) EXPECT_LE(end - begin, static_cast<size_t>(b));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// attnctl: Trainer commands

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  return path;
}

// n contrastive examples "a<i>" -> "p<i>".
std::string PairsJsonl(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&text, "{\"anchor\": \"a", i, "\", \"positive\": \"p", i, "\"}\n");
  }
  return text;
}

// The anchors of each batch, e.g. {{"a3", "a0"}, {"a1", "a2"}}.
std::vector<std::vector<std::string>> Anchors(const FakeTrainer::Job& job) {
  std::vector<std::vector<std::string>> out;
  for (const v1::TrainingBatch& batch : job.batches) {
    out.emplace_back();
    for (const v1::TrainingExample& e : batch.examples()) out.back().push_back(e.anchor());
  }
  return out;
}

class TrainerCliTest : public ClientTest {
 protected:
  void SetUp() override {
    token_file_ = WriteTemp("token", absl::StrCat("  ", kToken, "\n"));
    data_ = WriteTemp("pairs.jsonl", PairsJsonl(10));
  }
  void TearDown() override {
    std::remove(token_file_.c_str());
    std::remove(data_.c_str());
    ClientTest::TearDown();
  }
  std::vector<std::string> FineTuneArgs(std::vector<std::string> extra) {
    std::vector<std::string> args = {"finetune",     "--server",    Target(),
                                     "--token-file", token_file_,   "--data",
                                     data_,          "--objective", "contrastive"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string token_file_;
  std::string data_;
};

TEST_F(TrainerCliTest, BatchesEpochsAndConfig) {
  CliResult r =
      RunCli(FineTuneArgs({"--epochs", "3", "--batch-size", "4", "--lr", "3e-5", "--warmup-steps",
                           "2", "--seed", "7", "--no-dropout", "--parameters", "attention",
                           "--base-version", "base", "--max-length", "64", "--log-every", "4"}));
  EXPECT_EXIT_CODE(r, 0);
  auto jobs = trainer_->jobs();
  ASSERT_EQ(jobs.size(), 1u);
  const FakeTrainer::Job& job = jobs[0];
  EXPECT_EQ(job.authorization, "Bearer s3cret-token");  // whitespace around the file's token
  EXPECT_EQ(job.config.objective(), v1::CONTRASTIVE);
  EXPECT_DOUBLE_EQ(job.config.learning_rate(), 3e-5);
  EXPECT_EQ(job.config.warmup_steps(), 2);
  EXPECT_EQ(job.config.total_steps(), 9);  // ceil(10 / 4) x 3
  EXPECT_EQ(job.config.parameters(), v1::PARAMETERS_ATTENTION_ONLY);
  EXPECT_EQ(job.config.seed(), 7u);
  EXPECT_TRUE(job.config.disable_dropout());
  EXPECT_EQ(job.config.base_version(), "base");
  EXPECT_EQ(job.config.tokenization().max_length(), 64);
  EXPECT_EQ(job.config.num_labels(), 0);

  // 3 epochs of batches 4, 4, 2; every epoch visits every example once, in a new order.
  const auto anchors = Anchors(job);
  ASSERT_EQ(anchors.size(), 9u);
  std::vector<std::vector<std::string>> epochs(3);
  for (size_t b = 0; b < anchors.size(); ++b) {
    EXPECT_EQ(anchors[b].size(), b % 3 == 2 ? 2u : 4u) << b;
    epochs[b / 3].insert(epochs[b / 3].end(), anchors[b].begin(), anchors[b].end());
  }
  for (const auto& epoch : epochs) {
    EXPECT_EQ(std::set<std::string>(epoch.begin(), epoch.end()).size(), 10u);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_EQ(job.batches[0].examples(0).positive(),
            absl::StrCat("p", job.batches[0].examples(0).anchor().substr(1)));
  EXPECT_TRUE(job.aborted);  // no --commit: the job is discarded
  EXPECT_FALSE(job.committed);

  // stderr: the plan, then (no terminal) progress lines at steps 1, 4, 8 and the last.
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "plan: 3 epochs x 3 steps = 9 steps, batches of 4 (the last of each epoch: 2); lr "
      "3e-05, warm-up 2 steps, linear decay to 0; seed 7\n"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "10 contrastive examples")) << r.err;
  std::vector<std::string> progress_lines;
  for (absl::string_view line : absl::StrSplit(r.err, '\n')) {
    if (absl::StartsWith(line, "step ")) progress_lines.emplace_back(line);
  }
  ASSERT_EQ(progress_lines.size(), 4u) << r.err;
  EXPECT_TRUE(absl::StartsWith(progress_lines[0],
                               "step 1/9  epoch 1/3  loss 2.0000  lr 2.67e-05  100.0 ex/s  "))
      << progress_lines[0];
  EXPECT_TRUE(absl::StartsWith(progress_lines[1], "step 4/9  epoch 2/3  loss 0.5000"))
      << progress_lines[1];
  EXPECT_TRUE(absl::StartsWith(progress_lines[3], "step 9/9  epoch 3/3  loss 0.2222"))
      << progress_lines[3];
  EXPECT_TRUE(absl::EndsWith(progress_lines[3], "ETA 0:00")) << progress_lines[3];

  // stdout: the summary.
  const std::vector<std::string> out = absl::StrSplit(r.out, '\n');
  ASSERT_EQ(out.size(), 3u) << r.out;
  EXPECT_TRUE(absl::StartsWith(out[0], "job job-7: 9/9 steps in 0:0")) << out[0];
  EXPECT_TRUE(absl::EndsWith(out[0], ", loss 2.0000 \u2192 0.2222 (from base)")) << out[0];
  EXPECT_EQ(out[1], "not committed (pass --commit to publish)");

  // The same seed gives the same batches; another seed others.
  trainer_->Reset();
  r = RunCli(FineTuneArgs({"--epochs", "3", "--batch-size", "4", "--seed", "7"}));
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(Anchors(trainer_->jobs()[0]), anchors);
  trainer_->Reset();
  r = RunCli(FineTuneArgs({"--epochs", "3", "--batch-size", "4", "--seed", "8"}));
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_NE(Anchors(trainer_->jobs()[0]), anchors);
}

TEST_F(TrainerCliTest, CommitAndJson) {
  CliResult r = RunCli(FineTuneArgs(
      {"--batch-size", "5", "--commit", "--description", "faq pairs v2", "--log-every", "100"}));
  EXPECT_EXIT_CODE(r, 0);
  auto job = trainer_->jobs().at(0);
  EXPECT_TRUE(job.committed);
  EXPECT_FALSE(job.aborted);
  EXPECT_EQ(job.commit.description(), "faq pairs v2");
  EXPECT_FALSE(job.commit.promote());
  EXPECT_EQ(job.batches.size(), 2u);
  EXPECT_TRUE(absl::StrContains(
      r.out,
      "\ncommitted version ft-000003-20261122T050000Z (staged: not served by default; try it "
      "with --model-version ft-000003-20261122T050000Z, then 'attnctl promote --version "
      "ft-000003-20261122T050000Z')\nstaged: promotion not requested\n"))
      << r.out;
  // --promote: the version is served by default once committed.
  trainer_->Reset();
  r = RunCli(FineTuneArgs({"--batch-size", "5", "--commit", "--promote", "--log-every", "100"}));
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(trainer_->jobs().at(0).commit.promote());
  EXPECT_TRUE(absl::StrContains(r.out,
                                "\ncommitted version ft-000003-20261122T050000Z (promoted: now "
                                "served by default; 'attnctl rollback' undoes)\n"))
      << r.out;

  // --json: one JSON line per message on stdout (2 steps + the final one); the rest on stderr.
  trainer_->Reset();
  r = RunCli(FineTuneArgs({"--batch-size", "5", "--json", "--commit"}));
  EXPECT_EXIT_CODE(r, 0);
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "{\"job_id\":\"job-7\",\"step\":\"1\",\"loss\":2,"))
      << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "\"base_version\":\"base\"")) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[2], "\"committed_version\":\"ft-000003-20261122T050000Z\""))
      << lines[2];
  EXPECT_TRUE(absl::StrContains(r.err, "committed version ft-000003")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "step 1/2")) << r.err;
}

TEST_F(TrainerCliTest, TokenSources) {
  // $ATTNSERVE_TOKEN when there is no --token-file.
  CliResult r =
      RunCli({"finetune", "--server", Target(), "--data", data_, "--objective", "contrastive"}, "",
             absl::StrCat("ATTNSERVE_TOKEN=", kToken));
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(trainer_->jobs().back().authorization, "Bearer s3cret-token");

  r = RunCli({"finetune", "--server", Target(), "--data", data_, "--objective", "contrastive"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(
      r.err, "attnctl: UNAUTHENTICATED: missing metadata 'authorization: Bearer <token>'\n"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "hint: the Trainer needs its token: pass --token-file"))
      << r.err;

  const std::string wrong = WriteTemp("wrong-token", "nope\n");
  r = RunCli({"versions", "--server", Target(), "--token-file", wrong});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StartsWith(r.err, "attnctl: PERMISSION_DENIED: wrong trainer token\n"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "hint: wrong token")) << r.err;
  std::remove(wrong.c_str());

  r = RunCli({"versions", "--server", Target(), "--token-file", "/nonexistent/token"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StartsWith(r.err, "attnctl: cannot read token file /nonexistent/token: "))
      << r.err;
  const std::string empty = WriteTemp("empty-token", "\n");
  r = RunCli({"versions", "--server", Target(), "--token-file", empty});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "is empty")) << r.err;
  std::remove(empty.c_str());
}

TEST_F(TrainerCliTest, DataErrorsBeforeConnecting) {
  const std::string bad = WriteTemp("bad.jsonl",
                                    "{\"anchor\": \"a\", \"positive\": \"b\"}\n"
                                    "{\"anchor\": \"a\", \"positive\": 3}\n"
                                    "not json\n");
  CliResult r = RunCli({"finetune", "--server", Target(), "--token-file", token_file_, "--data",
                        bad, "--objective", "contrastive"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("attnctl: ", bad, ":2: \"positive\" must be a string, not a number\n")))
      << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("attnctl: ", bad, ":3: bad JSON at column 2: syntax error")))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "Run 'attnctl finetune --help' for the data format."));
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(trainer_->jobs().empty());  // never connected

  // The objective decides which fields are needed; data of another objective is said once.
  r = RunCli({"finetune", "--server", Target(), "--data", data_, "--objective", "cosine"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "this looks like contrastive data: 10 of 10 lines"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "; pass --objective contrastive\n")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, ":2:")) << "one message, not one per line: " << r.err;

  r = RunCli({"finetune", "--server", Target(), "--data", "/nonexistent/d.jsonl", "--objective",
              "contrastive"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: cannot read /nonexistent/d.jsonl: No such file or directory\n");

  // Classification: --num-labels bounds the labels; without it, the largest label + 1.
  const std::string labels = WriteTemp("labels.jsonl",
                                       "{\"text\": \"x\", \"label\": 0}\n"
                                       "{\"text\": \"y\", \"label\": 4}\n");
  r = RunCli({"finetune", "--server", Target(), "--data", labels, "--objective", "classification",
              "--num-labels", "3"});
  EXPECT_EXIT_CODE(r, 2);
  EXPECT_TRUE(absl::StrContains(r.err, ":2: \"label\" 4 is not below --num-labels 3")) << r.err;
  r = RunCli({"finetune", "--server", Target(), "--token-file", token_file_, "--data", labels,
              "--objective", "classification", "--parameters", "head"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(trainer_->jobs().back().config.num_labels(), 5);
  EXPECT_EQ(trainer_->jobs().back().config.objective(), v1::CLASSIFICATION);
  EXPECT_EQ(trainer_->jobs().back().config.parameters(), v1::PARAMETERS_HEAD_ONLY);
  EXPECT_EQ(trainer_->jobs().back().batches.at(0).examples_size(), 2);
  std::remove(labels.c_str());

  // --dry-run: the plan, no connection.
  trainer_->Reset();
  r = RunCli({"finetune", "--data", data_, "--objective", "contrastive", "--dry-run", "--epochs",
              "2", "--batch-size", "5", "--server", "127.0.0.1:1"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(
      r.out,
      "plan: 2 epochs x 2 steps = 4 steps, batches of 5; lr 2e-05, linear decay to 0; "
      "seed 0\ndry run: data OK, nothing sent\n"))
      << r.out;
  EXPECT_TRUE(trainer_->jobs().empty());
  std::remove(bad.c_str());
}

TEST_F(TrainerCliTest, ServerStopsTheJob) {
  trainer_->FailAtBatch(2);
  CliResult r = RunCli(FineTuneArgs({"--batch-size", "2", "--commit"}));
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(
      r.err, "attnctl: INVALID_ARGUMENT: job job-7 stopped at batch 2: text too long\n"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "the job stopped after step 1 of 5; nothing committed"))
      << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "job job-7: 1/5 steps")) << r.out;
  EXPECT_FALSE(trainer_->jobs().at(0).committed);
  // At most two batches ahead of the server's answers.
  EXPECT_LE(trainer_->jobs().at(0).batches.size(), 3u);
}

TEST_F(TrainerCliTest, SilentServerTimesOut) {
  trainer_->SetStepDelay(std::chrono::milliseconds(1500));
  CliResult r = RunCli(FineTuneArgs({"--timeout-ms", "300"}));
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "no answer from the server for 300 ms: cancelled the job"))
      << r.err;
  EXPECT_TRUE(trainer_->WaitForJobEnd(testing::ScaledMilliseconds(5000)));
}

// Runs attnctl in the background (stdout/stderr to files); the caller waits for it.
pid_t SpawnCli(const std::vector<std::string>& args, const std::string& out_path,
               const std::string& err_path) {
  std::vector<std::string> strings = {ATTNCTL_BINARY};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ATTNSERVE_")) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, ATTNCTL_BINARY, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return error == 0 ? pid : -1;
}

TEST_F(TrainerCliTest, CtrlCAbortsTheJob) {
  trainer_->SetStepDelay(std::chrono::milliseconds(100));
  const std::string out_path = TempPath("ctrlc.out");
  const std::string err_path = TempPath("ctrlc.err");
  const pid_t pid = SpawnCli(FineTuneArgs({"--batch-size", "2", "--epochs", "10", "--commit"}),
                             out_path, err_path);
  ASSERT_GT(pid, 0);
  const auto until = std::chrono::steady_clock::now() + testing::ScaledSeconds(20);
  while (trainer_->batches_received() < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(trainer_->batches_received(), 3u);
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string out = ReadFile(out_path);
  const std::string err = ReadFile(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 130) << err;
  EXPECT_TRUE(absl::StrContains(err, "interrupted: aborting the job after the current step"))
      << err;
  EXPECT_TRUE(absl::StrContains(out, "aborted: nothing committed, serving unchanged")) << out;
  const auto job = trainer_->jobs().at(0);
  EXPECT_TRUE(job.aborted);  // told the server, rather than just hanging up
  EXPECT_FALSE(job.committed);
  EXPECT_LT(job.batches.size(), 20u);
  EXPECT_TRUE(job.status.ok()) << job.status.error_message();
}

TEST_F(TrainerCliTest, VersionsTable) {
  CliResult r = RunCli({"versions", "--server", Target(), "--token-file", token_file_});
  EXPECT_EXIT_CODE(r, 0);
  const std::string expected =
      "  version                     created               origin                               "
      "                                  description\n"
      "  base                        2026-11-22T04:00:00Z  loaded from /models/all-MiniLM-L6-v2\n"
      "  ft-000001-20261122T041000Z  2026-11-22T04:10:00Z  fine-tuned from base (contrastive, 12 "
      "steps)\n"
      "* ft-000002-20261122T041900Z  2026-11-22T04:19:00Z  fine-tuned from "
      "ft-000001-20261122T041000Z (classification, 40 steps)  support intents\n";
  EXPECT_EQ(r.out, expected);

  r = RunCli({"versions", "--server", Target(), "--token-file", token_file_, "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "{\"versions\":[{\"version\":\"base\"")) << r.out;
  EXPECT_TRUE(absl::EndsWith(r.out, "\"serving_version\":\"ft-000002-20261122T041900Z\"}\n"))
      << r.out;
}

TEST_F(TrainerCliTest, RollbackAndServeVersion) {
  CliResult r = RunCli({"rollback", "--server", Target(), "--token-file", token_file_});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "rolled back: now serving ft-000001-20261122T041000Z\n\n"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\n* ft-000001-20261122T041000Z  ")) << r.out;

  // --version here is the model version, not the program's.
  r = RunCli({"rollback", "--version", "base", "--server", Target(), "--token-file", token_file_});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "rolled back: now serving base\n")) << r.out;

  r = RunCli({"serve-version", "--server", Target(), "--token-file", token_file_,
              "--version=ft-000002-20261122T041900Z", "--json"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::EndsWith(r.out, "\"serving_version\":\"ft-000002-20261122T041900Z\"}\n"))
      << r.out;

  r = RunCli(
      {"serve-version", "--server", Target(), "--token-file", token_file_, "--version", "nope"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: NOT_FOUND: unknown model version 'nope'\n");
  r = RunCli({"versions", "--server", Target(), "--token-file", token_file_});
  EXPECT_TRUE(absl::StrContains(r.out, "\n* ft-000002-20261122T041900Z  ")) << r.out;

  // promote: the Promote RPC, named version required.
  r = RunCli({"promote", "--server", Target(), "--token-file", token_file_, "--version",
              "ft-000001-20261122T041000Z"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "promoted: now serving ft-000001-20261122T041000Z\n\n"))
      << r.out;
  EXPECT_EQ(trainer_->promoted(), std::vector<std::string>{"ft-000001-20261122T041000Z"});
  r = RunCli({"promote", "--server", Target(), "--token-file", token_file_, "--version", "nope"});
  EXPECT_EXIT_CODE(r, 1);
  EXPECT_EQ(r.err, "attnctl: NOT_FOUND: unknown model version 'nope'\n");

  // Elsewhere --version is still attnctl's own.
  r = RunCli({"versions", "--version"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_EQ(r.out, "attnctl 0.1.0\n");
}

TEST(AttnctlUsage, TrainerUsageErrors) {
  const std::string data = WriteTemp("usage.jsonl", PairsJsonl(3));
  CliResult r = RunCli({"finetune", "--help"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "{\"anchor\": \"...\", \"positive\": \"...\""));
  EXPECT_TRUE(absl::StrContains(r.out, "--token-file PATH"));
  r = RunCli({"--help"});
  for (const char* cmd : {"finetune", "versions", "promote", "rollback", "serve-version"}) {
    EXPECT_TRUE(absl::StrContains(r.out, cmd)) << cmd;
  }
  r = RunCli({"help", "serve-version"});
  EXPECT_EXIT_CODE(r, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--version V"));

  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"finetune", "--objective", "contrastive"}, "finetune needs --data FILE"},
      {{"finetune", "--data", data}, "finetune needs --objective"},
      {{"finetune", "--data", data, "--objective", "triplet"}, "--objective must be contrastive"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--epochs", "0"},
       "--epochs must be >= 1"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--batch-size", "0"},
       "--batch-size must be >= 1"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--lr", "-1"},
       "--lr must be a positive number"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--lr", "fast"},
       "invalid value 'fast' for --lr"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--warmup-steps", "-1"},
       "--warmup-steps must be >= 0"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--warmup-steps", "5"},
       "--warmup-steps 5 exceeds the job's 1 steps"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--num-labels", "3"},
       "--num-labels applies to --objective classification and pair_classification only"},
      {{"finetune", "--data", data, "--objective", "classification", "--num-labels", "1"},
       "--num-labels must be >= 2"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--parameters", "some"},
       "--parameters must be all, attention, all-but-embeddings or head"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--parameters", "head"},
       "--parameters head needs --objective classification"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--description", "x"},
       "add --commit"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--do-not-serve"},
       "--do-not-serve goes with --commit"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--label-names", "a,b"},
       "--label-names applies to --objective classification and pair_classification"},
      {{"rerank", "--documents", "/nonexistent/docs.txt"}, "rerank needs --query"},
      {{"rerank", "--query", "q", "--documents", "/nonexistent/docs.txt"},
       "cannot read --documents /nonexistent/docs.txt"},
      {{"rerank", "--query", "q", "--rerank-method", "bm25", "--documents", data},
       "--rerank-method must be auto, cosine or cross-encoder, not 'bm25'"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--truncation", "mid"},
       "--truncation must be"},
      {{"finetune", "--data", data, "--objective", "contrastive", "extra"},
       "unexpected argument 'extra'; 'finetune' takes flags only"},
      {{"finetune", "--text", "a"}, "--text does not apply to 'finetune'"},
      {{"versions", "--data", data}, "--data does not apply to 'versions'"},
      {{"encode", "--token-file", "t", "--text", "a"}, "--token_file does not apply to 'encode'"},
      {{"serve-version"}, "serve-version needs --version V"},
      {{"promote"}, "promote needs --version V"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--promote"},
       "--promote goes with --commit"},
      {{"finetune", "--data", data, "--objective", "contrastive", "--commit", "--promote",
        "--do-not-serve"},
       "--promote and --do-not-serve contradict each other"},
      {{"rollback", "--version"}, "--version needs a value"},
      {{"versions", "--commit"}, "--commit does not apply to 'versions'"},
  };
  for (const Case& c : cases) {
    r = RunCli(c.args);
    EXPECT_EXIT_CODE(r, 2) << absl::StrJoin(c.args, " ");
    EXPECT_TRUE(absl::StrContains(r.err, c.message))
        << absl::StrJoin(c.args, " ") << " -> " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  std::remove(data.c_str());
}

TEST(AttnctlUsage, TrainerUnreachable) {
  const std::string data = WriteTemp("unreachable.jsonl", PairsJsonl(3));
  for (std::vector<std::string> args :
       {std::vector<std::string>{"versions"}, std::vector<std::string>{"rollback"},
        std::vector<std::string>{"finetune", "--data", data, "--objective", "contrastive"}}) {
    args.insert(args.end(), {"--server", "localhost:1", "--timeout-ms", "5000"});
    CliResult r = RunCli(args);
    EXPECT_EXIT_CODE(r, 1);
    EXPECT_TRUE(absl::StrContains(r.err, "attnctl: cannot reach localhost:1 (UNAVAILABLE): "))
        << r.err;
  }
  std::remove(data.c_str());
}

}  // namespace
}  // namespace attn::client
