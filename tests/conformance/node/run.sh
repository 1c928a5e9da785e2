#!/usr/bin/env bash
# The Node conformance suite: the official `openai` npm package (pinned in
# package.json and package-lock.json, installed with `npm ci` into
# node_modules/ here, again only when the lock file changes), run with the
# machine's Node and `node --test`, against stacks started by the harness's
# `stack` binary (build it first: `cargo build --release --workspace --bins`).
# Arguments go to `node --test` (for example `--test-name-pattern cancel`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/../npm-ci.sh" "$here"
cd "$here"
exec node --test --test-concurrency=1 "$@" test/
