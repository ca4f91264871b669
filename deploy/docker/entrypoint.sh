#!/bin/sh
# The image's entrypoint: turns ATTNSERVE_* environment variables into attnserve flags placed
# before the container's arguments, then execs attnserve (so it receives SIGTERM itself). A
# flag given as an argument wins over the variable (absl keeps the last value).
#   ATTNSERVE_HOST, ATTNSERVE_PORT, ATTNSERVE_METRICS_PORT, ATTNSERVE_MODEL_DIR,
#   ATTNSERVE_THREADS, ATTNSERVE_DRAIN_TIMEOUT_S   always passed (the image sets defaults)
#   ATTNSERVE_TOKEN_FILE     --trainer-token-file FILE (enables fine-tuning) when not empty
#   ATTNSERVE_MODEL_STORE    --model-store DIR when not empty
#   ATTNSERVE_WATCH_STORE    --watch-store SECONDS when not 0
#   ATTNSERVE_MAX_LOADED_VERSIONS, ATTNSERVE_TRAINER_THREADS, ATTNSERVE_LOG_LEVEL  when set
# `docker run IMAGE --help` lists attnserve's flags.
set -eu

if [ -n "${ATTNSERVE_LOG_LEVEL:-}" ]; then set -- --log-level="$ATTNSERVE_LOG_LEVEL" "$@"; fi
if [ -n "${ATTNSERVE_TRAINER_THREADS:-}" ]; then
  set -- --trainer-threads="$ATTNSERVE_TRAINER_THREADS" "$@"
fi
if [ -n "${ATTNSERVE_MAX_LOADED_VERSIONS:-}" ]; then
  set -- --max-loaded-versions="$ATTNSERVE_MAX_LOADED_VERSIONS" "$@"
fi
if [ "${ATTNSERVE_WATCH_STORE:-0}" != "0" ]; then
  set -- --watch-store="$ATTNSERVE_WATCH_STORE" "$@"
fi
if [ -n "${ATTNSERVE_MODEL_STORE:-}" ]; then set -- --model-store="$ATTNSERVE_MODEL_STORE" "$@"; fi
if [ -n "${ATTNSERVE_TOKEN_FILE:-}" ]; then
  set -- --trainer-token-file="$ATTNSERVE_TOKEN_FILE" "$@"
fi
exec /usr/local/bin/attnserve \
  --host="${ATTNSERVE_HOST:-0.0.0.0}" \
  --port="${ATTNSERVE_PORT:-50051}" \
  --metrics-port="${ATTNSERVE_METRICS_PORT:-9464}" \
  --http-port="${ATTNSERVE_HTTP_PORT:-8080}" \
  --model-dir="${ATTNSERVE_MODEL_DIR:?must name the model directory}" \
  --threads="${ATTNSERVE_THREADS:-0}" \
  --drain-timeout-s="${ATTNSERVE_DRAIN_TIMEOUT_S:-30}" \
  "$@"
