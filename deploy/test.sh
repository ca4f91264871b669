#!/usr/bin/env bash
# The deployment test (run by .ci/run after scripts/test.sh): builds and runs the real container
# image and the docker-compose stack, and validates the Kubernetes manifests.
#
#   1. installs the container tools (Debian's podman, runc, debootstrap, docker-compose, ...) and
#      points podman at deploy/podman/*.conf;
#   2. makes the base image debian:bookworm-slim locally (deploy/make-base-image.sh: no
#      container registry is needed), starts podman's Docker API on a private socket;
#   3. builds the attnserve image (Dockerfile) and the Prometheus image (deploy/prometheus);
#   4. `docker run`s the image, waits for its HEALTHCHECK, calls Encode and AttentionMap with
#      the host's attnctl and compares them with a host (non-container) attnserve; checks the
#      user, the absence of compilers; `docker stop` must drain and exit 0;
#   5. brings up deploy/docker-compose.yml, fine-tunes through the token secret into the named
#      volume, and asserts through Prometheus' query API that it scraped
#      attnserve_requests_total (and that the Grafana dashboard's queries are valid);
#   6. validates deploy/k8s (schemas + cross-checks, deploy/k8s/check_manifests.py);
#   7. validates deploy/k8s/kserve against KServe's published schemas (check_kserve.py) and the
#      replicated deployment's compose file and balancer config, then runs it
#      (deploy/replicas_test.sh: promotion, SIGKILL failover, rolling restart, Prometheus);
# then removes its containers, volumes and temp files, also on failure or timeout. Images stay
# (layer cache for the next run; ATTN_DEPLOY_REMOVE_IMAGES=1 removes them too).
#
# Usage: deploy/test.sh          (root, or sudo for apt-get and podman)
# Environment: ATTN_DEPLOY_TIMEOUT_S (default 3000: the whole run), ATTN_BUILD_DIR (the host
#              build, default build/), ATTN_DEPLOY_KEEP=1 keeps the temp dir and logs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The whole run is bounded: re-exec under timeout, which signals this script's process group.
if [[ -z "${ATTN_DEPLOY_UNDER_TIMEOUT:-}" ]]; then
  export ATTN_DEPLOY_UNDER_TIMEOUT=1
  exec timeout --kill-after=120 "${ATTN_DEPLOY_TIMEOUT_S:-3000}" bash "$ROOT/deploy/test.sh" "$@"
fi
if [[ $EUID -ne 0 ]]; then
  command -v sudo > /dev/null || { echo "deploy/test.sh: needs root or sudo" >&2; exit 1; }
  exec sudo --preserve-env bash "$ROOT/deploy/test.sh" "$@"
fi

BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
IMAGE=attnserve:latest
PROMETHEUS_IMAGE=attnserve-prometheus:latest
CONTAINER=attnserve-deploytest
PROJECT=attnserve-deploytest
COMPOSE_FILE="$ROOT/deploy/docker-compose.yml"
WORK="$(mktemp -d /tmp/attnserve-deploytest.XXXXXX)"
RUN_START=$SECONDS
PASSED=0
FAILED=0
SERVICE_PID=""
HOST_SERVER_PID=""

log() { printf '\033[1m[deploy %4ds]\033[0m %s\n' "$((SECONDS - RUN_START))" "$*"; }
pass() { PASSED=$((PASSED + 1)); log "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL $*"; }
# check DESCRIPTION COMMAND...: runs the command, counts the result.
check() {
  local description="$1"
  shift
  if "$@"; then pass "$description"; else fail "$description"; fi
}
die() {
  fail "$*"
  exit 1
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if [[ -n "${DOCKER_HOST:-}" ]]; then
    docker_cli rm -f "$CONTAINER" > /dev/null 2>&1
    [[ -f "$WORK/compose.env" ]] && compose down -v --timeout 40 > "$WORK/compose-down.log" 2>&1
    if [[ "${ATTN_DEPLOY_REMOVE_IMAGES:-0}" == 1 ]]; then
      docker_cli rmi -f "$IMAGE" "$PROMETHEUS_IMAGE" > /dev/null 2>&1
    fi
  fi
  [[ -n "$HOST_SERVER_PID" ]] && kill "$HOST_SERVER_PID" 2> /dev/null && wait "$HOST_SERVER_PID"
  if [[ -n "$SERVICE_PID" ]]; then
    kill "$SERVICE_PID" 2> /dev/null
    wait "$SERVICE_PID" 2> /dev/null
  fi
  if ((status != 0)) && [[ -d "$WORK" ]]; then
    for f in "$WORK"/*.log; do
      [[ -s "$f" ]] || continue
      echo "--- $(basename "$f") (last 40 lines) ---"
      tail -40 "$f"
    done
  fi
  if [[ "${ATTN_DEPLOY_KEEP:-0}" == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
  log "took $((SECONDS - RUN_START)) s"
  echo "deploy: $PASSED passed, $((FAILED + (status != 0 && FAILED == 0))) failed"
  exit "$status"
}
trap cleanup EXIT
trap 'log "interrupted (timeout?)"; exit 124' INT TERM

# --- 1. tools ---------------------------------------------------------------------------------
PACKAGES=(podman buildah runc catatonit debootstrap uidmap slirp4netns fuse-overlayfs
  docker-compose python3-venv)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
command -v kubectl > /dev/null || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    > "$WORK/apt.log" 2>&1 || die "apt-get install ${missing[*]} (see apt.log)"
fi
# The host build is the reference the container is compared with: packages and model from the
# set-up script (no-ops when done), then only the two binaries (CI has built everything already).
"$ROOT/scripts/setup.sh" --no-build > "$WORK/setup.log" 2>&1 || die "scripts/setup.sh (see setup.log)"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DATTN_DEFAULT_MODEL_DIR="$ROOT/models/all-MiniLM-L6-v2" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    >> "$WORK/setup.log" 2>&1 || die "cmake configure $BUILD_DIR (see setup.log)"
fi
# (The compiler cache's settings of scripts/setup.sh, which the image build below relies on.)
CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}" env -u LANG -u LC_ALL -u LC_CTYPE -u LC_MESSAGES \
  cmake --build "$BUILD_DIR" -j2 --target attnserve attnctl >> "$WORK/setup.log" 2>&1 ||
  die "building attnserve and attnctl in $BUILD_DIR (see setup.log)"
ATTNCTL="$BUILD_DIR/client/attnctl"
ATTNSERVE="$BUILD_DIR/server/attnserve"
[[ -x "$ATTNCTL" && -x "$ATTNSERVE" ]] || die "no $ATTNCTL or $ATTNSERVE"

# podman: runc and cgroupfs (crun fails on this host's cgroups), no systemd.
export CONTAINERS_CONF="$ROOT/deploy/podman/containers.conf"
export CONTAINERS_STORAGE_CONF="$ROOT/deploy/podman/storage.conf"
# The stock docker CLI when there is one (drives podman's Docker API), else podman itself.
if command -v docker > /dev/null; then
  DOCKER=docker
  export DOCKER_BUILDKIT=0 # the classic build API, which podman implements
  BUILD_FLAGS=()
else
  DOCKER=podman
  BUILD_FLAGS=(--format docker --pull=never) # docker format keeps HEALTHCHECK
fi
docker_cli() { "$DOCKER" "$@"; }
compose() { docker-compose --env-file "$WORK/compose.env" -f "$COMPOSE_FILE" -p "$PROJECT" "$@"; }
log "container client: $DOCKER ($(podman --version))"

# --- 2. base image, podman's Docker API -----------------------------------------------------
step_start=$SECONDS
"$ROOT/deploy/make-base-image.sh" > "$WORK/base-image.log" 2>&1 ||
  die "base image (see base-image.log)"
log "$(tail -1 "$WORK/base-image.log") in $((SECONDS - step_start)) s"

podman system service --time=0 "unix://$WORK/podman.sock" > "$WORK/podman-service.log" 2>&1 &
SERVICE_PID=$!
export DOCKER_HOST="unix://$WORK/podman.sock"
for _ in $(seq 100); do [[ -S "$WORK/podman.sock" ]] && break; sleep 0.1; done
docker_cli version > /dev/null 2>&1 || die "podman's Docker API does not answer"

# --- 3. images --------------------------------------------------------------------------------
# A host whose HTTPS goes through an intercepting proxy trusts extra CAs; the build stage needs
# them to download the model from PyPI (they never reach the runtime image).
extra_ca=""
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  extra_ca="$(cat /usr/local/share/ca-certificates/*.crt)"
fi
# The Dockerfile's from-source build, given the host's compiler cache (Dockerfile, CCACHE_DIR):
# scripts/setup.sh's release build compiled the same sources with the same flags, so the image
# build finds its objects there instead of compiling the server a second time. podman itself
# builds it (a build-time bind mount is not in the Docker API); the Dockerfile is the one
# `docker build .` runs.
cache_dir="$(ccache --get-config cache_dir 2> /dev/null || true)"
cache_args=()
if [[ -n "$cache_dir" ]]; then
  mkdir -p "$cache_dir"
  cache_args=(--volume "$cache_dir:/ccache" --build-arg CCACHE_DIR=/ccache)
fi
# ccache_counts: "hits misses" of the cache so far (the image build's are the difference).
ccache_counts() {
  ccache --print-stats 2> /dev/null | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ { h += $2 }
    $1 == "cache_miss" { m += $2 } END { print h + 0, m + 0 }'
}
read -r hits_before misses_before < <(ccache_counts)
log "building $IMAGE (Dockerfile: a release build of attnserve + attnctl on 2 cores${cache_dir:+, compiler cache $cache_dir})"
step_start=$SECONDS
podman build --format docker --pull=never "${cache_args[@]}" --build-arg EXTRA_CA_CERTS="$extra_ca" \
  -t "$IMAGE" . > "$WORK/build.log" 2>&1 || die "podman build (see build.log)"
BUILD_SECONDS=$((SECONDS - step_start))
IMAGE_MB=$(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f", $1/1e6}')
read -r hits_after misses_after < <(ccache_counts)
cache_note=""
if [[ -n "$cache_dir" ]] && grep -q 'Building CXX' "$WORK/build.log"; then
  cache_note=" (compiles found in the compiler cache: $((hits_after - hits_before)) of $((hits_after - hits_before + misses_after - misses_before)))"
fi
pass "image $IMAGE built in ${BUILD_SECONDS} s, ${IMAGE_MB} MB$cache_note"
step_start=$SECONDS
docker_cli build "${BUILD_FLAGS[@]}" -t "$PROMETHEUS_IMAGE" deploy/prometheus \
  > "$WORK/build-prometheus.log" 2>&1 || die "docker build deploy/prometheus"
pass "image $PROMETHEUS_IMAGE built in $((SECONDS - step_start)) s"

image_config() { podman image inspect --format "$1" "$IMAGE"; }
image_metadata_ok() {
  local user health signal ports
  user="$(image_config '{{.User}}')"
  health="$(image_config '{{.HealthCheck.Test}}')"
  signal="$(image_config '{{.Config.StopSignal}}')"
  ports="$(image_config '{{.Config.ExposedPorts}}')"
  echo "  user $user; healthcheck $health; stop signal $signal; exposed $ports"
  [[ "$user" == 10001:10001 && "$health" == *"attnctl health"* && "$signal" == SIGTERM &&
    "$ports" == *50051* && "$ports" == *9464* ]]
}
check "image: non-root user, HEALTHCHECK with attnctl health, STOPSIGNAL, EXPOSE" image_metadata_ok
compilers="$(docker_cli run --rm --entrypoint /bin/sh "$IMAGE" -c \
  'for c in cc gcc g++ c++ clang cmake ld as; do command -v $c; done; true')"
check "no compiler or build tool in the runtime image${compilers:+ (found: $compilers)}" \
  test -z "$compilers"

# --- 4. docker run: health, Encode/AttentionMap vs the host, SIGTERM drain --------------------
mapfile -t PORTS < <(python3 deploy/test_helpers.py free-ports 5)
GRPC_PORT=${PORTS[0]} METRICS_PORT=${PORTS[1]} PROMETHEUS_PORT=${PORTS[2]}
HOST_PORT=${PORTS[3]}

log "docker run $IMAGE (gRPC 127.0.0.1:$GRPC_PORT, metrics :$METRICS_PORT)"
run_start_ms=$(($(date +%s%N) / 1000000))
docker_cli run -d --name "$CONTAINER" --init --network host \
  -e ATTNSERVE_HOST=127.0.0.1 -e ATTNSERVE_PORT="$GRPC_PORT" \
  -e ATTNSERVE_METRICS_PORT="$METRICS_PORT" -e ATTNSERVE_THREADS=2 \
  "$IMAGE" > /dev/null || die "docker run"
# podman runs HEALTHCHECKs from systemd timers, which this host lacks: run the image's check
# by hand until it passes (it fails while the model loads).
healthy=0
for _ in $(seq 240); do
  if podman healthcheck run "$CONTAINER" > /dev/null 2>&1; then healthy=1; break; fi
  [[ "$(podman inspect --format '{{.State.Running}}' "$CONTAINER")" == true ]] || break
  sleep 0.5
done
HEALTHY_MS=$(($(date +%s%N) / 1000000 - run_start_ms))
HEALTHY_SECONDS="$((HEALTHY_MS / 1000)).$((HEALTHY_MS % 1000 / 100))"
docker_cli logs "$CONTAINER" > "$WORK/container.log" 2>&1
((healthy)) || die "the container never became healthy (see container.log)"
pass "container healthy $HEALTHY_SECONDS s after docker run"
check "podman reports the container healthy" \
  test "$(podman inspect --format '{{.State.Health.Status}}' "$CONTAINER")" = healthy
check "the server in the container runs as uid 10001" \
  test "$(docker_cli exec "$CONTAINER" sh -c 'id -u')" = 10001

# The same binary's source built on the host, on the same model files.
"$ATTNSERVE" --host=127.0.0.1 --port="$HOST_PORT" --metrics-port=-1 --http-port=-1 --threads=2 \
  --ready-file="$WORK/host.ready" > "$WORK/host-server.log" 2>&1 &
HOST_SERVER_PID=$!
for _ in $(seq 300); do [[ -s "$WORK/host.ready" ]] && break; sleep 0.2; done
[[ -s "$WORK/host.ready" ]] || die "the host attnserve did not start (see host-server.log)"

TEXT="The animal didn't cross the street because it was too tired."
PAIR="It was raining."
for server in container:$GRPC_PORT host:$HOST_PORT; do
  name=${server%%:*} port=${server##*:}
  "$ATTNCTL" encode --server "127.0.0.1:$port" --json --text "$TEXT" --pair "$PAIR" \
    > "$WORK/encode-$name.json" || die "attnctl encode against the $name server"
  "$ATTNCTL" attention --server "127.0.0.1:$port" --json --text "$TEXT" --layer 2 \
    > "$WORK/attention-$name.json" || die "attnctl attention against the $name server"
done
check "Encode from the container equals the host's" \
  python3 deploy/test_helpers.py compare "$WORK/encode-container.json" "$WORK/encode-host.json"
check "AttentionMap (layer 2, 12 heads) from the container equals the host's" \
  python3 deploy/test_helpers.py compare "$WORK/attention-container.json" \
  "$WORK/attention-host.json"
kill "$HOST_SERVER_PID" && wait "$HOST_SERVER_PID" || true
HOST_SERVER_PID=""

# SIGTERM while a call is in flight: it completes, the server exits 0.
python3 -c 'import sys; [print(f"sentence {i}: " + "the quick brown fox jumps over the lazy dog " * 20) for i in range(64)]' \
  > "$WORK/long-inputs.txt"
"$ATTNCTL" encode --server "127.0.0.1:$GRPC_PORT" --json < "$WORK/long-inputs.txt" \
  > "$WORK/in-flight.json" 2> "$WORK/in-flight.log" &
in_flight=$!
sleep 0.3
stop_start=$SECONDS
docker_cli stop -t 40 "$CONTAINER" > /dev/null
check "docker stop: SIGTERM drained and exited 0 in $((SECONDS - stop_start)) s" \
  test "$(podman inspect --format '{{.State.ExitCode}}' "$CONTAINER")" = 0
check "the call in flight during docker stop completed" wait "$in_flight"
docker_cli logs "$CONTAINER" > "$WORK/container.log" 2>&1
check "the container logged the drain" grep -q "drained; exiting" "$WORK/container.log"
docker_cli rm "$CONTAINER" > /dev/null

# --- 5. docker-compose with a real Prometheus -------------------------------------------------
sed "s/127\.0\.0\.1:9464/127.0.0.1:$METRICS_PORT/" deploy/prometheus.yml > "$WORK/prometheus.yml"
head -c 32 /dev/urandom | base64 > "$WORK/trainer.token"
chown 10001:10001 "$WORK/trainer.token" # the image's user reads the bind-mounted secret
chmod 0400 "$WORK/trainer.token"
cat > "$WORK/compose.env" << EOF
ATTNSERVE_HOST=127.0.0.1
ATTNSERVE_PORT=$GRPC_PORT
ATTNSERVE_METRICS_PORT=$METRICS_PORT
ATTNSERVE_THREADS=2
ATTNSERVE_TOKEN_FILE=$WORK/trainer.token
PROMETHEUS_LISTEN=127.0.0.1:$PROMETHEUS_PORT
PROMETHEUS_CONFIG=$WORK/prometheus.yml
EOF
log "docker-compose up (attnserve :$GRPC_PORT, Prometheus :$PROMETHEUS_PORT)"
compose up -d --no-build > "$WORK/compose-up.log" 2>&1 || die "docker-compose up (see compose-up.log)"
compose_container="${PROJECT}_attnserve_1"
healthy=0
for _ in $(seq 240); do
  if podman healthcheck run "$compose_container" > /dev/null 2>&1; then healthy=1; break; fi
  sleep 0.5
done
((healthy)) || { compose logs > "$WORK/compose.log" 2>&1; die "compose attnserve never healthy"; }
pass "docker-compose: attnserve healthy"
for i in 1 2 3; do
  "$ATTNCTL" encode --server "127.0.0.1:$GRPC_PORT" --text "compose request $i" > /dev/null ||
    die "Encode against the compose service"
done
# The token secret enables the Trainer; a commit lands in the named volume.
printf '{"anchor": "%s", "positive": "%s"}\n' "a red bicycle" "the tuesday meeting" \
  "fresh bread" "a broken umbrella" > "$WORK/pairs.jsonl"
finetune_through_compose() {
  "$ATTNCTL" finetune --server "127.0.0.1:$GRPC_PORT" --token-file "$WORK/trainer.token" \
    --data "$WORK/pairs.jsonl" --objective contrastive --epochs 1 --commit \
    --description "deploy test" > "$WORK/finetune.log" 2>&1
}
check "fine-tune with the compose secret's token commits a version" finetune_through_compose
check "the committed version is in the named volume" \
  docker_cli exec "$compose_container" sh -c 'ls /var/lib/attnserve/store | grep -q "^ft-"'
PROMETHEUS_URL="http://127.0.0.1:$PROMETHEUS_PORT"
check "Prometheus scraped attnserve_requests_total{method=Encode,code=OK} >= 3" \
  python3 deploy/test_helpers.py prom-wait "$PROMETHEUS_URL" attnserve_requests_total \
  --label method=Encode --label code=OK --label job=attnserve --min 3 --timeout 90
check "Prometheus scraped attnserve_finetune_steps_total >= 1" \
  python3 deploy/test_helpers.py prom-wait "$PROMETHEUS_URL" attnserve_finetune_steps_total \
  --min 1 --timeout 60
check "every Grafana dashboard query is valid PromQL" \
  python3 deploy/test_helpers.py prom-exprs "$PROMETHEUS_URL" \
  deploy/grafana/attnserve-dashboard.json
compose stop --timeout 40 > "$WORK/compose-stop.log" 2>&1
check "docker-compose stop: attnserve drained and exited 0" \
  test "$(podman inspect --format '{{.State.ExitCode}}' "$compose_container")" = 0
compose logs > "$WORK/compose.log" 2>&1 || true
compose down -v --timeout 40 > "$WORK/compose-down.log" 2>&1 || fail "docker-compose down -v"
rm -f "$WORK/compose.env"

# --- 6. Kubernetes manifests ------------------------------------------------------------------
VENV="$ROOT/.venv-deploy"
if [[ ! -x "$VENV/bin/kubernetes-validate" ]]; then
  log "creating $VENV (kubernetes-validate: Kubernetes' OpenAPI schemas, offline)"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==1.37.0" \
    > "$WORK/pip.log" 2>&1 || die "pip install kubernetes-validate (see pip.log)"
fi
check "deploy/k8s passes the schema (strict) and consistency checks" \
  "$VENV/bin/python" deploy/k8s/check_manifests.py --kubernetes-version 1.29.0 \
  --dockerfile Dockerfile deploy/k8s
check "kubectl kustomize deploy/k8s renders" \
  sh -c "kubectl kustomize '$ROOT/deploy/k8s' > '$WORK/k8s-rendered.yaml'"

# --- 7. KServe and the replicated deployment (issue 35) ---------------------------------------
check "deploy/k8s/kserve passes KServe's published schemas (its SDK's CRD models) and cross-checks" \
  "$VENV/bin/python" deploy/k8s/kserve/check_kserve.py --cache "$ROOT/.cache/kserve-wheels" \
  deploy/k8s/kserve
check "deploy/compose-replicas.yml is a valid compose file" \
  env ATTNSERVE_TOKEN_FILE="$WORK/trainer.token" docker-compose -f deploy/compose-replicas.yml config -q
check "deploy/replicas/haproxy.cfg is valid for HAProxy" \
  env LB_BIND=127.0.0.1 LB_GRPC_PORT=1 LB_HTTP_PORT=2 LB_STATS_PORT=3 R1_HOST=127.0.0.1 \
  R1_GRPC_PORT=4 R1_HTTP_PORT=5 R2_HOST=127.0.0.1 R2_GRPC_PORT=6 R2_HTTP_PORT=7 \
  R3_HOST=127.0.0.1 R3_GRPC_PORT=8 R3_HTTP_PORT=9 sh -c 'command -v haproxy > /dev/null ||
    apt-get install -y -qq --no-install-recommends haproxy > /dev/null; haproxy -c -q -f deploy/replicas/haproxy.cfg'
check "replicated deployment: promotion, SIGKILL failover, rolling restart, Prometheus, autoscaling signal" \
  deploy/replicas_test.sh

((FAILED == 0)) || exit 1
log "image ${IMAGE_MB} MB, built in ${BUILD_SECONDS} s; run -> healthy $HEALTHY_SECONDS s"
