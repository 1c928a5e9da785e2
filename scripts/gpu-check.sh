#!/usr/bin/env bash
# The first run on a GPU: proves the CUDA worker (scripts/cuda-build.sh) on
# a machine with one NVIDIA GPU, beside the CPU build, in the same run, and
# writes what it saw to a report.
#
#   scripts/gpu-check.sh [--arch sm_NN] [--cuda-worker PATH] [--cpu-bin DIR] [--out DIR]
#                        [--suites "a b"] [--skip-e2e] [--skip-bench] [--detect-only]
#   scripts/gpu-check.sh --fake-results DIR [--out DIR]   # the report from saved results
#
# Steps (each one's output is kept in OUT/results/):
# 1. the device: nvidia-smi must list a GPU with a driver >= 580 (CUDA 13);
#    its compute capability is the architecture (sm_90 on H100/H200) unless
#    --arch says otherwise, and must match what the worker was built for.
#    No GPU, no driver, an old driver or a mismatch: a message and exit 3.
# 2. the binaries: the CUDA worker (--cuda-worker; default
#    target/cuda-<arch>/release/worker, built with scripts/cuda-build.sh
#    when absent: that needs network and 30-60 minutes on 2 cores) and the
#    CPU build (--cpu-bin, default target/release: gateway, worker, the
#    test binaries; built with cargo when absent). Two bin dirs are made in
#    OUT, bin-cpu and bin-cuda, identical but for the worker; the tests'
#    harness takes its binaries from IGW_BIN_DIR. libcublas.so.13 comes
#    from the system, else from cuda-build.sh's toolchain (LD_LIBRARY_PATH).
# 3. `gateway up` on the CUDA worker: one chat completion through it, the
#    worker's own line saying its layers went to the GPU, and the GPU's
#    process list while it runs.
# 4. the real-model end-to-end suites (--suites, test targets of tests/tests,
#    TARGET::FILTER for some of a target's tests; default llama_e2e,
#    planner_llama_e2e, engine_conformance::llama) against bin-cpu, then
#    bin-cuda.
# 5. realbench (tests/src/bin/realbench.rs) against each: the gateway +
#    llama worker's prefill (cold prompt tokens / time to first token) and
#    decode tokens/s, with llama.cpp's CPU llama-server as the yardstick of
#    both (LLAMA_SERVER, else scripts/llama-server.sh builds it once).
# 6. OUT/report.md (default OUT: target/gpu-check/<date>): the figures side
#    by side and a verdict.
#
# Exit status: 0 all passed, 1 a step failed (the report says which),
# 2 bad arguments, 3 no usable GPU. Needs: bash, curl, python3, cargo (to
# build what is missing), redis-server for the end-to-end suites.
# Environment: IGW_MODEL_FILE (default: scripts/fetch-model.sh's SmolLM2),
# LLAMA_SERVER, BENCH_THREADS (realbench's CPU threads, default min(nproc, 8)),
# NVIDIA_SMI (default nvidia-smi).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
MIN_DRIVER=580
EXIT_NO_GPU=3

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}
die() {
    echo "gpu-check: $*" >&2
    exit 2
}
no_gpu() {
    echo "gpu-check: no usable GPU: $*" >&2
    echo "gpu-check: this check needs one NVIDIA GPU and its driver >= $MIN_DRIVER (CUDA 13)" >&2
    exit "$EXIT_NO_GPU"
}
say() { printf '\n==> %s\n' "$*"; }

arch=""
cuda_worker=""
cpu_bin="$repo/target/release"
out=""
fake=""
suites="llama_e2e planner_llama_e2e engine_conformance::llama"
skip_e2e=false
skip_bench=false
detect_only=false
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --arch | --cuda-worker | --cpu-bin | --out | --fake-results | --suites)
            [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
            case "$1" in
                --arch) arch="$2" ;;
                --cuda-worker) cuda_worker="$2" ;;
                --cpu-bin) cpu_bin="$2" ;;
                --out) out="$2" ;;
                --fake-results) fake="$2" ;;
                --suites) suites="$2" ;;
            esac
            shift 2 ;;
        --skip-e2e) skip_e2e=true; shift ;;
        --skip-bench) skip_bench=true; shift ;;
        --detect-only) detect_only=true; shift ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if [ -n "$arch" ]; then
    arch="sm_${arch#sm_}"
    [[ "$arch" =~ ^sm_[0-9]{2,3}[af]?$ ]] || die "bad --arch '$arch' (want sm_NN, e.g. sm_90)"
fi
if [ -n "$fake" ]; then
    [ -d "$fake" ] || die "--fake-results $fake is not a directory"
fi
out="${out:-$repo/target/gpu-check/$(date +%Y%m%d-%H%M%S)}"
results="$out/results"

# ---- the report ------------------------------------------------------------------
# Everything below reads only files in $results, so the report is the same
# whether the steps ran here or the files came from --fake-results.

# `test result:` lines of a cargo test log -> "ok: N passed, M failed" etc.
suite_summary() {
    local log="$1" rc_file="${1%.log}.rc"
    if [ ! -f "$log" ]; then
        echo "not run"
        return
    fi
    local passed failed rc
    passed=$(sed -n 's/^test result: .* \([0-9]*\) passed.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
    failed=$(sed -n 's/^test result: .* \([0-9]*\) failed.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
    rc=$(cat "$rc_file" 2>/dev/null || echo 1)
    if [ "$rc" = 0 ] && [ "$failed" = 0 ]; then
        echo "ok: $passed passed"
    else
        echo "FAILED: $passed passed, $failed failed (exit $rc)"
    fi
}

# realbench's row for our target: "prompt ttft_ms warm_ms decode_tps c1 c4 c8"
# (the last round's, if there were several).
bench_row() {
    [ -f "$1" ] || return 0
    sed -n 's/^gateway + llama worker *//p' "$1" | tail -1 |
        awk '{ agg = ""; for (i = 5; i <= NF; i++) if ($i !~ /^c[0-9]+$/) agg = agg " " $i;
               print $1, $2, $3, $4 agg }'
}

# A figure of the row by name, "-" if missing.
bench_figure() {
    local row="$1" name="$2"
    [ -n "$row" ] || { echo "-"; return; }
    # shellcheck disable=SC2086
    set -- $row
    case "$name" in
        prompt) echo "$1" ;;
        ttft) echo "$2" ;;
        prefill) awk -v p="$1" -v t="$2" 'BEGIN { if (t > 0) printf "%.1f", p * 1000 / t; else print "-" }' ;;
        decode) echo "$4" ;;
        c8) echo "${7:--}" ;;
    esac
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", b / a; else print "-" }'
}

write_report() {
    local report="$out/report.md" failed=()
    local device worker_info
    device=$(cat "$results/device.txt" 2>/dev/null || echo "unknown")
    worker_info=$(cat "$results/cuda-worker.txt" 2>/dev/null || echo "unknown")
    {
        echo "# GPU check, $(cat "$results/date.txt" 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo
        echo "- GPU (nvidia-smi: name, compute capability, driver, memory): $device"
        echo "- CUDA worker: $worker_info"
        echo "- model: $(cat "$results/model.txt" 2>/dev/null || echo unknown)"
        echo
        echo "## gateway up on the CUDA worker"
        echo
        if [ -f "$results/up-cuda.status" ]; then
            local up
            up=$(cat "$results/up-cuda.status")
            echo "- $up"
            [[ "$up" == ok* ]] || failed+=("gateway up")
        else
            echo "- not run"
            failed+=("gateway up")
        fi
        if grep -q "offloading model layers to the GPU" "$results/up-cuda.log" 2>/dev/null; then
            echo "- the workers offloaded their layers to the GPU:"
            grep -m1 "offloading model layers to the GPU" "$results/up-cuda.log" | sed 's/^/    /'
        else
            echo "- NO worker said it offloaded its layers to the GPU"
            failed+=("GPU offload")
        fi
        if grep -q "found no usable GPU" "$results/up-cuda.log" 2>/dev/null; then
            echo "- a worker found no usable GPU (it ran on the CPU)"
            failed+=("GPU offload")
        fi
        if [ -s "$results/up-cuda-gpu-apps.txt" ]; then
            echo "- GPU processes while it ran (pid, name, memory):"
            sed 's/^/    /' "$results/up-cuda-gpu-apps.txt"
        fi
        echo
        echo "## End-to-end suites (same tests, same model)"
        echo
        echo "| suite | CPU build | CUDA build |"
        echo "|---|---|---|"
        local s cpu cuda
        local suite_list=()
        [ -f "$results/suites.txt" ] && mapfile -t suite_list <"$results/suites.txt"
        for s in "${suite_list[@]}"; do
            cpu=$(suite_summary "$results/e2e-cpu-${s//:/_}.log")
            cuda=$(suite_summary "$results/e2e-cuda-${s//:/_}.log")
            echo "| $s | $cpu | $cuda |"
            [[ "$cuda" == ok* ]] || failed+=("e2e $s (CUDA)")
            [[ "$cpu" == ok* ]] || failed+=("e2e $s (CPU)")
        done
        echo
        echo "## realbench: gateway + llama worker (llama-server on the CPU as the yardstick of both)"
        echo
        local cpu_row cuda_row
        cpu_row=$(bench_row "$results/realbench-cpu.txt")
        cuda_row=$(bench_row "$results/realbench-cuda.txt")
        [ -n "$cpu_row" ] || failed+=("realbench (CPU)")
        [ -n "$cuda_row" ] || failed+=("realbench (CUDA)")
        local v header=""
        for v in cuda cpu; do
            [ -n "$header" ] || header=$(grep -m1 '^realbench:' "$results/realbench-$v.txt" 2>/dev/null || true)
        done
        echo "${header:-realbench: no output}"
        echo
        echo "| figure | CPU build | CUDA build | CUDA / CPU |"
        echo "|---|---|---|---|"
        local f label a b
        for f in prompt prefill ttft decode c8; do
            case "$f" in
                prompt) label="cold prompt, tokens" ;;
                prefill) label="prefill tokens/s (cold prompt / TTFT)" ;;
                ttft) label="time to first token, ms" ;;
                decode) label="decode tokens/s, one stream" ;;
                c8) label="completion tokens/s, 8 streams" ;;
            esac
            a=$(bench_figure "$cpu_row" "$f")
            b=$(bench_figure "$cuda_row" "$f")
            case "$f" in
                prompt) echo "| $label | $a | $b | |" ;;
                ttft)
                    local r
                    r=$(ratio "$b" "$a")
                    [ "$r" = - ] || r="$r faster"
                    echo "| $label | $a | $b | $r |" ;;
                *) echo "| $label | $a | $b | $(ratio "$a" "$b") |" ;;
            esac
        done
        echo
        if ((${#failed[@]})); then
            echo "Verdict: FAIL ($(printf '%s\n' "${failed[@]}" | sort -u | paste -sd, - | sed 's/,/, /g'))"
        else
            echo "Verdict: PASS"
        fi
        echo
        echo "Logs: $results/"
    } >"$report"
    cat "$report"
    echo
    echo "gpu-check: report written to $report"
    ((${#failed[@]} == 0))
}

if [ -n "$fake" ]; then
    mkdir -p "$results"
    cp -R "$fake"/. "$results"/
    if write_report; then exit 0; else exit 1; fi
fi

# ---- 1. the device ---------------------------------------------------------------
# Sets `device` (nvidia-smi's line) and `arch`, or exits 3.
detect_gpu() {
    command -v "$NVIDIA_SMI" >/dev/null 2>&1 || no_gpu "nvidia-smi is not installed (no NVIDIA driver)"
    local q n cap driver found
    q=$("$NVIDIA_SMI" --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1) ||
        no_gpu "nvidia-smi failed: $(echo "$q" | head -1)"
    q=$(echo "$q" | sed '/^[[:space:]]*$/d')
    [ -n "$q" ] || no_gpu "nvidia-smi lists no GPU"
    n=$(echo "$q" | wc -l)
    if [ "$n" -gt 1 ]; then
        echo "gpu-check: $n GPUs; checking the first (CUDA_VISIBLE_DEVICES=0)" >&2
        export CUDA_VISIBLE_DEVICES=0
        q=$(echo "$q" | head -1)
    fi
    cap=$(echo "$q" | cut -d, -f2 | tr -d ' ')
    driver=$(echo "$q" | cut -d, -f3 | tr -d ' ')
    [[ "$cap" =~ ^[0-9]+\.[0-9]+$ ]] || no_gpu "nvidia-smi gave no compute capability ('$q')"
    [[ "${driver%%.*}" =~ ^[0-9]+$ ]] && [ "${driver%%.*}" -ge "$MIN_DRIVER" ] ||
        no_gpu "the driver is $driver; the CUDA 13 worker needs $MIN_DRIVER or newer"
    found="sm_${cap/./}"
    if [ -z "$arch" ]; then
        arch="$found"
    elif [ "$arch" != "$found" ]; then
        no_gpu "the GPU is $found (compute capability $cap) but --arch is $arch; its kernels would not load"
    fi
    device="${q#"${q%%[! ]*}"}"
}

detect_gpu
echo "gpu-check: GPU $device; architecture $arch"
if $detect_only; then
    exit 0
fi
command -v curl >/dev/null || die "curl is needed"
mkdir -p "$results"
echo "$device" >"$results/device.txt"
date -u +%Y-%m-%dT%H:%M:%SZ >"$results/date.txt"
echo "$suites" | tr ' ' '\n' | sed '/^$/d' >"$results/suites.txt"

# ---- 2. the binaries ---------------------------------------------------------------
cd "$repo"
if [ -d "$HOME/.cargo/bin" ]; then PATH="$HOME/.cargo/bin:$PATH"; fi
# The CPU build as the test command builds it (this machine's CPU kernels).
while read -r flag; do export "${flag?}"; done < <(bash scripts/ggml-cpu-flags.sh)

cuda_worker="${cuda_worker:-$repo/target/cuda-$arch/release/worker}"
if [ ! -x "$cuda_worker" ]; then
    say "no CUDA worker at $cuda_worker: building it (scripts/cuda-build.sh $arch)"
    # With the CPU build's GGML_* flags: the layers and sampling left on the
    # CPU run the same kernels in both builds.
    bash scripts/cuda-build.sh "$arch" --target-dir "$(dirname "$(dirname "$cuda_worker")")"
fi
[ -x "$cuda_worker" ] || die "no CUDA worker at $cuda_worker"

if [ ! -x "$cpu_bin/gateway" ] || [ ! -x "$cpu_bin/worker" ] || [ ! -x "$cpu_bin/realbench" ]; then
    [ "$cpu_bin" = "$repo/target/release" ] || die "--cpu-bin $cpu_bin lacks gateway, worker or realbench"
    say "building the CPU binaries (cargo build --release --bins)"
    cargo build --release -p gateway -p worker -p tests --bins
fi

# libcublas.so.13 and libcublasLt.so.13: the system's, else the toolchain's.
if ldd "$cuda_worker" | grep -q 'not found'; then
    cuda_lib="$(bash scripts/cuda-build.sh --toolchain-only | tail -1)/lib"
    export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
missing=$(ldd "$cuda_worker" | grep 'not found' || true)
[ -z "$missing" ] || die "the CUDA worker's libraries are missing: $missing"

make_bin_dir() { # dir worker
    rm -rf "$1"
    mkdir -p "$1"
    local f
    for f in "$cpu_bin"/*; do
        if [ -f "$f" ] && [ -x "$f" ]; then ln -s "$f" "$1/$(basename "$f")"; fi
    done
    ln -sfn "$2" "$1/worker"
}
make_bin_dir "$out/bin-cpu" "$cpu_bin/worker"
make_bin_dir "$out/bin-cuda" "$cuda_worker"
echo "$cuda_worker, $(($(stat -c %s "$cuda_worker") / 1048576)) MiB, for $arch, needs $(readelf -d "$cuda_worker" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | paste -sd' ' -)" \
    >"$results/cuda-worker.txt"

model="${IGW_MODEL_FILE:-$(bash scripts/fetch-model.sh)}"
export IGW_MODEL_FILE="$model"
basename "$model" >"$results/model.txt"

# ---- 3. gateway up on the CUDA worker --------------------------------------------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
say "gateway up on the CUDA worker"
port=$(free_port)
admin=$(free_port)
"$out/bin-cuda/gateway" up --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --model-file "$model" >"$results/up-cuda.log" 2>&1 &
up_pid=$!
started=$(date +%s)
status="fail: not ready within 300 s (see up-cuda.log)"
for _ in $(seq 600); do
    kill -0 "$up_pid" 2>/dev/null || { status="fail: gateway up exited (see up-cuda.log)"; break; }
    if curl -sf -o /dev/null "http://127.0.0.1:$port/v1/models" -H 'Authorization: Bearer sk-local-dev'; then
        code=$(curl -s -o "$results/up-cuda-reply.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" \
            -H 'Authorization: Bearer sk-local-dev' -H 'Content-Type: application/json' \
            -d '{"model":"base","messages":[{"role":"user","content":"Name three colours."}],"max_tokens":32,"temperature":0}' || true)
        "$NVIDIA_SMI" --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
            >"$results/up-cuda-gpu-apps.txt" 2>&1 || true
        if [ "$code" = 200 ]; then
            status="ok: ready in $(($(date +%s) - started)) s; chat completion HTTP 200: $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])[:120])' "$results/up-cuda-reply.json" 2>/dev/null || echo '?')"
        else
            status="fail: chat completion HTTP $code (see up-cuda-reply.json)"
        fi
        break
    fi
    sleep 0.5
done
kill "$up_pid" 2>/dev/null || true
wait "$up_pid" 2>/dev/null || true
echo "$status" >"$results/up-cuda.status"
echo "gateway up: $status"

# ---- 4. the end-to-end suites -------------------------------------------------------
redis_ok() { command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
if ! $skip_e2e; then
    if [ -z "${TEST_REDIS_URL:-}" ] && ! redis_ok && command -v redis-server >/dev/null; then
        redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize yes >/dev/null
        sleep 1
    fi
    for variant in cpu cuda; do
        for s in $suites; do
            say "end-to-end: $s on the $variant build"
            target="${s%%::*}"
            filter=()
            [ "$target" = "$s" ] || filter=("::${s#*::}")
            log="$results/e2e-$variant-${s//:/_}.log"
            rc=0
            IGW_BIN_DIR="$out/bin-$variant" cargo test --release -p tests --test "$target" -- \
                --test-threads 1 "${filter[@]}" >"$log" 2>&1 || rc=$?
            echo "$rc" >"${log%.log}.rc"
            echo "$s ($variant): $(suite_summary "$log")"
        done
    done
fi

# ---- 5. realbench ---------------------------------------------------------------------
if ! $skip_bench; then
    llama_server="${LLAMA_SERVER:-$(bash scripts/llama-server.sh)}"
    threads="${BENCH_THREADS:-$(($(nproc) < 8 ? $(nproc) : 8))}"
    for variant in cpu cuda; do
        say "realbench on the $variant build ($threads threads)"
        IGW_BIN_DIR="$out/bin-$variant" LLAMA_SERVER="$llama_server" "$cpu_bin/realbench" \
            --threads "$threads" >"$results/realbench-$variant.txt" 2>&1 ||
            echo "realbench ($variant) failed: see $results/realbench-$variant.txt"
    done
fi

# ---- 6. the report ----------------------------------------------------------------------
say "report"
write_report
