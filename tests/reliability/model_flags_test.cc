// Hostile --model flags at start (several models per server, issue 17): each malformed,
// repeated or over-long --model, and a model set of which one model cannot load, is refused
// before the server serves anything: exit code 2 for a flag error (1 for a model that does not
// load), a message naming the flag or the model and quoting at most a short piece of the input,
// no ready file (the server never reports SERVING half-loaded).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace attn::integration {

// Every test starts its own (refused) server.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

struct Refusal {
  int exit_code = -1;
  std::string log;
  bool ready = false;
};

Refusal StartRefused(const std::vector<std::string>& flags) {
  ServerProcess server(flags);
  std::string error;
  Refusal refusal;
  if (!server.Start(&error)) {
    ADD_FAILURE() << error;
    return refusal;
  }
  int wait_status = 0;
  if (!server.process().WaitExit(ScaledSeconds(120), &wait_status)) {
    ADD_FAILURE() << "the server did not exit; log:\n" << server.process().LogTail();
    server.process().Stop();
    return refusal;
  }
  refusal.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  refusal.log = server.process().LogTail();
  refusal.ready = server.ReadyFileExists();
  return refusal;
}

struct FlagCase {
  const char* name;
  std::vector<std::string> flags;
  int exit_code;
  std::vector<std::string> message_parts;
};

class ModelFlagsTest : public ::testing::TestWithParam<FlagCase> {};

TEST_P(ModelFlagsTest, IsRefusedAtStartNamingTheProblem) {
  const FlagCase& c = GetParam();
  const Refusal refusal = StartRefused(c.flags);
  EXPECT_EQ(refusal.exit_code, c.exit_code) << refusal.log;
  EXPECT_FALSE(refusal.ready) << "the server reported SERVING";
  for (const std::string& part : c.message_parts) {
    EXPECT_NE(refusal.log.find(part), std::string::npos) << "'" << part << "' not in:\n"
                                                         << refusal.log;
  }
  // Whatever the input, the message quotes at most a short piece of it.
  EXPECT_EQ(refusal.log.find(std::string(200, 'n')), std::string::npos);
}

std::vector<FlagCase> Cases() {
  const std::string minilm = TestModelDir();
  // A directory with only MiniLM's config.json (no vocabulary, no weights): the config reads,
  // the model does not load.
  const std::string weightless =
      std::filesystem::temp_directory_path() / ("attnserve-weightless-" + std::to_string(getpid()));
  std::filesystem::create_directories(weightless);
  std::filesystem::copy_file(minilm + "/config.json", weightless + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  return {
      {"no_equals", {"--model", "minilm"}, 2, {"--model 'minilm'", "expected NAME=DIR"}},
      {"empty", {"--model="}, 2, {"expected NAME=DIR"}},
      {"empty_name", {"--model", "=" + minilm}, 2, {"expected NAME=DIR"}},
      {"empty_dir", {"--model", "minilm="}, 2, {"expected NAME=DIR"}},
      {"name_with_slash", {"--model", "a/b=" + minilm}, 2, {"model name 'a/b' is not valid"}},
      {"name_of_10000_chars",
       {"--model", std::string(10000, 'n') + "=" + minilm},
       2,
       {"(10000 bytes)", "is not valid"}},
      {"same_name_twice",
       {"--model", "m=" + minilm, "--model", "m=" + minilm},
       2,
       {"'m' is given twice"}},
      {"with_model_name",
       {"--model", "m=" + minilm, "--model_name=other"},
       2,
       {"not --model-name with --model"}},
      {"missing_dir",
       {"--model", "m=" + minilm, "--model", "gone=/nonexistent/model"},
       1,
       {"cannot load the model gone", "/nonexistent/model"}},
      // The first model loads, the second cannot: the server does not serve the first alone.
      {"second_model_does_not_load",
       {"--model", "m=" + minilm, "--model", "broken=" + weightless},
       1,
       {"cannot load the model broken", "vocab.txt"}},
  };
}

INSTANTIATE_TEST_SUITE_P(Catalogue, ModelFlagsTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<FlagCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace attn::integration
