#!/usr/bin/env bash
# Prints, one per line, the GGML_* options (NAME=ON) that build llama.cpp
# for this machine's x86 CPU, read from /proc/cpuinfo: AVX, AVX2, FMA,
# F16C, BMI2, AVX_VNNI and AVX-512 (with VBMI, VNNI, BF16) where present.
#
# Why not GGML_NATIVE / -march=native: some virtual machines list AMX in
# /proc/cpuinfo yet trap its instructions (llama.cpp then dies with SIGILL
# in its AMX kernels on the first matrix product), so AMX is never turned
# on here. Without these options the worker's llama.cpp is built for
# x86-64-v3 (AVX2, FMA, F16C), which runs anywhere the Docker image does.
#
# Used as `env $(bash scripts/ggml-cpu-flags.sh) cargo build ...`: the
# llama-cpp-sys-2 build script hands GGML_* variables to cmake. Prints
# nothing on other architectures.
set -euo pipefail
[ "$(uname -m)" = "x86_64" ] || exit 0
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$flags" == *" $1 "* ]]; }
has avx && echo GGML_AVX=ON
has avx2 && echo GGML_AVX2=ON
has fma && echo GGML_FMA=ON
has f16c && echo GGML_F16C=ON
has bmi2 && echo GGML_BMI2=ON
has avx_vnni && echo GGML_AVX_VNNI=ON
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
    echo GGML_AVX512=ON
    has avx512vbmi && echo GGML_AVX512_VBMI=ON
    has avx512_vnni && echo GGML_AVX512_VNNI=ON
    has avx512_bf16 && echo GGML_AVX512_BF16=ON
fi
exit 0
