#!/usr/bin/env bash
# `npm-ci.sh DIR`: installs DIR's pinned npm packages (package-lock.json)
# with `npm ci` into DIR/node_modules, again only when the lock file has
# changed since the last install.
set -euo pipefail
cd "$1"
if ! cmp -s package-lock.json node_modules/.package-lock.installed; then
    rm -rf node_modules
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.package-lock.installed
fi
