// A JSON fixture of tests/golden, parsed once per process. A missing or unparsable file gives a
// null value with `error` set, so each test's SetUp can fail with the reason:
//   const GoldenJsonFile& f = GoldenJson("bm42_cases.json"); ASSERT_TRUE(f.error.empty()) << ...
#pragma once

#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "nlohmann/json.hpp"

namespace attn::testing {

struct GoldenJsonFile {
  nlohmann::json json;
  std::string error;  // empty when `json` holds the file
};

inline const GoldenJsonFile& GoldenJson(const std::string& name) {
  static std::mutex mutex;
  static auto* files = new std::map<std::string, GoldenJsonFile>();
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = files->try_emplace(name);
  if (inserted) {
    const std::string path = std::string(ATTN_GOLDEN_DIR) + "/" + name;
    std::ifstream file(path);
    if (!file.good()) {
      it->second.error = "missing " + path;
    } else {
      it->second.json = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
      if (it->second.json.is_discarded()) it->second.error = path + " is not valid JSON";
    }
  }
  return it->second;
}

}  // namespace attn::testing
