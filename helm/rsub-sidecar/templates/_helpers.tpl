{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "rsub-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, or the release name when it already has it. */}}
{{- define "rsub-sidecar.fullname" -}}
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

{{- define "rsub-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of an object, `dict "ctx" $ "component" "sidecar"`: the chart's own, then
commonLabels (which never replace the chart's: selectors rely on them).
*/}}
{{- define "rsub-sidecar.componentLabels" -}}
{{- $ctx := .ctx }}
{{- $own := dict
  "helm.sh/chart" (include "rsub-sidecar.chart" $ctx)
  "app.kubernetes.io/name" (include "rsub-sidecar.name" $ctx)
  "app.kubernetes.io/instance" $ctx.Release.Name
  "app.kubernetes.io/version" ($ctx.Values.image.tag | default $ctx.Chart.AppVersion | trunc 63)
  "app.kubernetes.io/managed-by" $ctx.Release.Service
  "app.kubernetes.io/part-of" "rsub"
  "app.kubernetes.io/component" .component
  "rsub.io/region" $ctx.Values.region
}}
{{- toYaml (merge $own $ctx.Values.commonLabels) }}
{{- end }}

{{/* Selector labels of the sidecar pods: stable across upgrades (selectors are immutable). */}}
{{- define "rsub-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rsub-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sidecar
{{- end }}

{{/* Labels of the sidecar's objects. */}}
{{- define "rsub-sidecar.labels" -}}
{{ include "rsub-sidecar.componentLabels" (dict "ctx" . "component" "sidecar") }}
{{- end }}

{{/*
The `annotations:` of an object's metadata (a new line, indented 2), `dict "ctx" $ "own"
<map>`: the object's own annotations over commonAnnotations; nothing when both are empty.
*/}}
{{- define "rsub-sidecar.annotations" -}}
{{- with merge (deepCopy (.own | default dict)) .ctx.Values.commonAnnotations }}
{{ dict "annotations" . | toYaml | indent 2 }}
{{- end }}
{{- end }}

{{- define "rsub-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rsub-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: [registry/]repository, then @digest or :tag. */}}
{{- define "rsub-sidecar.image" -}}
{{- $registry := .Values.global.imageRegistry | default .Values.image.registry }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The `imagePullSecrets:` of a pod: imagePullSecrets, then
global.imagePullSecrets (`{name: ...}` or a bare name, as umbrella charts write them), each
name once; nothing when both are empty.
*/}}
{{- define "rsub-sidecar.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat .Values.imagePullSecrets (.Values.global.imagePullSecrets | default list) }}
{{- if kindIs "map" . }}
{{- $names = append $names .name }}
{{- else }}
{{- $names = append $names . }}
{{- end }}
{{- end }}
{{- with uniq $names }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* listenHost as it goes before ":port" (IPv6 addresses in brackets). */}}
{{- define "rsub-sidecar.listenHost" -}}
{{- if contains ":" .Values.listenHost }}[{{ .Values.listenHost }}]{{ else }}{{ .Values.listenHost }}{{ end }}
{{- end }}

{{/* Where Secrets are mounted in the pod. */}}
{{- define "rsub-sidecar.natsSecretDir" -}}/etc/rsub/nats{{- end }}
{{- define "rsub-sidecar.grpcTlsDir" -}}/etc/rsub/grpc-tls{{- end }}

{{/* True (non-empty) when gRPC is served over TLS. */}}
{{- define "rsub-sidecar.grpcTls" -}}
{{- if .Values.grpcSecret.tlsName }}true{{ end }}
{{- end }}

{{/*
The sidecar's environment: credentials from the Secrets as RSUB_* settings (so they never
enter the ConfigMap), then extraEnv.
*/}}
{{- define "rsub-sidecar.env" -}}
{{- $secret := .Values.natsSecret }}
{{- if and $secret.name (eq $secret.auth "userPassword") }}
- name: RSUB_NATS__USER
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.user | quote }}}
- name: RSUB_NATS__PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.password | quote }}}
{{- else if and $secret.name (eq $secret.auth "token") }}
- name: RSUB_NATS__TOKEN
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.token | quote }}}
{{- end }}
{{- with .Values.grpcSecret.authTokenName }}
- name: RSUB_GRPC__AUTH_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $.Values.grpcSecret.authTokenKey | quote }}}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A probe, `dict "probe" <probes.X> "handler" <default handler>`: probes.X.custom when set,
else the chart's handler with the timings from values.
*/}}
{{- define "rsub-sidecar.probe" -}}
{{- if .probe.custom }}
{{- toYaml .probe.custom }}
{{- else }}
{{- toYaml (merge (omit .probe "enabled" "custom") .handler) }}
{{- end }}
{{- end }}

{{/*
The sidecar configuration: config values plus what the chart owns (region, listen
addresses, file paths of mounted Secrets). Credentials that are not files arrive as
RSUB_* environment variables from the Secret, so they never enter the ConfigMap.
*/}}
{{- define "rsub-sidecar.config" -}}
{{- if not (has .Values.region .Values.config.regions) }}
{{- fail (printf "region: %q is not in config.regions %v" .Values.region .Values.config.regions) }}
{{- end }}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "region" .Values.region }}
{{- $nats := $cfg.nats }}
{{- $dir := include "rsub-sidecar.natsSecretDir" . }}
{{- $secret := .Values.natsSecret }}
{{- if and $secret.name (eq $secret.auth "creds") }}
{{- $_ := set $nats "creds_file" (printf "%s/%s" $dir $secret.keys.creds) }}
{{- end }}
{{- if and $secret.name $secret.tls.enabled }}
{{- $tls := dict "ca_file" (printf "%s/%s" $dir $secret.tls.caKey) }}
{{- if $secret.tls.clientCert }}
{{- $_ := set $tls "cert_file" (printf "%s/%s" $dir $secret.tls.certKey) }}
{{- $_ := set $tls "key_file" (printf "%s/%s" $dir $secret.tls.keyKey) }}
{{- end }}
{{- if $secret.tls.serverName }}
{{- $_ := set $tls "server_name" $secret.tls.serverName }}
{{- end }}
{{- $_ := set $nats "tls" $tls }}
{{- end }}
{{- $grpc := dict "listen" (printf "%s:%d" (include "rsub-sidecar.listenHost" .) (int .Values.ports.grpc)) }}
{{- if include "rsub-sidecar.grpcTls" . }}
{{- $gdir := include "rsub-sidecar.grpcTlsDir" . }}
{{- $gtls := dict "cert_file" (printf "%s/tls.crt" $gdir) "key_file" (printf "%s/tls.key" $gdir) }}
{{- if .Values.grpcSecret.clientAuth }}
{{- $_ := set $gtls "client_ca_file" (printf "%s/ca.crt" $gdir) }}
{{- end }}
{{- $_ := set $grpc "tls" $gtls }}
{{- end }}
{{- $_ := set $cfg "grpc" $grpc }}
{{- $_ := set $cfg "http" (dict "listen" (printf "%s:%d" (include "rsub-sidecar.listenHost" .) (int .Values.ports.http))) }}
{{- toYaml $cfg }}
{{- end }}
