{{/*
The release's full name: the release name when it already names the chart (eni-operator,
eni-operator-shadow), else <release>-eni-operator. It names every object and is the pods'
app.kubernetes.io/name label, the one selector label: it stays what the plain manifests used
(app.kubernetes.io/name: eni-operator), so an install made from them can be upgraded in place
(a Deployment's selector cannot change).
*/}}
{{- define "eni-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "eni-operator.shadow" -}}
{{- if eq .Values.mode "shadow" -}}true{{- end -}}
{{- end -}}

{{- define "eni-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eni-operator.fullname" . }}
{{- end -}}

{{- define "eni-operator.labels" -}}
{{ include "eni-operator.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eni-operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "eni-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "eni-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set (the release pins it). */}}
{{- define "eni-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* A map of tags as the operator's flags take them: k=v,k2=v2 (sorted by key). */}}
{{- define "eni-operator.tags" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/*
The loopback host (probes) and the listen addresses of the ipFamily value: "host" gives the bare
host, "any"/"loopback" with a port give host:port (IPv6 in brackets).
*/}}
{{- define "eni-operator.loopbackHost" -}}
{{- if eq .Values.ipFamily "IPv6" -}}::1{{- else -}}127.0.0.1{{- end -}}
{{- end -}}
{{- define "eni-operator.loopbackAddr" -}}
{{- $ctx := index . 0 -}}
{{- if eq $ctx.Values.ipFamily "IPv6" -}}[::1]:{{ int (index . 1) }}{{- else -}}127.0.0.1:{{ int (index . 1) }}{{- end -}}
{{- end -}}
{{- define "eni-operator.anyAddr" -}}
{{- $ctx := index . 0 -}}
{{- if eq $ctx.Values.ipFamily "IPv6" -}}[::]:{{ int (index . 1) }}{{- else -}}0.0.0.0:{{ int (index . 1) }}{{- end -}}
{{- end -}}

{{/*
Combinations of values the schema cannot compare: each fails the render with what to change.
Equal ports would be one host port declared twice on the container (or two listeners on one
port); a PodDisruptionBudget
that needs every replica up blocks every drain of a node that runs one.
*/}}
{{- define "eni-operator.validate" -}}
{{- $ports := .Values.ports -}}
{{- if eq (int $ports.metrics) (int $ports.health) -}}
{{- fail (printf "ports.metrics and ports.health are both %d: give them different ports" (int $ports.metrics)) -}}
{{- end -}}
{{- if or (eq (int $ports.debug) (int $ports.metrics)) (eq (int $ports.debug) (int $ports.health)) -}}
{{- fail (printf "ports.debug is %d, as ports.metrics or ports.health: give it its own port" (int $ports.debug)) -}}
{{- end -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- $replicas := int .Values.replicas -}}
{{- if and $pdb.enabled (not (include "eni-operator.shadow" .)) (gt $replicas 1) -}}
{{- $min := 0 -}}
{{- $given := toString $pdb.minAvailable -}}
{{- if hasSuffix "%" $given -}}
{{- /* a percentage: Kubernetes rounds minAvailable up */ -}}
{{- $min = div (add (mul (atoi (trimSuffix "%" $given)) $replicas) 99) 100 -}}
{{- else -}}
{{- $min = atoi $given -}}
{{- end -}}
{{- if ge (int $min) $replicas -}}
{{- fail (printf "podDisruptionBudget.minAvailable (%v) must be below replicas (%d): otherwise no node running a replica can be drained" $pdb.minAvailable $replicas) -}}
{{- end -}}
{{- end -}}
{{- end -}}
