#!/usr/bin/env bash
# Build llama-cpp-python 0.3.36 with the batch-invariance patches in cpp_patches/ into
# ./.venv-patched (a second venv; ./.venv keeps the stock build), then install llamaspec there.
#
#   scripts/build_patched.sh            # idempotent: skips the build when the venv already
#                                       # holds a build of exactly these patches
#   LLAMASPEC_REBUILD=1 scripts/build_patched.sh   # force a rebuild
#   EXTRA_CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" ...    # extra llama.cpp options (changes the marker)
#
# Steps: pip download the sdist (vendored llama.cpp), apply cpp_patches/*.patch in name order,
# build with the AMX-safe flags of scripts/cpu_cmake_args.sh (--no-cache-dir so no wheel built
# with other flags or without the patches is ever reused), pip install -e . of the project.
# The patched CPU backend reports "BATCH_INVARIANT = 16" in llama_print_system_info(); the
# environment variable GGML_CPU_BATCH_INVARIANT=N changes the largest invariant batch at run
# time (0 = stock behaviour, for side-by-side measurements with one build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PYTHON="${PYTHON:-python3}"
VENV="${VENV_PATCHED:-$ROOT/.venv-patched}"
VERSION=0.3.36
MARKER="$VENV/.llamaspec-patched"

shopt -s nullglob
patches=("$ROOT"/cpp_patches/*.patch)
shopt -u nullglob
[[ ${#patches[@]} -gt 0 ]] || { echo "no patches in cpp_patches/" >&2; exit 1; }

cmake_args="$(scripts/cpu_cmake_args.sh) ${EXTRA_CMAKE_ARGS:-}"
stamp="$( { cat "${patches[@]}"; echo "version=$VERSION"; echo "cmake=$cmake_args"; } | sha256sum | cut -d' ' -f1)"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"

if [[ -z "${LLAMASPEC_REBUILD:-}" && -f "$MARKER" && "$(cat "$MARKER")" == "$stamp" ]] && \
   "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "patched llama-cpp-python $VERSION already built in $VENV (patch hash ${stamp:0:12})" >&2
else
  "$VENV/bin/python" -m pip install -q --upgrade pip wheel
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$VENV/bin/python" -m pip download -q --no-cache-dir --no-binary :all: --no-deps \
      -d "$work" "llama-cpp-python==$VERSION"
  tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
  src="$work/llama_cpp_python-$VERSION"
  for p in "${patches[@]}"; do
    echo "applying $(basename "$p")" >&2
    patch -d "$src" -p1 --forward --batch < "$p"
  done
  export CMAKE_ARGS="$cmake_args"
  echo "building patched llama-cpp-python $VERSION with CMAKE_ARGS=$CMAKE_ARGS (takes several minutes)" >&2
  start=$(date +%s)
  rm -f "$MARKER"
  "$VENV/bin/python" -m pip install --no-cache-dir --force-reinstall --no-deps "$src"
  echo "built in $(( $(date +%s) - start )) s" >&2
  # llama-cpp-python's own dependencies (installed --no-deps above so nothing else is rebuilt)
  "$VENV/bin/python" -m pip install -q numpy typing-extensions diskcache jinja2
  echo "$stamp" > "$MARKER"
fi

"$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
"$VENV/bin/python" - <<'PY'
import llama_cpp
llama_cpp.llama_backend_init()
info = llama_cpp.llama_print_system_info().decode()
assert "BATCH_INVARIANT" in info, "the installed llama-cpp-python is not the patched build: " + info
print("patched build OK:", info.strip())
PY
