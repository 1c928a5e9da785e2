#!/usr/bin/env bash
# The Codex CLI test: the pinned `@openai/codex` (package.json and
# package-lock.json; the package ships its binary) installed with `npm ci`
# into node_modules/ here, again only when the lock file changes, then
# `codex exec` against `gateway up` (codex.test.mjs). Build the gateway and
# worker first: `cargo build --release --workspace --bins`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/../npm-ci.sh" "$here"
cd "$here"
exec node --test --test-concurrency=1 "$@" codex.test.mjs
