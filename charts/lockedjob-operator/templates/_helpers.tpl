{{/* Names, labels and the Redis node list shared by the templates. */}}

{{- define "lockedjob.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lockedjob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lockedjob.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "lockedjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "lockedjob.operatorSelector" -}}
app.kubernetes.io/name: {{ include "lockedjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Selector of one Redis node; call with (dict "root" $ "index" $i). */}}
{{- define "lockedjob.redisSelector" -}}
app.kubernetes.io/name: {{ include "lockedjob.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: redis
lockedjob.dev/redis-node: {{ .index | quote }}
{{- end -}}

{{- define "lockedjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lockedjob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "lockedjob.redisSecretName" -}}
{{- default (printf "%s-redis-auth" (include "lockedjob.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{/* Comma-separated node URLs: the release's own nodes, or the external ones. */}}
{{- define "lockedjob.redisUrls" -}}
{{- if .Values.redis.enabled -}}
{{- $urls := list -}}
{{- $fullname := include "lockedjob.fullname" . -}}
{{- range $i := until (int .Values.redis.nodes) -}}
{{- $scheme := ternary "rediss" "redis" $.Values.redis.tls.enabled -}}
{{- $urls = append $urls (printf "%s://%s-redis-%d.%s.svc:6379" $scheme $fullname $i $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- if .Values.redis.tls.enabled -}}
{{- range .Values.redis.external -}}
{{- if not (hasPrefix "rediss://" .) -}}
{{- fail (printf "redis.tls.enabled: every redis.external URL must be rediss://, got %s" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- required "redis.external must list the nodes when redis.enabled is false" (join "," .Values.redis.external) -}}
{{- end -}}
{{- end -}}

{{/* The lock nodes' StatefulSets, NAMESPACE/NAME, comma-separated (the operator rolls them). */}}
{{- define "lockedjob.redisStatefulSets" -}}
{{- $fullname := include "lockedjob.fullname" . -}}
{{- $sets := list -}}
{{- range $i := until (int .Values.redis.nodes) -}}
{{- $sets = append $sets (printf "%s/%s-redis-%d" $.Release.Namespace $fullname $i) -}}
{{- end -}}
{{- join "," $sets -}}
{{- end -}}
