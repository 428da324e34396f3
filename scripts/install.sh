#!/usr/bin/env bash
# Install llamaspec into ./.venv, building llama-cpp-python 0.3.36 from source for this CPU.
# Why from source: the stock build enables every extension the CPU advertises, including
# AMX, which faults on some virtual machines; cpu_cmake_args.sh picks safe flags instead.
# --no-cache-dir keeps pip from reusing a wheel built earlier with other flags.
# A venv that already holds llama-cpp-python 0.3.36 is reused (set LLAMASPEC_REBUILD=1 to force).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip wheel
if [[ -n "${LLAMASPEC_REBUILD:-}" ]] || ! .venv/bin/python -c \
    "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '0.3.36')" 2>/dev/null; then
  export CMAKE_ARGS="$(scripts/cpu_cmake_args.sh)"
  echo "building llama-cpp-python 0.3.36 with CMAKE_ARGS=$CMAKE_ARGS (takes several minutes)" >&2
  .venv/bin/python -m pip install --no-cache-dir --force-reinstall --no-deps llama-cpp-python==0.3.36
fi
.venv/bin/python -m pip install -q -e ".[test,plot]"
# llama.cpp's rpc-server from the same sdist, linked against this build (seconds): --target-rpc.
scripts/build_rpc.sh >/dev/null
