# The sidecar's image: `ragflow-sidecar run` by default, `init-topics`, `status`, `diffs`, ...
# as the command. Built by compose/docker-compose.yml (sidecar and kafka-init) or by hand:
#   docker build -t ragflow-kafka-sidecar:0.1.0 .
#
# Two stages: the package and its dependencies are installed into a virtualenv in the first,
# and only that virtualenv is copied into the second, so no build tooling, source tree or pip
# cache is left in the image. Every dependency ships wheels for CPython 3.11 on x86_64 and
# arm64 (aiokafka, libvalkey, grpcio, PyYAML), so no compiler is needed in either stage.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what `pip install .` reads: the metadata (README.md is the long description) and the
# two packages. Tests, benchmarks, compose files and dashboards stay out (.dockerignore too).
# The [sidecar] extra: what only the sidecar process needs (OpenTelemetry, the gate's SciPy).
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY comparators ./comparators
COPY ragflow_mq ./ragflow_mq
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ".[sidecar]" \
 && /opt/venv/bin/ragflow-sidecar --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ragflow-kafka-sidecar" \
      org.opencontainers.image.description="Mirror RAGFlow's Redis Streams task queue into Kafka, shadow-consume it and compare both paths" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SIDECAR_METRICS_PORT=9464
# A fixed, unprivileged uid/gid (no shell, no home), so a runtime that checks runAsNonRoot
# sees a number and file ownership is predictable.
RUN groupadd --system --gid 10001 sidecar \
 && useradd --system --uid 10001 --gid sidecar --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin sidecar
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
USER 10001:10001

# /metrics (Prometheus), /healthz (alive) and /readyz (connected to Valkey and Kafka).
EXPOSE 9464
# Ready, not merely alive: a sidecar that lost Valkey or Kafka is reported unhealthy. The
# slim image has no curl; Python's urllib is enough (an HTTP 503 raises, so the exit is 1).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % (os.environ.get('SIDECAR_METRICS_PORT') or '9464'), timeout=4)"]
# SIGTERM starts an orderly stop: the batch in hand is finished within SHUTDOWN_GRACE_S, then
# the process exits 0. Give the runtime a longer stop timeout than that (compose: 40 s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["ragflow-sidecar"]
CMD ["run"]
