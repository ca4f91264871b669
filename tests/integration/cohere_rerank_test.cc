// Cohere's and Jina's rerank shape (server/http/cohere_rerank.h) against the real server: the
// real `cohere` package (PyPI, test venv) through /v1/rerank and /v2/rerank gets the scores of
// attnserve.v1.Encoder's Rerank and numpy's cosines of Encode's embeddings
// (tests/integration/cohere_rerank_check.py); /rerank (Jina's path) answers the same; a body in
// attnserve's own shape still gets RerankResponse on /v1/rerank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using nlohmann::json;

const std::vector<std::string>& Documents() {
  static const auto* documents = new std::vector<std::string>{
      "Our office is in Berlin.",
      "Refunds are issued within 5 business days.",
      "An electric kettle boils water fast.",
      "You get your money back after we receive the parcel.",
  };
  return *documents;
}
constexpr char kQuery[] = "when do I get my money back?";

json Expected(pb::Encoder::Stub* stub) {
  json expected = {{"model", "all-MiniLM-L6-v2"}, {"query", kQuery}, {"documents", Documents()}};
  pb::RerankRequest rerank;
  rerank.set_query(kQuery);
  for (const std::string& d : Documents()) rerank.add_documents(d);
  pb::RerankResponse reranked;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub->Rerank(&context, rerank, &reranked);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(reranked.method(), pb::RERANK_COSINE) << "a base version has no pair head";
  std::vector<float> scores(Documents().size());
  for (const pb::RerankResult& r : reranked.results()) scores[r.index()] = r.score();
  expected["rerank_scores"] = scores;
  pb::EncodeRequest encode;
  encode.add_inputs()->set_text(kQuery);
  for (const std::string& d : Documents()) encode.add_inputs()->set_text(d);
  pb::EncodeResponse encoded;
  grpc::ClientContext context;
  const grpc::Status status = stub->Encode(&context, encode, &encoded);
  EXPECT_TRUE(status.ok()) << status.error_message();
  json embeddings = json::array();
  for (const pb::EncodeResult& r : encoded.results()) {
    embeddings.push_back(std::vector<float>(r.embedding().begin(), r.embedding().end()));
  }
  if (embeddings.empty()) return expected;
  expected["query_embedding"] = embeddings[0];
  embeddings.erase(embeddings.begin());
  expected["embeddings"] = embeddings;
  return expected;
}

json PostJson(const std::string& path, const json& body, int* status) {
  HttpResponse response;
  std::string error;
  EXPECT_TRUE(HttpRequest(SharedServer().http_port(), "POST", path,
                          {"Content-Type: application/json"}, body.dump(), &response, &error))
      << error;
  *status = response.status;
  return json::parse(response.body, nullptr, false);
}

TEST(CohereRerankTest, CohereClient) {
  std::unique_ptr<pb::Encoder::Stub> stub = SharedServer().NewStub();
  const std::string path = SharedServer().process().dir() + "/cohere_expected.json";
  std::ofstream(path) << Expected(stub.get()).dump();
  const std::string python = ATTN_TEST_VENV_PYTHON;
  ASSERT_EQ(access(python.c_str(), X_OK), 0)
      << python << " is missing: scripts/setup.sh creates the test venv with cohere";
  int exit_code = -1;
  const std::string output =
      RunCommand("NO_PROXY='*' no_proxy='*' '" + python + "' '" + ATTN_COHERE_CHECK_SCRIPT +
                     "' --base-url http://127.0.0.1:" + std::to_string(SharedServer().http_port()) +
                     " --expected '" + path + "' 2>&1",
                 &exit_code);
  std::cout << output;
  EXPECT_EQ(exit_code, 0);
  EXPECT_NE(output.find("cohere client: all checks passed"), std::string::npos);
}

// /rerank (Jina's and Infinity's path) takes the same shape; /v1/rerank tells the two shapes
// apart by attnserve's own fields.
TEST(CohereRerankTest, PathsAndShapes) {
  int status = 0;
  const json jina = PostJson("/rerank",
                             {{"model", "all-MiniLM-L6-v2"},
                              {"query", kQuery},
                              {"documents", Documents()},
                              {"top_n", 1},
                              {"return_documents", true}},
                             &status);
  ASSERT_EQ(status, 200) << jina.dump();
  ASSERT_EQ(jina.at("results").size(), 1u);
  EXPECT_EQ(jina["results"][0]["document"]["text"], Documents()[jina["results"][0]["index"]]);
  EXPECT_TRUE(jina["results"][0].contains("relevance_score"));
  EXPECT_TRUE(jina.at("usage").contains("total_tokens"));

  const json ours =
      PostJson("/v1/rerank", {{"query", kQuery}, {"documents", Documents()}, {"topN", 1}}, &status);
  ASSERT_EQ(status, 200) << ours.dump();
  EXPECT_EQ(ours.at("method"), "RERANK_COSINE");
  EXPECT_TRUE(ours["results"][0].contains("score"));
  EXPECT_FALSE(ours["results"][0].contains("relevance_score"));

  const json objects =
      PostJson("/v1/rerank", {{"query", kQuery}, {"documents", {{{"text", "a"}}, {{"text", "b"}}}}},
               &status);
  EXPECT_EQ(status, 200) << objects.dump();
  const json wrong =
      PostJson("/rerank",
               {{"query", kQuery}, {"documents", Documents()}, {"max_chunks_per_doc", 2}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(wrong["error"]["param"], "max_chunks_per_doc") << wrong.dump();
}

}  // namespace
}  // namespace attn::integration
