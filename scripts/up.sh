#!/usr/bin/env bash
# The README's run command: on a fresh Debian machine with only the Rust
# toolchain, installs what is missing (scripts/system-deps.sh), fetches the
# reference model once (scripts/fetch-model.sh), builds, and runs
# `gateway up` (one real llama.cpp worker per model, the embedded store).
# Arguments go to `gateway up` (for example `--engine synthetic`, `--listen 127.0.0.1:8081`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -d "$HOME/.cargo/bin" ]; then PATH="$HOME/.cargo/bin:$PATH"; fi
bash scripts/system-deps.sh
model="$(bash scripts/fetch-model.sh)"
export IGW_MODEL_FILE="$model"
# llama.cpp built for this CPU (AVX-512 where present; scripts/ggml-cpu-flags.sh).
while read -r flag; do export "${flag?}"; done < <(bash scripts/ggml-cpu-flags.sh)
exec cargo run --release --bin gateway -- up "$@"
