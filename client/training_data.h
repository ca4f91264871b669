// Fine-tuning data for attnserve.v1.Trainer: JSON Lines files checked line by line before any
// connection is made, and the per-epoch shuffled batch order.
//
// One JSON object per line; blank lines are skipped and fields other than these are ignored:
//   CONTRASTIVE        {"anchor": "...", "positive": "...", "negative": "..."}  (negative
//                      optional, but on every line or on none: a batch has all or none)
//   COSINE_SIMILARITY  {"first": "...", "second": "...", "score": 0.8}  (finite, in [-1, 1])
//   CLASSIFICATION     {"text": "...", "label": 2}  (an integer >= 0, < num_labels if given)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/trainer.pb.h"

namespace attn::client {

struct TrainingData {
  attnserve::v1::Objective objective = attnserve::v1::OBJECTIVE_UNSPECIFIED;
  std::vector<attnserve::v1::TrainingExample> examples;
  // CONTRASTIVE: every example has a hard negative.
  bool has_negatives = false;
  // CLASSIFICATION: the largest label seen (-1 for no examples).
  int32_t max_label = -1;
};

struct DataLimits {
  // CLASSIFICATION: labels must be < num_labels; 0 = no upper bound.
  int32_t num_labels = 0;
  // Problems reported before giving up (the message then says how many more there were).
  int max_errors = 10;
};

// The objective as attnctl's --objective spells it ("contrastive", "cosine", "classification";
// "" for none).
const char* ObjectiveFlagName(attnserve::v1::Objective objective);

// Parses and checks JSON Lines `text` for `objective`. Every problem is reported as
// "<name>:<line>: <what>" (1-based lines), one per line of the InvalidArgument message, up to
// limits.max_errors. A file without examples is InvalidArgument too.
absl::StatusOr<TrainingData> ParseTrainingData(absl::string_view text,
                                               attnserve::v1::Objective objective,
                                               absl::string_view name, const DataLimits& limits);

// Reads `path` and parses it as above. An unreadable file keeps its errno's code (NotFound,
// PermissionDenied, ...) with a message naming the path.
absl::StatusOr<TrainingData> ReadTrainingData(const std::string& path,
                                              attnserve::v1::Objective objective,
                                              const DataLimits& limits);

// Evaluation data (a fine-tuning job's --eval-data, attnctl eval --data): JSON Lines in one of
//   retrieval            {"query": "...", "item": "..."}: the query's relevant item; a line
//                        {"item": "..."} alone adds a distractor. The corpus is every distinct
//                        item, in order of first appearance.
//   contrastive pairs    read as retrieval: each anchor is a query, its positive the relevant
//                        item, every positive and negative of the file the corpus
//   cosine similarity,   the training formats of those objectives (above)
//   (pair) classification
// The format is told from the fields of the first JSON object; every line is checked as
// ParseTrainingData checks training data.
absl::StatusOr<attnserve::v1::EvaluationSet> ParseEvaluationData(absl::string_view text,
                                                                 absl::string_view name,
                                                                 const DataLimits& limits);
absl::StatusOr<attnserve::v1::EvaluationSet> ReadEvaluationData(const std::string& path,
                                                                const DataLimits& limits);

// A server-side job's dataset as CreateJob uploads it: the examples in protobuf's delimited
// format (each preceded by its size as a varint), with their size, count and SHA-256.
struct JobDataset {
  std::string bytes;
  attnserve::v1::DatasetInfo info;
};
JobDataset EncodeJobDataset(const std::vector<attnserve::v1::TrainingExample>& examples);

// Optimisation steps per epoch: ceil(examples / batch_size); the last batch may be smaller.
int64_t StepsPerEpoch(size_t examples, int batch_size);

// The order examples are visited in epoch `epoch` (0-based): a permutation of [0, n) from a
// Fisher-Yates shuffle with a generator seeded by (seed, epoch) only, so a run is reproducible
// and independent of the standard library. The same order as a server-side job's
// (engine/training/epoch_order.h, header-only: the client links no engine code).
std::vector<size_t> EpochOrder(size_t n, uint64_t seed, int epoch);

}  // namespace attn::client
