#include "bench/bench_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "oneapi/dnnl/dnnl.h"

namespace attn::bench {
namespace {

absl::StatusOr<std::vector<SequenceInput>> ParseSequences(const nlohmann::json& list,
                                                          const std::string& what) {
  if (!list.is_array()) return absl::InvalidArgumentError(what + " is not a list");
  std::vector<SequenceInput> sequences;
  sequences.reserve(list.size());
  for (const nlohmann::json& ids : list) {
    if (!ids.is_array() || ids.empty()) {
      return absl::InvalidArgumentError(what + " holds an empty or non-list sequence");
    }
    SequenceInput& seq = sequences.emplace_back();
    seq.token_ids = ids.get<std::vector<int32_t>>();
  }
  return sequences;
}

void WriteLine(const nlohmann::json& reply) {
  std::cout << reply.dump() << std::endl;  // endl: the harness waits for each line
}

}  // namespace

absl::StatusOr<std::map<std::string, Workload>> LoadWorkloads(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("workloads") || !doc["workloads"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"workloads\" object"));
  }
  std::map<std::string, Workload> workloads;
  for (const auto& [name, spec] : doc["workloads"].items()) {
    Workload& workload = workloads[name];
    const std::string where = absl::StrCat(path, ": workloads.", name);
    for (auto [key, target] :
         {std::pair{"sequences", &workload.sequences}, std::pair{"anchors", &workload.anchors},
          std::pair{"positives", &workload.positives}}) {
      if (!spec.contains(key)) continue;
      absl::StatusOr<std::vector<SequenceInput>> parsed =
          ParseSequences(spec[key], absl::StrCat(where, ".", key));
      if (!parsed.ok()) return parsed.status();
      *target = *std::move(parsed);
    }
    if (workload.anchors.size() != workload.positives.size()) {
      return absl::InvalidArgumentError(where + ": anchors and positives differ in count");
    }
  }
  return workloads;
}

int RunWorker(const nlohmann::json& ready, const CommandHandler& handle) {
  WriteLine(ready);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json command = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (command.is_discarded() || !command.is_object() || !command.contains("cmd")) {
      WriteLine({{"error", "expected a JSON object with \"cmd\", got: " + line}});
      continue;
    }
    if (command["cmd"] == "quit") {
      WriteLine({{"bye", true}});
      return 0;
    }
    absl::StatusOr<nlohmann::json> reply;
    try {
      reply = handle(command);
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
      reply = absl::InvalidArgumentError(e.what());
    }
    WriteLine(reply.ok() ? *reply
                         : nlohmann::json{{"error", std::string(reply.status().message())}});
  }
  return 0;
}

absl::StatusOr<double> TimeOnce(const std::function<absl::Status()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = fn();
  const auto stop = std::chrono::steady_clock::now();
  if (!status.ok()) return status;
  return std::chrono::duration<double>(stop - start).count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return (values[(n - 1) / 2] + values[n / 2]) / 2;
}

std::string OneDnnVersion() {
  const dnnl_version_t* version = dnnl_version();
  return absl::StrFormat("oneDNN %d.%d.%d", version->major, version->minor, version->patch);
}

}  // namespace attn::bench
