// attnctl at the seams (issue 31), the real binary against a real server on loopback (API key,
// trainer token, model store, an HTTP port, 3 inputs per request):
//  * finding 4: the API key from --api-key-file or $ATTNSERVE_API_KEY, and what attnctl says
//    without one or with a wrong one;
//  * finding 9: encode --jsonl maps every vector to its line of stdin (index, line and text on
//    each record, over calls of 3 inputs), and an empty line is an error naming it;
//  * finding 12: messages in attnctl's terms (an over-long text with --truncation none, attnctl
//    pointed at the HTTP or metrics port, a mistyped flag or command, an empty --text);
//  * finding 10: job watch: --log-every governs the "most changed" lines, replayed steps show
//    when they happened and no ETA, --from-event still counts the steps the job ran;
//  * finding 3: rollback after a staged commit and a gated promotion serves what was served
//    before (base), never the staged version, also after a restart.
// Run against an older attnctl or server: ATTNCTL_BINARY=... ATTNSERVE_BINARY=... <binary>.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/integration/attnctl_runner.h"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr char kApiKey[] = "attnctl-test-api-key";
constexpr char kToken[] = "attnctl-test-trainer-token";

bool Has(const std::string& text, const std::string& part) { return absl::StrContains(text, part); }

// A JSON number, or an int64 as protobuf's JSON writes it (a string).
int Int(const nlohmann::json& value) {
  return value.is_string() ? std::stoi(value.get<std::string>()) : value.get<int>();
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

class AttnctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-attnctl-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    std::ofstream(*work_ + "/api.key") << kApiKey << "\n";
    std::ofstream(*work_ + "/trainer.token") << kToken << "\n";
    start_error_ = new std::string();
    server_ = new ServerProcess(ServerFlags());
    if (!server_->StartAndWait(ScaledSeconds(90), start_error_)) return;
    start_error_->clear();
  }

  static std::vector<std::string> ServerFlags() {
    return {"--api_key_file=" + *work_ + "/api.key",
            "--trainer_token_file=" + *work_ + "/trainer.token",
            "--model_store=" + *work_ + "/store",
            "--max_inputs_per_request=3",
            "--threads=1",
            "--trainer_threads=1"};
  }

  static void TearDownTestSuite() {
    StopOwnServer(server_);
    delete server_;
    RemoveTestDir(*work_);
    delete work_;
    delete start_error_;
  }

  void SetUp() override { ASSERT_TRUE(start_error_->empty()) << *start_error_; }

  static std::string Address() { return server_->address(); }
  static std::string KeyFile() { return *work_ + "/api.key"; }

  // attnctl `args` against the server, with the API key (by file) and the trainer token.
  static AttnctlResult Run(std::vector<std::string> args, const std::string& stdin_bytes = "") {
    args.insert(args.end(), {"--server", Address()});
    return RunAttnctl(
        args, stdin_bytes,
        {"ATTNSERVE_API_KEY=" + std::string(kApiKey), "ATTNSERVE_TOKEN=" + std::string(kToken)});
  }

  // The embedding gRPC Encode gives `text` (the reference attnctl's vectors must equal).
  static std::vector<float> Embed(const std::string& text, const std::string& version = "") {
    auto stub = server_->NewStub();
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kApiKey);
    pb::EncodeRequest request;
    request.add_inputs()->set_text(text);
    request.set_model_version(version);
    pb::EncodeResponse response;
    const grpc::Status status = stub->Encode(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    if (!status.ok() || response.results_size() != 1) return {};
    return {response.results(0).embedding().begin(), response.results(0).embedding().end()};
  }

  static std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = *work_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  static std::string* work_;
  static ServerProcess* server_;
  static std::string* start_error_;
};

std::string* AttnctlTest::work_ = nullptr;
ServerProcess* AttnctlTest::server_ = nullptr;
std::string* AttnctlTest::start_error_ = nullptr;

// Finding 4: every Encoder command answered UNAUTHENTICATED and attnctl had no way to send a key.
TEST_F(AttnctlTest, TheApiKeyComesFromAFileOrTheEnvironment) {
  const std::vector<float> reference = Embed("a key for the encoder");
  ASSERT_FALSE(reference.empty());
  const AttnctlResult by_file =
      RunAttnctl({"encode", "--server", Address(), "--api-key-file", KeyFile(), "--jsonl", "--text",
                  "a key for the encoder"});
  ASSERT_EQ(by_file.exit_code, 0) << by_file.Describe();
  const nlohmann::json record = nlohmann::json::parse(by_file.out);
  EXPECT_EQ(record["embedding"].get<std::vector<float>>(), reference);
  const AttnctlResult by_env = RunAttnctl({"info", "--server", Address()}, "",
                                          {"ATTNSERVE_API_KEY=" + std::string(kApiKey)});
  EXPECT_EQ(by_env.exit_code, 0) << by_env.Describe();

  const AttnctlResult none = RunAttnctl({"encode", "--server", Address(), "--text", "x"});
  EXPECT_EQ(none.exit_code, 1) << none.Describe();
  EXPECT_TRUE(Has(none.err, "UNAUTHENTICATED")) << none.err;
  EXPECT_TRUE(Has(none.err,
                  "hint: this server requires an API key (attnserve --api-key-file): "
                  "pass --api-key-file PATH or set ATTNSERVE_API_KEY"))
      << none.err;
  const AttnctlResult wrong = RunAttnctl({"tokenize", "--server", Address(), "--text", "x"}, "",
                                         {"ATTNSERVE_API_KEY=not-the-key"});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.Describe();
  EXPECT_TRUE(Has(wrong.err, "PERMISSION_DENIED")) << wrong.err;
  EXPECT_TRUE(Has(wrong.err, "hint: wrong API key")) << wrong.err;
  EXPECT_FALSE(Has(wrong.err, "not-the-key")) << "a presented key is never echoed: " << wrong.err;
  // The Trainer keeps its own token: the API key is not sent in its place.
  const AttnctlResult versions = RunAttnctl({"versions", "--server", Address()}, "",
                                            {"ATTNSERVE_API_KEY=" + std::string(kApiKey)});
  EXPECT_EQ(versions.exit_code, 1) << versions.Describe();
  EXPECT_TRUE(Has(versions.err, "hint: the Trainer needs its token")) << versions.err;
}

// Finding 9: a blank line was skipped and the lines after it renumbered, with no text in the
// output: the third line came back as "index": 1.
TEST_F(AttnctlTest, JsonlMapsEveryVectorToItsLine) {
  const AttnctlResult blank = Run({"encode", "--jsonl"}, "alpha\n\ngamma\n");
  EXPECT_EQ(blank.exit_code, 2) << blank.Describe();
  EXPECT_TRUE(Has(blank.err, "line 2 of stdin is empty")) << blank.err;
  EXPECT_TRUE(blank.out.empty()) << "nothing printed for a file that would map wrongly";

  // Seven lines over calls of 3, 3 and 1 inputs (--max-inputs-per-request 3).
  const std::vector<std::string> texts = {"alpha particles",
                                          "a blue kettle",
                                          "gamma rays",
                                          "delta of the river",
                                          "\"quoted\" \\ text \t tab",
                                          "zeta",
                                          "the last line, without a newline"};
  std::string input;
  for (const std::string& t : texts) input += t + (&t == &texts.back() ? "" : "\r\n");
  const AttnctlResult r = Run({"encode", "--jsonl"}, input);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), texts.size()) << r.out;
  for (size_t i = 0; i < texts.size(); ++i) {
    const nlohmann::json record = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(record["index"], i);
    EXPECT_EQ(record["line"], i + 1);
    EXPECT_EQ(record["text"], texts[i]);
    EXPECT_EQ(record["embedding"].get<std::vector<float>>(), Embed(texts[i])) << texts[i];
  }

  // A line the server refuses (over the length limit), in the third call: named by its line of
  // stdin, not by its index in that call.
  std::string refused = "a\nb\nc\nd\ne\nf\n";
  for (int i = 0; i < 300; ++i) refused += "the ";
  const AttnctlResult bad = Run({"encode", "--jsonl", "--truncation", "none"}, refused + "\nh\n");
  EXPECT_EQ(bad.exit_code, 1) << bad.Describe();
  EXPECT_TRUE(Has(bad.err, "line 7 of stdin: text has 302 tokens")) << bad.err;
  EXPECT_FALSE(Has(bad.err, "inputs[0]")) << bad.err;
  EXPECT_TRUE(Has(bad.err,
                  "inputs 0 to 5 (lines 1 to 6) were printed; input 6 (line 7) and "
                  "later were not"))
      << bad.err;
}

// Finding 12: the server's words for its API (tokenization.max_length, TRUNCATION_NONE,
// LONG_TEXT_CHUNK; "raise ... up to 512" for a text no length fits), gRPC's for an HTTP port, no suggestion for a typo
// and "no input" for an empty --text.
TEST_F(AttnctlTest, MessagesSpeakAttnctlsLanguage) {
  std::string long_text;  // 2,348 tokens with [CLS] and [SEP], as in the finding
  for (int i = 0; i < 2346; ++i) long_text += "the ";
  const AttnctlResult too_long = Run({"encode", "--truncation", "none", "--text", long_text});
  EXPECT_EQ(too_long.exit_code, 1) << too_long.Describe();
  EXPECT_TRUE(Has(too_long.err,
                  "--text: text has 2348 tokens, more than --max-length 256 with "
                  "--truncation none"))
      << too_long.err;
  EXPECT_TRUE(Has(too_long.err,
                  "hint: no --max-length of this model fits the text: shorten or split it, "
                  "embed all of it in windows with --long-text chunk"))
      << too_long.err;
  EXPECT_FALSE(Has(too_long.err, "LONG_TEXT_CHUNK")) << too_long.err;
  EXPECT_FALSE(Has(too_long.err, "TRUNCATION_")) << too_long.err;
  EXPECT_FALSE(Has(too_long.err, "tokenization.max_length")) << too_long.err;
  EXPECT_FALSE(Has(too_long.err, "up to 512")) << too_long.err;

  const AttnctlResult fits =
      Run({"tokenize", "--truncation", "none"}, "short\n" + long_text.substr(0, 300 * 4) + "\n");
  EXPECT_EQ(fits.exit_code, 1) << fits.Describe();
  EXPECT_TRUE(Has(fits.err, "line 2 of stdin: text has 302 tokens")) << fits.err;
  EXPECT_TRUE(Has(fits.err, "hint: pass --max-length 302 or more (this model takes up to 512"))
      << fits.err;

  for (const auto& [port, says] :
       {std::pair<int, std::string>{server_->http_port(), "is attnserve's HTTP port"},
        {server_->metrics_port(), "is attnserve's metrics port"}}) {
    const AttnctlResult wrong_port =
        RunAttnctl({"info", "--server", "127.0.0.1:" + std::to_string(port)});
    EXPECT_EQ(wrong_port.exit_code, 1) << wrong_port.Describe();
    EXPECT_TRUE(Has(wrong_port.err, says)) << wrong_port.err;
    EXPECT_FALSE(Has(wrong_port.err, "http1.x")) << wrong_port.err;  // gRPC's words for it
    EXPECT_FALSE(Has(wrong_port.err, "Failed parsing HTTP/2")) << wrong_port.err;
  }
  const AttnctlResult http =
      RunAttnctl({"health", "--server", "127.0.0.1:" + std::to_string(server_->http_port())});
  EXPECT_TRUE(
      Has(http.err, "this server serves on port " + std::to_string(server_->grpc_port()) +
                        ": attnctl --server 127.0.0.1:" + std::to_string(server_->grpc_port())))
      << http.err;

  const AttnctlResult typo = Run({"encode", "--txt", "hello"});
  EXPECT_EQ(typo.exit_code, 2) << typo.Describe();
  EXPECT_TRUE(Has(typo.err, "unknown flag --txt; did you mean --text?")) << typo.err;
  const AttnctlResult command = Run({"ecnode", "--text", "hello"});
  EXPECT_EQ(command.exit_code, 2) << command.Describe();
  EXPECT_TRUE(Has(command.err, "did you mean 'encode'?")) << command.err;
  const AttnctlResult empty = Run({"encode", "--text", ""});
  EXPECT_EQ(empty.exit_code, 2) << empty.Describe();
  EXPECT_TRUE(Has(empty.err, "--text is empty")) << empty.err;
  EXPECT_FALSE(Has(empty.err, "no input")) << empty.err;
}

// Seconds between two of the server's UTC times.
double Seconds(const std::string& from, const std::string& to) {
  absl::Time a, b;
  std::string error;
  EXPECT_TRUE(absl::ParseTime(absl::RFC3339_full, from, &a, &error)) << from;
  EXPECT_TRUE(absl::ParseTime(absl::RFC3339_full, to, &b, &error)) << to;
  return absl::ToDoubleSeconds(b - a);
}

// A detached contrastive job over `pairs` made-up pairs, batches of 2, `epochs` epochs: its id.
std::string CreateJob(const std::string& data_path, int epochs,
                      const std::function<AttnctlResult(std::vector<std::string>)>& run) {
  const AttnctlResult created =
      run({"finetune", "--data", data_path, "--objective", "contrastive", "--batch-size", "2",
           "--epochs", std::to_string(epochs), "--detach", "--no-dropout"});
  EXPECT_EQ(created.exit_code, 0) << created.Describe();
  return std::string(absl::StripAsciiWhitespace(created.out));
}

// Finding 10: a 20-step server-side job watched after it ended (every event a replay), and a
// cancelled one watched from its last event.
TEST_F(AttnctlTest, JobWatchLinesAndSummary) {
  std::string data;
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&data, "{\"anchor\": \"question ", i,
                    " about the weather\", \"positive\": ", "\"answer ", i, ": rain on day ", i % 9,
                    "\"}\n");
  }
  const std::string path = WriteFile("watch.jsonl", data);
  auto run = [](std::vector<std::string> args) { return Run(std::move(args)); };
  const std::string id = CreateJob(path, 1, run);
  AttnctlResult shown;
  ASSERT_TRUE(WaitFor(
      [&] {
        shown = Run({"job", "show", id, "--json"});
        return shown.exit_code == 0 && Has(shown.out, "\"JOB_SUCCEEDED\"");
      },
      ScaledSeconds(240)))
      << shown.Describe();

  // Every event with its time: when each step happened, from the job's start.
  const AttnctlResult events = Run({"job", "watch", id, "--json"});
  ASSERT_EQ(events.exit_code, 0) << events.Describe();
  const nlohmann::json job = nlohmann::json::parse(shown.out);
  std::map<int, double> elapsed;
  for (const std::string& line : Lines(events.out)) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (!event.contains("progress")) continue;
    const int step = Int(event["progress"]["step"]);
    // The step's own event (a committing job's last event repeats the last step).
    if (step > 0 && elapsed.count(step) == 0) {
      elapsed[step] = Seconds(job["started_utc"], event["time_utc"]);
    }
  }
  ASSERT_EQ(elapsed.size(), 20u) << events.out;

  const AttnctlResult watch = Run({"job", "watch", id, "--log-every", "5"});
  ASSERT_EQ(watch.exit_code, 0) << watch.Describe();
  int progress_lines = 0, most_changed = 0;
  for (const std::string& line : Lines(watch.err)) {
    if (absl::StartsWith(line, "step ")) {
      ++progress_lines;
      EXPECT_FALSE(Has(line, "ETA")) << "a replayed step has no ETA: " << line;
      const int seconds = static_cast<int>(elapsed[std::stoi(line.substr(5))] + 0.5);
      EXPECT_TRUE(Has(line, absl::StrFormat("elapsed %d:%02d", seconds / 60, seconds % 60)))
          << line << " (the job's events say " << seconds << " s)";
    }
    most_changed += absl::StartsWith(line, "  most changed:");
  }
  EXPECT_EQ(progress_lines, 5) << watch.err;  // steps 1, 5, 10, 15, 20
  EXPECT_GE(most_changed, 1) << watch.err;
  EXPECT_LE(most_changed, progress_lines) << "--log-every 5 governs these too:\n" << watch.err;
  EXPECT_TRUE(Has(watch.out, "succeeded, 20/20 steps")) << watch.out;

  // A long job, cancelled after a few steps, watched from its last event (the cancellation): the
  // summary counts the steps it ran.
  const std::string long_id = CreateJob(path, 50, run);
  ASSERT_TRUE(WaitFor(
      [&] {
        shown = Run({"job", "show", long_id, "--json"});
        return shown.exit_code == 0 && Has(shown.out, "\"JOB_RUNNING\"") &&
               Int(nlohmann::json::parse(shown.out)["step"]) >= 3;
      },
      ScaledSeconds(240)))
      << shown.Describe();
  const AttnctlResult cancel = Run({"job", "cancel", long_id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.Describe();
  shown = Run({"job", "show", long_id, "--json"});
  const nlohmann::json cancelled = nlohmann::json::parse(shown.out);
  const int ran = Int(cancelled["step"]);
  const int last_event = Int(cancelled["events"]) - 1;
  const AttnctlResult late =
      Run({"job", "watch", long_id, "--from-event", std::to_string(last_event)});
  EXPECT_EQ(late.exit_code, 1) << late.Describe();
  EXPECT_TRUE(Has(late.out, absl::StrCat("cancelled, ", ran, "/1000 steps"))) << late.Describe();
}

// Finding 3: a staged commit, a job whose gate promotes another version, then rollback.
TEST_F(AttnctlTest, RollbackAfterAGatedPromotionServesWhatWasServedBefore) {
  const AttnctlResult before = Run({"versions", "--json"});
  ASSERT_EQ(before.exit_code, 0) << before.Describe();
  const std::string served_before =
      nlohmann::json::parse(before.out)["serving_version"].get<std::string>();

  auto trainer = pb::Trainer::NewStub(server_->NewChannel());
  const std::string staged = CommitOneContrastiveStep(trainer.get(), {kToken, "", 5e-5, false});
  ASSERT_FALSE(staged.empty());
  const std::string pairs = WriteFile(
      "gated.jsonl",
      "{\"anchor\": \"a red bicycle\", \"positive\": \"a bike painted red\"}\n"
      "{\"anchor\": \"fresh bread\", \"positive\": \"a loaf from the bakery\"}\n"
      "{\"anchor\": \"the violin concerto\", \"positive\": \"music for violin and orchestra\"}\n");
  const std::string held_out =
      WriteFile("gated-heldout.jsonl",
                "{\"query\": \"a bike\", \"item\": \"a bike painted red\"}\n"
                "{\"query\": \"bread\", \"item\": \"a loaf from the bakery\"}\n");
  const AttnctlResult gated =
      Run({"finetune", "--data", pairs, "--objective", "contrastive", "--batch-size", "3",
           "--eval-data", held_out, "--promote-if", "recall@1>=0", "--commit"});
  ASSERT_EQ(gated.exit_code, 0) << gated.Describe();
  ASSERT_TRUE(Has(gated.out, "(promoted: now served by default")) << gated.out;
  const AttnctlResult promoted = Run({"versions", "--json"});
  const std::string gated_version =
      nlohmann::json::parse(promoted.out)["serving_version"].get<std::string>();
  ASSERT_NE(gated_version, staged);

  const AttnctlResult rollback = Run({"rollback"});
  ASSERT_EQ(rollback.exit_code, 0) << rollback.Describe();
  EXPECT_TRUE(absl::StartsWith(rollback.out, "rolled back: now serving " + served_before + "\n"))
      << rollback.out;
  EXPECT_EQ(Embed("probe"), Embed("probe", served_before));

  const AttnctlResult refused = Run({"rollback", "--version", staged});
  EXPECT_EQ(refused.exit_code, 1) << refused.Describe();
  EXPECT_TRUE(Has(refused.err, "never served by default")) << refused.err;
  EXPECT_TRUE(Has(refused.err, "hint: attnctl promote --version " + staged)) << refused.err;

  // A restart rebuilds the history from the store's record: the same answers.
  StopOwnServer(server_);
  delete server_;
  server_ = new ServerProcess(ServerFlags());
  ASSERT_TRUE(server_->StartAndWait(ScaledSeconds(90), start_error_)) << *start_error_;
  const AttnctlResult after_restart = Run({"rollback", "--version", staged});
  EXPECT_EQ(after_restart.exit_code, 1) << after_restart.Describe();
  EXPECT_TRUE(Has(after_restart.err, "never served by default")) << after_restart.err;
  const AttnctlResult back_again = Run({"rollback", "--version", gated_version});
  EXPECT_EQ(back_again.exit_code, 0) << back_again.Describe();
  const AttnctlResult and_back = Run({"rollback"});
  EXPECT_EQ(and_back.exit_code, 0) << and_back.Describe();
  EXPECT_TRUE(absl::StartsWith(and_back.out, "rolled back: now serving " + served_before + "\n"))
      << and_back.out;
}

}  // namespace
}  // namespace attn::integration
