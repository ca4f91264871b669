#include "server/core/job_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/durable_file.h"

namespace attn::server::core {

void AppendDelimited(std::string_view message, std::string* out) {
  uint64_t size = message.size();
  do {
    const uint8_t low = size & 0x7F;
    size >>= 7;
    out->push_back(static_cast<char>(size != 0 ? low | 0x80 : low));
  } while (size != 0);
  out->append(message);
}

size_t ReadVarint(std::string_view data, uint64_t* value, bool* malformed) {
  *value = 0;
  *malformed = false;
  for (size_t i = 0; i < data.size(); ++i) {
    if (i == 10) {
      *malformed = true;
      return 0;
    }
    const auto byte = static_cast<uint8_t>(data[i]);
    *value |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
    if ((byte & 0x80) == 0) return i + 1;
  }
  return 0;
}

Sha256::Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr);
}

void Sha256::Update(std::string_view data) {
  EVP_DigestUpdate(context_.get(), data.data(), data.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context_.get(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xF]);
  }
  return hex;
}

DatasetReceiver::DatasetReceiver(DatasetInfo declared, CheckExample check_example)
    : declared_(std::move(declared)), check_example_(std::move(check_example)) {}

absl::Status DatasetReceiver::Add(int64_t index, std::string_view data) {
  if (index != next_chunk_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " arrived where chunk ", next_chunk_,
                     " was expected; send the chunks in order, numbered from 0, each once"));
  }
  if (data.empty() || static_cast<int64_t>(data.size()) > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " has ", data.size(),
                                                   " bytes; send 1 to ", kMaxChunkBytes,
                                                   " bytes per chunk"));
  }
  if (received_ + static_cast<int64_t>(data.size()) > declared_.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, " brings the dataset to ", received_ + static_cast<int64_t>(data.size()),
        " bytes, more than the ", declared_.bytes,
        " bytes the spec declared (dataset.bytes); declare the dataset's real size"));
  }
  ++next_chunk_;
  received_ += static_cast<int64_t>(data.size());
  sha256_.Update(data);
  // Examples whole in this chunk are read from it directly; only one that continues into the
  // next chunk is copied.
  std::string_view rest = data;
  std::string joined;
  if (!partial_.empty()) {
    joined = std::move(partial_);
    joined.append(data);
    partial_.clear();
    rest = joined;
  }
  while (!rest.empty()) {
    uint64_t size = 0;
    bool malformed = false;
    const size_t header = ReadVarint(rest, &size, &malformed);
    if (malformed || (header > 0 && size > static_cast<uint64_t>(kMaxExampleBytes))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset example ", examples_, " (at byte ", received_ - rest.size(), ") ",
          malformed ? "does not start with a valid size (a varint)"
                    : absl::StrCat("declares ", size, " bytes, more than the limit of ",
                                   kMaxExampleBytes),
          "; the dataset must be TrainingExamples each preceded by its size (protobuf's "
          "delimited format)"));
    }
    if (header == 0 || rest.size() - header < size) break;  // continues in the next chunk
    if (absl::Status valid = check_example_(rest.substr(header, size), examples_); !valid.ok()) {
      return valid;
    }
    ++examples_;
    if (examples_ > declared_.examples) {
      return absl::InvalidArgumentError(
          absl::StrCat("the dataset holds more than the ", declared_.examples,
                       " examples the spec declared (dataset.examples); declare the real count"));
    }
    rest.remove_prefix(header + size);
  }
  partial_.assign(rest.data(), rest.size());
  return absl::OkStatus();
}

absl::Status DatasetReceiver::Finish() {
  if (received_ != declared_.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the upload ended after ", received_, " of the ", declared_.bytes,
                     " bytes the spec declared (", next_chunk_,
                     next_chunk_ == 1 ? " chunk" : " chunks", "); send the whole dataset"));
  }
  if (!partial_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset ends inside example ", examples_,
                                                   " (its last ", partial_.size(),
                                                   " bytes are an incomplete example)"));
  }
  if (examples_ != declared_.examples) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset holds ", examples_,
                                                   " examples, the spec declared ",
                                                   declared_.examples, " (dataset.examples)"));
  }
  const std::string sha256 = sha256_.HexDigest();
  if (sha256 != absl::AsciiStrToLower(declared_.sha256)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset's SHA-256 is ", sha256, ", the spec declared ",
        absl::AsciiStrToLower(declared_.sha256),
        " (dataset.sha256): the bytes were changed on the way or the checksum was computed over "
        "other bytes"));
  }
  return absl::OkStatus();
}

bool DelimitedOffsets(std::string_view data, int64_t max_record_bytes,
                      std::vector<uint32_t>* offsets) {
  offsets->clear();
  size_t at = 0;
  while (at < data.size()) {
    uint64_t size = 0;
    bool malformed = false;
    const size_t header = ReadVarint(data.substr(at), &size, &malformed);
    if (malformed || size > static_cast<uint64_t>(max_record_bytes)) return false;
    if (header == 0 || data.size() - at - header < size) break;  // cut short
    offsets->push_back(static_cast<uint32_t>(at));
    at += header + size;
  }
  offsets->push_back(static_cast<uint32_t>(at));
  return true;
}

absl::StatusOr<DatasetFile> DatasetFile::Open(const std::string& path,
                                              const DatasetInfo& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError(path, "open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(path, "fstat", err);
  }
  auto damaged = [&path](const std::string& what) {
    return absl::DataLossError(absl::StrCat("the job's dataset ", path, " ", what,
                                            "; it was changed or damaged on disk since its "
                                            "upload, so the job does not train on it"));
  };
  if (st.st_size != expected.bytes) {
    ::close(fd);
    return damaged(absl::StrCat("has ", st.st_size, " bytes, the upload had ", expected.bytes));
  }
  DatasetFile file;
  file.path_ = path;
  void* mapped = st.st_size > 0 ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                                         MAP_PRIVATE, fd, 0)
                                : nullptr;
  const int map_error = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) return ErrnoError(path, "mmap", map_error);
  const std::string_view data(static_cast<const char*>(mapped), static_cast<size_t>(st.st_size));
  Sha256 sha256;
  sha256.Update(data);
  const std::string digest = sha256.HexDigest();
  const bool framed = DelimitedOffsets(data, kMaxExampleBytes, &file.offsets_);
  if (mapped != nullptr) ::munmap(mapped, static_cast<size_t>(st.st_size));
  if (digest != absl::AsciiStrToLower(expected.sha256)) {
    return damaged(absl::StrCat("has SHA-256 ", digest, ", the upload had ", expected.sha256));
  }
  if (!framed || file.offsets_.back() != static_cast<uint32_t>(st.st_size) ||
      file.size() != expected.examples) {
    return damaged(absl::StrCat("does not hold the ", expected.examples, " examples uploaded"));
  }
  return file;
}

absl::StatusOr<std::string> DatasetFile::Read(int64_t index) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("example ", index, " of ", size()));
  }
  const uint32_t begin = offsets_[index];
  const uint32_t end = offsets_[index + 1];
  absl::StatusOr<std::string> record = ReadFileRange(path_, begin, end - begin);
  if (!record.ok()) return record.status();
  uint64_t size = 0;
  bool malformed = false;
  const size_t header = ReadVarint(*record, &size, &malformed);
  return record->substr(header);
}

namespace {

// The fields of TrainingExample and which objectives use them.
enum Field : uint8_t { kAnchor, kPositive, kNegative, kFirst, kSecond, kScore, kText, kLabel };
constexpr const char* kFieldNames[] = {"anchor", "positive", "negative", "first",
                                       "second", "score",    "text",     "label"};

struct ObjectiveFields {
  std::vector<Field> required;  // texts that must not be empty
  std::vector<Field> allowed;   // besides the required ones
};

ObjectiveFields FieldsOf(Objective objective) {
  switch (objective) {
    case Objective::kContrastive:
      return {{kAnchor, kPositive}, {kNegative}};
    case Objective::kCosineSimilarity:
      return {{kFirst, kSecond}, {kScore}};
    case Objective::kClassification:
      return {{kText}, {kLabel}};
    case Objective::kPairClassification:
      return {{kFirst, kSecond}, {kLabel}};
  }
  return {};
}

bool IsSet(const TrainingExample& e, Field field) {
  switch (field) {
    case kAnchor:
      return !e.anchor.empty();
    case kPositive:
      return !e.positive.empty();
    case kNegative:
      return !e.negative.empty();
    case kFirst:
      return !e.first.empty();
    case kSecond:
      return !e.second.empty();
    case kScore:
      return e.score != 0;
    case kText:
      return !e.text.empty();
    case kLabel:
      return e.label != 0;
  }
  return false;
}

}  // namespace

absl::Status CheckJobExample(const TrainingExample& e, const JobSettings& settings, int64_t index,
                             bool has_negatives) {
  const Objective objective = settings.trainer.objective;
  const ObjectiveFields fields = FieldsOf(objective);
  auto invalid = [index](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("dataset example ", index, ": ", what));
  };
  for (Field field : fields.required) {
    if (!IsSet(e, field)) return invalid(absl::StrCat(kFieldNames[field], " is empty"));
  }
  for (int f = kAnchor; f <= kLabel; ++f) {
    const auto field = static_cast<Field>(f);
    const auto uses = [field](const std::vector<Field>& list) {
      return std::find(list.begin(), list.end(), field) != list.end();
    };
    if (IsSet(e, field) && !uses(fields.required) && !uses(fields.allowed)) {
      return invalid(absl::StrCat(kFieldNames[field], " is set but the ", ObjectiveName(objective),
                                  " objective does not use it"));
    }
  }
  if (objective == Objective::kContrastive && IsSet(e, kNegative) != has_negatives) {
    return invalid(has_negatives ? "has no negative but the first example has one; give a hard "
                                   "negative for every example or for none"
                                 : "has a negative but the first example has none; give a hard "
                                   "negative for every example or for none");
  }
  if (objective == Objective::kCosineSimilarity &&
      (!std::isfinite(e.score) || e.score < -1.0f || e.score > 1.0f)) {
    return invalid(
        absl::StrCat("score is ", e.score, "; gold scores must be finite and in [-1, 1]"));
  }
  if (HasClassificationHead(objective) && (e.label < 0 || e.label >= settings.trainer.num_labels)) {
    return invalid(absl::StrCat("label is ", e.label, ", outside [0, ", settings.trainer.num_labels,
                                ") (config.num_labels)"));
  }
  return absl::OkStatus();
}

}  // namespace attn::server::core
