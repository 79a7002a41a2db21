"""Loaded by Python at start-up when this directory is on PYTHONPATH: routes RAGFlow's task
queue through ragflow_mq (MQ_BACKEND); ``MQ_BACKEND=redis`` leaves RAGFlow untouched."""

import ragflow_mq._sitecustomize  # noqa: F401
