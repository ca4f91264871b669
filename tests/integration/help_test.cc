// attnserve --help against what the server serves (issue 31, finding 13: the help listed an old
// set of RPCs and routes, and said the latest version of the model store is served):
// * its gRPC section names every method of attnserve.v1.Encoder, attnserve.v1.Trainer and the
//   Open Inference Protocol's inference.GRPCInferenceService, in the .proto's order (the
//   descriptors compiled into this test);
// * its HTTP routes are the README's route table, and the running server answers each of them
//   (anything but 404 "unknown_route"), and its "no route" message names the same list;
// * its flags are the README's flag table, and --model-store says what is served at start.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "inference/grpc_service.pb.h"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::vector<std::string>{}; }

namespace {

using nlohmann::json;

std::string Help() {
  int exit_code = -1;
  const std::string help = RunCommand(AttnserveBinary() + " --help", &exit_code);
  EXPECT_EQ(exit_code, 0) << help;
  return help;
}

std::string Readme() {
  std::ifstream in(ATTN_README);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << ATTN_README;
  return text.str();
}

std::string MethodsOf(const std::string& service) {
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  EXPECT_NE(descriptor, nullptr) << service;
  std::vector<std::string> methods;
  for (int i = 0; descriptor != nullptr && i < descriptor->method_count(); ++i) {
    methods.push_back(descriptor->method(i)->name());
  }
  return absl::StrJoin(methods, ", ");
}

// "POST /v1/embeddings" ... from the help's HTTP section: lines "    METHOD /path  what".
std::set<std::string> HelpRoutes(const std::string& help) {
  std::set<std::string> routes;
  const std::regex line(R"(^    (GET|POST) (/\S*)  )");
  for (const std::string& l : std::vector<std::string>(absl::StrSplit(help, '\n'))) {
    std::smatch match;
    if (std::regex_search(l, match, line)) routes.insert(match[1].str() + " " + match[2].str());
  }
  return routes;
}

// The README's route table (| route | what |): "`POST /v1/encode`, `/v1/attention`" rows, a path
// without a method taking the one before it.
std::set<std::string> ReadmeRoutes(const std::string& readme) {
  std::set<std::string> routes;
  const size_t table = readme.find("| route | what |");
  EXPECT_NE(table, std::string::npos) << "the README has no route table";
  if (table == std::string::npos) return routes;
  const std::regex item(R"(`((GET|POST) )?(/[^`]*)`)");
  std::string method;
  for (const std::string& row : std::vector<std::string>(
           absl::StrSplit(readme.substr(table, readme.find("\n\n", table) - table), '\n'))) {
    const std::string first_cell = row.substr(0, row.find('|', 1));
    for (auto it = std::sregex_iterator(first_cell.begin(), first_cell.end(), item);
         it != std::sregex_iterator(); ++it) {
      if ((*it)[2].matched) method = (*it)[2];
      routes.insert(method + " " + (*it)[3].str());
    }
  }
  return routes;
}

std::string Shown(const std::set<std::string>& items) { return absl::StrJoin(items, "; "); }

TEST(HelpTest, ListsEveryRpcOfEachService) {
  const std::string help = Help();
  // Links the protocol's generated code, which registers its descriptors in the generated pool.
  ASSERT_NE(inference::ModelInferRequest::descriptor(), nullptr);
  for (const std::string service :
       {"attnserve.v1.Encoder", "attnserve.v1.Trainer", "inference.GRPCInferenceService"}) {
    const std::regex line("\n    " + std::regex_replace(service, std::regex(R"(\.)"), R"(\.)") +
                          R"(( \([^)]*\))?: ([^\n]*)\n)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(help, match, line)) << "no line for " << service << ":\n"
                                                      << help.substr(0, 3000);
    EXPECT_EQ(match[2].str(), MethodsOf(service)) << service;
  }
  EXPECT_TRUE(absl::StrContains(help, "grpc.health.v1.Health")) << help.substr(0, 3000);
}

TEST(HelpTest, ListsTheRoutesTheReadmeDocumentsAndTheServerAnswers) {
  const std::set<std::string> help = HelpRoutes(Help());
  const std::set<std::string> readme = ReadmeRoutes(Readme());
  EXPECT_FALSE(help.empty());
  EXPECT_EQ(help, readme) << "--help: " << Shown(help) << "\nREADME: " << Shown(readme);

  ServerProcess& server = SharedServer();
  const std::string model = std::filesystem::path(TestModelDir()).filename().string();
  for (const std::string& route : help) {
    const std::string method = route.substr(0, route.find(' '));
    std::string path = route.substr(route.find(' ') + 1);
    // "/v2/models/NAME[/versions/V]/ready": the model's own route, without a version.
    path = std::regex_replace(path, std::regex(R"(\[/versions/V\])"), "");
    path = std::regex_replace(path, std::regex("NAME"), model);
    HttpResponse response;
    std::string error;
    ASSERT_TRUE(HttpRequest(server.http_port(), method, path, {}, method == "POST" ? "{}" : "",
                            &response, &error))
        << route << ": " << error;
    const json body = json::parse(response.body, nullptr, false);
    // The HTTP routes' unknown route: {"error": {"code": "unknown_route"}}; the Open Inference
    // Protocol's (/v2/...): {"error": "no route ..."}.
    const bool unknown =
        response.status == 404 && body.is_object() && body.contains("error") &&
        (body["error"].is_object() ? body["error"].value("code", json()) == "unknown_route"
                                   : absl::StartsWith(body["error"].dump(), "\"no route"));
    EXPECT_FALSE(unknown) << route << " is listed but not served: " << response.body;
  }
  // The "no route" answer lists the same routes.
  HttpResponse response;
  std::string error;
  ASSERT_TRUE(
      HttpRequest(server.http_port(), "POST", "/v1/nothing-here", {}, "{}", &response, &error))
      << error;
  EXPECT_EQ(response.status, 404);
  for (const std::string& route : help) {
    const std::string path = route.substr(route.find(' ') + 1);
    EXPECT_TRUE(absl::StrContains(response.body, path)) << path << ": " << response.body;
  }
}

TEST(HelpTest, ListsTheFlagsOfTheReadmeTableAndSaysWhatTheStoreServes) {
  const std::string help = Help();
  std::set<std::string> help_flags, readme_flags;
  const std::regex flag_line(R"(^  (--[a-z0-9-]+)  \(default)");
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(help, '\n'))) {
    std::smatch match;
    if (std::regex_search(line, match, flag_line)) help_flags.insert(match[1]);
  }
  const std::string readme = Readme();
  const size_t table = readme.find("| flag | default | meaning |");
  ASSERT_NE(table, std::string::npos) << "the README has no flag table";
  const std::regex flag_item(R"(`(--[a-z0-9-]+)`)");
  for (const std::string& row : std::vector<std::string>(
           absl::StrSplit(readme.substr(table, readme.find("\n\n", table) - table), '\n'))) {
    const std::string first_cell = row.substr(0, row.find('|', 1));
    for (auto it = std::sregex_iterator(first_cell.begin(), first_cell.end(), flag_item);
         it != std::sregex_iterator(); ++it) {
      readme_flags.insert((*it)[1]);
    }
  }
  EXPECT_EQ(help_flags, readme_flags)
      << "--help: " << Shown(help_flags) << "\nREADME: " << Shown(readme_flags);

  // What --model-store serves at start: the recorded serving version, not "the latest".
  const size_t store = help.find("  --model-store  (default");
  ASSERT_NE(store, std::string::npos);
  const std::string store_help = std::regex_replace(
      help.substr(store, help.find("\n  --", store + 1) - store), std::regex(R"(\s+)"), " ");
  EXPECT_TRUE(absl::StrContains(store_help, "serving.json")) << store_help;
  EXPECT_FALSE(absl::StrContains(store_help, "the latest one is served")) << store_help;
}

}  // namespace
}  // namespace attn::integration
