"""Failures per path: RAGFlow acks a failed task like a finished one, and says it failed only
in ``set_progress(task_id, prog=-1)`` (its outcome lives in its database). The executor's
``set_progress`` is wrapped to tell us, and otherwise left to do what it does."""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

logger = logging.getLogger(__name__)

# RAGFlow runs its executor as a script: its set_progress lives in __main__.
EXECUTOR_MODULES = ("rag.svr.task_executor", "__main__")


def watch_failures(on_failed: Callable[[Any], None]) -> None:
    """Count ``set_progress(task_id, prog=-1)`` per path: RAGFlow acks failed tasks like
    finished ones, and marks the failure only there (the outcome lives in its database)."""
    for name in EXECUTOR_MODULES:
        module = sys.modules.get(name)
        original = getattr(module, "set_progress", None) if module is not None else None
        if not callable(original) or getattr(original, "_ragflow_mq_watched", False):
            continue
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            continue
        if "prog" not in signature.parameters:
            continue

        @wraps(original)
        def set_progress(
            *args: Any, _original: Any = original, _sig: Any = signature, **kwargs: Any
        ) -> Any:
            result = _original(*args, **kwargs)
            try:
                bound = _sig.bind(*args, **kwargs)
                prog = bound.arguments.get("prog")
                if isinstance(prog, int | float) and prog < 0:
                    on_failed(next(iter(bound.arguments.values()), None))
            except Exception:
                logger.debug("could not read a set_progress call", exc_info=True)
            return result

        set_progress._ragflow_mq_watched = True  # type: ignore[attr-defined]
        module.set_progress = set_progress  # type: ignore[union-attr]
