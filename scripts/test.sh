#!/usr/bin/env bash
# The README's test command: sets up (packages, model, build) then runs the whole ctest suite.
# Usage: scripts/test.sh [extra ctest arguments, e.g. -L unit or -R Golden]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
cd "$BUILD_DIR"
# Two test processes at a time on this 2-core machine, each with one OpenMP thread, so they
# do not oversubscribe the cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec ctest --output-on-failure -j2 "$@"
