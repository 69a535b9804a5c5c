{{/*
Chart name, overridable with nameOverride.
*/}}
{{- define "kargo-argocd-observer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. The release name alone when it already contains the chart
name, so `helm install kargo-argocd-observer` yields kargo-argocd-observer, not a doubled name.
*/}}
{{- define "kargo-argocd-observer.fullname" -}}
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

{{/*
Value of the helm.sh/chart label.
*/}}
{{- define "kargo-argocd-observer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "kargo-argocd-observer.labels" -}}
helm.sh/chart: {{ include "kargo-argocd-observer.chart" . }}
{{ include "kargo-argocd-observer.selectorLabels" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: kargo-argocd-observer
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable across upgrades, so never the version.
*/}}
{{- define "kargo-argocd-observer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kargo-argocd-observer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount the controller runs as.
*/}}
{{- define "kargo-argocd-observer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kargo-argocd-observer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Namespace of the leader-election Lease.
*/}}
{{- define "kargo-argocd-observer.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.leaseNamespace }}
{{- end }}

{{/*
The image reference; the tag defaults to the chart's appVersion.
*/}}
{{- define "kargo-argocd-observer.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Replicas to run. Without leader election every replica would reconcile and could create duplicate
Promotions, so the chart then runs at most one, whatever replicaCount says.
*/}}
{{- define "kargo-argocd-observer.replicas" -}}
{{- if .Values.leaderElection.enabled }}
{{- int .Values.replicaCount }}
{{- else }}
{{- min (int .Values.replicaCount) 1 }}
{{- end }}
{{- end }}

{{/*
Refuse combinations the schema cannot express clearly.
*/}}
{{- define "kargo-argocd-observer.validate" -}}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) }}
{{- fail "metrics.port and health.port must differ" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled requires metrics.service.enabled: the ServiceMonitor scrapes that Service" }}
{{- end }}
{{- end }}
