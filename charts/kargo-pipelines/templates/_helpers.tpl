{{/* Labels on every object. */}}
{{- define "kargo-pipelines.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kargo-pipelines
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A Stage's name: the stage's `stageName`, else <target>-<stage>. */}}
{{- define "kargo-pipelines.stageName" -}}
{{ .stage.stageName | default (printf "%s-%s" .target.name .stage.name) }}
{{- end -}}

{{/*
The expr-lang expression that reads the pinned line's current value from the parsed file:
`$env["a"]["b"]` for the key `a.b` (a key segment that is a number indexes a list).
*/}}
{{- define "kargo-pipelines.readKey" -}}
$env
{{- range (splitList "." .) -}}
{{- if regexMatch "^[0-9]+$" . -}}[{{ . }}]{{- else -}}["{{ . }}"]{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Whether a promotion waits for a person, as an expression over the current version (read by
the `current` step) and the Freight's version. The one rule, shared with the gate's
`major-version-boundary` note: a major change is a boundary, and so is a minor change below
1.0.0 (0.x counts its minor as its major); a version Kargo's semverDiff cannot compare holds.
A trusted target merges itself below that boundary (patch only, or minor too with
`autoMerge: minor`); `hold: always` and untrusted targets always wait.
*/}}
{{- define "kargo-pipelines.hold" -}}
{{- $t := .target -}}
{{- if or (eq ($t.hold | default "auto") "always") (not $t.trusted) -}}
${{ "{{" }} true {{ "}}" }}
{{- else -}}
{{- $from := "string(outputs.current.version)" -}}
{{- $to := include "kargo-pipelines.version" $t -}}
{{- $diff := printf "semverDiff(%s, %s)" $from $to -}}
{{- $minorHolds := eq ($t.autoMerge | default "patch") "patch" -}}
${{ "{{" }} {{ $diff }} in ['Major', 'Incomparable'] || ({{ $diff }} == 'Minor' && ({{ $minorHolds }} || {{ $from }} in ['0', 'v0'] || {{ $from }} startsWith '0.' || {{ $from }} startsWith 'v0.')) {{ "}}" }}
{{- end -}}
{{- end -}}

{{/* Fails the render when two targets share a name or a path leaves the repository. */}}
{{- define "kargo-pipelines.check" -}}
{{- $seen := dict -}}
{{- range .Values.targets -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "targets: the name %q is used twice" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- $target := . -}}
{{- $stages := dict -}}
{{- range .stages -}}
{{- if hasKey $stages .name -}}
{{- fail (printf "targets[%s].stages: the stage %q is listed twice" $target.name .name) -}}
{{- end -}}
{{- $_ := set $stages .name true -}}
{{- $stageName := include "kargo-pipelines.stageName" (dict "target" $target "stage" .) -}}
{{- if hasKey $seen (printf "stage/%s" $stageName) -}}
{{- fail (printf "targets[%s].stages[%s]: the Stage name %q is used twice" $target.name .name $stageName) -}}
{{- end -}}
{{- $_ := set $seen (printf "stage/%s" $stageName) true -}}
{{- if or (has ".." (splitList "/" .file)) (hasPrefix "/" .file) -}}
{{- fail (printf "targets[%s].stages[%s].file: %q leaves the repository" $target.name .name .file) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The Stage's Applications as a PromQL regular expression inside a double-quoted string: names
joined by `|`, each `.` escaped as `\\.` (a backslash escaped for the PromQL string).
*/}}
{{- define "kargo-pipelines.appNames" -}}
{{- $names := list -}}
{{- range .applications -}}
{{- $names = append $names (replace "." "\\\\." .name) -}}
{{- end -}}
{{- join "|" $names -}}
{{- end -}}

{{/* The namespaces of the Stage's Applications, as a PromQL alternation (default argocd). */}}
{{- define "kargo-pipelines.appNamespaces" -}}
{{- $namespaces := list -}}
{{- range .applications -}}
{{- $namespaces = append $namespaces (.namespace | default "argocd") -}}
{{- end -}}
{{- join "|" (uniq $namespaces) -}}
{{- end -}}

{{/*
The Freight's version of the target's chart, as an expression: an oci:// repository names the
chart itself (its Warehouse subscription has no name, so chartFrom takes the URL alone).
*/}}
{{- define "kargo-pipelines.version" -}}
{{- if hasPrefix "oci://" .chart.repoURL -}}
{{ printf "chartFrom('%s').Version" .chart.repoURL }}
{{- else -}}
{{ printf "chartFrom('%s', '%s').Version" .chart.repoURL .chart.name }}
{{- end -}}
{{- end -}}

{{/*
On GitLab, fails the render unless the repository is a GitLab project path (what Bosun's
intake and GitLab take): GROUP/PROJECT or GROUP/SUBGROUP/.../PROJECT, at most 20 levels of
subgroups below the top-level group (Namespace::NUMBER_OF_ANCESTORS_ALLOWED) and 255
characters (app/models/route.rb); each segment letters, digits, '_', '-' and '.', starting with
a letter, a digit or '_', without '..', not ending in .git or .atom.
*/}}
{{- define "kargo-pipelines.checkGitlabProject" -}}
{{- if .gitlab -}}
{{- $repository := .repository -}}
{{- $field := ternary "gitops.repository" "gitops.repoURL" (not (empty .gitops.repository)) -}}
{{- $segment := "[A-Za-z0-9_][A-Za-z0-9_.-]*" -}}
{{- $shape := printf "^%s(/%s){1,21}$" $segment $segment -}}
{{- if or (not (regexMatch $shape $repository)) (contains ".." $repository) (regexMatch "[.](git|atom)(/|$)" $repository) (gt (len $repository) 255) -}}
{{- fail (printf "%s: %q is not a GitLab project path (GROUP/PROJECT or GROUP/SUBGROUP/.../PROJECT: letters, digits, '_', '-' and '.', no empty segment or '..', at most 20 levels of subgroups)" $field $repository) -}}
{{- end -}}
{{- end -}}
{{- end -}}
