#!/usr/bin/env bash
# Print CMAKE_ARGS for building llama.cpp (inside llama-cpp-python) on this CPU.
# Why: GGML_NATIVE enables AMX where the CPU merely advertises it, and AMX faults on
# some virtual machines; so we switch NATIVE off and enable exactly the x86 extensions
# /proc/cpuinfo lists, never AMX. On macOS (Metal) or non-x86 CPUs the defaults are right.
set -euo pipefail
if [[ "$(uname -s)" != "Linux" || ! -r /proc/cpuinfo ]] || ! grep -q -w avx /proc/cpuinfo; then
  echo "${CMAKE_ARGS:-}"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
args="-DGGML_NATIVE=OFF"
add() { if [[ "$flags" == *" $1 "* ]]; then args+=" -D$2=ON"; else args+=" -D$2=OFF"; fi; }
add avx GGML_AVX
add avx2 GGML_AVX2
add fma GGML_FMA
add f16c GGML_F16C
add bmi2 GGML_BMI2
add avx512f GGML_AVX512
add avx512vbmi GGML_AVX512_VBMI
add avx512_vnni GGML_AVX512_VNNI
add avx512_bf16 GGML_AVX512_BF16
add avx_vnni GGML_AVX_VNNI
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
# The RPC client backend (llamaspec --target-rpc): no devices until servers are added, so local
# inference is unchanged (logits checked bit-identical with and without it).
args+=" -DGGML_RPC=ON"
echo "$args ${CMAKE_ARGS:-}"
