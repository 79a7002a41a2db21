"""RAGFlow's queue naming (``common/settings.py`` in RAGFlow v0.26+).

Unlike RAGFlow, ``STANDIN_QUEUE_PREFIX`` is read at every call, so that tests in one process can
each use streams of their own: prefix ``t1234`` gives ``t1234.te.1.common``.
"""

from __future__ import annotations

import os

from common.constants import SVR_CONSUMER_GROUP_NAME, SVR_QUEUE_NAME

__all__ = ["SVR_CONSUMER_GROUP_NAME", "get_svr_queue_name", "get_svr_queue_names"]


def get_svr_queue_name(priority: int, suffix: str = "common") -> str:
    """``te.<priority>.common``; like RAGFlow's, the suffix is accepted and ignored."""
    del suffix
    prefix = os.environ.get("STANDIN_QUEUE_PREFIX", "")
    name = f"{SVR_QUEUE_NAME}.{priority}.common"
    return f"{prefix}.{name}" if prefix else name


def get_svr_queue_names(suffix: str = "common") -> list[str]:
    """Queue names, priority first (1 then 0)."""
    return [get_svr_queue_name(priority, suffix) for priority in [1, 0]]
