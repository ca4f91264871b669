#include "engine/training/training_report.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/json_file.h"
#include "engine/model_store.h"
#include "nlohmann/json.hpp"

namespace attn {

using Json = nlohmann::json;

std::vector<GroupChange> RelativeChanges(const BertWeights& initial, const BertWeights& weights,
                                         int64_t* embedding_rows_changed,
                                         double* total_relative_change) {
  const std::vector<ParameterGroup> from = ParameterGroups(initial);
  const std::vector<ParameterGroup> to = ParameterGroups(weights);
  std::vector<GroupChange> changes;
  double base_total = 0, moved_total = 0;
  for (size_t g = 0; g < to.size(); ++g) {
    const double base_squared = SquaredNorm(from[g]);
    const double moved_squared = SquaredDistance(to[g], from[g]);
    base_total += base_squared;
    moved_total += moved_squared;
    const double base = std::sqrt(base_squared), moved = std::sqrt(moved_squared);
    changes.push_back({to[g].name, to[g].kind, to[g].layer, base > 0 ? moved / base : 0.0});
  }
  if (total_relative_change != nullptr) {
    *total_relative_change = base_total > 0 ? std::sqrt(moved_total / base_total) : 0.0;
  }
  if (embedding_rows_changed != nullptr) {
    const Tensor& a = initial.word_embeddings;
    const Tensor& b = weights.word_embeddings;
    const int64_t rows = a.dim(0), H = a.dim(1);
    int64_t changed = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (std::memcmp(a.data() + r * H, b.data() + r * H, H * sizeof(float)) != 0) ++changed;
    }
    *embedding_rows_changed = changed;
  }
  return changes;
}

namespace {

// JSON has no NaN/Inf: a diverged value is written as null and read back as NaN.
Json Number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }
double ReadNumber(const Json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

std::string TrainingReportJson(const TrainingReport& report) {
  Json settings = Json::object();
  for (const auto& [name, value] : report.settings) settings[name] = value;
  // Columns, not objects per point: a 10,000-step curve stays a few hundred KB.
  Json steps = Json::array(), losses = Json::array(), rates = Json::array(), norms = Json::array();
  for (const LossPoint& p : report.loss_curve) {
    steps.push_back(p.step);
    losses.push_back(Number(p.loss));
    rates.push_back(Number(p.learning_rate));
    norms.push_back(Number(p.grad_norm));
  }
  Json changes = Json::array();
  for (const GroupChange& c : report.changes) {
    changes.push_back({{"name", c.name},
                       {"kind", c.kind},
                       {"layer", c.layer},
                       {"relative_change", Number(c.relative_change)}});
  }
  Json evaluations = Json::array();
  for (const StepEvaluation& e : report.evaluations) {
    Json metrics = Json::array();
    for (const auto& [name, value] : e.result.metrics) {
      metrics.push_back({{"name", name}, {"value", Number(value)}});
    }
    evaluations.push_back({{"step", e.step},
                           {"task", EvaluationTaskName(e.result.task)},
                           {"examples", e.result.examples},
                           {"seconds", Number(e.result.seconds)},
                           {"metrics", metrics}});
  }
  Json json = {
      {"format_version", 1},
      {"settings", settings},
      {"loss_curve",
       {{"step", steps}, {"loss", losses}, {"learning_rate", rates}, {"grad_norm", norms}}},
      {"relative_change", changes},
      {"embedding_rows_changed", report.embedding_rows_changed},
      {"total_relative_change", Number(report.total_relative_change)}};
  if (!evaluations.empty()) json["evaluations"] = evaluations;
  if (!report.promotion.empty()) json["promotion"] = report.promotion;
  return json.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

absl::StatusOr<TrainingReport> ParseTrainingReport(std::string_view text, std::string_view source) {
  absl::StatusOr<Json> parsed = ParseJsonObject(text, source);
  if (!parsed.ok()) return parsed.status();
  auto bad = [&](std::string_view what) {
    return absl::DataLossError(
        absl::StrCat(std::string(source), ": not a training report (", std::string(what), ")"));
  };
  try {
    const Json& json = *parsed;
    TrainingReport report;
    for (const auto& [name, value] : json.at("settings").items()) {
      report.settings.emplace_back(name, value.get<std::string>());
    }
    const Json& curve = json.at("loss_curve");
    const Json& steps = curve.at("step");
    const Json& losses = curve.at("loss");
    const Json& rates = curve.at("learning_rate");
    const Json& norms = curve.at("grad_norm");
    if (losses.size() != steps.size() || rates.size() != steps.size() ||
        norms.size() != steps.size()) {
      return bad("loss_curve columns of different lengths");
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      report.loss_curve.push_back({steps[i].get<int64_t>(), ReadNumber(losses[i]),
                                   ReadNumber(rates[i]), ReadNumber(norms[i])});
    }
    for (const Json& c : json.at("relative_change")) {
      report.changes.push_back({c.at("name").get<std::string>(), c.at("kind").get<std::string>(),
                                c.at("layer").get<int>(), ReadNumber(c.at("relative_change"))});
    }
    report.embedding_rows_changed = json.at("embedding_rows_changed").get<int64_t>();
    if (auto total = json.find("total_relative_change"); total != json.end()) {
      report.total_relative_change = ReadNumber(*total);
    }
    if (auto evaluations = json.find("evaluations"); evaluations != json.end()) {
      for (const Json& e : *evaluations) {
        StepEvaluation& point = report.evaluations.emplace_back();
        point.step = e.at("step").get<int64_t>();
        if (!ParseEvaluationTask(e.at("task").get<std::string>(), &point.result.task)) {
          return bad("unknown evaluation task");
        }
        point.result.examples = e.at("examples").get<int64_t>();
        point.result.seconds = ReadNumber(e.at("seconds"));
        for (const Json& m : e.at("metrics")) {
          point.result.metrics.emplace_back(m.at("name").get<std::string>(),
                                            ReadNumber(m.at("value")));
        }
      }
    }
    if (auto promotion = json.find("promotion"); promotion != json.end()) {
      report.promotion = promotion->get<std::string>();
    }
    return report;
  } catch (const Json::exception& e) {
    return bad(e.what());
  }
}

absl::StatusOr<TrainingReport> ReadTrainingReport(const std::string& store_dir,
                                                  const std::string& version) {
  absl::StatusOr<StoredVersion> stored = ReadStoredVersion(store_dir, version);
  if (!stored.ok()) return stored.status();
  const std::string path = JoinPath(stored->dir, kTrainingReportFile);
  absl::StatusOr<std::optional<std::string>> text = ReadFileIfExists(path);
  if (!text.ok()) return text.status();
  if (!text->has_value()) {
    return absl::NotFoundError(
        absl::StrCat("version ", version,
                     " has no training report (it was committed before reports were "
                     "recorded)"));
  }
  return ParseTrainingReport(**text, path);
}

}  // namespace attn
