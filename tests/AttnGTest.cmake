# Test registration shared by tests/ and client/ (included from both).
#
# attn_test_main: GoogleTest's main plus the skip policy of tests/test_policy.h. Link it instead
# of GTest::gtest_main.
#
# attn_discover_tests(target label): one ctest test per gtest case. gtest_discover_tests marks a
# test "skipped" (not failed, whatever its exit code) when its output contains "[  SKIPPED ]",
# which GoogleTest also prints for every test of a suite whose SetUpTestSuite failed. With the
# policy's main only an ISA-gated skip prints it: any other skip is turned into a failure.
include_guard(GLOBAL)
include(GoogleTest)

if(NOT TARGET attn_test_main)
  add_library(attn_test_policy STATIC ${PROJECT_SOURCE_DIR}/tests/test_policy.cc)
  target_include_directories(attn_test_policy PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(attn_test_policy PUBLIC GTest::gtest)
  add_library(attn_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/test_main.cc)
  target_link_libraries(attn_test_main PUBLIC attn_test_policy)
endif()

function(attn_discover_tests target label)
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${label}")
endfunction()

# attn_shuffled_run(target label): the whole binary once more (ctest label "shuffled" only, so
# `-L unit` and the sanitizer jobs do not run it twice), in a random order
# (--gtest_shuffle; the seed is printed): each test must pass alone (attn_discover_tests) and
# after any other test of its binary.
function(attn_shuffled_run target label)
  add_test(NAME ${target}.shuffled COMMAND ${target} --gtest_shuffle)
  set_tests_properties(${target}.shuffled PROPERTIES LABELS "shuffled")
endfunction()
