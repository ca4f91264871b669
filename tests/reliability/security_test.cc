// Security: Trainer RPCs without or with a wrong token are rejected and change nothing; the token
// never shows in the log (even at --log-level debug), in errors or in /metrics; message size
// limits hold for the Encoder and the Trainer; version names cannot reach outside the model store
// ("../x", absolute paths) and symlinks inside the store are not followed; TLS with a
// self-signed certificate made here by openssl serves TLS clients and turns away plaintext
// clients, clients that do not trust the certificate and clients expecting another host name.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/reliability/reliability_util.h"

namespace attn::integration {

constexpr int kMaxMessageBytes = 1 << 20;

// A token unique to this run, so finding it anywhere can only mean it leaked.
const std::string& Token() {
  static const std::string* token = [] {
    std::random_device random;
    return new std::string("sec-" + std::to_string(random()) + "-" + std::to_string(getpid()) +
                           "-Zq9");
  }();
  return *token;
}

// Lives until the process exits (after the shared server has stopped).
reliability::TempDir& Work() {
  static reliability::TempDir* dir = new reliability::TempDir("security");
  return *dir;
}

std::optional<std::vector<std::string>> SharedServerFlags() {
  return std::vector<std::string>{
      "--trainer_token_file=" + Work().WriteFile("token", Token() + "\n"),
      "--model_store=" + Work().path() + "/store",
      "--max_message_bytes=" + std::to_string(kMaxMessageBytes), "--trainer_threads=1",
      // The most verbose level: the token must not appear even there.
      "--log_level=debug"};
}

namespace {

namespace fs = std::filesystem;
using reliability::ExpectStatus;
using Metadata = std::vector<std::pair<std::string, std::string>>;

Metadata Bearer(const std::string& token) { return {{"authorization", "Bearer " + token}}; }

void AddMetadata(grpc::ClientContext* context, const Metadata& metadata) {
  for (const auto& [key, value] : metadata) context->AddMetadata(key, value);
}

grpc::Status ListVersions(pb::Trainer::Stub* trainer, const Metadata& metadata,
                          pb::ListVersionsResponse* response = nullptr) {
  grpc::ClientContext context;
  AddMetadata(&context, metadata);
  pb::ListVersionsResponse ignored;
  return trainer->ListVersions(&context, {}, response != nullptr ? response : &ignored);
}

grpc::Status SetServing(pb::Trainer::Stub* trainer, const Metadata& metadata,
                        const std::string& version) {
  grpc::ClientContext context;
  AddMetadata(&context, metadata);
  pb::SetServingVersionRequest request;
  request.set_version(version);
  pb::ListVersionsResponse response;
  return trainer->SetServingVersion(&context, request, &response);
}

grpc::Status Rollback(pb::Trainer::Stub* trainer, const Metadata& metadata,
                      const std::string& version) {
  grpc::ClientContext context;
  AddMetadata(&context, metadata);
  pb::RollbackRequest request;
  request.set_version(version);
  pb::ListVersionsResponse response;
  return trainer->Rollback(&context, request, &response);
}

// A whole FineTune stream; the answers in *answers.
grpc::Status FineTune(pb::Trainer::Stub* trainer, const Metadata& metadata,
                      const std::vector<pb::FineTuneRequest>& requests,
                      std::vector<pb::FineTuneProgress>* answers = nullptr) {
  grpc::ClientContext context;
  AddMetadata(&context, metadata);
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(300));
  auto stream = trainer->FineTune(&context);
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

pb::FineTuneRequest ContrastiveConfig(const std::string& base_version = "") {
  pb::FineTuneRequest request;
  request.mutable_config()->set_objective(pb::CONTRASTIVE);
  request.mutable_config()->set_learning_rate(1e-5);
  request.mutable_config()->set_disable_dropout(true);
  request.mutable_config()->set_base_version(base_version);
  return request;
}

pb::FineTuneRequest SmallBatch() {
  pb::FineTuneRequest request;
  for (const auto& [anchor, positive] : std::vector<std::pair<std::string, std::string>>{
           {"a red bicycle", "a bike that is red"}, {"fresh bread", "a warm loaf"}}) {
    pb::TrainingExample* example = request.mutable_batch()->add_examples();
    example->set_anchor(anchor);
    example->set_positive(positive);
  }
  return request;
}

pb::FineTuneRequest CommitRequest() {
  pb::FineTuneRequest request;
  request.mutable_commit()->set_description("security test");
  return request;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    channel_ = new auto(SharedServer().NewChannel());
    encoder_ = pb::Encoder::NewStub(*channel_).release();
    trainer_ = pb::Trainer::NewStub(*channel_).release();
  }
  static void TearDownTestSuite() {
    delete encoder_;
    delete trainer_;
    delete channel_;
  }
  void TearDown() override { reliability::ExpectHealthy(SharedServer(), "the security test"); }

  static std::string ServingVersion() {
    pb::ListVersionsResponse response;
    const grpc::Status status = ListVersions(trainer_, Bearer(Token()), &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response.serving_version();
  }

  // Commits one fine-tuned version (one step) on the shared server and returns its name; the
  // first call does the work, later calls return the same version.
  static std::string CommittedVersion() {
    static std::string* version = nullptr;
    if (version != nullptr) return *version;
    std::vector<pb::FineTuneProgress> answers;
    const grpc::Status status = FineTune(
        trainer_, Bearer(Token()), {ContrastiveConfig(), SmallBatch(), CommitRequest()}, &answers);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    if (!status.ok() || answers.empty()) return "";
    version = new std::string(answers.back().committed_version());
    return *version;
  }

  static std::shared_ptr<grpc::Channel>* channel_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
};
std::shared_ptr<grpc::Channel>* SecurityTest::channel_ = nullptr;
pb::Encoder::Stub* SecurityTest::encoder_ = nullptr;
pb::Trainer::Stub* SecurityTest::trainer_ = nullptr;

// ---------------------------------------------------------------------------------------------
// Authentication

TEST_F(SecurityTest, TrainerRpcsNeedTheRightBearerToken) {
  const std::string token = Token();
  std::string upper = token;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  struct Credential {
    std::string what;
    Metadata metadata;
    grpc::StatusCode code;
  };
  const std::vector<Credential> credentials = {
      {"no metadata", {}, grpc::StatusCode::UNAUTHENTICATED},
      {"the token without a scheme", {{"authorization", token}}, grpc::StatusCode::UNAUTHENTICATED},
      {"Basic scheme", {{"authorization", "Basic " + token}}, grpc::StatusCode::UNAUTHENTICATED},
      {"the token in another header", {{"x-token", token}}, grpc::StatusCode::UNAUTHENTICATED},
      {"Bearer and nothing", {{"authorization", "Bearer "}}, grpc::StatusCode::PERMISSION_DENIED},
      {"a wrong token", Bearer("wrong-token-marker-31337"), grpc::StatusCode::PERMISSION_DENIED},
      {"the token minus its last character", Bearer(token.substr(0, token.size() - 1)),
       grpc::StatusCode::PERMISSION_DENIED},
      {"the token plus a character", Bearer(token + "x"), grpc::StatusCode::PERMISSION_DENIED},
      {"the token in upper case", Bearer(upper), grpc::StatusCode::PERMISSION_DENIED},
      {"the token twice", Bearer(token + token), grpc::StatusCode::PERMISSION_DENIED},
  };
  const std::string served_before = ServingVersion();
  const Metrics before = ScrapeOrFail(SharedServer());
  for (const Credential& credential : credentials) {
    SCOPED_TRACE(credential.what);
    std::vector<grpc::Status> statuses = {
        ListVersions(trainer_, credential.metadata),
        SetServing(trainer_, credential.metadata, "base"),
        Rollback(trainer_, credential.metadata, ""),
        FineTune(trainer_, credential.metadata,
                 {ContrastiveConfig(), SmallBatch(), CommitRequest()}),
    };
    const char* const methods[] = {"ListVersions", "SetServingVersion", "Rollback", "FineTune"};
    for (size_t i = 0; i < statuses.size(); ++i) {
      ExpectStatus(statuses[i], credential.code, {},
                   std::string(methods[i]) + ", " + credential.what);
      EXPECT_FALSE(statuses[i].error_message().empty()) << methods[i];
      EXPECT_EQ(statuses[i].error_message().find(token), std::string::npos)
          << methods[i] << ": the error repeats the token";
    }
  }
  // Nothing was trained, committed or switched by the rejected calls.
  EXPECT_EQ(ServingVersion(), served_before);
  pb::ListVersionsResponse versions;
  ASSERT_TRUE(ListVersions(trainer_, Bearer(token), &versions).ok());
  const Metrics metrics = ScrapeOrFail(SharedServer());
  for (const char* counter :
       {"attnserve_finetune_steps_total", "attnserve_model_versions_published_total"}) {
    EXPECT_EQ(metrics.Sum(counter), before.Sum(counter)) << counter;
  }
  // The Encoder needs no token.
  pb::EncodeRequest request;
  request.add_inputs()->set_text("no token needed");
  pb::EncodeResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(encoder_->Encode(&context, request, &response).ok());
}

// ---------------------------------------------------------------------------------------------
// Message size limits (1 MiB on this server; gRPC's own limit sits at 2 x + 1 MiB)

TEST_F(SecurityTest, MessageSizeLimits) {
  const std::string limit = std::to_string(kMaxMessageBytes);
  {
    pb::EncodeRequest request;
    request.add_inputs()->set_text(std::string(kMaxMessageBytes + kMaxMessageBytes / 2, 'a'));
    pb::EncodeResponse response;
    grpc::ClientContext context;
    ExpectStatus(encoder_->Encode(&context, request, &response),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {limit, "max-message-bytes"},
                 "a 1.5 MiB Encode request");
  }
  {
    pb::EncodeRequest request;
    request.add_inputs()->set_text(std::string(4 * kMaxMessageBytes, 'a'));
    pb::EncodeResponse response;
    grpc::ClientContext context;
    ExpectStatus(encoder_->Encode(&context, request, &response),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {"larger than max"},
                 "a 4 MiB Encode request (over gRPC's receive limit)");
  }
  {
    pb::AttentionMapRequest request;
    request.add_inputs()->set_text(TextOfTokens(256));
    pb::AttentionMapResponse response;
    grpc::ClientContext context;
    ExpectStatus(encoder_->AttentionMap(&context, request, &response),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {"response", limit},
                 "an 18 MiB AttentionMap response");
  }
  {
    pb::FineTuneRequest batch;
    pb::TrainingExample* example = batch.mutable_batch()->add_examples();
    example->set_anchor(std::string(kMaxMessageBytes + kMaxMessageBytes / 2, 'a'));
    example->set_positive("positive");
    ExpectStatus(FineTune(trainer_, Bearer(Token()), {ContrastiveConfig(), batch}),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {"batch 1", limit, "max-message-bytes"},
                 "a 1.5 MiB training batch");
  }
  {
    // Without a token a big message is never even read.
    pb::FineTuneRequest batch;
    pb::TrainingExample* example = batch.mutable_batch()->add_examples();
    example->set_anchor(std::string(2 * kMaxMessageBytes, 'a'));
    ExpectStatus(FineTune(trainer_, {}, {batch}), grpc::StatusCode::UNAUTHENTICATED, {},
                 "a 2 MiB batch without a token");
  }
}

// ---------------------------------------------------------------------------------------------
// Version names and the model store

TEST_F(SecurityTest, VersionNamesCannotLeaveTheStore) {
  const std::string committed = CommittedVersion();
  ASSERT_FALSE(committed.empty());
  const std::string store = Work().path() + "/store";
  ASSERT_TRUE(fs::is_directory(store + "/" + committed));
  // A complete checkpoint just outside the store, reachable as "../outside" from inside it.
  const std::string outside = Work().path() + "/outside";
  fs::create_directories(outside);
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(store + "/" + committed)) {
    const fs::path target = outside / fs::relative(entry.path(), store + "/" + committed);
    if (entry.is_directory()) {
      fs::create_directories(target);
    } else {
      fs::copy_file(entry.path(), target);
    }
  }
  const std::string served_before = ServingVersion();
  const std::vector<std::string> names = {"../outside",
                                          "../../outside",
                                          "..",
                                          ".",
                                          outside,
                                          "/etc",
                                          "/etc/passwd",
                                          committed + "/..",
                                          committed + "/../../outside",
                                          "./" + committed,
                                          ".hidden",
                                          "-rf",
                                          "a\\b",
                                          "with space",
                                          "..%2foutside",
                                          std::string("base\0../outside", 15),
                                          std::string(300, 'v'),
                                          "",
                                          "\xc3\xa9t\xc3\xa9"};
  for (const std::string& name : names) {
    SCOPED_TRACE("version name '" + name + "'");
    const grpc::StatusCode expected = grpc::StatusCode::INVALID_ARGUMENT;
    ExpectStatus(SetServing(trainer_, Bearer(Token()), name), expected, {"version"},
                 "SetServingVersion");
    if (!name.empty()) {  // an empty Rollback version means "the previous one"
      ExpectStatus(Rollback(trainer_, Bearer(Token()), name), expected, {"version"}, "Rollback");
      ExpectStatus(FineTune(trainer_, Bearer(Token()), {ContrastiveConfig(name)}), expected,
                   {"base_version"}, "FineTune base_version");
      // The Encoder's versions are names in memory, never paths.
      pb::EncodeRequest request;
      request.add_inputs()->set_text("versions");
      request.set_model_version(name);
      pb::EncodeResponse response;
      grpc::ClientContext context;
      ExpectStatus(encoder_->Encode(&context, request, &response), grpc::StatusCode::NOT_FOUND,
                   {"not found"}, "Encode model_version");
    }
  }
  // A valid name that is not in the store is simply unknown.
  ExpectStatus(SetServing(trainer_, Bearer(Token()), "outside"), grpc::StatusCode::NOT_FOUND,
               {"outside"}, "SetServingVersion 'outside'");
  EXPECT_EQ(ServingVersion(), served_before);
  // Nothing was created, removed or renamed next to the store.
  std::vector<std::string> siblings;
  for (const fs::directory_entry& entry : fs::directory_iterator(Work().path())) {
    siblings.push_back(entry.path().filename().string());
  }
  std::sort(siblings.begin(), siblings.end());
  EXPECT_EQ(siblings, (std::vector<std::string>{"outside", "store", "token"}));
}

// Links a checkpoint's files into `dir` (hard links: cheap, and not symlinks).
void LinkCheckpoint(const std::string& from, const std::string& dir, const std::string& version,
                    int64_t sequence) {
  fs::create_directories(dir);
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(from)) {
    const fs::path target = fs::path(dir) / fs::relative(entry.path(), from);
    if (entry.is_directory()) {
      fs::create_directories(target);
    } else if (entry.path().filename() != "attnserve_version.json") {
      fs::create_hard_link(entry.path(), target);
    }
  }
  // The version record must match the directory name and carry its own sequence number.
  nlohmann::json info = nlohmann::json::parse(ReadAll(from + "/attnserve_version.json"));
  info["version"] = version;
  info["sequence"] = sequence;
  std::ofstream(dir + "/attnserve_version.json") << info.dump(2);
}

// A store holding a real version next to entries that are, or contain, symlinks to checkpoints
// outside it: a restarted server serves the real one and skips every symlinked one, and its
// clean-up of stale temp dirs removes a symlink without touching what it points to.
TEST_F(SecurityTest, SymlinksInTheStoreAreNotFollowed) {
  const std::string committed = CommittedVersion();
  ASSERT_FALSE(committed.empty());
  const std::string source = Work().path() + "/store/" + committed;
  reliability::TempDir dir("symlinks");
  const std::string store = dir.path() + "/store", outside = dir.path() + "/outside";
  fs::create_directories(store);
  fs::create_directories(outside);

  const std::string real = "ft-000001-20300101T000000Z";
  LinkCheckpoint(source, store + "/" + real, real, 1);
  // 2: the whole version directory is a symlink to a complete checkpoint outside.
  const std::string linked_dir = "ft-000002-20300101T000000Z";
  LinkCheckpoint(source, outside + "/" + linked_dir, linked_dir, 2);
  fs::create_directory_symlink(outside + "/" + linked_dir, store + "/" + linked_dir);
  // 3: a real directory whose weights are a symlink.
  const std::string linked_weights = "ft-000003-20300101T000000Z";
  LinkCheckpoint(source, store + "/" + linked_weights, linked_weights, 3);
  fs::remove(store + "/" + linked_weights + "/model.safetensors");
  fs::create_symlink(source + "/model.safetensors",
                     store + "/" + linked_weights + "/model.safetensors");
  // 4: a real directory whose version record is a symlink.
  const std::string linked_info = "ft-000004-20300101T000000Z";
  LinkCheckpoint(source, store + "/" + linked_info, linked_info, 4);
  fs::rename(store + "/" + linked_info + "/attnserve_version.json",
             outside + "/" + linked_info + ".json");
  fs::create_symlink(outside + "/" + linked_info + ".json",
                     store + "/" + linked_info + "/attnserve_version.json");
  // 5: a real directory whose vocabulary is a symlink to a copy outside.
  const std::string linked_vocab = "ft-000005-20300101T000000Z";
  LinkCheckpoint(source, store + "/" + linked_vocab, linked_vocab, 5);
  fs::rename(store + "/" + linked_vocab + "/vocab.txt", outside + "/vocab.txt");
  fs::create_symlink(outside + "/vocab.txt", store + "/" + linked_vocab + "/vocab.txt");
  // 6: a real directory whose pooling config directory is a symlink.
  const std::string linked_pooling = "ft-000006-20300101T000000Z";
  LinkCheckpoint(source, store + "/" + linked_pooling, linked_pooling, 6);
  fs::rename(store + "/" + linked_pooling + "/1_Pooling", outside + "/1_Pooling");
  fs::create_directory_symlink(outside + "/1_Pooling", store + "/" + linked_pooling + "/1_Pooling");
  const std::vector<std::string> symlinked = {linked_dir, linked_weights, linked_info, linked_vocab,
                                              linked_pooling};
  // A stale temp dir that is a symlink to a directory outside, which must survive.
  fs::create_directories(outside + "/keep-me");
  std::ofstream(outside + "/keep-me/precious") << "do not delete";
  fs::create_directory_symlink(outside + "/keep-me", store + "/.tmp-ft-000009-x-1-0");

  ServerProcess server({"--trainer_token_file=" + Work().path() + "/token",
                        "--model_store=" + store, "--trainer_threads=1"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;
  auto trainer = pb::Trainer::NewStub(server.NewChannel());
  pb::ListVersionsResponse versions;
  const grpc::Status status = ListVersions(trainer.get(), Bearer(Token()), &versions);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  std::vector<std::string> names;
  for (const pb::VersionInfo& version : versions.versions()) names.push_back(version.version());
  EXPECT_EQ(names, (std::vector<std::string>{"base", real}))
      << "only the real checkpoint may be served (a version is loaded from the store only if "
         "nothing in its directory is a symlink: vocab.txt and 1_Pooling/ are read too)\n"
      << server.process().LogTail();
  EXPECT_EQ(versions.serving_version(), real);
  for (const std::string& name : symlinked) {
    ExpectStatus(SetServing(trainer.get(), Bearer(Token()), name), grpc::StatusCode::NOT_FOUND,
                 {name}, "SetServingVersion to a skipped symlinked version");
  }
  const std::string log = server.process().LogTail(1 << 20);
  for (const std::string& name : symlinked) {
    EXPECT_NE(log.find(name), std::string::npos)
        << "the log should say why " << name << " was skipped:\n"
        << log;
  }
  EXPECT_NE(log.find("symlink"), std::string::npos) << log;
  EXPECT_TRUE(reliability::CrashLines(log).empty()) << log;
  EXPECT_FALSE(fs::exists(fs::symlink_status(store + "/.tmp-ft-000009-x-1-0")));
  EXPECT_EQ(ReadAll(outside + "/keep-me/precious"), "do not delete");
  EXPECT_TRUE(reliability::ExpectHealthy(server, "a store with symlinks"));
  const int exit_status = server.process().Stop();
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
      << server.process().ExitDescription();
}

// ---------------------------------------------------------------------------------------------
// TLS

struct Certificate {
  std::string cert_path, key_path, pem;
};

// A self-signed certificate for localhost / 127.0.0.1 made by Debian's openssl.
bool MakeCertificate(const std::string& dir, const std::string& name, Certificate* out) {
  std::string openssl;
  if (!FindOnPath("openssl", &openssl)) return false;
  out->cert_path = dir + "/" + name + ".pem";
  out->key_path = dir + "/" + name + ".key";
  const std::string command = openssl + " req -x509 -newkey rsa:2048 -nodes -days 1 -subj " +
                              "/CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 " +
                              "-keyout " + out->key_path + " -out " + out->cert_path +
                              " > /dev/null 2>&1";
  if (std::system(command.c_str()) != 0) return false;
  out->pem = ReadAll(out->cert_path);
  return !out->pem.empty();
}

grpc::Status EncodeOver(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = pb::Encoder::NewStub(channel);
  pb::EncodeRequest request;
  request.add_inputs()->set_text("over tls");
  pb::EncodeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(10));
  return stub->Encode(&context, request, &response);
}

TEST_F(SecurityTest, TlsServesTlsClientsAndRejectsTheRest) {
  reliability::TempDir dir("tls");
  Certificate server_cert, stranger;
  ASSERT_TRUE(MakeCertificate(dir.path(), "server", &server_cert) &&
              MakeCertificate(dir.path(), "stranger", &stranger))
      << "openssl cannot make a test certificate (scripts/setup.sh installs openssl)";
  ServerProcess server({"--tls_cert=" + server_cert.cert_path, "--tls_key=" + server_cert.key_path,
                        "--trainer_token_file=" + Work().path() + "/token"});
  std::string error;
  ASSERT_TRUE(server.StartAndWait(ScaledSeconds(120), &error)) << error;

  // A client that trusts the certificate: every service works, the Trainer still wants a token.
  const auto trusted = TlsChannel(server.grpc_port(), server_cert.pem);
  EXPECT_TRUE(EncodeOver(trusted).ok()) << StatusString(EncodeOver(trusted));
  EXPECT_EQ(reliability::HealthOf(trusted, ""), "SERVING");
  auto trainer = pb::Trainer::NewStub(trusted);
  EXPECT_TRUE(ListVersions(trainer.get(), Bearer(Token())).ok());
  EXPECT_EQ(ListVersions(trainer.get(), {}).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // Plaintext, an untrusted certificate, or the wrong host name: no call gets through.
  const grpc::Status plaintext = EncodeOver(server.NewChannel());
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE) << StatusString(plaintext);
  const grpc::Status untrusted = EncodeOver(TlsChannel(server.grpc_port(), stranger.pem));
  EXPECT_EQ(untrusted.error_code(), grpc::StatusCode::UNAVAILABLE) << StatusString(untrusted);
  const grpc::Status wrong_host =
      EncodeOver(TlsChannel(server.grpc_port(), server_cert.pem, "not-this-server.example"));
  EXPECT_EQ(wrong_host.error_code(), grpc::StatusCode::UNAVAILABLE) << StatusString(wrong_host);
  EXPECT_EQ(reliability::HealthOf(server.NewChannel(), "").rfind("RPC error", 0), 0u)
      << "plaintext health checks must fail too";
  // Still serving TLS clients after the failed handshakes.
  EXPECT_TRUE(EncodeOver(trusted).ok());

  const std::string log = server.process().LogTail(1 << 20);
  const std::string key = ReadAll(server_cert.key_path);
  EXPECT_EQ(log.find("PRIVATE KEY"), std::string::npos) << "the log shows key material";
  EXPECT_EQ(log.find(key.substr(key.size() / 2, 40)), std::string::npos)
      << "the log shows key material";
  EXPECT_TRUE(reliability::CrashLines(log).empty()) << log;
  const int exit_status = server.process().Stop();
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)
      << server.process().ExitDescription();

  // A key that does not belong to the certificate (or is not a key at all) stops the server at
  // start with an error, without printing the key.
  const std::string garbage_key = dir.WriteFile("garbage.key",
                                                "-----BEGIN PRIVATE KEY-----\n"
                                                "bm90IGEga2V5\n"
                                                "-----END PRIVATE KEY-----\n");
  for (const std::string& bad_key : {garbage_key, stranger.key_path}) {
    SCOPED_TRACE(bad_key);
    ServerProcess bad({"--tls_cert=" + server_cert.cert_path, "--tls_key=" + bad_key});
    ASSERT_TRUE(bad.Start(&error)) << error;
    int wait_status = 0;
    ASSERT_TRUE(bad.process().WaitExit(ScaledSeconds(60), &wait_status))
        << "attnserve kept running with a bad TLS key";
    EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0)
        << bad.process().ExitDescription();
    const std::string bad_log = bad.process().LogTail();
    EXPECT_EQ(bad_log.find("bm90IGEga2V5"), std::string::npos) << bad_log;
    EXPECT_EQ(bad_log.find(ReadAll(stranger.key_path).substr(40, 40)), std::string::npos)
        << bad_log;
    EXPECT_FALSE(bad.ReadyFileExists()) << "a server without working TLS must never be ready";
  }
}

// ---------------------------------------------------------------------------------------------
// Last: after everything above (authorised and rejected Trainer calls, a commit), the token is
// nowhere in the debug-level log or in /metrics.

TEST_F(SecurityTest, ZzTokenNeverInTheLogOrMetrics) {
  // Make sure there was traffic of every kind, also when this test runs alone.
  EXPECT_TRUE(ListVersions(trainer_, Bearer(Token())).ok());
  EXPECT_FALSE(ListVersions(trainer_, Bearer("wrong-token-marker-31337")).ok());
  EXPECT_FALSE(CommittedVersion().empty());

  const std::string log = reliability::FullLog(SharedServer());
  EXPECT_EQ(log.find(Token()), std::string::npos) << "the token is in the server log";
  EXPECT_EQ(log.find("wrong-token-marker-31337"), std::string::npos)
      << "presented (wrong) tokens are logged";
  EXPECT_EQ(log.find("Bearer "), std::string::npos) << "authorization headers are logged";
  HttpResponse metrics;
  std::string error;
  ASSERT_TRUE(HttpGet(SharedServer().metrics_port(), "/metrics", &metrics, &error)) << error;
  EXPECT_EQ(metrics.body.find(Token()), std::string::npos) << "the token is in /metrics";
  EXPECT_EQ(metrics.body.find("wrong-token-marker"), std::string::npos);
  const std::string ready = ReadAll(SharedServer().ready_file());
  EXPECT_EQ(ready.find(Token()), std::string::npos);
  const std::vector<std::string> crashes = reliability::CrashLines(log);
  EXPECT_TRUE(crashes.empty()) << crashes.front();
}

}  // namespace
}  // namespace attn::integration
