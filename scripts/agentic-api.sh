#!/usr/bin/env bash
# vLLM's Agentic API (`agentic-api` on PyPI, pinned), the yardstick
# `agentbench` runs beside the gateway: its Rust Responses server
# (`agentic-server`, HTTP+SSE and WebSocket) in front of the same
# llama-server. Installed once from PyPI into a venv under target/ (the
# base package: no vLLM, no GPU libraries), then reused. Prints the path of
# its `agentic-server` binary.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/agentic-api-venv"
version="0.9.0"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("agentic-api"))' 2>/dev/null)" != "$version" ]; then
    echo "installing agentic-api $version from PyPI (once)" >&2
    "$venv/bin/pip" install --quiet "agentic-api==$version" >&2
fi
echo "$venv/bin/agentic-server"
