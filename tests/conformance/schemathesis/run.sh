#!/usr/bin/env bash
# schemathesis against the live gateway: every operation of the served
# OpenAPI document (GET /v1/openapi.json) driven with generated valid and
# invalid inputs, every response checked against the document (status
# codes, content types, headers, schemas) with schemathesis's default
# checks. The tool is pinned (requirements.txt, fully frozen) in a venv
# under target/; the service is `gateway up --engine synthetic` (SIMULATED
# workers, unpaced) on free loopback ports. What is configured away from
# the defaults, and why, is in schemathesis.toml and tests/README.md.
#
# Build first: `cargo build --release -p gateway -p worker --bins`.
# Knobs: ST_MAX_EXAMPLES (per operation and phase, default 40), ST_SEED,
# ST_SCHEMA=tree (see below).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/target/schemathesis-venv"
if [ ! -x "$venv/bin/st" ] || ! cmp -s "$here/requirements.txt" "$venv/requirements.installed"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$venv/requirements.installed"
fi

gateway="$root/target/release/gateway"
[ -x "$gateway" ] && [ -x "$root/target/release/worker" ] ||
    { echo "build first: cargo build --release -p gateway -p worker --bins" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
admin="$(free_port)"
key="sk-schemathesis-$RANDOM$RANDOM"
logs="$root/target/e2e-logs"
mkdir -p "$logs"
log="$logs/schemathesis-gateway.log"

# The gateway's workers die with it (PR_SET_PDEATHSIG); stop it on any exit.
"$gateway" up --engine synthetic --ttft-ms 0 --tokens-per-second 0 \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" --dev-key "$key" \
    >"$log" 2>&1 &
gateway_pid=$!
trap 'kill "$gateway_pid" 2>/dev/null; wait "$gateway_pid" 2>/dev/null || true' EXIT

base="http://127.0.0.1:$port"
for _ in $(seq 150); do
    if python3 - "$base/v1/openapi.json" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1).read()
PY
    kill -0 "$gateway_pid" 2>/dev/null || { echo "gateway up exited; see $log" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 0.2
done

report="$root/target/schemathesis-report"
rm -rf "$report"
# schemathesis keeps a cache of past failures in the working directory:
# keep it under target/, out of the tree.
mkdir -p "$root/target/schemathesis-work"
cd "$root/target/schemathesis-work"
set +e
# The served document by default; ST_SCHEMA=tree reads docs/openapi.json
# instead (the same bytes, tests/tests/openapi_e2e.rs checks it) to try a
# change of the document without rebuilding the gateway.
schema="$base/v1/openapi.json"
[ "${ST_SCHEMA:-served}" = tree ] && schema="$root/docs/openapi.json"
"$venv/bin/st" --config-file "$here/schemathesis.toml" run "$schema" \
    --url "$base/v1" \
    -H "Authorization: Bearer $key" \
    --max-examples "${ST_MAX_EXAMPLES:-40}" \
    ${ST_SEED:+--seed "$ST_SEED"} \
    --request-timeout 20 \
    --report junit --report-dir "$report" \
    "$@"
status=$?
set -e
if [ "$status" -ne 0 ]; then
    echo "schemathesis failed (exit $status); gateway log: $log" >&2
fi
exit "$status"
