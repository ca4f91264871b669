// The model store: checkpoints written in Hugging Face layout and loaded back bit-exactly,
// atomic commit (nothing left behind on failure), listing with skip reasons, name validation.
#include "engine/model_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/training/losses.h"
#include "engine/weights.h"
#include "nlohmann/json.hpp"
#include "tests/test_model.h"
#include "tests/test_util.h"

namespace attn {
namespace {

namespace fs = std::filesystem;

constexpr char kVersion1[] = "ft-000001-20261122T000000Z";

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

using testing::ReadText;

bool SameValues(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}

class ModelStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status();
    base_ = &*testing::TestModel();
    std::string pattern = ::testing::TempDir() + "model_store_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    store_ = root_ + "/store";
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::add, ec);
    if (fs::exists(store_, ec)) fs::permissions(store_, fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }

  const Model& base() const { return **base_; }

  // Base weights with a few entries changed, one of them in each of the query, key and value
  // row blocks of the fused QKV matrix (rows [0,H), [H,2H), [2H,3H)).
  BertWeights PerturbedWeights() const {
    BertWeights w = base().weights();
    const int64_t H = base().config().hidden_size;
    w.word_embeddings.data()[1012 * H + 5] += 0.25f;
    w.embedding_norm_gamma.data()[3] *= 1.5f;
    float* qkv = w.layers[0].qkv_weight.data();
    for (int64_t c = 0; c < H; ++c) {
      qkv[5 * H + c] += 0.01f * static_cast<float>(c % 7);            // query row 5
      qkv[(2 * H + 7) * H + c] -= 0.02f * static_cast<float>(c % 5);  // value row 7
    }
    w.layers[0].qkv_bias.data()[H + 3] += 0.5f;      // key bias 3
    w.layers[0].qkv_bias.data()[2 * H + 9] -= 0.5f;  // value bias 9
    w.layers[5].ffn_out_weight.data()[17] = 0.125f;
    return w;
  }

  CheckpointInfo Info(int64_t sequence) const {
    CheckpointInfo info;
    info.base_version = "base";
    info.objective = "contrastive";
    info.steps = 42;
    info.final_loss = 0.375;
    info.sequence = sequence;
    return info;
  }

  std::vector<SequenceInput> Batch() const {
    std::vector<SequenceInput> batch;
    for (const char* text :
         {"the quick brown fox jumps over the lazy dog", "attention is all you need", "a"}) {
      auto encoding = base().tokenizer().Encode(text);
      EXPECT_TRUE(encoding.ok()) << encoding.status();
      batch.push_back({encoding->ids, encoding->type_ids});
    }
    return batch;
  }

  // A directory that ListStore accepts without a real checkpoint in it.
  void FakeVersion(const std::string& dir, const std::string& version, int64_t sequence) {
    fs::create_directories(dir);
    WriteText(dir + "/config.json", "{}");
    WriteText(dir + "/model.safetensors", "");
    nlohmann::json info = {
        {"version", version}, {"sequence", sequence}, {"created_utc", "2026-11-22T00:00:00Z"}};
    WriteText(dir + "/attnserve_version.json", info.dump());
  }

  static const std::shared_ptr<const Model>* base_;
  std::string root_, store_;
};

const std::shared_ptr<const Model>* ModelStoreTest::base_ = nullptr;

TEST_F(ModelStoreTest, RoundTripIsBitExactAndForwardsIdentically) {
  BertWeights weights = PerturbedWeights();
  ASSERT_TRUE(WriteCheckpoint(base(), weights, nullptr, Info(1), store_, kVersion1).ok());
  EXPECT_EQ(Entries(store_), std::vector<std::string>{kVersion1});  // no temp dir left

  std::vector<std::string> skipped;
  auto versions = ListStore(store_, &skipped);
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_TRUE(skipped.empty());
  ASSERT_EQ(versions->size(), 1u);
  const StoredVersion& v = (*versions)[0];
  EXPECT_EQ(v.version, kVersion1);
  EXPECT_EQ(v.dir, store_ + "/" + kVersion1);
  EXPECT_EQ(v.sequence, 1);
  EXPECT_EQ(v.base_version, "base");
  EXPECT_EQ(v.objective, "contrastive");
  EXPECT_EQ(v.steps, 42);
  EXPECT_EQ(v.final_loss, 0.375);
  EXPECT_EQ(v.num_labels, 0);
  EXPECT_EQ(v.parent_dir, fs::absolute(base().model_dir()).lexically_normal().string());
  EXPECT_EQ(v.created_utc.size(), 20u) << v.created_utc;  // 2026-11-22T04:19:00Z

  // Config, tokenizer and sentence-transformers files come along verbatim.
  for (const char* file : {"config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
                           "config_sentence_transformers.json", "1_Pooling/config.json"}) {
    EXPECT_EQ(ReadText(v.dir + "/" + file), ReadText(base().model_dir() + "/" + file)) << file;
  }
  EXPECT_FALSE(fs::exists(v.dir + "/head.safetensors"));

  auto loaded = LoadStoredVersion(v);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->head.has_value());
  EXPECT_EQ(loaded->model->model_dir(), v.dir);
  const auto expected = EngineTensors(&weights);
  BertWeights got = loaded->model->weights();
  const auto actual = EngineTensors(&got);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(SameValues(*actual[i].second, *expected[i].second)) << expected[i].first;
  }

  const ForwardOptions options = base().DefaultForwardOptions();
  const auto written = Model::WithWeights(base(), weights)->Forward(Batch(), options);
  const auto reloaded = loaded->model->Forward(Batch(), options);
  const auto original = base().Forward(Batch(), options);
  ASSERT_TRUE(written.ok() && reloaded.ok() && original.ok());
  EXPECT_TRUE(SameValues(written->pooled, reloaded->pooled));
  // The perturbation (layer 0 Q/K/V) reaches the output, so the comparison above means something.
  EXPECT_FALSE(SameValues(original->pooled, reloaded->pooled));
}

TEST_F(ModelStoreTest, WrittenFileHasTheBaseTensorsMinusPositionIdsAndPooler) {
  // Unchanged weights: every written tensor must equal the base file's bytes, which checks the
  // QKV split against Hugging Face's layout as well as the names.
  ASSERT_TRUE(WriteCheckpoint(base(), base().weights(), nullptr, Info(1), store_, kVersion1).ok());
  auto base_file = SafetensorsFile::Open(base().model_dir() + "/model.safetensors");
  auto written = SafetensorsFile::Open(store_ + "/" + kVersion1 + "/model.safetensors");
  ASSERT_TRUE(base_file.ok() && written.ok());

  const std::set<std::string> omitted = {"embeddings.position_ids", "pooler.dense.weight",
                                         "pooler.dense.bias"};
  std::set<std::string> expected_names, written_names;
  for (const TensorInfo& t : (*base_file)->tensors()) {
    if (!omitted.count(t.name)) expected_names.insert(t.name);
  }
  for (const TensorInfo& t : (*written)->tensors()) written_names.insert(t.name);
  EXPECT_EQ(written_names, expected_names);
  EXPECT_EQ(written_names.size(), 4u + 1u + 16u * 6u);  // embeddings, LayerNorm, 6 layers

  for (const TensorInfo& t : (*written)->tensors()) {
    const TensorInfo* b = (*base_file)->Find(t.name);
    ASSERT_NE(b, nullptr) << t.name;
    EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    EXPECT_EQ(t.shape, b->shape) << t.name;
    EXPECT_EQ((*written)->RawBytes(t), (*base_file)->RawBytes(*b)) << t.name;
  }
  // transformers rejects a safetensors file without format "pt".
  EXPECT_EQ((*written)->metadata().at("format"), "pt");
}

TEST_F(ModelStoreTest, HeadRoundTripAndCorruptionIsReportedNotHalfLoaded) {
  const int64_t H = base().config().hidden_size;
  const ClassificationHead head = MakeClassificationHead(3, H, HeadInit::kNormal, 7);
  CheckpointInfo info = Info(4);
  info.objective = "classification";
  ASSERT_TRUE(WriteCheckpoint(base(), base().weights(), &head, info, store_, kVersion1).ok());

  auto v = ReadStoredVersion(store_, kVersion1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->num_labels, 3);
  auto head_file = SafetensorsFile::Open(v->dir + "/head.safetensors");
  ASSERT_TRUE(head_file.ok());
  ASSERT_EQ((*head_file)->tensors().size(), 2u);
  EXPECT_EQ((*head_file)->Find("classifier.weight")->shape, (std::vector<int64_t>{3, H}));
  EXPECT_EQ((*head_file)->Find("classifier.bias")->shape, (std::vector<int64_t>{3}));

  auto loaded = LoadStoredVersion(*v);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->head.has_value());
  EXPECT_TRUE(SameValues(loaded->head->weight, head.weight));
  EXPECT_TRUE(SameValues(loaded->head->bias, head.bias));

  // A head whose label count disagrees with attnserve_version.json.
  {
    const std::string info_path = v->dir + "/attnserve_version.json";
    const std::string saved = ReadText(info_path);
    auto json = nlohmann::json::parse(saved);
    json["num_labels"] = 2;
    WriteText(info_path, json.dump());
    auto stale = ReadStoredVersion(store_, kVersion1);
    ASSERT_TRUE(stale.ok());
    auto mismatch = LoadStoredVersion(*stale);
    ASSERT_FALSE(mismatch.ok());
    EXPECT_NE(mismatch.status().message().find("3 labels"), std::string::npos) << mismatch.status();
    WriteText(info_path, saved);
  }

  // Truncated head, then truncated model: the loader's error, naming the file.
  fs::resize_file(v->dir + "/head.safetensors", 100);
  auto bad_head = LoadStoredVersion(*v);
  ASSERT_FALSE(bad_head.ok());
  EXPECT_NE(bad_head.status().message().find("head.safetensors"), std::string::npos)
      << bad_head.status();
  EXPECT_NE(bad_head.status().message().find(kVersion1), std::string::npos);

  fs::resize_file(v->dir + "/model.safetensors", fs::file_size(v->dir + "/model.safetensors") / 2);
  auto bad_model = LoadStoredVersion(*v);
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.status().message().find("model.safetensors"), std::string::npos)
      << bad_model.status();
}

TEST_F(ModelStoreTest, ListStoreOrdersBySequenceIgnoresTempAndSkipsWithReasons) {
  // Name order (a < b < c) differs from sequence order (b=1, c=2, a=3).
  FakeVersion(store_ + "/a-seq3", "a-seq3", 3);
  FakeVersion(store_ + "/b-seq1", "b-seq1", 1);
  FakeVersion(store_ + "/c-seq2", "c-seq2", 2);
  fs::create_directories(store_ + "/.tmp-d-seq4-1234-0");  // a crash leftover
  FakeVersion(store_ + "/broken", "broken", 5);
  WriteText(store_ + "/broken/attnserve_version.json", "{\"version\": \"broken\", ");
  fs::create_directories(store_ + "/no-info");
  FakeVersion(store_ + "/renamed", "other-name", 6);
  FakeVersion(root_ + "/outside", "linked", 7);
  fs::create_directory_symlink(root_ + "/outside", store_ + "/linked");
  FakeVersion(store_ + "/.hidden", ".hidden", 8);
  WriteText(store_ + "/notes.txt", "not a version");
  FakeVersion(store_ + "/no-weights", "no-weights", 9);
  fs::remove(store_ + "/no-weights/model.safetensors");

  std::vector<std::string> skipped;
  auto versions = ListStore(store_, &skipped);
  ASSERT_TRUE(versions.ok()) << versions.status();
  std::vector<std::string> names;
  for (const StoredVersion& v : *versions) names.push_back(v.version);
  EXPECT_EQ(names, (std::vector<std::string>{"b-seq1", "c-seq2", "a-seq3"}));

  std::string all;
  for (const std::string& reason : skipped) all += reason + "\n";
  ASSERT_EQ(skipped.size(), 7u) << all;
  auto has = [&](const std::string& entry, const std::string& fragment) {
    for (const std::string& reason : skipped) {
      if (reason.find("'" + entry + "'") == 0 && reason.find(fragment) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(has(".hidden", "must not start with '.'")) << all;
  EXPECT_TRUE(has("broken", "attnserve_version.json is not a JSON object")) << all;
  EXPECT_TRUE(has("linked", "symlink")) << all;
  EXPECT_TRUE(has("no-info", "attnserve_version.json is missing")) << all;
  EXPECT_TRUE(has("no-weights", "model.safetensors is missing")) << all;
  EXPECT_TRUE(has("notes.txt", "not a directory")) << all;
  EXPECT_TRUE(has("renamed", "records version 'other-name'")) << all;
  EXPECT_EQ(all.find(".tmp-"), std::string::npos) << all;

  // A symlink named like a temp dir is removed as a link; its target survives.
  fs::create_directory_symlink(root_ + "/outside", store_ + "/.tmp-evil-1-0");
  auto removed = RemoveStaleTempDirs(store_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_FALSE(fs::exists(store_ + "/.tmp-d-seq4-1234-0"));
  EXPECT_TRUE(fs::exists(root_ + "/outside/attnserve_version.json"));

  EXPECT_EQ(ListStore(root_ + "/missing", nullptr).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadStoredVersion(store_, "../outside").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// CommitRequest.description survives a restart: written to attnserve_version.json and read
// back by ListStore/ReadStoredVersion; optional for older checkpoints; bounded in size.
TEST_F(ModelStoreTest, DescriptionIsPersistedAndReadBack) {
  CheckpointInfo info = Info(1);
  info.description = "support FAQ pairs, \"quoted\", caf\xc3\xa9\nsecond line";
  ASSERT_TRUE(WriteCheckpoint(base(), base().weights(), nullptr, info, store_, kVersion1).ok());
  const std::string info_path = store_ + "/" + kVersion1 + "/attnserve_version.json";
  // The file itself carries it (any tool reading the checkpoint sees it), as a JSON string.
  const auto json = nlohmann::json::parse(ReadText(info_path));
  ASSERT_TRUE(json.contains("description")) << json.dump();
  EXPECT_EQ(json["description"].get<std::string>(), info.description);

  auto read = ReadStoredVersion(store_, kVersion1);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->description, info.description);
  auto listed = ListStore(store_, nullptr);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].description, info.description);

  // A checkpoint written before the field existed (no key) reads as no description.
  FakeVersion(store_ + "/old", "old", 2);
  auto old = ReadStoredVersion(store_, "old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->description, "");

  // A non-string description is malformed metadata: the entry is skipped with the reason.
  FakeVersion(store_ + "/bad-description", "bad-description", 3);
  nlohmann::json bad =
      nlohmann::json::parse(ReadText(store_ + "/bad-description/" + std::string(kVersionInfoFile)));
  bad["description"] = 42;
  WriteText(store_ + "/bad-description/" + std::string(kVersionInfoFile), bad.dump());
  std::vector<std::string> skipped;
  listed = ListStore(store_, &skipped);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("'description'"), std::string::npos) << skipped[0];

  // Too long to keep attnserve_version.json small: refused before anything is written.
  const std::vector<std::string> before = Entries(store_);
  info.description = std::string(kMaxDescriptionBytes + 1, 'x');
  const absl::Status too_long =
      WriteCheckpoint(base(), base().weights(), nullptr, info, store_, "ft-000004");
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument) << too_long;
  EXPECT_NE(too_long.message().find("description"), std::string::npos) << too_long;
  EXPECT_EQ(Entries(store_), before);
  info.description = std::string(kMaxDescriptionBytes, 'y');
  ASSERT_TRUE(WriteCheckpoint(base(), base().weights(), nullptr, info, store_, "ft-000004").ok());
  read = ReadStoredVersion(store_, "ft-000004");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->description, info.description);
}

TEST(ModelStoreNameTest, ValidateVersionName) {
  for (const std::string& bad : std::vector<std::string>{
           "../x", "/abs", "a/b", "", ".", "..", ".hidden", ".tmp-x", "-flag", "a b", "a\\b",
           "caf\xc3\xa9", std::string("a\0b", 3), std::string(65, 'a')}) {
    const absl::Status status = ValidateVersionName(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  for (const std::string& good : std::vector<std::string>{
           "ft-000001-20261122T000000Z", "a", "v1.2_final", "A-b.c", std::string(64, 'z')}) {
    EXPECT_TRUE(ValidateVersionName(good).ok()) << good << ": " << ValidateVersionName(good);
  }
  EXPECT_NE(ValidateVersionName("a/b").message().find("'/' at index 1"), std::string::npos);
}

TEST(ModelStoreNameTest, NewVersionNameIsSortableAndValid) {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 22;
  tm.tm_hour = 4;
  tm.tm_min = 19;
  const std::time_t t = timegm(&tm);
  EXPECT_EQ(NewVersionName(12, t), "ft-000012-20261122T041900Z");
  EXPECT_LT(NewVersionName(9, t + 100), NewVersionName(10, t));
  EXPECT_TRUE(ValidateVersionName(NewVersionName(123456789)).ok());
}

TEST_F(ModelStoreTest, RefusesAnExistingVersionAndBadInputs) {
  FakeVersion(store_ + "/" + kVersion1, kVersion1, 1);
  const std::string before = ReadText(store_ + "/" + kVersion1 + "/attnserve_version.json");
  const absl::Status exists =
      WriteCheckpoint(base(), base().weights(), nullptr, Info(2), store_, kVersion1);
  EXPECT_EQ(exists.code(), absl::StatusCode::kAlreadyExists) << exists;
  EXPECT_EQ(ReadText(store_ + "/" + kVersion1 + "/attnserve_version.json"), before);
  EXPECT_EQ(Entries(store_), std::vector<std::string>{kVersion1});

  EXPECT_EQ(WriteCheckpoint(base(), base().weights(), nullptr, Info(2), store_, "../escape").code(),
            absl::StatusCode::kInvalidArgument);

  BertWeights short_weights = base().weights();
  short_weights.layers.pop_back();
  const absl::Status layers =
      WriteCheckpoint(base(), short_weights, nullptr, Info(2), store_, "ft-2");
  EXPECT_EQ(layers.code(), absl::StatusCode::kInvalidArgument) << layers;

  BertWeights wrong_shape = base().weights();
  wrong_shape.layers[2].ffn_in_bias = Tensor({7});
  const absl::Status shape = WriteCheckpoint(base(), wrong_shape, nullptr, Info(2), store_, "ft-2");
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("layers.2.ffn_in_bias"), std::string::npos) << shape;

  const ClassificationHead bad_head = MakeClassificationHead(2, 5, HeadInit::kNormal, 1);
  EXPECT_EQ(WriteCheckpoint(base(), base().weights(), &bad_head, Info(2), store_, "ft-2").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Entries(store_), std::vector<std::string>{kVersion1});
}

TEST_F(ModelStoreTest, UnwritableStoreFailsNamingThePathAndLeavesNothing) {
  std::string store = store_;
  if (::geteuid() == 0) {
    // root ignores permission bits: a store under a regular file fails for anyone (ENOTDIR).
    WriteText(root_ + "/plain-file", "x");
    store = root_ + "/plain-file/store";
  } else {
    fs::create_directories(store_);
    fs::permissions(store_, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read |
                                fs::perms::others_exec);
  }
  const absl::Status status =
      WriteCheckpoint(base(), base().weights(), nullptr, Info(1), store, kVersion1);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(store), std::string::npos) << status;
  if (::geteuid() == 0) {
    EXPECT_EQ(Entries(root_), std::vector<std::string>{"plain-file"});
    EXPECT_EQ(ReadText(root_ + "/plain-file"), "x");
  } else {
    EXPECT_TRUE(Entries(store_).empty());
  }
}

// A disk that fills up mid-write, simulated with RLIMIT_FSIZE (which also binds root): the
// config files fit, model.safetensors (90 MB) does not.
TEST_F(ModelStoreTest, DiskFullMidWriteRemovesTheTempDir) {
  FakeVersion(store_ + "/existing", "existing", 1);
  const std::vector<std::string> before = Entries(store_);
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct sigaction ignore {
  }, saved_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &saved_action), 0);  // get EFBIG, not a signal
  struct rlimit limited = saved;
  limited.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const absl::Status status =
      WriteCheckpoint(base(), base().weights(), nullptr, Info(2), store_, "ft-000002");
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &saved_action, nullptr);

  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(store_ + "/.tmp-ft-000002-"), std::string::npos) << status;
  EXPECT_NE(status.message().find("model.safetensors"), std::string::npos) << status;
  EXPECT_NE(status.message().find(std::strerror(EFBIG)), std::string::npos) << status;
  EXPECT_EQ(Entries(store_), before);
  auto versions = ListStore(store_, nullptr);
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->size(), 1u);
}

}  // namespace
}  // namespace attn
