#!/usr/bin/env bash
# The Codex CLI test: the pinned `@openai/codex` (package.json and
# package-lock.json; the package ships its binary) installed with `npm ci`
# into node_modules/ here, again only when the lock file changes, then
# `codex exec` against `gateway up` (codex.test.mjs). Build the gateway and
# worker first: `cargo build --release --workspace --bins`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
if ! cmp -s package-lock.json node_modules/.package-lock.installed; then
    rm -rf node_modules
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.package-lock.installed
fi
exec node --test --test-concurrency=1 "$@" codex.test.mjs
