#!/usr/bin/env bash
# Build what llamaspec needs to put a target model on llama.cpp RPC servers:
#   1. llama-cpp-python 0.3.36 in the venv, with GGML_RPC=ON (the RPC client): scripts/install.sh
#      builds it so (scripts/cpu_cmake_args.sh); when llama_supports_rpc() says the installed one
#      lacks it, it is rebuilt by scripts/build_llama.sh, patched as install.sh would;
#   2. llama.cpp's rpc-server from the same sdist, at .rpc/bin/rpc-server.
#
# Default: rpc-server is compiled from the sdist's tools/rpc/rpc-server.cpp and linked against
# the venv's own libggml*.so (seconds, not minutes), so client and server run the very same
# ggml build and RPC protocol. --standalone instead builds a self-contained, statically linked
# rpc-server with CMake (several minutes), .rpc/bin/rpc-server-standalone, to copy to other
# machines with the same CPU features (or run this script on each of them).
#
# Idempotent: skips each step whose result is already there for this llama-cpp-python build.
# Usage: scripts/build_rpc.sh [--standalone]      (PYTHON=... to use another interpreter)
#
# SECURITY: rpc-server has no authentication and runs whatever graph a client sends; bind it
# to 127.0.0.1 or to an interface of a trusted, private network only. The standalone binary is
# upstream's as is: start it with SIGPIPE ignored (bash -c "trap '' PIPE; exec rpc-server ...").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
VERSION=0.3.36
OUT=$ROOT/.rpc
STANDALONE=0
for arg in "$@"; do
  case "$arg" in
    --standalone) STANDALONE=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "build_rpc.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ -x "$PY" ]] || { echo "build_rpc.sh: no Python at $PY: run scripts/install.sh first (or set PYTHON)" >&2; exit 1; }
CMAKE_FLAGS="$(scripts/cpu_cmake_args.sh)"
SO=so
[[ "$(uname -s)" == Darwin ]] && SO=dylib

probe() {  # prints "<version> <rpc 0|1> <lib dir>"
  "$PY" - <<'EOF'
import os, llama_cpp
from llama_cpp import llama_cpp as low
print(llama_cpp.__version__, int(low.llama_supports_rpc()), os.path.dirname(low._lib._name))
EOF
}

# 1. the RPC client: llama-cpp-python with GGML_RPC=ON
read -r have rpc libdir < <(probe 2>/dev/null || echo "none 0 -")
if [[ "$have" != "$VERSION" || "$rpc" != 1 ]]; then
  echo "build_rpc.sh: llama-cpp-python $VERSION lacks RPC support; rebuilding it (several minutes)..." >&2
  LLAMASPEC_REBUILD=1 VENV="$("$PY" -c 'import sys; print(sys.prefix)')" scripts/build_llama.sh
  probed=$(probe) || { echo "build_rpc.sh: llama_cpp does not import after the rebuild" >&2; exit 1; }
  read -r have rpc libdir <<< "$probed"
  [[ "$rpc" == 1 ]] || { echo "build_rpc.sh: llama-cpp-python still lacks RPC support" >&2; exit 1; }
else
  echo "build_rpc.sh: llama-cpp-python $VERSION already has RPC support ($libdir)" >&2
fi

# 2. the sdist: rpc-server.cpp and the ggml headers of exactly this version
mkdir -p "$OUT/bin" "$OUT/src"
SRC=$OUT/src/llama_cpp_python-$VERSION
if [[ ! -f "$SRC/vendor/llama.cpp/tools/rpc/rpc-server.cpp" ]]; then
  "$PY" -m pip download --no-cache-dir --no-binary llama-cpp-python --no-deps -d "$OUT/src" \
    "llama-cpp-python==$VERSION" >&2
  tar -xzf "$OUT/src/llama_cpp_python-$VERSION.tar.gz" -C "$OUT/src"
fi
LLAMA=$SRC/vendor/llama.cpp

# 3. rpc-server, linked against the venv's ggml (stamp: version + hash of that ggml)
for lib in ggml-rpc ggml-base; do
  [[ -f "$libdir/lib$lib.$SO" ]] || { echo "build_rpc.sh: $libdir/lib$lib.$SO not found" >&2; exit 1; }
done
ggml_hash=$(cat "$libdir/libggml-rpc.$SO" "$libdir/libggml-base.$SO" | sha256sum | cut -c1-16)
stamp="llama-cpp-python $VERSION sigpipe-ign $ggml_hash"
if [[ -x "$OUT/bin/rpc-server" && "$(cat "$OUT/bin/rpc-server.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "build_rpc.sh: $OUT/bin/rpc-server is up to date" >&2
else
  echo "build_rpc.sh: compiling rpc-server against $libdir" >&2
  # Upstream rpc-server sends without MSG_NOSIGNAL: a client that dies while the server writes
  # kills the server with SIGPIPE (seen here: exit 141). One extra translation unit ignores
  # SIGPIPE at startup, so a lost client only ends that connection; the server keeps serving.
  printf '%s\n' '#include <csignal>' \
    'namespace { struct ignore_sigpipe { ignore_sigpipe() { std::signal(SIGPIPE, SIG_IGN); } } ignore_sigpipe_now; }' \
    > "$OUT/src/ignore_sigpipe.cpp"
  ${CXX:-c++} -O2 -std=c++17 -pthread -I"$LLAMA/ggml/include" "$LLAMA/tools/rpc/rpc-server.cpp" \
    "$OUT/src/ignore_sigpipe.cpp" -L"$libdir" -lggml -lggml-base -Wl,-rpath,"$libdir" -o "$OUT/bin/rpc-server.tmp"
  mv "$OUT/bin/rpc-server.tmp" "$OUT/bin/rpc-server"
  echo "$stamp" > "$OUT/bin/rpc-server.stamp"
fi

# 4. optionally a self-contained rpc-server (static ggml) from the same sdist
if [[ "$STANDALONE" == 1 ]]; then
  sstamp="llama-cpp-python $VERSION standalone $CMAKE_FLAGS"
  if [[ -x "$OUT/bin/rpc-server-standalone" && "$(cat "$OUT/bin/rpc-server-standalone.stamp" 2>/dev/null)" == "$sstamp" ]]; then
    echo "build_rpc.sh: $OUT/bin/rpc-server-standalone is up to date" >&2
  else
    echo "build_rpc.sh: building a standalone rpc-server with CMake (several minutes)..." >&2
    # shellcheck disable=SC2086
    cmake -S "$LLAMA" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF $CMAKE_FLAGS >&2
    cmake --build "$OUT/build" -j "$(nproc 2>/dev/null || echo 2)" --target ggml-rpc-server >&2
    cp "$OUT/build/bin/ggml-rpc-server" "$OUT/bin/rpc-server-standalone.tmp"
    mv "$OUT/bin/rpc-server-standalone.tmp" "$OUT/bin/rpc-server-standalone"
    echo "$sstamp" > "$OUT/bin/rpc-server-standalone.stamp"
  fi
fi

"$OUT/bin/rpc-server" --help >/dev/null 2>&1 || { echo "build_rpc.sh: $OUT/bin/rpc-server does not run" >&2; exit 1; }
echo "$OUT/bin/rpc-server"
