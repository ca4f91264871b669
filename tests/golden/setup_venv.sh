#!/usr/bin/env bash
# Creates the Python environment used ONLY to regenerate the golden fixtures
# (tests/golden/make_golden.py). CI never runs this.
#
#   bash tests/golden/setup_venv.sh        # as root (apt-get) on Debian bookworm
#
# Layout: Debian's python3-torch (1.13, CPU) in a venv made with Debian's own
# interpreter (/usr/bin/python3, --system-site-packages so torch and numpy come
# from Debian), plus the PyPI releases pinned in requirements.txt, which are
# the last ones that still accept torch 1.13.
# Result: /work/main/.venv-golden (git-ignored via /.venv*/).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${VENV_GOLDEN:-$repo/.venv-golden}"

if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends python3-torch python3-venv python3-pip
fi

if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi

"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$here/requirements.txt"

"$venv/bin/python" - <<'PY'
import numpy, torch, transformers, sentence_transformers, safetensors, tokenizers
print("torch", torch.__version__, "numpy", numpy.__version__,
      "transformers", transformers.__version__,
      "sentence_transformers", sentence_transformers.__version__,
      "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)
PY
echo "golden venv ready: $venv"
