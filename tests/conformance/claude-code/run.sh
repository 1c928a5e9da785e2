#!/usr/bin/env bash
# Claude Code and the official Anthropic TypeScript SDK: the pinned
# `@anthropic-ai/claude-code` (its native binary comes as an optional
# package) and `@anthropic-ai/sdk` (package.json and package-lock.json)
# installed with `npm ci` into node_modules/ here, again only when the
# lock file changes, then `claude -p` and one streamed SDK turn against
# `gateway up --engine synthetic` (claude-code.test.mjs). Build the
# gateway and worker first: `cargo build --release --workspace --bins`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/../npm-ci.sh" "$here"
cd "$here"
exec node --test --test-concurrency=1 "$@" claude-code.test.mjs
