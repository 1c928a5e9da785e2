#!/usr/bin/env bash
# SMG 1.13 (`smg` on PyPI, pinned), the peer router the benchmarks measure
# this gateway against (routebench, fairbench, hotbench): installed once
# from PyPI into a venv under target/, then reused. Prints the path of its
# `smg` command (`smg launch ...`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/smg-venv"
version="1.13.0"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))' 2>/dev/null)" != "$version" ]; then
    echo "installing smg $version from PyPI (once)" >&2
    "$venv/bin/pip" install --quiet "smg==$version" >&2
fi
echo "$venv/bin/smg"
