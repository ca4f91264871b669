#!/usr/bin/env bash
# The benchmark, in one command: sets up its peers, builds ours, runs bench/harness.py.
#
#   bench/run.sh                       # everything; writes bench/results/latest.json and
#                                      # bench/RESULTS.md
#   bench/run.sh --sections served     # extra arguments go to bench/harness.py (--help)
#   bench/run.sh --setup-only          # the set-up below, no benchmark (then `ctest -L bench`
#                                      # runs the smoke with every peer)
#
# Set-up, idempotent (a second run skips what is done):
#   1. scripts/setup.sh --no-build: Debian packages and the default model;
#   2. the peers' Debian packages: python3-torch (1.13, CPU), python3-venv, libopenblas0-openmp
#      (Debian's torch is slow on the reference BLAS);
#   3. .venv-bench: Debian's python3 venv with --system-site-packages (torch, numpy from Debian)
#      plus bench/requirements.txt from PyPI (onnxruntime, onnx, transformers);
#   3b. .venv-bench-openvino: Debian's python3 venv without system packages (openvino and nncf
#      need numpy 2) plus bench/requirements-openvino.txt from PyPI;
#   4. the ONNX export (bench/export_onnx.py) into .cache/bench/onnx, its NNCF int8 quantisation
#      for OpenVINO (bench/quantize_openvino.py) beside it, and the CTranslate2 conversion
#      (bench/export_ct2.py) into .cache/bench/ct2, each redone when its input or script changes;
#   5. a Release build of attn-bench-engine, attn-bench-train, attn-bench-explain, attn-load-gen
#      and attnserve in $ATTN_BUILD_DIR (default build/).
#   (and the same export of all-mpnet-base-v2 into .cache/bench/onnx-mpnet when it is installed:
#   the "mpnet" section's rows)
# Environment: ATTN_BUILD_DIR, ATTN_MODEL_DIR, ATTN_MPNET_MODEL_DIR (as scripts/setup.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ATTN_BUILD_DIR:-$ROOT/build}"
MODEL_DIR="${ATTN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}"
MPNET_DIR="${ATTN_MPNET_MODEL_DIR:-$ROOT/models/all-mpnet-base-v2}"
VENV="$ROOT/.venv-bench"
ONNX_DIR="$ROOT/.cache/bench/onnx"
MPNET_ONNX_DIR="$ROOT/.cache/bench/onnx-mpnet"
CT2_DIR="$ROOT/.cache/bench/ct2"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,26p' "$0"
  exit 0
fi

SETUP_ONLY=0
if [[ "${1:-}" == "--setup-only" ]]; then
  SETUP_ONLY=1
  shift
fi

log() { printf '\033[1m[bench]\033[0m %s\n' "$*"; }

# --- 1. packages and the model (the project's own set-up) -----------------------------------
ATTN_MODEL_DIR="$MODEL_DIR" "$ROOT/scripts/setup.sh" --no-build

# --- 2. the peers' Debian packages -------------------------------------------------------------
PEER_PACKAGES=(python3-torch python3-venv python3-pip python3-yaml python3-requests
               libopenblas0-openmp)
missing=()
for pkg in "${PEER_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "run.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  log "installing Debian packages: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- 3. the peers' virtualenv ------------------------------------------------------------------
requirements_sha="$(sha256sum "$ROOT/bench/requirements.txt" | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "making $VENV (Debian python3, --system-site-packages)"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
if [[ "$(cat "$VENV/.bench-requirements" 2>/dev/null)" != "$requirements_sha" ]]; then
  log "installing bench/requirements.txt into $VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$ROOT/bench/requirements.txt"
  echo "$requirements_sha" > "$VENV/.bench-requirements"
fi

OV_VENV="$ROOT/.venv-bench-openvino"
openvino_sha="$(sha256sum "$ROOT/bench/requirements-openvino.txt" | cut -d' ' -f1)"
if [[ ! -x "$OV_VENV/bin/python" ]]; then
  log "making $OV_VENV (Debian python3, its own numpy 2)"
  /usr/bin/python3 -m venv "$OV_VENV"
fi
if [[ "$(cat "$OV_VENV/.bench-requirements" 2>/dev/null)" != "$openvino_sha" ]]; then
  log "installing bench/requirements-openvino.txt into $OV_VENV"
  "$OV_VENV/bin/python" -m pip install --disable-pip-version-check -q \
    -r "$ROOT/bench/requirements-openvino.txt"
  echo "$openvino_sha" > "$OV_VENV/.bench-requirements"
fi

# OpenBLAS 0.3.21 does not recognise recent Intel CPUs and falls back to slow kernels; SkylakeX
# is right for any CPU with AVX-512 (see ../shared/DESIGN.md, "Performance peers").
if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && grep -qw avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi

# --- 4. the ONNX export --------------------------------------------------------------------------
export_current() {  # out_dir model_dir [exporter [required file...]]
  "$VENV/bin/python" - "$1" "$2" "${3:-$ROOT/bench/export_onnx.py}" "${@:4}" <<'PY'
import hashlib, json, os, sys
out_dir, model_dir, exporter = sys.argv[1:4]
required = sys.argv[4:] or ["model-fp32.onnx", "model-int8.onnx", "model-export.onnx"]
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
try:
    meta = json.load(open(os.path.join(out_dir, "export.json")))
except (OSError, ValueError):
    sys.exit(1)
ok = (meta.get("weights_sha256") == sha(os.path.join(model_dir, "model.safetensors"))
      and meta.get("exporter_sha256") == sha(exporter)
      and all(os.path.exists(os.path.join(out_dir, f)) for f in required))
sys.exit(0 if ok else 1)
PY
}
if ! export_current "$ONNX_DIR" "$MODEL_DIR"; then
  log "exporting the model to ONNX (fp32 + quantize_dynamic int8) into $ONNX_DIR"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$ROOT/bench/export_onnx.py" \
    --model-dir "$MODEL_DIR" --out-dir "$ONNX_DIR" > /dev/null
fi
# OpenVINO's int8 model: NNCF on the export, redone with a new export or quantiser.
nncf_stamp="$(sha256sum "$ONNX_DIR/model-export.onnx" "$ROOT/bench/quantize_openvino.py" \
  "$ROOT/bench/sentences.py" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$ONNX_DIR/model-int8-nncf.stamp" 2>/dev/null)" != "$nncf_stamp" ||
      ! -f "$ONNX_DIR/model-int8-nncf.xml" ]]; then
  log "quantising the export for OpenVINO (NNCF, 300 calibration sentences) in $ONNX_DIR"
  (cd "$ROOT/bench" && "$OV_VENV/bin/python" quantize_openvino.py --model-dir "$MODEL_DIR" \
    --onnx-dir "$ONNX_DIR" > /dev/null)
  echo "$nncf_stamp" > "$ONNX_DIR/model-int8-nncf.stamp"
fi
if ! export_current "$CT2_DIR" "$MODEL_DIR" "$ROOT/bench/export_ct2.py" model.bin; then
  log "converting the model for CTranslate2 into $CT2_DIR"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$ROOT/bench/export_ct2.py" \
    --model-dir "$MODEL_DIR" --out-dir "$CT2_DIR" > /dev/null
fi
# all-mpnet-base-v2 (the mpnet rows) by the same recipe, when installed (scripts/setup.sh
# --model all-mpnet-base-v2); without it those rows say n/a.
if [[ -f "$MPNET_DIR/config.json" ]] && ! export_current "$MPNET_ONNX_DIR" "$MPNET_DIR"; then
  log "exporting all-mpnet-base-v2 to ONNX into $MPNET_ONNX_DIR"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$ROOT/bench/export_onnx.py" \
    --model-dir "$MPNET_DIR" --out-dir "$MPNET_ONNX_DIR" > /dev/null
fi

# --- 5. ours -----------------------------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  log "configuring $BUILD_DIR (Release)"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DATTN_DEFAULT_MODEL_DIR="$MODEL_DIR"
fi
log "building the bench tools and attnserve in $BUILD_DIR"
cmake --build "$BUILD_DIR" -j2 --target attn-bench-engine attn-bench-train attn-bench-explain \
  attn-bench-matmul-peak attn-load-gen attnserve

if ((SETUP_ONLY)); then
  log "set up; not running the benchmark (--setup-only)"
  exit 0
fi

# --- run -----------------------------------------------------------------------------------------
cd "$ROOT"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 exec /usr/bin/python3 "$ROOT/bench/harness.py" \
  --build-dir "$BUILD_DIR" --model-dir "$MODEL_DIR" --venv "$VENV" --onnx-dir "$ONNX_DIR" \
  --openvino-venv "$OV_VENV" --ct2-dir "$CT2_DIR" \
  --mpnet-model-dir "$MPNET_DIR" --mpnet-onnx-dir "$MPNET_ONNX_DIR" \
  --results-md "$ROOT/bench/RESULTS.md" --command "bench/run.sh${*:+ $*}" "$@"
