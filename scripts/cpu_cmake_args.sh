#!/usr/bin/env bash
# Print CMAKE_ARGS for building llama.cpp (inside llama-cpp-python) on this CPU.
# Why: GGML_NATIVE enables AMX where the CPU merely advertises it, and AMX faults on
# some virtual machines; so we switch NATIVE off and enable exactly the x86 extensions
# /proc/cpuinfo lists, never AMX. On macOS (Metal) or non-x86 CPUs the defaults are right.
# Everywhere: the RPC client backend (llamaspec --target-rpc); it has no devices until servers
# are added, so local inference is unchanged (logits checked bit-identical with and without it).
set -euo pipefail
if [[ "$(uname -s)" != "Linux" || ! -r /proc/cpuinfo ]] || ! grep -q -w avx /proc/cpuinfo; then
  echo "-DGGML_RPC=ON ${CMAKE_ARGS:-}"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
args="-DGGML_NATIVE=OFF"
add() {  # -D$1=ON when the CPU lists every one of the flags after it
  local option=$1 flag
  shift
  for flag in "$@"; do
    [[ "$flags" == *" $flag "* ]] || { args+=" -D$option=OFF"; return; }
  done
  args+=" -D$option=ON"
}
add GGML_AVX avx
add GGML_AVX2 avx2
add GGML_FMA fma
add GGML_F16C f16c
add GGML_BMI2 bmi2
# ggml's GGML_AVX512 compiles with -mavx512f, cd, vl, dq and bw: a CPU (or a VM's CPU model)
# with avx512f alone would fault.
add GGML_AVX512 avx512f avx512cd avx512vl avx512dq avx512bw
add GGML_AVX512_VBMI avx512vbmi
add GGML_AVX512_VNNI avx512_vnni
add GGML_AVX512_BF16 avx512_bf16
add GGML_AVX_VNNI avx_vnni
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
args+=" -DGGML_RPC=ON"
echo "$args ${CMAKE_ARGS:-}"
