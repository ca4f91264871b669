#include "tests/test_policy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace attn::testing {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string FullName(const ::testing::TestInfo& info) {
  // (A parameterised test's name ends with its parameter's name, e.g. ".../Avx512".)
  return std::string(info.test_suite_name()) + "." + info.name();
}

// The instruction sets a test name may declare, longest first so "Avx512Bf16" wins over
// "Avx512".
const std::vector<std::string>& IsaTags() {
  static const std::vector<std::string> tags = {"avx512bf16", "avx512", "avxvnni", "vnni",
                                                "amx",        "f16c",   "avx2"};
  return tags;
}

// The ISA a test's name declares, or "".
std::string DeclaredIsa(const ::testing::TestInfo& info) {
  const std::string name = Lower(FullName(info));
  for (const std::string& tag : IsaTags()) {
    if (name.find(tag) != std::string::npos) return tag;
  }
  return "";
}

class TestPolicyListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override {
    skip_message_.clear();
    isa_skip_ = true;
  }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.skipped()) return;
    const std::string message = result.message() != nullptr ? result.message() : "";
    skip_message_ = message;
    isa_skip_ = isa_skip_ && message.rfind(kIsaSkipPrefix, 0) == 0;
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string name = FullName(info), isa = DeclaredIsa(info);
    if (info.result()->Skipped()) {
      if (isa_skip_ && !isa.empty()) {
        std::printf("%s %s: %s\n", kIsaSkipMarker, name.c_str(), skip_message_.c_str());
        Report("skipped", isa, name, skip_message_);
      } else {
        // An empty message is GoogleTest's own: the suite's SetUpTestSuite failed.
        const std::string why = skip_message_.empty()
                                    ? "not run (a suite or environment set-up failed, see above)"
                                    : skip_message_;
        unexpected_.push_back(name + ": " + why);
        // Turn the skip into a failure. Here, before the result printer's OnTestEnd (end events
        // run in reverse order), so the test reads FAILED, not "[  SKIPPED ]", which ctest's
        // rule for discovered tests would count as a skip.
        ADD_FAILURE() << "the test did not run: " << why
                      << "\n(a test may skip only through ATTN_SKIP_UNLESS_CPU_HAS, when its "
                         "name says which instruction set it needs)";
      }
    } else if (!isa.empty()) {
      Report(info.result()->Passed() ? "ran" : "failed", isa, name, "");
    }
  }

  int Finish(int result) const {
    if (unexpected_.empty()) return result;
    std::printf(
        "\n%zu test(s) did not run, and a test may only skip through "
        "ATTN_SKIP_UNLESS_CPU_HAS (tests/test_policy.h):\n",
        unexpected_.size());
    for (const std::string& line : unexpected_)
      std::printf("[ UNEXPECTED SKIP ] %s\n", line.c_str());
    std::fflush(stdout);
    return 1;
  }

 private:
  // One line per ISA-gated test, appended with one write() so parallel test processes do not
  // interleave: status, ISA, test, reason.
  static void Report(const std::string& status, const std::string& isa, const std::string& name,
                     const std::string& reason) {
    const char* path = std::getenv("ATTN_TEST_ISA_REPORT");
    if (path == nullptr || *path == '\0') return;
    std::string line = status + "\t" + isa + "\t" + name + "\t" + reason;
    std::replace(line.begin(), line.end(), '\n', ' ');
    line += "\n";
    const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    [[maybe_unused]] const ssize_t written = write(fd, line.data(), line.size());
    close(fd);
  }

  std::string skip_message_;
  bool isa_skip_ = true;
  std::vector<std::string> unexpected_;
};

TestPolicyListener* g_listener = nullptr;

}  // namespace

bool CurrentTestNameHas(const std::string& isa_tag) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info != nullptr && Lower(FullName(*info)).find(Lower(isa_tag)) != std::string::npos;
}

void InstallTestPolicy() {
  g_listener = new TestPolicyListener();
  ::testing::UnitTest::GetInstance()->listeners().Append(g_listener);  // owned by gtest
}

int FinishTestPolicy(int run_all_tests_result) {
  return g_listener != nullptr ? g_listener->Finish(run_all_tests_result) : run_all_tests_result;
}

}  // namespace attn::testing
