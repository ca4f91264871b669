// Long inputs and token ids where users meet the server (issue 31, findings 2 and 5), against the
// real server: POST /v1/embeddings refuses token ids that are not this model's tokenizer output
// (what LangChain's default OpenAIEmbeddings sends: tiktoken cl100k ids) and an input over the
// model's limit unless the request asks to truncate or chunk, and `--openai-long-text` changes
// the route's default; every answer says per input how many tokens it had, whether it was
// truncated and in how many windows it was encoded; long documents chunked on purpose
// (LONG_TEXT_CHUNK over gRPC, /v1/encode and /v1/embeddings) equal a numpy reference built from
// per-window Encode calls (long_text_reference.py); and the real langchain-openai package, as
// the README configures it and as it comes (langchain_check.py).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using nlohmann::json;

constexpr double kTolerance = 1e-6;

// POST `body` to `path` on `port`; the parsed JSON answer, after checking the status.
json Post(int port, const std::string& path, const json& body, int expected_status = 200) {
  HttpResponse response;
  std::string error;
  EXPECT_TRUE(HttpRequest(port, "POST", path, {"Content-Type: application/json"}, body.dump(),
                          &response, &error))
      << error;
  EXPECT_EQ(response.status, expected_status) << path << ": " << response.body.substr(0, 400);
  const json parsed = json::parse(response.body, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << response.body.substr(0, 200);
  return parsed;
}

json Post(const std::string& path, const json& body, int expected_status = 200) {
  return Post(SharedServer().http_port(), path, body, expected_status);
}

// The error's message, or (when there is none) the start of what was answered instead.
std::string ErrorMessage(const json& answer) {
  if (answer.contains("error")) return answer["error"].value("message", "");
  return "no error, the answer was: " + answer.dump().substr(0, 200) + "...";
}

void ExpectContains(const std::string& text, const std::vector<std::string>& words) {
  for (const std::string& word : words) {
    EXPECT_NE(text.find(word), std::string::npos) << "no \"" << word << "\" in: " << text;
  }
}

std::vector<std::vector<float>> Embeddings(const json& answer) {
  std::vector<std::vector<float>> out;
  if (!answer.contains("data")) return out;
  for (const json& item : answer["data"]) {
    out.push_back(item.at("embedding").get<std::vector<float>>());
  }
  return out;
}

double MaxAbsDifference(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, MaxAbsDiff(a[i], b[i]));
  return worst;
}

pb::EncodeResponse GrpcEncode(const pb::EncodeRequest& request) {
  pb::EncodeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
  const grpc::Status status = SharedServer().NewStub()->Encode(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

std::vector<std::vector<float>> GrpcEmbeddings(const std::vector<std::string>& texts,
                                               pb::Truncation truncation = pb::TRUNCATION_RIGHT) {
  pb::EncodeRequest request;
  for (const std::string& text : texts) request.add_inputs()->set_text(text);
  request.mutable_tokenization()->set_truncation(truncation);
  std::vector<std::vector<float>> out;
  const pb::EncodeResponse response = GrpcEncode(request);
  for (const pb::EncodeResult& result : response.results()) {
    out.emplace_back(result.embedding().begin(), result.embedding().end());
  }
  return out;
}

// This model's token ids of `text` (up to 512), [CLS] and [SEP] included (the tokenizer route).
std::vector<int> TokenIds(const std::string& text) {
  const json tokenized = Post(
      "/v1/tokenize", {{"inputs", {{{"text", text}}}}, {"tokenization", {{"maxLength", 512}}}});
  std::vector<int> ids;
  for (const json& token : tokenized.at("results").at(0).at("tokens")) {
    ids.push_back(token.value("id", 0));
  }
  return ids;
}

// Runs `script` with the test venv's Python and `arguments`; its output, after checking that it
// exited 0 and printed `success_line`.
std::string RunPythonCheck(const std::string& script, const std::string& arguments,
                           const std::string& success_line) {
  const std::string python = ATTN_TEST_VENV_PYTHON;
  EXPECT_EQ(access(python.c_str(), X_OK), 0)
      << python << " is missing: scripts/setup.sh creates the test venv";
  const std::string command =
      "NO_PROXY='*' no_proxy='*' '" + python + "' '" + script + "' " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  if (pipe == nullptr) return "";
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find(success_line), std::string::npos) << output;
  return output;
}

// tiktoken's cl100k_base ids of "A man is playing a guitar." (tiktoken 0.12:
// `tiktoken.get_encoding("cl100k_base").encode(text)`): what langchain-openai sends by default.
// Every one is below this model's vocabulary size (30,522), so a range check passes them all.
const std::vector<int>& Cl100kIds() {
  static const auto* ids = new std::vector<int>{32, 893, 374, 5737, 264, 17418, 13};
  return *ids;
}

TEST(OpenAiTokenIds, Cl100kIdsAreRefusedNamingTheCause) {
  for (const json& input : {json(Cl100kIds()), json::array({Cl100kIds()})}) {
    SCOPED_TRACE(input.dump());
    const json refused = Post("/v1/embeddings", {{"input", input}}, 400);
    ExpectContains(ErrorMessage(refused),
                   {"not this model's tokenizer output", "[CLS] (id 101)", "[SEP] (id 102)",
                    "/v1/tokenize", "check_embedding_ctx_length=False"});
    if (refused.contains("error")) {
      EXPECT_EQ(refused["error"]["param"], "input");
      EXPECT_EQ(refused["error"]["code"], "invalid_token_ids");
    }
  }
  // The index of the offending array when several are sent.
  const json second = Post("/v1/embeddings", {{"input", {TokenIds("hello"), Cl100kIds()}}}, 400);
  ExpectContains(ErrorMessage(second), {"input[1]"});
}

TEST(OpenAiTokenIds, OwnTokenizerOutputIsAcceptedAndPartsOfItAreNot) {
  const std::string text = "A man is playing a guitar.";
  const std::vector<int> ids = TokenIds(text);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_LE(MaxAbsDifference(Embeddings(Post("/v1/embeddings", {{"input", ids}})),
                             GrpcEmbeddings({text})),
            kTolerance);
  const std::vector<int> no_cls(ids.begin() + 1, ids.end());
  const std::vector<int> no_sep(ids.begin(), ids.end() - 1);
  for (const auto& part : {no_cls, no_sep}) {
    const json refused = Post("/v1/embeddings", {{"input", part}}, 400);
    ExpectContains(ErrorMessage(refused), {"not this model's tokenizer output"});
  }
}

TEST(OpenAiLongInput, RefusedByDefaultNamingIndexCountLimitAndWaysOut) {
  const json refused =
      Post("/v1/embeddings", {{"input", {"a short one", TextOfTokens(600, 1)}}}, 400);
  ExpectContains(ErrorMessage(refused), {"input[1]", "600 tokens", "limit of 256",
                                         "\"truncate\": true", "\"long_text\": \"chunk\""});
  if (refused.contains("error")) {
    EXPECT_EQ(refused["error"]["param"], "input");
    EXPECT_EQ(refused["error"]["code"], "context_length_exceeded");
  }
  // Over-long token ids (this model's own) are refused the same way.
  const json ids = Post("/v1/embeddings", {{"input", TokenIds(TextOfTokens(300, 2))}}, 400);
  ExpectContains(ErrorMessage(ids), {"input", "300 tokens", "limit of 256"});
}

TEST(OpenAiLongInput, TruncateTrueKeepsTheFirstTokensAndSaysSo) {
  const std::vector<std::string> texts = {"a short one", TextOfTokens(600, 1)};
  const json answer = Post("/v1/embeddings", {{"input", texts}, {"truncate", true}});
  EXPECT_LE(MaxAbsDifference(Embeddings(answer), GrpcEmbeddings(texts)), kTolerance);
  ASSERT_EQ(answer.value("data", json::array()).size(), 2u) << answer.dump().substr(0, 300);
  const json& data = answer["data"];
  EXPECT_EQ(data[0].value("truncated", true), false);
  EXPECT_EQ(data[0].value("input_tokens", 0), 5);  // [CLS] a short one [SEP]
  EXPECT_EQ(data[0].value("chunks", 0), 1);
  EXPECT_EQ(data[1].value("truncated", false), true);
  EXPECT_EQ(data[1].value("input_tokens", 0), 600);
  EXPECT_EQ(data[1].value("chunks", 0), 1);
  EXPECT_FALSE(data[1].contains("input_tokens_lower_bound"));
  // The end instead of the beginning (text-embeddings-inference's truncation_direction).
  const json left =
      Post("/v1/embeddings",
           {{"input", texts[1]}, {"truncate", true}, {"truncation_direction", "left"}});
  EXPECT_LE(MaxAbsDifference(Embeddings(left), GrpcEmbeddings({texts[1]}, pb::TRUNCATION_LEFT)),
            kTolerance);
  EXPECT_GT(MaxAbsDifference(Embeddings(left), GrpcEmbeddings({texts[1]})), 1e-3);
  // Asked not to: the default.
  Post("/v1/embeddings", {{"input", texts}, {"truncate", false}}, 400);
}

TEST(OpenAiLongInput, ChunkEmbedsTheWholeDocument) {
  const std::string document = TextOfTokens(600, 1);
  const json answer = Post("/v1/embeddings", {{"input", document}, {"long_text", "chunk"}});
  ASSERT_EQ(answer.value("data", json::array()).size(), 1u) << answer.dump().substr(0, 300);
  // 598 text tokens in windows of 254 moving by 254 - 32: starts 0, 222, 444.
  EXPECT_EQ(answer["data"][0].value("chunks", 0), 3);
  EXPECT_EQ(answer["data"][0].value("truncated", true), false);
  EXPECT_EQ(answer["data"][0].value("input_tokens", 0), 600);
  const json encoded =
      Post("/v1/encode", {{"inputs", {{{"text", document}}}}, {"longText", "LONG_TEXT_CHUNK"}});
  std::vector<float> reference;
  if (encoded.contains("results")) {
    reference = encoded["results"][0].at("embedding").get<std::vector<float>>();
  }
  EXPECT_LE(MaxAbsDifference(Embeddings(answer), {reference}), kTolerance);
  // Not the first window's embedding.
  EXPECT_GT(MaxAbsDifference(Embeddings(answer), GrpcEmbeddings({document})), 1e-3);
}

// --openai-long-text sets what /v1/embeddings does with an over-long input when the request
// does not say; a request still decides for itself.
TEST(OpenAiLongInput, ServerFlagMakesTruncationTheDefault) {
  ServerProcess server({"--openai_long_text=truncate"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
  const std::string document = TextOfTokens(600, 1);
  const json answer = Post(server.http_port(), "/v1/embeddings", {{"input", document}});
  EXPECT_LE(MaxAbsDifference(Embeddings(answer), GrpcEmbeddings({document})), kTolerance);
  if (answer.contains("data")) {
    EXPECT_EQ(answer["data"][0].value("truncated", false), true);
  }
  Post(server.http_port(), "/v1/embeddings", {{"input", document}, {"truncate", false}}, 400);
  StopOwnServer(&server);

  int exit_code = 0;
  const std::string output = RunCommand(
      "'" + AttnserveBinary() + "' --openai_long_text=sometimes --port=0 2>&1", &exit_code);
  EXPECT_EQ(exit_code, 2) << output;
  ExpectContains(output, {"--openai-long-text", "refuse, truncate or chunk"});
}

// langchain-openai's OpenAIEmbeddings (PyPI, pinned in the test venv) against the server: as
// the README configures it (check_embedding_ctx_length=False) the vectors equal gRPC Encode's;
// as it comes (tiktoken cl100k ids) it gets the 400 naming the setting, not garbage; a long
// document is refused unless LangChain passes `long_text` or `truncate` through extra_body.
TEST(LangChain, OpenAIEmbeddingsConfiguredAsTheReadmeSaysAndAsItComes) {
  const std::vector<std::string> texts = {
      "The animal didn't cross the street because it was too tired.", "A man is playing a guitar.",
      "Ünïcödé text, CJK 日本語 and emoji 🙂 travel intact."};
  const std::string document = TextOfTokens(600, 3);
  pb::EncodeRequest chunked;
  chunked.add_inputs()->set_text(document);
  chunked.set_long_text(pb::LONG_TEXT_CHUNK);
  const pb::EncodeResponse chunked_answer = GrpcEncode(chunked);
  ASSERT_EQ(chunked_answer.results_size(), 1);
  EXPECT_EQ(chunked_answer.results(0).chunks(), 3);
  const json expected = {
      {"texts", texts},
      {"vectors", GrpcEmbeddings(texts)},
      {"document", document},
      {"document_chunked", std::vector<float>(chunked_answer.results(0).embedding().begin(),
                                              chunked_answer.results(0).embedding().end())},
      {"document_truncated", GrpcEmbeddings({document}).at(0)}};
  const std::string path = SharedServer().process().dir() + "/langchain_expected.json";
  std::ofstream(path) << expected.dump();
  RunPythonCheck(ATTN_LANGCHAIN_CHECK_SCRIPT,
                 "--base-url http://127.0.0.1:" + std::to_string(SharedServer().http_port()) +
                     "/v1 --expected '" + path + "'",
                 "langchain-openai: all checks passed");
}

// The chunked embedding of long documents against numpy over per-window Encode calls, for
// several window lengths, overlaps, poolings and `dimensions`, over /v1/encode and
// /v1/embeddings (long_text_reference.py); gRPC gives the same vector as /v1/encode.
TEST(LongText, ChunkedEmbeddingEqualsANumpyReferenceOfPerWindowEncodes) {
  RunPythonCheck(ATTN_LONG_TEXT_REFERENCE_SCRIPT,
                 "--http-port " + std::to_string(SharedServer().http_port()),
                 "long text reference: all checks passed");
}

// Every front end says per input how many tokens it had, whether it was truncated, and in how
// many windows it was encoded; a text longer than the tokenizer's look-ahead is counted up to it
// (the count is then a lower bound, and says so).
TEST(LongText, EveryAnswerSaysWhatHappenedToEachInput) {
  pb::EncodeRequest request;
  request.add_inputs()->set_text("a short one");
  request.add_inputs()->set_text(TextOfTokens(600, 1));
  std::string huge;  // 20,000 words: past the look-ahead
  for (int i = 0; i < 20000; ++i) huge += i % 2 ? "river " : "tree ";
  request.add_inputs()->set_text(huge);
  const pb::EncodeResponse truncated = GrpcEncode(request);
  ASSERT_EQ(truncated.results_size(), 3);
  EXPECT_FALSE(truncated.results(0).truncated());
  EXPECT_EQ(truncated.results(0).untruncated_length(), 5);
  EXPECT_EQ(truncated.results(0).chunks(), 1);
  EXPECT_TRUE(truncated.results(1).truncated());
  EXPECT_EQ(truncated.results(1).untruncated_length(), 600);
  EXPECT_FALSE(truncated.results(1).untruncated_length_is_lower_bound());
  EXPECT_TRUE(truncated.results(2).truncated());
  EXPECT_TRUE(truncated.results(2).untruncated_length_is_lower_bound());
  EXPECT_GT(truncated.results(2).untruncated_length(), 256);
  EXPECT_LT(truncated.results(2).untruncated_length(), 20002);
  EXPECT_EQ(truncated.results(2).tokens_size(), 256);

  // Chunked over gRPC equals chunked over /v1/encode, input by input.
  pb::EncodeRequest chunk;
  chunk.add_inputs()->set_text("a short one");
  chunk.add_inputs()->set_text(TextOfTokens(600, 1));
  chunk.set_long_text(pb::LONG_TEXT_CHUNK);
  chunk.set_chunk_overlap(10);
  const pb::EncodeResponse chunked = GrpcEncode(chunk);
  ASSERT_EQ(chunked.results_size(), 2);
  EXPECT_EQ(chunked.results(0).chunks(), 1);
  EXPECT_EQ(chunked.results(1).chunks(), 3);  // 598 tokens by 254 - 10
  EXPECT_FALSE(chunked.results(1).truncated());
  EXPECT_EQ(chunked.results(1).untruncated_length(), 600);
  EXPECT_EQ(chunked.results(1).tokens_size(), 600);
  const json http =
      Post("/v1/encode", {{"inputs", {{{"text", "a short one"}}, {{"text", TextOfTokens(600, 1)}}}},
                          {"longText", "LONG_TEXT_CHUNK"},
                          {"chunkOverlap", 10}});
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> grpc(chunked.results(i).embedding().begin(),
                                  chunked.results(i).embedding().end());
    const auto json_embedding = http.at("results").at(i).at("embedding").get<std::vector<float>>();
    EXPECT_LE(MaxAbsDiff(grpc, json_embedding), kTolerance) << i;
    EXPECT_EQ(http["results"][i].value("chunks", 0), chunked.results(i).chunks());
  }
  // The short input is what a plain Encode gives.
  EXPECT_LE(MaxAbsDiff(std::vector<float>(chunked.results(0).embedding().begin(),
                                          chunked.results(0).embedding().end()),
                       GrpcEmbeddings({"a short one"}).at(0)),
            kTolerance);
}

}  // namespace
}  // namespace attn::integration
