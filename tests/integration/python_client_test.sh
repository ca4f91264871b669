#!/usr/bin/env bash
# The Python client package's pytest suite against the real server (ctest:
# integration_python_client*_test). The fixture test installs client/python from this checkout
# into the test venv first (no dependencies, no build isolation: scripts/setup.sh put
# grpcio-tools, numpy, tqdm and pytest there), so the tests exercise the package as
# `pip install` builds it now.
# Usage: python_client_test.sh VENV_PYTHON ATTNSERVE_BINARY (--install | PYTEST_ARGS...)
set -euo pipefail
# Absolute paths (not realpath: the venv's python is a symlink that must stay one).
python="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
binary="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ ! -x "$python" ]]; then
  echo "test venv python $python not found: run scripts/setup.sh (it makes .venv-test)" >&2
  exit 1
fi
# --install: install the package and stop (the ctest fixture integration_python_client_install,
# run once before the pytest tests: reinstalling while another test imports the package would
# pull files from under it).
if [[ "${1:-}" == "--install" ]]; then
  # pip builds in the source tree (client/python/build): one install at a time.
  exec flock "${TMPDIR:-/tmp}/attnserve-python-client-install.lock" \
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation --force-reinstall "$root/client/python"
fi
cd "$root/client/python/tests"
ATTNSERVE_BINARY="$binary" exec "$python" -m pytest -q -p no:cacheprovider "$@"
