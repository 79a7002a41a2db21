{{/*
The variables ragflow_mq reads inside RAGFlow's pods (compose/ragflow-override.yml lists the
same), taken from this release's values so that both sides agree: the shares, Kafka, the queue
names and routes, the served share's tuning, and the state store.
*/}}
{{- define "sidecar.ragflowSharedSettings" -}}
KAFKA_TRAFFIC_PERCENT KAFKA_SERVE_PERCENT KAFKA_CONSUMER_GROUP KAFKA_COMPRESSION_TYPE KAFKA_LINGER_MS KAFKA_BATCH_BYTES KAFKA_REQUEST_TIMEOUT_MS MIRROR_STREAMS MIRROR_PRIORITY_STREAMS MIRROR_ROUTES SERVE_PREFETCH SERVE_PRODUCE_TIMEOUT_MS SERVE_ENQUEUE_TIMEOUT_MS SERVE_BREAKER_OPEN_S SERVE_SHARE_REFRESH_S SERVE_CLAIM_REFRESH_S SERVE_COMMIT_INTERVAL_MS SERVE_SESSION_TIMEOUT_MS SERVE_MAX_POLL_INTERVAL_MS SERVE_LEASE_S SERVE_DONE_TTL_S SERVE_STICKY_S SERVE_EVIDENCE_FLUSH_S SERVE_KEY_PREFIX
{{- end -}}

{{/*
The `ragflow.image` and `env:` blocks for RAGFlow's own chart. Every value quoted: RAGFlow's
chart keeps an `env:` key only when its value is truthy, so an unquoted 0 would be dropped.
REDIS_URL repeats RAGFlow's Valkey password (RAGFlow's env.REDIS_PASSWORD), which RAGFlow's
chart keeps in its Secret <ragflow-fullname>-env-config.
*/}}
{{- define "sidecar.ragflowValues" -}}
ragflow:
  image:
    repository: {{ .Values.ragflowMqImage.repository | quote }}
    tag: {{ .Values.ragflowMqImage.tag | quote }}
env:
  REDIS_URL: "redis://:<env.REDIS_PASSWORD>@<ragflow-fullname>-redis.{{ .Release.Namespace }}.svc:6379/1"
  {{- if .Values.stateStore.enabled }}
  SIDECAR_STATE_URL: {{ include "sidecar.stateStoreUrl" . | quote }}
  {{- end }}
  MQ_BACKEND: {{ ternary "kafka" "split" (eq (toString (default "" .Values.settings.MQ_BACKEND)) "kafka") | quote }}
  KAFKA_BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
  KAFKA_CLIENT_ID: "ragflow"
  KAFKA_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
  {{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
  KAFKA_SASL_MECHANISM: {{ .Values.kafka.sasl.mechanism | quote }}
  # KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD: RAGFlow's principal, from a Secret through the
  # post-renderer patch (compose/helm/ragflow-post-renderer/), or written here.
  {{- end }}
  {{- if .Values.kafka.ssl.caSecret }}
  # KAFKA_SSL_CAFILE: set by the post-renderer patch, which mounts the CA bundle.
  {{- end }}
  {{- $settings := .Values.settings }}
  {{- range splitList " " (include "sidecar.ragflowSharedSettings" .) }}
  {{- if and (hasKey $settings .) (not (kindIs "invalid" (get $settings .))) }}
  {{ . }}: {{ include "sidecar.scalar" (get $settings .) | quote }}
  {{- end }}
  {{- end }}
{{- end -}}
