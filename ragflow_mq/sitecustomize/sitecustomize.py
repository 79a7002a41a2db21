"""Loaded by Python at start-up when this directory is on PYTHONPATH: routes RAGFlow's task
queue through ragflow_mq (MQ_BACKEND); ``MQ_BACKEND=redis`` leaves RAGFlow untouched."""

import os

# Every Python process of RAGFlow's container starts through here. With the default backend and
# no served share asked for, not even ragflow_mq is imported: the package brings aiokafka,
# valkey and the sidecar's settings, 150-200 ms of every start (bench/ragflow_mq_footprint.py).
# Anything else, a wrong value or a share set with MQ_BACKEND=redis included, is read and
# checked by ragflow_mq._sitecustomize.
if (
    os.environ.get("MQ_BACKEND", "").strip() not in ("", "redis")
    or os.environ.get("KAFKA_SERVE_PERCENT", "").strip()
):
    import ragflow_mq._sitecustomize  # noqa: F401
