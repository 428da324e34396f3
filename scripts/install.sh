#!/usr/bin/env bash
# Install llamaspec into ./.venv, building llama-cpp-python 0.3.36 from source for this CPU with
# the patches in cpp_patches/ (bit-exact, cheaper verify batches; LLAMASPEC_STOCK=1 for stock
# llama.cpp). Why from source: the stock wheel enables every extension the CPU advertises,
# including AMX, which faults on some virtual machines; cpu_cmake_args.sh picks safe flags.
# A venv that already holds this exact build is reused (LLAMASPEC_REBUILD=1 forces a rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || {
  echo "error: llamaspec needs Python 3.10 or newer; $PYTHON is not (PYTHON=python3.11 scripts/install.sh)" >&2
  exit 1
}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv || \
  { echo "error: $PYTHON could not create a venv (on Debian/Ubuntu: apt install python3-venv)" >&2; exit 1; }
.venv/bin/python -m pip install -q --upgrade pip wheel
VENV="$PWD/.venv" scripts/build_llama.sh
.venv/bin/python -m pip install -q -e ".[test,plot]"
# llama.cpp's rpc-server from the same sdist, linked against this build (seconds): --target-rpc.
scripts/build_rpc.sh >/dev/null
