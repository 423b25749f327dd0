{{/* Names, labels and the environment every loraplex container shares. */}}

{{- define "loraplex.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A DNS-1123 name for one component: <fullname>-<component>. */}}
{{- define "loraplex.componentName" -}}
{{- printf "%s-%s" (include "loraplex.fullname" .root) .component | lower | replace "." "-" | replace "_" "-" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels every pod of the release carries, whatever its component (the PodMonitor selects by them). */}}
{{- define "loraplex.releaseLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "loraplex.selectorLabels" -}}
{{ include "loraplex.releaseLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "loraplex.labels" -}}
{{ include "loraplex.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The image of one service: <repository>-<service>:<tag or appVersion>. */}}
{{- define "loraplex.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s-%s:%s" .root.Values.image.repository .service $tag -}}
{{- end -}}

{{- define "loraplex.configName" -}}
{{- printf "%s-config" (include "loraplex.fullname" .) -}}
{{- end -}}

{{/* One env var from the credentials Secret. Args: root, name (env var), key (a key of secrets.keys). */}}
{{- define "loraplex.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.secrets.name }}
      key: {{ index .root.Values.secrets.keys .key }}
{{- end -}}

{{/* Connection settings (the plain LPX_ prefix) every service reads: config map + Secret. */}}
{{- define "loraplex.connectionEnv" -}}
{{ include "loraplex.secretEnv" (dict "root" . "name" "LPX_PG_DSN" "key" "pgDsn") }}
{{ include "loraplex.secretEnv" (dict "root" . "name" "LPX_S3_ACCESS_KEY" "key" "s3AccessKey") }}
{{ include "loraplex.secretEnv" (dict "root" . "name" "LPX_S3_SECRET_KEY" "key" "s3SecretKey") }}
{{- end -}}

{{/* The service's own NATS user (libs/natsauth/permissions.py) and its password from the Secret. */}}
{{- define "loraplex.natsEnv" -}}
- name: LPX_NATS_USER
  value: {{ .user | quote }}
{{ include "loraplex.secretEnv" (dict "root" .root "name" "LPX_NATS_PASSWORD" "key" .key) }}
{{- end -}}

{{/* Per-service settings: LPX_<SERVICE>_<NAME> for the log, metrics and any extraEnv. */}}
{{- define "loraplex.serviceEnv" -}}
- name: {{ printf "LPX_%s_LOG_FORMAT" .prefix }}
  value: {{ .root.Values.logFormat | quote }}
- name: {{ printf "LPX_%s_LOG_LEVEL" .prefix }}
  value: {{ .root.Values.logLevel | quote }}
- name: {{ printf "LPX_%s_METRICS_PORT" .prefix }}
  value: {{ .root.Values.metricsPort | quote }}
{{- range $name, $value := .extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "loraplex.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  fsGroup: 10001
{{- end -}}

{{- define "loraplex.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | quote }}
{{- end -}}

{{/* Resources, with `gpus` NVIDIA GPUs added to limits (Kubernetes counts extended resources in limits). */}}
{{- define "loraplex.resources" -}}
{{- $res := deepCopy (.resources | default dict) -}}
{{- if .gpus -}}
{{- $limits := $res.limits | default dict -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .gpus) -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}
