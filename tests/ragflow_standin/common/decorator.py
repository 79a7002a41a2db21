"""RAGFlow's ``singleton``: one instance per class and process; the class name becomes a factory."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def singleton(cls: Callable[..., T], *args: Any, **kw: Any) -> Callable[[], T]:
    instances: dict[str, T] = {}

    def _singleton() -> T:
        key = str(cls) + str(os.getpid())
        if key not in instances:
            instances[key] = cls(*args, **kw)
        return instances[key]

    return _singleton
