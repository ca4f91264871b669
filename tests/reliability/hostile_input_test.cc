// The hostile-input catalogue: every kind of malformed, extreme or out-of-range request we know
// of, sent over gRPC to the real attnserve. One table row per case says how it is sent, the
// status code it must get and words its message must contain. After every case the server must
// still be alive, SERVING on the health service and answering Encode, and its log must show no
// crash; at the end every rejected call must have been counted in attnserve_requests_total.
//
// Run one case: reliability_hostile_input_test --gtest_filter='*invalid_utf8*'
// List them:    reliability_hostile_input_test --gtest_list_tests
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "client/training_data.h"
#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

constexpr char kToken[] = "hostile-catalogue-token-7f3a";
constexpr int kMaxMessageBytes = 4 << 20;  // 4 MiB: a 1 MiB text fits, five of them do not
constexpr int kMaxInputs = 256;
// Server-side jobs: datasets up to 1 MiB, 8 jobs waiting per model.
constexpr int64_t kMaxJobDatasetBytes = 1 << 20;
constexpr int kMaxQueuedJobs = 8;
constexpr int64_t kMaxRequestMemory = 128
                                      << 20;  // 128 MiB: a 3 x 512-token rollout does not fit //
                                              // the server default, named here for the messages

std::optional<std::vector<std::string>> SharedServerFlags() {
  // Lives until the process exits, after the shared server has stopped.
  static reliability::TempDir* dir = new reliability::TempDir("hostile");
  return std::vector<std::string>{
      "--max_message_bytes=" + std::to_string(kMaxMessageBytes),
      "--max_inputs_per_request=" + std::to_string(kMaxInputs),
      "--trainer_token_file=" + dir->WriteFile("token", std::string(kToken) + "\n"),
      "--trainer_threads=1",
      "--max_request_memory_bytes=" + std::to_string(kMaxRequestMemory),
      "--model_store=" + dir->path() + "/store",
      "--max_job_dataset_bytes=" + std::to_string(kMaxJobDatasetBytes),
      "--max_queued_jobs=" + std::to_string(kMaxQueuedJobs)};
}

namespace {

using reliability::ExpectStatus;
namespace wire = reliability::wire;

constexpr int kMaxPositions = 512;
constexpr int kDefaultMaxLength = 256;

// What a case may use to send its request.
struct Clients {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Encoder::Stub> encoder;
  std::unique_ptr<pb::Trainer::Stub> trainer;
};

struct HostileCase {
  std::string name;  // [A-Za-z0-9_], the gtest parameter name
  std::string what;  // one line: what is sent
  std::function<grpc::Status(Clients&)> send;
  grpc::StatusCode code;
  std::vector<std::string> message_parts;
  // The attnserve_requests_total method label the server must count the call under; empty when
  // gRPC itself answers before the service sees the call (transport limits, unknown methods).
  std::string counted_as;
};

std::ostream& operator<<(std::ostream& out, const HostileCase& c) { return out << c.name; }

// ---------------------------------------------------------------------------------------------
// Ways to send

std::chrono::system_clock::time_point Deadline(int seconds = 120) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

grpc::Status Encode(Clients& c, const pb::EncodeRequest& request,
                    pb::EncodeResponse* response = nullptr) {
  pb::EncodeResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->Encode(&context, request, response != nullptr ? response : &ignored);
}

grpc::Status Explain(Clients& c, const pb::ExplainRequest& request) {
  pb::ExplainResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->Explain(&context, request, &ignored);
}

grpc::Status Classify(Clients& c, const pb::ClassifyRequest& request) {
  pb::ClassifyResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->Classify(&context, request, &ignored);
}

grpc::Status Rerank(Clients& c, const pb::RerankRequest& request) {
  pb::RerankResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->Rerank(&context, request, &ignored);
}

// A Rerank request of `query` against `documents`, then `configure`.
pb::RerankRequest RerankOf(const std::string& query, const std::vector<std::string>& documents,
                           const std::function<void(pb::RerankRequest*)>& configure = {}) {
  pb::RerankRequest request;
  request.set_query(query);
  for (const std::string& d : documents) request.add_documents(d);
  if (configure) configure(&request);
  return request;
}

// An Explain request of `query` against `documents`, then `configure`.
pb::ExplainRequest ExplainOf(const std::string& query, const std::vector<std::string>& documents,
                             const std::function<void(pb::ExplainRequest*)>& configure = {}) {
  pb::ExplainRequest request;
  request.set_query(query);
  for (const std::string& d : documents) request.add_documents(d);
  if (configure) configure(&request);
  return request;
}

grpc::Status Attention(Clients& c, const pb::AttentionMapRequest& request,
                       pb::AttentionMapResponse* response = nullptr) {
  pb::AttentionMapResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->AttentionMap(&context, request, response != nullptr ? response : &ignored);
}

grpc::Status Tokenize(Clients& c, const pb::TokenizeRequest& request,
                      pb::TokenizeResponse* response = nullptr) {
  pb::TokenizeResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return c.encoder->Tokenize(&context, request, response != nullptr ? response : &ignored);
}

grpc::Status Raw(Clients& c, const std::string& method, const std::string& bytes) {
  return reliability::RawUnaryCall(c.channel, method, bytes, nullptr);
}

const std::vector<std::pair<std::string, std::string>>& Bearer() {
  static const std::vector<std::pair<std::string, std::string>> metadata = {
      {"authorization", std::string("Bearer ") + kToken}};
  return metadata;
}

// One FineTune stream: writes `requests` in order (the server may end the stream early), then
// half-closes, drains the answers and returns the final status.
grpc::Status FineTune(Clients& c, const std::vector<pb::FineTuneRequest>& requests,
                      const std::string& token = kToken,
                      std::vector<pb::FineTuneProgress>* answers = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(300));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  auto stream = c.trainer->FineTune(&context);
  for (const pb::FineTuneRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  pb::FineTuneProgress progress;
  while (stream->Read(&progress)) {
    if (answers != nullptr) answers->push_back(progress);
  }
  return stream->Finish();
}

// Server-side jobs. One CreateJob stream: writes `requests` in order (stopping once the server
// has ended the call), half-closes, reads every answer and returns the final status.
grpc::Status CreateJob(Clients& c, const std::vector<pb::CreateJobRequest>& requests,
                       pb::CreateJobResponse* last = nullptr, const std::string& token = kToken) {
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  auto stream = c.trainer->CreateJob(&context);
  for (const pb::CreateJobRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  pb::CreateJobResponse response;
  while (stream->Read(&response)) {
    if (last != nullptr) *last = response;
  }
  return stream->Finish();
}

// `n` contrastive pairs the model does not know.
std::vector<pb::TrainingExample> JobPairs(int n) {
  std::vector<pb::TrainingExample> examples(n);
  for (int i = 0; i < n; ++i) {
    examples[i].set_anchor("hostile anchor number " + std::to_string(i));
    examples[i].set_positive("an unrelated positive " + std::to_string(i * 7));
  }
  return examples;
}

// The spec of a contrastive job over `dataset` in batches of 2, then `edit`.
pb::CreateJobRequest JobSpecOf(const client::JobDataset& dataset, int epochs = 1,
                               const std::function<void(pb::JobSpec*)>& edit = nullptr) {
  pb::CreateJobRequest request;
  pb::JobSpec* spec = request.mutable_spec();
  spec->mutable_config()->set_objective(pb::CONTRASTIVE);
  spec->mutable_config()->set_disable_dropout(true);
  spec->set_epochs(epochs);
  spec->set_batch_size(2);
  *spec->mutable_dataset() = dataset.info;
  if (edit) edit(spec);
  return request;
}

// `bytes` as chunks of `size` bytes numbered from `first`.
std::vector<pb::CreateJobRequest> ChunksOf(const std::string& bytes, size_t size, int first = 0) {
  std::vector<pb::CreateJobRequest> chunks;
  for (size_t at = 0; at < bytes.size(); at += size) {
    pb::CreateJobRequest& request = chunks.emplace_back();
    request.mutable_chunk()->set_index(first++);
    request.mutable_chunk()->set_data(bytes.substr(at, size));
  }
  return chunks;
}

// The spec, then the chunks.
std::vector<pb::CreateJobRequest> Upload(pb::CreateJobRequest spec,
                                         const std::vector<pb::CreateJobRequest>& chunks) {
  std::vector<pb::CreateJobRequest> requests = {std::move(spec)};
  requests.insert(requests.end(), chunks.begin(), chunks.end());
  return requests;
}

grpc::Status WatchJob(Clients& c, const std::string& id, int64_t from = 0,
                      const std::string& model = "") {
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  pb::WatchJobRequest request;
  request.set_job_id(id);
  request.set_model(model);
  request.set_from_index(from);
  auto stream = c.trainer->WatchJob(&context, request);
  pb::JobEvent event;
  while (stream->Read(&event)) {
  }
  return stream->Finish();
}

// GetJob or CancelJob (`method`) of job `id` of `model`, with the token.
template <typename Request>
grpc::Status JobCall(Clients& c,
                     grpc::Status (pb::Trainer::Stub::*method)(grpc::ClientContext*, const Request&,
                                                               pb::Job*),
                     const std::string& id, pb::Job* job, const std::string& model) {
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  Request request;
  request.set_job_id(id);
  request.set_model(model);
  pb::Job ignored;
  return (c.trainer.get()->*method)(&context, request, job != nullptr ? job : &ignored);
}

grpc::Status CancelJob(Clients& c, const std::string& id, pb::Job* job = nullptr,
                       const std::string& model = "") {
  return JobCall(c, &pb::Trainer::Stub::CancelJob, id, job, model);
}

grpc::Status GetJob(Clients& c, const std::string& id, pb::Job* job = nullptr,
                    const std::string& model = "") {
  return JobCall(c, &pb::Trainer::Stub::GetJob, id, job, model);
}

// ---------------------------------------------------------------------------------------------
// Requests

pb::EncodeRequest Texts(const std::vector<std::string>& texts) {
  pb::EncodeRequest request;
  for (const std::string& text : texts) request.add_inputs()->set_text(text);
  return request;
}

pb::EncodeRequest Pair(const std::string& first, const std::string& second) {
  pb::EncodeRequest request;
  request.add_inputs()->mutable_pair()->set_first(first);
  request.mutable_inputs(0)->mutable_pair()->set_second(second);
  return request;
}

pb::EncodeRequest Ids(const std::vector<int>& ids, const std::vector<int>& type_ids = {}) {
  pb::EncodeRequest request;
  request.add_inputs()->set_text("a valid first input");
  pb::TokenIds* tokens = request.add_inputs()->mutable_tokens();
  for (int id : ids) tokens->add_ids(id);
  for (int type : type_ids) tokens->add_type_ids(type);
  return request;
}

pb::AttentionMapRequest AttentionOf(const std::string& text) {
  pb::AttentionMapRequest request;
  request.add_inputs()->set_text(text);
  return request;
}

pb::FineTuneRequest Config(pb::Objective objective) {
  pb::FineTuneRequest request;
  request.mutable_config()->set_objective(objective);
  request.mutable_config()->set_learning_rate(1e-5);
  request.mutable_config()->set_disable_dropout(true);
  if (objective == pb::CLASSIFICATION || objective == pb::PAIR_CLASSIFICATION) {
    request.mutable_config()->set_num_labels(3);
  }
  return request;
}

pb::FineTuneRequest Batch(const std::vector<pb::TrainingExample>& examples) {
  pb::FineTuneRequest request;
  pb::TrainingBatch* batch = request.mutable_batch();  // set even when empty
  for (const pb::TrainingExample& example : examples) *batch->add_examples() = example;
  return request;
}

pb::TrainingExample Contrastive(const std::string& anchor, const std::string& positive,
                                const std::string& negative = "") {
  pb::TrainingExample example;
  example.set_anchor(anchor);
  example.set_positive(positive);
  if (!negative.empty()) example.set_negative(negative);
  return example;
}

pb::TrainingExample Scored(const std::string& first, const std::string& second, float score) {
  pb::TrainingExample example;
  example.set_first(first);
  example.set_second(second);
  example.set_score(score);
  return example;
}

pb::TrainingExample Labelled(const std::string& text, int label) {
  pb::TrainingExample example;
  example.set_text(text);
  example.set_label(label);
  return example;
}

pb::FineTuneRequest Commit() {
  pb::FineTuneRequest request;
  request.mutable_commit();
  return request;
}

pb::FineTuneRequest Abort(bool abort = true) {
  pb::FineTuneRequest request;
  request.set_abort(abort);
  return request;
}

// Hand-made wire bytes of attnserve.v1 messages (field numbers from encoder.proto).
namespace raw {
std::string TextInput(std::string_view text) { return wire::Field(1, text); }  // Input.text
std::string PairInput(std::string_view first, std::string_view second) {
  return wire::Field(2, wire::Field(1, first) + wire::Field(2, second));  // Input.pair
}
// EncodeRequest / AttentionMapRequest / TokenizeRequest: `inputs` is field 1 in all three.
std::string RequestWithInputs(const std::vector<std::string>& inputs) {
  std::string out;
  for (const std::string& input : inputs) out += wire::Field(1, input);
  return out;
}
// A FineTuneRequest carrying one TrainingBatch (field 2) of one example.
std::string BatchOf(const std::string& example) { return wire::Field(2, wire::Field(1, example)); }
}  // namespace raw

const std::string kEncode = "/attnserve.v1.Encoder/Encode";
const std::string kAttention = "/attnserve.v1.Encoder/AttentionMap";
const std::string kTokenize = "/attnserve.v1.Encoder/Tokenize";
const std::string kModelInfo = "/attnserve.v1.Encoder/GetModelInfo";
const std::string kListVersions = "/attnserve.v1.Trainer/ListVersions";
const std::string kRollback = "/attnserve.v1.Trainer/Rollback";
const std::string kSetServing = "/attnserve.v1.Trainer/SetServingVersion";

// A megabyte of text in words the vocabulary knows.
std::string Megabyte(const std::string& unit = "lorem ipsum dolor sit amet ") {
  std::string text;
  text.reserve((1 << 20) + unit.size());
  while (text.size() < (1 << 20)) text += unit;  // whole units: multi-byte ones stay valid
  return text;
}

// ---------------------------------------------------------------------------------------------
// The catalogue

std::vector<HostileCase> Catalogue() {
  using grpc::StatusCode;
  std::vector<HostileCase> cases;
  auto add = [&cases](HostileCase c) { cases.push_back(std::move(c)); };
  const std::string vocab = std::to_string(kVocabSize);

  // --- Empty and oversized requests -------------------------------------------------------------
  add({"empty_encode_request",
       "EncodeRequest with no inputs",
       [](Clients& c) { return Encode(c, pb::EncodeRequest()); },
       StatusCode::INVALID_ARGUMENT,
       {"no inputs", std::to_string(kMaxInputs)},
       "Encode"});
  add({"empty_attention_request",
       "AttentionMapRequest with no inputs",
       [](Clients& c) { return Attention(c, pb::AttentionMapRequest()); },
       StatusCode::INVALID_ARGUMENT,
       {"no inputs"},
       "AttentionMap"});
  add({"empty_tokenize_request",
       "TokenizeRequest with no inputs",
       [](Clients& c) { return Tokenize(c, pb::TokenizeRequest()); },
       StatusCode::INVALID_ARGUMENT,
       {"no inputs"},
       "Tokenize"});
  add({"zero_byte_request",
       "Encode with a zero-length body (a valid, empty EncodeRequest)",
       [](Clients& c) { return Raw(c, kEncode, ""); },
       StatusCode::INVALID_ARGUMENT,
       {"no inputs"},
       "Encode"});
  add({"input_kind_not_set",
       "an Input with neither text, pair nor tokens",
       [](Clients& c) {
         pb::EncodeRequest request;
         request.add_inputs();
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "set text, pair or tokens"},
       "Encode"});
  add({"empty_text_at_index_2",
       "three texts, the third empty",
       [](Clients& c) {
         return Encode(c, Texts({"first", "second", ""}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[2]", "empty"},
       "Encode"});
  add({"ten_thousand_inputs",
       "Encode with 10,000 inputs (limit 256)",
       [](Clients& c) { return Encode(c, Texts(std::vector<std::string>(10000, "x"))); },
       StatusCode::INVALID_ARGUMENT,
       {"10000", std::to_string(kMaxInputs), "max-inputs-per-request"},
       "Encode"});
  add({"ten_thousand_tokenize_inputs",
       "Tokenize with 10,000 inputs",
       [](Clients& c) {
         pb::TokenizeRequest request;
         for (int i = 0; i < 10000; ++i) request.add_inputs()->set_text("x");
         return Tokenize(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"10000", std::to_string(kMaxInputs)},
       "Tokenize"});
  add({"one_megabyte_text",
       "a 1 MiB text: served, truncated to the default 256 tokens",
       [](Clients& c) {
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, Texts({Megabyte()}), &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), kDefaultMaxLength);
           EXPECT_TRUE(response.results(0).truncated());
           // Tokenized up to the 256 kept and the 8,192-token look-ahead, not to its end.
           EXPECT_TRUE(response.results(0).untruncated_length_is_lower_bound());
           EXPECT_GE(response.results(0).untruncated_length(), 256 + 8192);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"one_megabyte_word",
       "a 1 MiB text without spaces: one over-long word, [UNK]",
       [](Clients& c) {
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, Texts({std::string(1 << 20, 'a')}), &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), 3);
           if (response.results(0).tokens_size() == 3) {
             EXPECT_EQ(response.results(0).tokens(1).text(), "[UNK]");
           }
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"one_megabyte_cjk",
       "1 MiB of CJK characters (one token each) for AttentionMap",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf(Megabyte("\xe4\xb8\xad"));  // U+4E2D
         request.add_layers(-1);
         request.add_heads(0);
         request.set_top_k(4);
         pb::AttentionMapResponse response;
         const grpc::Status status = Attention(c, request, &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), kDefaultMaxLength);
           EXPECT_TRUE(response.results(0).truncated());
         }
         return status;
       },
       StatusCode::OK,
       {},
       "AttentionMap"});
  add({"one_megabyte_combining_marks",
       "'a' followed by 1 MiB of U+0301 (accent stripping)",
       [](Clients& c) {
         std::string text = "a" + Megabyte("\xcc\x81");
         pb::TokenizeRequest request;
         request.add_inputs()->set_text(text);
         pb::TokenizeResponse response;
         const grpc::Status status = Tokenize(c, request, &response);
         if (status.ok()) {
           EXPECT_GE(response.results(0).tokens_size(), 3);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Tokenize"});
  add({"one_megabyte_text_truncation_none",
       "a 1 MiB text with TRUNCATION_NONE",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({Megabyte()});
         request.mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "TRUNCATION_NONE", std::to_string(kDefaultMaxLength)},
       "Encode"});
  add({"request_over_message_limit",
       "five 1 MiB texts (5 MiB) with --max-message-bytes 4 MiB",
       [](Clients& c) { return Encode(c, Texts(std::vector<std::string>(5, Megabyte()))); },
       StatusCode::RESOURCE_EXHAUSTED,
       {std::to_string(kMaxMessageBytes), "max-message-bytes"},
       "Encode"});
  add({"request_over_transport_limit",
       "a 10 MiB text: beyond gRPC's own receive limit",
       [](Clients& c) { return Encode(c, Texts({std::string(10 << 20, 'a')})); },
       StatusCode::RESOURCE_EXHAUSTED,
       {"larger than max"},
       ""});
  add({"response_over_message_limit",
       "all 6x12 attention maps of 512 tokens (75 MB) at 4 MiB",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf(TextOfTokens(kMaxPositions));
         request.mutable_tokenization()->set_max_length(kMaxPositions);
         return Attention(c, request);
       },
       StatusCode::RESOURCE_EXHAUSTED,
       {"response", std::to_string(kMaxMessageBytes), "top_k"},
       "AttentionMap"});
  add({"attention_scores_qkv_16x512",
       "16 x 512 tokens, every layer and head with scores and Q/K/V: 2.6 GB from an 80 KB request",
       [](Clients& c) {
         pb::AttentionMapRequest request;
         for (int i = 0; i < 16; ++i) request.add_inputs()->set_text(TextOfTokens(512, i));
         request.mutable_tokenization()->set_max_length(kMaxPositions);
         request.set_include_scores(true);
         request.set_include_qkv(true);
         return Attention(c, request);
       },
       StatusCode::RESOURCE_EXHAUSTED,
       {"response would be at least", "--max-message-bytes", "FLOAT16"},
       "AttentionMap"});
  add({"rollout_over_request_memory",
       "rollout of 3 x 512 tokens in float16: a 1.6 MB answer from ~230 MB of maps (limit 128 MiB)",
       [](Clients& c) {
         pb::AttentionMapRequest request;
         for (int i = 0; i < 3; ++i) request.add_inputs()->set_text(TextOfTokens(512, i));
         request.mutable_tokenization()->set_max_length(kMaxPositions);
         request.add_layers(-1);
         request.set_include_weights(false);
         request.set_rollout(true);
         request.set_output_dtype(pb::FLOAT16);
         return Attention(c, request);
       },
       StatusCode::RESOURCE_EXHAUSTED,
       {"bytes of memory", std::to_string(kMaxRequestMemory), "--max-request-memory-bytes"},
       "AttentionMap"});

  // --- Text content: invalid UTF-8 (sent as raw bytes), NUL bytes ------------------------------
  add({"invalid_utf8_text",
       "inputs[0].text = 'caf\\xC3' (truncated 2-byte sequence)",
       [](Clients& c) {
         return Raw(c, kEncode, raw::RequestWithInputs({raw::TextInput("caf\xc3")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].text", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_lone_continuation",
       "inputs[1].text has a lone 0x80 byte",
       [](Clients& c) {
         return Raw(c, kEncode,
                    raw::RequestWithInputs({raw::TextInput("fine"), raw::TextInput("a\x80z")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1].text", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_surrogate",
       "a UTF-16 surrogate encoded in UTF-8 (ED A0 80)",
       [](Clients& c) {
         return Raw(c, kEncode, raw::RequestWithInputs({raw::TextInput("x\xed\xa0\x80y")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].text", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_overlong",
       "an overlong encoding of '/' (C0 AF)",
       [](Clients& c) {
         return Raw(c, kEncode, raw::RequestWithInputs({raw::TextInput("\xc0\xaf")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].text", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_pair_second",
       "pair.second = FF FE",
       [](Clients& c) {
         return Raw(c, kEncode, raw::RequestWithInputs({raw::PairInput("fine", "\xff\xfe")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].pair.second", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_attention",
       "AttentionMap with invalid UTF-8 text",
       [](Clients& c) {
         return Raw(c, kAttention,
                    raw::RequestWithInputs({raw::TextInput("\xf8\x88\x80\x80\x80")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].text", "UTF-8"},
       "AttentionMap"});
  add({"invalid_utf8_tokenize",
       "Tokenize with invalid UTF-8 text",
       [](Clients& c) {
         return Raw(c, kTokenize, raw::RequestWithInputs({raw::TextInput("\xe2\x82")}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0].text", "UTF-8"},
       "Tokenize"});
  add({"invalid_utf8_model_version",
       "EncodeRequest.model_version = 'v\\xFF'",
       [](Clients& c) {
         return Raw(c, kEncode,
                    raw::RequestWithInputs({raw::TextInput("fine")}) + wire::Field(9, "v\xff"));
       },
       StatusCode::INVALID_ARGUMENT,
       {"model_version", "UTF-8"},
       "Encode"});
  add({"invalid_utf8_model_info_version",
       "GetModelInfoRequest.model_version = FF",
       [](Clients& c) { return Raw(c, kModelInfo, wire::Field(1, "\xff")); },
       StatusCode::INVALID_ARGUMENT,
       {"model_version", "UTF-8"},
       "GetModelInfo"});
  add({"nul_bytes_in_text",
       "'hello\\0world': NUL is dropped as a control character",
       [](Clients& c) {
         // Hugging Face's BERT normaliser removes U+0000, so the text reads as "helloworld".
         pb::TokenizeRequest with_nul, without;
         with_nul.add_inputs()->set_text(std::string("hello\0world", 11));
         without.add_inputs()->set_text("helloworld");
         pb::TokenizeResponse a, b;
         const grpc::Status status = Tokenize(c, with_nul, &a);
         EXPECT_TRUE(Tokenize(c, without, &b).ok());
         if (status.ok()) {
           std::vector<int> with_ids, without_ids;
           for (const pb::Token& token : a.results(0).tokens()) with_ids.push_back(token.id());
           for (const pb::Token& token : b.results(0).tokens()) without_ids.push_back(token.id());
           EXPECT_EQ(with_ids, without_ids);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Tokenize"});
  add({"only_nul_bytes",
       "a text of 1000 NUL bytes: nothing left but [CLS] [SEP]",
       [](Clients& c) {
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, Texts({std::string(1000, '\0')}), &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), 2);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"nul_bytes_in_pair",
       "a pair whose halves are NUL-laden",
       [](Clients& c) { return Encode(c, Pair(std::string("a\0b", 3), std::string("\0\0c", 3))); },
       StatusCode::OK,
       {},
       "Encode"});
  add({"whitespace_only_text",
       "a text of spaces, tabs and newlines",
       [](Clients& c) {
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, Texts({" \t\n  \r\n "}), &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), 2);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});

  // --- Token ids and type ids ------------------------------------------------------------------
  add({"token_id_negative",
       "inputs[1].tokens.ids contains -1",
       [](Clients& c) {
         return Encode(c, Ids({101, 2023, -1, 102}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "-1", vocab},
       "Encode"});
  add({"token_id_vocab_size",
       "a token id equal to the vocabulary size",
       [](Clients& c) {
         return Encode(c, Ids({101, kVocabSize, 102}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", vocab},
       "Encode"});
  add({"token_id_int32_max",
       "a token id of 2^31-1",
       [](Clients& c) {
         return Encode(c, Ids({101, std::numeric_limits<int>::max(), 102}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "2147483647"},
       "Encode"});
  add({"token_id_int32_min_tokenize",
       "Tokenize with a token id of -2^31",
       [](Clients& c) {
         pb::TokenizeRequest request;
         request.add_inputs()->mutable_tokens()->add_ids(std::numeric_limits<int>::min());
         return Tokenize(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "-2147483648"},
       "Tokenize"});
  add({"token_type_id_2",
       "type id 2 (type_vocab_size is 2)",
       [](Clients& c) {
         return Encode(c, Ids({101, 2023, 102}, {0, 2, 0}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "type id 2"},
       "Encode"});
  add({"token_type_id_negative",
       "type id -1",
       [](Clients& c) {
         return Encode(c, Ids({101, 2023, 102}, {0, -1, 0}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "type id -1"},
       "Encode"});
  add({"token_type_ids_count_mismatch",
       "1 type id for 3 token ids",
       [](Clients& c) {
         return Encode(c, Ids({101, 2023, 102}, {0}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "type_ids", "3 ids"},
       "Encode"});
  add({"token_ids_empty",
       "tokens with no ids",
       [](Clients& c) { return Encode(c, Ids({})); },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "tokens.ids is empty"},
       "Encode"});
  add({"token_ids_over_positions",
       "513 token ids (512 positions)",
       [](Clients& c) { return Encode(c, Ids(std::vector<int>(kMaxPositions + 1, 1000))); },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[1]", "513", "512"},
       "Encode"});

  // --- Pairs -----------------------------------------------------------------------------------
  add({"pair_empty_first",
       "a pair whose first half is empty",
       [](Clients& c) { return Encode(c, Pair("", "second half")); },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "pair.first is empty"},
       "Encode"});
  add({"pair_empty_second",
       "a pair whose second half is empty",
       [](Clients& c) { return Encode(c, Pair("first half", "")); },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "pair.second is empty"},
       "Encode"});
  add({"pair_max_length_2",
       "a pair with max_length 2 (3 special tokens needed)",
       [](Clients& c) {
         pb::EncodeRequest request = Pair("first", "second");
         request.mutable_tokenization()->set_max_length(2);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "max_length"},
       "Encode"});

  // --- max_length ------------------------------------------------------------------------------
  add({"max_length_0_is_default",
       "max_length 0 = the model default (256)",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({TextOfTokens(400)});
         request.mutable_tokenization()->set_max_length(0);
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, request, &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), kDefaultMaxLength);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"max_length_1",
       "max_length 1: no room for [CLS] and [SEP]",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"hello world"});
         request.mutable_tokenization()->set_max_length(1);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "max_length"},
       "Encode"});
  add({"max_length_negative",
       "max_length -1",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"hello"});
         request.mutable_tokenization()->set_max_length(-1);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"max_length", "-1"},
       "Encode"});
  add({"max_length_int32_min",
       "max_length -2^31 (AttentionMap)",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("hello");
         request.mutable_tokenization()->set_max_length(std::numeric_limits<int>::min());
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"max_length", "-2147483648"},
       "AttentionMap"});
  add({"max_length_huge",
       "max_length 2^31-1 (Tokenize)",
       [](Clients& c) {
         pb::TokenizeRequest request;
         request.add_inputs()->set_text("hello");
         request.mutable_tokenization()->set_max_length(std::numeric_limits<int>::max());
         return Tokenize(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"2147483647", std::to_string(kMaxPositions)},
       "Tokenize"});

  // --- Unknown enum values (proto3 enums are open) ---------------------------------------------
  add({"unknown_pooling",
       "pooling = 99",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"enums"});
         request.set_pooling(static_cast<pb::Pooling>(99));
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"pooling", "99"},
       "Encode"});
  add({"unknown_output_dtype",
       "output_dtype = -1",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"enums"});
         request.set_output_dtype(static_cast<pb::DType>(-1));
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"output_dtype", "-1"},
       "Encode"});
  add({"unknown_truncation",
       "tokenization.truncation = 7",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"enums"});
         request.mutable_tokenization()->set_truncation(static_cast<pb::Truncation>(7));
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"truncation", "7"},
       "Encode"});
  add({"unknown_attention_dtype",
       "AttentionMap output_dtype = 1000",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("enums");
         request.set_output_dtype(static_cast<pb::DType>(1000));
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"output_dtype", "1000"},
       "AttentionMap"});

  // --- Layers, heads, top-k --------------------------------------------------------------------
  add({"hidden_layer_7",
       "hidden_layers [7] (0..6 exist)",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"layers"});
         request.add_hidden_layers(7);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"hidden_layers[0] = 7"},
       "Encode"});
  add({"hidden_layer_minus_8",
       "hidden_layers [-8]",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"layers"});
         request.add_hidden_layers(-8);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"hidden_layers[0] = -8"},
       "Encode"});
  add({"hidden_layers_duplicate",
       "hidden_layers [-1, 6]: the same layer twice",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"layers"});
         request.add_hidden_layers(-1);
         request.add_hidden_layers(6);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"hidden_layers[1]", "repeats layer 6"},
       "Encode"});
  add({"hidden_layers_100000",
       "100,000 hidden_layers entries",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"layers"});
         for (int i = 0; i < 100000; ++i) request.add_hidden_layers(i % 7);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"hidden_layers[7]", "repeats"},
       "Encode"});
  add({"attention_layer_6",
       "AttentionMap layers [6] (0..5 exist)",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("layers");
         request.add_layers(6);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"layers[0] = 6"},
       "AttentionMap"});
  add({"attention_layers_duplicate",
       "AttentionMap layers [2, -4]",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("layers");
         request.add_layers(2);
         request.add_layers(-4);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"layers[1]", "repeats layer 2"},
       "AttentionMap"});
  add({"head_12",
       "heads [12] (0..11 exist)",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("heads");
         request.add_heads(12);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"heads[0] = 12"},
       "AttentionMap"});
  add({"head_negative",
       "heads [0, -1]",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("heads");
         request.add_heads(0);
         request.add_heads(-1);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"heads[1] = -1"},
       "AttentionMap"});
  add({"heads_duplicate",
       "heads [3, 3]",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("heads");
         request.add_heads(3);
         request.add_heads(3);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"heads[1] = 3", "repeated"},
       "AttentionMap"});
  add({"top_k_0_is_dense",
       "top_k 0: dense maps",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("top k zero");
         request.add_layers(0);
         request.set_top_k(0);
         pb::AttentionMapResponse response;
         const grpc::Status status = Attention(c, request, &response);
         if (status.ok()) {
           const pb::LayerAttention& layer = response.results(0).layers(0);
           const int64_t T = response.results(0).tokens_size();
           EXPECT_EQ(Shape(layer.weights()), (std::vector<int64_t>{kNumHeads, T, T}));
           EXPECT_FALSE(layer.has_weights_top_k());
         }
         return status;
       },
       StatusCode::OK,
       {},
       "AttentionMap"});
  add({"top_k_negative",
       "top_k -1",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("top k");
         request.set_top_k(-1);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"top_k", "-1"},
       "AttentionMap"});
  add({"top_k_huge_is_clamped",
       "top_k 2^31-1: clamped to the sequence length",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("top k huge");
         request.add_layers(0);
         request.set_top_k(std::numeric_limits<int>::max());
         pb::AttentionMapResponse response;
         const grpc::Status status = Attention(c, request, &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).layers(0).weights_top_k().k(),
                     response.results(0).tokens_size());
         }
         return status;
       },
       StatusCode::OK,
       {},
       "AttentionMap"});
  add({"attention_nothing_requested",
       "include_weights false and nothing else",
       [](Clients& c) {
         pb::AttentionMapRequest request = AttentionOf("nothing");
         request.set_include_weights(false);
         return Attention(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"nothing to return"},
       "AttentionMap"});

  // --- Model versions --------------------------------------------------------------------------
  add({"model_version_10kb",
       "a 10 KB model_version: quoted 64 bytes long in the NOT_FOUND message",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"hello"});
         request.set_model_version(std::string(10240, 'v'));
         const grpc::Status status = Encode(c, request);
         EXPECT_LT(status.error_message().size(), 400u) << status.error_message().substr(0, 200);
         return status;
       },
       StatusCode::NOT_FOUND,
       {"\u2026(10240 bytes)", "not found"},
       "Encode"});
  add({"unknown_model_version",
       "model_version 'v999'",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"versions"});
         request.set_model_version("v999");
         return Encode(c, request);
       },
       StatusCode::NOT_FOUND,
       {"v999", "base"},
       "Encode"});
  add({"model_version_path_traversal",
       "model_version '../../etc/passwd'",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"versions"});
         request.set_model_version("../../etc/passwd");
         return Encode(c, request);
       },
       StatusCode::NOT_FOUND,
       {"../../etc/passwd"},
       "Encode"});
  add({"model_version_with_nul",
       "model_version 'base\\0x' (valid UTF-8, embedded NUL)",
       [](Clients& c) {
         grpc::ClientContext context;
         pb::GetModelInfoRequest request;
         request.set_model_version(std::string("base\0x", 6));
         pb::ModelInfo info;
         return c.encoder->GetModelInfo(&context, request, &info);
       },
       StatusCode::NOT_FOUND,
       {"base"},
       "GetModelInfo"});
  // --- Models (the request field `model`, several models per server) ------------------------
  add({"unknown_model",
       "model 'bert-large' (this server serves one model)",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"models"});
         request.set_model("bert-large");
         return Encode(c, request);
       },
       StatusCode::NOT_FOUND,
       {"'bert-large' is not served here", "served models:"},
       "Encode"});
  add({"model_name_of_10000_chars",
       "model of 10,000 characters",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"models"});
         request.set_model(std::string(10000, 'm'));
         const grpc::Status status = Encode(c, request);
         EXPECT_LT(status.error_message().size(), 400u) << status.error_message().substr(0, 200);
         return status;
       },
       StatusCode::NOT_FOUND,
       {"\u2026(10000 bytes)", "served models:"},
       "Encode"});
  add({"unknown_model_attention",
       "AttentionMap with model 'nope'",
       [](Clients& c) {
         pb::AttentionMapRequest request;
         request.add_inputs()->set_text("models");
         request.set_model("nope");
         pb::AttentionMapResponse response;
         grpc::ClientContext context;
         context.set_deadline(Deadline());
         return c.encoder->AttentionMap(&context, request, &response);
       },
       StatusCode::NOT_FOUND,
       {"'nope' is not served here"},
       "AttentionMap"});
  add({"unknown_model_list_versions",
       "ListVersions of model 'nope'",
       [](Clients& c) {
         grpc::ClientContext context;
         context.AddMetadata("authorization", std::string("Bearer ") + kToken);
         pb::ListVersionsRequest request;
         request.set_model("nope");
         pb::ListVersionsResponse response;
         return c.trainer->ListVersions(&context, request, &response);
       },
       StatusCode::NOT_FOUND,
       {"'nope' is not served here"},
       "ListVersions"});
  add({"invalid_utf8_model",
       "GetModelInfoRequest.model = FF FE",
       [](Clients& c) { return Raw(c, kModelInfo, wire::Field(2, "\xff\xfe")); },
       StatusCode::INVALID_ARGUMENT,
       {"model", "UTF-8"},
       "GetModelInfo"});

  // --- Garbage and malformed protobuf bytes through a raw channel ------------------------------
  add({"garbage_bytes",
       "4 KiB of seeded random bytes as an EncodeRequest",
       [](Clients& c) {
         std::mt19937 random(20240607);
         std::string bytes(4096, '\0');
         for (char& b : bytes) b = static_cast<char>(random() & 0xff);
         // The bytes must really be unparsable for this case to mean anything.
         EXPECT_FALSE(pb::EncodeRequest().ParseFromString(bytes));
         return Raw(c, kEncode, bytes);
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.EncodeRequest"},
       "Encode"});
  add({"garbage_overlong_varint",
       "eleven 0xFF bytes: a varint tag longer than 10 bytes",
       [](Clients& c) { return Raw(c, kEncode, std::string(11, '\xff')); },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.EncodeRequest"},
       "Encode"});
  add({"garbage_field_number_0",
       "a tag with field number 0",
       [](Clients& c) { return Raw(c, kTokenize, wire::VarintField(0, 1)); },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.TokenizeRequest"},
       "Tokenize"});
  add({"garbage_invalid_wire_type",
       "a tag with wire type 7",
       [](Clients& c) { return Raw(c, kAttention, wire::Tag(1, 7) + "xyz"); },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.AttentionMapRequest"},
       "AttentionMap"});
  add({"length_beyond_end",
       "inputs claims 1000 bytes, 5 follow",
       [](Clients& c) { return Raw(c, kEncode, wire::Tag(1, 2) + wire::Varint(1000) + "hello"); },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.EncodeRequest"},
       "Encode"});
  add({"truncated_request",
       "a valid EncodeRequest cut in the middle of its text",
       [](Clients& c) {
         std::string bytes;
         Texts({"a perfectly fine sentence"}).SerializeToString(&bytes);
         return Raw(c, kEncode, bytes.substr(0, bytes.size() - 6));
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.EncodeRequest"},
       "Encode"});
  add({"nested_groups_100000_deep",
       "an unknown field of 100,000 nested groups",
       [](Clients& c) {
         const std::string open = wire::Tag(15, wire::kStartGroup);
         const std::string close = wire::Tag(15, wire::kEndGroup);
         std::string bytes = raw::RequestWithInputs({raw::TextInput("deep")});
         for (int i = 0; i < 100000; ++i) bytes += open;
         for (int i = 0; i < 100000; ++i) bytes += close;
         return Raw(c, kEncode, bytes);
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.EncodeRequest"},
       "Encode"});
  add({"nested_messages_inside_text_input",
       "inputs[0] holding 50,000 nested length prefixes",
       [](Clients& c) {
         // Each level is an unknown length-delimited field 15 inside the previous one. Unknown
         // fields are kept as opaque bytes, so this parses and is served. Prefixes are built
         // from the inside out (wrapping a string 50,000 times would copy gigabytes).
         constexpr int kLevels = 50000;
         std::vector<std::string> prefixes(kLevels);
         size_t inner_size = 1;  // the innermost "x"
         for (int level = kLevels - 1; level >= 0; --level) {
           prefixes[level] = wire::Tag(15, wire::kLengthDelimited) + wire::Varint(inner_size);
           inner_size += prefixes[level].size();
         }
         std::string nested;
         for (const std::string& prefix : prefixes) nested += prefix;
         nested += "x";
         return Raw(c, kEncode, wire::Field(1, raw::TextInput("nested") + nested));
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"wrong_wire_type_for_inputs",
       "inputs (field 1) sent as a varint",
       [](Clients& c) { return Raw(c, kEncode, wire::VarintField(1, 42)); },
       StatusCode::INVALID_ARGUMENT,
       {"no inputs"},
       "Encode"});
  add({"unknown_fields_are_ignored",
       "a valid request plus unknown fields 99 and 1000",
       [](Clients& c) {
         std::string bytes = raw::RequestWithInputs({raw::TextInput("forward compatible")}) +
                             wire::VarintField(99, 7) + wire::Field(1000, "\xff\xfe opaque");
         std::string response_bytes;
         const grpc::Status status =
             reliability::RawUnaryCall(c.channel, kEncode, bytes, &response_bytes);
         pb::EncodeResponse response;
         if (status.ok()) {
           EXPECT_TRUE(response.ParseFromString(response_bytes));
           EXPECT_EQ(response.results_size(), 1);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"garbage_model_info",
       "GetModelInfo with garbage bytes",
       [](Clients& c) { return Raw(c, kModelInfo, "\x0a\xff\xff\xff\xff\x0f"); },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.GetModelInfoRequest"},
       "GetModelInfo"});
  add({"unknown_method",
       "a call to /attnserve.v1.Encoder/Nope",
       [](Clients& c) { return Raw(c, "/attnserve.v1.Encoder/Nope", ""); },
       StatusCode::UNIMPLEMENTED,
       {},
       ""});

  // --- Fine-tuning streams ---------------------------------------------------------------------
  const pb::TrainingExample ok_pair = Contrastive("a red bicycle", "a bike that is red");
  add({"contrastive_single_pair",
       "a contrastive batch of one pair: no in-batch negatives, loss exactly 0",
       [ok_pair](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE), Batch({ok_pair})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"batch 1", "at least 2", "negatives"},
       "FineTune"});
  add({"finetune_without_token",
       "FineTune with no authorization metadata",
       [](Clients& c) { return FineTune(c, {Config(pb::CONTRASTIVE)}, ""); },
       StatusCode::UNAUTHENTICATED,
       {"authorization", "Bearer"},
       "FineTune"});
  add({"finetune_wrong_token",
       "FineTune with a wrong bearer token",
       [](Clients& c) { return FineTune(c, {Config(pb::CONTRASTIVE)}, "not-the-token"); },
       StatusCode::PERMISSION_DENIED,
       {"token"},
       "FineTune"});
  add({"batch_before_config",
       "a batch as the first message",
       [ok_pair](Clients& c) { return FineTune(c, {Batch({ok_pair})}); },
       StatusCode::INVALID_ARGUMENT,
       {"first message must be a config"},
       "FineTune"});
  add({"config_sent_twice",
       "two configs in one stream",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE), Config(pb::CONTRASTIVE)});
       },
       StatusCode::INVALID_ARGUMENT,
       {"second config"},
       "FineTune"});
  add({"commit_without_steps",
       "config, then commit",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE), Commit()});
       },
       StatusCode::FAILED_PRECONDITION,
       {"nothing to commit"},
       "FineTune"});
  add({"empty_finetune_message",
       "a FineTuneRequest with nothing set",
       [](Clients& c) { return FineTune(c, {pb::FineTuneRequest()}); },
       StatusCode::INVALID_ARGUMENT,
       {"empty FineTuneRequest"},
       "FineTune"});
  add({"abort_false",
       "config, then abort: false",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE), Abort(false)});
       },
       StatusCode::INVALID_ARGUMENT,
       {"abort is false"},
       "FineTune"});
  add({"zero_length_batch",
       "config, then a batch of 0 examples",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE), Batch({})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"batch 1", "0 examples"},
       "FineTune"});
  add({"batch_over_example_limit",
       "a batch of 257 examples (limit 256)",
       [ok_pair](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE),
                             Batch(std::vector<pb::TrainingExample>(kMaxInputs + 1, ok_pair))});
       },
       StatusCode::INVALID_ARGUMENT,
       {"257", "max-inputs-per-request"},
       "FineTune"});
  add({"mismatched_negatives",
       "contrastive batch: examples[0] has a negative, examples[1] not",
       [ok_pair](Clients& c) {
         return FineTune(c, {Config(pb::CONTRASTIVE),
                             Batch({Contrastive("anchor", "positive", "negative"), ok_pair})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[1]", "negative"},
       "FineTune"});
  add({"pair_missing_second_text",
       "cosine example with first but no second",
       [](Clients& c) {
         return FineTune(c,
                         {Config(pb::COSINE_SIMILARITY), Batch({Scored("only first", "", 0.5f)})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[0].second is empty"},
       "FineTune"});
  add({"nan_gold_score",
       "cosine gold score NaN",
       [](Clients& c) {
         return FineTune(c, {Config(pb::COSINE_SIMILARITY),
                             Batch({Scored("a", "b", 0.5f),
                                    Scored("c", "d", std::numeric_limits<float>::quiet_NaN())})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[1].score", "finite"},
       "FineTune"});
  add({"inf_gold_score",
       "cosine gold score +Inf",
       [](Clients& c) {
         return FineTune(c, {Config(pb::COSINE_SIMILARITY),
                             Batch({Scored("a", "b", std::numeric_limits<float>::infinity())})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[0].score", "finite"},
       "FineTune"});
  add({"gold_score_out_of_range",
       "cosine gold score 1.5",
       [](Clients& c) {
         return FineTune(c, {Config(pb::COSINE_SIMILARITY), Batch({Scored("a", "b", 1.5f)})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[0].score is 1.5", "[-1, 1]"},
       "FineTune"});
  add({"label_out_of_range",
       "classification label 3 with num_labels 3",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CLASSIFICATION),
                             Batch({Labelled("fine", 0), Labelled("too high", 3)})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[1].label is 3", "[0, 3)"},
       "FineTune"});
  add({"label_negative",
       "classification label -1",
       [](Clients& c) {
         return FineTune(c, {Config(pb::CLASSIFICATION), Batch({Labelled("negative", -1)})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[0].label is -1"},
       "FineTune"});
  add({"unknown_objective",
       "config.objective = 42",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_objective(static_cast<pb::Objective>(42));
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"objective", "42"},
       "FineTune"});
  add({"unknown_parameter_selection",
       "config.parameters = 9",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_parameters(static_cast<pb::ParameterSelection>(9));
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"parameters", "9"},
       "FineTune"});
  add({"nan_learning_rate",
       "config.learning_rate = NaN",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_learning_rate(std::nan(""));
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"learning_rate", "finite"},
       "FineTune"});
  add({"beta1_equal_1",
       "config.beta1 = 1",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_beta1(1.0);
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"beta1", "[0, 1)"},
       "FineTune"});
  add({"num_labels_huge",
       "CLASSIFICATION with num_labels 2^31-1",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CLASSIFICATION);
         config.mutable_config()->set_num_labels(std::numeric_limits<int>::max());
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"num_labels", "2147483647"},
       "FineTune"});
  add({"telemetry_every_negative",
       "config.telemetry_every = -1",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_telemetry_every(-1);
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.telemetry_every is -1", "0 (no telemetry)"},
       "FineTune"});
  add({"precision_int8",
       "config.precision = int8 (training runs in float32 or bfloat16)",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_precision("int8");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.precision is 'int8'", "bfloat16"},
       "FineTune"});
  add({"config_max_length_negative",
       "config.tokenization.max_length = -3",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->mutable_tokenization()->set_max_length(-3);
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.tokenization.max_length", "-3"},
       "FineTune"});
  add({"base_version_traversal",
       "config.base_version = '../x'",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_base_version("../x");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"base_version", "../x"},
       "FineTune"});
  add({"invalid_utf8_training_text",
       "a batch whose anchor is FF FE (raw bytes)",
       [](Clients& c) {
         std::string config;
         Config(pb::CONTRASTIVE).SerializeToString(&config);
         const std::string example = wire::Field(1, "\xff\xfe") + wire::Field(2, "positive");
         return reliability::RawBidiCall(c.channel, "/attnserve.v1.Trainer/FineTune",
                                         {config, raw::BatchOf(example)}, nullptr, Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"UTF-8"},
       "FineTune"});
  add({"garbage_finetune_message",
       "config, then 64 bytes of 0xFF",
       [](Clients& c) {
         std::string config;
         Config(pb::CONTRASTIVE).SerializeToString(&config);
         return reliability::RawBidiCall(c.channel, "/attnserve.v1.Trainer/FineTune",
                                         {config, std::string(64, '\xff')}, nullptr, Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"FineTuneRequest"},
       "FineTune"});
  add({"one_megabyte_training_text",
       "a classification step on a 1 MiB text, then abort",
       [](Clients& c) {
         std::vector<pb::FineTuneProgress> answers;
         const grpc::Status status =
             FineTune(c, {Config(pb::CLASSIFICATION), Batch({Labelled(Megabyte(), 1)}), Abort()},
                      kToken, &answers);
         if (status.ok()) {
           EXPECT_GE(answers.size(), 2u);
           if (!answers.empty()) {
             EXPECT_EQ(answers.front().step(), 1);
           }
           if (!answers.empty()) {
             EXPECT_TRUE(answers.back().committed_version().empty());
           }
         }
         return status;
       },
       StatusCode::OK,
       {},
       "FineTune"});
  add({"rollback_absolute_path",
       "Rollback to version '/etc'",
       [](Clients& c) {
         grpc::ClientContext context;
         context.AddMetadata("authorization", std::string("Bearer ") + kToken);
         pb::RollbackRequest request;
         request.set_version("/etc");
         pb::ListVersionsResponse response;
         return c.trainer->Rollback(&context, request, &response);
       },
       StatusCode::INVALID_ARGUMENT,
       {"version", "/"},
       "Rollback"});
  add({"set_serving_version_empty",
       "SetServingVersion with an empty version",
       [](Clients& c) {
         grpc::ClientContext context;
         context.AddMetadata("authorization", std::string("Bearer ") + kToken);
         pb::SetServingVersionRequest request;
         pb::ListVersionsResponse response;
         return c.trainer->SetServingVersion(&context, request, &response);
       },
       StatusCode::INVALID_ARGUMENT,
       {"version", "empty"},
       "SetServingVersion"});
  // Promote (issue 16): the same checks as SetServingVersion, the one code path behind both.
  auto promote = [](const std::string& version, const std::string& model = "") {
    return [version, model](Clients& c) {
      grpc::ClientContext context;
      context.AddMetadata("authorization", std::string("Bearer ") + kToken);
      pb::PromoteRequest request;
      request.set_version(version);
      request.set_model(model);
      pb::ListVersionsResponse response;
      return c.trainer->Promote(&context, request, &response);
    };
  };
  add({"promote_unknown_version",
       "Promote 'ft-999999-20260101T000000Z' (never committed)",
       promote("ft-999999-20260101T000000Z"),
       StatusCode::NOT_FOUND,
       {"ft-999999-20260101T000000Z"},
       "Promote"});
  add({"promote_empty_version",
       "Promote with an empty version",
       promote(""),
       StatusCode::INVALID_ARGUMENT,
       {"version", "empty"},
       "Promote"});
  add({"promote_overlong_version",
       "Promote a 10,000-character version name",
       promote(std::string(10000, 'v')),
       StatusCode::INVALID_ARGUMENT,
       {"version", "10000 characters"},
       "Promote"});
  add({"promote_control_character_version",
       "Promote 'ft-1\\x07\\x1b[2J' (BEL and an escape sequence)",
       promote("ft-1\x07\x1b[2J"),
       StatusCode::INVALID_ARGUMENT,
       {"version", "\\x07", "index 4"},
       "Promote"});
  add({"promote_path_traversal",
       "Promote '../../etc'",
       promote("../../etc"),
       StatusCode::INVALID_ARGUMENT,
       {"version", "index 2"},
       "Promote"});
  add({"promote_unknown_model",
       "Promote base of model 'no-such-model'",
       promote("base", "no-such-model"),
       StatusCode::NOT_FOUND,
       {"no-such-model"},
       "Promote"});
  // The version RPCs parse their bytes themselves too (gRPC's typed handler used to answer these
  // with a bare UNIMPLEMENTED, uncounted).
  add({"invalid_utf8_rollback_version",
       "RollbackRequest.version = 'v\\xFF' (raw bytes)",
       [](Clients& c) {
         return reliability::RawUnaryCall(c.channel, kRollback, wire::Field(1, "v\xff"), nullptr,
                                          Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.RollbackRequest", "version", "UTF-8"},
       "Rollback"});
  add({"invalid_utf8_set_serving_version",
       "SetServingVersionRequest.version = C0 AF (overlong '/', raw bytes)",
       [](Clients& c) {
         return reliability::RawUnaryCall(c.channel, kSetServing, wire::Field(1, "\xc0\xaf"),
                                          nullptr, Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.SetServingVersionRequest", "version", "UTF-8"},
       "SetServingVersion"});
  add({"set_serving_version_length_beyond_end",
       "SetServingVersionRequest.version claims 1000 bytes, 3 follow",
       [](Clients& c) {
         return reliability::RawUnaryCall(c.channel, kSetServing,
                                          wire::Tag(1, 2) + wire::Varint(1000) + "abc", nullptr,
                                          Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.SetServingVersionRequest", "1000"},
       "SetServingVersion"});
  add({"garbage_list_versions",
       "ListVersions with garbage bytes",
       [](Clients& c) {
         return reliability::RawUnaryCall(c.channel, kListVersions, "\x0a\xff\xff\xff\xff\x0f",
                                          nullptr, Bearer());
       },
       StatusCode::INVALID_ARGUMENT,
       {"attnserve.v1.ListVersionsRequest"},
       "ListVersions"});
  add({"garbage_rollback_without_token",
       "Rollback with garbage bytes and no token: the token is checked first",
       [](Clients& c) { return Raw(c, kRollback, std::string(16, '\xff')); },
       StatusCode::UNAUTHENTICATED,
       {},
       "Rollback"});

  // --- CompareVersions and Neighbors (issue 20): read-only, every limit named ------------------
  auto compare = [](Clients& c, const pb::CompareVersionsRequest& request) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(Deadline());
    pb::CompareVersionsResponse response;
    return c.trainer->CompareVersions(&context, request, &response);
  };
  auto compare_of = [](const std::string& a, const std::string& b,
                       std::vector<std::string> probes = {}) {
    pb::CompareVersionsRequest request;
    request.set_version_a(a);
    request.set_version_b(b);
    for (std::string& probe : probes) request.add_probes(std::move(probe));
    return request;
  };
  auto neighbors = [](Clients& c, const pb::NeighborsRequest& request) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(Deadline());
    pb::NeighborsResponse response;
    return c.trainer->Neighbors(&context, request, &response);
  };
  auto neighbors_of = [](const std::string& word,
                         const std::function<void(pb::NeighborsRequest*)>& edit = nullptr) {
    pb::NeighborsRequest request;
    request.set_word(word);
    if (edit) edit(&request);
    return request;
  };
  add({"compare_unknown_version",
       "CompareVersions base vs an unknown version 'v999'",
       [=](Clients& c) { return compare(c, compare_of("base", "v999")); },
       StatusCode::NOT_FOUND,
       {"v999", "base"},
       "CompareVersions"});
  add({"compare_missing_version",
       "CompareVersions without version_a",
       [=](Clients& c) { return compare(c, compare_of("", "base")); },
       StatusCode::INVALID_ARGUMENT,
       {"version_a is empty", "ListVersions"},
       "CompareVersions"});
  add({"compare_version_path_traversal",
       "CompareVersions with version_b '../../etc'",
       [=](Clients& c) { return compare(c, compare_of("base", "../../etc")); },
       StatusCode::INVALID_ARGUMENT,
       {"version_b"},
       "CompareVersions"});
  add({"compare_100000_probes",
       "CompareVersions with 100,000 probe texts (limit 1000)",
       [=](Clients& c) {
         return compare(c, compare_of("base", "base", std::vector<std::string>(100000, "probe")));
       },
       StatusCode::INVALID_ARGUMENT,
       {"100000 probes", "11 to 1000"},
       "CompareVersions"});
  add({"compare_3_probes",
       "CompareVersions with 3 probe texts (top-10 neighbours need 11)",
       [=](Clients& c) {
         return compare(c, compare_of("base", "base", {"a", "b", "c"}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"3 probes", "11 to 1000"},
       "CompareVersions"});
  add({"compare_empty_probe",
       "CompareVersions with an empty probe text at index 4",
       [=](Clients& c) {
         std::vector<std::string> probes(12, "a probe text");
         probes[4].clear();
         return compare(c, compare_of("base", "base", probes));
       },
       StatusCode::INVALID_ARGUMENT,
       {"probes[4] is empty"},
       "CompareVersions"});
  add({"compare_long_probe",
       "CompareVersions with a 1 MiB probe text (limit 2000 bytes)",
       [=](Clients& c) {
         std::vector<std::string> probes(12, "a probe text");
         probes[7] = std::string(1 << 20, 'x');
         return compare(c, compare_of("base", "base", probes));
       },
       StatusCode::INVALID_ARGUMENT,
       {"probes[7]", "1048576 bytes", "2000"},
       "CompareVersions"});
  add({"compare_unknown_model",
       "CompareVersions on an unknown model_b",
       [=](Clients& c) {
         pb::CompareVersionsRequest request = compare_of("base", "base");
         request.set_model_b("nope");
         return compare(c, request);
       },
       StatusCode::NOT_FOUND,
       {"nope"},
       "CompareVersions"});
  add({"compare_without_token",
       "CompareVersions without the trainer token",
       [=](Clients& c) {
         grpc::ClientContext context;
         pb::CompareVersionsResponse response;
         return c.trainer->CompareVersions(&context, compare_of("base", "base"), &response);
       },
       StatusCode::UNAUTHENTICATED,
       {},
       "CompareVersions"});
  add({"neighbors_10000_char_word",
       "Neighbors of a 10,000-character word (limit 100)",
       [=](Clients& c) { return neighbors(c, neighbors_of(std::string(10000, 'k'))); },
       StatusCode::INVALID_ARGUMENT,
       {"10000 characters", "100"},
       "Neighbors"});
  add({"neighbors_layer_7",
       "Neighbors at layer 7 of 6",
       [=](Clients& c) {
         return neighbors(c, neighbors_of("bank", [](pb::NeighborsRequest* r) {
                            r->set_layer(7);
                            r->add_sentences("the bank of the river");
                            r->add_sentences("the bank lends money");
                          }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"layer is 7", "0 (the embedding output) to 6"},
       "Neighbors"});
  add({"neighbors_layer_minus_1",
       "Neighbors at layer -1",
       [=](Clients& c) {
         return neighbors(c,
                          neighbors_of("bank", [](pb::NeighborsRequest* r) { r->set_layer(-1); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"layer is -1"},
       "Neighbors"});
  add({"neighbors_token_id_vocab_size",
       "Neighbors of token_id 30522 (= vocab size)",
       [=](Clients& c) {
         pb::NeighborsRequest request;
         request.set_token_id(30522);
         return neighbors(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"token_id is 30522", "0 to 30521"},
       "Neighbors"});
  add({"neighbors_word_and_token_id",
       "Neighbors with both a word and a token_id",
       [=](Clients& c) {
         return neighbors(
             c, neighbors_of("king", [](pb::NeighborsRequest* r) { r->set_token_id(5); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"exactly one"},
       "Neighbors"});
  add({"neighbors_word_not_in_sentence",
       "Neighbors of 'bank' in a sentence without it",
       [=](Clients& c) {
         return neighbors(c, neighbors_of("bank", [](pb::NeighborsRequest* r) {
                            r->add_sentences("the bank of the river");
                            r->add_sentences("a cat on a mat");
                          }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"sentences[1] does not contain", "bank"},
       "Neighbors"});
  add({"neighbors_top_k_101",
       "Neighbors with top_k 101 (limit 100)",
       [=](Clients& c) {
         return neighbors(c,
                          neighbors_of("king", [](pb::NeighborsRequest* r) { r->set_top_k(101); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"top_k is 101", "100"},
       "Neighbors"});
  add({"neighbors_unknown_version",
       "Neighbors in an unknown version 'v999'",
       [=](Clients& c) {
         return neighbors(
             c, neighbors_of("king", [](pb::NeighborsRequest* r) { r->set_version("v999"); }));
       },
       StatusCode::NOT_FOUND,
       {"v999"},
       "Neighbors"});

  // --- Evaluate and evaluation sets in a FineTune config (issue 16) --------------------------
  auto evaluate = [](Clients& c, const pb::EvaluateRequest& request) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(Deadline());
    pb::EvaluationResult response;
    return c.trainer->Evaluate(&context, request, &response);
  };
  // A retrieval set of `queries` queries over `corpus` items, then `edit`.
  auto retrieval_of = [](int queries, int corpus,
                         const std::function<void(pb::EvaluationSet*)>& edit = nullptr) {
    pb::EvaluationSet set;
    set.set_task(pb::EVALUATION_RETRIEVAL);
    for (int i = 0; i < queries; ++i) {
      set.add_queries("a red kettle");
      set.add_relevant(i % corpus);
    }
    for (int i = 0; i < corpus; ++i) set.add_corpus("Vornak Zelto");
    if (edit) edit(&set);
    return set;
  };
  auto evaluate_of = [](const pb::EvaluationSet& set, const std::string& version = "") {
    pb::EvaluateRequest request;
    request.set_version(version);
    *request.mutable_evaluation() = set;
    return request;
  };
  add({"evaluate_unknown_version",
       "Evaluate version 'v999'",
       [=](Clients& c) { return evaluate(c, evaluate_of(retrieval_of(2, 2), "v999")); },
       StatusCode::NOT_FOUND,
       {"v999"},
       "Evaluate"});
  add({"evaluate_version_path_traversal",
       "Evaluate version '../../etc'",
       [=](Clients& c) { return evaluate(c, evaluate_of(retrieval_of(2, 2), "../../etc")); },
       StatusCode::INVALID_ARGUMENT,
       {"version"},
       "Evaluate"});
  add({"evaluate_no_task",
       "Evaluate an empty evaluation set",
       [=](Clients& c) { return evaluate(c, evaluate_of(pb::EvaluationSet())); },
       StatusCode::INVALID_ARGUMENT,
       {"evaluation.task is not set"},
       "Evaluate"});
  add({"evaluate_unknown_task",
       "Evaluate with task 9",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(2, 2, [](pb::EvaluationSet* s) {
                           s->set_task(static_cast<pb::EvaluationTask>(9));
                         })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"evaluation.task: unknown value 9"},
       "Evaluate"});
  add({"evaluate_no_queries",
       "Evaluate a retrieval set with a corpus and no queries",
       [=](Clients& c) { return evaluate(c, evaluate_of(retrieval_of(0, 3))); },
       StatusCode::INVALID_ARGUMENT,
       {"0 queries", "at least one of each"},
       "Evaluate"});
  add({"evaluate_10000_texts",
       "Evaluate 9,000 queries over 1,000 items (limit 5,000 texts)",
       [=](Clients& c) { return evaluate(c, evaluate_of(retrieval_of(9000, 1000))); },
       StatusCode::INVALID_ARGUMENT,
       {"10000 texts", "5000"},
       "Evaluate"});
  add({"evaluate_relevant_out_of_range",
       "Evaluate with relevant[1] = 7 of a 3-item corpus",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(
                                2, 3, [](pb::EvaluationSet* s) { s->set_relevant(1, 7); })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"relevant[1] is 7", "0 to 2"},
       "Evaluate"});
  add({"evaluate_relevant_negative",
       "Evaluate with relevant[0] = -2^31",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(2, 3, [](pb::EvaluationSet* s) {
                           s->set_relevant(0, std::numeric_limits<int32_t>::min());
                         })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"relevant[0] is -2147483648"},
       "Evaluate"});
  add({"evaluate_missing_relevant",
       "Evaluate 3 queries with 2 relevant indices",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(3, 3, [](pb::EvaluationSet* s) {
                           s->mutable_relevant()->RemoveLast();
                         })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"3 queries but 2 relevant"},
       "Evaluate"});
  add({"evaluate_empty_corpus_item",
       "Evaluate with an empty corpus item at index 1",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(
                                2, 3, [](pb::EvaluationSet* s) { s->set_corpus(1, ""); })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"evaluation.corpus[1] is empty"},
       "Evaluate"});
  add({"evaluate_1mib_query",
       "Evaluate with a 1 MiB query (limit 8,192 bytes)",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(2, 2, [](pb::EvaluationSet* s) {
                           s->set_queries(0, std::string(1 << 20, 'q'));
                         })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"evaluation.queries[0] has 1048576 bytes", "8192"},
       "Evaluate"});
  add({"evaluate_retrieval_with_examples",
       "Evaluate a retrieval set that also carries classification examples",
       [=](Clients& c) {
         return evaluate(c, evaluate_of(retrieval_of(2, 2, [](pb::EvaluationSet* s) {
                           s->add_examples()->set_text("stray");
                         })));
       },
       StatusCode::INVALID_ARGUMENT,
       {"evaluation.examples is set", "retrieval"},
       "Evaluate"});
  add({"evaluate_classification_without_head",
       "Evaluate a classification set on base (no head)",
       [=](Clients& c) {
         pb::EvaluationSet set;
         set.set_task(pb::EVALUATION_CLASSIFICATION);
         set.add_examples()->set_text("a kettle");
         return evaluate(c, evaluate_of(set, "base"));
       },
       StatusCode::FAILED_PRECONDITION,
       {"base has no classification head"},
       "Evaluate"});
  add({"evaluate_one_cosine_pair",
       "Evaluate a cosine-similarity set of 1 pair (Spearman needs 2)",
       [=](Clients& c) {
         pb::EvaluationSet set;
         set.set_task(pb::EVALUATION_COSINE_SIMILARITY);
         pb::TrainingExample* e = set.add_examples();
         e->set_first("a");
         e->set_second("b");
         e->set_score(0.5f);
         return evaluate(c, evaluate_of(set));
       },
       StatusCode::INVALID_ARGUMENT,
       {"1 pair", "at least 2"},
       "Evaluate"});
  add({"evaluate_nan_score",
       "Evaluate a cosine-similarity pair with score NaN",
       [=](Clients& c) {
         pb::EvaluationSet set;
         set.set_task(pb::EVALUATION_COSINE_SIMILARITY);
         for (float score : {0.5f, std::numeric_limits<float>::quiet_NaN()}) {
           pb::TrainingExample* e = set.add_examples();
           e->set_first("a");
           e->set_second("b");
           e->set_score(score);
         }
         return evaluate(c, evaluate_of(set));
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[1].score is not a finite number"},
       "Evaluate"});
  add({"evaluate_without_token",
       "Evaluate without the trainer token",
       [=](Clients& c) {
         grpc::ClientContext context;
         pb::EvaluationResult response;
         return c.trainer->Evaluate(&context, evaluate_of(retrieval_of(2, 2)), &response);
       },
       StatusCode::UNAUTHENTICATED,
       {},
       "Evaluate"});
  add({"finetune_eval_every_negative",
       "FineTune config.eval_every = -1",
       [=](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         *config.mutable_config()->mutable_evaluation() = retrieval_of(2, 2);
         config.mutable_config()->set_eval_every(-1);
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.eval_every is -1"},
       "FineTune"});
  add({"finetune_promote_if_without_evaluation",
       "FineTune config.promote_if without an evaluation set",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->set_promote_if("recall@1>=0.8");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.promote_if needs an evaluation set"},
       "FineTune"});
  add({"finetune_promote_if_garbage",
       "FineTune config.promote_if = 'recall@1 >= lots; rm -rf /'",
       [=](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         *config.mutable_config()->mutable_evaluation() = retrieval_of(2, 2);
         config.mutable_config()->set_promote_if("recall@1 >= lots; rm -rf /");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.promote_if", "the threshold is not a number"},
       "FineTune"});
  add({"finetune_promote_if_unknown_metric",
       "FineTune config.promote_if on accuracy for a retrieval set",
       [=](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         *config.mutable_config()->mutable_evaluation() = retrieval_of(2, 2);
         config.mutable_config()->set_promote_if("accuracy>0.9");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"reports mrr@10, recall@1, recall@10, ndcg@10, not 'accuracy'"},
       "FineTune"});
  add({"finetune_promote_if_10000_bytes",
       "FineTune config.promote_if of 10,000 bytes (limit 256)",
       [=](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         *config.mutable_config()->mutable_evaluation() = retrieval_of(2, 2);
         config.mutable_config()->set_promote_if(std::string(10000, '>'));
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"10000 bytes", "256"},
       "FineTune"});
  add({"finetune_classification_eval_on_contrastive",
       "FineTune contrastive job with a classification evaluation set",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         pb::EvaluationSet* set = config.mutable_config()->mutable_evaluation();
         set->set_task(pb::EVALUATION_CLASSIFICATION);
         set->add_examples()->set_text("a kettle");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"contrastive job has no classification head"},
       "FineTune"});
  add({"finetune_eval_set_6000_texts",
       "FineTune with an evaluation set of 6,000 texts (limit 5,000)",
       [=](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         *config.mutable_config()->mutable_evaluation() = retrieval_of(5000, 1000);
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"config.evaluation has 6000 texts", "5000"},
       "FineTune"});

  // --- Explain (issue 19): every limit named; none of these reaches the engine -------------------
  add({"explain_steps_0",
       "Explain with steps explicitly 0",
       [](Clients& c) {
         return Explain(
             c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) { r->set_steps(0); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"steps is 0", "1 to 256"},
       "Explain"});
  add({"explain_steps_100000",
       "Explain with 100000 interpolation steps",
       [](Clients& c) {
         return Explain(
             c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) { r->set_steps(100000); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"steps is 100000", "1 to 256"},
       "Explain"});
  add({"explain_5000_token_query",
       "Explain with a 5,000-token query (integrated gradients: limit 512)",
       [](Clients& c) {
         std::string text;
         for (int i = 0; i < 4998; ++i) text += "word ";
         return Explain(c, ExplainOf(text, {"a dog"}, [](pb::ExplainRequest* r) {
                          r->set_method(pb::ATTRIBUTION_INTEGRATED_GRADIENTS);
                        }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"query has 5000 tokens", "limit of 512", "does not truncate"},
       "Explain"});
  add({"explain_5000_token_document_pairwise",
       "pairwise Explain with a 5,000-token document (limit 128)",
       [](Clients& c) {
         std::string text;
         for (int i = 0; i < 4998; ++i) text += "word ";
         return Explain(c, ExplainOf("a cat", {"a dog", text}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"documents[1] has 5000 tokens", "limit of 128", "ATTRIBUTION_PAIRWISE"},
       "Explain"});
  add({"explain_empty_document",
       "Explain with an empty second text",
       [](Clients& c) { return Explain(c, ExplainOf("a cat", {""})); },
       StatusCode::INVALID_ARGUMENT,
       {"documents[0] is empty"},
       "Explain"});
  add({"explain_no_documents",
       "Explain with a query and no documents",
       [](Clients& c) { return Explain(c, ExplainOf("a cat", {})); },
       StatusCode::INVALID_ARGUMENT,
       {"no documents", "16"},
       "Explain"});
  add({"explain_empty_query",
       "Explain with an empty query",
       [](Clients& c) { return Explain(c, ExplainOf("", {"a dog"})); },
       StatusCode::INVALID_ARGUMENT,
       {"query is empty"},
       "Explain"});
  add({"classify_base_has_no_head",
       "Classify on the base model (no classification head)",
       [](Clients& c) {
         pb::ClassifyRequest request;
         request.add_inputs()->set_text("a cat");
         return Classify(c, request);
       },
       StatusCode::FAILED_PRECONDITION,
       {"version base has no classification head", "CLASSIFICATION"},
       "Classify"});
  add({"classify_unknown_version",
       "Classify pinned to a version that does not exist",
       [](Clients& c) {
         pb::ClassifyRequest request;
         request.add_inputs()->set_text("a cat");
         request.set_model_version("ft-999999-nope");
         return Classify(c, request);
       },
       StatusCode::NOT_FOUND,
       {"ft-999999-nope"},
       "Classify"});
  add({"classify_10000_inputs",
       "Classify with 10,000 inputs on the base model",
       [](Clients& c) {
         pb::ClassifyRequest request;
         for (int i = 0; i < 10000; ++i) request.add_inputs()->set_text("x");
         return Classify(c, request);
       },
       StatusCode::FAILED_PRECONDITION,
       {"no classification head"},
       "Classify"});
  add({"rerank_no_documents",
       "Rerank with a query and no documents",
       [](Clients& c) { return Rerank(c, RerankOf("a cat", {})); },
       StatusCode::INVALID_ARGUMENT,
       {"0 documents", "1 to 255"},
       "Rerank"});
  add({"rerank_10000_documents",
       "Rerank with 10,000 documents",
       [](Clients& c) {
         return Rerank(c, RerankOf("a cat", std::vector<std::string>(10000, "x")));
       },
       StatusCode::INVALID_ARGUMENT,
       {"10000 documents", "1 to 255", "--max-inputs-per-request"},
       "Rerank"});
  add({"rerank_empty_query",
       "Rerank with an empty query",
       [](Clients& c) { return Rerank(c, RerankOf("", {"a dog"})); },
       StatusCode::INVALID_ARGUMENT,
       {"query is empty"},
       "Rerank"});
  add({"rerank_empty_document",
       "Rerank with an empty second document",
       [](Clients& c) {
         return Rerank(c, RerankOf("a cat", {"a dog", ""}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"documents[1] is empty"},
       "Rerank"});
  add({"rerank_top_n_negative",
       "Rerank with top_n -1",
       [](Clients& c) {
         return Rerank(
             c, RerankOf("a cat", {"a dog"}, [](pb::RerankRequest* r) { r->set_top_n(-1); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"top_n is -1"},
       "Rerank"});
  add({"rerank_unknown_method",
       "Rerank with method 9",
       [](Clients& c) {
         return Rerank(c, RerankOf("a cat", {"a dog"}, [](pb::RerankRequest* r) {
                         r->set_method(static_cast<pb::RerankMethod>(9));
                       }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"method: unknown value 9"},
       "Rerank"});
  add({"rerank_cross_encoder_without_pair_head",
       "Rerank as a cross-encoder on the base model (no pair head)",
       [](Clients& c) {
         return Rerank(c, RerankOf("a cat", {"a dog"}, [](pb::RerankRequest* r) {
                         r->set_method(pb::RERANK_CROSS_ENCODER);
                       }));
       },
       StatusCode::FAILED_PRECONDITION,
       {"no classification head", "PAIR_CLASSIFICATION"},
       "Rerank"});
  add({"rerank_5000_token_document_untruncated",
       "Rerank with a 5,000-token document and TRUNCATION_NONE",
       [](Clients& c) {
         std::string text;
         for (int i = 0; i < 4998; ++i) text += "word ";
         return Rerank(c, RerankOf("a cat", {"a dog", text}, [](pb::RerankRequest* r) {
                         r->mutable_tokenization()->set_truncation(pb::TRUNCATION_NONE);
                       }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[2]", "inputs[i + 1] is documents[i]"},
       "Rerank"});
  add({"rerank_1mib_query_served",
       "Rerank with a 1 MiB query (truncated like Encode, served)",
       [](Clients& c) {
         std::string text;
         while (text.size() < (1 << 20)) text += "query words ";
         return Rerank(c, RerankOf(text, {"a dog", "a cat"}));
       },
       StatusCode::OK,
       {},
       "Rerank"});
  add({"label_names_count_mismatch",
       "CLASSIFICATION with 3 labels and 2 label_names",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CLASSIFICATION);
         config.mutable_config()->add_label_names("a");
         config.mutable_config()->add_label_names("b");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"label_names has 2 names for num_labels 3"},
       "FineTune"});
  add({"label_names_on_contrastive",
       "CONTRASTIVE with label_names",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CONTRASTIVE);
         config.mutable_config()->add_label_names("a");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"label_names is set", "contrastive"},
       "FineTune"});
  add({"label_name_10000_chars",
       "a 10,000-character label name",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CLASSIFICATION);
         config.mutable_config()->add_label_names("a");
         config.mutable_config()->add_label_names(std::string(10000, 'x'));
         config.mutable_config()->add_label_names("c");
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"label_names[1] is 10000 bytes", "1 to 256"},
       "FineTune"});
  add({"label_names_repeated",
       "the same label name twice",
       [](Clients& c) {
         pb::FineTuneRequest config = Config(pb::CLASSIFICATION);
         for (const char* name : {"spam", "ham", "spam"}) {
           config.mutable_config()->add_label_names(name);
         }
         return FineTune(c, {config});
       },
       StatusCode::INVALID_ARGUMENT,
       {"label_names[2] repeats 'spam'"},
       "FineTune"});
  add({"pair_classification_with_text",
       "PAIR_CLASSIFICATION given a text example instead of a pair",
       [](Clients& c) {
         return FineTune(c, {Config(pb::PAIR_CLASSIFICATION), Batch({Labelled("only text", 1)})});
       },
       StatusCode::INVALID_ARGUMENT,
       {"examples[0].text is set", "pair_classification"},
       "FineTune"});
  add({"explain_unknown_method",
       "Explain with method 7",
       [](Clients& c) {
         return Explain(c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) {
                          r->set_method(static_cast<pb::AttributionMethod>(7));
                        }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"method: unknown value 7", "ATTRIBUTION_PAIRWISE"},
       "Explain"});
  add({"explain_unknown_baseline",
       "Explain with baseline 9",
       [](Clients& c) {
         return Explain(c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) {
                          r->set_baseline(static_cast<pb::AttributionBaseline>(9));
                        }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"baseline: unknown value 9"},
       "Explain"});
  add({"explain_layer_7",
       "Explain at layer 7 of a 6-layer model",
       [](Clients& c) {
         return Explain(
             c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) { r->set_layer(7); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"layer is 7", "0 to 6"},
       "Explain"});
  add({"explain_layer_negative",
       "Explain at layer -1",
       [](Clients& c) {
         return Explain(
             c, ExplainOf("a cat", {"a dog"}, [](pb::ExplainRequest* r) { r->set_layer(-1); }));
       },
       StatusCode::INVALID_ARGUMENT,
       {"layer is -1", "0 to 6"},
       "Explain"});
  add({"explain_1000_documents",
       "Explain with 1,000 documents",
       [](Clients& c) {
         return Explain(c, ExplainOf("a cat", std::vector<std::string>(1000, "a dog")));
       },
       StatusCode::INVALID_ARGUMENT,
       {"1000 documents", "limit of 16", "--max-explain-documents"},
       "Explain"});
  add({"explain_only_punctuation_document",
       "Explain with a document that tokenizes to nothing (only control characters)",
       [](Clients& c) { return Explain(c, ExplainOf("a cat", {"\x01\x02"})); },
       StatusCode::INVALID_ARGUMENT,
       {"documents[0]", "no tokens besides"},
       "Explain"});
  add({"encode_unknown_pooling_6",
       "Encode with pooling 6 (POOLING_CLS_ATTENTION is 5)",
       [](Clients& c) {
         pb::EncodeRequest request = Texts({"hello"});
         request.set_pooling(static_cast<pb::Pooling>(6));
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"pooling: unknown value 6", "POOLING_CLS_ATTENTION"},
       "Encode"});

  // --- Server-side jobs (issue 16): uploads, ids, the queue -------------------------------------
  const client::JobDataset pairs = client::EncodeJobDataset(JobPairs(6));
  add({"job_chunks_out_of_order",
       "CreateJob: chunk 0, then chunk 2",
       [=](Clients& c) {
         std::vector<pb::CreateJobRequest> chunks = ChunksOf(pairs.bytes, 40);
         chunks.erase(chunks.begin() + 1);
         return CreateJob(c, Upload(JobSpecOf(pairs), chunks));
       },
       StatusCode::INVALID_ARGUMENT,
       {"chunk 2 arrived where chunk 1 was expected", "in order", "no job was created"},
       "CreateJob"});
  add({"job_chunk_repeated",
       "CreateJob: chunk 0 twice",
       [=](Clients& c) {
         std::vector<pb::CreateJobRequest> chunks = ChunksOf(pairs.bytes, 40);
         chunks.insert(chunks.begin() + 1, chunks.front());
         return CreateJob(c, Upload(JobSpecOf(pairs), chunks));
       },
       StatusCode::INVALID_ARGUMENT,
       {"chunk 0 arrived where chunk 1 was expected"},
       "CreateJob"});
  add({"job_checksum_mismatch",
       "CreateJob whose spec declares another dataset's SHA-256",
       [=](Clients& c) {
         const client::JobDataset other = client::EncodeJobDataset(JobPairs(4));
         return CreateJob(c,
                          Upload(JobSpecOf(pairs, 1,
                                           [&](pb::JobSpec* s) {
                                             s->mutable_dataset()->set_sha256(other.info.sha256());
                                           }),
                                 ChunksOf(pairs.bytes, 100)));
       },
       StatusCode::INVALID_ARGUMENT,
       {"the dataset's SHA-256 is " + pairs.info.sha256(), "no job was created"},
       "CreateJob"});
  add({"job_dataset_2gb_declared",
       "CreateJob declaring a 2 GB dataset (limit 1 MiB): refused before any upload",
       [=](Clients& c) {
         pb::CreateJobResponse answer;
         const grpc::Status status = CreateJob(
             c,
             {JobSpecOf(pairs, 1,
                        [](pb::JobSpec* s) { s->mutable_dataset()->set_bytes(int64_t{2} << 30); })},
             &answer);
         EXPECT_TRUE(answer.job_id().empty()) << "no upload may start";
         return status;
       },
       StatusCode::INVALID_ARGUMENT,
       {"dataset.bytes is 2147483648", "1 to 1048576 bytes (--max-job-dataset-bytes)"},
       "CreateJob"});
  add({"job_dataset_size_lie",
       "CreateJob declaring 200 bytes, then sending 2 MiB in 1 MiB chunks",
       [=](Clients& c) {
         return CreateJob(
             c, Upload(JobSpecOf(pairs, 1,
                                 [](pb::JobSpec* s) { s->mutable_dataset()->set_bytes(200); }),
                       ChunksOf(std::string(2 << 20, '\x01'), 1 << 20)));
       },
       StatusCode::INVALID_ARGUMENT,
       {"chunk 0 brings the dataset to 1048576 bytes, more than the 200 bytes the spec declared"},
       "CreateJob"});
  add({"job_upload_ends_early",
       "CreateJob that half-closes after the first of its chunks",
       [=](Clients& c) {
         return CreateJob(c, Upload(JobSpecOf(pairs), {ChunksOf(pairs.bytes, 50).front()}));
       },
       StatusCode::INVALID_ARGUMENT,
       {"the upload ended after 50 of the " + std::to_string(pairs.bytes.size()) + " bytes",
        "no job was created"},
       "CreateJob"});
  add({"job_chunk_2mib",
       "CreateJob with one 2 MiB chunk (limit 1 MiB)",
       [=](Clients& c) {
         return CreateJob(c,
                          Upload(JobSpecOf(pairs), ChunksOf(std::string(2 << 20, 'x'), 2 << 20)));
       },
       StatusCode::INVALID_ARGUMENT,
       {"chunk 0 has 2097152 bytes; send 1 to 1048576"},
       "CreateJob"});
  add({"job_chunk_before_spec",
       "CreateJob starting with a chunk",
       [=](Clients& c) { return CreateJob(c, ChunksOf(pairs.bytes, 100)); },
       StatusCode::INVALID_ARGUMENT,
       {"the first message must be a spec"},
       "CreateJob"});
  add({"job_second_spec",
       "CreateJob with two specs",
       [=](Clients& c) {
         return CreateJob(c, {JobSpecOf(pairs), JobSpecOf(pairs)});
       },
       StatusCode::INVALID_ARGUMENT,
       {"a second spec"},
       "CreateJob"});
  add({"job_example_invalid_utf8",
       "CreateJob whose example 1 has invalid UTF-8 in its anchor",
       [=](Clients& c) {
         std::vector<pb::TrainingExample> examples = JobPairs(4);
         examples[1].set_anchor("caf\xC3");
         std::string bytes;  // serialized without UTF-8 checks, as a careless client might
         for (const pb::TrainingExample& e : examples) {
           const std::string message = wire::Field(1, e.anchor()) + wire::Field(2, e.positive());
           bytes += wire::Varint(message.size()) + message;
         }
         client::JobDataset dataset = client::EncodeJobDataset(examples);
         dataset.bytes = bytes;
         dataset.info.set_bytes(static_cast<int64_t>(bytes.size()));
         dataset.info.set_sha256(std::string(64, '0'));
         return CreateJob(c, Upload(JobSpecOf(dataset), ChunksOf(bytes, 1 << 20)));
       },
       StatusCode::INVALID_ARGUMENT,
       {"dataset example 1: it is not a valid attnserve.v1.TrainingExample: anchor is not valid "
        "UTF-8"},
       "CreateJob"});
  add({"job_example_of_another_objective",
       "CreateJob (contrastive) whose example 3 is a classification example",
       [=](Clients& c) {
         std::vector<pb::TrainingExample> examples = JobPairs(6);
         examples[3].Clear();
         examples[3].set_text("a text");
         examples[3].set_label(1);
         const client::JobDataset dataset = client::EncodeJobDataset(examples);
         return CreateJob(c, Upload(JobSpecOf(dataset), ChunksOf(dataset.bytes, 1 << 20)));
       },
       StatusCode::INVALID_ARGUMENT,
       {"dataset example 3: anchor is empty"},
       "CreateJob"});
  add({"job_batch_over_limit",
       "CreateJob with batch_size 257 (--max-inputs-per-request 256)",
       [=](Clients& c) {
         return CreateJob(c, {JobSpecOf(pairs, 1, [](pb::JobSpec* s) { s->set_batch_size(257); })});
       },
       StatusCode::INVALID_ARGUMENT,
       {"batch_size is 257; give 1 to 256 (--max-inputs-per-request"},
       "CreateJob"});
  add({"job_without_token",
       "CreateJob without the trainer token",
       [=](Clients& c) { return CreateJob(c, {JobSpecOf(pairs)}, nullptr, ""); },
       StatusCode::UNAUTHENTICATED,
       {},
       "CreateJob"});
  add({"job_watch_unknown",
       "WatchJob of a job id the server never had",
       [](Clients& c) { return WatchJob(c, "job-20990101T000000Z-deadbeef"); },
       StatusCode::NOT_FOUND,
       {"has no job job-20990101T000000Z-deadbeef", "attnctl jobs"},
       "WatchJob"});
  add({"job_watch_path_traversal",
       "WatchJob of job id '../../etc/passwd'",
       [](Clients& c) { return WatchJob(c, "../../etc/passwd"); },
       StatusCode::INVALID_ARGUMENT,
       {"job_id is '../../etc/passwd'", "a job id looks like job-"},
       "WatchJob"});
  add({"job_watch_negative_index",
       "WatchJob from index -1",
       [](Clients& c) { return WatchJob(c, "job-20990101T000000Z-deadbeef", -1); },
       StatusCode::INVALID_ARGUMENT,
       {"from_index is -1"},
       "WatchJob"});
  add({"job_get_10000_char_id",
       "GetJob of a 10,000-character job id (quoted short)",
       [](Clients& c) { return GetJob(c, "job-" + std::string(9996, 'z')); },
       StatusCode::INVALID_ARGUMENT,
       {"job_id is 'job-zzz", "(10000 bytes)"},
       "GetJob"});
  add({"job_get_empty_id",
       "GetJob without a job id",
       [](Clients& c) { return GetJob(c, ""); },
       StatusCode::INVALID_ARGUMENT,
       {"job_id is empty"},
       "GetJob"});
  add({"job_cancel_unknown",
       "CancelJob of a job id the server never had",
       [](Clients& c) { return CancelJob(c, "job-20990101T000000Z-feedface"); },
       StatusCode::NOT_FOUND,
       {"has no job job-20990101T000000Z-feedface"},
       "CancelJob"});
  add({"job_cancel_finished",
       "CancelJob of a job that has committed its version",
       [=](Clients& c) {
         pb::CreateJobResponse created;
         const grpc::Status status =
             CreateJob(c, Upload(JobSpecOf(pairs), ChunksOf(pairs.bytes, 1 << 20)), &created);
         EXPECT_TRUE(status.ok()) << StatusString(status);
         const std::string id = created.job().job_id();
         pb::Job job;
         EXPECT_TRUE(WaitFor(
             [&] {
               return GetJob(c, id, &job).ok() && job.state() != pb::JOB_PENDING &&
                      job.state() != pb::JOB_RUNNING;
             },
             ScaledSeconds(120)));
         EXPECT_EQ(job.state(), pb::JOB_SUCCEEDED) << job.error();
         return CancelJob(c, id);
       },
       StatusCode::FAILED_PRECONDITION,
       {"has already ended (succeeded: committed version ft-", "there is nothing to cancel"},
       "CancelJob"});
  add({"job_queue_1000",
       "1,000 CreateJob calls in a row: the queue holds 8, the rest are refused",
       [=](Clients& c) {
         // The first one runs (long enough to hold the slot); then the queue fills.
         std::vector<std::string> created;
         grpc::Status refused;
         int refusals = 0;
         for (int i = 0; i < 1000; ++i) {
           pb::CreateJobResponse answer;
           const grpc::Status status = CreateJob(
               c, Upload(JobSpecOf(pairs, /*epochs=*/1000), ChunksOf(pairs.bytes, 1 << 20)),
               &answer);
           if (status.ok()) {
             created.push_back(answer.job().job_id());
           } else {
             EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
                 << StatusString(status);
             if (refusals++ == 0) refused = status;
           }
         }
         // 8 waiting, and one running unless the runner had not taken the first yet.
         EXPECT_GE(created.size(), 8u);
         EXPECT_LE(created.size(), 9u);
         EXPECT_EQ(refusals, 1000 - static_cast<int>(created.size()));
         for (auto it = created.rbegin(); it != created.rend(); ++it) {
           pb::Job job;
           const grpc::Status cancelled = CancelJob(c, *it, &job);
           EXPECT_TRUE(cancelled.ok()) << StatusString(cancelled);
           EXPECT_EQ(job.state(), pb::JOB_CANCELLED);
         }
         return refused;
       },
       StatusCode::RESOURCE_EXHAUSTED,
       {"the job queue of model", "is full", "the limit is 8 (--max-queued-jobs)",
        "attnctl job cancel"},
       /*counted_as=*/""});
  // --- Long texts (issue 31): chunking's options, and texts chunking cannot afford ----------
  // A chunked request: one text with `configure` applied.
  const auto chunked = [](const std::string& text,
                          const std::function<void(pb::EncodeRequest*)>& configure = {}) {
    pb::EncodeRequest request = Texts({text});
    request.set_long_text(pb::LONG_TEXT_CHUNK);
    if (configure) configure(&request);
    return request;
  };
  struct ChunkCase {
    std::string name, what;
    std::function<void(pb::EncodeRequest*)> configure;
    std::vector<std::string> words;
  };
  for (const ChunkCase& k : std::vector<ChunkCase>{
           {"chunk_pooling_none",
            "LONG_TEXT_CHUNK with POOLING_NONE",
            [](pb::EncodeRequest* r) { r->set_pooling(pb::POOLING_NONE); },
            {"LONG_TEXT_CHUNK", "POOLING_NONE"}},
           {"chunk_token_embeddings",
            "LONG_TEXT_CHUNK with return_token_embeddings",
            [](pb::EncodeRequest* r) { r->set_return_token_embeddings(true); },
            {"one pooled embedding per input", "return_token_embeddings"}},
           {"chunk_hidden_layers",
            "LONG_TEXT_CHUNK with hidden_layers [-1]",
            [](pb::EncodeRequest* r) { r->add_hidden_layers(-1); },
            {"hidden_layers"}},
           {"chunk_sparse",
            "LONG_TEXT_CHUNK with sparse",
            [](pb::EncodeRequest* r) { r->set_sparse(true); },
            {"sparse"}},
           {"chunk_truncation_left",
            "LONG_TEXT_CHUNK with TRUNCATION_LEFT",
            [](pb::EncodeRequest* r) {
              r->mutable_tokenization()->set_truncation(pb::TRUNCATION_LEFT);
            },
            {"embeds whole texts", "TRUNCATION_LEFT"}},
           {"chunk_overlap_minus_one",
            "chunk_overlap -1",
            [](pb::EncodeRequest* r) { r->set_chunk_overlap(-1); },
            {"chunk_overlap -1", "0 .. 253"}},
           {"chunk_overlap_whole_window",
            "chunk_overlap 254 with windows of 256 (254 text tokens)",
            [](pb::EncodeRequest* r) { r->set_chunk_overlap(254); },
            {"chunk_overlap 254", "0 .. 253"}},
           {"chunk_overlap_int_max",
            "chunk_overlap 2^31-1",
            [](pb::EncodeRequest* r) { r->set_chunk_overlap(2147483647); },
            {"chunk_overlap 2147483647"}},
           {"chunk_max_length_2",
            "LONG_TEXT_CHUNK with max_length 2 (no room for text)",
            [](pb::EncodeRequest* r) { r->mutable_tokenization()->set_max_length(2); },
            {"max_length 2", "3 or more"}},
           {"chunk_overlap_without_chunk",
            "chunk_overlap 8 without LONG_TEXT_CHUNK",
            [](pb::EncodeRequest* r) {
              r->set_long_text(pb::LONG_TEXT_UNSPECIFIED);
              r->set_chunk_overlap(8);
            },
            {"chunk_overlap is set", "LONG_TEXT_CHUNK"}},
           {"long_text_unknown",
            "long_text 7",
            [](pb::EncodeRequest* r) { r->set_long_text(static_cast<pb::LongText>(7)); },
            {"long_text: unknown value 7"}}}) {
    add({k.name, k.what,
         [=](Clients& c) { return Encode(c, chunked("a text to chunk", k.configure)); },
         StatusCode::INVALID_ARGUMENT, k.words, "Encode"});
  }
  add({"chunk_a_pair",
       "LONG_TEXT_CHUNK with a text pair",
       [](Clients& c) {
         pb::EncodeRequest request;
         request.add_inputs()->mutable_pair()->set_first("a question");
         request.mutable_inputs(0)->mutable_pair()->set_second("an answer");
         request.set_long_text(pb::LONG_TEXT_CHUNK);
         return Encode(c, request);
       },
       StatusCode::INVALID_ARGUMENT,
       {"inputs[0]", "a pair cannot be chunked"},
       "Encode"});
  add({"chunk_two_thousand_tokens",
       "a 2,000-token text chunked: served, 9 windows of 256 overlapping by 32",
       [=](Clients& c) {
         pb::EncodeResponse response;
         const grpc::Status status = Encode(c, chunked(TextOfTokens(2000, 4)), &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).chunks(), 9);
           EXPECT_EQ(response.results(0).untruncated_length(), 2000);
           EXPECT_FALSE(response.results(0).truncated());
           EXPECT_EQ(response.results(0).embedding_size(), 384);
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Encode"});
  add({"chunk_megabyte_of_words",
       "1 MiB of words chunked (limit 128 MiB a request): refused on its word count",
       [=](Clients& c) { return Encode(c, chunked(Megabyte())); },
       StatusCode::RESOURCE_EXHAUSTED,
       {"at least", "--max-request-memory-bytes"},
       "Encode"});
  for (const auto& [name, unit] : std::vector<std::pair<std::string, std::string>>{
           {"chunk_megabyte_of_punctuation", "!"}, {"chunk_megabyte_of_cjk", "\xe4\xb8\xad"}}) {
    add({name,
         "1 MiB of " + std::string(name == "chunk_megabyte_of_cjk" ? "CJK" : "'!'") +
             " chunked: no words to count first, one token a character; tokenizing stops at "
             "what the limit affords",
         [=, unit = unit](Clients& c) { return Encode(c, chunked(Megabyte(unit))); },
         StatusCode::RESOURCE_EXHAUSTED,
         {"inputs[0]: chunked", "--max-request-memory-bytes"},
         "Encode"});
  }
  add({"tokenize_three_megabytes_one_word",
       "Tokenize a 3 MiB word: one [UNK] (a word over 64 KiB is tokenized without being held)",
       [](Clients& c) {
         pb::TokenizeRequest request;
         request.add_inputs()->set_text(std::string(3 << 20, 'q'));
         pb::TokenizeResponse response;
         const grpc::Status status = Tokenize(c, request, &response);
         if (status.ok()) {
           EXPECT_EQ(response.results(0).tokens_size(), 3);
           EXPECT_FALSE(response.results(0).truncated());
         }
         return status;
       },
       StatusCode::OK,
       {},
       "Tokenize"});
  return cases;
}

const std::vector<HostileCase>& AllCases() {
  static const std::vector<HostileCase>* cases = new std::vector<HostileCase>(Catalogue());
  return *cases;
}

// ---------------------------------------------------------------------------------------------
// The test: one gtest case per catalogue row.

class HostileInputTest : public ::testing::TestWithParam<HostileCase> {
 protected:
  static void SetUpTestSuite() {
    clients_ = new Clients();
    clients_->channel = SharedServer().NewChannel();
    clients_->encoder = pb::Encoder::NewStub(clients_->channel);
    clients_->trainer = pb::Trainer::NewStub(clients_->channel);
    baseline_ = new Metrics(ScrapeOrFail(SharedServer()));
    expected_counts_ = new std::map<std::pair<std::string, std::string>, int>();
    suite_start_ = std::chrono::steady_clock::now();
  }

  // After the last case: the whole log shows no crash, and every rejected call was counted.
  static void TearDownTestSuite() {
    const std::string log = reliability::FullLog(SharedServer());
    const std::vector<std::string> crashes = reliability::CrashLines(log);
    EXPECT_TRUE(crashes.empty()) << "the server log shows a crash:\n" << crashes.front();

    const Metrics now = ScrapeOrFail(SharedServer());
    for (const auto& [key, count] : *expected_counts_) {
      const auto& [method, code] = key;
      const std::map<std::string, std::string> labels = {{"method", method}, {"code", code}};
      const double delta = now.Sum("attnserve_requests_total", labels) -
                           baseline_->Sum("attnserve_requests_total", labels);
      if (code == "OK") {
        // The health probes after every case add successful Encodes.
        EXPECT_GE(delta, count) << method << " " << code;
      } else {
        EXPECT_EQ(delta, count) << "attnserve_requests_total{method=\"" << method << "\",code=\""
                                << code << "\"} should count each rejected call once";
      }
    }
    std::printf(
        "[catalogue] %d cases in %.1f s; server log %zu bytes, no crash lines\n", cases_run_,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - suite_start_).count(),
        log.size());
    delete clients_;
    delete baseline_;
    delete expected_counts_;
  }

  static Clients* clients_;
  static Metrics* baseline_;
  static std::map<std::pair<std::string, std::string>, int>* expected_counts_;
  static std::chrono::steady_clock::time_point suite_start_;
  static int cases_run_;
};
Clients* HostileInputTest::clients_ = nullptr;
Metrics* HostileInputTest::baseline_ = nullptr;
std::map<std::pair<std::string, std::string>, int>* HostileInputTest::expected_counts_ = nullptr;
std::chrono::steady_clock::time_point HostileInputTest::suite_start_;
int HostileInputTest::cases_run_ = 0;

TEST_P(HostileInputTest, GetsTheRightStatusAndTheServerStaysHealthy) {
  const HostileCase& c = GetParam();
  ServerProcess& server = SharedServer();
  const size_t log_before = reliability::FullLog(server).size();
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = c.send(*clients_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectStatus(status, c.code, c.message_parts, c.name + " (" + c.what + ")");
  if (c.code != grpc::StatusCode::OK) {
    EXPECT_FALSE(status.error_message().empty() && !c.message_parts.empty())
        << c.name << ": the rejection should say what is wrong";
  }
  std::printf("[case] %-36s %-20s %6.3f s  %s\n", c.name.c_str(), CodeName(status.error_code()),
              seconds, status.error_message().substr(0, 160).c_str());
  ++cases_run_;
  if (!c.counted_as.empty()) ++(*expected_counts_)[{c.counted_as, CodeName(c.code)}];

  reliability::ExpectHealthy(server, c.name);
  const std::string log = reliability::FullLog(server);
  const std::vector<std::string> crashes =
      reliability::CrashLines(log.substr(std::min(log_before, log.size())));
  EXPECT_TRUE(crashes.empty()) << c.name << " left a crash in the server log:\n" << crashes.front();
}

INSTANTIATE_TEST_SUITE_P(Catalogue, HostileInputTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<HostileCase>& info) {
                           return info.param.name;
                         });

// The catalogue's names are unique and usable as gtest names (checked without a server).
TEST(HostileCatalogue, HasAtLeastFortyUniquelyNamedCases) {
  std::map<std::string, int> names;
  for (const HostileCase& c : AllCases()) {
    ++names[c.name];
    EXPECT_TRUE(std::all_of(c.name.begin(), c.name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
    })) << c.name;
  }
  for (const auto& [name, count] : names) EXPECT_EQ(count, 1) << name;
  EXPECT_GE(AllCases().size(), 40u);
}

// Promote where there is nothing it could promote: a server without a model store, and a
// version of another served model. Each is refused with a code and a message naming the fix or
// the version, and the server keeps serving what it served.
TEST(PromoteHostile, WithoutAStoreAndAcrossModels) {
  reliability::TempDir dir("promote");
  const std::string token = dir.WriteFile("token", std::string(kToken) + "\n");
  auto serving = [](pb::Trainer::Stub* trainer, const std::string& model) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::ListVersionsRequest request;
    request.set_model(model);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer->ListVersions(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response.serving_version();
  };
  auto call = [](pb::Trainer::Stub* trainer, const std::string& version, const std::string& model,
                 pb::ListVersionsResponse* response) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::PromoteRequest request;
    request.set_version(version);
    request.set_model(model);
    return trainer->Promote(&context, request, response);
  };
  std::string error;
  pb::ListVersionsResponse response;
  {
    ServerProcess server({"--trainer_token_file=" + token, "--trainer_threads=1"});
    ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
    auto trainer = pb::Trainer::NewStub(server.NewChannel());
    ExpectStatus(call(trainer.get(), "base", "", &response), grpc::StatusCode::FAILED_PRECONDITION,
                 {"no model store", "--model-store DIR"}, "Promote on a server without a store");
    ExpectStatus(call(trainer.get(), "ft-000001-20260101T000000Z", "", &response),
                 grpc::StatusCode::FAILED_PRECONDITION, {"--model-store"},
                 "Promote of a version on a server without a store");
    reliability::ExpectHealthy(server, "Promote without a store");
  }
  {
    ServerProcess server({"--model=a=" + TestModelDir(), "--model=b=" + TestModelDir(),
                          "--trainer_token_file=" + token, "--model_store=" + dir.path() + "/store",
                          "--trainer_threads=1"});
    ASSERT_TRUE(server.StartAndWait(ScaledSeconds(180), &error)) << error;
    auto trainer = pb::Trainer::NewStub(server.NewChannel());
    const std::string version =
        CommitOneContrastiveStep(trainer.get(), {kToken, "a", 5e-5, /*promote=*/false, "a's"});
    ASSERT_FALSE(version.empty());
    ExpectStatus(call(trainer.get(), version, "b", &response), grpc::StatusCode::NOT_FOUND,
                 {version}, "Promote of model a's version as model b's");
    EXPECT_EQ(serving(trainer.get(), "b"), "base");
    EXPECT_EQ(serving(trainer.get(), "a"), "base");  // staged
    // Its own model promotes it.
    const grpc::Status promoted = call(trainer.get(), version, "a", &response);
    ASSERT_TRUE(promoted.ok()) << StatusString(promoted);
    EXPECT_EQ(response.serving_version(), version);
    reliability::ExpectHealthy(server, "Promote across models");
  }
}

// Job calls that name one model for a job of another: NOT_FOUND saying which model has it, on a
// server of two models; the job is untouched and its own model answers for it.
TEST(JobHostile, AJobOfAnotherModel) {
  reliability::TempDir dir("jobs-models");
  const std::string token = dir.WriteFile("token", std::string(kToken) + "\n");
  ServerProcess server({"--model=a=" + TestModelDir(), "--model=b=" + TestModelDir(),
                        "--trainer_token_file=" + token, "--model_store=" + dir.path() + "/store",
                        "--trainer_threads=1"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(180), &error)) << error;
  Clients c;
  c.channel = server.NewChannel();
  c.trainer = pb::Trainer::NewStub(c.channel);
  const client::JobDataset pairs = client::EncodeJobDataset(JobPairs(6));
  pb::CreateJobRequest spec = JobSpecOf(pairs, /*epochs=*/1000);
  spec.mutable_spec()->mutable_config()->set_model("a");
  pb::CreateJobResponse created;
  const grpc::Status status = CreateJob(c, Upload(spec, ChunksOf(pairs.bytes, 1 << 20)), &created);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  const std::string id = created.job().job_id();
  EXPECT_EQ(created.job().model(), "a");
  const std::vector<std::string> parts = {"job " + id + " is a job of model a, not of model b",
                                          "ask with model 'a'"};
  ExpectStatus(WatchJob(c, id, 0, "b"), grpc::StatusCode::NOT_FOUND, parts, "WatchJob as b's");
  ExpectStatus(GetJob(c, id, nullptr, "b"), grpc::StatusCode::NOT_FOUND, parts, "GetJob as b's");
  ExpectStatus(CancelJob(c, id, nullptr, "b"), grpc::StatusCode::NOT_FOUND, parts,
               "CancelJob as b's");
  pb::Job job;
  ASSERT_TRUE(GetJob(c, id, &job, "a").ok());
  EXPECT_NE(job.state(), pb::JOB_CANCELLED);
  const grpc::Status cancelled = CancelJob(c, id, &job, "a");
  ASSERT_TRUE(cancelled.ok()) << StatusString(cancelled);
  EXPECT_EQ(job.state(), pb::JOB_CANCELLED);
  reliability::ExpectHealthy(server, "job calls across models");
}

// Clients that go quiet mid-stream (killed, stopped, cut off by the network): after
// --stream-idle-timeout-s of waiting for them the server cancels the stream, so a FineTune stream
// stops holding the model's fine-tuning slot and a CreateJob upload its job queue place. A client
// that keeps sending, however slowly, is not cancelled: only time waiting for it counts.
TEST(StreamIdleHostile, AQuietClientLosesTheSlotAndTheQueuePlaceItHeld) {
  reliability::TempDir dir("stream-idle");
  const std::string token = dir.WriteFile("token", std::string(kToken) + "\n");
  constexpr int kIdleSeconds = 2;
  ServerProcess server({"--trainer_token_file=" + token, "--model_store=" + dir.path() + "/store",
                        "--trainer_threads=1", "--max_queued_jobs=1",
                        "--stream_idle_timeout_s=" + std::to_string(kIdleSeconds)});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
  Clients c;
  c.channel = server.NewChannel();
  c.trainer = pb::Trainer::NewStub(c.channel);
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  pb::FineTuneRequest config;
  config.mutable_config()->set_objective(pb::CONTRASTIVE);
  config.mutable_config()->set_disable_dropout(true);
  pb::FineTuneRequest batch;
  for (const pb::TrainingExample& e : JobPairs(2)) *batch.mutable_batch()->add_examples() = e;

  // A slow client: a message every 0.3 s for two idle timeouts is never cancelled.
  {
    std::vector<pb::FineTuneRequest> requests = {config};
    for (int i = 0; i < 2 * kIdleSeconds / 0.3; ++i) requests.push_back(batch);
    pb::FineTuneRequest stop;
    stop.set_abort(true);
    requests.push_back(stop);
    grpc::ClientContext context;
    context.set_deadline(Deadline(300));
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    auto stream = c.trainer->FineTune(&context);
    pb::FineTuneProgress progress;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ASSERT_TRUE(stream->Write(requests[i])) << "message " << i;
      // The config has no answer; every batch and the abort have one.
      if (i > 0) {
        ASSERT_TRUE(stream->Read(&progress)) << "message " << i;
      }
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << StatusString(status);
  }

  // FineTune: one step, then silence. While it waits, the slot is taken; then it is cancelled
  // and the next job gets the slot.
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline(300));
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    auto quiet = c.trainer->FineTune(&context);
    ASSERT_TRUE(quiet->Write(config));
    ASSERT_TRUE(quiet->Write(batch));
    pb::FineTuneProgress progress;
    ASSERT_TRUE(quiet->Read(&progress));
    const Clock::time_point silent = Clock::now();
    ExpectStatus(FineTune(c, {config}), grpc::StatusCode::FAILED_PRECONDITION, {progress.job_id()},
                 "FineTune while a quiet client holds the slot");
    EXPECT_FALSE(quiet->Read(&progress));  // returns once the server has cancelled the stream
    EXPECT_GE(seconds_since(silent), kIdleSeconds - 0.1);
    EXPECT_LT(seconds_since(silent), ScaledSeconds(60).count());
    EXPECT_EQ(quiet->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The client hears the cancel before the server has ended the job: the slot is free soon
  // after, not at once.
  pb::FineTuneRequest abort;
  abort.set_abort(true);
  EXPECT_TRUE(WaitFor(
      [&] {
        return FineTune(c, {config, abort}).ok();
      },
      ScaledSeconds(10)))
      << "the slot of the cancelled stream was not freed";
  EXPECT_FALSE(
      CommitOneContrastiveStep(c.trainer.get(), {kToken, "", 5e-5, false, "after"}).empty());

  // CreateJob: the spec, then silence. Its upload holds the only queue place; then it is
  // cancelled, no job is left of it, and the next upload is queued.
  const client::JobDataset pairs = client::EncodeJobDataset(JobPairs(4));
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline(300));
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    auto quiet = c.trainer->CreateJob(&context);
    ASSERT_TRUE(quiet->Write(JobSpecOf(pairs)));
    pb::CreateJobResponse accepted;
    ASSERT_TRUE(quiet->Read(&accepted));
    const Clock::time_point silent = Clock::now();
    ExpectStatus(CreateJob(c, Upload(JobSpecOf(pairs), ChunksOf(pairs.bytes, 1 << 20))),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {"--max-queued-jobs"},
                 "CreateJob while a quiet upload holds the queue");
    EXPECT_FALSE(quiet->Read(&accepted));
    EXPECT_GE(seconds_since(silent), kIdleSeconds - 0.1);
    EXPECT_LT(seconds_since(silent), ScaledSeconds(60).count());
    EXPECT_EQ(quiet->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  grpc::Status queued;
  EXPECT_TRUE(WaitFor(
      [&] {
        queued = CreateJob(c, Upload(JobSpecOf(pairs), ChunksOf(pairs.bytes, 1 << 20)));
        return queued.ok();
      },
      ScaledSeconds(10)))
      << "the queue place of the cancelled upload was not freed: " << StatusString(queued);

  // The server says why, in its log and its counters.
  const std::string log = reliability::FullLog(server);
  EXPECT_TRUE(absl::StrContains(log,
                                "FineTune: no message from the client for 2 s while waiting "
                                "for the next batch, commit or abort"))
      << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  EXPECT_TRUE(absl::StrContains(log,
                                "CreateJob: no message from the client for 2 s while waiting "
                                "for the next chunk"));
  const Metrics metrics = ScrapeOrFail(server);
  for (const char* method : {"FineTune", "CreateJob"}) {
    EXPECT_EQ(metrics.Sum("attnserve_requests_total",
                          {{"method", method}, {"code", "DEADLINE_EXCEEDED"}}),
              1)
        << method;
  }
  reliability::ExpectHealthy(server, "quiet trainer streams");
}

}  // namespace
}  // namespace attn::integration
