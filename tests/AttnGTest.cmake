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

# Precompiled headers (issue 32) for the integration and reliability tests (their harness
# precompiles them, tests/integration/CMakeLists.txt): the gRPC, protobuf, GoogleTest and Abseil
# headers, parsed once instead of once per file (measured on this AMX host: about 1 to 1.7 CPU s
# less per integration file). The unit test groups do without: there the saving (under 0.5 s
# per file, nothing for most) did not pay for compiling the header (5 to 10 s per group).
# ATTN_PCH=OFF turns them off. (ccache caches a compile that uses them only with
# CCACHE_SLOPPINESS=pch_defines,time_macros.)
option(ATTN_PCH "Precompile the heavy third-party headers of the integration tests" ON)
# (A cache variable: this file is included once, from whichever directory comes first, and a
# plain variable would exist only there.)
set(ATTN_GRPC_TEST_PCH_HEADERS
  <algorithm> <chrono> <cmath> <cstdint> <filesystem> <fstream> <functional> <map> <memory>
  <optional> <random> <set> <sstream> <string> <thread> <vector>
  <gtest/gtest.h> <nlohmann/json.hpp>
  <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
  <absl/strings/str_format.h>
  <grpcpp/grpcpp.h> <google/protobuf/message.h> <google/protobuf/util/json_util.h>
  CACHE INTERNAL "headers precompiled for the integration tests")

# attn_test_pch(target headers...): `target` precompiles `headers`; attn_use_test_pch(target
# pch_target) makes `target` use those of `pch_target` (same compile flags).
function(attn_test_pch target)
  if(ATTN_PCH)
    target_precompile_headers(${target} PRIVATE ${ARGN})
  endif()
endfunction()
function(attn_use_test_pch target pch_target)
  if(ATTN_PCH)
    target_precompile_headers(${target} REUSE_FROM ${pch_target})
  endif()
endfunction()

function(attn_discover_tests target label)
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${label}")
endfunction()

# attn_grouped_test(binary name label sources...): test files are linked into a few large
# binaries, one per folder and layer (unit_engine_tests, unit_core_tests, ...), so the large
# static libraries are linked, and the gtest cases discovered, once per binary instead of once
# per file (issue 32: compile less). The sources become an object library `name` (the file's
# former executable name, so per-file target_link_libraries, target_compile_definitions and
# add_dependencies keep working), linked into `binary`, which is created by the first call with
# the ctest label `label`. ctest names do not change: one ctest test per gtest case (Suite.Case),
# each run alone as before. A test suite name must be unique within its binary: two files that
# each define a fixture `FooTest` (even in anonymous namespaces) fail the build at test discovery
# ("Attempted redefinition of test suite FooTest").
function(attn_grouped_test binary name label)
  if(NOT TARGET ${binary})
    add_executable(${binary})
    target_link_libraries(${binary} PRIVATE attn_test_main)
    attn_discover_tests(${binary} "${label}")
  endif()
  add_library(${name} OBJECT ${ARGN})
  target_compile_options(${name} PRIVATE ${ATTN_TEST_CODE_FLAGS})
  target_link_libraries(${name} PRIVATE attn_test_main)
  target_link_libraries(${binary} PRIVATE ${name})
  set(sources)
  # Relative to the project root: what --attn_test_source matches against the end of each test's
  # __FILE__ (tests/test_main.cc), which is absolute or, through ccache, relative to the build.
  foreach(source IN LISTS ARGN)
    get_filename_component(source "${source}" ABSOLUTE)
    file(RELATIVE_PATH source "${PROJECT_SOURCE_DIR}" "${source}")
    list(APPEND sources "${source}")
  endforeach()
  set_target_properties(${name} PROPERTIES ATTN_TEST_BINARY ${binary}
                                           ATTN_TEST_SOURCES "${sources}")
endfunction()

# attn_shuffled_run(target label): the target's tests once more, all in one process in a random
# order (ctest label "shuffled" only, so `-L unit` and the sanitizer jobs do not run them twice;
# --gtest_shuffle, the seed is printed): each test must pass alone (attn_discover_tests) and
# after any other test of its file. For a grouped file (attn_grouped_test) this runs the file's
# own tests, as when it was a binary of its own (--attn_test_source, tests/test_main.cc).
function(attn_shuffled_run target label)
  get_target_property(binary ${target} ATTN_TEST_BINARY)
  if(binary)
    get_target_property(sources ${target} ATTN_TEST_SOURCES)
    list(TRANSFORM sources PREPEND "--attn_test_source=")
    add_test(NAME ${target}.shuffled COMMAND ${binary} --gtest_shuffle ${sources})
  else()
    add_test(NAME ${target}.shuffled COMMAND ${target} --gtest_shuffle)
  endif()
  set_tests_properties(${target}.shuffled PROPERTIES LABELS "shuffled")
endfunction()
