// A fine-tuning job's report, stored with the version it committed (<version>/
// training_report.json, written in the same atomic checkpoint): the job's settings, the loss
// curve, how far each parameter group moved from the weights the job started from, and its
// evaluations with the promotion decision.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parameter_groups.h"
#include "engine/training/evaluate_encoder.h"
#include "engine/training/losses.h"

namespace attn {

inline constexpr char kTrainingReportFile[] = "training_report.json";

struct LossPoint {
  int64_t step = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;  // before clipping
};

struct GroupChange {
  std::string name, kind;  // ParameterGroup's
  int layer = -1;
  double relative_change = 0;  // ‖W − W₀‖ / ‖W₀‖
};

// An evaluation of the job's weights after `step` steps (0: the base version).
struct StepEvaluation {
  int64_t step = 0;
  EvaluationResult result;  // per_example is not stored
};

struct TrainingReport {
  // The job's settings as "name": value pairs (objective, learning_rate, parameters, ...).
  std::vector<std::pair<std::string, std::string>> settings;
  std::vector<LossPoint> loss_curve;   // one point per step
  std::vector<GroupChange> changes;    // ParameterGroups order
  int64_t embedding_rows_changed = 0;  // word-embedding rows that differ from W₀
  // ‖W − W₀‖/‖W₀‖ over every encoder parameter together: how far the version is from its base.
  double total_relative_change = 0;
  // The job's evaluation set scored on the base, every eval_every steps and on the committed
  // weights (empty without an evaluation set).
  std::vector<StepEvaluation> evaluations;
  // Whether the commit promoted the version, and why ("staged: the gate recall@1>=0.8 failed:
  // recall@1 0.72"); empty in reports written before promotion gates existed.
  std::string promotion;
};

// ‖W − W₀‖/‖W₀‖ per parameter group (double sums), and the count of word-embedding rows that
// differ. (A job's head is new: it has no W₀ in the base, so it is not in the table.)
// `total_relative_change` (may be null): the same over all groups together.
std::vector<GroupChange> RelativeChanges(const BertWeights& initial, const BertWeights& weights,
                                         int64_t* embedding_rows_changed,
                                         double* total_relative_change = nullptr);

std::string TrainingReportJson(const TrainingReport& report);
// InvalidArgument/DataLoss naming `source` for a file that is not a report.
absl::StatusOr<TrainingReport> ParseTrainingReport(std::string_view text, std::string_view source);

// The report of `version` in `store_dir`: NotFound naming the version when it is not in the
// store, or when it has no report (loaded from a directory, or committed before reports
// existed); DataLoss when the file is damaged.
absl::StatusOr<TrainingReport> ReadTrainingReport(const std::string& store_dir,
                                                  const std::string& version);

}  // namespace attn
