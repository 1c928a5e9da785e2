{{/* Prefix of every object name: fullnameOverride, else the release name. */}}
{{- define "ig.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "ig.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ig.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Common labels; call with (dict "root" $ "component" "gateway"). */}}
{{- define "ig.labels" -}}
helm.sh/chart: {{ include "ig.chart" .root }}
{{ include "ig.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: inference-gateway
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ig.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ig.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .model }}
inference-gateway.io/model: {{ include "ig.modelLabel" . | quote }}
{{- end }}
{{- end -}}

{{/* The spec's model ids: catalogue built in. */}}
{{- define "ig.specModels" -}}base base-ultra base-mini{{- end -}}

{{/* A label value for a model id (ids reach 64 characters and may end in . _ -; label values stop at 63 and end alphanumeric). */}}
{{- define "ig.modelLabel" -}}
{{- if and (le (len .) 63) (regexMatch "[a-z0-9]$" .) -}}
{{- . -}}
{{- else -}}
{{- printf "%s-%s" (. | trunc 52 | trimSuffix "-" | trimSuffix "." | trimSuffix "_") (sha256sum . | trunc 10) -}}
{{- end -}}
{{- end -}}

{{/* Image reference: (dict "image" .Values.image "root" $ "suffix" "-cuda"). Digest wins over tag. */}}
{{- define "ig.image" -}}
{{- if not .image.repository -}}{{- fail "image.repository is empty: set this project's image (ghcr.io/igw-inference-edge/igw, the default) or your registry's copy of it (deploy/README.md \"The image\")" -}}{{- end -}}
{{- if regexMatch "(^|/)inference-gateway/inference-gateway$" .image.repository -}}{{- fail (printf "image.repository %s is another project's image, not this one: build deploy/Dockerfile and push it (deploy/README.md \"The image\")" .image.repository) -}}{{- end -}}
{{- $tag := default .root.Chart.AppVersion .image.tag -}}
{{- if eq $tag "latest" -}}{{- fail "image tag 'latest' is not allowed: pin a version (or a digest)" -}}{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s%s" .image.repository $tag (default "" .suffix) -}}
{{- end -}}
{{- end -}}

{{- define "ig.namespace" -}}{{ .Release.Namespace }}{{- end -}}

{{- define "ig.gatewayName" -}}{{ include "ig.fullname" . }}-gateway{{- end -}}
{{- define "ig.redisName" -}}{{ include "ig.fullname" . }}-redis{{- end -}}
{{/* "<fullname>-worker-<model>", a DNS-1035 label (Service names): a model id with . or _, ending in -, or making it longer than 63 characters is cut and gets a hash of the id. */}}
{{- define "ig.workerName" -}}
{{- $key := .model | replace "." "-" | replace "_" "-" -}}
{{- $n := printf "%s-worker-%s" (include "ig.fullname" .root) $key -}}
{{- if or (ne $key .model) (gt (len $n) 63) (hasSuffix "-" $n) -}}
{{- $n = printf "%s-%s" ($n | trunc 52 | trimSuffix "-") (sha256sum .model | trunc 10) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* Secret names (existing ones win). */}}
{{- define "ig.redisSecretName" -}}
{{- if .Values.redis.enabled -}}
{{- default (printf "%s-redis" (include "ig.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- else -}}
{{- default (printf "%s-redis" (include "ig.fullname" .)) .Values.externalRedis.existingSecret -}}
{{- end -}}
{{- end -}}
{{- define "ig.redisSecretKey" -}}
{{- if .Values.redis.enabled -}}{{ .Values.redis.auth.existingSecretPasswordKey }}{{- else -}}{{ .Values.externalRedis.existingSecretPasswordKey }}{{- end -}}
{{- end -}}
{{- define "ig.workerAuthSecretName" -}}
{{- default (printf "%s-worker-auth" (include "ig.fullname" .)) .Values.workerAuth.existingSecret -}}
{{- end -}}
{{- define "ig.bootstrapSecretName" -}}
{{- default (printf "%s-bootstrap" (include "ig.fullname" .)) .Values.bootstrap.existingSecret -}}
{{- end -}}

{{/* Whether a password is in use for Redis. */}}
{{- define "ig.redisAuth" -}}
{{- if .Values.redis.enabled -}}{{ .Values.redis.auth.enabled }}{{- else if or .Values.externalRedis.existingSecret .Values.externalRedis.password -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* GATEWAY_REDIS_URL, with $(REDIS_PASSWORD) expanded by the kubelet from the env var defined before it. */}}
{{- define "ig.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" .Values.redis.auth.enabled -}}
{{- printf "redis://%s%s.%s.svc:%d/0" $auth (include "ig.redisName" .) .Release.Namespace (int .Values.redis.port) -}}
{{- else -}}
{{- $e := .Values.externalRedis -}}
{{- $scheme := ternary "rediss" "redis" $e.tls -}}
{{- $auth := "" -}}
{{- if eq (include "ig.redisAuth" .) "true" -}}{{- $auth = printf "%s:$(REDIS_PASSWORD)@" (default "" $e.username) -}}{{- end -}}
{{- if $e.cluster -}}
{{- if ne (int $e.db) 0 -}}{{- fail "externalRedis.cluster: a Redis Cluster has database 0 only (externalRedis.db)" -}}{{- end -}}
{{- $seeds := list (printf "%s://%s%s:%d" $scheme $auth $e.host (int $e.port)) -}}
{{- range $e.clusterNodes -}}{{- $seeds = append $seeds (printf "%s://%s%s" $scheme $auth .) -}}{{- end -}}
{{- join "," $seeds -}}
{{- else -}}
{{- printf "%s://%s%s:%d/%d" $scheme $auth $e.host (int $e.port) (int $e.db) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* env entries that give a container GATEWAY_REDIS_URL. */}}
{{- define "ig.redisEnv" -}}
{{- if eq (include "ig.redisAuth" .) "true" }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "ig.redisSecretName" . }}
      key: {{ include "ig.redisSecretKey" . }}
{{- end }}
- name: GATEWAY_REDIS_URL
  value: {{ include "ig.redisUrl" . | quote }}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.cluster }}
- name: GATEWAY_REDIS_CLUSTER
  value: "true"
{{- end }}
{{- if include "ig.redisCa" . }}
- name: GATEWAY_REDIS_CA_FILE
  value: /etc/igw/redis-ca/ca.crt
{{- end }}
- name: GATEWAY_KEY_PREFIX
  value: {{ .Values.gateway.config.store.keyPrefix | quote }}
{{- end -}}

{{/* Refuses generated secrets where lookup sees no cluster (helm template, Argo CD): each render would make new values. */}}
{{- define "ig.requireCluster" -}}
{{- if not .root.Values.secrets.generateWithoutCluster -}}
{{- $probe := lookup "v1" "Secret" .root.Release.Namespace "" -}}
{{- if not $probe -}}
{{- fail (printf "%s: this render has no cluster to read the existing Secret from (helm template, Argo CD, --dry-run=client), so a generated value would change on every render. Set %s (GitOps: deploy/README.md \"GitOps\"), or secrets.generateWithoutCluster=true for a throwaway render" .what .value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A generated secret value that survives upgrades: (dict "root" $ "name" N "key" K "length" L). */}}
{{- define "ig.persistentSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $existing (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum (int .length) -}}
{{- end -}}
{{- end -}}

{{/* Container securityContext shared by every container of the chart. */}}
{{- define "ig.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* topologySpreadConstraints over zones and nodes: (dict "root" $ "labels" (selector labels string) "spread" values). */}}
{{- define "ig.topologySpread" -}}
{{- if .spread.enabled }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: {{ .spread.zone }}
    labelSelector:
      matchLabels:
        {{- .labels | nindent 8 }}
    matchLabelKeys: ["pod-template-hash"]
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: {{ .spread.hostname }}
    labelSelector:
      matchLabels:
        {{- .labels | nindent 8 }}
    matchLabelKeys: ["pod-template-hash"]
{{- end }}
{{- end -}}

{{/* One model's worker settings: workerDefaults deep-merged under the model entry. */}}
{{- define "ig.workerValues" -}}
{{- $d := deepCopy .root.Values.workerDefaults -}}
{{- include "ig.deepMerge" (dict "dst" $d "src" (deepCopy .model)) -}}
{{- toYaml $d -}}
{{- end -}}

{{/* Deep merge of src into dst (src wins, false and 0 included; lists replace). Mutates dst. */}}
{{- define "ig.deepMerge" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if and (kindIs "map" $v) (hasKey $dst $k) (kindIs "map" (index $dst $k)) -}}
{{- include "ig.deepMerge" (dict "dst" (index $dst $k) "src" $v) -}}
{{- else -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the external Redis's CA (ca.crt), when TLS uses a private CA. */}}
{{- define "ig.redisCa" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.tls .Values.externalRedis.caSecret -}}{{ .Values.externalRedis.caSecret }}{{- end -}}
{{- end -}}

{{/* volumeMounts / volumes entries for the Redis CA (empty without one). */}}
{{- define "ig.redisCaMount" -}}
{{- if include "ig.redisCa" . }}
- {name: redis-ca, mountPath: /etc/igw/redis-ca, readOnly: true}
{{- end }}
{{- end -}}
{{- define "ig.redisCaVolume" -}}
{{- if include "ig.redisCa" . }}
- name: redis-ca
  secret: {secretName: {{ include "ig.redisCa" . }}, items: [{key: ca.crt, path: ca.crt}]}
{{- end }}
{{- end -}}

{{/* Bytes of a Kubernetes quantity ("2Gi", "1536M", "512Mi", 1073741824). */}}
{{- define "ig.quantityBytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9.]+" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if not (hasKey $mult $suffix) -}}{{- fail (printf "cannot read the quantity %q" $q) -}}{{- end -}}
{{- mulf (float64 $num) (index $mult $suffix) | int64 -}}
{{- end -}}

{{/* Bytes of a Redis memory size ("1gb", "1536mb", "512m", "100000"). */}}
{{- define "ig.redisBytes" -}}
{{- $q := lower (toString .) -}}
{{- $num := regexFind "^[0-9]+" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $mult := dict "" 1 "b" 1 "k" 1000 "kb" 1024 "m" 1000000 "mb" 1048576 "g" 1000000000 "gb" 1073741824 -}}
{{- if or (not $num) (not (hasKey $mult $suffix)) -}}{{- fail (printf "redis.maxmemory %q is not a Redis size (e.g. 1gb, 1536mb)" $q) -}}{{- end -}}
{{- mul (int64 $num) (index $mult $suffix) -}}
{{- end -}}

{{/* The lowest replica count a pool runs at (autoscaled: minReplicas). */}}
{{- define "ig.poolFloor" -}}
{{- if and .w.autoscaling.enabled (ne .root.Values.autoscaling.mode "none") -}}{{ int .w.autoscaling.minReplicas }}{{- else -}}{{ int .w.replicas }}{{- end -}}
{{- end -}}

{{/* Environment variable carrying a planner agent's auth secret. */}}
{{- define "ig.agentEnv" -}}
{{- printf "PLANNER_AGENT_%s_AUTH" (regexReplaceAll "[^A-Z0-9]" (upper .) "_") -}}
{{- end -}}
