#!/usr/bin/env bash
# SMG (`sglang-router`, pinned), the peer router `routebench` measures this
# gateway against: installed once from PyPI into a venv under target/, then
# reused. Prints the venv's python (`python -m sglang_router.launch_router`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/smg-venv"
version="0.3.2"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang-router"))' 2>/dev/null)" != "$version" ]; then
    echo "installing sglang-router $version from PyPI (once)" >&2
    "$venv/bin/pip" install --quiet "sglang-router==$version" >&2
fi
echo "$venv/bin/python"
