// The model the unit and golden tests run on: $ATTN_TEST_MODEL_DIR (as for the integration
// tests), else the configured ATTN_TEST_MODEL_DIR (all-MiniLM-L6-v2); loaded once per process and
// precision. A fixture checks it in SetUp, so a missing or broken model fails
// every test that needs it, each with the loader's message:
//   void SetUp() override { ASSERT_TRUE(TestModel().ok()) << TestModel().status(); }
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace attn::testing {

inline std::string TestModelDir() {
  const char* env = std::getenv("ATTN_TEST_MODEL_DIR");
  return env != nullptr && *env != '\0' ? env : ATTN_TEST_MODEL_DIR;
}

inline const absl::StatusOr<std::shared_ptr<const Model>>& TestModel(
    Precision precision = Precision::kFp32) {
  static std::mutex mutex;
  static auto* models = new std::map<Precision, absl::StatusOr<std::shared_ptr<const Model>>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = models->find(precision);
  if (it == models->end()) {
    ModelOptions options;
    options.precision = precision;
    absl::StatusOr<std::shared_ptr<const Model>> loaded = Model::Load(TestModelDir(), options);
    it = models->emplace(precision, std::move(loaded)).first;
  }
  return it->second;
}

}  // namespace attn::testing
