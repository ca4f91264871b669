#!/usr/bin/env bash
# The README's test command: sets up (packages, model, build) then runs the whole ctest suite.
# Usage: scripts/test.sh [extra ctest arguments, e.g. -L unit or -R Golden]
#
# What a pass means (tests/test_policy.h): every test ran, except the ISA-gated ones (their name
# says which instruction set they need, e.g. "Avx512") on a CPU without it; any other skip fails
# its test binary. At the end the ISA-gated tests are listed, ran or skipped, with the CPU flags
# they depend on. Unit test binaries also run whole in a random order (ctest label "shuffled",
# --gtest_shuffle), besides each test alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# all-mpnet-base-v2 too, so the MPNet parity and server tests run (about 35 s to download and
# assemble its 470 MB on a fast link; nothing on a second run).
"$ROOT/scripts/setup.sh" --model all-mpnet-base-v2
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
cd "$BUILD_DIR"
# Two test processes at a time on this 2-core machine, each with one OpenMP thread, so they
# do not oversubscribe the cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export ATTN_TEST_ISA_REPORT="$BUILD_DIR/isa-gated-tests.tsv"
rm -f "$ATTN_TEST_ISA_REPORT"
ctest_log="$BUILD_DIR/ctest-output.log"
status=0
ctest --output-on-failure -j2 "$@" 2>&1 | tee "$ctest_log" || status=$?

# A test that fails here and passes when run again alone is reported as FLAKY and does not fail
# the run: on a loaded shared machine a timing margin (a stream deadline, ctest's timeout) can
# be missed by a correct build. A test that fails twice fails the run; both outputs are kept.
if ((status != 0)) && grep -q '^The following tests FAILED:' "$ctest_log"; then
  failed_first=$(sed -n '/^The following tests FAILED:/,/^$/p' "$ctest_log" |
    grep -E '^\s+[0-9]+ - ' | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//')
  echo "test.sh: re-running the failed tests once, one at a time:" $failed_first
  rerun_log="$BUILD_DIR/ctest-rerun.log"
  rerun_status=0
  ctest --output-on-failure --rerun-failed "$@" 2>&1 | tee "$rerun_log" || rerun_status=$?
  if ((rerun_status == 0)); then
    echo "test.sh: FLAKY (failed, then passed alone; first output in $ctest_log):" $failed_first
    status=0
  fi
fi

# ctest counts "Not Run" entries other than failures as passed; only ISA-gated skips and tests
# disabled on purpose (DISABLED_ prefix) may be among them.
unexpected=$(sed -n '/^The following tests did not run:/,/^$/p' "$ctest_log" |
  grep -E '^\s+[0-9]+ - ' | grep -Ev '\((Disabled)\)$' |
  grep -Eiv 'avx512|avx512bf16|avxvnni|vnni|amx|f16c|avx2' || true)
if [[ -n "$unexpected" ]]; then
  echo "test.sh: tests that did not run without an ISA reason:" >&2
  echo "$unexpected" >&2
  status=1
fi

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' |
  grep -Ex 'avx2|fma|f16c|avx512(f|bw|dq|vl|_vnni|_bf16|_fp16)|avx_vnni|amx_(tile|int8|bf16)' |
  sort | tr '\n' ' ' || true)
model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)
echo
echo "ISA-gated tests on this host ($model; flags: ${flags:-none of the gated ones})"
if [[ -s "$ATTN_TEST_ISA_REPORT" ]]; then
  for what in ran skipped failed; do
    count=$(awk -F'\t' -v w="$what" '$1 == w' "$ATTN_TEST_ISA_REPORT" | sort -u | wc -l)
    ((count)) || continue
    echo "  $what ($count):"
    awk -F'\t' -v w="$what" '$1 == w { printf "    [%s] %s%s\n", $2, $3, ($4 == "" ? "" : ": " $4) }' \
      "$ATTN_TEST_ISA_REPORT" | sort -u
  done
else
  echo "  none ran"
fi
exit "$status"
