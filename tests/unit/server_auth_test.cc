// The Trainer service's bearer-token checks (server/auth.h): reading the token file, the
// constant-time comparison, and the metadata check's status codes.
#include <grpcpp/server_context.h>
#include <grpcpp/test/server_context_test_spouse.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "server/auth.h"

namespace attn::server {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attn-auth-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& Write(const std::string& contents) {
    path_ = dir_ + "/token";
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << contents;
    return path_;
  }
  std::string dir_;
  std::string path_;
};

TEST_F(TokenFileTest, TrimsSurroundingWhitespace) {
  auto token = ReadTokenFile(Write("  s3cret-Token_1\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-Token_1");
}

TEST_F(TokenFileTest, MissingFileNamesThePath) {
  auto token = ReadTokenFile(dir_ + "/does-not-exist");
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(token.status().message().find("does-not-exist"), std::string::npos);
}

TEST_F(TokenFileTest, RejectsEmptyAndBadCharacters) {
  for (const std::string& contents :
       {std::string(""), std::string(" \n\t "), std::string("two words"),
        std::string("tab\tinside"), std::string("nul\0inside", 10), std::string("caf\xc3\xa9")}) {
    auto token = ReadTokenFile(Write(contents));
    EXPECT_FALSE(token.ok()) << "accepted a token file holding '" << contents << "'";
    if (!token.ok()) {
      EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
      // The message must not echo the secret-to-be back.
      if (contents.size() > 4) {
        EXPECT_EQ(token.status().message().find(contents), std::string::npos);
      }
    }
  }
}

TEST(ConstantTimeEqualsTest, EqualOnlyForTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("abc123", "abc123"));
  EXPECT_FALSE(ConstantTimeEquals("abc124", "abc123"));
  EXPECT_FALSE(ConstantTimeEquals("xbc123", "abc123"));
  EXPECT_FALSE(ConstantTimeEquals("abc12", "abc123"));    // prefix
  EXPECT_FALSE(ConstantTimeEquals("abc1234", "abc123"));  // longer
  // Cycling the secret must not make a repetition of it match.
  EXPECT_FALSE(ConstantTimeEquals("abcabc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  // An empty secret never matches (the server refuses empty token files anyway).
  EXPECT_FALSE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
}

grpc::Status CheckWithMetadata(const std::string* authorization) {
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (authorization != nullptr) spouse.AddClientMetadata("authorization", *authorization);
  return CheckBearerToken(context, "s3cret");
}

TEST(CheckBearerTokenTest, StatusCodes) {
  EXPECT_EQ(CheckWithMetadata(nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::string cases_unauthenticated[] = {"", "s3cret", "Basic s3cret", "Bearer"};
  for (const std::string& value : cases_unauthenticated) {
    EXPECT_EQ(CheckWithMetadata(&value).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "'" << value << "'";
  }
  const std::string cases_denied[] = {"Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "Bearer "};
  for (const std::string& value : cases_denied) {
    const grpc::Status status = CheckWithMetadata(&value);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "'" << value << "'";
    EXPECT_EQ(status.error_message().find("s3cret"), std::string::npos)
        << "the error message leaks the token";
  }
  const std::string cases_ok[] = {"Bearer s3cret", "bearer s3cret", "BEARER  s3cret "};
  for (const std::string& value : cases_ok) {
    EXPECT_TRUE(CheckWithMetadata(&value).ok()) << "'" << value << "'";
  }
}

}  // namespace
}  // namespace attn::server
