{{/* The release's name, or nameOverride. */}}
{{- define "resmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name when it already holds the chart's name (a release called
resmon-exporter names its objects as deploy/kubernetes does). */}}
{{- define "resmon.fullname" -}}
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

{{/* name + instance only: a DaemonSet's selector is immutable, a version in it would break upgrades */}}
{{- define "resmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "resmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* the labels of every object and of the pods: the kustomize base's */}}
{{- define "resmon.podLabels" -}}
{{ include "resmon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: exporter
{{- end }}

{{/* an object's labels: the pods' and Helm's own */}}
{{- define "resmon.labels" -}}
{{ include "resmon.podLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "resmon.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* the web config's Secret, when there is one */}}
{{- define "resmon.webConfigSecret" -}}
{{- if .Values.webConfig.existingSecret }}{{ .Values.webConfig.existingSecret }}
{{- else if .Values.webConfig.config }}{{ include "resmon.fullname" . }}-web-config
{{- end }}
{{- end }}

{{/* how the kubelet probes the exporter: HTTP, HTTPS or TCP */}}
{{- define "resmon.probeMode" -}}
{{- $web := .Values.webConfig }}
{{- if ne $web.probe "auto" }}{{ $web.probe }}
{{- else if $web.existingSecret }}TCP
{{- else if $web.config.basic_auth_users }}TCP
{{- else if $web.config.tls_server_config }}
{{- $clientAuth := $web.config.tls_server_config.client_auth_type | default "" }}
{{- if or (eq $clientAuth "RequireAnyClientCert") (eq $clientAuth "RequireAndVerifyClientCert") }}TCP{{ else }}HTTPS{{ end }}
{{- else }}HTTP
{{- end }}
{{- end }}

{{- define "resmon.probe" -}}
{{- $mode := include "resmon.probeMode" .root }}
{{- if eq $mode "TCP" }}
tcpSocket: {port: metrics}
{{- else if eq $mode "HTTPS" }}
httpGet: {path: {{ .path }}, port: metrics, scheme: HTTPS}
{{- else }}
httpGet: {path: {{ .path }}, port: metrics}
{{- end }}
periodSeconds: 10
timeoutSeconds: 5
failureThreshold: 3
{{- end }}
