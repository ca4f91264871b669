// main() of the unit, golden and client test binaries: GoogleTest's, plus the skip policy of
// tests/test_policy.h (a skip without an ISA reason fails the binary).
//
// The test files of one folder and layer are linked into one binary (tests/AttnGTest.cmake);
// --attn_test_source=PATH (repeatable) runs only the tests defined in the source file PATH
// (relative to the project root), as when the file was a binary of its own (its ".shuffled" ctest
// entry does this).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "tests/test_policy.h"

namespace {

constexpr char kSourceFlag[] = "--attn_test_source=";

// Whether `file`, a test's __FILE__, is the project's source `source` (relative to the project
// root). __FILE__ is the path the compiler was given: absolute from CMake, but relative to the
// build directory (../tests/unit/x.cc) when ccache rewrites paths under CCACHE_BASEDIR, as
// scripts/setup.sh's build does. Either way it ends with "/" + `source`.
bool IsSourceFile(const std::string& file, const std::string& source) {
  if (file == source) return true;
  return file.size() > source.size() && file[file.size() - source.size() - 1] == '/' &&
         file.compare(file.size() - source.size(), source.size(), source) == 0;
}

// Sets GoogleTest's filter to the tests defined in the files named by --attn_test_source.
// Returns false (after saying why) if a flag selects no test or clashes with --gtest_filter.
bool SelectTestsOfSourceFiles(int argc, char** argv) {
  std::set<std::string> sources;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kSourceFlag, sizeof(kSourceFlag) - 1) == 0) {
      sources.insert(argv[i] + sizeof(kSourceFlag) - 1);
    }
  }
  if (sources.empty()) return true;
  if (GTEST_FLAG_GET(filter) != "*") {
    std::fprintf(stderr, "%s and --gtest_filter exclude each other\n", kSourceFlag);
    return false;
  }
  std::string filter;
  std::set<std::string> matched;
  const ::testing::UnitTest& unit_test = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit_test.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit_test.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(t);
      const std::string file = info.file();
      auto source = std::find_if(sources.begin(), sources.end(),
                                 [&](const std::string& s) { return IsSourceFile(file, s); });
      if (source == sources.end()) continue;
      matched.insert(*source);
      if (!filter.empty()) filter += ':';
      filter += std::string(suite.name()) + "." + info.name();
    }
  }
  for (const std::string& source : sources) {
    if (matched.count(source) == 0) {
      std::fprintf(stderr, "%s%s: this binary has no test defined in that file\n", kSourceFlag,
                   source.c_str());
      return false;
    }
  }
  GTEST_FLAG_SET(filter, filter);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!SelectTestsOfSourceFiles(argc, argv)) return 1;
  attn::testing::InstallTestPolicy();
  return attn::testing::FinishTestPolicy(RUN_ALL_TESTS());
}
