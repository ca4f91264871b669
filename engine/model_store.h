// The model store: fine-tuned versions as Hugging Face directories under one store directory.
//
//   <store>/<version>/model.safetensors        every encoder tensor under its HF name (F32)
//                    config.json               the base's, verbatim
//                    vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
//                    modules.json, sentence_bert_config.json, config_sentence_transformers.json,
//                    1_Pooling/config.json     copied from the base (whichever exist)
//                    head.safetensors          classifier.weight (K, H), classifier.bias (K)
//                                              (classification fine-tunes only)
//                    training_report.json      settings, loss curve, per-matrix change
//                                              (fine-tunes that recorded one)
//                    attnserve_version.json    {version, base_version, parent_dir, created_utc,
//                                               objective, steps, final_loss, sequence,
//                                               num_labels, description, format_version}
//   <store>/.tmp-<version>-<pid>/              a checkpoint being written (or a crash leftover)
//   <store>/jobs/                              server-side fine-tuning jobs
//                                              (server/core/job_runner.h), not a version
//
// A version directory appears in one rename() of a complete, fsynced temp directory, so a
// reader sees either nothing or the whole checkpoint, also after a crash or power loss.
// model.safetensors omits `embeddings.position_ids` (an I64 buffer; the writer is F32-only and
// transformers rebuilds it) and the `pooler` (the engine does not load it; transformers then
// initialises a fresh pooler, which sentence embeddings never use).
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/training/losses.h"
#include "engine/weights.h"

namespace attn {

inline constexpr char kVersionInfoFile[] = "attnserve_version.json";
inline constexpr char kHeadFile[] = "head.safetensors";
inline constexpr char kTempDirPrefix[] = ".tmp-";
inline constexpr char kJobsDir[] = "jobs";
inline constexpr size_t kMaxVersionNameLength = 64;
// attnserve_version.json must stay far below the reader's 1 MiB cap, or a committed version
// would be skipped at the next start.
inline constexpr size_t kMaxDescriptionBytes = 4096;
// The same for a classification job's label names, all together.
inline constexpr size_t kMaxLabelNamesBytes = 64 * 1024;

// 1-64 chars of [A-Za-z0-9._-], not starting with '.' or '-' (so never ".", "..", a hidden or
// temp dir, or something that reads as a flag). With no '/' a name cannot leave the store.
// InvalidArgument naming the problem otherwise.
absl::Status ValidateVersionName(std::string_view name);

// "ft-000012-20261122T041900Z": the sequence first so names sort in commit order (up to
// 999999; ListStore sorts by the recorded sequence anyway), then the UTC time. sequence < 0 is
// treated as 0.
std::string NewVersionName(int64_t sequence, std::time_t now = std::time(nullptr));

// What the caller knows about a fine-tune; recorded in attnserve_version.json.
struct CheckpointInfo {
  std::string base_version;  // the version that was fine-tuned ("" for the embedded default)
  std::string objective;     // e.g. "contrastive", "cosine_similarity", "classification"
  // Names of the head's classes (empty, or one per label): what Classify answers with.
  std::vector<std::string> label_names;
  int64_t steps = 0;
  double final_loss = 0;           // non-finite values are recorded as null
  int64_t sequence = 0;            // commit counter; ListStore orders by it
  std::string description;         // the committer's free text (CommitRequest.description)
  std::vector<std::string> notes;  // the server's warnings about the job (degenerate batches)
  // Written as training_report.json (engine/training/training_report.h) when not empty.
  std::string training_report_json;
};

// Writes `weights` (+ `head`, may be null) as the new version `version` in `store_dir`,
// atomically: everything goes into <store>/.tmp-<version>-<pid>, each file and directory is
// fsynced, then the temp dir is renamed to <store>/<version> and the store dir fsynced. The
// store dir is created if missing. Config and tokenizer files are copied from
// base.model_dir(); `weights` must have the base config's shapes.
// Errors: InvalidArgument (bad name, wrong shapes, description over kMaxDescriptionBytes),
// AlreadyExists (version exists), or the errno's code with a message naming the file and
// strerror (disk full, permissions). On any error the temp dir is removed and the store is as
// before.
absl::Status WriteCheckpoint(const Model& base, const BertWeights& weights,
                             const ClassificationHead* head, const CheckpointInfo& info,
                             const std::string& store_dir, const std::string& version);

// A committed version as recorded in its attnserve_version.json.
struct StoredVersion {
  std::string version;
  std::string dir;  // <store>/<version>
  int64_t sequence = 0;
  std::string created_utc;  // "2026-11-22T04:19:00Z"
  std::string base_version;
  std::string parent_dir;  // model_dir() of the model that was fine-tuned
  std::string objective;
  int64_t steps = 0;
  double final_loss = 0;                 // NaN if recorded as null
  int64_t num_labels = 0;                // > 0: the version has a classification head
  std::vector<std::string> label_names;  // empty, or num_labels names
  std::string description;               // "" if none was given (or the file predates the field)
  std::vector<std::string> notes;        // empty if none (or the file predates the field)
};

// Committed versions in `store_dir`, sorted by sequence (then name). `.tmp-*` entries are
// ignored. Entries that are not versions are skipped, each with a reason appended to
// `skipped_reasons` (may be null): invalid name, symlink (never followed out of the store),
// not a directory, missing/malformed attnserve_version.json, a version field that differs from
// the directory name, missing config.json or model.safetensors.
// NotFound if `store_dir` does not exist (a fresh store: callers may treat it as empty).
absl::StatusOr<std::vector<StoredVersion>> ListStore(const std::string& store_dir,
                                                     std::vector<std::string>* skipped_reasons);

// One version's attnserve_version.json, with the same checks as ListStore (the reason becomes
// the error: NotFound if absent, else FailedPrecondition/DataLoss).
absl::StatusOr<StoredVersion> ReadStoredVersion(const std::string& store_dir,
                                                const std::string& version);

// Removes `.tmp-*` entries (crash leftovers) without following symlinks; returns how many.
// Call only while nothing is writing into this store (e.g. at server start): an in-progress
// WriteCheckpoint's temp dir would be removed too.
absl::StatusOr<int> RemoveStaleTempDirs(const std::string& store_dir);

struct LoadedVersion {
  std::shared_ptr<const Model> model;
  std::optional<ClassificationHead> head;  // set iff info.num_labels > 0
  StoredVersion info;
};

// A version's head.safetensors (the version must have num_labels > 0), checked against
// `hidden` (the model's hidden size) and the recorded num_labels: DataLoss naming the file when
// it does not match.
absl::StatusOr<ClassificationHead> LoadStoredHead(const StoredVersion& version, int64_t hidden);

// Model::Load(version.dir, model_options) plus head.safetensors when the version has a head.
// Any loader error (truncated or corrupted file, wrong shapes) is returned with its code and
// message, prefixed with the version name; nothing half-loaded is ever returned.
absl::StatusOr<LoadedVersion> LoadStoredVersion(const StoredVersion& version,
                                                const ModelOptions& model_options = {});

}  // namespace attn
