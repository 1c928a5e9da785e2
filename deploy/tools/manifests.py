#!/usr/bin/env python3
"""Offline checks and the plain-manifest split for deploy/ (used by deploy/check.sh).

  manifests.py split RENDERED.yaml OUTDIR       write OUTDIR/NN-*.yaml in apply order
  manifests.py refs [--external-secrets a,b] FILE...   order/reference test
  manifests.py crds-out RENDERED.yaml OUT.yaml CRDS.json
                                                core kinds to OUT.yaml, CRD kinds to CRDS.json
                                                (validated by tools/crds.mjs)
  manifests.py toml RENDERED.yaml               gateway.toml parses, known keys only
  manifests.py alert-tests RULES TESTS          every alert has a firing test case
  manifests.py runbooks RULES RUNBOOK.md        every alert links its section of the runbook
  manifests.py dashboard DASHBOARD.json         datasource variable, $__rate_interval
  manifests.py readme-values README.md OUTDIR   write the README's values examples
                                                (yaml blocks opening with "# values: NAME")
"""
import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

# Custom resources: no schema in kubernetes-validate's Kubernetes set; their
# CRDs' schemas are checked by tools/crds.mjs.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject", "HTTPRoute"}

# Kinds a workload may reference, and the apply order of kinds.
ORDER = [
    "Namespace", "ServiceAccount", "Secret", "ConfigMap", "Role", "RoleBinding",
    "ClusterRole", "ClusterRoleBinding", "PersistentVolumeClaim", "Service",
    "NetworkPolicy", "StatefulSet", "Deployment", "PodDisruptionBudget",
    "HorizontalPodAutoscaler", "ScaledObject", "Ingress", "HTTPRoute", "ServiceMonitor",
    "PodMonitor", "PrometheusRule", "Job",
]


def load(paths):
    docs = []
    for p in paths:
        for d in yaml.safe_load_all(Path(p).read_text()):
            if d:
                docs.append((str(p), d))
    return docs


def kind_rank(kind):
    return ORDER.index(kind) if kind in ORDER else len(ORDER)


def component(d):
    labels = d.get("metadata", {}).get("labels", {}) or {}
    return labels.get("app.kubernetes.io/component", ""), labels.get("inference-gateway.io/model", "")


def strip_helm(d):
    ann = d.get("metadata", {}).get("annotations")
    if ann:
        for k in [k for k in ann if k.startswith("helm.sh/hook")]:
            del ann[k]
        if not ann:
            del d["metadata"]["annotations"]
    return d


def cmd_split(rendered, outdir):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        old.unlink()
    files = {}

    def put(name, d):
        files.setdefault(name, []).append(strip_helm(d))

    for _, d in load([rendered]):
        kind = d["kind"]
        comp, model = component(d)
        if kind == "Namespace":
            put("00-namespace.yaml", d)
        elif kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
            put("10-rbac.yaml", d)
        elif kind == "Secret":
            put("15-secrets.yaml", d)
        elif kind == "PersistentVolumeClaim":
            put("25-volumes.yaml", d)
        elif kind == "ConfigMap" and comp in ("gateway", "redis"):
            put("20-config.yaml", d)
        elif comp == "redis":
            put("30-redis.yaml", d)
        elif comp == "worker" and model:
            put(f"40-worker-{model}.yaml", d)
        elif comp == "gateway":
            put("50-gateway.yaml", d)
        elif comp == "monitoring" or kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            put("60-monitoring.yaml", d)
        elif kind == "Job":
            put("70-bootstrap-job.yaml", d)
        else:
            put("80-other.yaml", d)
    header = (
        "# Rendered from deploy/helm/inference-gateway by deploy/render-k8s.sh; do not edit.\n"
        "# Apply in order with `kubectl apply -f deploy/k8s/` after deploy/k8s/create-secrets.sh.\n"
    )
    for name, docs in sorted(files.items()):
        docs.sort(key=lambda d: kind_rank(d["kind"]))
        body = "---\n".join(yaml.safe_dump(d, sort_keys=False, width=120) for d in docs)
        (out / name).write_text(header + body)
    print(f"wrote {len(files)} files to {out}")


def pod_spec(d):
    kind = d["kind"]
    spec = d.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return spec.get("template", {}).get("spec", {})
    if kind == "CronJob":
        return spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
    if kind == "Pod":
        return spec
    return None


def image_ok(image):
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and not last.endswith(":latest")


def cmd_refs(paths, external_secrets):
    """Namespace first; no :latest / untagged images; every Secret, ConfigMap
    and ServiceAccount a workload names is defined (or explicitly external)."""
    docs = load(paths)
    errors = []
    if not docs:
        errors.append("no objects")
    else:
        first = docs[0][1]
        if first.get("kind") != "Namespace":
            errors.append(f"first object is {first.get('kind')} {first['metadata'].get('name')}, not the Namespace")
        ns_names = {d["metadata"]["name"] for _, d in docs if d["kind"] == "Namespace"}
        for f, d in docs:
            ns = d["metadata"].get("namespace")
            if d["kind"] != "Namespace" and ns not in ns_names:
                errors.append(f"{f}: {d['kind']}/{d['metadata']['name']} in namespace {ns!r}, defined by no Namespace object")
        # Files sort in apply order: no file may hold a kind that must come
        # before a kind of an earlier file (Namespace before everything).
        seen_ns_index = min((i for i, (_, d) in enumerate(docs) if d["kind"] == "Namespace"), default=None)
        if seen_ns_index not in (0, None):
            errors.append("the Namespace is not the first object applied")
    defined = {}
    for _, d in docs:
        defined.setdefault(d["kind"], set()).add((d["metadata"].get("namespace"), d["metadata"]["name"]))
    for name in external_secrets:
        for _, d in docs:
            if d["kind"] == "Namespace":
                defined.setdefault("Secret", set()).add((d["metadata"]["name"], name))

    def need(kind, ns, name, where):
        if name and (ns, name) not in defined.get(kind, set()):
            errors.append(f"{where}: {kind} {name!r} is not defined")

    dns1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    for f, d in docs:
        meta = d.get("metadata", {})
        where = f"{Path(f).name}: {d['kind']}/{meta.get('name')}"
        if d["kind"] == "Service" and not (len(meta["name"]) <= 63 and dns1035.match(meta["name"])):
            errors.append(f"{where}: not a valid Service name (DNS-1035 label, at most 63)")
        for k, v in (meta.get("labels") or {}).items():
            if len(str(v)) > 63 or not label_value.match(str(v)):
                errors.append(f"{where}: label {k}={v!r} is not a valid label value")
    for f, d in docs:
        ps = pod_spec(d)
        if ps is None:
            continue
        ns = d["metadata"].get("namespace")
        where = f"{Path(f).name}: {d['kind']}/{d['metadata']['name']}"
        need("ServiceAccount", ns, ps.get("serviceAccountName") or None, where)
        for ips in ps.get("imagePullSecrets", []) or []:
            need("Secret", ns, ips.get("name"), where)
        for v in ps.get("volumes", []) or []:
            if "secret" in v:
                need("Secret", ns, v["secret"].get("secretName"), where)
            if "configMap" in v:
                need("ConfigMap", ns, v["configMap"].get("name"), where)
            if "persistentVolumeClaim" in v:
                need("PersistentVolumeClaim", ns, v["persistentVolumeClaim"].get("claimName"), where)
        for c in (ps.get("initContainers") or []) + (ps.get("containers") or []):
            img = c.get("image", "")
            if not image_ok(img):
                errors.append(f"{where}: container {c['name']} image {img!r} is untagged or :latest")
            if c.get("imagePullPolicy") == "Always":
                errors.append(f"{where}: container {c['name']} pulls Always")
            for e in c.get("env", []) or []:
                vf = e.get("valueFrom") or {}
                if "secretKeyRef" in vf:
                    need("Secret", ns, vf["secretKeyRef"]["name"], where)
                if "configMapKeyRef" in vf:
                    need("ConfigMap", ns, vf["configMapKeyRef"]["name"], where)
            for ef in c.get("envFrom", []) or []:
                if "secretRef" in ef:
                    need("Secret", ns, ef["secretRef"]["name"], where)
                if "configMapRef" in ef:
                    need("ConfigMap", ns, ef["configMapRef"]["name"], where)
            sc = c.get("securityContext") or {}
            if not (sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False
                    and "ALL" in (sc.get("capabilities", {}).get("drop") or [])):
                errors.append(f"{where}: container {c['name']} lacks the restricted securityContext")
            res = c.get("resources") or {}
            if not res.get("requests") or not res.get("limits"):
                errors.append(f"{where}: container {c['name']} lacks requests or limits")
        psc = ps.get("securityContext") or {}
        if not psc.get("runAsNonRoot") or (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            errors.append(f"{where}: pod securityContext is not runAsNonRoot + seccomp RuntimeDefault")
    # Role bindings name defined service accounts and roles.
    for f, d in docs:
        if d["kind"] == "RoleBinding":
            need("Role", d["metadata"].get("namespace"), d["roleRef"]["name"], f"{Path(f).name}: RoleBinding/{d['metadata']['name']}")
            for s in d.get("subjects", []):
                if s.get("kind") == "ServiceAccount":
                    need("ServiceAccount", s.get("namespace"), s["name"], f"{Path(f).name}: RoleBinding/{d['metadata']['name']}")
        if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            t = d["spec"]["scaleTargetRef"]
            need(t.get("kind", "Deployment"), d["metadata"].get("namespace"), t["name"], f"{Path(f).name}: {d['kind']}/{d['metadata']['name']}")
    for e in errors:
        print("  FAIL", e)
    print(f"refs: {len(docs)} objects, {len(errors)} problems")
    return 1 if errors else 0


def cmd_crds_out(rendered, out, crds_json):
    keep, crds = [], []
    for _, d in load([rendered]):
        (crds if d["kind"] in CRD_KINDS else keep).append(d)
    Path(out).write_text("---\n".join(yaml.safe_dump(d, sort_keys=False) for d in keep))
    Path(crds_json).write_text(json.dumps(crds))
    print(f"  {len(keep)} core objects, {len(crds)} custom resources")
    return 0


GATEWAY_KEYS = {
    "listen", "admin_listen", "threads", "grace_period_seconds", "readiness_drain_millis",
    "max_body_bytes", "max_header_bytes", "read_timeout_seconds", "write_timeout_seconds",
    "request_timeout_seconds", "keys", "store", "plans", "orgs", "limits", "telemetry", "models",
    "planner", "tls", "worker_tls", "websocket",
}
SECTION_KEYS = {
    "store": {"redis_url", "redis_cluster", "redis_ca_file", "key_prefix", "storage_window_seconds", "lease_millis", "heartbeat_millis",
              "sweep_interval_millis", "cancel_poll_millis", "idempotency_window_seconds",
              "idempotency_max_record_bytes", "idempotency_max_memory_bytes"},
    "limits": {"on_store_failure", "key_cache_ttl_ms", "default_plan", "concurrency_ttl_seconds"},
    "telemetry": {"otlp_endpoint", "service_name"},
    "websocket": {"ping_interval_seconds", "idle_timeout_seconds", "max_connection_seconds",
                  "max_connections_per_key"},
    "tls": {"cert_file", "key_file"},
    "worker_tls": {"ca_file", "cert_file", "key_file", "server_name"},
    # gateway/src/config.rs PlannerConfig (allowed_networks: #29).
    "planner": {"connect_timeout_ms", "first_byte_timeout_ms", "idle_timeout_ms", "step_timeout_ms",
                "hedge_after_ms", "run_timeout_ms", "synthesis_timeout_ms", "max_steps", "max_replans",
                "max_run_tokens", "max_plan_tokens", "max_step_tokens", "max_answer_tokens", "max_response_bytes", "max_card_bytes",
                "max_step_output_bytes", "card_ttl_seconds", "session_ttl_seconds", "keepalive_ms",
                "allow_private_addresses", "allow_link_local", "allow_request_urls", "max_discovered",
                "allowed_networks", "agents"},
}
AGENT_KEYS = {"id", "url", "auth_header", "auth_secret_env", "allowed_hosts", "enabled"}
SPEC_MODELS = {"base", "base-ultra", "base-mini"}
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
PLAN_KEYS = {"rpm", "tpm", "max_concurrent", "default_max_tokens", "max_service_tier", "weight", "max_stored_bytes"}
MODEL_KEYS = {"workers", "policy", "queue_timeout_ms", "queue_max_depth", "stall_timeout_ms",
              "preempt_tiers", "max_preemptions"}
# Catalogue of a model id other than the spec's (#29).
CATALOGUE_KEYS = {"context_window", "input_price", "cached_input_price", "output_price",
                  "reasoning_budget", "image_input", "description"}
KEY_KEYS = {"sha256", "org", "name", "plan", "scopes", "models"}


def cmd_toml(rendered):
    """The gateway refuses unknown keys (deny_unknown_fields): parse the
    rendered gateway.toml, with the bootstrap key the init container appends."""
    errors = []
    n = 0
    for _, d in load([rendered]):
        if d["kind"] != "ConfigMap" or "gateway.toml" not in (d.get("data") or {}):
            continue
        n += 1
        text = d["data"]["gateway.toml"] + (
            '\n[[keys]]\nsha256 = "%s"\norg = "org-admin"\nname = "bootstrap"\nplan = "bootstrap"\n' % ("0" * 64))
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            errors.append(f"gateway.toml does not parse: {e}")
            continue
        errors += [f"unknown top-level key {k}" for k in cfg if k not in GATEWAY_KEYS]
        for sec, allowed in SECTION_KEYS.items():
            errors += [f"unknown key [{sec}].{k}" for k in cfg.get(sec, {}) if k not in allowed]
        for name, p in cfg.get("plans", {}).items():
            errors += [f"unknown key [plans.{name}].{k}" for k in p if k not in PLAN_KEYS]
        for k in cfg.get("keys", []):
            errors += [f"unknown key [[keys]].{x}" for x in k if x not in KEY_KEYS]
        for a in cfg.get("planner", {}).get("agents", []):
            errors += [f"unknown key [[planner.agents]].{x}" for x in a if x not in AGENT_KEYS]
        if not cfg.get("models"):
            errors.append("no [models.*]")
        for name, m in cfg.get("models", {}).items():
            allowed = MODEL_KEYS if name in SPEC_MODELS else MODEL_KEYS | CATALOGUE_KEYS
            errors += [f"unknown key [models.{name}].{k}" for k in m if k not in allowed]
            if not MODEL_NAME.match(name):
                errors.append(f"model id {name!r} is not one the gateway accepts")
            if name not in SPEC_MODELS and "context_window" not in m:
                errors.append(f"[models.{name}] has no context_window")
            for w in m.get("workers", []):
                if not re.match(r"^(k8s://[a-z0-9-]+/[a-z][a-z0-9-]{0,62}:[a-z0-9-]+|dns://[a-z0-9.-]+:\d+)$", w):
                    errors.append(f"[models.{name}] worker target {w!r} is malformed")
        if cfg.get("default_plan") and cfg["limits"]["default_plan"] not in cfg.get("plans", {}):
            errors.append("limits.default_plan names no plan")
    if n != 1:
        errors.append(f"expected one gateway.toml ConfigMap, found {n}")
    for e in errors:
        print("  FAIL", e)
    return 1 if errors else 0


def cmd_alert_tests(rules, tests):
    alerts = [r["alert"] for g in yaml.safe_load(Path(rules).read_text())["groups"] for r in g["rules"] if "alert" in r]
    firing = set()
    for t in yaml.safe_load(Path(tests).read_text())["tests"]:
        for a in t.get("alert_rule_test", []):
            if a.get("exp_alerts"):
                firing.add(a["alertname"])
    missing = [a for a in alerts if a not in firing]
    for a in missing:
        print(f"  FAIL alert {a} has no test case in which it fires")
    print(f"alerts: {len(alerts)}, with a firing test: {len(alerts) - len(missing)}")
    return 1 if missing else 0


RUNBOOK_BASE = "https://github.com/igw-inference-edge/igw/blob/main/deploy/monitoring/runbook.md"


def cmd_runbooks(rules, runbook):
    """Every alert has runbook_url = RUNBOOK_BASE#<alert in lower case>
    (the chart swaps the base), and the runbook has that heading."""
    headings = {m.group(1).strip().lower() for m in re.finditer(r"^## (.+)$", Path(runbook).read_text(), re.M)}
    errors = []
    n = 0
    for g in yaml.safe_load(Path(rules).read_text())["groups"]:
        for r in g["rules"]:
            if "alert" not in r:
                continue
            n += 1
            name = r["alert"]
            want = f"{RUNBOOK_BASE}#{name.lower()}"
            got = (r.get("annotations") or {}).get("runbook_url")
            if got != want:
                errors.append(f"alert {name}: runbook_url {got!r}, expected {want!r}")
            if name.lower() not in headings:
                errors.append(f"alert {name}: no '## {name}' section in {Path(runbook).name}")
    for e in errors:
        print("  FAIL", e)
    print(f"runbooks: {n} alerts, {len(errors)} problems")
    return 1 if errors else 0


def cmd_dashboard(path):
    dash = json.loads(Path(path).read_text())
    errors = []
    names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
    if not any(v.get("type") == "datasource" for v in dash["templating"]["list"]):
        errors.append("no datasource variable")
    for p in dash["panels"]:
        if p.get("type") == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            errors.append(f"panel {p['title']!r} does not use ${{datasource}}")
        for t in p.get("targets", []):
            expr = t["expr"]
            if re.search(r"\[\d+[smhd]\]", expr):
                errors.append(f"panel {p['title']!r} hard-codes a range: {expr}")
            if re.search(r"\b(rate|increase)\(", expr) and "$__rate_interval" not in expr:
                errors.append(f"panel {p['title']!r} rate without $__rate_interval")
    for e in errors:
        print("  FAIL", e)
    print(f"dashboard: {len(dash['panels'])} panels, variables {names}")
    return 1 if errors else 0


def cmd_readme_values(readme, outdir):
    """The values files deploy/README.md documents, so that check.sh renders
    them: every ```yaml block whose first line is `# values: NAME`. A
    `<sha256>` placeholder becomes a well-formed digest."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for m in re.finditer(r"^( *)```yaml\n((?:.*\n)*?)\1```", Path(readme).read_text(), re.M):
        indent, body = m.group(1), m.group(2)
        lines = [ln[len(indent):] for ln in body.splitlines()]
        head = re.match(r"^# values: ([\w.-]+\.yaml)$", lines[0]) if lines else None
        if not head:
            continue
        text = "\n".join(lines) + "\n"
        (out / head.group(1)).write_text(text.replace("<sha256>", "a" * 64))
        n += 1
    print(f"readme values: {n} files")
    return 0 if n else 1


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "split":
        cmd_split(*args)
        return 0
    if cmd == "refs":
        ext = []
        if args and args[0] == "--external-secrets":
            ext = [s for s in args[1].split(",") if s]
            args = args[2:]
        return cmd_refs(args, ext)
    if cmd == "crds-out":
        return cmd_crds_out(*args)
    if cmd == "toml":
        return cmd_toml(*args)
    if cmd == "alert-tests":
        return cmd_alert_tests(*args)
    if cmd == "dashboard":
        return cmd_dashboard(*args)
    if cmd == "runbooks":
        return cmd_runbooks(*args)
    if cmd == "readme-values":
        return cmd_readme_values(*args)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
