{{- define "bosun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bosun.fullname" -}}
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

{{- define "bosun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bosun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bosun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bosun.selectorLabels" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | trunc 63 | quote }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: gitops-loop
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
bosun.yaml: the user's config, with the paths and the inventory this chart provides.
*/}}
{{- define "bosun.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "workdir" "/var/lib/bosun" }}
{{- $_ := set $config "webhook" (dict "secretEnv" "BOSUN_WEBHOOK_SECRET") }}
{{- if not (hasKey $config "inventory") }}
{{- $_ := set $config "inventory" (dict "kubernetes" (dict "namespace" .Values.argocdNamespace)) }}
{{- end }}
{{- $forge := deepCopy $config.forge }}
{{- $_ := set $forge "tokenEnv" "BOSUN_FORGE_TOKEN" }}
{{- $_ := set $config "forge" $forge }}
{{- toYaml $config }}
{{- end }}
