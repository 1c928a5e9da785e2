#!/usr/bin/env bash
# Builds the CUDA worker (`worker --features cuda`: llama.cpp's CUDA backend)
# with a CUDA 13 toolchain taken from NVIDIA's PyPI wheels, so no NVIDIA
# installer, apt repository or root is needed. Prints the build time, the
# binary's size and the shared libraries it needs at run time.
#
#   scripts/cuda-build.sh [ARCH] [--target-dir DIR] [--cache DIR] [--cuda-home DIR] [--toolchain-only]
#
# ARCH: the GPU architecture the kernels are compiled for, as sm_NN or NN,
# or a CMake list ("80;90"). Default sm_90 (H100/H200). One architecture
# keeps the compile to 30-60 minutes on 2 cores; every added one costs about
# as much again. Kernels for sm_90 run on sm_90 only (no PTX is kept for
# later GPUs): build once per fleet architecture.
#
# The toolchain (pinned below, about 1.2 GB unpacked) is cached in --cache
# (default $IGW_CUDA_CACHE, else <repo>/target/cuda-toolchain). The build's
# cargo target dir defaults to $CARGO_TARGET_DIR, else
# <repo>/target/cuda-<arch>: one per architecture, because llama.cpp's
# cmake build is configured once per target dir (the crate does not
# reconfigure when CMAKE_CUDA_ARCHITECTURES changes). A new target dir is
# seeded with hard links to <repo>/target/release, so the Rust crates
# already built there are reused. The binary is <target-dir>/release/worker.
#
# --cuda-home DIR uses an installed toolkit (e.g. /usr/local/cuda in an
# nvidia/cuda devel image; deploy/Dockerfile does) instead of the wheels,
# with the same link options. --toolchain-only installs the toolchain and
# prints its root.
#
# The CPU kernels are built for x86-64-v3 unless GGML_* options are in the
# environment (`env $(bash scripts/ggml-cpu-flags.sh) scripts/cuda-build.sh`
# builds for this machine's CPU, which may not be the GPU node's).
#
# Link options, and why (the wheels decide them):
# - No wheel ships the driver library libcuda.so or its link stub. The
#   worker's `cuda` feature is llama.cpp's no-VMM build (GGML_CUDA_NO_VMM,
#   llama-cpp-2's `cuda-no-vmm`): ggml's CUDA memory pool then uses
#   cudaMalloc instead of the driver's virtual memory calls (cuMemCreate,
#   cuMemMap, ...), so nothing links against libcuda. The CUDA runtime is
#   linked statically (libcudart_static.a, in the runtime wheel), and it
#   opens libcuda.so.1 itself when the process starts using CUDA. The
#   binary therefore starts on a machine without the driver, finds no GPU
#   and runs on the CPU (the worker logs a warning).
# - cuBLAS is linked dynamically: the wheel has libcublas.so.13 and
#   libcublasLt.so.13 only (no libcublas_static.a, libcublasLt_static.a,
#   and no libculibos.a, which static cuBLAS needs). llama-cpp-sys-2's build
#   script asks for those three static archives on Linux, unconditionally;
#   the script puts empty archives of those names first on the link search
#   path (a "shim" dir) and links libcublas.so and libcublasLt.so on the
#   worker's link line instead. At run time the binary needs
#   libcublas.so.13 and libcublasLt.so.13 (the nvidia/cuda runtime images
#   have them; elsewhere set LD_LIBRARY_PATH to the toolchain's lib dir) and
#   the driver's libcuda.so.1 for the GPU.
set -euo pipefail

# The CUDA 13.0 Update 2 components (the nvidia/cuda:13.0.2-* images carry
# the same release). CUDA 13 needs an NVIDIA driver >= 580 on the node.
CUDA_RELEASE=13.0.2
WHEELS=(
    "nvidia-cuda-nvcc==13.0.88 --hash=sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
    "nvidia-nvvm==13.0.88 --hash=sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"
    "nvidia-cuda-crt==13.0.88 --hash=sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"
    "nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"
    "nvidia-cublas==13.1.0.3 --hash=sha256:ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"
    "nvidia-cuda-cccl==13.0.85 --hash=sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"
)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
    echo "cuda-build: $*" >&2
    exit 2
}

arch_arg=""
cache="${IGW_CUDA_CACHE:-$repo/target/cuda-toolchain}"
target_dir="${CARGO_TARGET_DIR:-}"
cuda_home=""
toolchain_only=false
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --target-dir) [ $# -ge 2 ] || die "--target-dir needs a DIR"; target_dir="$2"; shift 2 ;;
        --cache) [ $# -ge 2 ] || die "--cache needs a DIR"; cache="$2"; shift 2 ;;
        --cuda-home) [ $# -ge 2 ] || die "--cuda-home needs a DIR"; cuda_home="$2"; shift 2 ;;
        --toolchain-only) toolchain_only=true; shift ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$arch_arg" ] || die "one ARCH only, got '$arch_arg' and '$1'"; arch_arg="$1"; shift ;;
    esac
done

# sm_90 / 90 / "80;90" -> the CMake list "90" / "80;90".
cuda_archs() {
    local list="${1:-sm_90}" out="" a
    IFS=';,' read -r -a parts <<<"$list"
    for a in "${parts[@]}"; do
        a="${a#sm_}"
        [[ "$a" =~ ^[0-9]{2,3}[af]?$ ]] || die "bad architecture '$a' (want sm_NN or NN, e.g. sm_90)"
        out="${out:+$out;}$a"
    done
    [ -n "$out" ] || die "empty architecture list"
    echo "$out"
}
archs="$(cuda_archs "$arch_arg")"
label="sm_${archs//;/-sm_}"

# Unpacks a wheel keeping the executables' mode bits (Python's zipfile
# drops them; unzip is not always installed).
unpack_wheel() {
    python3 - "$1" "$2" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
}

# The wheels unpack to nvidia/cu13/{bin,include,lib,nvvm}; cmake's
# FindCUDAToolkit and nvcc.profile look for lib64 and unversioned .so names.
install_toolchain() {
    local dir="$cache/cuda-$CUDA_RELEASE"
    local root="$dir/nvidia/cu13"
    if [ -f "$dir/.complete" ]; then
        echo "$root"
        return
    fi
    command -v python3 >/dev/null || die "python3 (with pip) is needed to fetch the CUDA wheels"
    rm -rf "$dir"
    mkdir -p "$dir/wheels"
    printf '%s\n' "${WHEELS[@]}" >"$dir/requirements.txt"
    echo "cuda-build: fetching CUDA $CUDA_RELEASE wheels into $dir" >&2
    python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
        -r "$dir/requirements.txt" -d "$dir/wheels" >&2
    local w
    for w in "$dir"/wheels/*.whl; do unpack_wheel "$w" "$dir"; done
    ln -sfn lib "$root/lib64"
    local so
    for so in cudart cublas cublasLt; do
        ln -sfn "lib$so.so.13" "$root/lib/lib$so.so"
    done
    "$root/bin/nvcc" --version >&2 || die "the unpacked nvcc does not run"
    touch "$dir/.complete"
    echo "$root"
}

if [ -n "$cuda_home" ]; then
    [ -x "$cuda_home/bin/nvcc" ] || die "no $cuda_home/bin/nvcc"
    cuda_root="$(cd "$cuda_home" && pwd)"
else
    cuda_root="$(install_toolchain)"
fi
if $toolchain_only; then
    echo "$cuda_root"
    exit 0
fi

# Empty stand-ins for the static archives llama-cpp-sys-2 names but the
# toolchain does not have (see "Link options" above); searched first.
shim="$cache/link-shim"
mkdir -p "$shim/lib64"
for a in cublas_static cublasLt_static culibos; do
    [ -f "$shim/lib64/lib$a.a" ] || ar rcs "$shim/lib64/lib$a.a"
done

target_dir="${target_dir:-$repo/target/cuda-$label}"
if [ ! -d "$target_dir" ] && [ -d "$repo/target/release" ]; then
    mkdir -p "$target_dir"
    cp -al "$repo/target/release" "$target_dir/release"
fi

export CARGO_TARGET_DIR="$target_dir"
export CUDA_PATH="$cuda_root" CUDAToolkit_ROOT="$cuda_root" CUDACXX="$cuda_root/bin/nvcc"
export PATH="$cuda_root/bin:$PATH"
# find_cuda_helper (llama-cpp-sys-2's link search) appends /lib64 to each
# entry: the shim first, then the toolkit (libcudart_static.a).
export CUDA_LIBRARY_PATH="$shim:$cuda_root"
export CMAKE_CUDA_ARCHITECTURES="$archs"

echo "cuda-build: CUDA $("$CUDACXX" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $cuda_root, architectures $archs, target dir $target_dir" >&2
start=$(date +%s)
# `cargo rustc` passes the extra link arguments to the worker binary's link
# only (RUSTFLAGS would reach every build script and proc macro).
(cd "$repo" && cargo rustc --release --locked -p worker --bin worker --features cuda -- \
    -C link-arg=-L"$cuda_root/lib64" -C link-arg=-lcublas -C link-arg=-lcublasLt)
elapsed=$(($(date +%s) - start))

bin="$target_dir/release/worker"
size=$(stat -c %s "$bin")
stripped=$(mktemp)
strip -o "$stripped" "$bin"
stripped_size=$(stat -c %s "$stripped")
rm -f "$stripped"
echo "cuda-build: built $bin for $label in $((elapsed / 60))m$((elapsed % 60))s"
echo "cuda-build: size $((size / 1048576)) MiB ($size bytes); stripped $((stripped_size / 1048576)) MiB ($stripped_size bytes)"
echo "cuda-build: needs at run time: $(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
echo "cuda-build: run it with LD_LIBRARY_PATH=$cuda_root/lib (libcublas) where the system has no CUDA 13 libraries"
