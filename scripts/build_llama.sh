#!/usr/bin/env bash
# Build llama-cpp-python 0.3.36 from its sdist into a venv (default ./.venv), with the patches in
# cpp_patches/ applied: batch-invariant small batches with multi-row kernels, so a verify batch
# is bit-identical to plain decoding and cheaper than stock. scripts/install.sh calls this.
#
#   scripts/build_llama.sh                        # idempotent: skips the build when the venv
#                                                 # already holds a build of exactly these inputs
#   LLAMASPEC_STOCK=1 scripts/install.sh          # llama.cpp's stock kernels (no patches)
#   LLAMASPEC_REBUILD=1 scripts/install.sh        # force a rebuild
#   EXTRA_CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" ...   # extra llama.cpp options (part of the stamp)
#
# Steps: pip download the sdist (vendored llama.cpp), apply cpp_patches/*.patch in name order,
# build a wheel with the AMX-safe flags of scripts/cpu_cmake_args.sh (--no-cache-dir, so no
# wheel built with other flags or patches is ever reused), then install it. A patch that does
# not apply or a failed build is one error line and leaves the venv's previous llama-cpp-python
# as it was (nothing is installed until the wheel exists).
# The patched CPU backend reports "BATCH_INVARIANT = 16 | MULTIROW = Q4_0,Q4_K,Q5_K,Q6_K,Q8_0,F16" in
# llama_print_system_info(); GGML_CPU_BATCH_INVARIANT=0 gives stock kernels at run time,
# GGML_CPU_MULTIROW=0 the per-row invariant kernels (or llamaspec.model.set_cpu_kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="${VENV:-$ROOT/.venv}"
VERSION=0.3.36
MARKER="$VENV/.llamaspec-build"
LOG="$VENV/llamaspec-build.log"

patches=()
if [[ -z "${LLAMASPEC_STOCK:-}" ]]; then
  shopt -s nullglob
  patches=("$ROOT"/cpp_patches/*.patch)
  shopt -u nullglob
  [[ ${#patches[@]} -gt 0 ]] || { echo "error: no patches in cpp_patches/ (LLAMASPEC_STOCK=1 builds stock)" >&2; exit 1; }
fi
kind=$([[ ${#patches[@]} -gt 0 ]] && echo patched || echo stock)
cmake_args="$(scripts/cpu_cmake_args.sh) ${EXTRA_CMAKE_ARGS:-}"
stamp="$( { [[ ${#patches[@]} -gt 0 ]] && cat "${patches[@]}"; echo "kind=$kind version=$VERSION cmake=$cmake_args"; } | sha256sum | cut -d' ' -f1)"

if [[ -z "${LLAMASPEC_REBUILD:-}" && -f "$MARKER" && "$(cat "$MARKER")" == "$stamp" ]] && \
   "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "llama-cpp-python $VERSION ($kind) already built in $VENV" >&2
  exit 0
fi

need() { command -v "$1" >/dev/null || { echo "error: $1 not found: $2" >&2; exit 1; }; }
[[ ${#patches[@]} -eq 0 ]] || need patch "the patches need it (apt install patch)"
need "${CXX:-c++}" "llama.cpp needs a C++ compiler (apt install g++, or set CXX)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "error: $1 (log: $LOG)" >&2; exit 1; }
: > "$LOG"
"$VENV/bin/python" -m pip download -q --no-cache-dir --no-binary llama-cpp-python --no-deps -d "$work" \
    "llama-cpp-python==$VERSION" >>"$LOG" 2>&1 || fail "downloading the llama-cpp-python $VERSION sdist failed"
tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION"
# ${a[@]+...}: bash 3.2 (macOS) calls an empty array unbound under set -u
for p in ${patches[@]+"${patches[@]}"}; do
  patch -d "$src" -p1 --forward --batch < "$p" >>"$LOG" 2>&1 || \
    fail "cpp_patches/$(basename "$p") does not apply to llama-cpp-python $VERSION"
done
echo "building $kind llama-cpp-python $VERSION with CMAKE_ARGS=$cmake_args (takes several minutes)" >&2
start=$(date +%s)
CMAKE_ARGS="$cmake_args" "$VENV/bin/python" -m pip wheel --no-cache-dir --no-deps -w "$work/wheel" "$src" \
    >>"$LOG" 2>&1 || fail "building $kind llama-cpp-python $VERSION failed"
rm -f "$MARKER"
"$VENV/bin/python" -m pip install -q --no-cache-dir --force-reinstall --no-deps "$work"/wheel/*.whl >>"$LOG" 2>&1 || \
    fail "installing the llama-cpp-python wheel failed"
# llama-cpp-python's own dependencies (installed --no-deps above so nothing else is rebuilt)
"$VENV/bin/python" -m pip install -q numpy typing-extensions diskcache jinja2 >>"$LOG" 2>&1 || \
    fail "installing llama-cpp-python's dependencies failed"
echo "$stamp" > "$MARKER"
echo "built in $(( $(date +%s) - start )) s: $("$VENV/bin/python" -c 'import llama_cpp; llama_cpp.llama_backend_init(); print(llama_cpp.llama_print_system_info().decode().strip())')" >&2
