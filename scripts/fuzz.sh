#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan) and runs each on its checked-in
# seed corpus for a while. The default is CI's short smoke; give more time to hunt for real.
#
# Usage: scripts/fuzz.sh [--seconds N] [--target NAME]... [--no-build]
#   --seconds N   run each target for N seconds (default 15: 4 targets, one minute)
#   --target NAME only this target (repeatable): safetensors, model_config, tokenizer, request
#   --no-build    use the fuzzers already in the build directory
# Environment: ATTN_FUZZ_BUILD_DIR (default build-fuzz).
#
# New inputs that add coverage go to $BUILD/corpus/<target>/ (not the checked-in seeds); a crash
# is saved under $BUILD/artifacts/<target>/ and the script prints how to reproduce it. The last
# line reads "fuzz: N passed, M failed" (one per target). Exit status 1 if any target failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${ATTN_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_PER_TARGET=15
TARGETS=()
DO_BUILD=1
ALL_TARGETS=(safetensors model_config tokenizer request)

while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET="${2:?--seconds needs a value}"; shift 2 ;;
    --target) TARGETS+=("${2:?--target needs a name}"); shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
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
  # The project's packages and the model (the tokenizer fuzzer uses its vocabulary), plus
  # clang-14 with its libFuzzer/sanitizer runtimes and llvm-14 (llvm-symbolizer-14, for
  # symbolized crash reports) from Debian.
  "$ROOT/scripts/setup.sh" --no-build --extra-packages 'clang-14 libclang-rt-14-dev llvm-14'
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    # -O1 -g1, as the sanitizer builds: line numbers in crash reports, and 10-20% less compile
    # time than -O2 -g for the whole engine and protobuf code the fuzzers link.
    cmake -G Ninja -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DATTN_DEFAULT_MODEL_DIR="${ATTN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}" "${launcher[@]}"
  fi
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

passed=0
failed=0
summary=()
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/fuzz/corpus/$t"
  work="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t"
  out="$BUILD/logs/$t.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$out")"
  dict=()
  [[ -f "$ROOT/fuzz/dict/$t.dict" ]] && dict=(-dict="$ROOT/fuzz/dict/$t.dict")
  log "$t: ${SECONDS_PER_TARGET} s on $(ls "$seeds" | wc -l) seeds (+$(ls "$work" | wc -l) from earlier runs)"
  status=0
  # -max_len: the largest seed (the tiny model's 13 KB weights file) fits; -timeout and
  # -rss_limit_mb turn hangs and runaway allocations into failures too.
  "$BUILD/${t}_fuzzer" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
    "$work" "$seeds" >"$out" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$out" | tail -1 || true)
  if ((status == 0)); then
    passed=$((passed + 1))
    summary+=("$(printf '%-13s ok     %9s execs  %6s/s  %s' "$t" "${execs:-?}" "${rate:-?}" "$cov")")
  else
    failed=$((failed + 1))
    summary+=("$(printf '%-13s FAILED (exit %d), log %s' "$t" "$status" "$out")")
    crash=$(grep -oE "Test unit written to [^ ]+" "$out" | tail -1 | sed 's/Test unit written to //' || true)
    echo "---- $t: last 40 lines of $out" >&2
    tail -n 40 "$out" >&2
    if [[ -n "$crash" ]]; then
      echo "---- reproduce: $BUILD/${t}_fuzzer $crash" >&2
      echo "---- once fixed, keep it as a regression seed: cp $crash $seeds/" >&2
    fi
  fi
done

log "summary (logs in $BUILD/logs):"
printf '  %s\n' "${summary[@]}"
echo "fuzz: $passed passed, $failed failed"
((failed == 0))
