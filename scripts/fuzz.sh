#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan, in the ASan tree) and runs each on
# its checked-in seed corpus for a while, two at a time (one per core). The default is CI's
# short smoke; give more time to hunt for real.
#
# Usage: scripts/fuzz.sh [--seconds N] [--target NAME]... [--no-build]
#   --seconds N   run each target for N seconds (default 15: 4 targets, 30 s on two cores)
#   --target NAME only this target (repeatable): safetensors, model_config, tokenizer, request
#   --no-build    use the fuzzers already in the build directory
# Environment: ATTN_ASAN_BUILD_DIR (default build-asan: scripts/sanitize.sh's clang ASan tree).
#
# New inputs that add coverage go to $BUILD/corpus/<target>/ (not the checked-in seeds); a crash
# is saved under $BUILD/artifacts/<target>/ and the script prints how to reproduce it. The last
# line reads "fuzz: N passed, M failed" (one per target). Exit status 1 if any target failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${ATTN_ASAN_BUILD_DIR:-$ROOT/build-asan}"
SECONDS_PER_TARGET=15
TARGETS=()
DO_BUILD=1
ALL_TARGETS=(safetensors model_config tokenizer request)

while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET="${2:?--seconds needs a value}"; shift 2 ;;
    --target) TARGETS+=("${2:?--target needs a name}"); shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] ||
    { echo "fuzz.sh: unknown target '$t' (one of: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

log() { printf '\033[1m[fuzz]\033[0m %s\n' "$*"; }

if ((DO_BUILD)); then
  # The fuzzers live in the ASan tree that scripts/sanitize.sh builds with clang-14 (its
  # libFuzzer); that script installs clang-14, its runtimes and llvm-14 (llvm-symbolizer-14) and
  # configures the tree, unless it already exists. In CI the fuzzers then cost four links and
  # the request parser's few files, not a second build of the engine.
  ATTN_ASAN_BUILD_DIR="$BUILD" "$ROOT/scripts/sanitize.sh" asan --configure-only
  build_start=$SECONDS
  ninja -C "$BUILD" -j2 "${TARGETS[@]/%/_fuzzer}"
  log "built in $((SECONDS - build_start)) s"
fi

# oneDNN runs on libgomp; one thread keeps each run deterministic and leaves a core free.
export OMP_NUM_THREADS=1
# The fuzzers are built with -fno-sanitize-recover=undefined: any UBSan report aborts the run.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Debian names the symbolizer llvm-symbolizer-14; the runtime looks for llvm-symbolizer.
if [[ -z "${ASAN_SYMBOLIZER_PATH:-}" ]] && command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer-14)"
fi

# Runs one target; its one-line result goes to $BUILD/logs/<target>.result, "ok ..." or
# "FAILED ...", and on failure the log's tail and how to reproduce follow it.
fuzz_target() {  # target
  local t="$1" seeds="$ROOT/fuzz/corpus/$1" work="$BUILD/corpus/$1"
  local artifacts="$BUILD/artifacts/$1" out="$BUILD/logs/$1.log" result="$BUILD/logs/$1.result"
  mkdir -p "$work" "$artifacts" "$(dirname "$out")"
  local dict=()
  [[ -f "$ROOT/fuzz/dict/$t.dict" ]] && dict=(-dict="$ROOT/fuzz/dict/$t.dict")
  log "$t: ${SECONDS_PER_TARGET} s on $(ls "$seeds" | wc -l) seeds (+$(ls "$work" | wc -l) from earlier runs)"
  local status=0
  # -max_len: the largest seed (the tiny model's 13 KB weights file) fits; -timeout and
  # -rss_limit_mb turn hangs and runaway allocations into failures too.
  "$BUILD/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
    -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "${dict[@]}" "$work" "$seeds" >"$out" 2>&1 || status=$?
  local execs rate cov crash
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$out" | tail -1 || true)
  if ((status == 0)); then
    printf '%-13s ok     %9s execs  %6s/s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$cov" >"$result"
    return 0
  fi
  {
    printf '%-13s FAILED (exit %d), log %s\n' "$t" "$status" "$out"
    echo "---- $t: last 40 lines of $out"
    tail -n 40 "$out"
    crash=$(grep -oE "Test unit written to [^ ]+" "$out" | tail -1 |
      sed 's/Test unit written to //' || true)
    if [[ -n "$crash" ]]; then
      echo "---- reproduce: $BUILD/fuzz/${t}_fuzzer $crash"
      echo "---- once fixed, keep it as a regression seed: cp $crash $seeds/"
    fi
  } >"$result"
}

# Two targets at a time: each fuzzer is single-threaded, and the machine has two cores.
running=0
for t in "${TARGETS[@]}"; do
  rm -f "$BUILD/logs/$t.result"
  fuzz_target "$t" &
  running=$((running + 1))
  if ((running == 2)); then wait -n || true; running=$((running - 1)); fi
done
wait || true

passed=0
failed=0
summary=()
for t in "${TARGETS[@]}"; do
  result="$BUILD/logs/$t.result"
  if [[ -f "$result" ]] && head -1 "$result" | grep -q '^[^ ]* *ok '; then
    passed=$((passed + 1)); summary+=("$(head -1 "$result")")
  else
    failed=$((failed + 1))
    summary+=("$(head -1 "$result" 2>/dev/null || echo "$t FAILED (no result)")")
    tail -n +2 "$result" >&2 2>/dev/null || true
  fi
done

log "summary (logs in $BUILD/logs):"
printf '  %s\n' "${summary[@]}"
echo "fuzz: $passed passed, $failed failed"
((failed == 0))
