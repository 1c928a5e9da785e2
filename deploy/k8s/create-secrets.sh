#!/usr/bin/env bash
# Creates the Secrets the plain manifests reference, with random values, in
# namespace inference (or $NAMESPACE). Existing Secrets are left alone, so it
# is safe to run again. --print writes them to stdout instead (no cluster).
#   kubectl apply -f deploy/k8s/00-namespace.yaml
#   deploy/k8s/create-secrets.sh
#   kubectl apply -f deploy/k8s/
set -euo pipefail
ns="${NAMESPACE:-inference}"
rand() { LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c "$1" || true; }
secret() { # name key value
    cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $1
  namespace: $ns
  labels: {app.kubernetes.io/part-of: inference-gateway}
type: Opaque
stringData:
  $2: "$3"
YAML
}
one() {
    case "$1" in
        igw-redis) secret igw-redis password "$(rand 32)" ;;
        igw-worker-auth) secret igw-worker-auth token "$(rand 48)" ;;
        igw-bootstrap) secret igw-bootstrap api-key "sk-igw-$(rand 40)" ;;
    esac
}
names="igw-redis igw-worker-auth igw-bootstrap"
if [ "${1:-}" = "--print" ]; then
    first=1
    for name in $names; do
        [ $first = 1 ] || echo ---
        first=0
        one "$name"
    done
    exit 0
fi
for name in $names; do
    if kubectl -n "$ns" get secret "$name" >/dev/null 2>&1; then
        echo "secret/$name exists, kept"
    else
        one "$name" | kubectl create -f -
    fi
done
