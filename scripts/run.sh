#!/usr/bin/env bash
# The README's first command: sets up everything (packages, model, build; idempotent) and starts
# attnserve on the default model. Extra arguments go to attnserve (see `attnserve --help`),
# e.g. scripts/run.sh --port 50052 --metrics-port 9465
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
echo "[run] starting attnserve (Ctrl-C or SIGTERM drains and stops it)"
echo "[run] try: $BUILD_DIR/client/attnctl encode --text \"The king spoke to the queen.\""
exec "$BUILD_DIR/server/attnserve" --model-dir "${ATTN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}" "$@"
