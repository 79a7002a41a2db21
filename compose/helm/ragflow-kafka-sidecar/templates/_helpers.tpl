{{/* Names: <release>-ragflow-kafka-sidecar unless the release name already holds the chart's. */}}
{{- define "sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sidecar.labels" -}}
{{ include "sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sidecar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sidecar.stateStoreHost" -}}
{{ include "sidecar.fullname" . }}-state
{{- end -}}

{{/* The state store's URL, as the sidecar and RAGFlow's pods both write it. */}}
{{- define "sidecar.stateStoreUrl" -}}
redis://{{ include "sidecar.stateStoreHost" . }}.{{ .Release.Namespace }}.svc:6379/0
{{- end -}}

{{/*
A value as the sidecar reads it. Helm reads every number of a values file as a float, which
prints 1000000 as 1e+06: whole numbers are printed as integers.
*/}}
{{- define "sidecar.scalar" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- if eq (float64 .) (floor .) -}}{{ printf "%d" (int64 .) }}{{- else -}}{{ toString . }}{{- end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* ROLLOUT_STEPS as the sidecar reads it: 1,5,25. */}}
{{- define "sidecar.steps" -}}
{{- $steps := list -}}
{{- range . }}{{ $steps = append $steps (include "sidecar.scalar" .) }}{{ end -}}
{{- join "," $steps -}}
{{- end -}}

{{/*
The rules between two values, which values.schema.json cannot state: each fails the render
naming the value to change. The sidecar checks the same at start; failing here stops a bad
release before any pod runs.
*/}}
{{- define "sidecar.validate" -}}
{{- $s := .Values.settings -}}
{{- $traffic := float64 (default 0 $s.KAFKA_TRAFFIC_PERCENT) -}}
{{- $serve := float64 (default 0 $s.KAFKA_SERVE_PERCENT) -}}
{{- if gt $serve $traffic -}}
{{- fail (printf "settings.KAFKA_SERVE_PERCENT=%v is above the ceiling settings.KAFKA_TRAFFIC_PERCENT=%v: the served share can only be a part of the judged one" $s.KAFKA_SERVE_PERCENT $traffic) -}}
{{- end -}}
{{- if and (eq (toString (default "" $s.MQ_BACKEND)) "kafka") (ne $serve 100.0) -}}
{{- fail (printf "settings.MQ_BACKEND=kafka serves every task from Kafka: settings.KAFKA_SERVE_PERCENT must be 100 (it is %v)" $serve) -}}
{{- end -}}
{{- if .Values.autopilot.enabled -}}
{{- if not .Values.stateStore.enabled | and (not .Values.redis.url) | and (not .Values.redis.existingSecret) -}}
{{- fail "autopilot.enabled needs redis.url or redis.existingSecret (its lease and decisions live in the state store)" -}}
{{- end -}}
{{- $previous := 0.0 -}}
{{- range (default (list 1 5 25 50 100) $s.ROLLOUT_STEPS) -}}
{{- if gt (float64 .) $serve -}}
{{- fail (printf "settings.ROLLOUT_STEPS: step %v is above the ceiling settings.KAFKA_SERVE_PERCENT=%v: raise the ceiling (here and in RAGFlow's env) or end the plan below it" . $serve) -}}
{{- end -}}
{{- if le (float64 .) $previous -}}
{{- fail (printf "settings.ROLLOUT_STEPS must rise: %v comes after %v" . $previous) -}}
{{- end -}}
{{- $previous = float64 . -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.redis.url) (not .Values.redis.existingSecret) -}}
{{- fail "redis.url or redis.existingSecret is required: RAGFlow's Valkey, redis://:<password>@<ragflow-release>-redis:6379/1" -}}
{{- end -}}
{{- if and (gt (int .Values.sidecar.replicas) 1) (or .Values.sidecar.instance .Values.sidecar.mirrorConsumer) -}}
{{- fail "sidecar.instance and sidecar.mirrorConsumer name one process: leave them blank with sidecar.replicas above 1 (each pod then uses its own name)" -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.existingSecret -}}
{{- fail "give redis.url or redis.existingSecret, not both" -}}
{{- end -}}
{{- if and (hasPrefix "SASL_" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.existingSecret) -}}
{{- fail (printf "kafka.sasl.existingSecret is required with kafka.securityProtocol=%s: a Secret holding the login under kafka.sasl.usernameKey and kafka.sasl.passwordKey" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if and .Values.kafka.ssl.caSecret (not (hasSuffix "SSL" .Values.kafka.securityProtocol)) -}}
{{- fail (printf "kafka.ssl.caSecret is set but kafka.securityProtocol=%s does not use TLS (SSL or SASL_SSL)" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- end -}}

{{/*
The environment every pod running the sidecar's image gets: the settings by name, the values
the chart derives, and the secrets by reference. One list, so that `run`, `rollout` and
`init-topics` read the same configuration (the autopilot and /metrics must agree on the plan).
*/}}
{{- define "sidecar.env" -}}
{{- include "sidecar.validate" . -}}
- name: REDIS_URL
{{- if .Values.redis.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.existingSecretKey }}
{{- else }}
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- if .Values.stateStore.enabled }}
- name: SIDECAR_STATE_URL
  value: {{ include "sidecar.stateStoreUrl" . | quote }}
{{- end }}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
- name: KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if .Values.kafka.ssl.caSecret }}
- name: KAFKA_SSL_CAFILE
  value: /etc/ragflow-sidecar/kafka-ca/{{ .Values.kafka.ssl.caKey }}
{{- end }}
{{- if .Values.compareRules.existingConfigMap }}
- name: COMPARE_RULES
  value: /etc/ragflow-sidecar/compare-rules/{{ .Values.compareRules.key }}
{{- end }}
{{- /*
The pod's own name unless given: a StatefulSet's pods keep theirs (<release>-0, -1) across
restarts and rescheduling, so each replica is a static member of the shadow's group and the
mirror's consumer under one stable name.
*/}}
{{- range $name, $value := dict "SIDECAR_INSTANCE" .Values.sidecar.instance "MIRROR_CONSUMER" .Values.sidecar.mirrorConsumer }}
- name: {{ $name }}
{{- if $value }}
  value: {{ $value | quote }}
{{- else }}
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- end }}
- name: SIDECAR_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: SIDECAR_METRICS_HOST
  value: "0.0.0.0"
{{- range $name, $value := .Values.settings }}
{{- if kindIs "slice" $value }}
- name: {{ $name }}
  value: {{ include "sidecar.steps" $value | quote }}
{{- else if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ include "sidecar.scalar" $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The files the settings name by path: the CA bundle and the comparison rules. */}}
{{- define "sidecar.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.ssl.caSecret }}
- name: kafka-ca
  mountPath: /etc/ragflow-sidecar/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.compareRules.existingConfigMap }}
- name: compare-rules
  mountPath: /etc/ragflow-sidecar/compare-rules
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sidecar.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.ssl.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.ssl.caSecret }}
{{- end }}
{{- if .Values.compareRules.existingConfigMap }}
- name: compare-rules
  configMap:
    name: {{ .Values.compareRules.existingConfigMap }}
{{- end }}
{{- end -}}

{{/* The pod-level parts the three workloads running the sidecar's image share. */}}
{{- define "sidecar.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
automountServiceAccountToken: false
volumes:
  {{- include "sidecar.volumes" . | nindent 2 }}
{{- end -}}

{{- define "sidecar.containerCommon" -}}
image: {{ include "sidecar.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
env:
  {{- include "sidecar.env" . | nindent 2 }}
volumeMounts:
  {{- include "sidecar.volumeMounts" . | nindent 2 }}
{{- end -}}
