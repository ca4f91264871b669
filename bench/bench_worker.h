// What attn-bench-engine and attn-bench-train share: the workloads file written by
// bench/harness.py and the JSON-lines worker protocol the harness drives them with.
//
// Worker protocol: the harness starts the binary with --worker; it prints one JSON line
// ({"ready": true, ...} or {"error": ...}), then answers each JSON line on stdin with exactly
// one JSON line on stdout until {"cmd": "quit"} or end of input. A command that fails answers
// {"error": "..."} and the worker keeps going. Keeping the process (and its primitive caches)
// alive lets the harness interleave single timed runs of every engine, A/B/A/B.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "nlohmann/json.hpp"

namespace attn::bench {

// One named input set. Inference workloads use `sequences`; the fine-tuning workload uses
// `anchors` and `positives` (same count). Every sequence already has [CLS]/[SEP].
struct Workload {
  std::vector<SequenceInput> sequences;
  std::vector<SequenceInput> anchors;
  std::vector<SequenceInput> positives;
};

// Reads {"workloads": {name: {"sequences": [[id, ...], ...], "anchors": ..., "positives": ...}}}.
absl::StatusOr<std::map<std::string, Workload>> LoadWorkloads(const std::string& path);

// A command handler returns the reply object or an error (sent as {"error": message}).
using CommandHandler = std::function<absl::StatusOr<nlohmann::json>(const nlohmann::json&)>;

// Prints `ready`, then serves commands until quit or EOF. Returns the process exit code.
int RunWorker(const nlohmann::json& ready, const CommandHandler& handle);

// Wall-clock seconds of one call of `fn`; a failed call fails the measurement.
absl::StatusOr<double> TimeOnce(const std::function<absl::Status()>& fn);

// Median (the mean of the middle two for an even count, like Python's statistics.median).
double Median(std::vector<double> values);

// "oneDNN 3.0.0" style version string of the linked library.
std::string OneDnnVersion();

}  // namespace attn::bench
