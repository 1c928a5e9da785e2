#!/usr/bin/env bash
# Renders the plain manifests in deploy/k8s/ from the chart with its default
# values (release "igw", namespace "inference"). Secrets are not rendered:
# deploy/k8s/create-secrets.sh makes them on the cluster with random values.
#   deploy/render-k8s.sh [OUTDIR]      (default deploy/k8s)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/k8s}"
tools="${DEPLOY_TOOLS:-$here/../target/deploy-tools}"
helm="$tools/bin/helm"
py="$tools/venv/bin/python"
[ -x "$helm" ] && [ -x "$py" ] || { echo "run deploy/check.sh once to install helm and python tools" >&2; exit 1; }
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
"$helm" template igw "$here/helm/inference-gateway" --namespace inference --kube-version 1.30.0 \
    --set namespace.create=true \
    --set redis.auth.existingSecret=igw-redis \
    --set workerAuth.existingSecret=igw-worker-auth \
    --set bootstrap.existingSecret=igw-bootstrap >"$tmp"
"$py" "$here/tools/manifests.py" split "$tmp" "$out"
