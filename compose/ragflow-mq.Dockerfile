# RAGFlow's own image with ragflow_mq installed into its Python environment, so that RAGFlow's
# API server and task executors route their task queue by MQ_BACKEND / KAFKA_SERVE_PERCENT.
# Built by compose/ragflow-override.yml, or by hand from the repository's root:
#   docker build -f compose/ragflow-mq.Dockerfile \
#     --build-arg RAGFLOW_IMAGE=infiniflow/ragflow:v0.27.0 -t ragflow-mq:local .
#
# RAGFlow's image keeps its packages in a virtualenv made by uv, /ragflow/.venv (VIRTUAL_ENV,
# first on PATH), and sets PYTHONPATH=/ragflow/. Its Python is 3.12+ from RAGFlow v0.23 on (3.13
# from v0.26); this project needs 3.11+, so v0.22 (3.10) and older cannot take it. Nothing of
# RAGFlow's is changed but that virtualenv and PYTHONPATH: entrypoint, user and command stay.

# RAGFlow's image, exactly as its docker/.env names it (RAGFLOW_IMAGE). No default: the derived
# image must be built on the RAGFlow release that runs.
ARG RAGFLOW_IMAGE
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The wheel, built from exactly what `pip install .` reads (as ../Dockerfile copies it).
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY comparators ./comparators
COPY ragflow_mq ./ragflow_mq
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && test -n "$(find /wheels -name 'ragflow_kafka_sidecar-*.whl')"

FROM ${RAGFLOW_IMAGE}
# Every package RAGFlow has stays at its installed version, valkey included: the virtualenv's
# own `uv pip freeze` is the constraints file, so uv adds only what RAGFlow lacks (aiokafka,
# libvalkey, ...) and a conflict fails this build instead of changing RAGFlow underneath it.
# The wheel goes in without the [sidecar] extra: that is the sidecar's, not RAGFlow's. The
# same install is resolved against RAGFlow's uv.lock, for Python 3.13, by the tests
# (compose/ragflow-constraints.txt, tests/test_ragflow_pins.py).
COPY --from=wheel /wheels/ /tmp/ragflow-mq-wheels/
RUN set -eu; \
    python=/ragflow/.venv/bin/python; \
    uv pip freeze --python "$python" | grep -E '^[A-Za-z0-9._-]+==' > /tmp/ragflow-pins.txt; \
    uv pip install --python "$python" --no-cache --constraint /tmp/ragflow-pins.txt \
      /tmp/ragflow-mq-wheels/ragflow_kafka_sidecar-*.whl; \
    uv pip freeze --python "$python" | grep -E '^[A-Za-z0-9._-]+==' > /tmp/ragflow-after.txt; \
    if grep -vxFf /tmp/ragflow-after.txt /tmp/ragflow-pins.txt; then \
      echo "ragflow_mq's install changed RAGFlow's packages above" >&2; exit 1; \
    fi; \
    sitecustomize="$("$python" -c 'import pathlib, ragflow_mq; print(pathlib.Path(ragflow_mq.__file__).parent / "sitecustomize")')"; \
    test -f "$sitecustomize/sitecustomize.py"; \
    ln -s "$sitecustomize" /opt/ragflow-mq; \
    rm -rf /tmp/ragflow-mq-wheels /tmp/ragflow-pins.txt /tmp/ragflow-after.txt
# The sitecustomize directory first, RAGFlow's own PYTHONPATH (/ragflow/) after it. Python loads
# /opt/ragflow-mq/sitecustomize.py at every start; it calls ragflow_mq.install(), which does
# nothing at all unless MQ_BACKEND is split or kafka.
ENV PYTHONPATH=/opt/ragflow-mq${PYTHONPATH:+:${PYTHONPATH}}
# The same start-up RAGFlow's processes will have: sitecustomize found and loaded, and with
# MQ_BACKEND=redis nothing of ragflow_mq imported.
RUN MQ_BACKEND=redis python3 -c "import sys; assert sys.modules['sitecustomize'].__file__.startswith('/opt/ragflow-mq/'), sys.path; assert 'ragflow_mq' not in sys.modules"
# And with the split on, on RAGFlow's own interpreter (3.13 from v0.26, which this project's CI
# lacks): every module of ragflow_mq imported and install() run, so a package or a Python that
# cannot take it fails the build rather than RAGFlow's processes at their start.
RUN MQ_BACKEND=split python3 -c "import importlib, pkgutil, sys, ragflow_mq; \
[importlib.import_module(m.name) for m in pkgutil.iter_modules(ragflow_mq.__path__, 'ragflow_mq.')]; \
assert 'ragflow_mq.install' in sys.modules and sys.meta_path[0].__class__.__name__ == '_PatchOnImport', sys.meta_path"
