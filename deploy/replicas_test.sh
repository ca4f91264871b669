#!/usr/bin/env bash
# The replicated deployment test (run by deploy/test.sh, or alone): one trainer and three
# serving replicas of the host build sharing one model store, Debian's HAProxy in front with
# deploy/replicas/haproxy.cfg (the balancer deploy/compose-replicas.yml runs), Debian's
# Prometheus scraping all four; deploy/replicas_test.py drives it (promotion propagation,
# SIGKILL failover, rolling SIGTERM restart, Prometheus targets, the autoscaling signal under a
# load ramp) and prints the figures.
#
# Why host processes on loopback, not the compose file's containers: on this 2-core host the
# four attnserve processes, the balancer, Prometheus and the clients already share two cores,
# and the test kills and restarts replicas on purpose; containers add nothing the test
# measures (the same binary, the same balancer config, the same store layout) but podman's
# start-up and network set-up time to every restart, which would sit inside the measured
# failover and rejoin figures. deploy/test.sh checks the compose file with `docker-compose
# config` against the same haproxy.cfg.
#
# Usage: deploy/replicas_test.sh            (needs the host build: attnserve in $ATTN_BUILD_DIR)
# Environment: ATTN_BUILD_DIR (default build/), ATTN_TEST_VENV (default .venv-test),
#              ATTN_MODEL_DIR (default models/all-MiniLM-L6-v2), ATTN_REPLICAS_KEEP=1 keeps logs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
VENV="${ATTN_TEST_VENV:-$ROOT/.venv-test}"
MODEL_DIR="${ATTN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}"

for package in haproxy prometheus; do
  if ! dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q "install ok installed"; then
    SUDO=""
    [[ $EUID -ne 0 ]] && SUDO=sudo
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "$package" > /dev/null
  fi
done
[[ -x "$BUILD_DIR/server/attnserve" ]] || { echo "replicas_test.sh: no $BUILD_DIR/server/attnserve" >&2; exit 1; }
[[ -x "$VENV/bin/python" ]] || { echo "replicas_test.sh: no $VENV (scripts/setup.sh)" >&2; exit 1; }
# The client from this checkout (its retry policy is part of what is tested).
exec 9> "${TMPDIR:-/tmp}/attnserve-python-client-install.lock"
flock 9
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  --no-build-isolation --force-reinstall "$ROOT/client/python"
flock -u 9

WORK="$(mktemp -d /tmp/attnserve-replicas.XXXXXX)"
cleanup() {
  if [[ "${ATTN_REPLICAS_KEEP:-0}" == 1 ]]; then echo "replicas_test.sh: logs in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
start=$SECONDS
status=0
OMP_NUM_THREADS=1 NO_PROXY='*' no_proxy='*' timeout 900 "$VENV/bin/python" \
  "$ROOT/deploy/replicas_test.py" --attnserve "$BUILD_DIR/server/attnserve" \
  --model-dir "$MODEL_DIR" --haproxy-config "$ROOT/deploy/replicas/haproxy.cfg" \
  --adapter-rules "$ROOT/deploy/k8s/prometheus-adapter.yaml" --work "$WORK" || status=$?
if ((status != 0)); then
  for log in "$WORK"/*.log; do echo "--- $log (last 30 lines)"; tail -30 "$log"; done
fi
echo "replicas_test.sh: wall time $((SECONDS - start)) s"
exit "$status"
