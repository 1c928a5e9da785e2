#!/usr/bin/env bash
# The Python conformance suite: the official `openai` SDK (pinned in
# requirements.txt) in a venv this script creates, against a live stack
# started by the harness's `stack` binary (build it first:
# `cargo build --release --workspace --bins`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements.txt" "$venv/requirements.installed"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$venv/requirements.installed"
fi
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
