#include "client/training_data.h"

#include <openssl/sha.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/training/epoch_order.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "nlohmann/json.hpp"

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;
using Json = nlohmann::json;

// If `line` holds a bare NaN / Infinity / -Infinity (Python's json.dumps writes them; JSON has
// no such numbers), the key it belongs to ("" if none) and the literal.
std::optional<std::pair<std::string, std::string>> FindNonFiniteLiteral(absl::string_view line) {
  std::string last_string, key;
  bool in_string = false, escaped = false;
  std::string current;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        last_string = current;
      } else {
        current.push_back(c);
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      current.clear();
    } else if (c == ':') {
      key = last_string;
    } else {
      for (const char* literal : {"NaN", "Infinity", "-Infinity"}) {
        if (absl::StartsWith(line.substr(i), literal)) return std::make_pair(key, literal);
      }
    }
  }
  return std::nullopt;
}

// "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." ->
// "syntax error ...".
std::string ShortParseError(const std::string& what) {
  const size_t column = what.find("column ");
  if (column != std::string::npos) {
    const size_t colon = what.find(": ", column);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  const size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

const char* TypeName(const Json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  return "an object";
}

const char* ObjectiveFields(v1::Objective objective) {
  switch (objective) {
    case v1::CONTRASTIVE:
      return R"({"anchor": "...", "positive": "...", "negative": "..." (optional)})";
    case v1::COSINE_SIMILARITY:
      return R"({"first": "...", "second": "...", "score": 0.8})";
    case v1::CLASSIFICATION:
      return R"({"text": "...", "label": 2})";
    case v1::PAIR_CLASSIFICATION:
      return R"({"first": "...", "second": "...", "label": 1})";
    default:
      return "";
  }
}

// The --objective value whose fields `json` has ("anchor"+"positive", "first"+"second",
// "text"+"label"), or OBJECTIVE_UNSPECIFIED.
v1::Objective ObjectiveOfFields(const Json& json) {
  if (!json.is_object()) return v1::OBJECTIVE_UNSPECIFIED;
  if (json.contains("anchor") && json.contains("positive")) return v1::CONTRASTIVE;
  if (json.contains("first") && json.contains("second")) {
    return json.contains("label") && !json.contains("score") ? v1::PAIR_CLASSIFICATION
                                                             : v1::COSINE_SIMILARITY;
  }
  if (json.contains("text") && json.contains("label")) return v1::CLASSIFICATION;
  return v1::OBJECTIVE_UNSPECIFIED;
}

class LineChecker {
 public:
  LineChecker(const Json& object, std::vector<std::string>* problems)
      : object_(object), problems_(problems) {}

  // A required (or, with `optional`, possibly absent or null) non-empty string field.
  std::optional<std::string> String(const char* field, bool optional = false) {
    const auto it = object_.find(field);
    if (it == object_.end() || (optional && it->is_null())) {
      if (!optional) problems_->push_back(absl::StrFormat("missing field \"%s\"", field));
      return std::nullopt;
    }
    if (!it->is_string()) {
      problems_->push_back(
          absl::StrFormat("\"%s\" must be a string, not %s", field, TypeName(*it)));
      return std::nullopt;
    }
    std::string value = it->get<std::string>();
    if (absl::StripAsciiWhitespace(value).empty()) {
      problems_->push_back(absl::StrFormat("\"%s\" is empty", field));
      return std::nullopt;
    }
    return value;
  }

  const Json* Field(const char* field) {
    const auto it = object_.find(field);
    if (it == object_.end()) {
      problems_->push_back(absl::StrFormat("missing field \"%s\"", field));
      return nullptr;
    }
    return &*it;
  }

 private:
  const Json& object_;
  std::vector<std::string>* problems_;
};

// The "label" field of a classification line: an integer class index below --num-labels.
void CheckLabel(LineChecker& check, const DataLimits& limits, v1::TrainingExample* example,
                std::vector<std::string>* problems) {
  if (const Json* label = check.Field("label"); label != nullptr) {
    if (label->is_number_float() || !label->is_number()) {
      problems->push_back(
          absl::StrFormat("\"label\" must be an integer class index, not %s",
                          label->is_number_float() ? "a fraction" : TypeName(*label)));
    } else if (label->is_number_integer() && !label->is_number_unsigned() &&
               label->get<int64_t>() < 0) {
      problems->push_back(absl::StrFormat("\"label\" is negative (%d)", label->get<int64_t>()));
    } else {
      const uint64_t value = label->get<uint64_t>();
      if (limits.num_labels > 0 && value >= static_cast<uint64_t>(limits.num_labels)) {
        problems->push_back(
            absl::StrFormat("\"label\" %d is not below --num-labels %d", value, limits.num_labels));
      } else if (value > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        problems->push_back(absl::StrFormat("\"label\" %d is too large", value));
      } else {
        example->set_label(static_cast<int32_t>(value));
      }
    }
  }
}

// Checks one parsed line; appends its problems (without the "file:line: " prefix).
void CheckExample(const Json& json, v1::Objective objective, const DataLimits& limits,
                  v1::TrainingExample* example, bool* has_negative,
                  std::vector<std::string>* problems) {
  if (!json.is_object()) {
    problems->push_back(absl::StrFormat("expected a JSON object like %s, got %s",
                                        ObjectiveFields(objective), TypeName(json)));
    return;
  }
  LineChecker check(json, problems);
  switch (objective) {
    case v1::CONTRASTIVE: {
      auto anchor = check.String("anchor");
      auto positive = check.String("positive");
      auto negative = check.String("negative", /*optional=*/true);
      if (anchor) example->set_anchor(*anchor);
      if (positive) example->set_positive(*positive);
      if (negative) example->set_negative(*negative);
      *has_negative = negative.has_value();
      break;
    }
    case v1::COSINE_SIMILARITY: {
      auto first = check.String("first");
      auto second = check.String("second");
      if (first) example->set_first(*first);
      if (second) example->set_second(*second);
      if (const Json* score = check.Field("score"); score != nullptr) {
        if (!score->is_number()) {
          problems->push_back(
              absl::StrFormat("\"score\" must be a number, not %s", TypeName(*score)));
        } else {
          const double value = score->get<double>();
          if (!std::isfinite(value)) {
            problems->push_back("\"score\" is not a finite number");
          } else if (value < -1.0 || value > 1.0) {
            problems->push_back(absl::StrFormat(
                "\"score\" %g is outside [-1, 1] (it is compared with a cosine similarity; "
                "rescale e.g. 0-5 STS scores to [0, 1])",
                value));
          } else {
            example->set_score(static_cast<float>(value));
          }
        }
      }
      break;
    }
    case v1::CLASSIFICATION: {
      auto text = check.String("text");
      if (text) example->set_text(*text);
      CheckLabel(check, limits, example, problems);
      break;
    }
    case v1::PAIR_CLASSIFICATION: {
      auto first = check.String("first");
      auto second = check.String("second");
      if (first) example->set_first(*first);
      if (second) example->set_second(*second);
      CheckLabel(check, limits, example, problems);
      break;
    }
    default:
      problems->push_back("no objective chosen");
  }
}

}  // namespace

const char* ObjectiveFlagName(v1::Objective objective) {
  switch (objective) {
    case v1::CONTRASTIVE:
      return "contrastive";
    case v1::COSINE_SIMILARITY:
      return "cosine";
    case v1::CLASSIFICATION:
      return "classification";
    case v1::PAIR_CLASSIFICATION:
      return "pair_classification";
    default:
      return "";
  }
}

namespace {

// A file's problems, "<name>:<line>: <what>", up to `max` of them and a count of the rest.
class Problems {
 public:
  Problems(absl::string_view name, int max) : name_(name), max_(max) {}

  void Report(int line, const std::string& message) {
    ++total_;
    if (static_cast<int>(lines_.size()) < max_) {
      lines_.push_back(absl::StrFormat("%s:%d: %s", name_, line, message));
    }
  }
  // A problem of the whole file, said first.
  void ReportFirst(const std::string& message) { lines_.insert(lines_.begin(), message); }
  // InvalidArgument with every problem, one per line; OK when there were none.
  absl::Status Status() const {
    std::vector<std::string> lines = lines_;
    const int reported = static_cast<int>(std::min<size_t>(lines_.size(), max_));
    if (total_ > reported) {
      lines.push_back(absl::StrFormat("%s: ... and %d more problems", name_, total_ - reported));
    }
    if (lines.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }

 private:
  std::string name_;
  int max_;
  int total_ = 0;
  std::vector<std::string> lines_;
};

// Calls `each(line_number, json)` for every non-blank line of `text` that is JSON (a BOM and
// CRLF line ends allowed); lines that are not JSON go to `problems`.
template <typename Each>
void ForEachJsonLine(absl::string_view text, Problems* problems, Each each) {
  int line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_number == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);  // BOM
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    Json json;
    try {
      json = Json::parse(line.begin(), line.end());
    } catch (const Json::parse_error& e) {
      if (auto literal = FindNonFiniteLiteral(line)) {
        const std::string what = literal->first.empty() ? std::string("a value")
                                                        : absl::StrCat("\"", literal->first, "\"");
        problems->Report(line_number,
                         absl::StrFormat("%s is %s, not a finite number (JSON has no %s)", what,
                                         literal->second, literal->second));
      } else {
        problems->Report(line_number, absl::StrFormat("bad JSON at column %d: %s", e.byte,
                                                      ShortParseError(e.what())));
      }
      continue;
    } catch (const Json::exception& e) {
      problems->Report(line_number, absl::StrCat("bad JSON: ", ShortParseError(e.what())));
      continue;
    }
    each(line_number, json);
  }
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", path));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", path));
  }
  return buffer.str();
}

}  // namespace

absl::StatusOr<TrainingData> ParseTrainingData(absl::string_view text, v1::Objective objective,
                                               absl::string_view name, const DataLimits& limits) {
  TrainingData data;
  data.objective = objective;
  Problems problems(name, limits.max_errors);
  // Contrastive negatives: all or none. The first example decides; later ones must agree.
  int negatives_decided_by = 0;
  // Lines written for another objective: said once for the file, not once per line.
  int other_objective_lines = 0, first_other_line = 0, object_lines = 0;
  v1::Objective other_objective = v1::OBJECTIVE_UNSPECIFIED;
  ForEachJsonLine(text, &problems, [&](int line_number, const Json& json) {
    object_lines += json.is_object();
    if (const v1::Objective fields = ObjectiveOfFields(json);
        fields != v1::OBJECTIVE_UNSPECIFIED && fields != objective &&
        objective != v1::OBJECTIVE_UNSPECIFIED) {
      if (other_objective_lines++ == 0) {
        first_other_line = line_number;
        other_objective = fields;
      }
      return;
    }
    v1::TrainingExample example;
    bool has_negative = false;
    std::vector<std::string> line_problems;
    CheckExample(json, objective, limits, &example, &has_negative, &line_problems);
    if (line_problems.empty() && objective == v1::CONTRASTIVE) {
      if (negatives_decided_by == 0) {
        negatives_decided_by = line_number;
        data.has_negatives = has_negative;
      } else if (has_negative != data.has_negatives) {
        line_problems.push_back(absl::StrFormat(
            "%s \"negative\" but line %d %s: give a negative on every line or on none",
            has_negative ? "has a" : "has no", negatives_decided_by,
            data.has_negatives ? "has one" : "does not"));
      }
    }
    if (!line_problems.empty()) {
      problems.Report(line_number, absl::StrJoin(line_problems, "; "));
      return;
    }
    if (objective == v1::CLASSIFICATION || objective == v1::PAIR_CLASSIFICATION)
      data.max_label = std::max(data.max_label, example.label());
    data.examples.push_back(std::move(example));
  });
  if (other_objective_lines > 0) {
    problems.ReportFirst(absl::StrFormat(
        "%s: this looks like %s data: %d of %d lines (the first is line %d) have "
        "the fields %s, not those of --objective %s, %s; pass --objective %s%s",
        name, ObjectiveFlagName(other_objective), other_objective_lines, object_lines,
        first_other_line, ObjectiveFields(other_objective), ObjectiveFlagName(objective),
        ObjectiveFields(objective), ObjectiveFlagName(other_objective),
        other_objective_lines < object_lines ? " or fix those lines" : ""));
  }
  if (absl::Status status = problems.Status(); !status.ok()) return status;
  if (data.examples.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: no examples (one JSON object per line, like %s)", name, ObjectiveFields(objective)));
  }
  return data;
}

namespace {

constexpr char kRetrievalFields[] =
    R"({"query": "...", "item": "..."} (the item relevant to the query), or {"item": "..."} (one more corpus item))";

// The retrieval format: each query with its relevant item; the corpus is every distinct item in
// order of first appearance.
absl::StatusOr<v1::EvaluationSet> ParseRetrievalData(absl::string_view text, absl::string_view name,
                                                     int max_errors) {
  v1::EvaluationSet set;
  set.set_task(v1::EVALUATION_RETRIEVAL);
  std::map<std::string, int> item_index;
  Problems problems(name, max_errors);
  ForEachJsonLine(text, &problems, [&](int line_number, const Json& json) {
    if (!json.is_object()) {
      problems.Report(line_number, absl::StrFormat("expected a JSON object like %s, got %s",
                                                   kRetrievalFields, TypeName(json)));
      return;
    }
    std::vector<std::string> line_problems;
    LineChecker check(json, &line_problems);
    std::optional<std::string> query = check.String("query", /*optional=*/true);
    std::optional<std::string> item = check.String("item");
    if (!line_problems.empty()) {
      problems.Report(line_number, absl::StrJoin(line_problems, "; "));
      return;
    }
    auto [it, added] = item_index.emplace(*item, set.corpus_size());
    if (added) set.add_corpus(*item);
    if (query) {
      set.add_queries(*query);
      set.add_relevant(it->second);
    }
  });
  if (absl::Status status = problems.Status(); !status.ok()) return status;
  if (set.queries_size() == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: no queries (one JSON object per line, like %s)", name, kRetrievalFields));
  }
  return set;
}

// The task of an evaluation file, from the fields of its first JSON object.
v1::EvaluationTask DetectEvaluationTask(absl::string_view text, v1::Objective* objective) {
  v1::EvaluationTask task = v1::EVALUATION_TASK_UNSPECIFIED;
  bool decided = false;
  Problems ignored("", 0);
  ForEachJsonLine(text, &ignored, [&](int, const Json& json) {
    if (decided || !json.is_object()) return;
    decided = true;
    if (json.contains("query") || (json.contains("item") && json.size() == 1)) {
      task = v1::EVALUATION_RETRIEVAL;
      return;
    }
    *objective = ObjectiveOfFields(json);
    switch (*objective) {
      case v1::CONTRASTIVE:
        task = v1::EVALUATION_RETRIEVAL;
        break;
      case v1::COSINE_SIMILARITY:
        task = v1::EVALUATION_COSINE_SIMILARITY;
        break;
      case v1::CLASSIFICATION:
        task = v1::EVALUATION_CLASSIFICATION;
        break;
      case v1::PAIR_CLASSIFICATION:
        task = v1::EVALUATION_PAIR_CLASSIFICATION;
        break;
      default:
        break;
    }
  });
  return task;
}

}  // namespace

absl::StatusOr<v1::EvaluationSet> ParseEvaluationData(absl::string_view text,
                                                      absl::string_view name,
                                                      const DataLimits& limits) {
  v1::Objective objective = v1::OBJECTIVE_UNSPECIFIED;
  const v1::EvaluationTask task = DetectEvaluationTask(text, &objective);
  if (task == v1::EVALUATION_TASK_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: cannot tell what to evaluate from its first JSON object; give one object per line, "
        "either retrieval %s, or the training format of an objective: %s, %s, %s or %s",
        name, kRetrievalFields, ObjectiveFields(v1::CONTRASTIVE),
        ObjectiveFields(v1::COSINE_SIMILARITY), ObjectiveFields(v1::CLASSIFICATION),
        ObjectiveFields(v1::PAIR_CLASSIFICATION)));
  }
  if (objective == v1::OBJECTIVE_UNSPECIFIED) {
    return ParseRetrievalData(text, name, limits.max_errors);
  }
  absl::StatusOr<TrainingData> data = ParseTrainingData(text, objective, name, limits);
  if (!data.ok()) return data.status();
  v1::EvaluationSet set;
  set.set_task(task);
  if (objective != v1::CONTRASTIVE) {
    for (v1::TrainingExample& example : data->examples) *set.add_examples() = std::move(example);
    return set;
  }
  // Contrastive pairs as retrieval: each anchor retrieves its positive among every positive
  // and negative of the file.
  std::map<std::string, int> item_index;
  auto add_item = [&](const std::string& item) {
    auto [it, added] = item_index.emplace(item, set.corpus_size());
    if (added) set.add_corpus(item);
    return it->second;
  };
  for (const v1::TrainingExample& example : data->examples) {
    set.add_queries(example.anchor());
    set.add_relevant(add_item(example.positive()));
    if (!example.negative().empty()) add_item(example.negative());
  }
  return set;
}

absl::StatusOr<v1::EvaluationSet> ReadEvaluationData(const std::string& path,
                                                     const DataLimits& limits) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  return ParseEvaluationData(*text, path, limits);
}

absl::StatusOr<TrainingData> ReadTrainingData(const std::string& path, v1::Objective objective,
                                              const DataLimits& limits) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  return ParseTrainingData(*text, objective, path, limits);
}

JobDataset EncodeJobDataset(const std::vector<attnserve::v1::TrainingExample>& examples) {
  JobDataset dataset;
  {
    google::protobuf::io::StringOutputStream out(&dataset.bytes);
    for (const attnserve::v1::TrainingExample& example : examples) {
      google::protobuf::util::SerializeDelimitedToZeroCopyStream(example, &out);
    }
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(dataset.bytes.data()), dataset.bytes.size(),
         digest);
  std::string hex;
  for (unsigned char byte : digest) absl::StrAppendFormat(&hex, "%02x", byte);
  dataset.info.set_bytes(static_cast<int64_t>(dataset.bytes.size()));
  dataset.info.set_examples(static_cast<int64_t>(examples.size()));
  dataset.info.set_sha256(hex);
  return dataset;
}

int64_t StepsPerEpoch(size_t examples, int batch_size) {
  return attn::StepsPerEpoch(examples, batch_size);
}

std::vector<size_t> EpochOrder(size_t n, uint64_t seed, int epoch) {
  return attn::EpochOrder(n, seed, epoch);
}

}  // namespace attn::client
