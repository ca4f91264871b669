// The pure parts of server-side jobs (server/core/job_record.h, job_dataset.h): a spec's plan,
// job.json both ways, job ids, the upload's chunk and size checks, the SHA-256, the stored
// dataset's damage checks and the per-example checks. No model, no server.
#include "server/core/job_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/job_dataset.h"

namespace attn::server::core {
namespace {

constexpr char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

#define EXPECT_STATUS(expr, code_, part)                                                       \
  do {                                                                                         \
    const absl::Status status_ = (expr);                                                       \
    EXPECT_EQ(status_.code(), absl::StatusCode::code_) << status_;                             \
    EXPECT_TRUE(absl::StrContains(status_.message(), part)) << status_ << "\nwants: " << part; \
  } while (0)

std::string Sha256Of(std::string_view data) {
  Sha256 sha;
  sha.Update(data);
  return sha.HexDigest();
}

JobSpec ContrastiveSpec(int64_t examples, int32_t batch_size, int64_t bytes = 1000) {
  JobSpec spec;
  spec.config.objective = Objective::kContrastive;
  spec.batch_size = batch_size;
  spec.dataset = {bytes, examples, std::string(64, 'a')};
  return spec;
}

TEST(Sha256Test, MatchesTheStandardVectors) {
  EXPECT_EQ(Sha256Of(""), kEmptySha256);
  EXPECT_EQ(Sha256Of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 pieces;  // the same bytes in pieces hash the same
  pieces.Update("a");
  pieces.Update("bc");
  EXPECT_EQ(pieces.HexDigest(), Sha256Of("abc"));
}

TEST(PlanJobTest, FillsDefaultsAndCountsSteps) {
  absl::StatusOr<JobPlan> plan = PlanJob(ContrastiveSpec(10, 0), 256, 1 << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->epochs, 1);
  EXPECT_EQ(plan->batch_size, kDefaultJobBatchSize);
  EXPECT_EQ(plan->total_steps, 1);
  JobSpec spec = ContrastiveSpec(10, 4);
  spec.epochs = 3;
  plan = PlanJob(spec, 256, 1 << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->steps_per_epoch, 3);  // 4 + 4 + 2
  EXPECT_EQ(plan->total_steps, 9);
  // A server limit below the default batch size lowers the default.
  plan = PlanJob(ContrastiveSpec(10, 0), 8, 1 << 20);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->batch_size, 8);
}

TEST(PlanJobTest, RefusesWhatCannotRun) {
  EXPECT_STATUS(PlanJob(ContrastiveSpec(10, 300), 256, 1 << 20).status(), kInvalidArgument,
                "batch_size is 300; give 1 to 256 (--max-inputs-per-request");
  JobSpec spec = ContrastiveSpec(10, 4);
  spec.epochs = -1;
  EXPECT_STATUS(PlanJob(spec, 256, 1 << 20).status(), kInvalidArgument, "epochs is -1");
  // 2 GB declared against a 256 MiB limit: refused from the spec alone.
  EXPECT_STATUS(PlanJob(ContrastiveSpec(10, 4, int64_t{2} << 30), 256, 256 << 20).status(),
                kInvalidArgument,
                "dataset.bytes is 2147483648; this server takes datasets of 1 to 268435456 bytes "
                "(--max-job-dataset-bytes)");
  EXPECT_STATUS(PlanJob(ContrastiveSpec(10, 4, 0), 256, 1 << 20).status(), kInvalidArgument,
                "dataset.bytes is 0");
  EXPECT_STATUS(PlanJob(ContrastiveSpec(0, 4), 256, 1 << 20).status(), kInvalidArgument,
                "dataset.examples is 0");
  spec = ContrastiveSpec(10, 4);
  spec.dataset.sha256 = "not-a-digest";
  EXPECT_STATUS(PlanJob(spec, 256, 1 << 20).status(), kInvalidArgument,
                "dataset.sha256 is 'not-a-digest'");
  // 9 pairs in batches of 4: the last batch borrows a pair (4, 3, 2), still 3 steps an epoch.
  absl::StatusOr<JobPlan> nine = PlanJob(ContrastiveSpec(9, 4), 256, 1 << 20);
  ASSERT_TRUE(nine.ok()) << nine.status();
  EXPECT_EQ(nine->steps_per_epoch, 3);
  // Batches of 2 have no pair to lend.
  EXPECT_STATUS(PlanJob(ContrastiveSpec(9, 2), 256, 1 << 20).status(), kInvalidArgument,
                "each epoch would end with a batch of 1 pair");
  EXPECT_STATUS(PlanJob(ContrastiveSpec(1, 4), 256, 1 << 20).status(), kInvalidArgument,
                "at least 2");
}

JobRecord SampleRecord() {
  JobRecord r;
  r.id = "job-20261125T103000Z-1a2b3c4d";
  r.model = "minilm";
  r.state = JobState::kSucceeded;
  r.created_utc = "2026-11-25T10:30:00Z";
  r.started_utc = "2026-11-25T10:30:01Z";
  r.ended_utc = "2026-11-25T10:31:00Z";
  r.base_version = "base";
  r.objective = "contrastive";
  r.epochs = 2;
  r.batch_size = 4;
  r.step = 6;
  r.total_steps = 6;
  r.loss = 0.25;
  r.dataset = {307, 8, std::string(64, 'f')};
  r.description = "FAQ pairs \xE2\x9C\x93";
  r.promote = true;
  r.committed_version = "ft-000001-20261125T103100Z";
  r.promoted = true;
  r.promotion = "promoted: the job asked for it";
  return r;
}

TEST(JobRecordTest, RoundTripsThroughJson) {
  JobRecord r = SampleRecord();
  absl::StatusOr<JobRecord> back = ParseJobRecord(JobRecordJson(r), "job.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(JobRecordJson(*back), JobRecordJson(r));
  EXPECT_EQ(back->state, JobState::kSucceeded);
  EXPECT_EQ(back->dataset.examples, 8);
  EXPECT_EQ(back->description, r.description);
  // A diverged loss is kept as null and read back as NaN.
  r.loss = std::nan("");
  r.state = JobState::kFailed;
  r.error = "job stopped at batch 3: the loss is NaN";
  r.error_code = "ABORTED";
  back = ParseJobRecord(JobRecordJson(r), "job.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(std::isnan(back->loss));
  EXPECT_EQ(back->error_code, "ABORTED");
}

TEST(JobRecordTest, RefusesRecordsItDidNotWrite) {
  const std::string good = JobRecordJson(SampleRecord());
  auto replaced = [&good](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_STATUS(ParseJobRecord("{not json", "a/job.json").status(), kFailedPrecondition,
                "a/job.json");
  EXPECT_STATUS(ParseJobRecord("[1, 2]", "job.json").status(), kFailedPrecondition, "job.json");
  EXPECT_STATUS(
      ParseJobRecord(replaced("\"state\": \"succeeded\"", "\"state\": \"dancing\""), "job.json")
          .status(),
      kFailedPrecondition, "unknown state 'dancing'");
  EXPECT_STATUS(ParseJobRecord(replaced("\"step\": 6", "\"step\": \"six\""), "job.json").status(),
                kFailedPrecondition, "\"step\" is missing or not a number");
  EXPECT_STATUS(
      ParseJobRecord(replaced("\"format_version\": 1", "\"format_version\": 9"), "job.json")
          .status(),
      kFailedPrecondition, "format_version 9");
  EXPECT_STATUS(
      ParseJobRecord(replaced("\"id\": \"job-20261125T103000Z-1a2b3c4d\"", "\"id\": \"../../etc\""),
                     "job.json")
          .status(),
      kFailedPrecondition, "job_id is '../../etc'");
  EXPECT_STATUS(ParseJobRecord(replaced("\"sha256\"", "\"sha\""), "job.json").status(),
                kFailedPrecondition, "\"sha256\" is missing");
}

TEST(JobIdTest, NewIdsAreValidAndMalformedOnesAreRefusedQuotingShortly) {
  const std::string id = NewJobId(1764066600, 0x1a2b3c4d);
  EXPECT_EQ(id, "job-20251125T103000Z-1a2b3c4d");
  EXPECT_TRUE(ValidateJobId(id).ok());
  EXPECT_STATUS(ValidateJobId(""), kInvalidArgument, "job_id is empty");
  EXPECT_STATUS(ValidateJobId("job-"), kInvalidArgument, "'job-'");
  EXPECT_STATUS(ValidateJobId("job-../../etc"), kInvalidArgument, "job_id is 'job-../../etc'");
  EXPECT_STATUS(ValidateJobId("ft-000001-20261125T103000Z"), kInvalidArgument,
                "a job id looks like job-");
  EXPECT_STATUS(ValidateJobId("job-a\nb"), kInvalidArgument, "\\x0A");
  const absl::Status long_id = ValidateJobId("job-" + std::string(10000, 'x'));
  EXPECT_EQ(long_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(long_id.message().size(), 300u) << "quotes at most a short piece";
}

// `examples` as a delimited dataset.
std::string Dataset(const std::vector<std::string>& examples) {
  std::string out;
  for (const std::string& e : examples) AppendDelimited(e, &out);
  return out;
}

DatasetInfo InfoOf(const std::string& data, int64_t examples) {
  return {static_cast<int64_t>(data.size()), examples, Sha256Of(data)};
}

// Keeps each example a receiver accepts; their indexes count from 0.
DatasetReceiver::CheckExample Collect(std::vector<std::string>* seen) {
  auto next = std::make_shared<int64_t>(0);
  return [seen, next](std::string_view example, int64_t index) {
    EXPECT_EQ(index, (*next)++);
    seen->emplace_back(example);
    return absl::OkStatus();
  };
}

TEST(DelimitedTest, VarintsRoundTrip) {
  for (uint64_t size : {0ull, 1ull, 127ull, 128ull, 300ull, 16383ull, 16384ull, 1ull << 20}) {
    std::string framed;
    AppendDelimited(std::string(size, 'x'), &framed);
    uint64_t read = 0;
    bool malformed = true;
    const size_t header = ReadVarint(framed, &read, &malformed);
    EXPECT_FALSE(malformed);
    EXPECT_EQ(read, size);
    EXPECT_EQ(header + size, framed.size());
  }
  uint64_t value;
  bool malformed;
  EXPECT_EQ(ReadVarint("\x80\x80", &value, &malformed), 0u);  // cut short
  EXPECT_FALSE(malformed);
  EXPECT_EQ(ReadVarint(std::string(11, '\x80'), &value, &malformed), 0u);
  EXPECT_TRUE(malformed);
}

TEST(DatasetReceiverTest, TakesExamplesSplitAcrossChunksAnywhere) {
  const std::vector<std::string> examples = {"first", std::string(300, 'b'), "", "last one"};
  const std::string data = Dataset(examples);
  for (size_t chunk = 1; chunk <= data.size(); chunk += 7) {
    std::vector<std::string> seen;
    DatasetReceiver receiver(InfoOf(data, 4), Collect(&seen));
    int64_t index = 0;
    for (size_t at = 0; at < data.size(); at += chunk) {
      ASSERT_TRUE(receiver.Add(index++, data.substr(at, chunk)).ok()) << "chunk size " << chunk;
    }
    EXPECT_TRUE(receiver.complete());
    EXPECT_TRUE(receiver.Finish().ok()) << "chunk size " << chunk;
    EXPECT_EQ(seen, examples) << "chunk size " << chunk;
  }
}

TEST(DatasetReceiverTest, RefusesChunksOutOfOrderOrRepeated) {
  const std::string data = Dataset({"aaaa", "bbbb", "cccc"});
  std::vector<std::string> seen;
  DatasetReceiver receiver(InfoOf(data, 3), Collect(&seen));
  ASSERT_TRUE(receiver.Add(0, data.substr(0, 5)).ok());
  EXPECT_STATUS(receiver.Add(2, data.substr(5, 5)), kInvalidArgument,
                "chunk 2 arrived where chunk 1 was expected; send the chunks in order");
  DatasetReceiver again(InfoOf(data, 3), Collect(&seen));
  ASSERT_TRUE(again.Add(0, data.substr(0, 5)).ok());
  EXPECT_STATUS(again.Add(0, data.substr(0, 5)), kInvalidArgument,
                "chunk 0 arrived where chunk 1 was expected");
  DatasetReceiver late_start(InfoOf(data, 3), Collect(&seen));
  EXPECT_STATUS(late_start.Add(1, data), kInvalidArgument, "chunk 1 arrived where chunk 0");
}

TEST(DatasetReceiverTest, CatchesASizeThatLied) {
  const std::string data = Dataset({"aaaa", "bbbb", "cccc"});
  DatasetInfo declared = InfoOf(data, 3);
  declared.bytes = 10;  // fewer than it sends
  std::vector<std::string> seen;
  DatasetReceiver receiver(declared, Collect(&seen));
  ASSERT_TRUE(receiver.Add(0, data.substr(0, 5)).ok());
  EXPECT_STATUS(receiver.Add(1, data.substr(5)), kInvalidArgument,
                "brings the dataset to 15 bytes, more than the 10 bytes the spec declared");
  // More bytes declared than sent: the end of the upload says how many arrived.
  declared.bytes = 100;
  DatasetReceiver short_upload(declared, Collect(&seen));
  ASSERT_TRUE(short_upload.Add(0, data).ok());
  EXPECT_FALSE(short_upload.complete());
  EXPECT_STATUS(short_upload.Finish(), kInvalidArgument,
                "the upload ended after 15 of the 100 bytes");
}

TEST(DatasetReceiverTest, CatchesAChecksumMismatchAndWrongCounts) {
  const std::string data = Dataset({"aaaa", "bbbb"});
  std::vector<std::string> seen;
  DatasetInfo declared = InfoOf(data, 2);
  declared.sha256 = kEmptySha256;
  DatasetReceiver receiver(declared, Collect(&seen));
  ASSERT_TRUE(receiver.Add(0, data).ok());
  EXPECT_STATUS(receiver.Finish(), kInvalidArgument,
                absl::StrCat("the dataset's SHA-256 is ", Sha256Of(data), ", the spec declared ",
                             kEmptySha256));
  // Upper-case hex is the same digest.
  declared.sha256 = Sha256Of(data);
  for (char& c : declared.sha256) c = static_cast<char>(std::toupper(c));
  DatasetReceiver upper(declared, Collect(&seen));
  ASSERT_TRUE(upper.Add(0, data).ok());
  EXPECT_TRUE(upper.Finish().ok());

  DatasetReceiver too_few(InfoOf(data, 3), Collect(&seen));
  ASSERT_TRUE(too_few.Add(0, data).ok());
  EXPECT_STATUS(too_few.Finish(), kInvalidArgument, "holds 2 examples, the spec declared 3");
  DatasetReceiver too_many(InfoOf(data, 1), Collect(&seen));
  EXPECT_STATUS(too_many.Add(0, data), kInvalidArgument, "more than the 1 examples the spec");
}

TEST(DatasetReceiverTest, RefusesBadFramingHugeExamplesAndHugeChunks) {
  // A size varint that never ends.
  const std::string endless(12, '\xFF');
  std::vector<std::string> seen;
  DatasetReceiver receiver({12, 1, std::string(64, '0')}, Collect(&seen));
  EXPECT_STATUS(receiver.Add(0, endless), kInvalidArgument,
                "dataset example 0 (at byte 0) does not start with a valid size");
  // An example that declares 2 MiB: refused before its bytes are kept.
  const std::string huge = std::string("\x80\x80\x80\x01", 4) + "xxxx";  // 2^21 bytes
  DatasetReceiver big({100, 1, std::string(64, '0')}, Collect(&seen));
  EXPECT_STATUS(big.Add(0, huge), kInvalidArgument,
                "declares 2097152 bytes, more than the limit of 1048576");
  DatasetReceiver chunky({kMaxChunkBytes * 4, 1, std::string(64, '0')}, Collect(&seen));
  EXPECT_STATUS(chunky.Add(0, std::string(kMaxChunkBytes + 1, 'x')), kInvalidArgument,
                "chunk 0 has 1048577 bytes; send 1 to 1048576");
  EXPECT_STATUS(chunky.Add(0, ""), kInvalidArgument, "chunk 0 has 0 bytes");
  // The ends of an example that is cut short.
  const std::string data = Dataset({"aaaa", "bbbb"});
  DatasetReceiver cut(InfoOf(data.substr(0, data.size() - 1), 2), Collect(&seen));
  ASSERT_TRUE(cut.Add(0, data.substr(0, data.size() - 1)).ok());
  EXPECT_STATUS(cut.Finish(), kInvalidArgument, "the dataset ends inside example 1");
}

TEST(DatasetReceiverTest, ReportsTheFirstBadExampleByIndex) {
  const std::string data = Dataset({"good", "good", "bad!", "good"});
  DatasetReceiver receiver(InfoOf(data, 4), [](std::string_view example, int64_t index) {
    return example == "bad!" ? absl::InvalidArgumentError(
                                   absl::StrCat("dataset example ", index, ": anchor is empty"))
                             : absl::OkStatus();
  });
  EXPECT_STATUS(receiver.Add(0, data), kInvalidArgument, "dataset example 2: anchor is empty");
}

class DatasetFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ =
        (std::filesystem::temp_directory_path() / ("attn-job-dataset-" + std::to_string(getpid())))
            .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void Write(const std::string& data) { std::ofstream(path_, std::ios::binary) << data; }
  std::string path_;
};

TEST_F(DatasetFileTest, ReadsEachExampleBack) {
  const std::vector<std::string> examples = {"one", std::string(200, 'x'), "three"};
  const std::string data = Dataset(examples);
  Write(data);
  absl::StatusOr<DatasetFile> file = DatasetFile::Open(path_, InfoOf(data, 3));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), 3);
  for (int i : {2, 0, 1}) {
    absl::StatusOr<std::string> example = file->Read(i);
    ASSERT_TRUE(example.ok()) << example.status();
    EXPECT_EQ(*example, examples[i]);
  }
  EXPECT_EQ(file->Read(3).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(DatasetFileTest, ADamagedFileIsDataLoss) {
  const std::string data = Dataset({"one", "two"});
  std::string flipped = data;
  flipped[2] = 'X';
  Write(flipped);
  EXPECT_STATUS(DatasetFile::Open(path_, InfoOf(data, 2)).status(), kDataLoss, "has SHA-256");
  Write(data + "x");
  EXPECT_STATUS(DatasetFile::Open(path_, InfoOf(data, 2)).status(), kDataLoss,
                absl::StrCat("has ", data.size() + 1, " bytes, the upload had ", data.size()));
  std::filesystem::remove(path_);
  EXPECT_EQ(DatasetFile::Open(path_, InfoOf(data, 2)).status().code(), absl::StatusCode::kNotFound);
}

JobSettings SettingsFor(Objective objective, int labels = 0) {
  JobSettings settings;
  settings.trainer.objective = objective;
  settings.trainer.num_labels = labels;
  return settings;
}

TEST(CheckJobExampleTest, EachObjectiveGetsItsFieldsAndOnlyThose) {
  TrainingExample pair;
  pair.anchor = "a";
  pair.positive = "b";
  const JobSettings contrastive = SettingsFor(Objective::kContrastive);
  EXPECT_TRUE(CheckJobExample(pair, contrastive, 0, false).ok());
  TrainingExample no_positive = pair;
  no_positive.positive.clear();
  EXPECT_STATUS(CheckJobExample(no_positive, contrastive, 7, false), kInvalidArgument,
                "dataset example 7: positive is empty");
  TrainingExample with_label = pair;
  with_label.label = 2;
  EXPECT_STATUS(CheckJobExample(with_label, contrastive, 3, false), kInvalidArgument,
                "dataset example 3: label is set but the contrastive objective does not use it");
  TrainingExample with_negative = pair;
  with_negative.negative = "c";
  EXPECT_TRUE(CheckJobExample(with_negative, contrastive, 0, true).ok());
  EXPECT_STATUS(CheckJobExample(pair, contrastive, 5, true), kInvalidArgument,
                "dataset example 5: has no negative but the first example has one");
  EXPECT_STATUS(CheckJobExample(with_negative, contrastive, 5, false), kInvalidArgument,
                "has a negative but the first example has none");

  TrainingExample scored;
  scored.first = "x";
  scored.second = "y";
  scored.score = 1.5f;
  EXPECT_STATUS(CheckJobExample(scored, SettingsFor(Objective::kCosineSimilarity), 1, false),
                kInvalidArgument, "dataset example 1: score is 1.5");
  scored.score = -0.5f;
  EXPECT_TRUE(CheckJobExample(scored, SettingsFor(Objective::kCosineSimilarity), 1, false).ok());

  TrainingExample labelled;
  labelled.text = "great film";
  labelled.label = 3;
  EXPECT_STATUS(CheckJobExample(labelled, SettingsFor(Objective::kClassification, 3), 9, false),
                kInvalidArgument, "dataset example 9: label is 3, outside [0, 3)");
  labelled.label = 2;
  EXPECT_TRUE(CheckJobExample(labelled, SettingsFor(Objective::kClassification, 3), 9, false).ok());
  EXPECT_STATUS(CheckJobExample(labelled, SettingsFor(Objective::kPairClassification, 3), 4, false),
                kInvalidArgument, "dataset example 4: first is empty");
}

}  // namespace
}  // namespace attn::server::core
