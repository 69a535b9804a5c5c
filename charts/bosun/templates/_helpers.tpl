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
{{- if eq .Values.inventory.source "clusterSecrets" }}
{{- $_ := set $config "inventory" (dict "kubernetes" (dict "namespace" .Values.argocdNamespace)) }}
{{- else }}
{{- $_ := set $config "inventory" (dict "argocd" (dict "server" .Values.inventory.argocd.server "tokenEnv" "ARGOCD_AUTH_TOKEN")) }}
{{- end }}
{{- $forge := deepCopy $config.forge }}
{{- $_ := set $forge "tokenEnv" "BOSUN_FORGE_TOKEN" }}
{{- $_ := set $config "forge" $forge }}
{{- if .Values.confinement.allowUnconfined }}
{{- $render := deepCopy ($config.render | default dict) }}
{{- $_ := set $render "allowUnconfined" true }}
{{- $_ := set $config "render" $render }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The TCP port of an http(s) URL: the one it names, else 443 for https and 80 for http.
*/}}
{{- define "bosun.urlPort" -}}
{{- $url := urlParse . }}
{{- $hostPort := splitList ":" $url.host }}
{{- if gt (len $hostPort) 1 }}{{ last $hostPort }}{{ else if eq $url.scheme "http" }}80{{ else }}443{{ end }}
{{- end }}

{{/*
The host of an http(s) URL, without its port.
*/}}
{{- define "bosun.urlHost" -}}
{{- first (splitList ":" (urlParse .).host) }}
{{- end }}

{{/*
Every URL outside the cluster bosun.yaml makes Bosun call, with the defaults Bosun applies when
a key is unset (src/bosun/config.rs): the forge, the model, the release-notes registries and
the releases API. One per line.
*/}}
{{- define "bosun.externalUrls" -}}
{{- $config := .Values.config }}
{{- $config.forge.apiUrl }}
{{- $model := $config.model | default dict }}
{{- $provider := $model.provider | default "none" }}
{{- if ne $provider "none" }}
{{ $model.baseUrl | default (ternary "https://api.anthropic.com" "https://api.openai.com/v1" (eq $provider "anthropic")) }}
{{- end }}
{{- $notes := $config.releaseNotes | default dict }}
{{- if ne (toString (dig "enabled" true $notes)) "false" }}
{{ $notes.githubApiUrl | default "https://api.github.com" }}
{{- $defaults := fromYaml `
registries:
  - {url: "https://registry-1.docker.io", tokenHosts: [auth.docker.io], redirectHosts: [production.cloudflare.docker.com]}
  - {url: "https://ghcr.io", redirectHosts: [pkg-containers.githubusercontent.com]}
  - {url: "https://quay.io", redirectHosts: [cdn01.quay.io, cdn02.quay.io, cdn03.quay.io]}
  - {url: "https://gcr.io", redirectHosts: [storage.googleapis.com]}
  - {url: "https://public.ecr.aws"}
` }}
{{- range $notes.registries | default $defaults.registries }}
{{ .url }}
{{- range .tokenHosts | default list }}
https://{{ . }}
{{- end }}
{{- range .redirectHosts | default list }}
https://{{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
