// attnctl's new surfaces of issue 31 under hostile use, the real binary against a real server
// (an API key, --max-inputs-per-request 4): API keys by file and variable (missing, empty, a
// directory, spaces, escape sequences, non-ASCII, oversized, binary, wrong), stdin's lines (empty,
// blank, CRLF, at line 9,999, past a call boundary, not UTF-8), --jsonl records of awkward texts,
// mistyped and oversized flags and commands, empty --text / --pair, and attnctl pointed at the
// HTTP and metrics ports. Each case: attnctl's exit code and the words its message must (and
// must not) hold, at most 64 bytes of the input quoted; after each, the server still serves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/integration/attnctl_runner.h"
#include "tests/integration/harness.h"

namespace attn::integration {

constexpr char kApiKey[] = "attnctl-hostile-api-key";

std::string WorkDir() {
  static const std::string* dir =
      new std::string((std::filesystem::temp_directory_path() /
                       ("attnserve-attnctl-hostile-" + std::to_string(getpid())))
                          .string());
  return *dir;
}

std::optional<std::vector<std::string>> SharedServerFlags() {
  std::filesystem::create_directories(WorkDir());
  std::ofstream(WorkDir() + "/api.key") << kApiKey << "\n";
  return std::vector<std::string>{"--api_key_file=" + WorkDir() + "/api.key",
                                  "--max_inputs_per_request=4", "--threads=1"};
}

namespace {

// A file under the work directory with `contents`; its path.
std::string File(const std::string& name, const std::string& contents) {
  const std::string path = WorkDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::string Lines(int n, int blank_at = 0) {
  std::string out;
  for (int i = 1; i <= n; ++i) out += i == blank_at ? "\n" : absl::StrCat("text ", i, "\n");
  return out;
}

struct Case {
  const char* name;
  // The arguments (--server is added unless the case gives one), stdin, environment.
  std::function<std::vector<std::string>()> args;
  std::string stdin_bytes;
  std::vector<std::string> env;
  int exit_code;
  std::vector<std::string> says;                              // every one in stderr
  std::vector<std::string> never;                             // none in stderr or stdout
  std::function<void(const AttnctlResult&)> check = nullptr;  // more checks on the output
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<std::string> WithKey(std::vector<std::string> args) {
  args.insert(args.end(), {"--api-key-file", WorkDir() + "/api.key"});
  return args;
}

const std::string kKeyEnv = std::string("ATTNSERVE_API_KEY=") + kApiKey;

std::vector<Case> ApiKeyFileCases() {
  return {
      {"key_file_missing",
       [] {
         return std::vector<std::string>{"info", "--api-key-file", "/nonexistent/key"};
       },
       "",
       {},
       1,
       {"cannot read API key file /nonexistent/key"},
       {}},
      {"key_file_empty",
       [] {
         return std::vector<std::string>{"info", "--api-key-file", File("empty", "\n \n")};
       },
       "",
       {},
       1,
       {"is empty"},
       {}},
      {"key_file_a_directory",
       [] {
         return std::vector<std::string>{"info", "--api-key-file", WorkDir()};
       },
       "",
       {},
       1,
       {"is a directory"},
       {}},
      {"key_with_a_space",
       [] {
         return std::vector<std::string>{"info", "--api-key-file", File("space", "ab cd")};
       },
       "",
       {},
       1,
       {"space, control or non-ASCII character at byte 2"},
       {"ab cd"}},
      {"key_with_an_escape_sequence",
       [] {
         return std::vector<std::string>{"info", "--api-key-file",
                                         File("escape", "key\x1b[31mred")};
       },
       "",
       {},
       1,
       {"at byte 3"},
       {"\x1b[31m"}},
      {"key_not_ascii",
       [] {
         return std::vector<std::string>{"info", "--api-key-file", File("utf8", "cl\xc3\xa9")};
       },
       "",
       {},
       1,
       {"non-ASCII character at byte 2"},
       {}},
      {"key_5000_bytes",
       [] {
         return std::vector<std::string>{"info", "--api-key-file",
                                         File("long", std::string(5000, 'k'))};
       },
       "",
       {},
       1,
       {"longer than 4096 bytes"},
       {std::string(100, 'k')}},
  };
}

std::vector<Case> ApiKeyMoreCases() {
  return {
      {"key_file_1mib_of_random_bytes",
       [] {
         std::mt19937 random(7);
         std::string bytes(1 << 20, '\0');
         for (char& c : bytes) c = static_cast<char>(random());
         return std::vector<std::string>{"info", "--api-key-file", File("random", bytes)};
       },
       "",
       {},
       1,
       {"API key"},
       {}},
      {"env_key_with_a_newline_inside",
       [] { return std::vector<std::string>{"info"}; },
       "",
       {"ATTNSERVE_API_KEY=ab\ncd"},
       1,
       {"$ATTNSERVE_API_KEY has a space, control"},
       {}},
      {"env_key_blank_is_no_key",
       [] { return std::vector<std::string>{"info"}; },
       "",
       {"ATTNSERVE_API_KEY=   "},
       1,
       {"UNAUTHENTICATED", "hint: this server requires an API key"},
       {}},
      {"wrong_key",
       [] { return std::vector<std::string>{"info"}; },
       "",
       {"ATTNSERVE_API_KEY=wrong-key-123"},
       1,
       {"PERMISSION_DENIED", "hint: wrong API key"},
       {"wrong-key-123"}},
      {"key_file_with_crlf_and_blanks_around",
       [] {
         return std::vector<std::string>{"info", "--api-key-file",
                                         File("crlf", std::string("  ") + kApiKey + "\r\n\r\n")};
       },
       "",
       {},
       0,
       {},
       {}},
  };
}

std::vector<Case> LineCases() {
  auto encode = [] { return WithKey({"encode", "--jsonl"}); };
  return {
      {"blank_first_line", encode, "\nhello\n", {}, 2, {"line 1 of stdin is empty"}, {}},
      {"whitespace_only_line", encode, "a\n \t \nb\n", {}, 2, {"line 2 of stdin is blank"}, {}},
      {"crlf_empty_line", encode, "a\r\n\r\nb\r\n", {}, 2, {"line 2 of stdin is empty"}, {}},
      {"trailing_empty_line", encode, "a\nb\n\n", {}, 2, {"line 3 of stdin is empty"}, {}},
      {"empty_line_9999_of_10000",
       encode,
       Lines(10000, 9999),
       {},
       2,
       {"line 9999 of stdin is empty"},
       {}},
      {"empty_stdin", encode, "", {}, 2, {"no input: stdin had no text"}, {}},
      {"not_utf8_in_the_second_call",
       encode,
       "a\nb\nc\nd\ne\nbad \xff\n",
       {},
       2,
       {"line 6 of stdin is not valid UTF-8 (byte 0xFF at offset 4)"},
       {"libprotobuf"}},
      {"surrogate_in_text_flag",
       [] {
         return WithKey({"encode", "--text",
                         "a\xed\xa0\x80"
                         "b"});
       },
       "",
       {},
       2,
       {"--text is not valid UTF-8 (byte 0xED at offset 1)"},
       {"libprotobuf"}},
      {"over_long_line_in_the_second_call",
       [] {
         return WithKey({"encode", "--truncation", "none"});
       },
       "a\nb\nc\nd\n" +
           [] {
             std::string s;
             for (int i = 0; i < 600; ++i) s += "the ";
             return s;
           }() +
           "\n",
       {},
       1,
       {"line 5 of stdin: text has 602 tokens", "no --max-length of this model fits the text"},
       {"inputs[", "tokenization.max_length"}},
  };
}

std::vector<Case> OutputCases() {
  auto encode = [] { return WithKey({"encode", "--jsonl"}); };
  return {
      {"rerank_empty_document",
       [] {
         return WithKey({"rerank", "--query", "kettle"});
       },
       "red kettle\n\nblue lamp\n",
       {},
       2,
       {"line 2 of stdin is empty"},
       {}},
      {"jsonl_awkward_texts",
       encode,
       "quotes \" and \\ backslash\ttab\nemoji \xf0\x9f\x98\x80 and \xe2\x80\xa8 separator\n"
       "<script>alert(1)</script>\n",
       {},
       0,
       {},
       {},
       [](const AttnctlResult& r) {
         const std::vector<std::string> texts = {
             "quotes \" and \\ backslash\ttab", "emoji \xf0\x9f\x98\x80 and \xe2\x80\xa8 separator",
             "<script>alert(1)</script>"};
         const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
         ASSERT_EQ(lines.size(), texts.size()) << r.out;
         for (size_t i = 0; i < texts.size(); ++i) {
           const nlohmann::json record = nlohmann::json::parse(lines[i]);
           EXPECT_EQ(record["line"], i + 1);
           EXPECT_EQ(record["text"], texts[i]);
         }
       }},
      {"jsonl_1000_lines",
       encode,
       Lines(1000),
       {},
       0,
       {},
       {},
       [](const AttnctlResult& r) {
         const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
         ASSERT_EQ(lines.size(), 1000u);
         for (size_t i = 0; i < lines.size(); ++i) {
           const nlohmann::json record = nlohmann::json::parse(lines[i]);
           ASSERT_EQ(record["line"], i + 1);
           ASSERT_EQ(record["text"], absl::StrCat("text ", i + 1));
         }
       }},
      {"empty_text_flag",
       [] {
         return WithKey({"encode", "--text", ""});
       },
       "",
       {},
       2,
       {"--text is empty"},
       {"no input"}},
      {"empty_pair_flag",
       [] {
         return WithKey({"encode", "--text", "a", "--pair", ""});
       },
       "",
       {},
       2,
       {"--pair is empty"},
       {}},
  };
}

std::vector<Case> CommandLineCases() {
  const std::string long_name(10000, 'x');
  return {
      {"flag_typo_txt",
       [] {
         return WithKey({"encode", "--txt", "a"});
       },
       "",
       {},
       2,
       {"unknown flag --txt; did you mean --text?"},
       {}},
      {"flag_typo_max_lenght",
       [] {
         return WithKey({"encode", "--max-lenght", "5"});
       },
       "",
       {},
       2,
       {"did you mean --max-length?"},
       {}},
      {"flag_typo_jsnol",
       [] {
         return WithKey({"encode", "--jsnol"});
       },
       "",
       {},
       2,
       {"did you mean --jsonl?"},
       {}},
      {"flag_far_from_any",
       [] {
         return WithKey({"encode", "--zzzz"});
       },
       "",
       {},
       2,
       {"unknown flag --zzzz\n"},
       {"did you mean"}},
      {"flag_10000_characters",
       [long_name] {
         return WithKey({"encode", "--" + long_name});
       },
       "",
       {},
       2,
       {"unknown flag --" + std::string(64, 'x') + "\u2026(10000 bytes)"},
       {std::string(65, 'x')}},
      {"command_typo",
       [] {
         return WithKey({"tokenise", "--text", "a"});
       },
       "",
       {},
       2,
       {"did you mean 'tokenize'?"},
       {}},
      {"command_10000_characters",
       [long_name] { return std::vector<std::string>{long_name}; },
       "",
       {},
       2,
       {"(10000 bytes)"},
       {std::string(65, 'x')}},
      {"stray_argument_10000_characters",
       [long_name] {
         return WithKey({"encode", "--text", "a", long_name});
       },
       "",
       {},
       2,
       {"unexpected argument"},
       {std::string(65, 'x')}},
  };
}

std::vector<Case> PortCases() {
  return {
      {"http_port",
       [] {
         return std::vector<std::string>{"encode", "--text", "a", "--server",
                                         "127.0.0.1:" + std::to_string(SharedServer().http_port())};
       },
       "",
       {kKeyEnv},
       1,
       {"is attnserve's HTTP port"},
       {"http1.x", "Failed parsing HTTP/2"},
       [](const AttnctlResult& r) {
         EXPECT_TRUE(absl::StrContains(
             r.err, "serves on port " + std::to_string(SharedServer().grpc_port())))
             << r.err;
       }},
      {"metrics_port",
       [] {
         return std::vector<std::string>{
             "health", "--server", "127.0.0.1:" + std::to_string(SharedServer().metrics_port())};
       },
       "",
       {},
       1,
       {"is attnserve's metrics port"},
       {"http1.x", "Failed parsing HTTP/2"}},
      {"nobody_listens",
       [] {
         return std::vector<std::string>{"info", "--server",
                                         "127.0.0.1:" + std::to_string(PickFreePort())};
       },
       "",
       {},
       1,
       {"cannot reach"},
       {}},
      {"unix_socket_nobody_listens",
       [] {
         return std::vector<std::string>{"info", "--server", "unix:/nonexistent/socket"};
       },
       "",
       {},
       1,
       {"UNAVAILABLE"},
       {}},
  };
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (auto group :
       {ApiKeyFileCases, ApiKeyMoreCases, LineCases, OutputCases, CommandLineCases, PortCases}) {
    for (Case& c : group()) cases.push_back(std::move(c));
  }
  return cases;
}

class AttnctlHostileTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttnctlHostileTest, AnswersWithAClearMessageAndTheServerKeepsServing) {
  const Case& c = GetParam();
  std::vector<std::string> args = c.args();
  if (std::find(args.begin(), args.end(), "--server") == args.end()) {
    args.insert(args.end(), {"--server", SharedServer().address()});
  }
  const AttnctlResult r = RunAttnctl(args, c.stdin_bytes, c.env);
  std::printf("[attnctl] %s: exit %d: %s\n", c.name, r.exit_code,
              r.err.substr(0, r.err.find('\n')).c_str());
  EXPECT_EQ(r.exit_code, c.exit_code) << r.Describe();
  for (const std::string& part : c.says) {
    EXPECT_TRUE(absl::StrContains(r.err, part)) << "missing '" << part << "'\n" << r.Describe();
  }
  for (const std::string& part : c.never) {
    EXPECT_FALSE(absl::StrContains(r.err, part) || absl::StrContains(r.out, part))
        << "should not say '" << part.substr(0, 80) << "'\n"
        << r.Describe();
  }
  for (absl::string_view line : absl::StrSplit(r.err, '\n')) {
    EXPECT_LE(line.size(), 600u) << "an over-long message line: " << line.substr(0, 200);
  }
  if (c.exit_code == 2) {
    EXPECT_TRUE(r.out.empty()) << "a usage error prints nothing\n" << r.Describe();
  }
  if (c.check) c.check(r);
  // The server is alive and serving.
  const AttnctlResult health = RunAttnctl({"health", "--server", SharedServer().address()});
  EXPECT_EQ(health.exit_code, 0) << health.Describe();
  const AttnctlResult encode = RunAttnctl(
      {"encode", "--server", SharedServer().address(), "--text", "still serving"}, "", {kKeyEnv});
  EXPECT_EQ(encode.exit_code, 0) << encode.Describe();
}

INSTANTIATE_TEST_SUITE_P(Catalogue, AttnctlHostileTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace attn::integration
