#include "engine/model_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/durable_file.h"
#include "engine/log.h"
#include "engine/quote.h"
#include "engine/safetensors.h"
#include "engine/serving_state.h"
#include "engine/training/training_report.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kFormatVersion = 1;
// attnserve_version.json is a few hundred bytes; anything far larger is not ours.
constexpr size_t kMaxInfoBytes = 1 << 20;

// Files copied from the base directory when present. config.json is required and handled
// separately; 1_Pooling/config.json needs its subdirectory.
constexpr const char* kCopiedFiles[] = {
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
};
constexpr char kPoolingDir[] = "1_Pooling";

absl::Status WithPrefix(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

std::string Join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / std::string(name)).string();
}

// Streams `src` into a new file `dst` and fsyncs it. `src` may be a symlink (Hugging Face's
// cache links to blobs); the copy is always a regular file.
absl::Status CopyFileDurably(const std::string& src, const std::string& dst) {
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoError(src, "open", errno);
  const int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    return ErrnoError(dst, "open", err);
  }
  std::vector<char> buffer(1 << 20);
  absl::Status status;
  while (status.ok()) {
    const ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoError(src, "read", errno);
    } else if (n == 0) {
      break;
    } else if (const int err = WriteAll(out, buffer.data(), static_cast<size_t>(n)); err != 0) {
      status = ErrnoError(dst, "write", err);
    }
  }
  ::close(in);
  if (status.ok() && ::fsync(out) != 0) status = ErrnoError(dst, "fsync", errno);
  if (::close(out) != 0 && status.ok()) status = ErrnoError(dst, "close", errno);
  return status;
}

std::string FormatUtc(std::time_t t, const char* format) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buffer[64];
  const size_t n = std::strftime(buffer, sizeof(buffer), format, &tm);
  return std::string(buffer, n);
}

// A tensor of the checkpoint: its HF name and the data to write (borrowed or a QKV slice).
struct OutputTensor {
  std::string name;
  const Tensor* tensor;
};

// Maps the engine weights to HF-named tensors through BuildParameterTable, the one name table,
// so the writer can never disagree with the loader. Fused QKV rows are copied out into
// `slices` (H x H per block); everything else is written from the weights' own buffers.
absl::StatusOr<std::vector<OutputTensor>> HfTensors(const BertConfig& config,
                                                    const BertWeights& weights,
                                                    std::deque<Tensor>* slices) {
  // The table points into a BertWeights it allocates; a scratch copy shaped from the config
  // identifies each slot's engine tensor by position in EngineTensors(), whose order is fixed.
  BertWeights scratch;
  const std::vector<ParameterSlot> table = BuildParameterTable(config, &scratch);
  const std::vector<std::pair<std::string, Tensor*>> expected = EngineTensors(&scratch);
  // EngineTensors() only hands out pointers; nothing below writes through them.
  const std::vector<std::pair<std::string, Tensor*>> actual =
      EngineTensors(const_cast<BertWeights*>(&weights));
  if (actual.size() != expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", weights.layers.size(),
                                                   " layers, the base config.json has ",
                                                   config.num_hidden_layers));
  }
  std::map<const Tensor*, size_t> index;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (actual[i].second->shape() != expected[i].second->shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights tensor '", actual[i].first, "' has shape ", actual[i].second->ShapeString(),
          ", the base config.json expects ", expected[i].second->ShapeString()));
    }
    index[expected[i].second] = i;
  }
  std::vector<OutputTensor> out;
  out.reserve(table.size());
  for (const ParameterSlot& slot : table) {
    const Tensor& source = *actual[index.at(slot.target)].second;
    if (slot.row_offset == 0 && slot.shape == source.shape()) {
      out.push_back({slot.hf_name, &source});
      continue;
    }
    // A row block of a fused tensor: rows [row_offset, row_offset + shape[0]).
    Tensor& slice = slices->emplace_back(slot.shape);
    const int64_t row_size = source.numel() / source.dim(0);
    if ((slot.row_offset + slot.shape[0]) * row_size > source.numel() ||
        slice.numel() != slot.shape[0] * row_size) {
      return absl::InternalError(absl::StrCat("parameter table slot '", slot.hf_name,
                                              "' does not fit its engine tensor ",
                                              source.ShapeString()));
    }
    std::memcpy(slice.data(), source.data() + slot.row_offset * row_size,
                sizeof(float) * slice.numel());
    out.push_back({slot.hf_name, &slice});
  }
  return out;
}

absl::Status ValidateHead(const ClassificationHead& head, int64_t hidden) {
  const int64_t k = head.num_labels();
  if (head.weight.rank() != 2 || k < 1 || head.hidden_size() != hidden ||
      head.bias.shape() != std::vector<int64_t>{k}) {
    return absl::InvalidArgumentError(
        absl::StrCat("classification head has weight ", head.weight.ShapeString(), " and bias ",
                     head.bias.ShapeString(), "; expected (K, ", hidden, ") and (K) with K >= 1"));
  }
  return absl::OkStatus();
}

// Everything that goes into the temp dir. Any error leaves cleanup to the caller.
absl::Status WriteCheckpointFiles(const Model& base, const std::vector<OutputTensor>& tensors,
                                  const ClassificationHead* head, const CheckpointInfo& info,
                                  const std::string& version, const std::string& dir) {
  std::vector<NamedTensor> named;
  named.reserve(tensors.size());
  for (const OutputTensor& t : tensors) named.push_back({t.name, t.tensor});
  // transformers refuses a safetensors file whose metadata lacks format "pt".
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"attnserve_version", version}};
  absl::Status status = WriteSafetensors(Join(dir, "model.safetensors"), named, metadata);
  if (!status.ok()) return status;

  if (head != nullptr) {
    status = WriteSafetensors(
        Join(dir, kHeadFile),
        {{"classifier.weight", &head->weight}, {"classifier.bias", &head->bias}}, metadata);
    if (!status.ok()) return status;
  }

  const std::string& base_dir = base.model_dir();
  std::error_code ec;
  const std::string base_config = Join(base_dir, "config.json");
  if (!fs::is_regular_file(base_config, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(base_config,
                     ": the base model's config.json is missing; cannot write a "
                     "loadable checkpoint"));
  }
  status = CopyFileDurably(base_config, Join(dir, "config.json"));
  if (!status.ok()) return status;
  for (const char* name : kCopiedFiles) {
    const std::string src = Join(base_dir, name);
    if (!fs::is_regular_file(src, ec)) continue;
    status = CopyFileDurably(src, Join(dir, name));
    if (!status.ok()) return status;
  }
  const std::string pooling_src = Join(Join(base_dir, kPoolingDir), "config.json");
  if (fs::is_regular_file(pooling_src, ec)) {
    const std::string pooling_dir = Join(dir, kPoolingDir);
    if (::mkdir(pooling_dir.c_str(), 0755) != 0) return ErrnoError(pooling_dir, "mkdir", errno);
    status = CopyFileDurably(pooling_src, Join(pooling_dir, "config.json"));
    if (!status.ok()) return status;
    status = FsyncDir(pooling_dir);
    if (!status.ok()) return status;
  }

  fs::path parent = fs::absolute(base_dir, ec);
  Json json = {
      {"format_version", kFormatVersion},
      {"version", version},
      {"base_version", info.base_version},
      {"parent_dir", ec ? base_dir : parent.lexically_normal().string()},
      {"created_utc", FormatUtc(std::time(nullptr), "%Y-%m-%dT%H:%M:%SZ")},
      {"objective", info.objective},
      {"steps", info.steps},
      // JSON has no NaN/Inf; a diverged loss should never be committed, but stays readable.
      {"final_loss", std::isfinite(info.final_loss) ? Json(info.final_loss) : Json(nullptr)},
      {"sequence", info.sequence},
      {"num_labels", head != nullptr ? head->num_labels() : 0},
      {"label_names", info.label_names},
      {"description", info.description},
      {"notes", info.notes},
  };
  // Replace invalid UTF-8 (caller-supplied strings) instead of throwing.
  const std::string text = json.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  status = WriteFileDurably(Join(dir, kVersionInfoFile), text);
  if (!status.ok()) return status;
  if (!info.training_report_json.empty()) {
    status = WriteFileDurably(Join(dir, kTrainingReportFile), info.training_report_json);
    if (!status.ok()) return status;
  }
  return FsyncDir(dir);
}

// Atomically moves `from` to `to`, failing if `to` exists (a concurrent commit of the same
// name must not be overwritten; rename() would replace an empty directory).
absl::Status RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  int err = errno;
  if (err == EINVAL || err == ENOSYS) {
    // Filesystem without RENAME_NOREPLACE: check, then rename (a non-empty target dir still
    // makes rename() fail with ENOTEMPTY).
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) {
      err = EEXIST;
    } else if (::rename(from.c_str(), to.c_str()) == 0) {
      return absl::OkStatus();
    } else {
      err = errno;
    }
  }
  if (err == EEXIST || err == ENOTEMPTY) {
    return absl::AlreadyExistsError(absl::StrCat("version directory ", to, " already exists"));
  }
  return ErrnoError(absl::StrCat(from, " -> ", to), "rename", err);
}

bool GetString(const Json& json, const char* key, bool required, std::string* out) {
  auto it = json.find(key);
  if (it == json.end()) return !required;
  if (!it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

bool GetInt(const Json& json, const char* key, bool required, int64_t* out) {
  auto it = json.find(key);
  if (it == json.end()) return !required;
  if (!it->is_number_integer()) return false;
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) return false;
  *out = it->get<int64_t>();
  return *out >= 0;
}

// Checks one store entry and reads its attnserve_version.json. Never follows a symlink for the
// entry itself or the files it checks.
absl::StatusOr<StoredVersion> InspectVersionDir(const std::string& store_dir,
                                                const std::string& name) {
  const std::string dir = Join(store_dir, name);
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT)
      return absl::NotFoundError(absl::StrCat("no version ", QuoteInput(name), " in ", store_dir));
    return ErrnoError(dir, "lstat", err);
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is a symlink; symlinks are not followed out of the store"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  // The loaders open more files than the ones checked below (vocab.txt, tokenizer.json,
  // 1_Pooling/, ...): none of them may lead out of the store either. The iterator does not
  // follow directory symlinks, so it sees every entry as it is.
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink(ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          it->path().string(), " is a symlink; symlinks are not followed out of the store"));
    }
  }
  if (ec) return ErrnoError(dir, "list", ec.value());
  const std::string info_path = Join(dir, kVersionInfoFile);
  absl::StatusOr<std::string> text = ReadFileNoFollow(info_path, kMaxInfoBytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat(info_path, " is missing (not a committed checkpoint)"));
    }
    return text.status();
  }
  const Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::DataLossError(absl::StrCat(info_path, " is not a JSON object"));
  }
  StoredVersion v;
  v.dir = dir;
  auto malformed = [&info_path](const char* key, const char* expected) {
    return absl::DataLossError(
        absl::StrCat(info_path, ": field '", key, "' is missing or not ", expected));
  };
  if (!GetString(json, "version", true, &v.version)) return malformed("version", "a string");
  if (v.version != name) {
    return absl::DataLossError(absl::StrCat(info_path, ": records version '",
                                            absl::CHexEscape(v.version), "' but the directory is '",
                                            name, "'"));
  }
  if (!GetInt(json, "sequence", true, &v.sequence)) {
    return malformed("sequence", "a non-negative integer");
  }
  if (!GetString(json, "created_utc", true, &v.created_utc)) {
    return malformed("created_utc", "a string");
  }
  if (!GetString(json, "base_version", false, &v.base_version)) {
    return malformed("base_version", "a string");
  }
  if (!GetString(json, "parent_dir", false, &v.parent_dir)) {
    return malformed("parent_dir", "a string");
  }
  if (!GetString(json, "objective", false, &v.objective)) {
    return malformed("objective", "a string");
  }
  if (!GetInt(json, "steps", false, &v.steps)) {
    return malformed("steps", "a non-negative integer");
  }
  if (!GetInt(json, "num_labels", false, &v.num_labels)) {
    return malformed("num_labels", "a non-negative integer");
  }
  if (auto it = json.find("label_names"); it != json.end()) {
    if (!it->is_array()) return malformed("label_names", "an array of strings");
    for (const Json& name : *it) {
      if (!name.is_string()) return malformed("label_names", "an array of strings");
      v.label_names.push_back(name.get<std::string>());
    }
    if (!v.label_names.empty() && static_cast<int64_t>(v.label_names.size()) != v.num_labels) {
      return absl::DataLossError(absl::StrCat(info_path, ": records ", v.label_names.size(),
                                              " label_names for ", v.num_labels, " labels"));
    }
  }
  // Optional: checkpoints written before the field existed have none.
  if (!GetString(json, "description", false, &v.description)) {
    return malformed("description", "a string");
  }
  if (auto it = json.find("notes"); it != json.end()) {
    if (!it->is_array()) return malformed("notes", "an array of strings");
    for (const Json& note : *it) {
      if (!note.is_string()) return malformed("notes", "an array of strings");
      v.notes.push_back(note.get<std::string>());
    }
  }
  if (auto it = json.find("final_loss"); it != json.end()) {
    if (it->is_null()) {
      v.final_loss = std::nan("");
    } else if (it->is_number()) {
      v.final_loss = it->get<double>();
    } else {
      return malformed("final_loss", "a number or null");
    }
  }
  std::vector<std::string> required = {"config.json", "model.safetensors"};
  if (v.num_labels > 0) required.push_back(kHeadFile);
  for (const std::string& file : required) {
    const std::string path = Join(dir, file);
    if (::lstat(path.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is missing"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not a regular file (symlinks are not followed)"));
    }
  }
  return v;
}

}  // namespace

absl::StatusOr<ClassificationHead> LoadStoredHead(const StoredVersion& v, int64_t hidden) {
  const std::string path = Join(v.dir, kHeadFile);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  if ((*file)->tensors().size() != 2) {
    return absl::DataLossError(absl::StrCat(path,
                                            ": expected exactly classifier.weight and "
                                            "classifier.bias, found ",
                                            (*file)->tensors().size(), " tensors"));
  }
  ClassificationHead head;
  absl::StatusOr<Tensor> weight = (*file)->ReadFloat32("classifier.weight");
  if (!weight.ok()) return weight.status();
  absl::StatusOr<Tensor> bias = (*file)->ReadFloat32("classifier.bias");
  if (!bias.ok()) return bias.status();
  head.weight = *std::move(weight);
  head.bias = *std::move(bias);
  if (absl::Status status = ValidateHead(head, hidden); !status.ok()) {
    return WithPrefix(status, absl::StrCat(path, ": "));
  }
  if (head.num_labels() != v.num_labels) {
    return absl::DataLossError(absl::StrCat(path, ": head has ", head.num_labels(), " labels but ",
                                            kVersionInfoFile, " records ", v.num_labels));
  }
  return head;
}

absl::Status ValidateVersionName(std::string_view name_view) {
  // This Abseil build's string_view is its own type, not std::string_view.
  const absl::string_view name(name_view.data(), name_view.size());
  if (name.empty()) return absl::InvalidArgumentError("version name is empty");
  if (name.size() > kMaxVersionNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "version name is ", name.size(), " characters long (at most ", kMaxVersionNameLength, ")"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "version name ", QuoteInput(std::string_view(name.data(), name.size())), " has '",
          absl::CHexEscape(name.substr(i, 1)), "' at index ", i, "; allowed: A-Z a-z 0-9 . _ -"));
    }
  }
  // Covers ".", "..", hidden and .tmp- directories, and names that read as flags.
  if (name[0] == '.' || name[0] == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("version name ", QuoteInput(std::string_view(name.data(), name.size())),
                     " must not start with '.' or '-'"));
  }
  return absl::OkStatus();
}

std::string NewVersionName(int64_t sequence, std::time_t now) {
  return absl::StrFormat("ft-%06d-%s", std::max<int64_t>(sequence, 0),
                         FormatUtc(now, "%Y%m%dT%H%M%SZ"));
}

absl::Status WriteCheckpoint(const Model& base, const BertWeights& weights,
                             const ClassificationHead* head, const CheckpointInfo& info,
                             const std::string& store_dir, const std::string& version) {
  if (absl::Status status = ValidateVersionName(version); !status.ok()) return status;
  if (info.description.size() > kMaxDescriptionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("description is ", info.description.size(),
                                                   " bytes, more than ", kMaxDescriptionBytes));
  }
  if (head != nullptr) {
    if (absl::Status status = ValidateHead(*head, base.config().hidden_size); !status.ok()) {
      return status;
    }
  }
  const int64_t labels = head != nullptr ? head->num_labels() : 0;
  if (!info.label_names.empty() && static_cast<int64_t>(info.label_names.size()) != labels) {
    return absl::InvalidArgumentError(absl::StrCat(info.label_names.size(), " label_names for ",
                                                   labels, " labels; give none or one per label"));
  }
  size_t label_name_bytes = 0;
  for (const std::string& name : info.label_names) label_name_bytes += name.size();
  if (label_name_bytes > kMaxLabelNamesBytes) {
    return absl::InvalidArgumentError(absl::StrCat("label_names total ", label_name_bytes,
                                                   " bytes, more than ", kMaxLabelNamesBytes));
  }
  std::deque<Tensor> slices;
  absl::StatusOr<std::vector<OutputTensor>> tensors = HfTensors(base.config(), weights, &slices);
  if (!tensors.ok()) return tensors.status();

  std::error_code ec;
  if (!fs::exists(store_dir, ec)) {
    fs::create_directories(store_dir, ec);
    if (ec) {
      return absl::Status(
          absl::ErrnoToStatusCode(ec.value()),
          absl::StrCat(store_dir, ": cannot create the model store: ", ec.message()));
    }
    // Make the new store directory's own entry durable.
    const fs::path parent = fs::absolute(store_dir, ec).lexically_normal().parent_path();
    if (!ec) {
      if (absl::Status status = FsyncDir(parent.string()); !status.ok()) return status;
    }
  } else if (!fs::is_directory(store_dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model store ", store_dir, " is not a directory"));
  }

  const std::string final_dir = Join(store_dir, version);
  struct stat st;
  if (::lstat(final_dir.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("version ", QuoteInput(version), " already exists in ", store_dir));
  }
  // pid + a per-process counter: no two live writers share a temp dir, so one left over under
  // the same name is from a dead process and safe to replace.
  static std::atomic<uint64_t> counter{0};
  const std::string temp_dir =
      Join(store_dir, absl::StrCat(kTempDirPrefix, version, "-", ::getpid(), "-", counter++));
  fs::remove_all(temp_dir, ec);
  if (::mkdir(temp_dir.c_str(), 0755) != 0) return ErrnoError(temp_dir, "mkdir", errno);

  absl::Status status = WriteCheckpointFiles(base, *tensors, head, info, version, temp_dir);
  if (status.ok()) status = RenameNoReplace(temp_dir, final_dir);
  if (!status.ok()) {
    fs::remove_all(temp_dir, ec);
    return status;
  }
  status = FsyncDir(store_dir);
  if (!status.ok()) {
    // The rename may not survive a crash; withdraw it so success always means durable.
    fs::remove_all(final_dir, ec);
    return status;
  }
  Log(LogLevel::kInfo, "committed version %s to %s (%d tensors%s)", version, final_dir,
      tensors->size(), head != nullptr ? " + classification head" : "");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredVersion>> ListStore(const std::string& store_dir,
                                                     std::vector<std::string>* skipped_reasons) {
  struct stat st;
  if (::stat(store_dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("model store ", store_dir, " does not exist"));
    }
    return ErrnoError(store_dir, "stat", err);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model store ", store_dir, " is not a directory"));
  }
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(store_dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat(store_dir, ": cannot list: ", ec.message()));
  }
  std::sort(names.begin(), names.end());

  std::vector<StoredVersion> versions;
  auto skip = [skipped_reasons](const std::string& name, absl::string_view why) {
    if (skipped_reasons != nullptr) {
      skipped_reasons->push_back(absl::StrCat("'", absl::CHexEscape(name), "' skipped: ", why));
    }
  };
  for (const std::string& name : names) {
    if (absl::StartsWith(name, kTempDirPrefix)) continue;  // in progress or a crash leftover
    // The store's serving state (engine/serving_state.h) and its jobs, not versions.
    if (name == kServingStateFile || name == kServingLockFile || name == kServingTempFile ||
        name == kJobsDir) {
      continue;
    }
    if (absl::Status status = ValidateVersionName(name); !status.ok()) {
      skip(name, status.message());
      continue;
    }
    absl::StatusOr<StoredVersion> version = InspectVersionDir(store_dir, name);
    if (!version.ok()) {
      skip(name, version.status().message());
      continue;
    }
    versions.push_back(*std::move(version));
  }
  std::sort(versions.begin(), versions.end(), [](const StoredVersion& a, const StoredVersion& b) {
    return a.sequence != b.sequence ? a.sequence < b.sequence : a.version < b.version;
  });
  return versions;
}

absl::StatusOr<StoredVersion> ReadStoredVersion(const std::string& store_dir,
                                                const std::string& version) {
  if (absl::Status status = ValidateVersionName(version); !status.ok()) return status;
  return InspectVersionDir(store_dir, version);
}

absl::StatusOr<int> RemoveStaleTempDirs(const std::string& store_dir) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(store_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (absl::StartsWith(it->path().filename().string(), kTempDirPrefix)) {
      stale.push_back(it->path());
    }
  }
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat(store_dir, ": cannot list: ", ec.message()));
  }
  int removed = 0;
  for (const fs::path& path : stale) {
    // remove_all removes a symlink itself, never what it points to.
    fs::remove_all(path, ec);
    if (ec) {
      return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                          absl::StrCat(path.string(), ": cannot remove: ", ec.message()));
    }
    Log(LogLevel::kInfo, "removed stale checkpoint temp dir %s", path.string());
    ++removed;
  }
  return removed;
}

absl::StatusOr<LoadedVersion> LoadStoredVersion(const StoredVersion& version,
                                                const ModelOptions& model_options) {
  const std::string prefix = absl::StrCat("version '", version.version, "': ");
  // The caller's StoredVersion may be stale; re-check that the directory is still a real
  // directory inside the store before reading from it.
  struct stat st;
  if (::lstat(version.dir.c_str(), &st) != 0) return ErrnoError(version.dir, "lstat", errno);
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, version.dir, " is not a directory (symlinks are not followed)"));
  }
  absl::StatusOr<std::shared_ptr<const Model>> model = Model::Load(version.dir, model_options);
  if (!model.ok()) return WithPrefix(model.status(), prefix);

  LoadedVersion loaded;
  loaded.info = version;
  loaded.model = *std::move(model);
  const bool has_head_file = ::lstat(Join(version.dir, kHeadFile).c_str(), &st) == 0;
  if (version.num_labels > 0) {
    absl::StatusOr<ClassificationHead> head =
        LoadStoredHead(version, loaded.model->config().hidden_size);
    if (!head.ok()) return WithPrefix(head.status(), prefix);
    loaded.head = *std::move(head);
  } else if (has_head_file) {
    return absl::DataLossError(absl::StrCat(prefix, "has ", kHeadFile, " but ", kVersionInfoFile,
                                            " records no num_labels"));
  }
  return loaded;
}

}  // namespace attn
