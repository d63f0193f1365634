{{/*
Names. The fullname is the release name, unless it already contains the chart name.
*/}}
{{- define "reptables.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reptables.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "reptables.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reptables.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reptables.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "reptables.labels" -}}
helm.sh/chart: {{ include "reptables.chart" . }}
{{ include "reptables.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: reptables
{{- end }}

{{- define "reptables.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "reptables.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "reptables.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The namespaces whose namespaced resources (ReplicatedTable, TableReplica, TableCollocation and
Secrets) the operator watches when not cluster-wide: operator.watch.namespaces, the
credentials namespaces and the release namespace (the operator always adds its own namespace,
REPTABLES_NAMESPACE, where the credential Secrets live, and the credentials namespaces).
Returned as a JSON list: use with fromJsonArray.
*/}}
{{- define "reptables.watchNamespaces" -}}
{{- $namespaces := list .Release.Namespace }}
{{- range .Values.operator.watch.namespaces }}
{{- $namespaces = append $namespaces . }}
{{- end }}
{{- range (.Values.operator.credentials).namespaces }}
{{- $namespaces = append $namespaces . }}
{{- end }}
{{- $namespaces | uniq | sortAlpha | toJson }}
{{- end }}

{{/* "true" when the operator runs with kopf peering (HA, more than one replica). */}}
{{- define "reptables.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{- define "reptables.peeringName" -}}
{{- default (include "reptables.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{/* The resource name of an engine (StatefulSet, Service): <fullname>-<engine name>. */}}
{{- define "reptables.engineFullname" -}}
{{- printf "%s-%s" (include "reptables.fullname" .root) .engine.name | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The CloudNativePG Cluster of an engine with storage.postgresql.cloudnativepg: <engine fullname>-pg.
CloudNativePG makes from it the Services <name>-rw/-ro/-r and the Secret <name>-app (the application
user's credentials, the whole URL under the key "uri"). */}}
{{- define "reptables.cnpgClusterName" -}}
{{- printf "%s-pg" (include "reptables.engineFullname" .) }}
{{- end }}

{{/* The Secret holding an engine's token, and its key. */}}
{{- define "reptables.engineSecretName" -}}
{{- if and .engine.existingSecret .engine.existingSecret.name }}
{{- .engine.existingSecret.name }}
{{- else }}
{{- printf "%s-token" (include "reptables.engineFullname" .) }}
{{- end }}
{{- end }}

{{- define "reptables.engineSecretKey" -}}
{{- if and .engine.existingSecret .engine.existingSecret.key }}
{{- .engine.existingSecret.key }}
{{- else }}token{{ end }}
{{- end }}

{{/* "true" when the engines serve HTTPS (tls.secretName is set). Takes the root context. */}}
{{- define "reptables.tls" -}}
{{- if (.Values.tls).secretName }}true{{ end }}
{{- end }}

{{/* Where the tls Secret is mounted, in the engines (all its keys) and the operator (ca.crt only). */}}
{{- define "reptables.tlsDir" -}}/etc/reptables/tls{{- end }}

{{/* The engine's in-cluster URL, the endpoint of its TableCluster: https:// when TLS is on. */}}
{{- define "reptables.engineEndpoint" -}}
{{- $scheme := ternary "https" "http" (eq (include "reptables.tls" .root) "true") }}
{{- printf "%s://%s.%s.svc.%s:%d" $scheme (include "reptables.engineFullname" .) .root.Release.Namespace .root.Values.clusterDomain (int .root.Values.engineDefaults.port) }}
{{- end }}

{{/* Fails on engine lists the schema cannot reject: duplicate names or cluster ids, a CloudNativePG
Cluster name CloudNativePG would refuse; and on a ServiceMonitor with nothing it could scrape without a
token. Also on HA without PostgreSQL (the schema refuses it too, unless skipped). */}}
{{- define "reptables.validateEngines" -}}
{{- if and .Values.serviceMonitor.enabled .Values.engines (not (int .Values.engineDefaults.metricsPort)) }}
{{- fail "serviceMonitor.enabled scrapes the engines' metrics listener: set engineDefaults.metricsPort (the API port's /metrics needs each engine's token)" }}
{{- end }}
{{- if eq (int .Values.engineDefaults.metricsPort) (int .Values.engineDefaults.port) }}
{{- fail "engineDefaults.metricsPort must differ from engineDefaults.port" }}
{{- end }}
{{- $names := dict }}
{{- $ids := dict }}
{{- range .Values.engines }}
{{- if hasKey $names .name }}
{{- fail (printf "engines: the name %q is used twice" .name) }}
{{- end }}
{{- $id := toString (int .clusterId) }}
{{- if hasKey $ids $id }}
{{- fail (printf "engines: clusterId %s is used by %q and %q (cluster ids must be unique)" $id (get $ids $id) .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- $_ := set $ids $id .name }}
{{- /* the schema says the same: this is for `helm template --skip-schema-validation` */ -}}
{{- if and .ha (not (.storage).postgresql) }}
{{- fail (printf "engines: %q: ha needs storage.postgresql: the engine pods of an HA table cluster share one PostgreSQL database (SQLite is a file of one pod: no leader, no standby)" .name) }}
{{- end }}
{{- if and .ha ((.storage).postgresql).cloudnativepg (lt (int (.storage.postgresql.cloudnativepg.instances | default 1)) 2) }}
{{- fail (printf "engines: %q: ha needs storage.postgresql.cloudnativepg.instances of 2 or more (a primary and a synchronous standby)" .name) }}
{{- end }}
{{- if ((.storage).postgresql).cloudnativepg }}
{{- $cnpg := include "reptables.cnpgClusterName" (dict "root" $ "engine" .) }}
{{- if or (gt (len $cnpg) 50) (not (regexMatch "^[a-z]" $cnpg)) }}
{{- fail (printf "engines: %q: its CloudNativePG Cluster would be named %q, but CloudNativePG takes only names of at most 50 characters that start with a letter: shorten the release or engine name, or set fullnameOverride" .name $cnpg) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
