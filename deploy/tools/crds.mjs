// Validates custom resources against their CRDs' OpenAPI schemas, as
// compiled into the @kubernetes-models npm packages (pinned by
// deploy/check.sh): ServiceMonitor, PodMonitor, PrometheusRule
// (prometheus-operator), ScaledObject (KEDA), HTTPRoute (Gateway API).
//
//   node deploy/tools/crds.mjs OBJECTS.json       (a JSON array of objects)
//   node deploy/tools/crds.mjs --self-test        (a broken object must fail)
//
// Exits 1 when an object fails its schema or has a kind it has no schema
// for; prints one line per object.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";

const MODELS = [ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject, HTTPRoute];

function check(obj) {
  const model = MODELS.find((m) => m.apiVersion === obj.apiVersion && m.kind === obj.kind);
  const what = `${obj.kind}/${obj.metadata?.name} (${obj.apiVersion})`;
  if (!model) return `${what}: no CRD schema for this kind and version`;
  try {
    new model(obj).validate();
    return null;
  } catch (e) {
    return `${what}: ${e.message}`;
  }
}

function selfTest() {
  // KEDA's fallback needs replicas; a PodMonitor relabeling action is an enum.
  const broken = [
    { apiVersion: "keda.sh/v1alpha1", kind: "ScaledObject", metadata: { name: "x" },
      spec: { scaleTargetRef: { name: "d" }, fallback: { failureThreshold: 3 }, triggers: [{ type: "prometheus", metadata: {} }] } },
    { apiVersion: "monitoring.coreos.com/v1", kind: "PodMonitor", metadata: { name: "x" },
      spec: { selector: {}, podMetricsEndpoints: [{ port: "m", relabelings: [{ action: "nope" }] }] } },
    { apiVersion: "gateway.networking.k8s.io/v1", kind: "HTTPRoute", metadata: { name: "x" },
      spec: { rules: [{ backendRefs: [{ name: "s", port: "80" }] }] } },
  ];
  const missed = broken.filter((o) => check(o) === null);
  for (const o of missed) console.log(`  FAIL self-test: broken ${o.kind} passed validation`);
  console.log(`crd self-test: ${broken.length - missed.length}/${broken.length} broken objects refused`);
  return missed.length ? 1 : 0;
}

function main(argv) {
  if (argv[0] === "--self-test") return selfTest();
  const objects = JSON.parse(readFileSync(argv[0], "utf8"));
  let bad = 0;
  for (const obj of objects) {
    const err = check(obj);
    if (err) {
      bad++;
      console.log(`  FAIL ${err}`);
    } else {
      console.log(`  ok ${obj.kind}/${obj.metadata.name}`);
    }
  }
  console.log(`crds: ${objects.length} objects, ${bad} invalid`);
  return bad ? 1 : 0;
}

process.exit(main(process.argv.slice(2)));
